"""The host's cost per step: ``gptmini train`` against the bare PyTorch loop on a model so small (2 layers x 2 heads
x 32 wide) that the framework's per-step work, not the arithmetic, sets the pace; on a GPU that work is what the
host must finish while the kernels run.

Both are fresh processes with one torch thread (``OMP_NUM_THREADS=1``), the quick start's data, batch, AdamW and
schedule (``benchmarks.end_to_end``): the training command with every default callback (progress bar on a
pseudo-terminal, throughput, TensorBoard, the guards), checkpoints and validations out of the way (only the final
``last.ckpt``, one validation at the end), against the bare loop (``python -m benchmarks.end_to_end bare``). Steps
are timed end to end by the same clock (``benchmarks.step_clock.StepClock`` in the command); the ratio is of the
median steps, the two programs alternating ``rounds`` times.

The goal: the training command's tokens/s at least ``GOAL`` of the bare loop's.
``python -m benchmarks --only host`` regenerates the table.
"""

from __future__ import annotations

import logging
import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import BenchOptions, loadavg
from benchmarks.end_to_end import Cadence, child_env, prepare_char_data, run_bare_loop, run_training_command

log = logging.getLogger("benchmarks")

GOAL = 0.85  # the training command's tokens/s / the bare loop's
ROUNDS = 3
TINY = {"n_layer": 2, "n_head": 2, "n_embd": 32}
# long enough for a stable median; validation once, at the end (val_check_interval = the run's steps)
STEPS, QUICK_STEPS = 1500, 30
FLOOR_STEPS = 2000

HOST_COLUMNS = [
    "program",
    "round",
    "median_step_ms",
    "tokens_per_s",
    "ratio",
    "median_step_cpu_ms",
    "cpu_ratio",
    "startup_s",
    "total_s",
]


