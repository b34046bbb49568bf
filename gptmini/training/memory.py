"""Whether one training step fits in the device's memory, checked before the model is built."""

from __future__ import annotations

import torch

from gptmini.limits import device_memory
from gptmini.model import GPT, GPTConfig
from gptmini.training.errors import RunError


def training_memory_estimate(
    config: GPTConfig, batch_size: int, precision: str = "32-true"
) -> dict[str, int]:
    """A lower bound of the memory (bytes) one training step of ``config`` on a batch of ``batch_size`` needs on
    one device, by part: the weights with their gradients and AdamW's two moments (16 bytes a parameter), the
    logits with their gradient, and the activations kept for the backward pass (10 values of width n_embd per
    token and layer; the attention matrices of implementations that materialise them are not counted)."""
    with torch.device("meta"):  # counts parameters without allocating or initialising them
        params = GPT(config).num_parameters()
    act = 2 if precision.startswith(("bf16", "16")) else 4  # bytes per activation value
    tokens = batch_size * config.block_size
    return {
        "weights, gradients and AdamW state": 16 * params,
        "logits and their gradient": 2 * act * tokens * config.padded_vocab_size,
        "activations": 10 * act * tokens * config.n_embd * config.n_layer,
    }


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def check_training_memory(
    config: GPTConfig,
    batch_size: int,
    precision: str,
    device: torch.device,
    processes: int = 1,
    available: tuple[int, str] | None = None,
) -> None:
    """Refuses a run whose training step cannot fit in the device's memory (``training_memory_estimate``, a
    lower bound, times ``processes`` sharing one machine's RAM), naming the largest part and the fix."""
    available = available or device_memory(device)
    if available is None:
        return
    parts = training_memory_estimate(config, batch_size, precision)
    need = sum(parts.values()) * (processes if device.type == "cpu" else 1)
    if need <= available[0]:
        return
    largest = max(parts, key=lambda k: parts[k])
    raise RunError(
        f"model.block_size={config.block_size} with data.batch_size={batch_size} needs at least {_gib(need)} of "
        f"memory for one training step ({largest}: {_gib(parts[largest])}) but {available[1]} has "
        f"{_gib(available[0])}: lower model.block_size or data.batch_size (trainer.accumulate_grad_batches keeps "
        "the global batch), or use a smaller model"
    )
