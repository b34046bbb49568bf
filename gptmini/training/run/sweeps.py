"""Sweeps (``-m``): every job runs whichever fail, and the sweep ends with the failures (``SweepSummary``)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from hydra.experimental.callback import Callback as HydraCallback
from omegaconf import DictConfig


@dataclass(frozen=True)
class JobFailed:
    """What a sweep job whose run failed returns in place of its val/loss (the app logged the error already): the
    sweep goes on to its next job, and ``SweepSummary`` reports it at the end."""

    exit_status: int
    message: str


class SweepSummary(HydraCallback):
    """A Hydra callback (``hydra.callbacks`` in conf/train.yaml): every job of a sweep (``-m``) runs, whichever
    fail; the sweep ends with one line per failed job (its overrides and error) and the exit status of the first
    failure (2: invalid input, 3: non-finite loss). Jobs run in this process (Hydra's basic launcher)."""

    def __init__(self) -> None:
        self.jobs = 0
        self.failed: list[tuple[str, JobFailed]] = []

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        from hydra.core.utils import JobStatus

        self.jobs += 1
        # (an unexpected exception, status FAILED, is raised by Hydra itself once the sweep's jobs have run)
        if job_return.status == JobStatus.COMPLETED and isinstance(job_return.return_value, JobFailed):
            self.failed.append((" ".join(job_return.overrides or []), job_return.return_value))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if not self.failed:
            return
        lines = [f"error: {len(self.failed)} of {self.jobs} sweep jobs failed:"]
        lines += [f"  [{overrides}] {failure.message}" for overrides, failure in self.failed]
        sys.stderr.write("\n".join(lines) + "\n")
        sys.exit(self.failed[0][1].exit_status)
