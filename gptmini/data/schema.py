"""What a prepared data folder's index (``meta.json``) and its progress record (``progress.json``) may hold: one
table of checks per file, field by field (types, ranges, names), and the rule that every path they name stays
inside the data folder once symlinks are resolved. A file that breaks any of it is refused with one ``DataError``
naming the file, the field and the fix; nothing a file names is read, written or removed before it passes.

To add a field, add an entry to ``META_FIELDS`` (a check returning what is wrong, or None). Tokenizer kinds come
from the tokenizer registry (``available_tokenizers``), so a new kind needs no change here.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gptmini.data.corpora import SOURCE_KINDS
from gptmini.data.errors import DataError
from gptmini.data.tokenizers import available_tokenizers

FORMAT_VERSION = 2
META_FILE = "meta.json"
SPLITS = ("train", "val")
DTYPE_LIMITS = {"uint16": 1 << 16, "uint32": 1 << 32}  # the ids each shard dtype holds
SHARD_PREFIX = "tokens-"
SHARD_DIR = re.compile(r"tokens-[0-9a-z][0-9a-z_-]{0,62}")
SHARD_FILE = re.compile(r"shard_\d{6}\.bin")
SHA256 = re.compile(r"[0-9a-f]{64}")
FIX = "prepare it again (gptmini data <the run's settings> data.force_prepare=true; training re-prepares by itself)"

# A check: the value -> what is wrong with it (``bad``: "is -1, but must be an integer in [0, inf]"), or None.
Check = Callable[[Any], str | None]


def bad(value: Any, want: str) -> str:
    shown = repr(value)
    return f"is {shown if len(shown) <= 60 else shown[:57] + '...'}, but must be {want}"


def integer(low: int = 0, high: int | None = None) -> Check:
    def check(v: Any) -> str | None:
        ok = isinstance(v, int) and not isinstance(v, bool) and v >= low and (high is None or v <= high)
        return None if ok else bad(v, f"an integer in [{low}, {'inf' if high is None else high}]")

    return check


def text(pattern: re.Pattern[str] | None = None) -> Check:
    def check(v: Any) -> str | None:
        if isinstance(v, str) and (pattern is None or pattern.fullmatch(v)):
            return None
        return bad(v, f"a name matching {pattern.pattern}" if pattern else "a string")

    return check


def one_of(choices: Callable[[], Any]) -> Check:
    def check(v: Any) -> str | None:
        valid = list(choices())
        return None if isinstance(v, str) and v in valid else bad(v, f"one of {valid}")

    return check


def boolean(v: Any) -> str | None:
    return None if isinstance(v, bool) else bad(v, "true or false")


def fraction(v: Any) -> str | None:
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v < 1
    return None if ok else bad(v, "a number in [0, 1)")


def optional(check: Check) -> Check:
    return lambda v: None if v is None else check(v)


def mapping(fields: Mapping[str, Check], optional_fields: Mapping[str, Check] = {}) -> Check:  # noqa: B006
    """A JSON object with these fields (each checked) and no others but ``optional_fields``, checked when
    present."""

    def check(v: Any) -> str | None:
        if not isinstance(v, dict):
            return bad(v, "an object")
        missing = [k for k in fields if k not in v]
        if missing:
            return f"lacks {missing}"
        extra = sorted(k for k in v if k not in fields and k not in optional_fields)
        if extra:
            return f"has unknown fields {extra}"
        present = {**fields, **{k: c for k, c in optional_fields.items() if k in v}}
        for key, sub in present.items():
            problem = sub(v[key])
            if problem:
                return f"field {key!r} {problem}"
        return None

    return check


def list_of(item: Check, min_items: int = 0) -> Check:
    def check(v: Any) -> str | None:
        if not isinstance(v, list) or len(v) < min_items:
            return bad(v, f"a list of at least {min_items} item(s)")
        for i, x in enumerate(v):
            problem = item(x)
            if problem:
                return f"item {i} {problem}"
        return None

    return check


def dict_of(value: Check) -> Check:
    def check(v: Any) -> str | None:
        if not isinstance(v, dict):
            return bad(v, "an object")
        return next((f"key {k!r} {p}" for k, val in v.items() if (p := value(val))), None)

    return check


SHARD = mapping({"file": text(SHARD_FILE), "tokens": integer(1)})
SPLIT = mapping({"start": integer(0), "tokens": integer(0)})
SETTINGS = mapping(
    {
        "format_version": integer(FORMAT_VERSION, FORMAT_VERSION),
        "tokenizer": one_of(available_tokenizers),
        "single_text": boolean,
        "text_field": optional(text()),
        "plays_conversion": optional(integer(0)),
        "chunk_chars": integer(1),
        "shard_tokens": integer(1),
    },
    # tokenizer=bpe: what its training was given (gptmini.data.bpe.bpe_settings)
    optional_fields={
        "bpe": mapping(
            {
                "format_version": integer(1),
                "vocab_size": integer(257, 1 << 32),
                "train_bytes": integer(1),
                "pattern": text(),
                "val_fraction": fraction,
            }
        )
    },
)
SOURCE_FILE = mapping(
    {
        "path": text(),
        "kind": one_of(lambda: SOURCE_KINDS),
        "size": integer(0),
        "mtime_ns": integer(0),
        "sha256": text(SHA256),
    }
)

# Every field of meta.json and its check; the relations between fields are checked by ``check_meta``.
META_FIELDS: dict[str, Check] = {
    "format_version": integer(FORMAT_VERSION, FORMAT_VERSION),
    "source": text(),
    "settings": SETTINGS,
    "files": list_of(SOURCE_FILE, 1),
    "source_sha256": text(SHA256),
    "source_chars": integer(0),
    "documents": integer(0),
    "tokenizer": one_of(available_tokenizers),
    "tokenizer_spec": lambda v: None if isinstance(v, dict) else bad(v, "an object"),
    "vocab_size": integer(1, DTYPE_LIMITS["uint32"]),
    "eot_id": optional(integer(0)),
    "end_of_text": boolean,
    "dtype": one_of(lambda: DTYPE_LIMITS),
    "val_fraction": fraction,
    "shard_dir": text(SHARD_DIR),
    "shards": list_of(SHARD, 1),
    "tokens": integer(1),
    "splits": mapping({s: SPLIT for s in SPLITS}),
    "vocab_file": optional(text()),
    "dropped_records": dict_of(integer(0)),
}

# progress.json: where an interrupted preparation stands (see ``prepare``).
PROGRESS_FIELDS: dict[str, Check] = {
    "inputs": text(SHARD_DIR),
    "dtype": one_of(lambda: DTYPE_LIMITS),
    "scan": mapping(
        {
            "file_sha256": list_of(text(SHA256), 1),
            "text_sha256": optional(text(SHA256)),
            "chars": optional(
                list_of(lambda c: None if isinstance(c, str) and len(c) == 1 else bad(c, "a character"))
            ),
        }
    ),
    "shards": list_of(SHARD),
    "resume": optional(list_of(integer(0), 3)),
}


def inside(folder: Path, relative: str, what: str, file: Path) -> Path:
    """``folder / relative``, refused (DataError naming ``file`` and ``what``) unless it is a plain relative path
    that stays inside ``folder`` once every symlink is resolved."""
    parts = Path(relative).parts
    if (
        not relative
        or Path(relative).is_absolute()
        or any(p in ("..", ".") for p in parts)
        or "\0" in relative
    ):
        raise DataError(f"{file}: {what} {relative!r} is not a path inside {folder}; {FIX}")
    path = folder / relative
    base = os.path.realpath(folder)
    if os.path.commonpath([base, os.path.realpath(path)]) != base:
        raise DataError(f"{file}: {what} {relative!r} leads outside {folder} (a symlink); {FIX}")
    return path


def check_fields(payload: Any, fields: Mapping[str, Check], file: Path) -> None:
    problem = mapping(fields)(payload)
    if problem:
        raise DataError(f"{file} {problem}; {FIX}")


def check_meta(meta: Any, data_dir: Path) -> dict[str, Any]:
    """``meta`` (meta.json of ``data_dir``, parsed) if every field and the relations between them are valid."""
    file = data_dir / META_FILE
    version = meta.get("format_version") if isinstance(meta, dict) else None
    if version != FORMAT_VERSION:
        raise DataError(
            f"{file} has format_version {version!r}, expected {FORMAT_VERSION}; re-run prepare (training does it "
            "by itself) or prepare with --force"
        )
    check_fields(meta, META_FIELDS, file)
    relations = {
        "vocab_size fits the dtype": meta["vocab_size"] <= DTYPE_LIMITS[meta["dtype"]],
        "eot_id < vocab_size": meta["eot_id"] is None or meta["eot_id"] < meta["vocab_size"],
        "tokens is the sum of the shards' tokens": meta["tokens"] == sum(s["tokens"] for s in meta["shards"]),
        "shards are numbered in order": [s["file"] for s in meta["shards"]]
        == [f"shard_{i:06d}.bin" for i in range(len(meta["shards"]))],
        "the splits lie inside the tokens": all(
            s["start"] + s["tokens"] <= meta["tokens"] for s in meta["splits"].values()
        ),
        "tokenizer is the settings' tokenizer": meta["tokenizer"] == meta["settings"]["tokenizer"],
        # a tokenizer's files (char's vocab.json) are written beside the shards they encode
        "vocab_file is null or a file in <shard_dir>/": meta["vocab_file"] is None
        or (
            meta["vocab_file"].startswith(meta["shard_dir"] + "/")
            and "/" not in meta["vocab_file"][len(meta["shard_dir"]) + 1 :]
        ),
        "the char tokenizer has a vocab_file": meta["tokenizer"] != "char" or meta["vocab_file"] is not None,
        "a trained bpe has a vocab_file and its settings": meta["tokenizer"] != "bpe"
        or (meta["vocab_file"] is not None and "bpe" in meta["settings"]),
    }
    broken = [rule for rule, ok in relations.items() if not ok]
    if broken:
        raise DataError(f"{file} is inconsistent (expected: {'; '.join(broken)}); {FIX}")
    inside(data_dir, meta["shard_dir"], "shard_dir", file)
    if meta["vocab_file"] is not None:
        inside(data_dir, meta["vocab_file"], "vocab_file", file)
    return meta


def at_least(key: str, value: Any, low: int, note: str = "") -> None:
    """``value`` (None: not set) an integer >= ``low``, else a DataError naming ``data.<key>``."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
        raise DataError(f"data.{key}={value} is invalid: it must be an integer >= {low}{note}")


def check_data_settings(
    *,
    batch_size: int,
    num_workers: int,
    val_stride: int | None,
    val_fraction: float,
    shard_tokens: int,
    buffer_mb: int,
    prepare_threads: int | None,
    **_: Any,
) -> None:
    """The ranges of the ``data`` group's settings (``TokenDataModule``'s), each named as its config key."""
    at_least("batch_size", batch_size, 1)
    at_least("num_workers", num_workers, 0, " (0: load in the main process)")
    at_least("val_stride", val_stride, 1, " (or null: non-overlapping windows, stride = block_size)")
    check_settings(val_fraction, shard_tokens, buffer_mb, prepare_threads)


def check_settings(val_fraction: float, shard_tokens: int, buffer_mb: int, threads: int | None) -> None:
    """The preparation's own settings, named as the run's (``data.*``)."""
    at_least("shard_tokens", shard_tokens, 1)
    at_least("buffer_mb", buffer_mb, 1)
    at_least("prepare_threads", threads, 1, " (or null: one thread per core, at most 8)")
    if not 0.0 <= val_fraction < 1.0:
        raise DataError(f"data.val_fraction={val_fraction:g} is invalid: it must be in [0, 1)")
