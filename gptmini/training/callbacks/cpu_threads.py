"""Torch's CPU threads fitted to the cores other programs leave free, while training runs on the CPU (why, and
when it does nothing: docs/training.md, "Sharing the CPU with other programs"). Every ``interval_s`` seconds of
training it reads how much CPU time other processes took (Linux's ``/proc``), sets ``torch.set_num_threads`` to
the cores left free, and gives the count back when fitting ends."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch

from gptmini.training.lightning_compat import resume_hooks, skip_hooks

log = logging.getLogger(__name__)

PROC = Path("/proc")


@dataclass(frozen=True)
class CpuTimes:
    """One reading of the machine's and this process tree's CPU time, in clock ticks."""

    busy: int  # all cores, every process: total less idle and iowait
    total: int  # all cores
    own: int  # this process and its children (data-loader workers)


def read_cpu_times(proc: Path = PROC) -> CpuTimes:
    """The machine's busy and total ticks (the ``cpu`` line of ``/proc/stat``) and this process's own (user +
    system ticks of ``/proc/self/stat`` and of each child process). Raises ``OSError`` where ``/proc`` is not
    Linux's."""
    fields = [int(v) for v in (proc / "stat").read_text().split("\n", 1)[0].split()[1:]]
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest time is inside user)
    busy = total - fields[3] - fields[4]
    own = process_ticks(proc / "self" / "stat")
    for children in (proc / "self" / "task").glob("*/children"):
        for pid in children.read_text().split():
            try:
                own += process_ticks(proc / pid / "stat")
            except (OSError, ValueError, IndexError):  # the child ended between the two reads
                continue
    return CpuTimes(busy=busy, total=total, own=own)


def process_ticks(stat: Path) -> int:
    # the command name (field 2) may hold spaces and parentheses: count the fields after its closing one
    after = stat.read_text().rsplit(")", 1)[1].split()
    return int(after[11]) + int(after[12])  # utime, stime (fields 14 and 15)


def others_busy_cores(before: CpuTimes, after: CpuTimes, cores: int) -> float:
    """Cores' worth of CPU time that processes other than this one took between two readings."""
    elapsed = (after.total - before.total) / cores  # ticks of one core's clock
    if elapsed <= 0:
        return 0.0
    others = (after.busy - before.busy) - (after.own - before.own)
    return max(0.0, others / elapsed)


def threads_for(others: float, cores: int, most: int) -> int:
    """Threads for the cores ``others`` leave free: rounded to the nearest whole core, within 1..``most``."""
    return max(1, min(most, int(cores - others + 0.5)))


class CpuThreads(L.Callback):
    """``callbacks.cpu_threads``: torch's thread count follows the cores other programs leave free."""

    def __init__(
        self,
        # seconds of training between two readings of the free cores
        interval_s: float = 1.0,
    ) -> None:
        if not isinstance(interval_s, (int, float)) or isinstance(interval_s, bool) or not interval_s > 0:
            raise ValueError(
                f"callbacks.cpu_threads.interval_s={interval_s!r} is invalid: it must be a number of seconds > 0"
            )
        self.interval_s = float(interval_s)
        # every online CPU, as /proc/stat's machine-wide ticks count them (not hardware.cpu_cores: this process's)
        self.cores = os.cpu_count() or 1
        self._start_threads = 0
        self._last: CpuTimes | None = None
        self._last_time = 0.0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last = None
        # nothing to watch (another device, deterministic algorithms, no /proc): no call at any batch
        skip_hooks(self, "on_train_batch_end")
        if pl_module.device.type != "cpu":
            return
        if torch.are_deterministic_algorithms_enabled():
            log.info(
                "trainer.deterministic: torch keeps %d threads whatever other programs use (results would depend "
                "on the thread count)",
                torch.get_num_threads(),
            )
            return
        self._start_threads = torch.get_num_threads()
        try:
            self._last = read_cpu_times()
        except (OSError, ValueError, IndexError):
            log.debug("no Linux /proc here: torch keeps %d threads", self._start_threads)
            return
        self._last_time = time.monotonic()
        resume_hooks(self, "on_train_batch_end")

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._last is None or time.monotonic() - self._last_time < self.interval_s:
            return
        try:
            now = read_cpu_times()
        except (OSError, ValueError, IndexError):
            self._last = None
            skip_hooks(self, "on_train_batch_end")
            return
        others = others_busy_cores(self._last, now, self.cores)
        self._last, self._last_time = now, time.monotonic()
        threads = threads_for(others, self.cores, self._start_threads)
        if threads != torch.get_num_threads():
            log.info(
                "other programs are using %.1f of %d cores: torch threads %d -> %d",
                others,
                self.cores,
                torch.get_num_threads(),
                threads,
            )
            torch.set_num_threads(threads)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore()

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self._restore()

    def _restore(self) -> None:
        if self._start_threads and torch.get_num_threads() != self._start_threads:
            torch.set_num_threads(self._start_threads)
        self._last = None
