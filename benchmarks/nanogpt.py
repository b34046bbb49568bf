"""gptmini against nanoGPT on nanoGPT's CPU quick start, side by side on one machine:

    python -m benchmarks.nanogpt --nanogpt /path/to/nanoGPT --tinyshakespeare /path/to/tinyshakespeare.txt

nanoGPT's own ``train.py`` (a checkout of https://github.com/karpathy/nanoGPT, run in place; nothing of it is
copied into this repository) runs with the flags of its README's CPU quick start, from a scratch folder where
``data/shakespeare_char`` is prepared by its own ``prepare.py`` from the given tinyshakespeare.txt (the char-rnn
file); gptmini runs ``python -m gptmini.training experiment=shakespeare_char_cpu data=text data.source=<file>``
with every default callback on. The two alternate, ``--repeats`` times each, with the same Python and torch. Every
run is a fresh process on a pseudo-terminal, timed from its start to its exit.

Written to ``<out>/nanogpt.md`` and ``.csv``: per run the wall clock, the final validation loss, the time to the
training loop, the median step and the time validations took; then the medians and their ratios, against the
goals (whole run <= 0.8x nanoGPT's with the same validation loss +-0.01, step <= nanoGPT's).

nanoGPT's own log gives its numbers: each ``iter N: ... time T ms`` line is step N's time, end to end (at every
250th step it includes that evaluation of 2 x 20 batches, at step 0 too); ``step N: train loss .., val loss ..``
its evaluations. Its time to the training loop is the arrival of the ``iter 0`` line less that line's time.
"""

from __future__ import annotations

import argparse
import logging
import re
import shutil
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import loadavg, machine_info, markdown_table, write_table
from benchmarks.end_to_end import (
    Cadence,
    Run,
    child_env,
    prepare_char_data,
    run_timed,
    run_training_command,
)

log = logging.getLogger("benchmarks")

# nanoGPT's README, "I only have a macbook" (its CPU quick start), word for word.
NANOGPT_FLAGS = [
    "--device=cpu",
    "--compile=False",
    "--eval_iters=20",
    "--log_interval=1",
    "--block_size=64",
    "--batch_size=12",
    "--n_layer=4",
    "--n_head=4",
    "--n_embd=128",
    "--max_iters=2000",
    "--lr_decay_iters=2000",
    "--dropout=0.0",
]

ITER_LINE = re.compile(r"^iter (\d+): loss [-\d.]+, time ([\d.]+)ms")
EVAL_LINE = re.compile(r"^step (\d+): train loss ([\d.]+), val loss ([\d.]+)")

COLUMNS = [
    "program",
    "run",
    "total_s",
    "val_loss",
    "startup_s",
    "median_step_ms",
    "steps",
    "validations",
    "val_s",
]


def nanogpt_flags(cadence: Cadence) -> list[str]:
    """The README's flags; a shorter cadence (a smoke test of this script) changes the length and intervals."""
    if cadence == Cadence():
        return list(NANOGPT_FLAGS)
    flags = [f for f in NANOGPT_FLAGS if not f.startswith(("--max_iters", "--lr_decay_iters"))]
    flags += [f"--max_iters={cadence.steps}", f"--lr_decay_iters={cadence.steps}"]
    return flags + [f"--eval_interval={cadence.eval_every}", f"--warmup_iters={cadence.warmup_steps}"]


def nanogpt_evals(run: Run) -> list[tuple[int, float, float]]:
    """nanoGPT's evaluations from its own log: (step, val loss, seconds from the process start to the line)."""
    return [
        (int(m.group(1)), float(m.group(3)), arrived - run.started)
        for arrived, line in run.lines
        if (m := EVAL_LINE.match(line.strip()))
    ]


def nanogpt_phases(run: Run, eval_interval: int = 250) -> dict[str, Any]:
    """nanoGPT's phases from its own log (see the module docstring)."""
    iters: dict[int, tuple[float, float]] = {}  # iter -> (arrival, ms)
    val_loss = None
    for arrived, line in run.lines:
        if m := ITER_LINE.match(line.strip()):
            iters[int(m.group(1))] = (arrived, float(m.group(2)))
        elif m := EVAL_LINE.match(line.strip()):
            val_loss = float(m.group(3))
    if 0 not in iters:
        raise ValueError(f"no 'iter 0' line in nanoGPT's output ({run.output})")
    plain = [ms for i, (_, ms) in iters.items() if i % eval_interval != 0]
    median = statistics.median(plain) if plain else iters[0][1]
    evals = [ms - median for i, (_, ms) in iters.items() if i % eval_interval == 0]
    first_arrival, first_ms = iters[0]
    return {
        "total_s": run.ended - run.started,
        "val_loss": val_loss,
        "startup_s": first_arrival - first_ms / 1e3 - run.started,
        "median_step_ms": median,
        "steps": len(iters),
        "validations": len(evals),
        "val_s": sum(evals) / 1e3,
    }


