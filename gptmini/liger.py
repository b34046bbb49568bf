"""liger-kernel's Triton kernels for the options that name them: ``model.loss=liger`` (its fused linear
cross-entropy, which never materialises the logits) and ``model.fused_ops=liger`` (its LayerNorm and RMSNorm, and
the SwiGLU and squared-ReLU activations of ``model.mlp=swiglu`` and ``relu2``; GPT-2's plain GELU MLP has no liger
kernel, its GELU kernel being the gated GEGLU). liger-kernel is the optional extra ``gpu``
(``pip install 'gptmini[gpu]'``), imported only when an option names it; training refuses the options before any
work where it cannot run (``unavailable``).

The norms keep PyTorch's modules and parameters (``nn.LayerNorm``'s weight and bias), so a checkpoint is the same
whichever kernels trained it; tensors that are not on a CUDA device (a GPU-trained model evaluated on the CPU) go
through PyTorch's own operation, as ``FlexKernel`` hands CPU calls to its CPU kernel.
"""

from __future__ import annotations

import importlib.util

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

INSTALL = "pip install 'gptmini[gpu]'"


def unavailable() -> str | None:
    """Why liger's kernels cannot run on this machine (a clause for a message), or None when they can."""
    if importlib.util.find_spec("liger_kernel") is None:
        return f"liger-kernel is not installed ({INSTALL})"
    if importlib.util.find_spec("triton") is None:
        return f"triton is not installed ({INSTALL} on a Linux machine with a CUDA GPU)"
    if not torch.cuda.is_available():
        return "it runs on CUDA GPUs and this machine has none"
    return None


def linear_cross_entropy(
    h: Tensor, weight: Tensor, targets: Tensor, ignore_index: int = -1, softcap: float | None = None
) -> Tensor:
    """Mean cross entropy of ``softcap(F.linear(h, weight))`` against ``targets`` for h (N, C), weight (V, C),
    targets (N,), by liger's ``liger_fused_linear_cross_entropy`` on a CUDA device."""
    if not h.is_cuda:
        logits = F.linear(h, weight)  # (N, V)
        if softcap is not None:
            logits = softcap * torch.tanh(logits / softcap)
        return F.cross_entropy(logits.float(), targets, ignore_index=ignore_index)
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    return liger_fused_linear_cross_entropy(h, weight, targets, ignore_index=ignore_index, softcap=softcap)


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` computed by liger's ``liger_layer_norm`` on a CUDA device (its kernel takes a bias always:
    zeros, not a parameter, when the model has none)."""

    def forward(self, x: Tensor) -> Tensor:
        if not x.is_cuda:
            return super().forward(x)
        from liger_kernel.transformers.functional import liger_layer_norm

        bias = self.bias if self.bias is not None else torch.zeros_like(self.weight)
        return liger_layer_norm(x, self.weight, bias, self.eps)


class RMSNorm(nn.RMSNorm):
    """``nn.RMSNorm`` computed by liger's ``liger_rms_norm`` on a CUDA device (Llama's casting: the statistics in
    float32)."""

    def forward(self, x: Tensor) -> Tensor:
        if not x.is_cuda:
            return super().forward(x)
        from liger_kernel.transformers.functional import liger_rms_norm

        return liger_rms_norm(x, self.weight, self.eps, in_place=False)


def silu_mul(gate: Tensor, up: Tensor) -> Tensor:
    """``F.silu(gate) * up`` (SwiGLU's activation) in one liger kernel on a CUDA device."""
    if not gate.is_cuda:
        return F.silu(gate) * up
    from liger_kernel.transformers.functional import liger_swiglu

    return liger_swiglu(gate, up)


def relu_squared(x: Tensor) -> Tensor:
    """``F.relu(x).square()`` in one liger kernel on a CUDA device."""
    if not x.is_cuda:
        return F.relu(x).square()
    from liger_kernel.transformers.functional import liger_relu_squared

    return liger_relu_squared(x)
