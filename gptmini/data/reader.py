"""A prepared data folder, read back and validated: its index, its splits as token arrays, its tokenizer, and the
checks a model or a run makes against it. The writer is ``gptmini.data.prepare``.

Prepared layout (see data/README.md): ``meta.json`` is the index, written last and atomically, and the only proof
that a folder is complete. It names a folder ``tokens-<inputs>/`` of fixed-size shards ``shard_000000.bin``, ...:
raw little-endian token arrays (uint16 when the vocabulary fits, else uint32) that ``np.memmap`` opens in place.
The shards hold one token stream (each document followed by the tokenizer's end-of-text token) and the splits are
ranges of it, nanoGPT's rule: train the first ``1 - val_fraction`` of the tokens, val the rest.

Every reader checks what it relies on (every field of meta.json, by ``gptmini.data.schema``; each shard's size) and raises one
``DataError`` naming the file and the fix. NumPy only: opening data imports neither torch nor the writer.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from gptmini.data.errors import DataError
from gptmini.data.schema import FORMAT_VERSION, META_FILE, SPLITS, check_meta, inside
from gptmini.data.shards import TokenStream
from gptmini.data.tokenizers import Tokenizer, build_tokenizer, json_sha256
from gptmini.fileio import name_too_long

__all__ = ["DTYPES", "FORMAT_VERSION", "META_FILE", "SPLITS", "load_meta", "load_split", "load_tokenizer"]

DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}


def load_meta(data_dir: str | Path) -> dict[str, Any]:
    """meta.json of ``data_dir``, every field validated (``gptmini.data.schema``): DataError if any is wrong."""
    data_dir = Path(data_dir)
    path = data_dir / META_FILE
    too_long = name_too_long(path)
    if too_long:
        raise DataError(f"the data folder {str(data_dir)[:80]}...: {too_long}; pass a shorter path")
    if not path.is_file():
        raise DataError(
            f"{path} not found: {data_dir} is not a prepared data folder (or its prepare was interrupted); "
            f"run `gptmini data <the run's settings> data.data_dir={data_dir}`"
        )
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DataError(f"{path} is not readable JSON ({e}); re-run prepare with --force") from e
    return check_meta(meta, data_dir)


def checked_shards(data_dir: Path, meta: Mapping[str, Any]) -> list[tuple[Path, int]]:
    """Every shard's path and token count, each file's size checked against meta.json (a ``stat`` each)."""
    itemsize = DTYPES[meta["dtype"]].itemsize
    shards = []
    for info in meta["shards"]:
        path = inside(data_dir, f"{meta['shard_dir']}/{info['file']}", "shard", data_dir / META_FILE)
        try:
            actual = path.stat().st_size
        except OSError as e:
            raise DataError(f"{path} is missing ({e.strerror or e}); re-run prepare with --force") from e
        expected = int(info["tokens"]) * itemsize
        if actual != expected:
            raise DataError(
                f"{path} has {actual} bytes but meta.json says {info['tokens']} {meta['dtype']} tokens "
                f"({expected} bytes): the file is truncated or stale; re-run prepare with --force"
            )
        shards.append((path, int(info["tokens"])))
    return shards


def load_split(
    data_dir: str | Path, split: str, meta: Mapping[str, Any] | None = None
) -> np.ndarray | TokenStream:
    """A split's tokens, validated against meta.json: a read-only ``np.memmap`` when they lie in one shard (every
    corpus under ``shard_tokens``), else a ``TokenStream`` over the shards (same indexing and slicing)."""
    data_dir = Path(data_dir)
    meta = load_meta(data_dir) if meta is None else meta
    if split not in meta["splits"]:
        raise DataError(
            f"{data_dir / META_FILE} has no split {split!r}; valid splits: {sorted(meta['splits'])}"
        )
    info = meta["splits"][split]
    shards = checked_shards(data_dir, meta)
    dtype = DTYPES[meta["dtype"]]
    start, n = int(info["start"]), int(info["tokens"])
    if n == 0:  # mmap cannot map an empty range
        return np.empty(0, dtype=dtype)
    bounds = np.concatenate([[0], np.cumsum([t for _, t in shards])])
    first = int(np.searchsorted(bounds, start, side="right")) - 1
    tokens: np.ndarray | TokenStream
    if start + n <= bounds[first + 1]:
        offset = (start - int(bounds[first])) * dtype.itemsize
        tokens = np.memmap(shards[first][0], dtype=dtype, mode="r", offset=offset, shape=(n,))
    else:
        tokens = TokenStream([p for p, _ in shards], [t for _, t in shards], dtype, start, n)
    check_ids(tokens, int(meta["vocab_size"]), f"split {split!r} of {data_dir}")
    return tokens


# check_ids reads at most SAMPLE_BLOCKS blocks of SAMPLE_TOKENS tokens spread over a split (all of a small one):
# a bounded read at load time; the window datasets check every window they serve.
SAMPLE_BLOCKS = 64
SAMPLE_TOKENS = 1 << 16


def check_ids(tokens: np.ndarray | TokenStream, vocab_size: int, where: str) -> None:
    """Refuse token ids >= ``vocab_size`` in a sample of ``tokens`` (all of them when few): damaged shards, or
    shards of another tokenizer, would otherwise index past the model's embedding table."""
    n = len(tokens)
    if n <= SAMPLE_BLOCKS * SAMPLE_TOKENS:
        starts = range(0, n, SAMPLE_TOKENS)
    else:
        starts = np.linspace(0, n - SAMPLE_TOKENS, SAMPLE_BLOCKS).astype(np.int64).tolist()
    for a in starts:
        block = np.asarray(tokens[a : a + SAMPLE_TOKENS])
        if len(block) and int(block.max()) >= vocab_size:
            at = a + int(np.argmax(block >= vocab_size))
            raise bad_id(where, int(block[at - a]), f" at token {at}", vocab_size)


