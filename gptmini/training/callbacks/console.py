"""What the console shows while a run trains: the progress bar (a terminal), the plain progress lines (a file
or a pipe), a line at each validation and the model summary."""

from __future__ import annotations

import logging
import math
import sys
import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelSummary, Timer
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.model_summary import get_human_readable_count

from gptmini.limits import check_positive
from gptmini.options import duration
from gptmini.training.callbacks.loggers import LoggingCallback, Receiver, RunParts, TokenThroughputMonitor
from gptmini.training.lightning_compat import (
    LabelledRichProgressBar,
    logs_after_step,
    resume_hooks,
    skip_hooks,
)

log = logging.getLogger(__name__)


def console_is_terminal() -> bool:
    """Whether the console is a terminal, where a progress bar can be redrawn in place (not a file or a pipe)."""
    return sys.stdout.isatty()


class ShowsThroughput(Receiver):
    """A console callback that shows the latest tokens/s: the app hands it the run's ``TokenThroughputMonitor``
    (``receive``; None: the run measures none, and nothing is shown)."""

    throughput: TokenThroughputMonitor | None = None

    def receive(self, parts: RunParts) -> None:
        self.throughput = parts.throughput

    def tokens_per_sec(self) -> float | None:
        if self.throughput is None:
            return None
        return self.throughput.last.get("perf/tokens_per_sec")


class _CurrentStream:
    """A stream that writes to whatever ``sys.stdout``/``sys.stderr`` is at the time of the write: while Rich
    draws the bar it redirects them so that text goes above the bar, which a log handler holding the original
    stream would bypass (its lines then land on the bar's own line)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def write(self, text: str) -> int:
        return getattr(sys, self.name).write(text)

    def flush(self) -> None:
        getattr(sys, self.name).flush()


def follow_console_streams() -> list[tuple[logging.StreamHandler, Any]]:
    """Points Hydra's console handlers at the current stdout/stderr; returns (handler, old stream) pairs."""
    changed = []
    for handler in logging.getLogger().handlers:
        if (
            type(handler) is not logging.StreamHandler
        ):  # not a FileHandler (a subclass): train.log stays as is
            continue
        for name in ("stdout", "stderr"):
            if handler.stream in (getattr(sys, name), getattr(sys, f"__{name}__")):
                changed.append((handler, handler.setStream(_CurrentStream(name))))
                break
    return changed


# the per-batch hooks of Lightning's RichProgressBar (and ProgressBar's own)
BAR_BATCH_HOOKS = ("on_train_batch_end", "on_validation_batch_start", "on_validation_batch_end")


class ProgressBar(ShowsThroughput, LabelledRichProgressBar):
    """Rich progress bar that also shows the latest tokens/s, and names step-based runs "Training" where
    Lightning's own description would read "Epoch 0/-2" (max_epochs=-1). Drawn only when the console is a
    terminal: in a file or a pipe Rich would print the final frame at the end of the log (``ProgressLog``'s plain
    lines say how far the run is there).

    The screen is redrawn ``refresh_rate`` times a second (Lightning's thread); the training bar's count and
    metrics are updated no more often than that either, instead of after every step. The metrics (the training
    loss is a device tensor: reading it waits for the device) only on the steps Lightning writes its logs after,
    so the steps in between never wait for the device here."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._updated_at = self._counted_at = -math.inf
        self._start_step = 0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._start_step = trainer.global_step

    def _by_steps(self) -> bool:
        return self.trainer.max_epochs == -1 and (self.trainer.max_steps or 0) > 0

    @property
    def total_train_batches(self) -> int | float:
        """A step-based run's bar counts the steps this run does, from the one it started or resumed at."""
        return self.trainer.max_steps - self._start_step if self._by_steps() else super().total_train_batches

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if not console_is_terminal():
            self.disable()
        elif trainer.is_global_zero:
            self._streams = follow_console_streams()
        # a bar that is not drawn (not a terminal, or not rank zero) has nothing to do at any batch
        if self.is_disabled:
            skip_hooks(self, *BAR_BATCH_HOOKS)
        else:
            resume_hooks(self, *BAR_BATCH_HOOKS)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().teardown(trainer, pl_module, stage)
        for handler, stream in getattr(self, "_streams", []):
            handler.setStream(stream)
        self._streams = []

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        loss = trainer.callback_metrics.get("train/loss")
        if loss is not None:
            metrics["train/loss"] = float(loss)  # read here, not by Lightning after every step
        # the logger's version, which names nothing here (the TensorBoard run is named after the run)
        metrics.pop("v_num", None)
        rate = self.tokens_per_sec()
        if rate is not None:
            metrics["tok/s"] = f"{rate:,.0f}"
        return metrics

    def train_label(self, trainer: L.Trainer) -> str | None:
        """The training bar's label, or None to keep Lightning's ("Epoch N/M")."""
        if trainer.max_epochs is not None and trainer.max_epochs >= 0:
            return None
        return f"{'Training':{len(self.validation_description)}}"

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # A run resumed mid-epoch creates its bar here, not at the epoch start.
        first = self.train_progress_bar_id is None
        if self._by_steps():  # Lightning counts the epoch's batches: this run's steps instead
            batch_idx = trainer.global_step - self._start_step - 1
        now = time.monotonic()
        period = 1.0 / max(self.refresh_rate, 1e-9)  # not drawn more often than that anyway
        last = trainer.max_steps is not None and 0 <= trainer.max_steps <= trainer.global_step
        # The metrics (the loss: a device tensor) are read only on the steps Lightning reads them for its logs
        # too; the count moves on in between.
        if (
            first
            or last
            or (now - self._updated_at >= period and logs_after_step(trainer, trainer.global_step))
        ):
            self._updated_at = self._counted_at = now
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        elif now - self._counted_at >= period and self.progress is not None:
            self._counted_at = now
            self.progress.update(self.train_progress_bar_id, completed=batch_idx + 1)
            self.refresh()


