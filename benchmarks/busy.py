"""The speedrun's lead on a busy machine: ``experiment=speedrun_char_cpu``'s whole-process wall clock against a
reference quick start — nanoGPT's own ``train.py`` with its README's CPU flags (``--nanogpt DIR``), else gptmini's
``experiment=shakespeare_char_cpu`` (the same computation) — on a quiet machine and with competing programs on the
same cores: one busy single-threaded process per core, each in a session of its own as another program would be.
The speedrun also runs under load with its thread policy off (``callbacks.cpu_threads=null``: torch keeps one
thread per core), to show what the policy buys. Programs alternate, ``rounds`` times; each run is a fresh process,
timed from its start to its exit.

The goal: the speedrun's median ratio to the reference under load within 1.5x of its quiet ratio.
``python -m benchmarks --only busy --tinyshakespeare input.txt [--nanogpt DIR]`` regenerates the table.
"""

from __future__ import annotations

import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import BenchOptions, loadavg, run_command

log = logging.getLogger("benchmarks")

ROUNDS = 3
GOAL = 1.5  # busy ratio / quiet ratio
# one busy process per core: what a build, a browser tab or another training run does to a laptop's cores
SPINNER = "while True: pass"
QUICK_ARGS = (
    "model.n_layer=1",
    "model.n_embd=32",
    "model.n_head=2",
    "trainer.max_steps=4",
    "trainer.val_check_interval=4",
    "trainer.limit_val_batches=2",
)

BUSY_COLUMNS = ["program", "load", "round", "wall_s", "ratio", "val_loss"]


@dataclass(frozen=True)
class Program:
    name: str
    slug: str  # its run folders' names
    overrides: tuple[str, ...]  # of `python -m gptmini.training`; empty for nanoGPT's train.py


SPEEDRUN = Program("speedrun", "speedrun", ("experiment=speedrun_char_cpu",))
SPEEDRUN_FIXED_THREADS = Program(
    "speedrun, threads fixed",
    "speedrun_fixed",
    ("experiment=speedrun_char_cpu", "callbacks.cpu_threads=null"),
)
QUICK_START = Program("gptmini quick start", "quick_start", ("experiment=shakespeare_char_cpu",))
NANOGPT = Program("nanoGPT quick start", "nanogpt", ())


@contextmanager
def competitors(count: int) -> Iterator[list[int]]:
    """``count`` busy processes, each in its own session, for the duration of the block."""
    procs = [subprocess.Popen([sys.executable, "-c", SPINNER], start_new_session=True) for _ in range(count)]
    try:
        time.sleep(0.5)  # running before the measured program starts
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def gptmini_command(program: Program, source: str, root: Path, name: str, quick: bool) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gptmini.training",
        *program.overrides,
        "data=text",
        f"data.source={source}",
        f"run_name={name}",
        f"paths.output_root={root / 'outputs'}",
        f"paths.data_root={root / 'data'}",
        *(QUICK_ARGS if quick else ()),
    ]


def nanogpt_val_loss(output: str) -> float | None:
    """The last ``step N: train loss .., val loss X`` line of nanoGPT's log."""
    losses = [line.rsplit("val loss", 1)[1] for line in output.splitlines() if "val loss" in line]
    return round(float(losses[-1].strip(" ,")), 4) if losses else None


def run_program(program: Program, ctx: dict[str, Any], name: str) -> dict[str, Any]:
    if program is NANOGPT:
        wall, output = run_command(ctx["nanogpt_cmd"], "nanoGPT's train.py", ctx["nanogpt_dir"])
        return {"wall_s": round(wall, 1), "val_loss": nanogpt_val_loss(output)}
    from benchmarks.recipe import read_run

    cmd = gptmini_command(program, ctx["source"], ctx["root"], name, ctx["quick"])
    wall, _ = run_command(cmd, f"{program.name} ({name})")
    (run_dir,) = (ctx["root"] / "outputs" / name).glob("*/")
    loss = read_run(run_dir)["final_val_loss"]
    return {"wall_s": round(wall, 1), "val_loss": None if loss is None else round(loss, 4)}


