"""Corpus -> token shards + meta.json, streamed at constant memory and resumable: the writer of a prepared data
folder (its layout, and reading it back, validated: ``gptmini.data.reader``).

Preparing reads the corpus twice, piece by piece: a check of every file (UTF-8, JSON, columns; SHA-256 of its
bytes; the character set for ``char``) that stops on bad input before any tokenizing, then the tokenizing, by a
pool of threads (tiktoken releases the GIL), into shards. After each shard, ``progress.json`` in the shards' folder
records where the stream stands, so a killed preparation resumes after its last finished shard. No torch or
Lightning here: the writer stays quick to import.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import logging
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gptmini.data.bpe import bpe_settings, trained_bpe
from gptmini.data.corpora import (
    ARROW,
    EMBEDDED_SOURCES,
    JSONL,
    PARQUET,
    PLAYS_CONVERSION,
    Corpus,
    default_out_dir,
    file_sha256,
    resolve_source,
)
from gptmini.data.encoding import CHUNK_CHARS, token_dtype, tokenize_corpus
from gptmini.data.errors import DataError
from gptmini.data.progress import PrepareProgress, Reporter
from gptmini.data.reader import DTYPES, FORMAT_VERSION, META_FILE, checked_shards, load_meta, load_split
from gptmini.data.schema import PROGRESS_FIELDS, SHARD_PREFIX, check_fields, check_settings
from gptmini.data.shards import ShardWriter
from gptmini.data.tokenizers import (
    BPE_FILE,
    BPETokenizer,
    CharTokenizer,
    Tokenizer,
    bpe_file_facts,
    build_tokenizer,
    check_tokenizer_name,
    default_threads,
    json_sha256,
)
from gptmini.fileio import atomic_write_json, fsync_dir, name_too_long, remove_stale_temp_files

try:  # POSIX: one preparation of a folder at a time, across processes and (on shared storage) nodes
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

VOCAB_FILE = "vocab.json"
PROGRESS_FILE = "progress.json"
LOCK_FILE = ".lock"
# What format_version 1 kept at the top of the folder; removed when the folder is prepared again.
LEGACY_FILES = ("train.bin", "val.bin", VOCAB_FILE)
DEFAULT_SHARD_TOKENS = 100_000_000  # llm.c's and modded-nanogpt's FineWeb shards: 200 MB of uint16
DEFAULT_BUFFER_MB = 64
# the defaults of data.val_fraction and data.text_field (TokenDataModule's), for the writer's own callers too
DEFAULT_VAL_FRACTION = 0.1
DEFAULT_TEXT_FIELD = "text"


# -------------------------------------------------------------------------------------------- prepare


@dataclass(frozen=True)
class PreparedData:
    out_dir: Path
    meta: dict[str, Any]
    skipped: bool
    seconds: float

    @property
    def summary(self) -> str:
        meta, done = self.meta, "skipped (up to date)" if self.skipped else "prepared"
        train, val = (meta["splits"][s]["tokens"] for s in ("train", "val"))
        return (
            f"{done} {meta['source']}: train {train} tokens, val {val} tokens ({meta['dtype']}, "
            f"vocab {meta['vocab_size']}, {len(meta['shards'])} shard(s)) in {self.seconds:.2f}s -> {self.out_dir}"
        )


def _settings(
    corpus: Corpus, tokenizer: str, shard_tokens: int, bpe: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Everything besides the files that decides the token stream and its shards (``bpe``: a trained BPE's
    settings, so that it is trained again exactly when they change)."""
    records = any(f.kind in (JSONL, PARQUET, ARROW) for f in corpus.files)
    return ({"bpe": dict(bpe)} if bpe is not None else {}) | {
        "format_version": FORMAT_VERSION,
        "tokenizer": tokenizer,
        "single_text": corpus.single_text,
        "text_field": corpus.text_field if records else None,
        "plays_conversion": PLAYS_CONVERSION if corpus.source in EMBEDDED_SOURCES else None,
        "chunk_chars": CHUNK_CHARS,
        "shard_tokens": shard_tokens,
    }