class ProgressLog(ShowsThroughput, LoggingCallback):
    """One plain line every ``every_n_steps`` optimizer steps (step, training loss, tokens/s, elapsed, ETA) in
    the log, so the console and ``train.log`` show progress where no progress bar can be drawn (a file, a pipe).
    The last step is always logged."""

    WHEN = ("not_a_terminal", "always", "never")

    def __init__(
        self,
        # optimizer steps between two lines
        every_n_steps: int = 50,
        # "not_a_terminal" (the console is not a terminal; a terminal has the progress bar), "always" or "never"
        when: str = "not_a_terminal",
    ) -> None:
        self.every_n_steps = check_positive("callbacks.progress_log.every_n_steps", every_n_steps)
        if when not in self.WHEN:
            raise ValueError(f"callbacks.progress_log.when={when!r} is not one of {', '.join(self.WHEN)}")
        self.when = when
        self._active = False
        self._start_step = self._logged_step = 0
        self._t0 = 0.0
        self.timer: Timer | None = None

    def receive(self, parts: RunParts) -> None:
        super().receive(parts)
        self.timer = parts.timer

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._active = trainer.is_global_zero and (
            self.when == "always" or (self.when == "not_a_terminal" and not console_is_terminal())
        )
        # a resumed run: its rate and ETA from its own start
        self._start_step = self._logged_step = trainer.global_step
        self._t0 = time.monotonic()
        if self._active:
            resume_hooks(self, "on_train_batch_end")
        else:  # no line to write: no call at any step
            skip_hooks(self, "on_train_batch_end")

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step, total = trainer.global_step, trainer.max_steps
        last = total is not None and 0 <= total <= step
        # step == _logged_step: gradient accumulation, several batches end on the same optimizer step
        if not self._active or step == self._logged_step or (step % self.every_n_steps and not last):
            return
        self._logged_step = step
        # this step's loss, not the last logged one's; Lightning hands it over divided by the batches accumulated
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        elapsed = time.monotonic() - self._t0
        parts = [f"step {step}/{total}" if total is not None and total >= 0 else f"step {step}"]
        if loss is not None:
            parts.append(f"loss {float(loss * trainer.accumulate_grad_batches):.4f}")
        rate = self.tokens_per_sec()
        if rate is not None:
            parts.append(f"{rate:,.0f} tok/s")
        parts.append(f"elapsed {duration(elapsed)}")
        done = step - self._start_step
        etas = []
        if total is not None and total > step and done > 0:
            etas.append(elapsed / done * (total - step))
        if total is None or total < 0 or total > step:
            # trainer.max_time: Lightning's Timer stops the run when the budget is spent, whatever the steps left
            etas.append(self.timer.time_remaining("train") if self.timer is not None else None)
        etas = [eta for eta in etas if eta is not None]
        if etas:
            parts.append(f"ETA {duration(max(0.0, min(etas)))}")
        log.info("%s", " | ".join(parts))


class ValidationLog(LoggingCallback):
    """One line at each validation, terminal or not, in the style of nanoGPT's ``step N: train loss X, val loss
    Y``: the step, the latest training loss, and val/loss, val/bpb and val/ppl. The console and ``train.log``
    then show the curve without TensorBoard."""

    @rank_zero_only
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        # step 300: train loss 2.1234, val loss 2.2345, val bpb 1.2345, val ppl 9.35 (a metric not logged: left out)
        parts = []
        for key, digits in (("train/loss", 4), ("val/loss", 4), ("val/bpb", 4), ("val/ppl", 2)):
            value = trainer.callback_metrics.get(key)
            if value is not None:
                parts.append(f"{key.replace('/', ' ')} {float(value):.{digits}f}")
        log.info("step %d: %s", trainer.global_step, ", ".join(parts))


class ParameterSummary(LoggingCallback, ModelSummary):
    """Lightning's model summary without its FLOPs column and "Total FLOPs" line, which read 0 unless the
    module defines an ``example_input_array`` (gptmini's does not: the model's cost is logged as
    ``perf/flops_per_sec`` from ``flops_per_token``). Written to the run's log, not only to the console."""

    on_fit_start = ModelSummary.on_fit_start  # guarded here, as every LoggingCallback's hook

    @staticmethod
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        columns = {
            name: values for name, values in summary_data if name in ("Name", "Type", "Params", "Mode")
        }
        widths = {name: max([len(name), *(len(v) for v in values)]) for name, values in columns.items()}
        rule = "-" * (sum(widths.values()) + 3 * (len(widths) - 1))
        rows = [" | ".join(f"{name:<{w}}" for name, w in widths.items()).rstrip(), rule]
        for i in range(len(columns["Name"])):
            rows.append(" | ".join(f"{columns[name][i]:<{w}}" for name, w in widths.items()).rstrip())
        rows += [
            rule,
            f"{get_human_readable_count(trainable_parameters):<10} trainable params",
            f"{get_human_readable_count(total_parameters - trainable_parameters):<10} non-trainable params",
            f"{model_size:<10,.3f} estimated params size (MB)",
        ]
        log.info("model summary:\n%s", "\n".join(rows))
