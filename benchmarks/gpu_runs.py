"""``make gpu-check``'s measurements through the training command, each a whole process (``benchmarks.gpu`` runs
them): nanoGPT's shakespeare_char to its val/loss, the GPU default against nanoGPT's recipe, the speedrun against
nanoGPT's own program, and GPT-2 124M's logged MFU."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import log

# nanoGPT's shakespeare_char figure: val/loss 1.4697 on tinyshakespeare
CHAR_TARGET = 1.47

DEFAULT_COLUMNS = [
    "run",
    "steps",
    "final_val_loss",
    "wall_s",
    "fit_s",
    "tokens_per_s",
    "mfu",
    "seconds_to_reference",
    "note",
]
CHAR_COLUMNS = ["corpus", "seconds_to_target", "target", "final_val_loss", "steps", "wall_s", "note"]


def shakespeare_char_command(
    run_dir: Path, tinyshakespeare: Path | None, overrides: Sequence[str] = ()
) -> list[str]:
    """The training command of the ``shakespeare_char`` section (run from the repository root), writing its run
    into ``run_dir``."""
    data = ["data=text", f"data.source={tinyshakespeare}"] if tinyshakespeare else []
    return [
        sys.executable,
        "-m",
        "gptmini.training",
        "experiment=shakespeare_char",
        *data,
        "run_name=bench_shakespeare_char",
        f"paths.output_root={run_dir.parent}",
        f"hydra.run.dir={run_dir}",
        *overrides,
    ]


def read_run(run_dir: Path) -> dict[str, list[tuple[int, float, float]]]:
    """A run's TensorBoard scalars as ``{tag: [(step, value, wall_time), ...]}`` ({} when it wrote none)."""
    from gptmini.runs.discovery import read_events, run_event_folder

    folder = run_event_folder(run_dir)
    if folder is None:
        return {}
    ea = read_events(folder)
    return {tag: [(e.step, e.value, e.wall_time) for e in ea.Scalars(tag)] for tag in ea.Tags()["scalars"]}


def seconds_to(events: list[tuple[int, float, float]], target: float, started: float) -> float | None:
    """Seconds from ``started`` (wall clock) to the first event at or below ``target`` (None if never)."""
    return next((wall - started for _, value, wall in events if value <= target), None)


def time_to_target(run_dir: Path, target: float, started: float) -> dict[str, Any]:
    """From a run's TensorBoard events: seconds from ``started`` (wall clock) to the first val/loss <= ``target``
    (None if never), the final val/loss and its step."""
    val = read_run(run_dir).get("val/loss")
    if not val:
        return {"seconds_to_target": None, "final_val_loss": None, "steps": None}
    return {
        "seconds_to_target": seconds_to(val, target, started),
        "final_val_loss": val[-1][1],
        "steps": val[-1][0],
    }


def bench_shakespeare_char(
    out: Path, tinyshakespeare: Path | None, overrides: Sequence[str] = (), timeout: float = 600
) -> list[dict[str, Any]]:
    root = Path(__file__).resolve().parent.parent
    started = time.time()
    run_dir = out / "gpu_runs" / time.strftime("shakespeare_char_%Y-%m-%d_%H-%M-%S")
    cmd = shakespeare_char_command(run_dir, tinyshakespeare, overrides)
    try:
        proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=timeout)
        note = "" if proc.returncode == 0 else f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}"
    except subprocess.TimeoutExpired:
        note = f"stopped after {timeout:.0f} s"
    row: dict[str, Any] = {
        "corpus": f"tinyshakespeare ({tinyshakespeare})"
        if tinyshakespeare
        else "embedded (not tinyshakespeare)",
        "target": CHAR_TARGET,
        "wall_s": time.time() - started,
        "note": note,
    }
    row.update(time_to_target(run_dir, CHAR_TARGET, started))
    return [row]


# --- the GPU default against nanoGPT's recipe ------------------------------------------------------------------


def default_runs(steps: int) -> dict[str, list[str]]:
    """The ``default`` section's runs, as training-command overrides: the GPU default and nanoGPT's baby-GPT
    recipe at the default's batch, ``steps`` optimizer steps each (each schedule spans them), validated six times
    on the same 50 batches."""
    common = [
        f"trainer.max_steps={steps}",
        f"trainer.val_check_interval={max(1, steps // 6)}",
        "trainer.limit_val_batches=50",
        f"checkpoint_every_n_steps={steps}",
    ]
    return {
        "default": ["hardware=gpu", *common],
        "nanogpt": ["experiment=shakespeare_char", "data.batch_size=128", *common],
    }