def scan_corpus(
    corpus: Corpus, collect_chars: bool, callback: Callable[[PrepareProgress], None] | None
) -> dict[str, Any]:
    """Read every file once before tokenizing: bad input (a byte that is not UTF-8, a line that is not JSON, a
    missing column) stops here, in seconds; the SHA-256 of each file's bytes, and the characters for ``char``."""
    hashes: list[str] = []
    chars: set[str] = set()
    text_hash = hashlib.sha256() if corpus.source in EMBEDDED_SOURCES else None
    report = Reporter("checking", corpus.total_bytes, callback)
    nonblank, documents, done = False, 0, 0
    for frag in corpus.fragments(file_hashes=hashes, records=collect_chars):
        if collect_chars:
            chars.update(frag.text)
        if text_hash is not None:
            text_hash.update(frag.text.encode("utf-8", "surrogatepass"))
        nonblank = nonblank or not frag.text.isspace()
        documents += frag.end
        done += frag.nbytes
        report(documents, 0, done)
    report(documents, 0, corpus.total_bytes, force=True)
    # (the rows of Parquet and Arrow files are not read here: an empty one is found when nothing is tokenized)
    if not nonblank and not any(f.kind in (PARQUET, ARROW) for f in corpus.files):
        raise DataError(
            f"corpus {corpus.source!r} is empty (no non-whitespace characters); point the source at real text"
        )
    return {
        "file_sha256": hashes,
        "text_sha256": text_hash.hexdigest() if text_hash is not None else None,
        "chars": sorted(chars) if collect_chars else None,
    }


def source_sha256(corpus: Corpus, scan: Mapping[str, Any], tok: Tokenizer) -> str:
    """The corpus's content, for ``data_identity``: the text's SHA-256 for one continuous text (as before token
    shards, so checkpoints trained on such data still match it), else one over every file's and the settings."""
    if scan.get("text_sha256"):
        return str(scan["text_sha256"])
    if corpus.single_text:
        return str(scan["file_sha256"][0])
    payload = {
        "files": [[f.kind, sha] for f, sha in zip(corpus.files, scan["file_sha256"], strict=True)],
        "text_field": corpus.text_field,
        "end_of_text": tok.eot_id,
    }
    return json_sha256(payload)


def _splits(total: int, val_fraction: float) -> dict[str, dict[str, int]]:
    n_train = int(total * (1.0 - val_fraction))
    return {"train": {"start": 0, "tokens": n_train}, "val": {"start": n_train, "tokens": total - n_train}}


def _freshness(
    out: Path, corpus: Corpus, settings: Mapping[str, Any]
) -> tuple[dict[str, Any] | None, list[int]]:
    """The meta of ``out`` when it holds intact data of these files and settings, judged by ``stat`` alone, and
    the files whose modification time changed while their size did not (to be hashed); else (None, [])."""
    try:
        meta = load_meta(out)
        if meta.get("settings") != settings:
            return None, []
        recorded = meta["files"]
        if [(r["path"], r["kind"], r["size"]) for r in recorded] != [
            (str(f.path), f.kind, f.size) for f in corpus.files
        ]:
            return None, []
        checked_shards(out, meta)
        if meta.get("vocab_file") and not (out / meta["vocab_file"]).is_file():
            return None, []
    except (DataError, KeyError, TypeError):
        return None, []
    touched = [
        i for i, (r, f) in enumerate(zip(recorded, corpus.files, strict=True)) if r["mtime_ns"] != f.mtime_ns
    ]
    return meta, touched


