"""Token shards: fixed-size files of raw little-endian token ids, written whole or not at all, and read back as
one stream through memory maps. No torch or Lightning.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from gptmini.fileio import fsync_dir, temp_name


def shard_name(index: int) -> str:
    return f"shard_{index:06d}.bin"


class ShardWriter:
    """Appends tokens to ``shard_tokens``-sized shards in ``folder``. A shard is written under a temp name, fsynced
    and renamed when it is full (the last one when ``close`` is called); then ``on_shard(shards, position)``
    records it, with ``position`` the resume point that ``write`` was given for its end. A writer killed at any
    moment leaves whole shards only, plus a temp file that ``remove_stale_temp_files`` clears."""

    def __init__(
        self,
        folder: Path,
        dtype: np.dtype,
        shard_tokens: int,
        shards: Sequence[dict[str, Any]] = (),
        on_shard: Callable[[list[dict[str, Any]], Any], None] | None = None,
    ) -> None:
        self.folder = folder
        self.dtype = np.dtype(dtype)
        self.shard_tokens = shard_tokens
        self.shards = [dict(s) for s in shards]
        self.on_shard = on_shard
        self.tokens = sum(int(s["tokens"]) for s in self.shards)  # written so far, finished shards included
        self._file: IO[bytes] | None = None
        self._tmp: Path | None = None
        self._count = 0  # tokens in the open shard

    def write(self, tokens: np.ndarray, position_at: Callable[[int], Any]) -> None:
        """Append ``tokens``; ``position_at(i)``: where the token stream resumes after the first ``i`` of them."""
        tokens = np.ascontiguousarray(tokens, dtype=self.dtype)
        done = 0
        while done < len(tokens):
            take = tokens[done : done + self.shard_tokens - self._count]
            if self._file is None:
                self._open()
            assert self._file is not None
            self._file.write(take.data)
            self._count += len(take)
            self.tokens += len(take)
            done += len(take)
            if self._count == self.shard_tokens:
                self._finish(position_at(done))

    def close(self) -> list[dict[str, Any]]:
        """Finish the last, shorter shard; the list of every shard, in order."""
        if self._file is not None and self._count > 0:
            self._finish(None)
        self.abort()
        return self.shards

    def abort(self) -> None:
        """Drop the shard being written (an error stopped the preparation)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)
            self._tmp = None

    def _open(self) -> None:
        self._tmp = temp_name(self.folder / shard_name(len(self.shards)))
        # O_EXCL: never follows or overwrites anything
        fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        self._file = os.fdopen(fd, "wb", buffering=1 << 20)
        self._count = 0

    def _finish(self, position: Any) -> None:
        assert self._file is not None and self._tmp is not None
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        name = shard_name(len(self.shards))
        os.replace(self._tmp, self.folder / name)
        self._tmp = None
        fsync_dir(self.folder)
        self.shards.append({"file": name, "tokens": self._count})
        self._count = 0
        if self.on_shard is not None:
            self.on_shard(self.shards, position)


class TokenStream:
    """Tokens ``[start, start + length)`` of shards read as one array: ``len``, integer indexing and slices (a
    view of the memory map inside one shard, a copy across a boundary), ``np.asarray`` (reads it all). Each shard
    is memory-mapped on first use; a pickled stream (DataLoader workers) re-opens its shards by path."""

    def __init__(
        self,
        paths: Sequence[str | Path],
        lengths: Sequence[int],
        dtype: np.dtype | str,
        start: int = 0,
        length: int | None = None,
    ) -> None:
        if len(paths) != len(lengths) or not paths:
            raise ValueError(f"need one length per shard, got {len(paths)} paths and {len(lengths)} lengths")
        self.paths = [str(p) for p in paths]
        self.lengths = [int(n) for n in lengths]
        self.dtype = np.dtype(dtype)
        self._bounds = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)
        total = int(self._bounds[-1])
        self.start = int(start)
        self.length = total - self.start if length is None else int(length)
        if not (0 <= self.start and 0 <= self.length and self.start + self.length <= total):
            raise ValueError(f"range [{start}, {self.start + self.length}) is outside the {total} tokens")
        self._maps: list[np.memmap | None] = [None] * len(self.paths)

    def __len__(self) -> int:
        return self.length

    @property
    def shape(self) -> tuple[int]:
        return (self.length,)

    @property
    def ndim(self) -> int:
        return 1

    def _map(self, i: int) -> np.memmap:
        m = self._maps[i]
        if m is None:
            m = self._maps[i] = np.memmap(self.paths[i], dtype=self.dtype, mode="r", shape=(self.lengths[i],))
        return m

    def _read(self, a: int, b: int) -> np.ndarray:
        if a >= b:
            return np.empty(0, dtype=self.dtype)
        a, b = a + self.start, b + self.start
        first = int(np.searchsorted(self._bounds, a, side="right")) - 1
        last = int(np.searchsorted(self._bounds, b - 1, side="right")) - 1
        parts = []
        for i in range(first, last + 1):
            lo = max(a, int(self._bounds[i])) - int(self._bounds[i])
            hi = min(b, int(self._bounds[i + 1])) - int(self._bounds[i])
            parts.append(self._map(i)[lo:hi])
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def __getitem__(self, key: int | slice) -> Any:
        if isinstance(key, slice):
            a, b, step = key.indices(self.length)
            if step < 0:
                raise IndexError("TokenStream slices need a positive step")
            return self._read(a, b)[::step] if step != 1 else self._read(a, b)
        index = operator.index(key)
        if index < 0:
            index += self.length
        if not 0 <= index < self.length:
            raise IndexError(f"index {key} is out of range for {self.length} tokens")
        return self._read(index, index + 1)[0]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = np.array(self._read(0, self.length))
        return out if dtype is None else out.astype(dtype)

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__ | {"_maps": [None] * len(self.paths)}

    def __repr__(self) -> str:
        return f"TokenStream({self.length} {self.dtype.name} tokens from {len(self.paths)} shard(s))"
