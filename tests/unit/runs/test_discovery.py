"""``gptmini runs`` and what ``--ckpt last`` / a run name open: the newest finished or resumable run of the runs
folder, never a job of a sweep."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gptmini.runs.checkpoint import CheckpointError
from gptmini.runs.discovery import resolve_checkpoint


def _run(
    root: Path,
    rel: str,
    write_checkpoint,
    *,
    name: str,
    steps: int,
    planned: int,
    mtime: float,
    val: list[tuple[int, float]] = (),
    ckpt: str | None = "last.ckpt",
) -> Path:
    folder = root / rel
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "config.yaml").write_text(
        f"run_name: {name}\ntrainer:\n  max_steps: {planned}\n", encoding="utf-8"
    )
    (folder / ".hydra" / "overrides.yaml").write_text(
        f"- trainer.max_steps={planned}\n- run_name={name}\n- paths.output_root={root}\n", encoding="utf-8"
    )
    if val:
        from torch.utils.tensorboard import SummaryWriter

        with SummaryWriter(str(folder / "tb")) as writer:
            for step, loss in val:
                writer.add_scalar("val/loss", loss, step)
    if ckpt is not None:
        path = write_checkpoint(folder / "checkpoints" / ckpt, global_step=steps)
        if val:  # the last validation, as the callback watching it keeps it in the checkpoint
            import torch

            from gptmini.runs.checkpoint import atomic_save

            saved = torch.load(path, weights_only=True)
            step, loss = val[-1]
            saved["callbacks"] = {"StopAtTargetLoss": {"last_val_loss": loss, "last_val_step": step}}
            atomic_save(saved, path)
        os.utime(path, (mtime, mtime))
    for p in [*folder.rglob("*"), folder]:
        os.utime(p, (mtime, mtime))
    return folder


@pytest.fixture
def runs_folder(tmp_path, write_checkpoint):
    out = tmp_path / "outputs"
    made = {
        "done": _run(
            out,
            "default/2026-01-01_10-00-00_000000",
            write_checkpoint,
            name="default",
            steps=700,
            planned=700,
            mtime=1000,
            val=[(100, 6.0), (699, 4.957)],
        ),
        "cut": _run(
            out,
            "default/2026-01-01_11-00-00_000000",
            write_checkpoint,
            name="default",
            steps=300,
            planned=700,
            mtime=2000,
            val=[(100, 6.1)],
            ckpt="on_exception.ckpt",
        ),
        "job": _run(
            out,
            "default/multirun_2026-01-01_12-00-00_000000/trainer.max_steps=3",
            write_checkpoint,
            name="default",
            steps=3,
            planned=3,
            mtime=3000,
            val=[(3, 10.54)],
        ),
        "failed": _run(
            out,
            "char/2026-01-01_13-00-00_000000",
            write_checkpoint,
            name="char",
            steps=0,
            planned=50,
            mtime=4000,
            ckpt=None,
        ),
    }
    return out, made


def test_last_and_a_run_name_are_the_newest_top_level_run_never_a_sweep_job(runs_folder, monkeypatch):
    out, made = runs_folder
    cut = made["cut"] / "checkpoints" / "on_exception.ckpt"
    # the sweep job is newer, and so is the run without a checkpoint: neither is chosen
    assert resolve_checkpoint("last", out) == cut
    assert resolve_checkpoint(out / "default") == cut
    monkeypatch.chdir(out.parent)
    assert resolve_checkpoint("default") == Path("outputs") / cut.relative_to(out)
    # a sweep folder or a job's folder, named on purpose, is opened
    job = made["job"] / "checkpoints" / "last.ckpt"
    assert resolve_checkpoint(made["job"].parent) == job
    assert resolve_checkpoint(made["job"]) == job


def test_a_run_name_with_only_sweep_jobs_names_a_job_to_pass(tmp_path, write_checkpoint):
    out = tmp_path / "outputs"
    _run(out, "zoo/multirun_x/model.attention=mha", write_checkpoint, name="zoo", steps=3, planned=3, mtime=1)
    with pytest.raises(
        CheckpointError, match=r"it holds only sweep jobs: pass one job's folder, e\.g\. .*mha"
    ):
        resolve_checkpoint("zoo", out)
    with pytest.raises(
        CheckpointError, match=r"no last\.ckpt or on_exception\.ckpt found under .*only sweep"
    ):
        resolve_checkpoint("last", out)


def test_gptmini_runs_lists_every_run_newest_first_and_marks_last(runs_folder, gptmini_cli):
    out, made = runs_folder
    proc = gptmini_cli(["runs", "--runs-dir", out])
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["NAME", "STEPS", "VAL/LOSS", "SIZE", "STATE", "FOLDER", "OVERRIDES"]
    # the folder before the overrides, so that long overrides never push it off the screen
    folder_at = lines[0].index("FOLDER")
    folders = [line[folder_at:].split()[0] for line in lines[1:]]
    assert folders == [str(made[k]) for k in ("failed", "job", "cut", "done")]
    failed, job, cut, done = lines[1:]
    assert "0/50" not in failed and "-/50" in failed and "no checkpoint" in failed
    assert "3/3" in job and "10.5400" in job and "finished (sweep job)" in job and not job.startswith("*")
    assert cut.startswith("*") and "300/700" in cut and "6.1000" in cut and "resumable" in cut
    assert "700/700" in done and "4.9570" in done and "finished" in done
    # the overrides that set what each run trains, not those that place it (run_name, paths.*)
    assert "trainer.max_steps=700" in done.split() and "run_name=" not in done and "paths." not in done

    proc = gptmini_cli(["runs", "--runs-dir", out, "char", "--json"])
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(proc.stdout)
    assert row["name"] == "char" and row["state"] == "no checkpoint" and row["steps_planned"] == 50
    assert row["size_bytes"] > 0
    assert row["overrides"] == ["trainer.max_steps=50"]


def test_a_run_still_training_shows_running_and_last_passes_it_over(
    runs_folder, write_checkpoint, gptmini_cli, caplog
):
    """A run folder held by a live process (the lock file training keeps there, with its process id) is
    "running": `gptmini runs` says so and does not mark it, `--ckpt last` opens the newest run that is not
    training (with a note naming the one passed over), and its folder named on purpose opens it. A lock whose
    process is gone is not a running run."""
    import logging
    import subprocess
    import sys

    from gptmini.fileio import RUN_LOCK

    out, made = runs_folder
    live = _run(
        out,
        "default/2026-01-01_14-00-00_000000",
        write_checkpoint,
        name="default",
        steps=105,
        planned=700,
        mtime=5000,
        val=[(100, 5.5)],
    )
    trainer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        (live / RUN_LOCK).write_text(f"{trainer.pid}\n")
        proc = gptmini_cli(["runs", "--runs-dir", out])
        row = next(line for line in proc.stdout.splitlines() if str(live) in line)
        assert "running" in row.split() and not row.startswith("*"), proc.stdout
        cut = made["cut"] / "checkpoints" / "on_exception.ckpt"
        assert (
            next(line for line in proc.stdout.splitlines() if line.startswith("*")).find(str(made["cut"])) > 0
        )
        caplog.set_level(logging.INFO)
        assert resolve_checkpoint("last", out) == cut
        assert f"note: skipped {live}, still training (pass that folder as --ckpt to open it)" in caplog.text
        assert resolve_checkpoint(live) == live / "checkpoints" / "last.ckpt"
    finally:
        trainer.kill()
        trainer.wait()
    assert resolve_checkpoint("last", out) == live / "checkpoints" / "last.ckpt"  # its process is gone
    row = next(
        line for line in gptmini_cli(["runs", "--runs-dir", out]).stdout.splitlines() if str(live) in line
    )
    assert row.startswith("*") and "resumable" in row


def test_gptmini_runs_without_a_runs_folder_says_so(tmp_path, gptmini_cli):
    proc = gptmini_cli(["runs", "--runs-dir", tmp_path / "none"])
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        == f"error: --runs-dir {tmp_path / 'none'} does not exist: train first (gptmini train)"
    )
    (tmp_path / "file").write_text("x")
    proc = gptmini_cli(["runs", "--runs-dir", tmp_path / "file"])  # said "does not exist"
    assert proc.returncode == 2
    assert (
        proc.stderr
        == f"error: --runs-dir {tmp_path / 'file'} is not a folder: pass the runs folder (paths.output_root of training)\n"
    )


@pytest.mark.parametrize("command", ["sample", "eval", "attention", "analyze", "export", "runs"])
def test_every_ckpt_help_states_the_rule_for_last(command, cli_help):
    text = " ".join(cli_help(command).split())
    assert "the jobs of a sweep (outputs/<name>/multirun_*/) are never chosen" in text
