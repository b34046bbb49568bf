"""An exponential moving average of the weights for evaluation: Lightning's ``WeightAveraging`` callback with
``torch.optim.swa_utils``' EMA update.

After each optimizer step from ``start_step`` on the average moves towards the weights, ``avg = decay * avg +
(1 - decay) * w`` (the first update copies them). Validation runs on the average (Lightning swaps it in and back).
Every checkpoint keeps the average as ``state_dict`` and the trained weights as ``current_model_state``; how a
resume treats them: docs/training-recipe.md.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import WeightAveraging
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from gptmini.runs.checkpoint import TRAINED_WEIGHTS_KEY as TRAINED_KEY
from gptmini.training.lightning_compat import averaged_model

# Where a checkpoint's average goes while a run resumes from it: the module's hook puts the trained weights in
# "state_dict" (what Lightning restores into the model) and the average here, for this callback to restore.
AVERAGE_KEY = "averaged_state_dict"
# Lightning's key in a checkpoint of WeightAveraging for the AveragedModel's own counters (the trained weights'
# is TRAINED_KEY)
AVERAGING_STATE_KEY = "averaging_state"


def average_into_weights_only(trainer: L.Trainer, checkpoint: dict[str, Any]) -> None:
    """A checkpoint of weights alone (``best.ckpt``; Lightning runs no callback's hook for one) of a run that keeps
    an average gets the average as its ``state_dict``, as every other checkpoint of the run does: the weights its
    validation scored."""
    for callback in trainer.callbacks:
        if isinstance(callback, WeightAveraging) and (average := averaged_model(callback)) is not None:
            checkpoint["state_dict"] = {
                name.removeprefix("module."): value
                for name, value in average.state_dict().items()
                if name.startswith("module.")
            }


class EMAWeightAveraging(WeightAveraging):
    """``WeightAveraging`` with an EMA of decay ``decay`` per optimizer step, updated from optimizer step
    ``start_step`` (0-based) on; parameters and buffers are averaged (the model's buffers are constant tables)."""

    def __init__(self, decay: float = 0.99, start_step: int = 0, device: Any = None) -> None:
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0.0 < decay < 1.0:
            raise ValueError(
                f"callbacks.ema.decay={decay!r} is invalid: the average's decay per optimizer step, in (0, 1) "
                "(e.g. 0.99)"
            )
        if isinstance(start_step, bool) or not isinstance(start_step, int) or start_step < 0:
            raise ValueError(f"callbacks.ema.start_step={start_step!r} is invalid: an optimizer step >= 0")
        super().__init__(device=device, use_buffers=True, multi_avg_fn=get_ema_multi_avg_fn(decay))
        self.decay = decay
        self.start_step = start_step
        self._trained: dict[str, torch.Tensor] | None = None  # set when training ends (``on_train_end``)

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        return step_idx is not None and step_idx >= self.start_step

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        average = averaged_model(self)
        if average is not None:
            # torch's AveragedModel.update_parameters tests its update count, a device tensor, twice a step: each
            # test waits for the device. The same update here keeps the count on the host as well.
            average.update_parameters = partial(self._update, average)
        self._updates: int | None = None
        self._trained: dict[str, torch.Tensor] | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        average = averaged_model(self)
        if average is not None:
            self._updates = int(average.n_averaged)  # restored by a resume: read once, before the first step

    def _update(self, average: AveragedModel, model: torch.nn.Module) -> None:
        """``AveragedModel.update_parameters`` with the EMA of ``decay``: the first update copies the weights,
        each later one moves the average towards them (``torch._foreach_lerp_``, as
        ``get_ema_multi_avg_fn``); parameters and buffers alike."""
        if self._updates is None:
            self._updates = int(average.n_averaged)
        ours = [*average.module.parameters(), *average.module.buffers()]
        theirs = [
            t.detach().to(o.device)
            for t, o in zip([*model.parameters(), *model.buffers()], ours, strict=True)
        ]
        ours = [o.detach() for o in ours]
        with torch.no_grad():
            if self._updates == 0:
                torch._foreach_copy_(ours, theirs)
            else:
                floats = [(o, t) for o, t in zip(ours, theirs, strict=True) if o.is_floating_point()]
                if floats:
                    torch._foreach_lerp_([o for o, _ in floats], [t for _, t in floats], 1 - self.decay)
                for o, t in zip(ours, theirs, strict=True):
                    if not o.is_floating_point():  # integer tables: constant, copied
                        o.copy_(t)
            average.n_averaged.add_(1)
        self._updates += 1

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # the average goes into the model; the trained weights are kept for the checkpoint saved after training
        self._trained = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
        super().on_train_end(trainer, pl_module)

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        super().on_save_checkpoint(trainer, pl_module, checkpoint)
        if self._trained is not None and TRAINED_KEY in checkpoint:
            # after training the model holds the average: Lightning would save it as the trained weights too
            checkpoint[TRAINED_KEY] = self._trained

    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # the model already holds the trained weights (the module's hook put them in "state_dict")
        average = checkpoint.get(AVERAGE_KEY)
        average_model = averaged_model(self)
        if average_model is None:
            return
        if average is None or AVERAGING_STATE_KEY not in checkpoint:
            # a checkpoint without an average: the average starts from the weights the run continues from
            average_model.module.load_state_dict(pl_module.state_dict())
            return
        state = {"module." + name: value for name, value in average.items()}
        average_model.load_state_dict(state | checkpoint[AVERAGING_STATE_KEY])
