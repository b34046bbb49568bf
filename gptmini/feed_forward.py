"""The blocks' feed-forward sublayers by ``model.mlp`` choice (``FEED_FORWARDS``; ``none`` builds no
sublayer). Each is built from the model's ``GPTConfig`` (``n_embd``, ``mlp_width``, ``bias``, ``dropout``) and
names the hidden matrices an orthogonalising optimizer (Muon) may take. ``model.fused_ops=liger`` computes the
SwiGLU and squared-ReLU activations with liger-kernel's kernels (``gptmini.liger``); GELU has none there.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptmini import liger


class MLP(nn.Module):
    """Linear, activation, Linear: GPT-2's GELU (tanh-approximated, as GPT-2's, unless ``config.gelu_approximate``
    is "none"), or modded-nanogpt's squared ReLU (So et al., Primer) for ``mlp=relu2``."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, config.mlp_width, bias=config.bias)
        self.c_proj = nn.Linear(config.mlp_width, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)
        if config.mlp == "gelu":
            self.act: Any = nn.GELU(approximate=config.gelu_approximate)
        else:
            self.act = liger.relu_squared if config.fused_ops == "liger" else _relu_squared

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))  # (B, T, C)

    def hidden_matrices(self) -> list[nn.Parameter]:
        # the 2-D weights an orthogonalising optimizer (Muon) may take: see GPT.parameter_roles
        return [self.c_fc.weight, self.c_proj.weight]


class SwiGLU(nn.Module):
    """Llama's gated feed-forward sublayer (Shazeer 2020): ``c_proj(silu(w_gate(x)) * w_up(x))``.

    The output projection keeps GPT-2's name ``c_proj`` so initialisation scales it as a residual projection."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.w_gate = nn.Linear(config.n_embd, config.mlp_width, bias=config.bias)
        self.w_up = nn.Linear(config.n_embd, config.mlp_width, bias=config.bias)
        self.c_proj = nn.Linear(config.mlp_width, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)
        self.act = liger.silu_mul if config.fused_ops == "liger" else _silu_mul

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.act(self.w_gate(x), self.w_up(x))))  # (B, T, C)

    def hidden_matrices(self) -> list[nn.Parameter]:
        return [self.w_gate.weight, self.w_up.weight, self.c_proj.weight]


def _relu_squared(x: torch.Tensor) -> torch.Tensor:
    return F.relu(x).square()


def _silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


FEED_FORWARDS: dict[str, type[nn.Module]] = {"gelu": MLP, "swiglu": SwiGLU, "relu2": MLP}
