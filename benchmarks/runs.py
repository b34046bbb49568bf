"""``gptmini runs`` over many runs: the listing as a fresh process (imports included), over a runs folder of
1,000 finished runs (quick: 50) that carry their summary (``run_summary.json``, written with each checkpoint), and
over 100 (quick: 10) of the same runs without it (a run folder with no ``run_summary.json``): then every checkpoint is
opened (memory-mapped) and every TensorBoard event file read. The runs are hard links of one small run, so the
folder costs the disk one run."""

from __future__ import annotations

import os
import resource
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import BenchOptions, run_command

RUNS_COLUMNS = ["runs", "summaries", "wall_s", "cpu_s", "target_s", "met"]
TARGET_S = 2.0  # 1,000 runs listed on a 2-core CPU


def _one_run(folder: Path) -> None:
    """A finished 50-step run: Hydra's files, a small checkpoint with its summary, a TensorBoard event file."""
    from torch.utils.tensorboard import SummaryWriter

    from gptmini.model import GPT, GPTConfig
    from gptmini.runs.checkpoint import atomic_save
    from gptmini.runs.files import write_summary

    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "config.yaml").write_text(
        "run_name: bench\ntrainer:\n  max_steps: 50\nmodel:\n  n_layer: 1\n  n_embd: 16\n", encoding="utf-8"
    )
    (folder / ".hydra" / "overrides.yaml").write_text(
        "- trainer.max_steps=50\n- model=tiny\n", encoding="utf-8"
    )
    tb = "tb/bench"
    with SummaryWriter(str(folder / tb)) as writer:
        for step in range(10, 60, 10):
            writer.add_scalar("val/loss", 3.0 - step / 100, step)
    config = GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=16)
    ckpt = {
        "state_dict": {f"model.{k}": v for k, v in GPT(config).state_dict().items()},
        "global_step": 50,
        "hyper_parameters": {
            "model_config": config.to_dict(),
            "run_config": {"run_name": "bench", "trainer": {"max_steps": 50}, "tensorboard_dir": tb},
        },
        "callbacks": {"StopAtTargetLoss": {"last_val_loss": 2.5, "last_val_step": 50}},
    }
    path = folder / "checkpoints" / "last.ckpt"
    atomic_save(ckpt, path)
    write_summary(path, ckpt)


def _listing(root: Path) -> tuple[float, float]:
    """``gptmini runs --runs-dir root`` as a fresh process: its wall seconds and its CPU seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall, out = run_command(
        [sys.executable, "-m", "gptmini.cli", "runs", "--runs-dir", str(root)], "gptmini runs"
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if "bench" not in out:
        raise RuntimeError(f"gptmini runs listed no run:\n{out[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def bench_runs(opts: BenchOptions) -> tuple[list[dict[str, Any]], list[str]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="gptmini-bench-runs-") as tmp:
        template = Path(tmp) / "template"
        _one_run(template)
        for n, summaries in ((50 if opts.quick else 1000, True), (10 if opts.quick else 100, False)):
            root = Path(tmp) / f"outputs_{n}_{summaries}"
            for i in range(n):
                run = root / "bench" / f"2026-01-01_00-00-00_{i:06d}"
                shutil.copytree(template, run, copy_function=os.link)
                if not summaries:
                    (run / "run_summary.json").unlink()
            _listing(root)  # the files in the page cache, as on a machine that listed them before
            wall, cpu = _listing(root)
            target = TARGET_S * n / 1000 if summaries else None
            rows.append(
                {
                    "runs": n,
                    "summaries": "yes" if summaries else "no",
                    "wall_s": round(wall, 2),
                    "cpu_s": round(cpu, 2),
                    "target_s": target,
                    "met": None if target is None else "yes" if wall <= target else "no",
                }
            )
    notes = [
        "wall_s: `gptmini runs --runs-dir <folder>` as a fresh process, Python's start and imports included, the "
        "second of two listings; cpu_s: its user + system CPU seconds (what a busy machine does not inflate)",
        "with summaries: per run, a stat of each file (the size column), .hydra/overrides.yaml and "
        "run_summary.json; without: also .hydra/config.yaml, the checkpoint (torch, memory-mapped) and the "
        "TensorBoard events",
    ]
    return rows, notes
