"""Atomic file writes: killed at any point, a path holds either its previous complete content or the new
complete one. Temp file in the same folder (a rename across filesystems would be a copy), flush + fsync,
``os.replace`` (atomic on POSIX and Windows), fsync of the folder."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import socket
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def fsync_dir(folder: Path) -> None:
    # Makes the rename itself durable; not every platform/filesystem can open a directory.
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def host_identity() -> str:
    """This host's name as temp files carry it (letters, digits and '-' only, at most 32 characters): on storage
    several machines share, a process id means something only on the host that wrote it."""
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:32] or "host"


# ``.<name>.<pid>@<host>.<8 hex digits>.tmp``: what ``temp_name`` writes, and all that clean-up ever removes
TEMP_FILE = re.compile(r"\..+\.(?P<pid>[0-9]{1,9})@(?P<host>[A-Za-z0-9-]+)\.[0-9a-f]{8}\.tmp")


def temp_name(path: Path) -> Path:
    """``.<name>.<pid>@<host>.<id>.tmp`` beside ``path``: the pid and the host tell a stale temp file (its
    writer, a process of this host, is gone)."""
    return path.with_name(f".{path.name}.{os.getpid()}@{host_identity()}.{uuid.uuid4().hex[:8]}.tmp")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists but not ours
        return True
    return True


def remove_stale_temp_files(folder: str | Path, pattern: str = ".*.tmp") -> list[Path]:
    """Deletes the temp files that a process killed while writing left in ``folder``: only names ``temp_name``
    writes, carrying this host's identity and the id of a process of this host that is gone (a write in progress,
    another host's, or a file of the user's that merely looks alike is never touched). Callers pass only the
    folder a run is writing or resuming. Returns the deleted paths."""
    removed = []
    host = host_identity()
    for tmp in Path(folder).glob(pattern):
        match = TEMP_FILE.fullmatch(tmp.name)
        if match is None or match["host"] != host or not tmp.is_file() or tmp.is_symlink():
            continue
        pid = int(match["pid"])
        if pid == os.getpid() or _pid_alive(pid):
            continue
        with contextlib.suppress(OSError):
            tmp.unlink()
            removed.append(tmp)
    return removed


# The longest file name (one path component) and path that POSIX filesystems take, in bytes; longer ones fail
# with ENAMETOOLONG in the first call that touches them (even ``exists``).
NAME_MAX = 255
PATH_MAX = 4096


def name_too_long(path: str | Path) -> str | None:
    """Why ``path`` is too long for the filesystem (a component over ``NAME_MAX`` bytes, or the whole over
    ``PATH_MAX``), or None: checked on the text, so nothing is touched."""
    text = os.fspath(path)
    for part in Path(text).parts:
        size = len(os.fsencode(part))
        if size > NAME_MAX:
            return (
                f"its name {part[:24]!r}... is {size} bytes long, over the filesystem's limit of {NAME_MAX}"
            )
    size = len(os.fsencode(text))
    if size >= PATH_MAX:
        return f"it is {size} bytes long, over the filesystem's limit of {PATH_MAX - 1}"
    return None


# The file a training run holds in its run folder while it runs (see ``hold_folder``).
RUN_LOCK = ".gptmini-run.lock"


def hold_folder(folder: str | Path, name: str = RUN_LOCK) -> int | None:
    """Makes ``folder/name`` this process's (created with O_EXCL, so of two processes starting together exactly
    one gets it; a file whose process is gone is taken over), removed when this process exits. Returns None when
    this process holds it, else the id of the live process that does (-1: unknown)."""
    path = Path(folder) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            pid = holder(folder, name)
            if pid == os.getpid():
                return None
            if pid is not None:
                return pid
            with contextlib.suppress(OSError):  # stale: its process is gone
                path.unlink()
            continue
        with os.fdopen(fd, "w") as f:
            f.write(f"{os.getpid()}\n")
        atexit.register(_release, path, os.getpid())
        return None
    return -1  # taken again by another process between our two tries


def holder(folder: str | Path, name: str = RUN_LOCK) -> int | None:
    """The id of the live process that holds ``folder/name`` (``hold_folder``): a run training there; None when
    no process does."""
    try:
        pid = int((Path(folder) / name).read_text().strip() or 0)
    except (OSError, ValueError):
        return None
    return pid if pid > 0 and _pid_alive(pid) else None


def release_folder(folder: str | Path, name: str = RUN_LOCK) -> None:
    """Gives up ``folder/name`` where this process holds it (``hold_folder``): the run in it has ended."""
    _release(Path(folder) / name, os.getpid())


def _release(path: Path, pid: int) -> None:
    with contextlib.suppress(OSError, ValueError):
        if int(path.read_text().strip()) == pid == os.getpid():
            path.unlink()


def utf8_text(text: str) -> str:
    """``text`` as UTF-8 can store it (TensorBoard's text and hyperparameters): a path's bytes that are not UTF-8
    (``os.fsdecode``'s escapes) as ``\\xNN``."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def unwritable_reason(folder: str | Path) -> str | None:
    """Why files cannot be created in ``folder`` (to be created with its parents if missing), or None when they
    can: checked on its nearest existing ancestor, so nothing is created here."""
    path = Path(folder).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    if not path.is_dir():
        return f"{path} is a file, not a folder"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"{path} is not writable (permission denied)"
    return None


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], Any]) -> None:
    """``write(f)`` fills an open binary temp file that then replaces ``path`` atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(path)
    try:
        # O_EXCL: never follows or overwrites anything; 0o666 & ~umask like an ordinary file.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    atomic_write(path, lambda f: f.write(data))


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, payload: Any, **dumps_kwargs: Any) -> None:
    atomic_write_text(path, json.dumps(payload, **({"indent": 2} | dumps_kwargs)) + "\n")
