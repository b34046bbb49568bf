"""A run's checkpoint files, without torch: which files ``last`` chooses among, and the run's summary of its
checkpoints that ``gptmini runs`` reads instead of the checkpoints themselves."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gptmini import fileio
from gptmini.runs.record import RunRecordError, read_record

# The files ``last`` chooses among (``gptmini.runs.discovery.newest_checkpoint``).
LAST_NAMES = ("last.ckpt", "on_exception.ckpt")


# --- the run's summary of its checkpoints ----------------------------------------------------------------------

# In each run folder, beside checkpoints/, a small JSON summary of its last.ckpt and on_exception.ckpt as training
# wrote them: what ``gptmini runs`` shows of a run, read without opening the checkpoints (torch) or the run's event
# files (TensorBoard). Each entry records its checkpoint's size and modification time as written: an entry whose
# checkpoint has changed since is not used (the checkpoint is read instead).
SUMMARY_FILE = "run_summary.json"
SUMMARY_FORMAT = 1
SUMMARY_MAX_BYTES = 1 << 16  # a summary is a few hundred bytes


def _summary_file(ckpt: Path) -> Path | None:
    """The run's summary file for checkpoint ``ckpt`` (``<run>/checkpoints/<name>``), or None: not one of
    ``LAST_NAMES`` in a run's checkpoints folder."""
    if ckpt.name not in LAST_NAMES or ckpt.parent.name != "checkpoints":
        return None
    return ckpt.parent.parent / SUMMARY_FILE


def last_val_loss(checkpoint: Mapping[str, Any]) -> tuple[float | None, int | None]:
    """The last validation's val/loss and step, as the callback watching it (``stop_at_target``) keeps them in
    its state; (None, None) when no callback recorded one."""
    for state in (checkpoint.get("callbacks") or {}).values():
        if isinstance(state, Mapping) and isinstance(state.get("last_val_loss"), float):
            step = state.get("last_val_step")
            return state["last_val_loss"], step if isinstance(step, int) else None
    return None, None


def checkpoint_facts(checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    """What the run's summary keeps of a checkpoint: its step, its last val/loss and step, and the TensorBoard
    folder its run logged to (its record's, relative to the run folder)."""
    step = checkpoint.get("global_step")
    val_loss, val_step = last_val_loss(checkpoint)
    try:
        tensorboard_dir = read_record(checkpoint).tensorboard_dir
    except RunRecordError:
        tensorboard_dir = None
    return {
        "global_step": step if isinstance(step, int) else None,
        "val_loss": val_loss,
        "val_step": val_step,
        "tensorboard_dir": tensorboard_dir,
    }


def _read_summaries(file: Path) -> dict[str, Any]:
    try:
        if file.stat().st_size > SUMMARY_MAX_BYTES:
            return {}
        loaded = json.loads(file.read_bytes())
    except (OSError, ValueError):
        return {}
    if not isinstance(loaded, dict) or loaded.get("format_version") != SUMMARY_FORMAT:
        return {}
    entries = loaded.get("checkpoints")
    return entries if isinstance(entries, dict) else {}


def write_summary(path: str | Path, checkpoint: Mapping[str, Any]) -> None:
    """Records the checkpoint just saved at ``path`` in its run's summary (if it is in a run's checkpoints)."""
    path = Path(path)
    file = _summary_file(path)
    if file is None:
        return
    st = path.stat()
    entries = _read_summaries(file)
    entries[path.name] = {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns, **checkpoint_facts(checkpoint)}
    fileio.atomic_write_json(file, {"format_version": SUMMARY_FORMAT, "checkpoints": entries})


def read_summary(path: str | Path) -> dict[str, Any] | None:
    """The summary of the checkpoint ``path`` when it describes the file as it is now (its size and
    modification time); None when there is none, it is unreadable, or the checkpoint changed since."""
    path = Path(path)
    file = _summary_file(path)
    entry = _read_summaries(file).get(path.name) if file is not None else None
    if not isinstance(entry, dict):
        return None
    try:
        st = path.stat()
    except OSError:
        return None
    return entry if (entry.get("bytes"), entry.get("mtime_ns")) == (st.st_size, st.st_mtime_ns) else None