def prepare_nanogpt(nanogpt: Path, tinyshakespeare: Path, work: Path) -> Path:
    """A scratch folder for nanoGPT's runs: ``data/shakespeare_char`` with the given text as ``input.txt``, prepared
    by nanoGPT's own prepare.py (copied beside it, since it writes next to itself; with input.txt present it
    downloads nothing), and nanoGPT's configurator.py, which its train.py reads from the working folder."""
    folder = work / "nanogpt" / "data" / "shakespeare_char"
    folder.mkdir(parents=True)
    shutil.copyfile(nanogpt / "configurator.py", work / "nanogpt" / "configurator.py")
    shutil.copyfile(tinyshakespeare, folder / "input.txt")
    shutil.copyfile(nanogpt / "data" / "shakespeare_char" / "prepare.py", folder / "prepare.py")
    proc = run_timed([sys.executable, "prepare.py"], folder, work / "nanogpt_prepare.out", child_env())
    if proc.returncode != 0 or not (folder / "train.bin").is_file():
        raise RuntimeError(f"nanoGPT's prepare.py failed; see {proc.output}")
    return work / "nanogpt"


def prepare_both(nanogpt: Path, tinyshakespeare: Path, work: Path) -> tuple[Path, str, Path, str, str]:
    """Each program's corpus prepared in ``work`` by its own code (untimed): nanoGPT's scratch folder, the corpus's
    path, gptmini's prepared folder, and nanoGPT's train.py and shakespeare_char config, as paths to pass."""
    nano_dir = prepare_nanogpt(nanogpt.resolve(), tinyshakespeare, work)
    source = str(tinyshakespeare.resolve())
    data_dir = work / "gptmini_data"
    prepare_char_data(source, data_dir)
    config = str(nanogpt.resolve() / "config" / "train_shakespeare_char.py")
    return nano_dir, source, data_dir, str(nanogpt.resolve() / "train.py"), config


def check_inputs(nanogpt: Path, tinyshakespeare: Path) -> None:
    needed = [
        nanogpt / "train.py",
        nanogpt / "configurator.py",
        nanogpt / "config" / "train_shakespeare_char.py",
    ]
    needed.append(nanogpt / "data" / "shakespeare_char" / "prepare.py")
    missing = [str(p) for p in needed if not p.is_file()]
    if missing:
        raise SystemExit(
            f"error: --nanogpt {nanogpt} is not a nanoGPT checkout: missing {', '.join(missing)}"
        )
    if not tinyshakespeare.is_file():
        raise SystemExit(f"error: --tinyshakespeare {tinyshakespeare} is not a file (the char-rnn input.txt)")


def compare(
    nanogpt: Path, tinyshakespeare: Path, repeats: int, out: Path, cadence: Cadence | None = None
) -> list[dict[str, Any]]:
    cadence = cadence or Cadence()
    flags = nanogpt_flags(cadence)
    check_inputs(nanogpt, tinyshakespeare)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gptmini-vs-nanogpt-") as tmp:
        work = Path(tmp)
        nano_dir, source, data_dir, train_py, config = prepare_both(nanogpt, tinyshakespeare, work)
        for r in range(1, repeats + 1):
            log.info("nanoGPT, run %d/%d (load average %s)", r, repeats, loadavg())
            run = run_timed(
                [sys.executable, train_py, config, *flags], nano_dir, work / f"nano{r}.out", child_env()
            )
            if run.returncode != 0:
                raise RuntimeError(f"nanoGPT's train.py failed ({run.returncode}): {run.lines[-5:]}")
            rows.append({"program": "nanoGPT", "run": r, **nanogpt_phases(run, cadence.eval_every)})
            log.info("gptmini, run %d/%d (load average %s)", r, repeats, loadavg())
            p = run_training_command(source, data_dir, work, cadence, f"gptmini{r}")
            rows.append(
                {
                    "program": "gptmini",
                    "run": r,
                    **p,
                    "val_s": p["val_batches_s"] + p["val_extras_s"] + max(0.0, p["background_s"]),
                }
            )
            for row in rows[-2:]:
                log.info(
                    "%-8s run %d: %.1f s, val loss %.4f, startup %.2f s, median step %.2f ms",
                    row["program"],
                    r,
                    row["total_s"],
                    row["val_loss"],
                    row["startup_s"],
                    row["median_step_ms"],
                )
    return rows


