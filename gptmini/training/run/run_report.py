"""What a finished run leaves beside its checkpoints so that it can be judged without TensorBoard
(docs/training.md): ``scalars.csv``, ``loss_curve.png`` and a short summary in the log.

The TensorBoard events are the one record of the scalars: the CSV and the curve are read from them at the end. A
continuation logs to a TensorBoard run of its own; its CSV and curve start with the history of the run it continued,
up to the step it continued from (that run's own ``scalars.csv``, which holds its history in turn), read when it
starts (``continued_history``)."""

from __future__ import annotations

import csv
import io
import logging
import math
import os
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gptmini.fileio import atomic_write_bytes, atomic_write_text
from gptmini.options import duration
from gptmini.runs.discovery import read_events
from gptmini.viz import png, training_curves

log = logging.getLogger("gptmini.training.run.app")

SCALARS_CSV = "scalars.csv"
LOSS_CURVE_PNG = "loss_curve.png"
# the scalars the curve draws, in this order
CURVE_TAGS = ("train/loss", "val/loss")
# scalars.csv's first columns after ``step``, then the learning rates (LearningRateMonitor's ``lr-*`` tags), then
# every other tag, each part sorted
LEADING_TAGS = ("train/loss", "val/loss", "val/bpb")
LR_TAG_PREFIX = "lr-"


@dataclass
class Scalars:
    """Each scalar tag's (step, value) points, in step order; one value per step (a resumed run's last)."""

    series: dict[str, list[tuple[int, float]]] = field(default_factory=dict)

    def last(self, tag: str) -> float | None:
        points = self.series.get(tag)
        return points[-1][1] if points else None

    def best(self, tag: str) -> tuple[int, float] | None:
        """(step, value) of the lowest finite value of ``tag``."""
        points = [p for p in self.series.get(tag, []) if math.isfinite(p[1])]
        return min(points, key=lambda p: (p[1], p[0])) if points else None

    def csv_text(self) -> str:
        """One row per step, one column per tag (``step``, the losses and bpb, the learning rates, then the other
        tags sorted); a blank cell: not logged."""
        tags = [tag for tag in LEADING_TAGS if tag in self.series] + sorted(
            (tag for tag in self.series if tag not in LEADING_TAGS),
            key=lambda tag: (not tag.startswith(LR_TAG_PREFIX), tag),
        )
        rows: dict[int, dict[str, float]] = {}
        for tag, points in self.series.items():
            for step, value in points:
                rows.setdefault(step, {})[tag] = value
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["step", *tags])
        for step in sorted(rows):
            writer.writerow([step, *(_cell(rows[step].get(tag)) for tag in tags)])
        return out.getvalue()

    def after(self, history: Scalars) -> Scalars:
        """``history``'s points, then these (which win a step both hold)."""
        tags = {*history.series, *self.series}
        return Scalars(
            {
                tag: sorted((dict(history.series.get(tag, [])) | dict(self.series.get(tag, []))).items())
                for tag in tags
            }
        )


def _cell(value: float | None) -> str:
    return "" if value is None else repr(float(value))


def read_scalars(event_folder: Path) -> Scalars:
    """Every scalar of a TensorBoard run folder."""
    # only the scalars are of use: keep one of everything else (the attention images are large)
    guidance = {"images": 1, "tensors": 1, "histograms": 1, "audio": 1, "compressedHistograms": 1}
    events = read_events(event_folder, **guidance)
    series = {}
    for tag in events.Tags().get("scalars", []):
        by_step = {int(e.step): float(e.value) for e in events.Scalars(tag)}  # a later write of a step wins
        series[tag] = sorted(by_step.items())
    return Scalars(series)


def read_scalars_csv(path: Path) -> Scalars:
    """The scalars of a ``scalars.csv`` (``Scalars.csv_text``)."""
    rows = list(csv.reader(io.StringIO(path.read_text())))
    tags = rows[0][1:] if rows else []
    series: dict[str, list[tuple[int, float]]] = {tag: [] for tag in tags}
    for row in rows[1:]:
        for tag, cell in zip(tags, row[1:], strict=False):
            if cell:
                series[tag].append((int(row[0]), float(cell)))
    return Scalars(series)


def continued_history(ckpt_path: str | None, step: int) -> Scalars:
    """The scalars of the run a continuation continues (``ckpt_path``, at ``step``) up to that step: its run
    folder's ``scalars.csv`` (its own history included), else its TensorBoard events."""
    from gptmini.runs.discovery import event_folders
    from gptmini.training.run.resume import continued_run_folder

    run_dir = continued_run_folder(ckpt_path) if ckpt_path is not None else None
    if run_dir is None:
        return Scalars()
    try:
        if (run_dir / SCALARS_CSV).is_file():
            scalars = read_scalars_csv(run_dir / SCALARS_CSV)
        else:
            folders = event_folders(run_dir)
            scalars = read_scalars(folders[0]) if folders else Scalars()
    except Exception as err:  # the continuation trains either way: its curve starts at its own steps
        log.warning(
            "could not read the scalars of the run %s continues: %s: %s", ckpt_path, type(err).__name__, err
        )
        return Scalars()
    return Scalars({tag: [p for p in points if p[0] <= step] for tag, points in scalars.series.items()})


