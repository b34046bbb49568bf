"""Token array -> (x, y) training windows, and the samplers that feed them to a DataLoader, split across ranks.

torch, no Lightning: evaluation builds its loader from these directly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from gptmini.data.reader import bad_id, check_split_length


class _WindowDataset(Dataset):
    """``vocab_size``: every window served is checked to hold ids below it (a damaged shard is refused with one
    DataError instead of indexing past the embedding table)."""

    def __init__(self, tokens: np.ndarray, block_size: int, name: str, vocab_size: int | None = None) -> None:
        check_split_length(name, len(tokens), block_size)
        self.tokens = tokens
        self.block_size = block_size
        self.name = name
        self.vocab_size = vocab_size

    def window(self, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = np.asarray(self.tokens[start : start + self.block_size + 1]).astype(np.int64)
        chunk = torch.from_numpy(ids)  # (block_size + 1,)
        # checked in NumPy: the tokens are host memory, and a torch scalar read costs more per window
        if self.vocab_size is not None and ids.max() >= self.vocab_size:
            at = f" in tokens [{start}, {start + self.block_size + 1})"
            raise bad_id(f"split {self.name!r}", int(ids.max()), at, self.vocab_size)
        return chunk[:-1], chunk[1:]  # x, y: (block_size,) each, y = x shifted by one token

    # Workers started with spawn/forkserver get the memmap re-opened by path instead of a pickled copy.
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        t = self.tokens
        if isinstance(t, np.memmap) and t.filename is not None:
            state["tokens"] = ("memmap", t.filename, t.dtype.str, t.offset, t.shape)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        t = state["tokens"]
        if isinstance(t, tuple) and t[0] == "memmap":
            _, filename, dtype, offset, shape = t
            state["tokens"] = np.memmap(filename, dtype=np.dtype(dtype), mode="r", offset=offset, shape=shape)
        self.__dict__.update(state)


class RandomWindowDataset(_WindowDataset):
    """``num_samples`` random windows (nanoGPT-style); window ``i`` is a pure function of (seed, i).

    Starts are drawn in blocks of ``CHUNK`` from ``np.random.default_rng([seed, i // CHUNK])``, so any
    index can be computed directly (no state to save), by any worker, in any order. Indices past
    ``num_samples`` are valid too: the train sampler walks one endless stream of indices across epochs.
    """

    CHUNK = 4096

    def __init__(
        self,
        tokens: np.ndarray,
        block_size: int,
        num_samples: int,
        seed: int,
        name: str = "train",
        vocab_size: int | None = None,
    ) -> None:
        super().__init__(tokens, block_size, name, vocab_size)
        self.num_samples = num_samples
        self.seed = seed
        self._starts: tuple[int, np.ndarray] | None = None  # last block drawn: indices mostly come in order

    def __len__(self) -> int:
        return self.num_samples

    def start(self, index: int) -> int:
        if index < 0:
            raise IndexError(f"index {index} < 0")
        block, offset = divmod(index, self.CHUNK)
        if self._starts is None or self._starts[0] != block:
            rng = np.random.default_rng([self.seed, block])
            self._starts = (block, rng.integers(0, len(self.tokens) - self.block_size, size=self.CHUNK))
        return int(self._starts[1][offset])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.window(self.start(index))


class StridedWindowDataset(_WindowDataset):
    """Windows at 0, stride, 2*stride, ... plus one final window ending at the last token, so every
    target token is scored at least once (the tail window may overlap its neighbour)."""

    def __init__(
        self,
        tokens: np.ndarray,
        block_size: int,
        stride: int | None = None,
        name: str = "val",
        vocab_size: int | None = None,
    ) -> None:
        super().__init__(tokens, block_size, name, vocab_size)
        stride = block_size if stride is None else stride
        last = len(tokens) - block_size - 1
        starts = np.arange(0, last + 1, stride, dtype=np.int64)
        if starts[-1] != last:
            starts = np.append(starts, last)
        self.starts = starts

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.window(int(self.starts[index]))


class StreamSampler(Sampler[int]):
    """Consecutive global sample indices, ``num_samples`` per pass, starting where training stands.

    ``start()`` gives the first index of a pass (the DataModule passes "samples trained so far"); without
    it, or when it returns None, a pass starts at ``epoch * num_samples``. Under data parallelism rank ``r``
    of ``world_size`` takes indices ``first + r, first + r + world_size, ...``: the ranks together walk the
    same stream a single process would, so a run's batches do not depend on how it is distributed.
    """

    def __init__(
        self,
        num_samples: int,
        start: Callable[[], int | None] | None = None,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
        self.num_samples = num_samples
        self.epoch = 0
        self._start = start
        self.rank = rank
        self.world_size = world_size

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_samples // self.world_size

    def __iter__(self) -> Iterator[int]:
        first = self._start() if self._start is not None else None
        if first is None:
            first = self.epoch * self.num_samples
        return iter(range(first + self.rank, first + len(self) * self.world_size, self.world_size))


class ShardSampler(Sampler[int]):
    """Rank ``r`` of ``world_size`` takes indices r, r + world_size, ... of ``n`` (uneven, no padding), so a
    token-weighted mean reduced across ranks equals the single-process mean exactly."""

    def __init__(self, n: int, rank: int = 0, world_size: int = 1) -> None:
        self.n, self.rank, self.world_size = n, rank, world_size

    def __len__(self) -> int:
        return len(range(self.rank, self.n, self.world_size))

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.n, self.world_size))


# The train split is kept on the GPU when its tokens (int32 there) take at most this share of the GPU's memory:
# windows are then cut on the device, and a step copies nothing but its window starts to it.
DEVICE_SPLIT_SHARE = 0.05
DEVICE_TYPES = ("cuda",)  # the device types whose memory may hold the split


def split_fits_device(tokens: int, device: torch.device, memory: int | None) -> bool:
    """The size rule of ``DeviceWindows``: a device of ``DEVICE_TYPES`` with ``memory`` bytes, of which the split's
    tokens as int32 take at most ``DEVICE_SPLIT_SHARE``."""
    return device.type in DEVICE_TYPES and memory is not None and 4 * tokens <= DEVICE_SPLIT_SHARE * memory


class DeviceWindows(Dataset):
    """The windows of a ``RandomWindowDataset``, a batch at a time, cut from a copy of its tokens on ``device``:
    ``dataset[indices]`` is ``(x, y)``, each (len(indices), block_size) int64 on the device, equal to stacking
    ``dataset.window`` of each index's start. Only the starts travel, from pinned memory without waiting
    (``non_blocking``); ids are checked against the vocabulary once, when the tokens are copied. Use it with a
    ``BatchSampler`` and ``batch_size=None``."""

    def __init__(self, windows: RandomWindowDataset, device: torch.device) -> None:
        self.windows = windows
        self.device = device
        tokens = torch.from_numpy(np.asarray(windows.tokens).astype(np.int32))
        if windows.vocab_size is not None and len(tokens) and int(tokens.max()) >= windows.vocab_size:
            raise bad_id(f"split {windows.name!r}", int(tokens.max()), "", windows.vocab_size)
        self.tokens = tokens.to(device)  # (n,) int32
        self.offsets = torch.arange(windows.block_size + 1, device=device)  # (block_size + 1,)

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.tensor([self.windows.start(i) for i in indices], dtype=torch.int64)  # (B,)
        if self.device.type == "cuda":
            starts = starts.pin_memory()
        starts = starts.to(self.device, non_blocking=True)
        chunk = self.tokens[starts[:, None] + self.offsets].long()  # (B, block_size + 1)
        return chunk[:, :-1], chunk[:, 1:]  # x, y: (B, block_size) each