DEFAULT_LABELS = {
    "default": "GPU default (hardware=gpu: Muon + WSD)",
    "nanogpt": "nanoGPT's recipe (experiment=shakespeare_char, AdamW + cosine, batch 128)",
}


def training_command(run_dir: Path, overrides: Sequence[str]) -> list[str]:
    """The training command (run from the repository root) writing one run into ``run_dir``."""
    return [
        sys.executable,
        "-m",
        "gptmini.training",
        *overrides,
        f"run_name={run_dir.name}",
        f"paths.output_root={run_dir.parent}",
        f"hydra.run.dir={run_dir}",
    ]


def _late_median(events: list[tuple[int, float, float]] | None) -> float | None:
    # the second half of a run's values: compilation and warm-up are over
    if not events:
        return None
    return statistics.median(v for _, v, _ in events[len(events) // 2 :])


def run_summary(run_dir: Path, started: float, wall_s: float, note: str) -> dict[str, Any]:
    scalars = read_run(run_dir)
    val = scalars.get("val/loss", [])
    train = scalars.get("train/loss", [])
    return {
        "steps": val[-1][0] if val else None,
        "final_val_loss": val[-1][1] if val else None,
        "wall_s": wall_s,
        "first_log_s": train[0][2] - started if train else None,
        "tokens_per_s": _late_median(scalars.get("perf/tokens_per_sec")),
        "mfu": _late_median(scalars.get("perf/mfu")),
        "val": val,
        "started": started,
        "note": note,
    }


def run_and_summarize(run_dir: Path, overrides: Sequence[str], timeout: float) -> dict[str, Any]:
    """One training command into ``run_dir``, a whole process stopped after ``timeout`` seconds; its summary."""
    started = time.time()
    try:
        proc = subprocess.run(
            training_command(run_dir, overrides),
            cwd=Path(__file__).resolve().parent.parent,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        note = "" if proc.returncode == 0 else f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}"
    except subprocess.TimeoutExpired:
        note = f"stopped after {timeout:.0f} s"
    return run_summary(run_dir, started, time.time() - started, note)


def bench_default(out: Path, steps: int, timeout: float) -> list[dict[str, Any]]:
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    runs: dict[str, dict[str, Any]] = {}
    for name, overrides in default_runs(steps).items():
        runs[name] = run_and_summarize(out / "gpu_runs" / f"gpu_check_{name}_{stamp}", overrides, timeout)
        log.info("default %s: %s", name, {k: v for k, v in runs[name].items() if k != "val"})
    reference = runs["nanogpt"]["final_val_loss"]
    rows = []
    for name, r in runs.items():
        reached = seconds_to(r["val"], reference, r["started"]) if reference is not None else None
        rows.append({"run": DEFAULT_LABELS[name], "seconds_to_reference": reached, "key": name, **r})
    return rows


# --- the GPU speedrun against nanoGPT's own program --------------------------------------------------------------

SPEEDRUN_EXPERIMENT = "speedrun_char_gpu"
SPEEDRUN_COLUMNS = [
    "program",
    "pair",
    "wall_s",
    "seconds_to_target",
    "target",
    "final_val_loss",
    "best_val_loss",
    "best_at_s",
    "steps",
    "measured_on",
]
# how each side measures its validation loss on the same held-out tenth of tinyshakespeare
NANOGPT_MEASURE = "mean of 200 random 64 x 256 batches of the held-out tenth (its estimate_loss)"
GPTMINI_MEASURE = "every 256-token window of the held-out tenth (limit_val_batches=1.0)"


def speedrun_target() -> float:
    """The speedrun's target, read from its experiment (one place holds it): nanoGPT's published val/loss."""
    from omegaconf import OmegaConf

    from gptmini.conf_dir import conf_dir

    return float(OmegaConf.load(conf_dir() / "experiment" / f"{SPEEDRUN_EXPERIMENT}.yaml").target_val_loss)


def _loss_row(
    program: str,
    pair: int,
    wall_s: float,
    evals: Sequence[tuple[int, float, float]],
    target: float,
    measure: str,
) -> dict[str, Any]:
    # evals: (step, val loss, seconds from the process start)
    best = min(evals, key=lambda e: e[1]) if evals else None
    return {
        "program": program,
        "pair": pair,
        "wall_s": wall_s,
        "seconds_to_target": next((t for _, v, t in evals if v <= target), None),
        "target": target,
        "final_val_loss": evals[-1][1] if evals else None,
        "best_val_loss": best[1] if best else None,
        "best_at_s": best[2] if best else None,
        "steps": evals[-1][0] if evals else None,
        "measured_on": measure,
    }


def bench_speedrun(
    out: Path, nanogpt: Path, tinyshakespeare: Path, pairs: int, overrides: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """nanoGPT's own ``train.py`` with its published ``config/train_shakespeare_char.py`` (a checkout, run in place)
    and ``experiment=speedrun_char_gpu``, on the same tinyshakespeare, alternating ``pairs`` times; each a whole
    process, compilation included, each corpus prepared beforehand by its own program (untimed)."""
    import tempfile

    from benchmarks.end_to_end import REPO, child_env, run_timed
    from benchmarks.nanogpt import check_inputs, nanogpt_evals, prepare_both

    check_inputs(nanogpt, tinyshakespeare)
    target = speedrun_target()
    logs = out / "gpu_runs"
    logs.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gptmini-speedrun-") as tmp:
        work = Path(tmp)
        nano_dir, source, data_dir, train_py, config = prepare_both(nanogpt, tinyshakespeare, work)
        for pair in range(1, pairs + 1):
            run = run_timed(
                [sys.executable, train_py, config],
                nano_dir,
                logs / f"nanogpt_{stamp}_{pair}.out",
                child_env(),
            )
            rows.append(
                _loss_row(
                    "nanoGPT train.py",
                    pair,
                    run.ended - run.started,
                    nanogpt_evals(run),
                    target,
                    NANOGPT_MEASURE,
                )
            )
            run_dir = logs / f"speedrun_{stamp}_{pair}"
            cmd = training_command(
                run_dir,
                [
                    f"experiment={SPEEDRUN_EXPERIMENT}",
                    f"data.source={source}",
                    f"data.data_dir={data_dir}",
                    *overrides,
                ],
            )
            run = run_timed(cmd, REPO, logs / f"speedrun_{stamp}_{pair}.out", child_env())
            val = read_run(run_dir).get("val/loss", [])
            evals = [(step, value, wall - run.started) for step, value, wall in val]
            rows.append(
                _loss_row(
                    f"gptmini {SPEEDRUN_EXPERIMENT}",
                    pair,
                    run.ended - run.started,
                    evals,
                    target,
                    GPTMINI_MEASURE,
                )
            )
            for r in rows[-2:]:
                log.info("speedrun pair %d: %s", pair, r)
    return rows


def speedrun_ratios(
    rows: Sequence[dict[str, Any]],
) -> list[tuple[int, float, dict[str, Any], dict[str, Any]]]:
    """Per pair: gptmini's whole process over nanoGPT's, and the two rows."""
    out = []
    for pair in sorted({r["pair"] for r in rows}):
        nano, ours = (
            next(r for r in rows if r["pair"] == pair and r["program"].startswith(p))
            for p in ("nanoGPT", "gptmini")
        )
        out.append((pair, ours["wall_s"] / nano["wall_s"], nano, ours))
    return out


# --- GPT-2 124M through the training command ----------------------------------------------------------------------


def gpt2_train_overrides(steps: int) -> list[str]:
    """``experiment=gpt2_124m`` as users run it, for ``steps`` optimizer steps on the embedded corpus, perf/mfu
    logged every step, one short validation at the end and none of the validation-time pictures."""
    return [
        "experiment=gpt2_124m",
        f"trainer.max_steps={steps}",
        "trainer.log_every_n_steps=1",
        f"trainer.val_check_interval={steps}",
        "trainer.limit_val_batches=2",
        f"checkpoint_every_n_steps={10 * steps}",
        *(
            f"callbacks.{name}=null"
            for name in ("attention_maps", "head_insight", "attention_summary", "text_samples")
        ),
    ]


def bench_gpt2_train(
    out: Path, steps: int, timeout: float, overrides: Sequence[str] = ()
) -> list[dict[str, Any]]:
    run_dir = out / "gpu_runs" / time.strftime("gpt2_train_%Y-%m-%d_%H-%M-%S")
    r = run_and_summarize(run_dir, [*gpt2_train_overrides(steps), *overrides], timeout)
    r.pop("val")
    return [{"path": "gptmini train experiment=gpt2_124m " + " ".join(overrides), **r}]
