"""Shared by the benchmarks: options, timing, the machine's description, Markdown/CSV tables."""

from __future__ import annotations

import csv
import datetime as _dt
import io
import logging
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import yaml

from gptmini.conf_dir import conf_dir
from gptmini.fileio import atomic_write_text

if TYPE_CHECKING:
    from gptmini.model import GPTConfig

log = logging.getLogger("benchmarks")


SECTIONS = (
    "attention",
    "train",
    "host",
    "e2e",
    "generate",
    "data",
    "board",
    "runs",
    "startup",
)


# Published A100 numbers of the reference material (book chapter 3 bonus: B=8, T=1024, 12 heads, 768 wide).
A100_REFERENCE_MS = {
    "sdpa (flash)": {"fwd": 1.15, "fwd_bwd": 3.85},
    "ch3 MultiHeadAttention": {"fwd": 3.15, "fwd_bwd": 9.0},
}


TARGETS = {
    "attn_sdpa_vs_ch3": 2.5,  # sdpa at least 2.5x faster than chapter-3 MHA, fwd+bwd at T=1024
    "attn_sdpa_vs_bare": 1.05,  # sdpa within 5% of bare SDPA
    "train_tokens_per_s": 14_000.0,
    "train_lightning_overhead": 1.05,  # Lightning step time within 5% of the bare loop
    "gen_cache_speedup": 5.0,
    "data_prepare_s": 3.0,
    "data_reprepare_s": 0.5,
    "data_wait_share": 0.02,
    # the whole quick-start run (benchmarks/end_to_end.py): time to the first step, and what validations trigger
    # besides their batches as a share of the run
    "e2e_startup_s": 2.0,
    "e2e_extras_share": 0.05,
}


def preset_config(name: str, **overrides: Any) -> GPTConfig:
    """The model ``model=<name>`` composes (``conf/model/<name>.yaml``) with ``overrides``; presets that leave
    ``vocab_size`` to the tokenizer need ``vocab_size=...``."""
    from gptmini.model import GPTConfig

    values = yaml.safe_load((conf_dir() / "model" / f"{name}.yaml").read_text())
    values.pop("init_from", None)  # where weights come from, not a model setting
    return GPTConfig.from_dict(values | overrides)


def shakespeare_text() -> str:
    """The embedded corpus's text (38 plays as dialogue, in a fixed order), as preparation reads it."""
    from gptmini.data.corpora import resolve_source

    return "".join(f.text for f in resolve_source("shakespeare").fragments())


def max_time_string(seconds: float) -> str:
    """Lightning's ``trainer.max_time`` string, DD:HH:MM:SS (whole seconds, at least 1)."""
    s = max(1, round(seconds))
    return f"{s // 86400:02d}:{s % 86400 // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def run_command(cmd: Sequence[str], what: str, cwd: Path | None = None) -> tuple[float, str]:
    """``cmd`` as a fresh process: its wall seconds and its output; raises RuntimeError with the end of its
    output, naming ``what``, when it fails."""
    import subprocess

    t0 = time.time()
    proc = subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True)
    wall = time.time() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return wall, proc.stdout + proc.stderr


def run_module(args: Sequence[str], what: str) -> float:
    """``python -m <args>`` as a fresh process (the benchmarks' training and evaluation commands): its wall
    seconds (``run_command``)."""
    return run_command([sys.executable, "-m", *args], what)[0]


# host allocator of a benchmark process (gptmini.training.hardware.retain_freed_memory)
ALLOC_DEFAULT = "glibc default"


ALLOC_RETAINED = "retained"


@dataclass
class BenchOptions:
    device: str = "cpu"
    quick: bool = False
    compile: bool = True
    out: Path = Path("results")
    # whether this process keeps freed memory for reuse (gptmini.training.hardware.retain_freed_memory), as training does by default;
    # main() turns it on unless --no-retain-memory
    retain_memory: bool = False
    seed: int = 1337
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def allocator(self) -> str:
        return ALLOC_RETAINED if self.retain_memory else ALLOC_DEFAULT


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def median_time(fn: Callable[[], Any], repeats: int, device: str) -> tuple[float, list[float]]:
    """Median wall time of ``repeats`` calls of ``fn`` (already warmed up), in seconds."""
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def interleaved_times(fns: dict[str, Callable[[], Any]], rounds: int, device: str) -> dict[str, list[float]]:
    """Wall times (s) of each of ``fns`` (already warmed up) over ``rounds`` rounds, one run of each in turn per
    round, so background load falls on all of them alike."""
    times: dict[str, list[float]] = {n: [] for n in fns}
    for _ in range(rounds):
        for n, fn in fns.items():
            times[n].append(median_time(fn, 1, device)[0])
    return times


def loadavg() -> str:
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


@contextmanager
def num_threads(n: int | None) -> Iterator[None]:
    """Run the block with ``n`` torch threads (unchanged if None), restoring the previous count after."""
    old = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


@contextmanager
def quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2: the profiler's C++ side prints a line per start/stop there."""

    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no usable fd 2: nothing to silence
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def fmt(value: Any) -> str:
    if value is None or value == "":
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "—"
        if value == 0:
            return "0"
        a = abs(value)
        if a >= 1000:
            return f"{value:,.0f}"
        if a >= 100:
            return f"{value:.1f}"
        if a >= 1:
            return f"{value:.2f}"
        return f"{value:.3g}"
    return str(value)


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(fmt(row.get(c)).replace("|", "\\|") for c in columns) + " |")
    return "\n".join(lines)


def write_table(
    out_dir: Path,
    name: str,
    title: str,
    rows: Sequence[dict[str, Any]],
    columns: Sequence[str],
    notes: Iterable[str] = (),
) -> str:
    """Write ``<name>.md`` and ``<name>.csv`` (atomically); return the Markdown."""
    md = f"## {title}\n\n{markdown_table(rows, columns)}\n"
    notes = list(notes)
    if notes:
        md += "\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({c: "" if row.get(c) is None else row.get(c) for c in columns})
    atomic_write_text(out_dir / f"{name}.md", md)
    atomic_write_text(out_dir / f"{name}.csv", buf.getvalue())
    return md


def machine_info(device: str) -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import lightning

    info = {
        "date": _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "torch threads": str(torch.get_num_threads()),
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        "python": platform.python_version(),
        "device": device,
        "gpu": torch.cuda.get_device_name() if device.startswith("cuda") else "none",
    }
    return info