def one_thread_env() -> dict[str, str]:
    return {**child_env(), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def train_overrides(cadence: Cadence) -> list[str]:
    """The training command's overrides beyond the quick start: the tiny model, checkpoints only at the end."""
    return [f"model.{k}={v}" for k, v in TINY.items()] + [
        "callbacks=final",
        f"trainer.val_check_interval={cadence.steps}",
    ]


def bare_args() -> list[str]:
    return [arg for k, v in TINY.items() for arg in (f"--{k.replace('_', '-')}", str(v))]


def bench_host(opts: BenchOptions) -> tuple[list[dict[str, Any]], list[str]]:
    steps = QUICK_STEPS if opts.quick else STEPS
    cadence = Cadence(steps=steps, eval_every=steps, eval_batches=1, warmup_steps=min(100, steps // 2))
    rounds = 1 if opts.quick else ROUNDS
    source = str(opts.extra.get("tinyshakespeare") or "shakespeare")
    tokens = cadence.batch_size * 64  # the quick start's block
    rows: list[dict[str, Any]] = []
    env = one_thread_env()
    with tempfile.TemporaryDirectory(prefix="gptmini-bench-host-") as tmp:
        work = Path(tmp)
        data_dir = work / "data"
        prepare_char_data(source, data_dir)
        for r in range(1, rounds + 1):
            for program in ("gptmini train", "bare loop"):
                log.info("host %s, round %d/%d (load average %s)", program, r, rounds, loadavg())
                if program == "bare loop":
                    p = run_bare_loop(data_dir, work, cadence, f"bare{r}", bare_args(), env)
                else:
                    p = run_training_command(
                        source, data_dir, work, cadence, f"train{r}", train_overrides(cadence), env
                    )
                row = {
                    "program": program,
                    "round": r,
                    "median_step_ms": p["median_step_ms"],
                    "tokens_per_s": tokens / p["median_step_ms"] * 1e3,
                    "ratio": None,
                    "median_step_cpu_ms": p["median_step_cpu_ms"],
                    "cpu_ratio": None,
                    "startup_s": p["startup_s"],
                    "total_s": p["total_s"],
                }
                rows.append(row)
                log.info("host %-13s median step %.3f ms", program, p["median_step_ms"])
        interleaved_rows = interleaved(source, data_dir, work, cadence, rounds, env)
    bare = {r["round"]: r for r in rows if r["program"] == "bare loop"}
    for r in rows:
        if r["program"] != "bare loop":
            b = bare[r["round"]]
            r["ratio"] = r["tokens_per_s"] / b["tokens_per_s"]
            if r["median_step_cpu_ms"] and b["median_step_cpu_ms"]:
                r["cpu_ratio"] = b["median_step_cpu_ms"] / r["median_step_cpu_ms"]
    trained = [r for r in rows if r["ratio"] is not None]
    cpu_ratios = [r["cpu_ratio"] for r in trained if r["cpu_ratio"] is not None]
    rows.append(
        {
            "program": "gptmini train / bare loop, median of rounds",
            "round": None,
            "median_step_ms": None,
            "tokens_per_s": None,
            "ratio": statistics.median(r["ratio"] for r in trained),
            "median_step_cpu_ms": None,
            "cpu_ratio": statistics.median(cpu_ratios) if cpu_ratios else None,
            "startup_s": None,
            "total_s": None,
        }
    )
    rows += interleaved_rows
    rows += lightning_floor(QUICK_STEPS if opts.quick else FLOOR_STEPS, rounds)
    tiny = " x ".join(str(v) for v in TINY.values())
    notes = [
        f"model {tiny} (layers x heads x width), block 64, batch {cadence.batch_size}, AdamW (the kernel "
        f"training picks), warmup-cosine schedule, clipping 1.0; {steps} steps, validation once at the end; "
        "OMP_NUM_THREADS=1 in both processes; the corpus prepared in characters beforehand",
        "gptmini train: `python -m gptmini.training experiment=shakespeare_char_cpu "
        + " ".join(train_overrides(cadence))
        + "` on a pseudo-terminal, every default callback on; bare loop: `python -m benchmarks.end_to_end bare "
        + " ".join(bare_args())
        + "`, the same data windows, optimizer and schedule, nothing logged",
        "median_step_ms: step end to step end (fetching the batch counts), the median over the run; ratio: "
        f"tokens/s of the training command / the bare loop's in the same round; goal >= {GOAL}",
        "median_step_cpu_ms: the process's CPU time per step (every thread), the median over the same steps; "
        "cpu_ratio: the bare loop's / the training command's. On a busy machine the wall clock measures the "
        "neighbours as much as the program; the CPU time much less so",
        "interleaved: the training command (as above) with benchmarks.bare_reference.BareReference, 5 bare-loop "
        "steps after every 20th training step in the same process; median_step_cpu_ms: the training thread's CPU "
        "time per training step; cpu_ratio: the bare step's / the training step's (the same load at the same "
        "moments); ratio: the share of the process's CPU time its other threads took (progress bar, TensorBoard)",
        f"empty module: lightning.Trainer (no logger, no progress bar, gradient_clip_val=1.0) around a "
        f"one-parameter module, {FLOOR_STEPS} steps, against the same steps in a plain loop, in the benchmark's own "
        "process; median_step_cpu_ms is the difference of the two median steps' CPU time: Lightning's floor",
    ]
    return rows, notes


# --- the bare loop's step inside the training command's process ------------------------------------------------


def bare_reference_override(data_dir: Path, path: Path) -> str:
    """The training command's override that adds ``benchmarks.bare_reference.BareReference``."""
    sizes = ",".join(f"{k}:{v}" for k, v in TINY.items())
    return (
        "+callbacks.bare_reference={_target_:benchmarks.bare_reference.BareReference,"
        f"data_dir:'{data_dir}',path:'{path}',sizes:{{{sizes}}}}}"
    )


def interleaved(
    source: str, data_dir: Path, work: Path, cadence: Cadence, rounds: int, env: dict[str, str]
) -> list[dict[str, Any]]:
    """The training command with the bare loop's steps measured in its own process (``BareReference``): the
    ratio of the two CPU times per step of the training thread, and the share of the other threads."""
    import json

    rows = []
    for r in range(1, rounds + 1):
        path = work / f"reference{r}.json"
        extra = [*train_overrides(cadence), bare_reference_override(data_dir, path)]
        log.info("host interleaved, round %d/%d (load average %s)", r, rounds, loadavg())
        run_training_command(source, data_dir, work, cadence, f"inter{r}", extra, env)
        got = json.loads(path.read_text())
        rows.append(
            {
                "program": "bare step / training step, in one process (training thread); other threads",
                "round": r,
                "median_step_ms": None,
                "tokens_per_s": None,
                "ratio": got["other_threads_share"],
                "median_step_cpu_ms": got["train_step_cpu_ms"],
                "cpu_ratio": got["cpu_ratio"],
                "startup_s": None,
                "total_s": None,
            }
        )
        log.info(
            "host interleaved: CPU ratio %.3f, other threads %.3f",
            got["cpu_ratio"],
            got["other_threads_share"],
        )
    return rows


# --- the floor: Lightning's own loop around a module that does nothing ----------------------------------------


def lightning_floor(steps: int, rounds: int) -> list[dict[str, Any]]:
    """CPU time per step of ``lightning.Trainer`` around a one-parameter module (no logger, no callback but the
    clock, gradient clipping on, as training clips) against the same module in a plain loop, alternating in this
    process: what Lightning itself costs per step, which no change to gptmini can remove."""
    import time
    import warnings

    import lightning as L
    import torch

    class Empty(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return (self.w * batch).sum()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.0)

    class Clock(L.Callback):
        def __init__(self) -> None:
            self.cpu: list[float] = []

        def on_train_batch_end(self, *args: Any) -> None:
            self.cpu.append(time.thread_time())

    data = [torch.ones(1)] * steps

    def median_step(cpu: list[float]) -> float:
        skip = len(cpu) // 10  # the first steps warm up
        return statistics.median(b - a for a, b in zip(cpu[skip:-1], cpu[skip + 1 :], strict=True))

    def in_lightning() -> float:
        clock = Clock()
        trainer = L.Trainer(
            accelerator="cpu",
            max_steps=steps,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            gradient_clip_val=1.0,
            callbacks=[clock],
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(Empty(), train_dataloaders=torch.utils.data.DataLoader(data, batch_size=None))
        return median_step(clock.cpu)

    def bare() -> float:
        module = Empty()
        opt = torch.optim.SGD(module.parameters(), lr=0.0)
        cpu = []
        for x in torch.utils.data.DataLoader(data, batch_size=None):
            module.training_step(x, 0).backward()
            torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            cpu.append(time.thread_time())
        return median_step(cpu)

    rows = []
    for r in range(1, rounds + 1):
        b, lit = bare(), in_lightning()
        rows.append(
            {
                "program": "empty module: Lightning's loop - plain loop",
                "round": r,
                "median_step_ms": None,
                "tokens_per_s": None,
                "ratio": None,
                "median_step_cpu_ms": (lit - b) * 1e3,
                "cpu_ratio": None,
                "startup_s": None,
                "total_s": None,
            }
        )
        log.info("host floor: Lightning %.3f ms, plain %.3f ms per step (CPU)", lit * 1e3, b * 1e3)
    return rows
