"""The fixed inputs every head score is measured on (``Probes``; each ``Score`` names its probe), identical across
runs of the same data and seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from gptmini.limits import check_positive

# the synthetic corpus's characters (64, one token each with the char tokenizer)
ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,"


@dataclass(frozen=True)
class Probes:
    text: torch.Tensor  # (B_text, 2P) token ids of real text
    repeated: torch.Tensor  # (B_rep, 2P): [r_0 .. r_{P-1}, r_0 .. r_{P-1}]
    windows: torch.Tensor  # (B_win, block_size + 1): inputs [:, :-1], targets [:, 1:]

    @property
    def period(self) -> int:
        """P: the distance between a token of the second copy and the same token in the first."""
        return self.repeated.size(1) // 2

    def to(self, device: torch.device | str) -> Probes:
        return Probes(self.text.to(device), self.repeated.to(device), self.windows.to(device))


def _evenly_spaced(tokens: np.ndarray, length: int, count: int) -> torch.Tensor:
    """``count`` windows of ``length`` tokens at evenly spaced starts over the whole array: (count, length)."""
    starts = np.linspace(0, len(tokens) - length, num=count).astype(np.int64)
    rows = [np.asarray(tokens[s : s + length]).astype(np.int64) for s in starts]
    return torch.from_numpy(np.stack(rows))


def random_repeated(vocab_size: int, period: int, batch: int, seed: int) -> torch.Tensor:
    """(batch, 2 * period) rows of ``period`` random ids repeated twice. Within a copy the ids are distinct while
    the vocabulary allows (a permutation), so each second-copy token has exactly one earlier occurrence."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(batch):
        if period <= vocab_size:
            first = torch.randperm(vocab_size, generator=gen)[:period]
        else:
            first = torch.randint(0, vocab_size, (period,), generator=gen)
        rows.append(torch.cat([first, first]))
    return torch.stack(rows)


def check_probe_settings(probe_tokens: int, probe_batch: int, loss_windows: int, where: str = "") -> None:
    """ValueError naming the first setting that is not an integer in range (``where``: the config prefix)."""
    for name, value, low in (
        ("probe_tokens", probe_tokens, 4),
        ("probe_batch", probe_batch, 1),
        ("loss_windows", loss_windows, 1),
    ):
        check_positive(f"{where}{name}", value, low)


def make_probes(
    tokens: np.ndarray,
    vocab_size: int,
    block_size: int,
    probe_tokens: int = 128,
    probe_batch: int = 4,
    loss_windows: int = 32,
    seed: int = 1234,
) -> Probes:
    """The probes for a model of context ``block_size`` from a 1-D array of (validation) token ids.

    Probe sequences are ``min(probe_tokens, block_size)`` tokens, rounded down to an even number (two copies of
    P tokens); ``loss_windows`` windows of ``block_size + 1`` tokens score the loss at every position."""
    check_probe_settings(probe_tokens, probe_batch, loss_windows)
    length = min(probe_tokens, block_size) // 2 * 2
    if length < 4:
        raise ValueError(
            f"block_size={block_size} is too short for the head probes: they need at least 4 tokens"
        )
    if len(tokens) < block_size + 1:
        raise ValueError(
            f"the data has {len(tokens)} tokens but the probes need at least block_size + 1 = {block_size + 1}: "
            "use a larger validation split (data.val_fraction) or a smaller block_size"
        )
    text = _evenly_spaced(tokens, length, probe_batch)
    windows = _evenly_spaced(tokens, block_size + 1, loss_windows)
    return Probes(text, random_repeated(vocab_size, length // 2, probe_batch, seed), windows)


def repeated_segments_text(
    n_chars: int, alphabet: str = ALPHABET, min_len: int = 8, max_len: int = 16, seed: int = 0
) -> str:
    """A synthetic corpus on which induction heads form within a minute on a CPU: segments of ``min_len`` to
    ``max_len`` distinct random characters, each written twice in a row ("abcdabcd..."). The second copy of a
    segment is predictable only from the first, at a distance that varies, so only in-context copying (an
    induction head: find the earlier occurrence of the current character, predict what followed it) lowers its
    loss; a one-layer attention-only model cannot do that."""
    if not 2 <= min_len <= max_len <= len(alphabet):
        raise ValueError(
            f"segment lengths min_len={min_len}, max_len={max_len} must satisfy 2 <= min_len <= max_len <= "
            f"{len(alphabet)} (the alphabet's size)"
        )
    rng = np.random.default_rng(seed)
    chars = np.array(list(alphabet))
    parts, size = [], 0
    while size < n_chars:
        segment = "".join(rng.choice(chars, size=int(rng.integers(min_len, max_len + 1)), replace=False))
        parts.append(segment * 2)
        size += 2 * len(segment)
    return "".join(parts)[:n_chars]