def write_curves(scalars: Scalars, run_dir: Path, title: str) -> tuple[Path, Path]:
    """``scalars.csv`` and ``loss_curve.png`` in ``run_dir``, each replaced whole or not at all."""
    csv_path, png_path = run_dir / SCALARS_CSV, run_dir / LOSS_CURVE_PNG
    atomic_write_text(csv_path, scalars.csv_text())
    curves = [(tag, scalars.series[tag]) for tag in CURVE_TAGS if scalars.series.get(tag)]
    # NaN/inf points cannot be drawn: the curve says from which step, rather than ending without a word
    bad = [(step, tag) for tag, points in curves for step, value in points if not math.isfinite(value)]
    if bad:
        step, tag = min(bad)
        title = f"{title} ({tag} non-finite from step {step:,}: not drawn)"
        log.warning(
            "%s is NaN/inf from step %d on: %s draws its finite points only", tag, step, LOSS_CURVE_PNG
        )
    atomic_write_bytes(png_path, png(training_curves(curves, title)))
    return csv_path, png_path


def command_name() -> str:
    """How the shell that started this process runs ``gptmini``: its name when PATH finds this one, else its
    path (relative inside the working folder: ``.venv/bin/gptmini`` after ``make``)."""
    exe = Path(sys.executable).with_name("gptmini")
    found = shutil.which("gptmini")
    if not exe.is_file() or (found is not None and Path(found).resolve() == exe.resolve()):
        return "gptmini"
    inside = exe.is_relative_to(Path.cwd())
    return shlex.quote(str(exe.relative_to(Path.cwd()) if inside else exe))


def summary(
    run_dir: Path,
    checkpoints: list[Path],
    event_folder: Path | None,
    output_root: str,  # paths.output_root: where `gptmini runs` and `gptmini board` look
    scalars: Scalars | None,
    files: tuple[Path, Path] | None,
) -> str:
    """The end-of-run summary after its first line: a few lines, each one fact and where to look next."""
    if scalars is not None and scalars.last("val/loss") is not None:
        parts = [f"val/loss {scalars.last('val/loss'):.4f}"]
        if (bpb := scalars.last("val/bpb")) is not None:
            parts.append(f"val/bpb {bpb:.4f}")
        if (ppl := scalars.last("val/ppl")) is not None:
            parts.append(f"val/ppl {ppl:.2f}")
        best = scalars.best("val/loss")
        if best is not None:
            parts.append(f"best val/loss {best[1]:.4f} at step {best[0]:,}")
        lines = ["  final validation: " + ", ".join(parts)]
    else:
        lines = ["  final validation: none logged"]
    names = ", ".join(p.name for p in checkpoints) or "none"
    lines.append(f"  checkpoints: {run_dir / 'checkpoints'} ({names})")
    if event_folder is not None:
        lines.append(f"  TensorBoard run: {event_folder}")
    else:
        lines.append("  TensorBoard run: none (no TensorBoard logger)")
    if files is not None:
        lines.append(f"  loss curve: {files[1]}; every scalar: {files[0]}")
    run = shlex.quote(str(run_dir))
    root = shlex.quote(output_root)
    elsewhere = os.path.normpath(output_root) != "outputs"  # the commands' default runs folder
    gptmini = command_name()
    lines += [
        "  next:",
        f"    {gptmini} runs{f' --runs-dir {root}' if elsewhere else ''}    # every run, newest first",
        f'    {gptmini} sample --ckpt {run} --prompt "ROMEO:"',
        f"    {gptmini} eval --ckpt {run}",
        f"    {gptmini} board{f' --logdir {root}' if elsewhere else ''}    # TensorBoard, http://localhost:6006",
    ]
    return "\n".join(lines)


def report_run(
    trainer: Any,
    tensorboard: Any,  # the run's TensorBoard logger, None without one
    run_dir: Path,
    wall_seconds: float,
    output_root: str,
    tokens_per_step: int,
    history: Scalars,  # a continuation's (continued_history)
) -> dict[str, Any]:
    """What the run reached: its folder, checkpoints, step and final metrics; on the first process, also every
    scalar as ``scalars.csv`` and the loss curves as ``loss_curve.png`` (with a TensorBoard run), and the summary
    in the log."""
    ckpt_dir, steps = run_dir / "checkpoints", trainer.global_step
    result: dict[str, Any] = {
        "output_dir": str(run_dir),
        "checkpoint": str(ckpt_dir / "last.ckpt"),
        "best_checkpoint": str(ckpt_dir / "best.ckpt"),
        "global_step": steps,
        "metrics": {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1},
    }
    if not trainer.is_global_zero:
        return result
    scalars, files = None, None
    events = Path(tensorboard.log_dir) if tensorboard is not None else None
    if events is not None:
        try:
            scalars = read_scalars(events).after(history)
            files = write_curves(scalars, run_dir, f"{run_dir.parent.name}/{run_dir.name}: {steps:,} steps")
            result |= {"scalars_csv": str(files[0]), "loss_curve": str(files[1])}
        except Exception as err:  # the run is trained and saved: a curve that cannot be drawn only says so
            log.warning(
                "could not write %s and %s: %s: %s", SCALARS_CSV, LOSS_CURVE_PNG, type(err).__name__, err
            )
    tokens = f"{steps * tokens_per_step:,} tokens seen"
    head = f"run finished: {steps:,} steps in {duration(wall_seconds)} (wall time), {tokens}"
    checkpoints = sorted(ckpt_dir.glob("*.ckpt"))
    log.info("%s\n%s", head, summary(run_dir, checkpoints, events, output_root, scalars, files))
    return result
