"""Work that a validation logs but training need not wait for — drawing images, encoding them, writing them to
TensorBoard — runs on one background thread, in the order it was submitted.

Callbacks compute what needs the model on the training thread (small tensors, copied to NumPy) and hand the rest
to :func:`submit`. A job must not use torch (its intra-op threads would compete with training's) nor anything
the training thread changes afterwards. Without a :class:`BackgroundWork` in the run, :func:`submit` runs the
job at once. Every job submitted is finished before the loggers close at the end of fitting, whatever ended it,
so no image is lost; a job that fails is logged once (per name) as a warning and never stops the run.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import lightning as L

from gptmini.limits import check_positive

log = logging.getLogger(__name__)


class BackgroundWork(L.Callback):
    """One worker thread for the logging jobs of a run (see the module docstring)."""

    def __init__(
        self,
        # jobs allowed to wait at once; one more blocks its submitter until the oldest is done, so a renderer
        # slower than validation holds training up instead of piling up memory
        max_pending: int = 8,
    ) -> None:
        self.max_pending = check_positive("callbacks.background.max_pending", max_pending)
        self._executor: ThreadPoolExecutor | None = None
        self._slots = threading.BoundedSemaphore(max_pending)
        self._reported: set[str] = set()

    def submit(self, name: str, job: Callable[[], Any]) -> None:
        """Queues ``job()``; ``name`` labels it in the warning if it fails."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gptmini-logging")
        self._slots.acquire()
        try:
            self._executor.submit(self._run, name, job)
        except BaseException:
            self._slots.release()
            raise

    def _run(self, name: str, job: Callable[[], Any]) -> None:
        try:
            job()
        except Exception as err:
            if name not in self._reported:
                self._reported.add(name)
                log.warning(
                    "background job %r failed and is skipped; training goes on (reported once): %s: %s",
                    name,
                    type(err).__name__,
                    err,
                    exc_info=True,
                )
        finally:
            self._slots.release()

    def close(self) -> None:
        """Returns once every job submitted so far is done (_run never raises)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    # Lightning closes the loggers right after these hooks (on success: after teardown; on an exception: after
    # on_exception), so everything queued reaches them first.
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.close()

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self.close()


def submit(worker: BackgroundWork | None, name: str, job: Callable[[], Any]) -> None:
    """Runs ``job()`` on the run's :class:`BackgroundWork` thread, or at once when the run has none."""
    if worker is None:
        job()
    else:
        worker.submit(name, job)
