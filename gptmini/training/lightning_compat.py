"""The Lightning internals gptmini still relies on, in one place.

Everything else in gptmini uses Lightning's public API. What is here has no public equivalent; each function
names the Lightning versions its behaviour was checked against, and ``tests/unit/training/test_lightning_compat.py``
fails when a Lightning release renames or changes what is relied upon. pyproject caps ``lightning`` below the
first untested minor release: raise the cap only once that test passes on the new release.
"""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar, WeightAveraging
from torch.optim.swa_utils import AveragedModel

# Lightning's rank_zero_info() writes through these loggers (one per sub-package).
_RANK_ZERO_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")
# The prefix of Lightning's advertisement lines ("💡 Tip: For seamless cloud logging ... litlogger",
# "... cloud uploads and versioning ... litmodels"), printed by every Trainer that does not use those products.
_TIP_PREFIX = "💡 Tip:"


def request_graceful_stop(trainer: L.Trainer) -> None:
    """Ask a fitting ``trainer`` to stop at the next batch boundary exactly as after SIGTERM: the training
    loop raises ``SIGTERMException`` there, which the checkpoint-on-exception callback handles.

    Lightning offers only the read-only ``Trainer.received_sigterm``; the flag behind it lives on the private
    signal connector. Sending ourselves a real SIGTERM instead would also make Lightning forward it to launcher
    child processes and broadcast across ranks from inside a signal handler, and would kill the process if it
    arrived while no Lightning handler was installed. Checked with Lightning 2.5.3, 2.5.5 and 2.6.6."""
    trainer._signal_connector.received_sigterm = True


def _not_a_tip(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(_TIP_PREFIX)


def silence_tips() -> None:
    """Drop Lightning's product tips from the log (Lightning has no switch for them); every other message of
    its rank-zero loggers passes. Idempotent. Checked with Lightning 2.5.3, 2.5.5 and 2.6.6."""
    for name in _RANK_ZERO_LOGGERS:
        logger = logging.getLogger(name)
        if _not_a_tip not in logger.filters:
            logger.addFilter(_not_a_tip)


def logs_after_step(trainer: L.Trainer, step: int) -> bool:
    """Whether Lightning writes the values logged with ``on_step=True`` to the loggers after optimizer step
    ``step`` (1-based: ``trainer.global_step`` once the step is done, ``global_step + 1`` before it, as in
    ``on_before_optimizer_step``). Reading a logged device tensor then costs nothing extra: Lightning reads it on
    those steps anyway. Every other step, code that runs per step leaves its tensors on the device.

    Lightning's own test (``_LoggerConnector.should_update_logs``) is private; this is its arithmetic. Checked
    with Lightning 2.6.6."""
    return step % max(1, trainer.log_every_n_steps) == 0 or trainer.should_stop


def loops_as_at_last_batch_end(checkpoint: dict[str, Any]) -> None:
    """The loop state of a checkpoint saved once ``fit`` returned, rewritten as Lightning saves it at the last
    batch's end (``on_train_batch_end``). Resuming a closed epoch, Lightning opens another and replays a validating
    last step's end: the continuation would skip an epoch number and log each step one late. Checked with 2.6.6."""
    fit = checkpoint["loops"]["fit_loop"]
    for counts in fit["epoch_progress"].values():  # the epoch: started, not yet processed
        epochs = counts["completed"]
        counts.update(ready=epochs, started=epochs, processed=epochs - 1, completed=epochs - 1)
    for counts in map(fit["epoch_loop.batch_progress"].get, ("total", "current")):
        counts["completed"] -= 1  # the last batch: processed, its end not yet done
    fit["epoch_loop.state_dict"]["_batches_that_stepped"] -= 1  # counted at the batch's end


def averaged_model(callback: WeightAveraging) -> AveragedModel | None:
    """The ``AveragedModel`` a ``WeightAveraging`` callback keeps (built in its ``setup`` for fitting), or None
    before. Lightning keeps it private; gptmini's EMA replaces its update with one that reads nothing back from
    the device (``gptmini.training.loop.ema``). Checked with Lightning 2.6.6."""
    return callback._average_model


class LabelledRichProgressBar(RichProgressBar):
    """Lightning's ``RichProgressBar`` whose training bar takes its label from ``train_label`` (None: Lightning's
    "Epoch N/M") from its first frame on: at the epoch start and when a run resumed mid-epoch creates the bar
    at its first batch. Rich draws a frame as soon as a bar is added, so relabelling the bar after Lightning
    adds it would show Lightning's label once; the label is made by the private ``_get_train_description``.
    Checked with Lightning 2.6.6."""

    def train_label(self, trainer: L.Trainer) -> str | None:
        return None

    def _get_train_description(self, current_epoch: int) -> str:
        label = self.train_label(self.trainer)
        return super()._get_train_description(current_epoch) if label is None else label


# The hooks Lightning calls on every callback at every training or validation batch.
PER_BATCH_HOOKS = (
    "on_train_batch_start",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
    "on_train_batch_end",
    "on_validation_batch_start",
    "on_validation_batch_end",
)


def skip_idle_hooks(callbacks: list[L.Callback]) -> None:
    """Make a callback that has nothing to do at a batch cost nothing there: each per-batch hook a callback's
    class leaves as ``Callback``'s no-op is set to None on the instance, and Lightning skips it.

    Lightning calls every hook on every callback, each inside a profiler context with a name built from the
    callback's ``state_key``: with a dozen callbacks and eight hooks a batch, that dispatch costs more host time
    per step than the callbacks' own work. Lightning has no switch for it; its dispatcher
    (``trainer.call._call_callback_hooks``) calls a callback's hook only when ``callable(getattr(callback,
    hook))``, so an instance attribute of None is skipped before any of that work. Idempotent. Checked with
    Lightning 2.6.6."""
    for callback in callbacks:
        for hook in PER_BATCH_HOOKS:
            if getattr(type(callback), hook) is getattr(L.Callback, hook):
                setattr(callback, hook, None)


def skip_hooks(callback: L.Callback, *hooks: str) -> None:
    """Stop Lightning from calling ``hooks`` of ``callback`` (per-batch hooks it has nothing to do in for now),
    as ``skip_idle_hooks`` does; ``resume_hooks`` undoes it. Checked with Lightning 2.6.6."""
    for hook in hooks:
        setattr(callback, hook, None)


def resume_hooks(callback: L.Callback, *hooks: str) -> None:
    """Let Lightning call ``hooks`` of ``callback`` again after ``skip_hooks`` (each its class's own method); a
    hook its class leaves as ``Callback``'s no-op stays skipped."""
    for hook in hooks:
        if vars(callback).get(hook, False) is None and getattr(type(callback), hook) is not getattr(
            L.Callback, hook
        ):
            delattr(callback, hook)
