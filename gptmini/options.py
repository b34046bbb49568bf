"""Command-line options checked where they are parsed: numbers finite and in range (argparse ``type=`` functions,
so a bad value is argparse's one-line usage error, exit status 2, naming the option), and the one rule for
``--device`` (:func:`resolve_device`), which names the real cause of a device this machine cannot use; and the
progress lines of the commands that work for a while (:class:`EtaProgress`)."""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from collections.abc import Callable

# The seed of a run (seed=) and of sampling (gptmini sample --seed) when none is given.
DEFAULT_SEED = 1337


def int_at_least(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer >= ``low`` (and <= ``high``)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low or (high is not None and value > high):
            span = f">= {low}" if high is None else f"in [{low}, {high}]"
            raise argparse.ArgumentTypeError(f"{text} is out of range: it must be an integer {span}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


positive_int = int_at_least(1)
# A random seed: what torch.manual_seed and NumPy take (a 64-bit integer, kept non-negative).
seed_int = int_at_least(0, 2**63 - 1)


def finite_float(
    low: float | None = None, high: float | None = None, low_open: bool = False
) -> Callable[[str], float]:
    """An argparse type: a finite number in [low, high] (``low_open``: (low, high])."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text} is not a finite number")
        below = low is not None and (value <= low if low_open else value < low)
        if below or (high is not None and value > high):
            lo = "-inf" if low is None else f"{low:g}"
            hi = "inf" if high is None else f"{high:g}"
            raise argparse.ArgumentTypeError(
                f"{text} is out of range: it must be in {'(' if low_open or low is None else '['}{lo}, {hi}"
                f"{']' if high is not None else ')'}"
            )
        return value

    parse.__name__ = "number"
    return parse


def resolve_device(spec: str, option: str = "--device") -> str:
    """``auto``: ``cuda`` when PyTorch sees a GPU, else ``cpu``. Any other value must name a device this machine
    has (cpu, cuda, cuda:N, mps): else ValueError naming the option, the value and why."""
    # imported here, not with the module: commands that run no model (`gptmini runs`) start without torch
    import torch

    if spec == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(spec)
    except (RuntimeError, ValueError):
        raise ValueError(f"{option} {spec!r} is not a device: use auto, cpu, cuda or cuda:N") from None
    if device.type == "cpu":
        if device.index not in (None, 0):
            raise ValueError(f"{option} {spec}: the CPU is one device, cpu (or cpu:0): use --device cpu")
        return spec
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(
                f"{option} {spec}: PyTorch sees no CUDA GPU on this machine (a CPU-only build or no driver): "
                "use --device cpu (or auto)"
            )
        if device.index is not None and device.index >= count:
            raise ValueError(
                f"{option} {spec}: this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}"
            )
        return spec
    if device.type == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError(
                f"{option} {spec}: Apple's MPS is not available on this machine: use --device cpu"
            )
        return spec
    raise ValueError(f"{option} {spec}: gptmini's commands run on cpu, cuda or mps, not {device.type}")


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Every command's ``--help``: the description as written (its paragraphs and example lines), and each
    option's default after its help."""


class EtaProgress:
    """``progress(done, total)`` for a long command (``eval``, ``analyze``): a log line at most every
    ``every_s`` seconds and at the end, e.g. ``eval: 120/480 batches (25%), elapsed 30s, ETA 1m30s``; nothing for
    work done within ``every_s``. Plain log lines: readable in a terminal, a file or a pipe alike."""

    def __init__(self, log: logging.Logger, what: str, unit: str, every_s: float = 5.0) -> None:
        self.log, self.what, self.unit, self.every_s = log, what, unit, every_s
        self.t0 = self.last = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        finished = done >= total
        if now - self.last < self.every_s and not (finished and now - self.t0 >= self.every_s):
            return
        self.last = now
        elapsed = now - self.t0
        eta = "" if finished or done == 0 else f", ETA {duration(elapsed / done * (total - done))}"
        self.log.info(
            "%s: %s/%s %s (%d%%), elapsed %s%s",
            self.what,
            f"{done:,}",
            f"{total:,}",
            self.unit,
            100 * done // max(1, total),
            duration(elapsed),
            eta,
        )


def duration(seconds: float) -> str:
    """``1h02m03s``, ``2m05s`` or ``7s``."""
    s = int(round(seconds))
    h, m = divmod(s, 3600)
    m, s = divmod(m, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def starting(prog: str, what: str) -> None:
    """One line on a terminal at once, before a command's seconds of imports and composing: it has started."""
    if sys.stderr.isatty():
        sys.stderr.write(f"{prog}: {what}...\n")
        sys.stderr.flush()