def summarize(rows: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Medians per program and gptmini's ratios to nanoGPT's, judged against the goals."""

    def med(program: str, key: str) -> float:
        return statistics.median(r[key] for r in rows if r["program"] == program)

    keys = ("total_s", "val_loss", "startup_s", "median_step_ms", "val_s")
    medians = [
        {"program": p, "run": "median", **{k: med(p, k) for k in keys}} for p in ("nanoGPT", "gptmini")
    ]
    n, g = medians
    total, step = g["total_s"] / n["total_s"], g["median_step_ms"] / n["median_step_ms"]
    loss = g["val_loss"] - n["val_loss"]
    verdicts = [
        f"whole run: gptmini / nanoGPT = {total:.2f}x (goal <= 0.8x: {'met' if total <= 0.8 else 'not met'})",
        f"median step: gptmini / nanoGPT = {step:.2f}x (goal <= 1x: {'met' if step <= 1 else 'not met'})",
        f"validation loss: gptmini - nanoGPT = {loss:+.4f} (goal within +-0.01: "
        f"{'met' if abs(loss) <= 0.01 else 'not met'})",
        f"gptmini's time to the first step: {g['startup_s']:.2f} s (goal <= 2 s: "
        f"{'met' if g['startup_s'] <= 2 else 'not met'})",
    ]
    return medians, verdicts


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.nanogpt", description=__doc__.split("\n\n")[0])
    p.add_argument("--nanogpt", type=Path, required=True, help="a nanoGPT checkout (its train.py is run)")
    p.add_argument(
        "--tinyshakespeare", type=Path, required=True, help="tinyshakespeare.txt, the char-rnn file"
    )
    p.add_argument("--repeats", type=int, default=3, help="runs of each program, alternating (default 3)")
    p.add_argument("--out", type=Path, default=Path("results"))
    p.add_argument("--steps", type=int, default=2000, help="shorter runs to try this script (default 2000)")
    p.add_argument("--eval-every", type=int, default=250, help="with --steps: the evaluation interval")
    a = p.parse_args(argv)
    cadence = Cadence(steps=a.steps, eval_every=a.eval_every, warmup_steps=min(100, a.steps // 10))
    if a.steps == Cadence.steps and a.eval_every == Cadence.eval_every:
        cadence = Cadence()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    check_inputs(a.nanogpt, a.tinyshakespeare)
    info = machine_info("cpu")
    start_load = loadavg()
    rows = compare(a.nanogpt, a.tinyshakespeare, a.repeats, a.out, cadence)
    medians, verdicts = summarize(rows)
    notes = [
        f"{info['cpu']}, {info['cores']} cores, torch {info['torch']}, Python {info['python']}, {info['date']}; "
        f"load average {start_load} at the start, {loadavg()} at the end",
        "nanoGPT: `train.py config/train_shakespeare_char.py "
        + " ".join(nanogpt_flags(cadence))
        + "`; gptmini: "
        "`python -m gptmini.training experiment=shakespeare_char_cpu data=text data.source=tinyshakespeare.txt`"
        + ("" if cadence == Cadence() else " " + " ".join(cadence.overrides())),
        "startup_s: to the first training step (nanoGPT: to its loop, before its step-0 evaluation); "
        "median_step_ms: step end to step end; val_s: what the validations added (nanoGPT: its evaluation "
        "steps beyond the median step; gptmini: validation batches, the work they trigger on the training thread "
        "and the slower steps after them)",
        *verdicts,
    ]
    md = write_table(
        a.out, "nanogpt", "gptmini vs nanoGPT, CPU quick start", [*rows, *medians], COLUMNS, notes
    )
    print(md, flush=True)
    print(markdown_table(medians, ["program", *COLUMNS[2:]]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
