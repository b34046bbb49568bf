"""Whether one training step fits in the memory this process may still take, checked before the model is built:
``gptmini.limits`` holds the estimate (an upper bound measured against real steps) and the check."""

from __future__ import annotations

import torch

from gptmini.limits import check_training_step, training_step_bytes
from gptmini.model import GPTConfig


def training_memory_estimate(
    config: GPTConfig, batch_size: int, precision: str = "32-true"
) -> dict[str, int]:
    """The memory (bytes) one training step needs, by part: ``gptmini.limits.training_step_bytes``."""
    return training_step_bytes(config, batch_size, precision)


def check_training_memory(
    config: GPTConfig,
    batch_size: int,
    precision: str,
    device: torch.device,
    processes: int = 1,
    available: tuple[int, str] | None = None,
) -> None:
    """Refuses a run whose training step cannot fit: ``gptmini.limits.check_training_step``."""
    check_training_step(config, batch_size, precision, device, processes, available)
