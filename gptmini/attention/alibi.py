"""ALiBi (Press et al. 2022, "Train Short, Test Long"): no position embedding; each head adds
``-slope * distance`` to its attention scores, so attention fades with distance at a per-head rate."""

from __future__ import annotations

import math

import torch
from torch import Tensor

# ALiBi's masks (every path but FlexAttention's in-kernel bias) hold -inf where the bias would fall below this: keys
# more than -FLOOR / slope tokens back. Such a key's weight is below e^-80 of the nearest key's unless its logit
# beats that key's by tens of nats, so nothing a float32 row sum can hold is lost; left finite, their exponentials
# are denormal numbers, which x86 CPUs compute many times slower (docs/benchmarks.md).
ALIBI_BIAS_FLOOR = -80.0


def alibi_slopes(n_head: int) -> Tensor:
    """The paper's geometric slopes: for 2^k heads, 2^(-8/n), 2^(-16/n), ..., 2^-8; otherwise those of the
    nearest smaller power of two, then every other slope of the next power of two."""

    def power_of_two(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]

    closest = 2 ** math.floor(math.log2(n_head))
    slopes = power_of_two(closest)
    if closest != n_head:
        slopes += power_of_two(2 * closest)[0::2][: n_head - closest]
    return torch.tensor(slopes)  # (n_head,)


def score_mask(
    n_head: int, queries: int, start: int, slopes: Tensor | None, window: int | None, device: torch.device
) -> Tensor:
    """What is added to the scores of ``queries`` new tokens at absolute positions start.. against keys
    0..start + queries - 1: -inf for the future and (with a window) for keys ``window`` or more tokens back,
    else ``-slope_h * distance`` with ALiBi (-inf below ``ALIBI_BIAS_FLOOR``) or 0. Shape (1, n_head, T, S) with
    slopes, else (1, 1, T, S): four dimensions, because SDPA's fused CPU kernel takes only a 4-D mask (with a 3-D
    one it runs the unfused math)."""
    q_pos = torch.arange(start, start + queries, device=device)[:, None]  # (T, 1)
    k_pos = torch.arange(start + queries, device=device)[None, :]  # (1, S)
    distance = q_pos - k_pos  # (T, S): >= 0 for the past
    allowed = distance >= 0
    if window is not None:
        allowed &= distance < window
    if slopes is None:
        return torch.zeros(1, 1, *distance.shape, device=device).masked_fill(~allowed, float("-inf"))
    bias = -slopes.to(device)[None, :, None, None] * distance  # (1, nh, T, S)
    return bias.masked_fill(~allowed | (bias < ALIBI_BIAS_FLOOR), float("-inf"))
