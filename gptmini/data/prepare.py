"""Corpus text -> token files (train.bin / val.bin / meta.json), and loading them back, validated.

Prepared layout (see data/README.md): ``train.bin`` and ``val.bin`` are raw little-endian token arrays
(uint16 when the vocabulary fits, else uint32) that ``np.memmap`` opens in place; ``meta.json`` is written
last and is the only proof that a folder is complete. No torch or Lightning here: the CLI stays quick to start.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import re
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gptmini.data.corpora import default_out_dir, read_source
from gptmini.data.errors import DataError
from gptmini.data.tokenizers import (
    CharTokenizer,
    Tokenizer,
    TokenizerError,
    available_tokenizers,
    build_tokenizer,
)
from gptmini.fileio import atomic_write, atomic_write_json, fsync_dir, temp_name

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
META_FILE = "meta.json"
VOCAB_FILE = "vocab.json"
SPLITS = ("train", "val")
DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
# ~64k characters per chunk: enough chunks to keep every tiktoken thread busy, few enough to be cheap.
CHUNK_CHARS = 1 << 16


# ------------------------------------------------------------------------------------------ tokenizing

# Cut points: between a printable ASCII non-space char and a newline. No GPT-2/cl100k pre-token spans
# such a boundary, so encoding the chunks separately gives exactly the ids of encoding the whole text.
_CUT = re.compile(r"[!-~](?=\n)")


def split_for_encoding(text: str, chunk_chars: int = CHUNK_CHARS) -> list[str]:
    chunks = []
    pos = 0
    while pos < len(text):
        m = _CUT.search(text, pos + chunk_chars) if pos + chunk_chars < len(text) else None
        end = m.end() if m else len(text)
        chunks.append(text[pos:end])
        pos = end
    return chunks


def encode_text(tokenizer: Tokenizer, text: str, num_threads: int | None = None) -> np.ndarray:
    """All ids of ``text`` as one int64 array (chunked + threaded for BPE, vectorised for chars)."""
    if isinstance(tokenizer, CharTokenizer):
        return tokenizer.encode_array(text)
    parts = tokenizer.encode_batch(split_for_encoding(text), num_threads=num_threads)
    out = np.empty(sum(len(p) for p in parts), dtype=np.int64)
    pos = 0
    for p in parts:
        out[pos : pos + len(p)] = p
        pos += len(p)
    return out


def token_dtype(vocab_size: int) -> np.dtype:
    return DTYPES["uint16"] if vocab_size <= 1 << 16 else DTYPES["uint32"]


# ------------------------------------------------------------------------------------- prepare / load


@dataclass(frozen=True)
class PreparedData:
    out_dir: Path
    meta: dict[str, Any]
    skipped: bool
    seconds: float

    @property
    def train_tokens(self) -> int:
        return int(self.meta["splits"]["train"]["tokens"])

    @property
    def val_tokens(self) -> int:
        return int(self.meta["splits"]["val"]["tokens"])


def _current_meta(out: Path, sha: str, tokenizer: str, val_fraction: float) -> dict[str, Any] | None:
    """The existing meta when ``out`` already holds intact data for exactly these inputs."""
    try:
        meta = load_meta(out)
    except DataError:
        return None
    same = (
        meta.get("source_sha256") == sha
        and meta.get("tokenizer") == tokenizer
        and meta.get("val_fraction") == val_fraction
    )
    if not same:
        return None
    try:
        for split in SPLITS:
            _checked_split_path(out, meta, split)
    except DataError:
        return None
    if meta.get("vocab_file") and not (out / meta["vocab_file"]).is_file():
        return None
    return meta


def prepare(
    source: str = "shakespeare",
    tokenizer: str = "gpt2",
    out_dir: str | Path | None = None,
    val_fraction: float = 0.1,
    force: bool = False,
    num_threads: int | None = None,
) -> PreparedData:
    """Tokenize ``source`` once into ``out_dir`` (default ``data/<source name>_<hash of the source>_<tokenizer>``,
    see ``corpora.prepared_folder_name``); skip if current.

    The split is nanoGPT's: the first ``1 - val_fraction`` of the token stream is train, the rest val. A write
    that fails (full disk, unwritable folder) raises DataError and leaves ``out_dir`` as it was.
    """
    t0 = time.perf_counter()
    if not 0.0 <= val_fraction < 1.0:
        raise DataError(f"val_fraction must be in [0, 1), got {val_fraction}; 0.1 is a good default")
    if tokenizer not in available_tokenizers():
        raise TokenizerError(
            f"unknown tokenizer {tokenizer!r}; valid names: {', '.join(available_tokenizers())}"
        )
    out = Path(out_dir) if out_dir is not None else default_out_dir(source, tokenizer)
    text = read_source(source, download_dir=out / "raw")
    sha = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()

    if not force and (meta := _current_meta(out, sha, tokenizer, val_fraction)) is not None:
        return PreparedData(out, meta, skipped=True, seconds=time.perf_counter() - t0)

    tok: Tokenizer = CharTokenizer.from_text(text) if tokenizer == "char" else build_tokenizer(tokenizer)
    ids = encode_text(tok, text, num_threads=num_threads)
    dtype = token_dtype(tok.vocab_size)
    n_train = int(len(ids) * (1.0 - val_fraction))
    splits = {"train": ids[:n_train].astype(dtype), "val": ids[n_train:].astype(dtype)}
    meta = {
        "format_version": FORMAT_VERSION,
        "source": source,
        "source_sha256": sha,
        "source_chars": len(text),
        "tokenizer": tokenizer,
        "tokenizer_spec": tok.to_dict(),
        "vocab_size": tok.vocab_size,
        "eot_id": tok.eot_id,
        "dtype": dtype.name,
        "val_fraction": val_fraction,
        "splits": {s: {"file": f"{s}.bin", "tokens": int(len(a))} for s, a in splits.items()},
        "vocab_file": VOCAB_FILE if isinstance(tok, CharTokenizer) else None,
    }

    try:
        # fileio makes one file atomic; the three are swapped together here. Each is first written (and
        # fsynced) into a staging folder inside ``out`` (same filesystem: the commit is renames only), so a crash
        # before the commit leaves ``out`` exactly as it was.
        out.mkdir(parents=True, exist_ok=True)
        stage = temp_name(out / "prepare")
        stage.mkdir()
        try:
            for split, array in splits.items():
                atomic_write(stage / f"{split}.bin", array.tofile)  # (tokens,) raw little-endian
            if isinstance(tok, CharTokenizer):
                tok.save(stage / VOCAB_FILE)
            atomic_write_json(stage / META_FILE, meta, sort_keys=True)
            # Commit: drop the old meta first so a half-swapped folder never validates, meta.json last, and
            # only once the renames of the files it describes are on disk.
            (out / META_FILE).unlink(missing_ok=True)
            if not isinstance(tok, CharTokenizer):
                (out / VOCAB_FILE).unlink(missing_ok=True)
            for name in sorted(os.listdir(stage)):
                if name != META_FILE:
                    os.replace(stage / name, out / name)
            fsync_dir(out)
            os.replace(stage / META_FILE, out / META_FILE)
            fsync_dir(out)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    except OSError as e:
        raise DataError(
            f"cannot write prepared data to {out}: {e.strerror or e}; nothing half-written will be used. Free disk "
            "space or point paths.data_root (gptmini-prepare: --out) at a writable folder"
        ) from e
    return PreparedData(out, meta, skipped=False, seconds=time.perf_counter() - t0)


def load_meta(data_dir: str | Path) -> dict[str, Any]:
    data_dir = Path(data_dir)
    path = data_dir / META_FILE
    if not path.is_file():
        raise DataError(
            f"{path} not found: {data_dir} is not a prepared data folder (or its prepare was interrupted); "
            f"run `gptmini-prepare --source <corpus> --out {data_dir}`"
        )
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DataError(f"{path} is not readable JSON ({e}); re-run prepare with --force") from e
    if not isinstance(meta, dict) or meta.get("format_version") != FORMAT_VERSION:
        version = meta.get("format_version") if isinstance(meta, dict) else None
        raise DataError(
            f"{path} has format_version {version!r}, expected {FORMAT_VERSION}; re-run prepare with --force"
        )
    if meta.get("dtype") not in DTYPES:
        raise DataError(
            f"{path} names dtype {meta.get('dtype')!r}; expected one of {sorted(DTYPES)}: re-run prepare --force"
        )
    if not isinstance(meta.get("splits"), dict) or not isinstance(meta.get("vocab_size"), int):
        raise DataError(f"{path} lacks 'splits' or 'vocab_size'; re-run prepare with --force")
    return meta


def _checked_split_path(data_dir: Path, meta: Mapping[str, Any], split: str) -> tuple[Path, int]:
    info = meta["splits"].get(split)
    if not isinstance(info, dict) or not isinstance(info.get("tokens"), int):
        raise DataError(
            f"{data_dir / META_FILE} has no split {split!r}; valid splits: {sorted(meta['splits'])}"
        )
    path = data_dir / info.get("file", f"{split}.bin")
    if not path.is_file():
        raise DataError(f"{path} is missing; re-run prepare with --force")
    expected = info["tokens"] * DTYPES[meta["dtype"]].itemsize
    actual = path.stat().st_size
    if actual != expected:
        raise DataError(
            f"{path} has {actual} bytes but meta.json says {info['tokens']} {meta['dtype']} tokens "
            f"({expected} bytes): the file is truncated or stale; re-run prepare with --force"
        )
    return path, info["tokens"]


def load_split(data_dir: str | Path, split: str, meta: Mapping[str, Any] | None = None) -> np.ndarray:
    """Read-only ``np.memmap`` of a split's tokens, validated against meta.json."""
    data_dir = Path(data_dir)
    meta = load_meta(data_dir) if meta is None else meta
    path, n = _checked_split_path(data_dir, meta, split)
    dtype = DTYPES[meta["dtype"]]
    if n == 0:  # mmap cannot map an empty file
        return np.empty(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(n,))


