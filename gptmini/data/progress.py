"""How far a preparation is: the progress record handed to a callback, rate-limited reporting (a progress bar,
or log lines every ``LOG_EVERY_S`` without one), and the command line's logging set-up."""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gptmini.options import duration

log = logging.getLogger("gptmini.data.prepare")  # the preparation's own log lines, whichever module reports


@dataclass(frozen=True)
class PrepareProgress:
    """How far a preparation is: ``phase`` 'checking' (reading every file once, before any tokenizing) or
    'tokenizing'; bytes of the source files read of ``bytes_total``."""

    phase: str
    documents: int
    tokens: int
    bytes_done: int
    bytes_total: int
    seconds: float


# Seconds between progress updates: of a progress bar, and of log lines when there is none.
BAR_EVERY_S = 0.1
LOG_EVERY_S = 30.0


class Reporter:
    """Rate-limited progress: to ``callback`` (a progress bar), else as log lines (none for a preparation
    quicker than ``LOG_EVERY_S``)."""

    def __init__(self, phase: str, total: int, callback: Callable[[PrepareProgress], None] | None) -> None:
        self.phase, self.total, self.callback = phase, total, callback
        self.every = BAR_EVERY_S if callback is not None else LOG_EVERY_S
        self.t0 = self.last = time.monotonic()

    def __call__(self, documents: int, tokens: int, done: int, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < self.every:
            return
        self.last = now
        p = PrepareProgress(self.phase, documents, tokens, done, self.total, now - self.t0)
        if self.callback is not None:
            self.callback(p)
        elif not force:
            rate = done / max(p.seconds, 1e-9)
            eta = (self.total - done) / rate if rate > 0 else float("inf")
            log.info(
                "%s: %.0f%% of %.1f MB, %s documents, %s tokens, %.1f MB/s, ETA %s",
                self.phase,
                100 * done / max(1, self.total),
                self.total / 1e6,
                f"{documents:,}",
                f"{tokens:,}",
                rate / 1e6,
                duration(eta) if math.isfinite(eta) else "?",
            )


def progress_bar() -> tuple[Callable[[PrepareProgress], None], Any]:
    """A rich progress bar per phase on stderr (MB read, MB/s, ETA, documents, tokens): the ``prepare`` callback,
    and the ``rich.progress.Progress`` to show it with (a context manager; log through its ``console``)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    bar = Progress(
        TextColumn("{task.description:<10}"),
        BarColumn(bar_width=20),
        DownloadColumn(),
        TransferSpeedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[documents]:,} docs {task.fields[tokens]:,} tokens"),
        console=Console(stderr=True),
        transient=True,  # gone at the end: the log's last line stays the last
    )
    tasks: dict[str, Any] = {}

    def update(p: PrepareProgress) -> None:
        if p.phase not in tasks:
            tasks[p.phase] = bar.add_task(p.phase, total=p.bytes_total, documents=0, tokens=0)
        bar.update(tasks[p.phase], completed=p.bytes_done, documents=p.documents, tokens=p.tokens)

    return update, bar


def cli_logging() -> tuple[Callable[[PrepareProgress], None] | None, Any]:
    """Logging for a command that prepares data: on a terminal, a progress bar with the log lines above it;
    else plain log lines (one every 30 s while preparing). Returns the ``prepare`` callback and the context
    that shows the bar."""
    if not sys.stderr.isatty():
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        return None, contextlib.nullcontext()
    from rich.highlighter import NullHighlighter
    from rich.logging import RichHandler

    callback, bar = progress_bar()
    handler = RichHandler(
        console=bar.console,
        show_time=False,
        show_level=False,
        show_path=False,
        markup=False,
        highlighter=NullHighlighter(),
    )
    logging.basicConfig(level=logging.INFO, format="%(message)s", handlers=[handler])
    return callback, bar
