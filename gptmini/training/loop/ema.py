"""An exponential moving average of the weights for evaluation: Lightning's ``WeightAveraging`` callback with
``torch.optim.swa_utils``' EMA update.

After each optimizer step from ``start_step`` on the average moves towards the weights, ``avg = decay * avg +
(1 - decay) * w`` (the first update copies them). Validation runs on the average (Lightning swaps it in and back),
checkpoints hold the average as ``state_dict`` (what sampling, evaluation and export read) and the trained weights
as ``current_model_state``, and training ends with the average in the model. A resumed run restores both: the
average continues exactly. Off unless ``callbacks.ema`` is set (docs/training-recipe.md).
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import WeightAveraging
from torch.optim.swa_utils import get_ema_multi_avg_fn


def check_ema(decay: Any, start_step: Any, prefix: str = "callbacks.ema") -> None:
    """Raises ValueError naming the first invalid setting (the constructor runs it: callbacks have no schema)."""
    if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0.0 < decay < 1.0:
        raise ValueError(
            f"{prefix}.decay={decay!r} is invalid: the average's decay per optimizer step, in (0, 1) (e.g. 0.99)"
        )
    if isinstance(start_step, bool) or not isinstance(start_step, int) or start_step < 0:
        raise ValueError(f"{prefix}.start_step={start_step!r} is invalid: an optimizer step >= 0")


class EMAWeightAveraging(WeightAveraging):
    """``WeightAveraging`` with an EMA of decay ``decay`` per optimizer step, updated from optimizer step
    ``start_step`` (0-based) on; parameters and buffers are averaged (the model's buffers are constant tables)."""

    def __init__(self, decay: float = 0.99, start_step: int = 0, device: Any = None) -> None:
        check_ema(decay, start_step)
        super().__init__(device=device, use_buffers=True, multi_avg_fn=get_ema_multi_avg_fn(decay))
        self.decay = decay
        self.start_step = start_step

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        return step_idx is not None and step_idx >= self.start_step
