"""The key/value cache for incremental decoding: each step feeds only the newest tokens."""

from __future__ import annotations

import torch
from torch import Tensor


class KVCache:
    """Per-layer key/value cache, preallocated to max_len."""

    def __init__(
        self,
        batch_size: int,
        n_head: int,
        max_len: int,
        head_size: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        self.max_len = max_len
        # preallocated once: decoding then writes in place instead of concatenating every step
        self.k = torch.zeros(batch_size, n_head, max_len, head_size, device=device, dtype=dtype)
        self.v = torch.zeros(batch_size, n_head, max_len, head_size, device=device, dtype=dtype)
        self.pos = 0  # number of positions already stored

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        # k, v: (B, nh, T_new, hs) -> keys/values of all positions so far, (B, nh, pos + T_new, hs)
        end = self.pos + k.shape[2]
        if end > self.max_len:
            raise ValueError(
                f"KV cache full: {self.pos} cached + {k.shape[2]} new positions exceed max_len={self.max_len}"
            )
        self.k[:, :, self.pos : end] = k
        self.v[:, :, self.pos : end] = v
        self.pos = end
        # cast back so a cache kept in float32 still works under autocast
        return self.k[:, :, :end].to(k.dtype), self.v[:, :, :end].to(v.dtype)

    def reset(self) -> None:
        self.pos = 0  # old entries are simply overwritten
