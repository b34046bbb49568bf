"""The clock the end-to-end benchmark adds to a training command (``+callbacks.step_clock=...``): it records when
each step and each validation starts and ends (``benchmarks.end_to_end.Timeline``) and writes them when fitting
ends. Its own hooks do no more than read the time."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import lightning as L

from benchmarks.end_to_end import Timeline


class StepClock(L.Callback):
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.timeline = Timeline()
        self._step_start = 0.0
        self._val_start: float | None = None

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._step_start = time.time()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.timeline.step(self._step_start, time.time(), time.process_time())

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._val_start = time.time() if not trainer.sanity_checking else None

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._val_start is not None:
            self.timeline.validation(self._val_start, time.time())
            self._val_start = None

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        value = trainer.callback_metrics.get("val/loss")
        if value is not None and not trainer.sanity_checking:
            self.timeline.val_loss = float(value)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.timeline.train_end = time.time()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if trainer.is_global_zero:
            self.timeline.write(self.path)