def bad_id(where: str, token: int, at: str, vocab_size: int) -> DataError:
    return DataError(
        f"{where} holds token id {token}{at}, but the vocabulary has {vocab_size} ids (0 to {vocab_size - 1}): "
        "its shards are damaged or of another tokenizer; re-run prepare with --force"
    )


def check_split_length(split: str, tokens: int, block_size: int) -> None:
    """Refuse a split too short for one window of ``block_size + 1`` tokens."""
    if tokens < block_size + 1:
        fix = "a larger val_fraction" if split == "val" else "a smaller val_fraction"
        raise DataError(
            f"split {split!r} has {tokens} tokens but block_size={block_size} needs at least "
            f"{block_size + 1}; use a smaller block_size, more data, or {fix}"
        )


def load_tokenizer(data_dir: str | Path, meta: Mapping[str, Any] | None = None) -> Tokenizer:
    """The tokenizer a prepared folder was made with (char vocab or trained BPE read from its ``vocab_file``,
    checked against what meta.json records of it)."""
    data_dir = Path(data_dir)
    meta = load_meta(data_dir) if meta is None else meta
    vocab = data_dir / meta["vocab_file"] if meta.get("vocab_file") else None
    tokenizer = build_tokenizer(meta["tokenizer"], vocab, meta.get("tokenizer_spec"))
    if tokenizer.vocab_size != meta["vocab_size"]:
        raise DataError(
            f"{data_dir / META_FILE} says vocab_size {meta['vocab_size']} but its tokenizer "
            f"{meta['tokenizer']!r} has {tokenizer.vocab_size} ids; re-run prepare with --force"
        )
    return tokenizer


def check_block_size(block_size: int, meta: Mapping[str, Any]) -> None:
    """Refuse a context longer than a split can fill (the same check the window datasets make), from meta.json
    alone: before any model is built or any token is read."""
    for split in SPLITS:
        tokens = meta["splits"][split]["tokens"]
        if split == "train" or tokens > 0:
            check_split_length(split, tokens, block_size)


def data_identity(data_dir: str | Path, meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What a checkpoint records about the prepared data it was trained on (plain JSON data):
    ``tokenizer_fingerprint`` changes with the tokenizer (for ``char``, with its exact vocabulary: ids mean other
    characters), ``fingerprint`` with anything in the token files (corpus text, tokenizer, split)."""
    data_dir = Path(data_dir)
    meta = load_meta(data_dir) if meta is None else meta
    tokenizer: dict[str, Any] = {"tokenizer": meta["tokenizer"], "vocab_size": meta["vocab_size"]}
    if meta.get("vocab_file"):  # char: its characters; bpe: its ranks' digest
        tokenizer |= load_tokenizer(data_dir, meta).identity()
    tokenizer_fingerprint = json_sha256(tokenizer)[:16]
    data = {
        "tokenizer": tokenizer_fingerprint,
        "source_sha256": meta.get("source_sha256"),
        "val_fraction": meta.get("val_fraction"),
        "dtype": meta.get("dtype"),
        "splits": {s: info.get("tokens") for s, info in sorted(meta["splits"].items())},
    }
    return {
        "fingerprint": json_sha256(data)[:16],
        "tokenizer_fingerprint": tokenizer_fingerprint,
        "data_dir": str(data_dir),
        "source": meta.get("source"),
        "tokenizer": meta["tokenizer"],
        "vocab_size": int(meta["vocab_size"]),
    }


def saved_tokenizer(data_dir: str | Path, meta: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """The tokenizer of a prepared folder as plain data, for a checkpoint to carry (what its ``vocab_file``
    holds: the char vocabulary, the trained BPE), checked against meta.json; None for a tokenizer known by name
    (gpt2 and the other tiktoken encodings)."""
    meta = load_meta(data_dir) if meta is None else meta
    if not meta.get("vocab_file"):
        return None
    return load_tokenizer(data_dir, meta).payload()  # type: ignore[attr-defined] (char and bpe have one)


def check_vocab(model_vocab_size: int, meta: Mapping[str, Any]) -> None:
    """Refuse a model whose embedding table cannot hold every token id of the prepared data."""
    need = int(meta["vocab_size"])
    if model_vocab_size < need:
        raise DataError(
            f"model vocab_size {model_vocab_size} is smaller than tokenizer {meta.get('tokenizer')!r} "
            f"vocab_size {need}; set the model's vocab_size >= {need} "
            f"(e.g. {math.ceil(need / 64) * 64}, a multiple of 64 for speed)"
        )
