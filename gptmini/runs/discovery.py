"""Which checkpoint a command's ``--ckpt`` (and training's ``ckpt_path`` and ``model.init_from``) means
(``resolve_checkpoint``, :data:`CKPT_RULE`), and ``gptmini runs``: the runs under the runs folder, newest first.

A run is a folder holding ``.hydra/config.yaml``: ``outputs/<name>/<time>/``, or
``outputs/<name>/multirun_<time>/<overrides>/`` for a job of a sweep. Its row is read from its own small files
(``run_record.json``, the ``run_summary.json`` written with each checkpoint, ``.hydra/overrides.yaml``); a
checkpoint (memory-mapped) only when no summary describes it as it is now, so a listing imports no torch."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from gptmini import fileio
from gptmini.options import HelpFormatter
from gptmini.runs.files import LAST_NAMES, checkpoint_facts, read_summary
from gptmini.runs.record import read_record_file

log = logging.getLogger(__name__)

# What --ckpt takes, in every command's --help (resolve_checkpoint).
CKPT_RULE = (
    "a .ckpt file, a run folder, a run name under outputs/, or 'last'. 'last' is the newest finished or resumable "
    "run, never one still training (its last.ckpt or on_exception.ckpt, whichever was written last; a damaged one is skipped, with a "
    "warning), and a run name the newest such run of that name; the jobs of a sweep (outputs/<name>/multirun_*/) are never chosen: pass a job's folder. "
    "`gptmini runs` lists them"
)


# --- which file "last" means ---------------------------------------------------------------------------------


def newest_checkpoint(output_root: str | Path, run_name: str | None = None) -> Path | None:
    return next(iter(last_checkpoints(output_root, run_name)), None)


def last_checkpoints(
    output_root: str | Path, run_name: str | None = None, sweep_jobs: bool = True
) -> list[Path]:
    """Every ``last.ckpt`` and ``on_exception.ckpt`` in a ``checkpoints/`` folder under ``output_root/run_name``
    (every run's when ``run_name`` is None), the one written last first (ties: the later path).
    ``sweep_jobs=False`` leaves out the jobs of sweeps (``multirun_*``), as ``last`` and a run name do
    (:data:`CKPT_RULE`)."""
    root = Path(output_root) / run_name if run_name else Path(output_root)
    candidates = [
        p
        for name in LAST_NAMES
        for p in root.glob(f"**/checkpoints/{name}")
        if p.is_file() and (sweep_jobs or not is_sweep_job(p.relative_to(root)))
    ]
    return sorted(candidates, key=lambda p: (p.stat().st_mtime_ns, str(p)), reverse=True)


def newest_usable_checkpoint(root: str | Path, running: bool = True) -> Path | None:
    """What ``last`` (or a run folder) opens: the newest of :func:`last_checkpoints` (sweep jobs left out; with
    ``running=False`` the runs still training too, each named in a note) that loads and matches its checksum. The
    damaged ones newer than it are named in one warning; CheckpointError naming them when every one is damaged;
    None when there is none."""
    from gptmini.runs.checkpoint import CheckpointError, load_checkpoint

    damaged: list[Path] = []
    for path in last_checkpoints(root, sweep_jobs=False):
        if not running and fileio.holder(path.parent.parent) is not None:
            log.info(
                "note: skipped %s, still training (pass that folder as --ckpt to open it)", path.parent.parent
            )
            continue
        try:
            load_checkpoint(path, mmap=True)
        except CheckpointError:
            damaged.append(path)
            continue
        if damaged:
            log.warning(
                "skipped %d damaged checkpoint%s newer than %s: %s",
                len(damaged),
                "s" if len(damaged) > 1 else "",
                path,
                ", ".join(map(str, damaged)),
            )
        return path
    if damaged:
        raise CheckpointError(
            f"every checkpoint under {root} is damaged ({', '.join(map(str, damaged[:5]))}"
            f"{', ...' if len(damaged) > 5 else ''}): pass another checkpoint, or train again"
        )
    return None


def is_sweep_job(relative: Path) -> bool:
    """Whether a path below a runs folder lies in a sweep's folder (Hydra's ``multirun_<time>/``)."""
    return any(part.startswith("multirun_") for part in relative.parts)


def _sweep_only(root: Path) -> str:
    job = newest_checkpoint(root)
    return f"; it holds only sweep jobs: pass one job's folder, e.g. {job.parent.parent}" if job else ""


def resolve_checkpoint(spec: str | Path, output_root: str | Path = "outputs", option: str = "--ckpt") -> Path:
    """``spec`` as the commands take it (:data:`CKPT_RULE`; a folder of runs means its newest usable checkpoint
    outside the sweeps below it). ``option`` names the setting in a refusal: ``--ckpt`` or ``ckpt_path``."""
    # torch: only once a checkpoint is to be opened (`gptmini runs` lists without it)
    from gptmini.runs.checkpoint import CheckpointError

    named = f"{option} {spec}" if option.startswith("-") else f"{option}={spec}"
    for value, what in ((spec, named), (output_root, f"the output folder {output_root}")):
        if too_long := fileio.name_too_long(value):
            raise CheckpointError(f"{str(what)[:80]}...: {too_long}; pass a shorter path")
    if str(spec) == "last":
        found = newest_usable_checkpoint(output_root, running=False)
        if found is None:
            raise CheckpointError(
                f"no last.ckpt or on_exception.ckpt found under {output_root}/"
                f"{_sweep_only(Path(output_root))}: train first (gptmini train) or pass {option} PATH"
            )
        return found
    path = Path(spec)
    if not path.exists() and not path.is_absolute() and len(path.parts) == 1:
        run = Path(output_root) / path  # a run name
        path = run if run.is_dir() else path
    if path.is_dir():
        found = newest_usable_checkpoint(path)
        if found is None:
            raise CheckpointError(
                f"{named}: {path} is a folder without a checkpoint of a run (no checkpoints/last.ckpt or "
                f"on_exception.ckpt under it){_sweep_only(path)}: pass a run folder that holds one, a .ckpt file, "
                "or 'last'"
            )
        return found
    if path.is_symlink() and not path.exists():
        raise CheckpointError(
            f"{named} is a symlink that leads nowhere (a loop, or its target is missing): pass the checkpoint itself"
        )
    if not path.exists():
        root = Path(output_root)
        runs = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
        there = (
            f"its runs: {', '.join(runs[:10])}{', ...' if len(runs) > 10 else ''}"
            if runs
            else ("which holds no runs" if root.is_dir() else "no such folder")
        )
        raise CheckpointError(
            f"{named} does not exist: pass a .ckpt file written by training, a run folder, a run name under "
            f"{root}/ ({there}), or 'last'"
        )
    if not path.is_file():
        raise CheckpointError(f"{named} is not a regular file: pass a .ckpt file or a run folder")
    if not os.access(path, os.R_OK):
        raise CheckpointError(f"{named} is not readable (permissions): pass a checkpoint you can read")
    return path


@dataclass(frozen=True)
class RunInfo:
    name: str  # run_name
    folder: str
    sweep_job: bool
    steps_done: int | None  # the newest checkpoint's global_step; None without a checkpoint
    steps_planned: int | None  # trainer.max_steps
    val_loss: float | None  # the last val/loss logged
    val_step: int | None
    size_bytes: int
    # "running" (a process trains in it), "finished", "resumable", "resumed" (a later run resumed it and has a
    # checkpoint: that one is resumable) or "no checkpoint"
    state: str
    checkpoint: str | None  # the file a resume (or --ckpt with this folder) reads
    modified: float  # seconds since the epoch: the newest file of the run
    # the command line's overrides that set what the run trains (not its folders)
    overrides: tuple[str, ...] = ()
    # the folder of the TensorBoard run it logged to (a resumed run: its first run's)
    tensorboard: str | None = None
    # what this run continued, from its record's lineage: "<run folder>@<step>" (None: a fresh run)
    continues: str | None = None


# The largest YAML file of a run folder read: Hydra's config.yaml of a run is a few kilobytes.
YAML_MAX_BYTES = 1 << 20


def read_run_yaml(path: Path) -> Any:
    """A YAML file of a run folder (Hydra's ``.hydra/*.yaml``), read with bounded memory: a file over
    ``YAML_MAX_BYTES``, or one using aliases (``*name``: Hydra never writes them, and nested ones stand for
    gigabytes of text once expanded), is refused with one warning naming it, as is one that does not parse.
    None when refused or missing: the fields it holds show as unknown."""
    import yaml

    # libyaml's loader when PyYAML has it (ten times faster: `gptmini runs` may read a thousand of these)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        size = path.stat().st_size
        if size > YAML_MAX_BYTES:
            raise yaml.YAMLError(f"it is {size:,} bytes, over the {YAML_MAX_BYTES:,} a run's file may hold")
        text = path.read_text(encoding="utf-8")
        # the events, streamed, before anything is built
        if any(isinstance(event, yaml.AliasEvent) for event in yaml.parse(text, Loader=loader)):
            raise yaml.YAMLError("it uses YAML aliases, which a run's files never hold")
        return yaml.load(text, Loader=loader)  # noqa: S506 (a safe loader)
    except FileNotFoundError:
        return None
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as err:
        log.warning("%s is not read (%s): its fields show as unknown", display_path(path), err)
        return None


def display_path(path: str | Path) -> str:
    """``path`` as valid UTF-8: bytes of a name that are not UTF-8 (lone surrogates) are written ``\\xNN``."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


# Overrides that place a run rather than change what it trains (as hydra.job.config.override_dirname leaves out).
_PLACING = ("run_name", "ckpt_path", "paths.", "hydra.")


def task_overrides(overrides: Sequence[Any]) -> tuple[str, ...]:
    """Of a run's command-line overrides (Hydra's record, ``hydra.overrides.task``), those that set what it
    trains: not its name, its folders or its resume checkpoint."""
    return tuple(str(o) for o in overrides if not str(o).lstrip("+~").startswith(_PLACING))


def _overrides(folder: Path) -> tuple[str, ...]:
    loaded = read_run_yaml(folder / ".hydra" / "overrides.yaml")
    if not isinstance(loaded, list) or not all(isinstance(o, str) for o in loaded):
        return ()
    return task_overrides(loaded)


# --- the TensorBoard run of a run folder ---

# Event files go to <run folder>/tb/<label>: TensorBoard names a run by the folder of its event files, so the label
# says what the run is. Runs written before labels existed have their event files in tb/ itself.
TB_FOLDER = "tb"
# a label is one folder name: the characters a run_name may hold, at most this long
_LABEL_UNSAFE = re.compile(r"[^A-Za-z0-9_.,=+@-]+")
LABEL_MAX = 120


def tensorboard_label(run_name: str, overrides: Sequence[str]) -> str:
    """The folder name of a run's TensorBoard events: its run_name, then its overrides sorted (as Hydra names a
    sweep job's folder), e.g. ``default,model.n_layer=6,trainer.max_steps=300``. Characters a folder name should
    not hold become ``_``; a label over ``LABEL_MAX`` characters is cut and ends with 8 hex digits of a hash of
    the whole, so two long labels that differ stay apart (the full list is the run's ``run/overrides`` text)."""
    text = ",".join([run_name, *sorted(overrides)])
    label = _LABEL_UNSAFE.sub("_", text).lstrip(".-") or "run"
    if len(label) <= LABEL_MAX:
        return label
    # surrogateescape: a path not in UTF-8 too
    digest = hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    return f"{label[: LABEL_MAX - 9].rstrip('.,=')}-{digest}"


def event_folders(run_dir: Path) -> list[Path]:
    """The folders under ``run_dir/tb`` that hold TensorBoard event files (``tb/<label>``, or ``tb`` itself for a
    run written before labels), the one written last first."""
    tb = Path(run_dir) / TB_FOLDER
    if not tb.is_dir():
        return []
    newest = {}
    for folder in (tb, *(p for p in tb.iterdir() if p.is_dir() and not p.is_symlink())):
        files = [f.stat().st_mtime_ns for f in folder.glob("events.out.tfevents.*") if f.is_file()]
        if files:
            newest[folder] = max(files)
    return sorted(newest, key=lambda f: (newest[f], str(f)), reverse=True)


def read_events(folder: Path, **size_guidance: int) -> Any:
    """An ``EventAccumulator`` of the event files in ``folder``, read; ``size_guidance``: how many of each kind to
    keep (0: all), by default every scalar."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0, **size_guidance})
    # its directory watcher logs each folder read to the end ("No path found after ...") at INFO: noise here
    logger = logging.getLogger("tensorboard")
    level = logger.level
    logger.setLevel(max(level, logging.WARNING))
    try:
        events.Reload()
    finally:
        logger.setLevel(level)
    return events


def _facts(path: Path) -> dict[str, Any] | None:
    """The facts of a run's checkpoint (``checkpoint_facts``): from the run's summary when it describes the file as
    it is now, else from the checkpoint itself (memory-mapped); None, with a warning, when it does not load."""
    summary = read_summary(path)
    if summary is not None:
        return summary
    # torch: only for a checkpoint without a summary
    from gptmini.runs.checkpoint import CheckpointError, load_checkpoint

    try:
        return checkpoint_facts(load_checkpoint(path, mmap=True, verify=False))
    except CheckpointError as err:
        log.warning("%s", err)
        return None


def run_event_folder(run_dir: Path) -> Path | None:
    """The folder of the TensorBoard run that the run in ``run_dir`` logged to, by its newest checkpoint."""
    ckpt = next(iter(_checkpoints(Path(run_dir))), None)
    return _event_folder(Path(run_dir), _facts(ckpt) if ckpt is not None else None)


def _event_folder(run_dir: Path, facts: dict[str, Any] | None) -> Path | None:
    """The TensorBoard folder a checkpoint's ``facts`` record (its run record's ``tensorboard_dir``, relative to
    the run folder: a resumed run logs into the run it resumes), else the newest under ``run_dir/tb``; None: no
    events."""
    recorded = (facts or {}).get("tensorboard_dir")
    if isinstance(recorded, str) and recorded:
        # normalised by name: the run folder of a checkpoint that was copied away may not exist
        folder = Path(os.path.normpath(run_dir / recorded))
        if folder.is_dir():
            return folder
    return next(iter(event_folders(run_dir)), None)


def _size_and_mtime(folder: Path) -> tuple[int, float]:
    """The bytes of the files under ``folder`` and the newest modification time, symlinks left out: one
    ``stat`` per file (``os.scandir`` knows each entry's type), the listing's main cost over many runs."""
    size, newest = 0, folder.stat().st_mtime
    stack = [os.fspath(folder)]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    stat = entry.stat(follow_symlinks=False)
                    size += stat.st_size
                    newest = max(newest, stat.st_mtime)
    return size, newest


def _wanted(value: Any, kind: type) -> Any:
    """``value`` when it is of ``kind`` (not a bool for an int), else None: a field of the wrong type."""
    return value if isinstance(value, kind) and not isinstance(value, bool) else None


def _checkpoints(folder: Path) -> list[Path]:
    found = [p for p in (folder / "checkpoints" / name for name in LAST_NAMES) if p.is_file()]
    return sorted(found, key=lambda p: (p.stat().st_mtime_ns, str(p)), reverse=True)


# A run of the listing: its row, the checkpoint it stands for, and the checkpoint it continued (resolved) with the
# step that held (None: a fresh run, or one whose record does not say, of an earlier version).
Scanned = tuple[RunInfo, Path | None, tuple[Path, int] | None]


def _row(folder: Path, output_root: Path) -> Scanned:
    """One run, its record read once: its row and the checkpoint it stands for, the newest of the run's two that
    its summary still describes or that loads (a damaged newer one is skipped, as a resume and ``--ckpt`` skip
    it), and its lineage. The figures from that summary, else from its record and the checkpoint."""
    record = read_record_file(folder)  # written when the run starts
    config = (
        {"run_name": record.run_name, "trainer": {"max_steps": record.max_steps}}
        if record is not None
        else read_run_yaml(folder / ".hydra" / "config.yaml")  # a run of a version before the record
    )
    config = config if isinstance(config, dict) else {}
    files = _checkpoints(folder)
    ckpt, damaged = next(iter(files), None), bool(files)  # damaged: until one loads
    done = facts = val_loss = val_step = None
    for path in files:
        facts = _facts(path)
        if facts is None:
            continue
        done = _wanted(facts.get("global_step"), int)
        val_loss, val_step = _wanted(facts.get("val_loss"), float), _wanted(facts.get("val_step"), int)
        ckpt, damaged = path, False
        break
    trainer = _wanted(config.get("trainer"), dict) or {}
    planned = _wanted(trainer.get("max_steps"), int)
    planned = planned if planned is not None and planned >= 0 else None
    if fileio.holder(folder) is not None:
        state = "running"
    elif ckpt is None:
        state = "no checkpoint"
    elif damaged:
        state = "damaged"
    elif done is not None and planned is not None and done >= planned and ckpt.name == "last.ckpt":
        state = "finished"
    else:
        state = "resumable"
    events = _event_folder(folder, facts)
    size, modified = _size_and_mtime(folder)
    relative = folder.relative_to(output_root)
    name = config.get("run_name")
    if not isinstance(name, str) or not name or "${" in name:  # run_name's default, as saved: unresolved
        name = relative.parts[0]  # outputs/<run_name>/...
    lineage = record.continued_from if record is not None else None
    continues = None
    if lineage is not None:
        run = Path(lineage.path).parent.parent
        with contextlib.suppress(ValueError):
            run = run.resolve().relative_to(output_root.resolve())
        continues = f"{display_path(run)}@{lineage.step}"
        lineage = (Path(lineage.path).resolve(), lineage.step)
    info = RunInfo(
        name=display_path(name),
        folder=display_path(folder),
        sweep_job=is_sweep_job(relative),
        steps_done=done,
        steps_planned=planned,
        val_loss=val_loss,
        val_step=val_step,
        size_bytes=size,
        state=state,
        checkpoint=display_path(ckpt) if ckpt is not None else None,
        modified=modified,
        overrides=tuple(display_path(o) for o in _overrides(folder)),
        tensorboard=display_path(events) if events is not None else None,
        continues=continues,
    )
    return info, ckpt, lineage


def _scan(root: Path, name: str | None) -> list[Scanned]:
    """Every run, newest first (a row shows names as valid UTF-8 text, not the path itself)."""
    if not root.is_dir():
        return []
    rows = {f: _row(f, root) for f in {p.parent.parent for p in root.glob("**/.hydra/config.yaml")}}
    # a run whose checkpoint another run continued (its record's lineage) is continued there: resume that one
    continued = {lineage[0] for *_, lineage in rows.values() if lineage is not None}
    scanned = []
    for folder, (row, ckpt, lineage) in rows.items():
        if row.state == "resumable" and ckpt is not None and ckpt.resolve() in continued:
            row = replace(row, state="resumed")
        # a run name is the first folder under the runs folder, or the run_name its row shows
        if name is None or row.name == name or folder.relative_to(root).parts[0] == name:
            scanned.append((row, ckpt, lineage))
    return sorted(scanned, key=lambda run: (run[0].modified, run[0].folder), reverse=True)


def mark_last(scanned: Sequence[Scanned]) -> tuple[list[RunInfo], RunInfo | None]:
    """The row ``--ckpt last`` opens (the rule of :func:`newest_usable_checkpoint`; a run's summary that still
    describes its checkpoint stands for loading it). A row whose checkpoint turns out damaged is shown so.
    Returns the rows and the marked one."""
    rows = [r for r, _, _ in scanned]
    candidates = [
        (i, path)
        for i, (r, path, _) in enumerate(scanned)
        if path is not None
        and not r.sweep_job
        and r.state in ("finished", "resumable", "resumed")
        and path.is_file()
    ]
    candidates.sort(key=lambda c: (c[1].stat().st_mtime_ns, str(c[1])), reverse=True)
    for i, path in candidates:
        if read_summary(path) is None and _loaded(path) is None:
            rows[i] = replace(rows[i], state="damaged")
            continue
        return rows, rows[i]
    return rows, None


def human_size(n: float) -> str:
    for unit in ("B", "KB", "MB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def format_table(runs: Sequence[RunInfo], last: RunInfo | None) -> str:
    """The runs as an aligned table, the row that ``--ckpt last`` opens marked with ``*``. The overrides come
    last: however long they are, the folder (what ``--ckpt`` takes) stays on screen."""
    header = ("", "NAME", "STEPS", "VAL/LOSS", "SIZE", "STATE", "FOLDER", "OVERRIDES")
    rows = [header]
    for r in runs:
        marked = last is not None and r is last
        rows.append(
            (
                "*" if marked else "",
                r.name,
                "/".join("-" if n is None else str(n) for n in (r.steps_done, r.steps_planned)),
                "-" if r.val_loss is None else f"{r.val_loss:.4f}",
                human_size(r.size_bytes),
                r.state
                + (" (sweep job)" if r.sweep_job else "")
                + (f", continues {r.continues}" if r.continues else ""),
                r.folder,
                " ".join(r.overrides) or "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join(lines) + "\n"


# --- pruning: what no command chooses by itself and no resume needs (gptmini runs --prune) -------------------


@dataclass(frozen=True)
class Prunable:
    path: Path
    size_bytes: int
    reason: str


def _loaded(path: Path) -> dict[str, Any] | None:
    """The checkpoint ``path`` (memory-mapped) when it loads and matches its checksum; else None, warned."""
    from gptmini.runs.checkpoint import CheckpointError, load_checkpoint

    try:
        return load_checkpoint(path, mmap=True)
    except CheckpointError as err:
        log.warning("%s", err)
        return None


def prunable(root: Path, name: str | None = None) -> list[Prunable]:
    """The checkpoint files under ``root`` (of run name ``name``) that a user no longer needs, each with why: the
    rule of docs/reliability.md (``gptmini runs --prune``). What continued what is read from the runs' records
    (:class:`Lineage`) only, never guessed from folders."""
    scanned = _scan(root, name)
    _, marked = mark_last(scanned)
    keep = {path for r, path, _ in scanned if r is marked and path is not None}
    found: dict[Path, str] = {}
    # run folder -> the step of its newest usable checkpoint, and the run's lineage
    steps: dict[Path, tuple[int, tuple[Path, int] | None]] = {}
    for _, newest, lineage in scanned:
        if newest is None:
            continue
        folder = newest.parent.parent
        step = _wanted((_loaded(newest) or {}).get("global_step"), int)
        if step is None:
            continue
        steps[folder] = step, lineage
        for other in _checkpoints(folder):
            if other != newest and other.stat().st_mtime_ns <= newest.stat().st_mtime_ns:
                found[other] = f"older than {newest.name} beside it, which a resume and --ckpt read"
    ours = {path.resolve(): path for _, path, _ in scanned if path is not None} | {
        p.resolve(): p for p in found
    }
    for folder, (step, lineage) in steps.items():
        if lineage is None or lineage[0] not in ours or step <= lineage[1]:
            continue
        found[ours[lineage[0]]] = f"continued by {display_path(folder)}, which went on to step {step}"
    return sorted(
        (Prunable(p, p.stat().st_size, why) for p, why in found.items() if p not in keep),
        key=lambda x: str(x.path),
    )


def prune(root: Path, name: str | None, delete: bool) -> str:
    found = prunable(root, name)
    if not found:
        return f"nothing to prune under {display_path(root)}/\n"
    total = sum(p.size_bytes for p in found)
    lines = [f"  {display_path(p.path)}  {human_size(p.size_bytes)}  ({p.reason})" for p in found]
    if not delete:
        head = "would delete (nothing is deleted without --yes):"
        tail = f"{len(found)} file(s), {human_size(total)}: gptmini runs --prune --yes deletes them"
        return "\n".join([head, *lines, tail]) + "\n"
    for p in found:
        p.path.unlink(missing_ok=True)
    return "\n".join(["deleted:", *lines, f"{len(found)} file(s), {human_size(total)} freed"]) + "\n"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gptmini runs",
        description="List the training runs under the runs folder, newest first: name, steps done/planned, the "
        "last val/loss, size on disk, whether each finished, can be resumed (ckpt_path=<its folder>), was resumed "
        "by a later run (resume that one) or left no checkpoint, and the overrides it was started with. The row marked * is the one `--ckpt last` opens. "
        f"--ckpt (sample, eval, attention, analyze, export) takes {CKPT_RULE}.",
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "name", nargs="?", default=None, help="list only the runs of this run name (None: every run)"
    )
    p.add_argument("--runs-dir", default="outputs", help="the runs folder (paths.output_root of training)")
    p.add_argument("--json", action="store_true", help="write the rows as JSON instead of a table")
    p.add_argument(
        "--prune",
        action="store_true",
        help="list the checkpoints no longer needed (the older of last.ckpt and on_exception.ckpt in a run folder; "
        "a checkpoint a later run continued, by its record, and took further), with their sizes; nothing is deleted without "
        "--yes. best.ckpt and what --ckpt last opens stay",
    )
    p.add_argument("--yes", action="store_true", help="with --prune: delete what it lists")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.yes and not args.prune:
        parser.error(
            "--yes deletes what --prune lists: pass --prune --yes (or --prune alone to see the list)"
        )
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    root = Path(args.runs_dir)
    if not root.is_dir():
        what = (
            "is not a folder: pass the runs folder (paths.output_root of training)"
            if root.exists()
            else "does not exist: train first (gptmini train)"
        )
        sys.stderr.write(f"error: --runs-dir {root} {what}\n")
        return 2
    if args.prune:
        sys.stdout.write(prune(root, args.name, args.yes))
        return 0
    runs, last = mark_last(_scan(root, args.name))
    if args.json:
        sys.stdout.write(json.dumps([asdict(r) for r in runs], indent=2) + "\n")
        return 0
    if not runs:
        which = f"of run name {args.name!r} " if args.name else ""
        sys.stdout.write(f"no runs {which}under {display_path(root)}/\n")
        return 0
    sys.stdout.write(format_table(runs, last))
    return 0