def ratios(rows: Sequence[dict[str, Any]], reference: str) -> None:
    """Each row's wall clock over the reference's in the same round and load (in place)."""
    ref = {(r["round"], r["load"]): r["wall_s"] for r in rows if r["program"] == reference}
    for r in rows:
        r["ratio"] = round(r["wall_s"] / ref[(r["round"], r["load"])], 3)


def verdict(rows: Sequence[dict[str, Any]], program: str = SPEEDRUN.name) -> tuple[float, float, float]:
    """Median ratio of ``program`` quiet and busy, and busy / quiet."""

    def median(load: str) -> float:
        return statistics.median(r["ratio"] for r in rows if r["program"] == program and r["load"] == load)

    quiet, busy = median("quiet"), median("busy")
    return quiet, busy, busy / quiet


def bench_busy(opts: BenchOptions) -> tuple[list[dict[str, Any]], list[str]]:
    from benchmarks.nanogpt import NANOGPT_FLAGS, check_inputs, prepare_nanogpt
    from gptmini.data.corpora import prepared_folder_name
    from gptmini.data.prepare import prepare
    from gptmini.training.hardware import cpu_cores

    source = opts.extra.get("tinyshakespeare") or "shakespeare"
    nanogpt = opts.extra.get("nanogpt")
    rounds = opts.extra.get("busy_rounds") or (1 if opts.quick else ROUNDS)
    cores = cpu_cores()  # the cores training may use: one competitor on each
    reference = NANOGPT if nanogpt else QUICK_START
    programs = (SPEEDRUN, reference)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gptmini-bench-busy-") as tmp:
        root = Path(tmp)
        ctx: dict[str, Any] = {"source": source, "root": root, "quick": opts.quick}
        prepare(
            source, "char", root / "data" / prepared_folder_name(source, "char")
        )  # once, outside the clock
        if nanogpt:
            check_inputs(Path(nanogpt), Path(source))
            ctx["nanogpt_dir"] = prepare_nanogpt(Path(nanogpt).resolve(), Path(source), root)
            train_py = Path(nanogpt).resolve() / "train.py"
            config = Path(nanogpt).resolve() / "config" / "train_shakespeare_char.py"
            flags = [*NANOGPT_FLAGS, *(["--max_iters=4", "--eval_interval=2"] if opts.quick else [])]
            ctx["nanogpt_cmd"] = [sys.executable, str(train_py), str(config), *flags]
        for rnd in range(1, rounds + 1):
            for load in ("quiet", "busy"):
                run_list = (*programs, SPEEDRUN_FIXED_THREADS) if load == "busy" else programs
                with competitors(cores if load == "busy" else 0):
                    for program in run_list:
                        log.info(
                            "busy: %s, %s, round %d (load average %s)", program.name, load, rnd, loadavg()
                        )
                        name = f"busy_{load}_{rnd}_{program.slug}"
                        rows.append(
                            {
                                "program": program.name,
                                "load": load,
                                "round": rnd,
                                **run_program(program, ctx, name),
                            }
                        )
                        log.info("busy: %s", rows[-1])
    ratios(rows, reference.name)
    quiet, busy, factor = verdict(rows)
    judged = "quick, not judged" if opts.quick else "met" if factor <= GOAL else "not met"
    fixed = statistics.median(r["ratio"] for r in rows if r["program"] == SPEEDRUN_FIXED_THREADS.name)
    notes = [
        f"reference: {reference.name}"
        + (" (its train.py, README CPU flags)" if nanogpt else " (experiment=shakespeare_char_cpu)")
        + f"; data: {source}; ratio: wall clock over the reference's in the same round and load",
        f"busy: {cores} competing processes (`python -c '{SPINNER}'`, one per core, each in its own session) "
        "running through the whole run",
        f"speedrun / reference, median: quiet {quiet:.3f}, busy {busy:.3f}: busy / quiet = {factor:.2f} "
        f"(goal <= {GOAL}: {judged}); with threads fixed (callbacks.cpu_threads="
        f"null) busy {fixed:.3f}, {fixed / quiet:.2f}x the quiet ratio",
        "regenerate: python -m benchmarks --only busy --tinyshakespeare input.txt --nanogpt /path/to/nanoGPT",
    ]
    if opts.quick:
        notes.append("quick: 4 steps of a 1-layer model per program; checks that the section runs")
    return rows, notes