@contextlib.contextmanager
def _folder_lock(out: Path) -> Iterator[None]:
    """Hold ``out/.lock``: a second process preparing the same folder (every rank of a launcher-started run, or
    nodes sharing the data folder) waits, then finds the data up to date."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / LOCK_FILE, "a+b") as f:
        if fcntl is not None:
            try:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    log.info("waiting for another process preparing %s", out)
                    fcntl.flock(f, fcntl.LOCK_EX)
            except OSError as e:  # a filesystem without file locks (ENOLCK, EOPNOTSUPP): go on without one
                log.warning("cannot lock %s (%s); preparing without a lock", out / LOCK_FILE, e)
        yield  # the lock goes with the file's closing


def prepare(
    source: str,
    tokenizer: str,
    out_dir: str | Path | None = None,
    val_fraction: float = DEFAULT_VAL_FRACTION,
    force: bool = False,
    num_threads: int | None = None,
    *,
    text_field: str = DEFAULT_TEXT_FIELD,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    buffer_mb: int = DEFAULT_BUFFER_MB,
    progress: Callable[[PrepareProgress], None] | None = None,
    tokenizer_options: Mapping[str, Any] | None = None,
    given_tokenizer: Tokenizer | None = None,
) -> PreparedData:
    """Tokenize ``source`` once into ``out_dir`` (default ``data/<source name>_<hash of the source>_<tokenizer>``,
    see ``corpora.prepared_folder_name``); skip if current.

    Up to date means: the same settings, and every source file of the same size and modification time as when
    it was prepared (a file whose time changed but not its size is hashed and compared). A changed
    ``val_fraction`` only re-splits. Memory stays within the interpreter's own plus about ``buffer_mb`` (text
    and ids in flight between the reader and the tokenizer threads; plus one Parquet row group being decoded),
    whatever the corpus size. ``tokenizer_options``: ``vocab_size`` and ``train_bytes`` of ``tokenizer="bpe"``
    (``gptmini.data.bpe``), trained here on the corpus's training text. ``given_tokenizer``: that tokenizer of kind
    ``tokenizer`` instead of one built from the corpus (a checkpoint's own char vocabulary or trained BPE); the
    corpus is then always tokenized again. A killed preparation resumes at its last
    finished shard; a write that fails (full disk, unwritable folder) raises DataError, and the previous data
    stays as it was until the new is complete.
    """
    t0 = time.perf_counter()
    check_settings(val_fraction, shard_tokens, buffer_mb, num_threads)
    check_tokenizer_name(tokenizer)
    options = dict(tokenizer_options or {})
    bpe = (
        bpe_settings(options.get("vocab_size"), options.get("train_bytes"), val_fraction)
        if tokenizer == "bpe"
        else None
    )
    out = Path(out_dir) if out_dir is not None else default_out_dir(source, tokenizer)
    _check_out_folder(out)
    corpus = resolve_source(source, download_dir=out / "raw", text_field=text_field)
    settings = _settings(corpus, tokenizer, shard_tokens, bpe)
    force = force or given_tokenizer is not None  # meta.json's settings do not say which tokenizer was given

    if not force:
        meta, touched = _freshness(out, corpus, settings)
        if meta is not None and not touched and meta.get("val_fraction") == val_fraction:
            return PreparedData(out, meta, skipped=True, seconds=time.perf_counter() - t0)
    created = not out.exists()
    try:
        with _folder_lock(out):
            return _prepare_locked(
                corpus,
                out,
                settings,
                val_fraction,
                force,
                num_threads,
                buffer_mb,
                progress,
                t0,
                given_tokenizer,
            )
    except DataError:
        if created:  # bad input found before anything was written: leave no empty folder behind
            shutil.rmtree(out, ignore_errors=True)
        raise
    except OSError as e:
        raise DataError(
            f"cannot write prepared data to {out}: {e.strerror or e}; nothing half-written will be used. Free disk "
            "space or point paths.data_root (or data.data_dir) at a writable folder"
        ) from e


def prepare_run_data(
    settings: Mapping[str, Any], progress: Callable[[PrepareProgress], None] | None = None
) -> PreparedData:
    """The data of a run's ``data`` settings (``TokenDataModule``'s parameters) prepared, and its token files
    checked (sizes, and ids against the vocabulary) before any model is built or step run: the DataModule's
    ``prepare_data``, and ``gptmini data`` without building the DataModule."""
    result = prepare(
        settings["source"],
        settings["tokenizer"],
        settings["data_dir"],
        val_fraction=settings["val_fraction"],
        force=settings["force_prepare"],
        num_threads=settings["prepare_threads"],
        text_field=settings["text_field"],
        shard_tokens=settings["shard_tokens"],
        buffer_mb=settings["buffer_mb"],
        progress=progress,
        # tokenizer=bpe: the vocabulary to train and the bound on its training text (gptmini.data.bpe)
        tokenizer_options={
            "vocab_size": settings["tokenizer_vocab_size"],
            "train_bytes": settings["tokenizer_train_bytes"],
        },
    )
    log.info("data %s", result.summary)
    for split, info in result.meta["splits"].items():
        if info["tokens"] > 0:
            load_split(result.out_dir, split, result.meta)
    return result


def _check_out_folder(out: Path) -> None:
    """A preparation writes only into a folder of its own: new, empty, or one it prepared before (meta.json or
    shards there). Anything else is refused: its stale-shard and legacy-file clean-up must never touch files a
    preparation did not write (a model folder's vocab.json, say)."""
    too_long = name_too_long(out / META_FILE)
    if too_long:
        raise DataError(
            f"the prepared-data folder {str(out)[:80]}...: {too_long}; pass a shorter path (paths.data_root or "
            "data.data_dir)"
        )
    if out.exists() and not out.is_dir():
        raise DataError(
            f"the prepared-data folder {out} is a file: pass a folder (new, or one prepared before)"
        )
    if not out.is_dir():
        return
    # One listing decides: a preparation running now (it holds the lock, this check does not) may create its
    # shard folder between two looks, and the second look would call that folder foreign.
    names = sorted(p.name for p in out.iterdir())
    if META_FILE in names or any(n.startswith(SHARD_PREFIX) for n in names):
        return
    foreign = [n for n in names if n not in (LOCK_FILE, "raw")]
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise DataError(
            f"the prepared-data folder {out} holds files a preparation did not write ({shown}): pass a new or "
            "empty folder (or one prepared before)"
        )


def _prepare_locked(
    corpus: Corpus,
    out: Path,
    settings: dict[str, Any],
    val_fraction: float,
    force: bool,
    num_threads: int | None,
    buffer_mb: int,
    callback: Callable[[PrepareProgress], None] | None,
    t0: float,
    given: Tokenizer | None = None,
) -> PreparedData:
    if not force:
        # Again, holding the lock: another process may have prepared it meanwhile.
        refreshed = _refresh(out, corpus, settings, val_fraction, t0)
        if refreshed is not None:
            return refreshed
    try:
        live = load_meta(out)["shard_dir"]  # validated: a plain name of a folder inside ``out``
    except DataError:
        live = None
    inputs = {"settings": settings, "files": [f.record() for f in corpus.files]}
    name = SHARD_PREFIX + json_sha256(inputs)[:12]
    if name == live:  # --force over up-to-date data: build beside it, swap when done
        name += "-2"
    folder = out / name
    for stale in out.glob(SHARD_PREFIX + "*"):  # earlier preparations, interrupted or replaced
        if stale.name not in (live, name) and stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
    state, tok = _begin(corpus, out, folder, name, settings, force, callback, given)
    dropped: collections.Counter[str] = collections.Counter()
    documents, chars, shards = _write_shards(
        corpus, tok, folder, state, settings, num_threads or default_threads(), buffer_mb, callback, dropped
    )
    vocab_file = None
    if isinstance(tok, CharTokenizer):
        vocab_file = f"{name}/{VOCAB_FILE}"
        tok.save(out / vocab_file)
    elif isinstance(tok, BPETokenizer):  # saved before tokenizing
        vocab_file = f"{name}/{BPE_FILE}"
    meta = {
        "format_version": FORMAT_VERSION,
        "source": corpus.source,
        "settings": settings,
        "files": [
            f.record() | {"sha256": h}
            for f, h in zip(corpus.files, state["scan"]["file_sha256"], strict=True)
        ],
        "source_sha256": source_sha256(corpus, state["scan"], tok),
        "source_chars": chars,
        "documents": documents,
        "tokenizer": settings["tokenizer"],
        # a trained BPE's file: its size and digest, checked before it is read back
        "tokenizer_spec": tok.to_dict()
        | (bpe_file_facts(out / vocab_file) if isinstance(tok, BPETokenizer) else {}),
        "vocab_size": tok.vocab_size,
        "eot_id": tok.eot_id,
        # the end-of-text id follows every document (corpora of one continuous text have none)
        "end_of_text": not corpus.single_text and tok.eot_id is not None,
        "dtype": state["dtype"],
        "val_fraction": val_fraction,
        "shard_dir": name,
        "shards": shards,
        "tokens": sum(int(s["tokens"]) for s in shards),
        "splits": _splits(sum(int(s["tokens"]) for s in shards), val_fraction),
        "vocab_file": vocab_file,
        # records without text, left out (by reason: "null", "empty")
        "dropped_records": dict(sorted(dropped.items())),
    }
    # Commit: one atomic rename of meta.json makes the new shards the data; then the old ones go.
    atomic_write_json(out / META_FILE, meta, sort_keys=True)
    (folder / PROGRESS_FILE).unlink(missing_ok=True)
    if live and live != name and not (out / live).is_symlink():
        shutil.rmtree(out / live, ignore_errors=True)
    for legacy in LEGACY_FILES:
        (out / legacy).unlink(missing_ok=True)
    fsync_dir(out)
    return PreparedData(out, meta, skipped=False, seconds=time.perf_counter() - t0)


def _refresh(
    out: Path, corpus: Corpus, settings: Mapping[str, Any], val_fraction: float, t0: float
) -> PreparedData | None:
    """The data of ``out`` when it is up to date (files whose time alone changed hashed again; a new
    ``val_fraction`` re-split without tokenizing), its meta.json refreshed; else None."""
    meta, touched = _freshness(out, corpus, settings)
    if meta is None:
        return None
    refreshed = dict(meta)
    files = [dict(r) for r in meta["files"]]
    for i in touched:  # same size, new time: the same data if the same bytes
        if file_sha256(corpus.files[i].path) != files[i]["sha256"]:
            return None
        files[i]["mtime_ns"] = corpus.files[i].mtime_ns
    refreshed["files"] = files
    if meta.get("val_fraction") != val_fraction:
        refreshed["val_fraction"] = val_fraction
        refreshed["splits"] = _splits(int(meta["tokens"]), val_fraction)
        log.info("%s: re-split with val_fraction=%g (no tokenizing needed)", out, val_fraction)
    if refreshed != meta:
        atomic_write_json(out / META_FILE, refreshed, sort_keys=True)
    same = refreshed["splits"] == meta["splits"]
    return PreparedData(out, refreshed, skipped=same, seconds=time.perf_counter() - t0)


def _begin(
    corpus: Corpus,
    out: Path,
    folder: Path,
    name: str,
    settings: Mapping[str, Any],
    force: bool,
    callback: Callable[[PrepareProgress], None] | None,
    given: Tokenizer | None = None,
) -> tuple[dict[str, Any], Tokenizer]:
    """The progress record of the shards' folder (resumed after its finished shards, or new after a scan of the
    corpus) and the tokenizer."""
    state = None if force else _resume_state(folder, name)
    scan = (
        state["scan"] if state is not None else scan_corpus(corpus, settings["tokenizer"] == "char", callback)
    )
    char = settings["tokenizer"] == "char"
    if char and not scan["chars"]:
        raise DataError(
            f"corpus {corpus.source!r} has no text (every document is empty); point the source at text"
        )
    tok: Tokenizer
    if given is not None:
        tok = given
    elif char:
        tok = CharTokenizer(scan["chars"])
    elif "bpe" in settings:  # trained on the corpus, before any tokenizing (a resumed one reads it back)
        tok = trained_bpe(corpus, settings["bpe"], folder / BPE_FILE if state is not None else None)
    else:
        tok = build_tokenizer(settings["tokenizer"])
    dtype = token_dtype(tok.vocab_size).name
    if state is not None and state["dtype"] == dtype:
        _clear_unrecorded(folder, state)
        log.info(
            "%s: resuming after %d finished shard(s) (%s tokens)",
            out,
            len(state["shards"]),
            f"{sum(s['tokens'] for s in state['shards']):,}",
        )
    else:  # new, or a record of other ids than this tokenizer's: from the start
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        if isinstance(tok, BPETokenizer):
            tok.save(folder / BPE_FILE)
        state = {"inputs": name, "dtype": dtype, "scan": scan, "shards": [], "resume": None}
        atomic_write_json(folder / PROGRESS_FILE, state)
    return state, tok


def _write_shards(
    corpus: Corpus,
    tok: Tokenizer,
    folder: Path,
    state: dict[str, Any],
    settings: Mapping[str, Any],
    threads: int,
    buffer_mb: int,
    callback: Callable[[PrepareProgress], None] | None,
    dropped: collections.Counter[str],
) -> tuple[int, int, list[dict[str, Any]]]:
    """Tokenize the corpus into shards from where ``state`` stands: (documents, characters, every shard)."""

    def on_shard(shards: list[dict[str, Any]], position: Any) -> None:
        atomic_write_json(folder / PROGRESS_FILE, state | {"shards": shards, "resume": position})

    writer = ShardWriter(folder, DTYPES[state["dtype"]], settings["shard_tokens"], state["shards"], on_shard)
    try:
        documents, chars = tokenize_corpus(
            corpus, tok, writer, state["resume"], threads, buffer_mb, callback, dropped
        )
        shards = writer.close()
    finally:
        writer.abort()
    changed = corpus.changed_files()
    if changed:
        raise DataError(
            f"corpus {corpus.source!r} changed while it was being prepared: {'; '.join(changed[:3])}. The prepared "
            "text would mix two versions, so nothing was replaced; prepare again once the corpus stops changing"
        )
    if dropped:
        log.warning(
            "%s: left out %s; they hold no text in field %r",
            corpus.source,
            " and ".join(f"{n:,} record(s) whose text is {why}" for why, n in sorted(dropped.items())),
            corpus.text_field,
        )
    if sum(int(s["tokens"]) for s in shards) == 0:
        raise DataError(
            f"corpus {corpus.source!r} has no text (every document is empty); point the source at text"
        )
    return documents, chars, shards


def _resume_state(folder: Path, name: str) -> dict[str, Any] | None:
    """The progress of an interrupted preparation of these very inputs, if its finished shards are all there;
    else None."""
    try:
        state = json.loads((folder / PROGRESS_FILE).read_text(encoding="utf-8"))
        check_fields(state, PROGRESS_FIELDS, folder / PROGRESS_FILE)
        itemsize = DTYPES[state["dtype"]].itemsize
        if state["inputs"] != name or folder.is_symlink():
            return None
        for s in state["shards"]:
            if (folder / s["file"]).stat().st_size != int(s["tokens"]) * itemsize:
                return None
    except (OSError, ValueError):  # DataError included: a damaged record is prepared again from the start
        return None
    return state


def _clear_unrecorded(folder: Path, state: Mapping[str, Any]) -> None:
    """Shards a killed preparation wrote after its last progress record, and its temp files: written again,
    identically."""
    remove_stale_temp_files(folder)
    known = {s["file"] for s in state["shards"]}
    for extra in folder.glob("shard_*.bin"):
        if extra.name not in known:
            extra.unlink()
