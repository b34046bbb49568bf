"""In-context learning: the loss at each position of the context, the ICL score, and the phase change.

The ICL score (docs/insight.md) compares two bands of positions relative to the context length T
(``icl_bands``) rather than Olsson et al.'s 500th and 50th tokens: contexts here are often 64-256 tokens, and the
loss of one position over a few dozen validation windows is noisy.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from gptmini.model import GPT


@torch.no_grad()
def loss_by_position(model: GPT, windows: torch.Tensor, batch_size: int = 8) -> torch.Tensor:
    """Mean cross entropy (nats) at each position of the context over ``windows`` (B, T + 1) of token ids (inputs
    ``[:, :-1]``, targets ``[:, 1:]``): (T,), on the CPU. Runs the plain (uncompiled) model in chunks of
    ``batch_size`` windows."""
    device = next(model.parameters()).device
    total = torch.zeros(windows.size(1) - 1, dtype=torch.float64)
    for chunk in windows.split(batch_size):
        chunk = chunk.to(device)
        x, y = chunk[:, :-1], chunk[:, 1:]  # (b, T) each
        total += model.token_losses(x, y).sum(0).double().cpu()  # (b, T) losses, summed over windows
    return (total / windows.size(0)).float()


def icl_bands(t: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The positions ``[start, end)`` of the early and the late band of a ``t``-token context."""
    early = (max(1, t // 20), max(2, t // 5))
    late = (max(early[1], t // 2), t)
    return early, late


def icl_score(losses: torch.Tensor) -> float:
    """Mean loss late in the context minus mean loss early in it (``icl_bands``), from ``loss_by_position``:
    negative when the model uses its context."""
    (e0, e1), (l0, l1) = icl_bands(losses.numel())
    return float(losses[l0:l1].mean() - losses[e0:e1].mean())


@dataclass
class PhaseChange:
    """The induction phase change, seen between two validations."""

    step: int  # the validation that saw it
    previous_step: int  # the validation before it
    heads: list[dict[str, Any]]  # per head that became an induction head: layer, head, before, after
    icl_before: float  # the ICL score at its highest so far (least in-context learning)
    icl_after: float

    def describe(self) -> str:
        heads = ", ".join(
            f"layer {h['layer']} head {h['head']} ({h['before']:.2f} -> {h['after']:.2f})" for h in self.heads
        )
        return (
            f"induction phase change between step {self.previous_step} and step {self.step}: induction score of "
            f"{heads}; ICL score {self.icl_before:+.3f} -> {self.icl_after:+.3f} nats"
        )


@dataclass
class PhaseChangeDetector:
    """Says once when induction heads form and in-context learning switches on: the first validation where some
    head's induction score is at least ``induction_threshold`` and has risen by ``min_rise`` or more since the
    first validation seen, while the ICL score has fallen by ``icl_drop`` nats or more below its highest value
    so far. Its state is plain data (a checkpoint stores it, so a resumed run does not report it twice)."""

    induction_threshold: float = 0.4
    min_rise: float = 0.2
    icl_drop: float = 0.05
    baseline: list[list[float]] | None = None  # (n_layer, n_head) induction scores at the first validation
    icl_max: float | None = None
    last_step: int | None = None
    fired: dict[str, Any] | None = field(default=None)

    def update(self, step: int, induction: torch.Tensor, icl: float) -> PhaseChange | None:
        """Feed one validation's induction scores (n_layer, n_head) and ICL score; the phase change the first time
        it is seen, else None."""
        previous = self.last_step
        self.last_step = step
        if self.baseline is None:
            self.baseline = induction.tolist()
            self.icl_max = icl
            return None
        base = torch.tensor(self.baseline)
        icl_before = self.icl_max if self.icl_max is not None else icl  # the highest of the earlier ones
        self.icl_max = max(icl_before, icl)
        if self.fired is not None:
            return None
        risen = (induction >= self.induction_threshold) & (induction - base >= self.min_rise)
        if not bool(risen.any()) or icl > icl_before - self.icl_drop:
            return None
        heads = [
            {
                "layer": int(layer),
                "head": int(head),
                "before": float(base[layer, head]),
                "after": float(induction[layer, head]),
            }
            for layer, head in risen.nonzero().tolist()
        ]
        heads.sort(key=lambda h: -h["after"])
        change = PhaseChange(step, previous if previous is not None else step, heads, icl_before, icl)
        self.fired = asdict(change)
        return change

    def state_dict(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in _DETECTOR_STATE}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in _DETECTOR_STATE:
            setattr(self, key, state.get(key))


# what a checkpoint keeps of a PhaseChangeDetector (its thresholds are settings)
_DETECTOR_STATE = ("baseline", "icl_max", "last_step", "fired")
