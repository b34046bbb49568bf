"""The training command's own behaviour around a run: a broken install without configs says so
in one line, even for --help; a run that fails its checks leaves no run folder behind."""

from __future__ import annotations

import gc
import os
import runpy
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from gptmini.training.run import app

PACKAGE = Path(__file__).resolve().parents[3] / "gptmini"


def test_help_without_the_configs_is_one_clear_line(tmp_path):
    # An install whose configs are missing: the package alone, no conf/ beside or inside it.
    shutil.copytree(PACKAGE, tmp_path / "gptmini", ignore=shutil.ignore_patterns("__pycache__", "conf"))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    env.pop("HYDRA_FULL_ERROR", None)
    proc = subprocess.run(
        [sys.executable, "-m", "gptmini.training", "--help"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(
        f"error: gptmini's configs (train.yaml) are neither in {tmp_path}/gptmini/conf"
    )
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_only_a_run_folder_holding_nothing_but_hydras_files_is_removed(tmp_path):
    failed = tmp_path / "outputs" / "mine" / "2026-01-01_00-00-00_000000"
    (failed / ".hydra").mkdir(parents=True)
    (failed / ".hydra" / "config.yaml").write_text("{}")
    (failed / "train.log").write_text("error: ...\n")
    (failed / "checkpoints").mkdir()  # empty
    app._remove_failed_run_folder(failed)
    assert not failed.exists() and not failed.parent.exists()  # nor the run_name folder it was alone in
    assert (tmp_path / "outputs").is_dir()

    kept = tmp_path / "outputs" / "mine" / "2026-01-02_00-00-00_000000"
    (kept / "checkpoints").mkdir(parents=True)
    (kept / "train.log").write_text("")
    (kept / "checkpoints" / "last.ckpt").write_bytes(b"x")
    app._remove_failed_run_folder(kept)
    assert (kept / "checkpoints" / "last.ckpt").is_file()


def test_a_folder_the_user_named_keeps_existing_after_a_failed_start(tmp_path):
    named = tmp_path / "mine"  # hydra.run.dir=mine, an empty folder before the run
    (named / ".hydra").mkdir(parents=True)
    (named / ".hydra" / "config.yaml").write_text("{}")
    (named / "train.log").write_text("error: ...\n")
    app._remove_failed_run_folder(named, keep_folder=True)
    assert named.is_dir() and list(named.iterdir()) == []  # what the run wrote went, the folder stays
    assert tmp_path.is_dir()


def test_the_callbacks_are_handed_the_probe_and_the_throughput_they_read():
    """The build hands the LightningModule's validation probe to every logger of attention, the throughput
    monitor to the progress bar and the progress lines and the background worker to the attention maps, from the
    callbacks it made, by their config name; none of them looks for any of them."""
    from gptmini.training.callbacks.background import BackgroundWork
    from gptmini.training.callbacks.console import ProgressBar, ProgressLog
    from gptmini.training.callbacks.insight_logging import HeadInsightLogger
    from gptmini.training.callbacks.loggers import (
        AttentionMapLogger,
        TextSampleLogger,
        TokenThroughputMonitor,
    )
    from gptmini.training.callbacks.summary_logging import AttentionSummaryLogger
    from gptmini.training.loop.probe import ValidationProbe

    readers = [AttentionMapLogger(), HeadInsightLogger(), AttentionSummaryLogger()]
    shows = [ProgressBar(), ProgressLog()]
    monitor, work = TokenThroughputMonitor(), BackgroundWork()
    probe = ValidationProbe()
    assert all(r.probe is not probe for r in readers)  # each starts with a private one
    named = dict(
        zip(
            ("maps", "insight", "summary", "samples", "bar", "lines", "throughput", "background"),
            [*readers, TextSampleLogger(), *shows, monitor, work],
            strict=True,
        )
    )
    app.RunCallbacks(named, list(named.values())).connect(probe)
    assert all(r.probe is probe for r in readers)
    assert all(s.throughput is monitor for s in shows)
    assert readers[0].background is work
    monitor.last["perf/tokens_per_sec"] = 1234.0
    assert [s.tokens_per_sec() for s in shows] == [1234.0, 1234.0]

    alone, maps = ProgressLog(), AttentionMapLogger()  # a run without a monitor or a worker
    app.RunCallbacks({"lines": alone, "maps": maps}, [alone, maps]).connect(probe)
    assert alone.throughput is None and alone.tokens_per_sec() is None
    assert maps.background is None  # its images are drawn at once


def test_the_training_process_holds_the_collector_off_through_start_up_and_freezes_before_it_exits(
    monkeypatch,
):
    # start-up makes millions of long-lived objects: the collector's passes over them would find nothing; and the
    # interpreter's last collections at the exit skip frozen objects, which they would walk only to free them
    seen = []
    monkeypatch.setattr("gptmini.training.run.app.main", lambda: seen.append(gc.isenabled()))
    gc.unfreeze()
    try:
        runpy.run_module("gptmini.training", run_name="__main__")
        assert seen == [False]
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.enable()


@pytest.mark.parametrize("held_off", [True, False])
def test_the_fit_turns_the_collector_back_on_after_freezing_what_start_up_made(held_off):
    at_fit = []

    def trainer_fit(*args, **kwargs):
        at_fit.append((gc.isenabled(), gc.get_freeze_count() > 0))

    trainer = SimpleNamespace(
        fit=trainer_fit,
        state=SimpleNamespace(finished=False),
        interrupted=False,
        strategy=SimpleNamespace(checkpoint_io=SimpleNamespace(teardown=lambda: None)),
    )
    gc.unfreeze()
    if held_off:
        gc.disable()
    try:
        app.fit(trainer, None, None, SimpleNamespace(ckpt_path=None), Path("last.ckpt"))
        # held off by the training process: frozen and back on; called in-process (tests, a notebook): untouched
        assert at_fit == [(True, held_off)]
    finally:
        gc.unfreeze()
        gc.enable()