def load_tokenizer(data_dir: str | Path, meta: Mapping[str, Any] | None = None) -> Tokenizer:
    """The tokenizer a prepared folder was made with (char vocab read from its vocab.json)."""
    data_dir = Path(data_dir)
    meta = load_meta(data_dir) if meta is None else meta
    vocab = data_dir / meta["vocab_file"] if meta.get("vocab_file") else None
    return build_tokenizer(meta["tokenizer"], vocab)


def check_block_size(block_size: int, meta: Mapping[str, Any]) -> None:
    """Refuse a context longer than a split can fill (the same check the window datasets make), from meta.json
    alone: before any model is built or any token is read."""
    for split in SPLITS:
        tokens = int(meta["splits"].get(split, {}).get("tokens", 0))
        if (split == "train" or tokens > 0) and tokens < block_size + 1:
            fix = "a larger val_fraction" if split == "val" else "a smaller val_fraction"
            raise DataError(
                f"split {split!r} has {tokens} tokens but block_size={block_size} needs at least "
                f"{block_size + 1}; use a smaller block_size, more data, or {fix}"
            )


def _fingerprint(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def data_identity(data_dir: str | Path, meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What a checkpoint records about the prepared data it was trained on (plain JSON data):
    ``tokenizer_fingerprint`` changes with the tokenizer (for ``char``, with its exact vocabulary: ids mean other
    characters), ``fingerprint`` with anything in the token files (corpus text, tokenizer, split)."""
    data_dir = Path(data_dir)
    meta = load_meta(data_dir) if meta is None else meta
    tokenizer: dict[str, Any] = {"tokenizer": meta["tokenizer"], "vocab_size": meta["vocab_size"]}
    if meta.get("vocab_file"):
        tokenizer["chars"] = "".join(CharTokenizer.load(data_dir / meta["vocab_file"]).chars)
    tokenizer_fingerprint = _fingerprint(tokenizer)
    data = {
        "tokenizer": tokenizer_fingerprint,
        "source_sha256": meta.get("source_sha256"),
        "val_fraction": meta.get("val_fraction"),
        "dtype": meta.get("dtype"),
        "splits": {s: info.get("tokens") for s, info in sorted(meta["splits"].items())},
    }
    return {
        "fingerprint": _fingerprint(data),
        "tokenizer_fingerprint": tokenizer_fingerprint,
        "data_dir": str(data_dir),
        "source": meta.get("source"),
        "tokenizer": meta["tokenizer"],
        "vocab_size": int(meta["vocab_size"]),
    }


def check_vocab(model_vocab_size: int, meta: Mapping[str, Any]) -> None:
    """Refuse a model whose embedding table cannot hold every token id of the prepared data."""
    need = int(meta["vocab_size"])
    if model_vocab_size < need:
        raise DataError(
            f"model vocab_size {model_vocab_size} is smaller than tokenizer {meta.get('tokenizer')!r} "
            f"vocab_size {need}; set the model's vocab_size >= {need} "
            f"(e.g. {math.ceil(need / 64) * 64}, a multiple of 64 for speed)"
        )


# ------------------------------------------------------------------------------------------------ CLI


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gptmini-prepare", description="Tokenize a corpus into train.bin / val.bin / meta.json."
    )
    parser.add_argument(
        "--source",
        default="shakespeare",
        help="'shakespeare' (embedded), a file, a dir of *.txt, a glob, or a URL",
    )
    parser.add_argument("--tokenizer", default="gpt2", help=f"one of: {', '.join(available_tokenizers())}")
    parser.add_argument(
        "--out", default=None, help="output folder (default: data/<source name>_<source hash>_<tokenizer>)"
    )
    parser.add_argument(
        "--val-fraction", type=float, default=0.1, help="last fraction of tokens kept for val"
    )
    parser.add_argument("--force", action="store_true", help="re-tokenize even if the folder is up to date")
    parser.add_argument(
        "--num-threads", type=int, default=None, help="tokenizer threads (default: cores, max 8)"
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(message)s")
    try:
        result = prepare(
            args.source, args.tokenizer, args.out, args.val_fraction, args.force, args.num_threads
        )
    except (DataError, TokenizerError) as e:
        log.error("error: %s", e)
        return 2
    log.info(
        "%s %s: train %d tokens, val %d tokens (%s, vocab %d) in %.2fs -> %s",
        "skipped (up to date)" if result.skipped else "prepared",
        args.source,
        result.train_tokens,
        result.val_tokens,
        result.meta["dtype"],
        result.meta["vocab_size"],
        result.seconds,
        result.out_dir,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
