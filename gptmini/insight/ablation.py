"""Which heads matter: the validation loss change when one head's output is replaced by its mean (mean ablation).

A head's output is the slice of channels it owns at the input of its layer's output projection (head h: channels
``h * hs : (h + 1) * hs``, the layout of every implementation; see ``gptmini.attention.base``). It is read by
running the attention module with an identity output projection (``torch.func.functional_call``: no weight is
touched), so it works for every implementation, fused kernels and ``nn.MultiheadAttention`` included. Replacing
head h's output z_h by its mean z̄_h over all positions of the windows changes the layer's output by
``(z̄_h - z_h) W_o[:, h]^T``, which a forward hook adds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn as nn
from torch.func import functional_call

from gptmini.insight.icl import loss_by_position
from gptmini.model import GPT


def _out_proj_names(attn: nn.Module) -> dict[str, torch.Tensor]:
    """The output projection's parameters by their names inside ``attn``, replaced by an identity."""
    out = attn.out_proj
    if out.weight.size(0) != out.weight.size(1):
        raise ValueError(
            f"{type(attn).__name__}.out_proj is {tuple(out.weight.shape)}, not square: per-head outputs cannot be read"
        )
    names = {id(p): name for name, p in attn.named_parameters()}
    w = out.weight
    identity = {names[id(w)]: torch.eye(w.size(1), dtype=w.dtype, device=w.device)}
    if out.bias is not None:
        identity[names[id(out.bias)]] = torch.zeros_like(out.bias)
    return identity


@torch.no_grad()
def head_outputs(attn: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The concatenated per-head outputs of an attention module before its output projection: (B, T, C)."""
    return functional_call(attn, _out_proj_names(attn), (x,))


@contextmanager
def _attention_hooks(
    model: GPT, edit: Callable[[int, nn.Module, torch.Tensor, torch.Tensor], torch.Tensor | None]
) -> Iterator[None]:
    """Calls ``edit(layer, attn, input, output)`` after every attention module of ``model``; a tensor it returns
    replaces the output. Re-entrant calls (``head_outputs`` runs the module again) are passed through."""
    busy = False

    def hook_for(layer: int) -> Callable:
        def hook(module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor | None:
            nonlocal busy
            if busy:
                return None
            busy = True
            try:
                return edit(layer, module, inputs[0], output)
            finally:
                busy = False

        return hook

    handles = [block.attn.register_forward_hook(hook_for(i)) for i, block in enumerate(model.blocks)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _mean_loss(model: GPT, windows: torch.Tensor, batch_size: int) -> float:
    return float(loss_by_position(model, windows, batch_size).mean())  # (T,) -> the mean over every position


@torch.no_grad()
def mean_ablation(
    model: GPT, windows: torch.Tensor, batch_size: int = 8, progress: Callable[[int], None] | None = None
) -> tuple[float, torch.Tensor]:
    """The mean loss over ``windows`` (B, T + 1), and for each head the loss with that head mean-ablated minus
    it: (n_layer, n_head), positive where the head helps. Costs n_layer * n_head + 1 passes over the windows;
    ``progress(passes)`` is called after each."""
    model.eval()
    c = model.config
    hs = c.n_embd // c.n_head
    sums = torch.zeros(c.n_layer, c.n_embd, dtype=torch.float64)
    count = 0

    def accumulate(layer: int, attn: nn.Module, x: torch.Tensor, output: torch.Tensor) -> None:
        nonlocal count
        sums[layer] += head_outputs(attn, x).double().sum((0, 1)).cpu()  # (C,)
        if layer == 0:
            count += x.shape[0] * x.shape[1]

    with _attention_hooks(model, accumulate):
        base = _mean_loss(model, windows, batch_size)
    if progress is not None:
        progress(1)
    means = (sums / count).float()  # (n_layer, C): z̄ per layer, heads side by side

    delta = torch.zeros(c.n_layer, c.n_head)
    for layer in range(c.n_layer):
        for head in range(c.n_head):

            def ablate(
                i: int,
                attn: nn.Module,
                x: torch.Tensor,
                output: torch.Tensor,
                layer: int = layer,
                cols: slice = slice(head * hs, (head + 1) * hs),
            ) -> torch.Tensor | None:
                if i != layer:
                    return None
                z = head_outputs(attn, x)[..., cols]  # (B, T, hs)
                mean = means[layer, cols].to(z)
                return output + (mean - z) @ attn.out_proj.weight[:, cols].T  # (B, T, C)

            with _attention_hooks(model, ablate):
                delta[layer, head] = _mean_loss(model, windows, batch_size) - base
            if progress is not None:
                progress(2 + layer * c.n_head + head)
    return base, delta
