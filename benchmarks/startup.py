"""Start-up: from the command to the first training step of ``gptmini train debug=smoke trainer.max_steps=1``
(its data prepared beforehand) against ``python -c "import torch"``, the two alternating round by round so that
both see the same machine; and the floor under it: the imports a training process cannot skip (Lightning, with and
without what torchmetrics imports eagerly when installed; torch._dynamo, which Lightning imports) and Hydra's
composition (``gptmini train --cfg job``, a whole process)."""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import BenchOptions, loadavg, run_command
from benchmarks.end_to_end import REPO, Timeline

STARTUP_COLUMNS = ["what", "median_s", "min_s", "x_import_torch", "rounds"]
TORCH = 'python -c "import torch"'
TRAIN = "gptmini train debug=smoke trainer.max_steps=1: to the first step"
# what torchmetrics imports at its own import when installed, for metrics training never computes
EAGER = ("transformers", "scipy")


def cpu_name() -> str:
    """The CPU's model name as ``lscpu`` reports it (the machine named in docs/benchmarks.md)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    found = re.search(r"^Model name:\s*(.+)$", out, re.MULTILINE)
    return found.group(1).strip() if found else "unknown"


def imported_seconds(importtime: str, names: tuple[str, ...]) -> float:
    """The seconds ``python -X importtime`` output says the first import of each of ``names`` (with what it
    imported) took."""
    total = 0
    for line in importtime.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[2].strip() in names:
            total += int(parts[1])  # cumulative microseconds
    return total / 1e6


def _python(code: str) -> Callable[[], float]:
    return lambda: run_command([sys.executable, "-c", code], f"python -c {code!r}", cwd=REPO)[0]


def _lightning_without_eager() -> float:
    """``import lightning`` less what its imports of ``EAGER`` took: torchmetrics' availability checks read the
    packages' metadata, so they cannot be kept out of a process that has them installed; this is what the import
    costs where they are not."""
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import lightning"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    wall = time.time() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"import lightning failed:\n{proc.stderr[-3000:]}")
    return wall - imported_seconds(proc.stderr, EAGER)


def bench_startup(opts: BenchOptions) -> tuple[list[dict[str, Any]], list[str]]:
    rounds = 1 if opts.quick else 5
    load_start = loadavg()
    with tempfile.TemporaryDirectory(prefix="gptmini-bench-startup-") as tmp:
        work = Path(tmp)
        base = ["debug=smoke", f"paths.data_root={work / 'data'}", f"paths.output_root={work / 'outputs'}"]
        gptmini = [sys.executable, "-m", "gptmini.cli"]
        run_command([*gptmini, "data", *base], "preparing the smoke run's data", cwd=REPO)

        def train(r: int) -> float:
            clock = work / f"clock{r}.json"
            step_clock = f"+callbacks.step_clock={{_target_:benchmarks.step_clock.StepClock,path:'{clock}'}}"
            started = time.time()
            run_command([*gptmini, "train", *base, "trainer.max_steps=1", step_clock], TRAIN, cwd=REPO)
            return Timeline.read(clock).steps[0][0] - started

        measures: dict[str, Callable[[int], float]] = {
            TORCH: lambda r: _python("import torch")(),
            TRAIN: train,
            'python -c "import lightning"': lambda r: _python("import lightning")(),
            f"import lightning less its {' and '.join(EAGER)} imports": lambda r: _lightning_without_eager(),
            'python -c "import torch._dynamo"': lambda r: _python("import torch._dynamo")(),
            "gptmini train --cfg job (Hydra's composition)": lambda r: run_command(
                [*gptmini, "train", "--cfg", "job", *base], "gptmini train --cfg job", cwd=REPO
            )[0],
        }
        times: dict[str, list[float]] = {name: [] for name in measures}
        for r in range(rounds):  # alternating: each round measures everything once
            for name, measure in measures.items():
                times[name].append(measure(r))
    rows = [
        {
            "what": name,
            "median_s": statistics.median(t),
            "min_s": min(t),
            # per round, against that round's import torch
            "x_import_torch": statistics.median(a / b for a, b in zip(t, times[TORCH], strict=True)),
            "rounds": len(t),
        }
        for name, t in times.items()
    ]
    notes = [
        f"CPU: {cpu_name()}; load average (1/5/15 min) {load_start} at the start, {loadavg()} at the end",
        "each round runs every row once, in the table's order; x_import_torch: the median over rounds of the row "
        "over that round's import torch",
        "the first step: when the training process starts its first batch (benchmarks.step_clock), timed from "
        "just before `gptmini train` starts; the data is prepared before the rounds",
        "import lightning less its eager imports: torchmetrics (which Lightning imports) imports transformers and "
        "scipy.signal when they are installed (make install installs them); its availability checks read their "
        "metadata, so a process that has them cannot keep them out; the row is the import less what "
        "`python -X importtime` says they took",
    ]
    return rows, notes
