"""``gptmini runs --prune`` and the listing of continuations: what continued what is read from the runs' records
(their lineage), never guessed from folders, so a prune never deletes a checkpoint a run still stands on."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from gptmini.runs.checkpoint import atomic_save, load_checkpoint
from gptmini.runs.record import Lineage, RunRecord


def _run(
    root: Path,
    rel: str,
    write_checkpoint,
    *,
    steps: int,
    mtime: float,
    continues: Path | None = None,
    continued_step: int = 0,
    tensorboard_dir: str = "tb/default",
    lineage: bool = True,
) -> Path:
    """A run folder as training leaves it: Hydra's config, the run record (with its lineage) and a last.ckpt at
    ``steps`` holding the same record. A continuation logs into the TensorBoard run of the run it continues, as
    training does (``tensorboard_dir`` relative to its folder). ``lineage=False``: a run of a version whose record
    had none."""
    folder = root / rel
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "config.yaml").write_text("run_name: default\ntrainer:\n  max_steps: 100\n")
    record = RunRecord(
        run_name="default",
        trainer={"max_steps": 100},
        tensorboard_dir=tensorboard_dir,
        continued_from=Lineage(str(continues.resolve()), continued_step) if continues and lineage else None,
    )
    record.write(folder)
    if not lineage:  # as an earlier version wrote it: no key at all
        values = json.loads((folder / "run_record.json").read_text())
        del values["continued_from"]
        (folder / "run_record.json").write_text(json.dumps(values))
    path = write_checkpoint(folder / "checkpoints" / "last.ckpt", global_step=steps)
    saved = torch.load(path, weights_only=True)
    saved["hyper_parameters"]["run_record"] = record.to_json()
    atomic_save(saved, path)
    for p in [*folder.rglob("*"), folder]:
        os.utime(p, (mtime, mtime))
    return folder


def _last(folder: Path) -> Path:
    return folder / "checkpoints" / "last.ckpt"


def _damage(path: Path, mtime: float) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    os.utime(path, (mtime, mtime))


@pytest.fixture
def tree(tmp_path, write_checkpoint):
    """A run, two continuations of its last.ckpt (both past its step), a continuation of one of those."""
    out = tmp_path / "outputs"
    a = _run(out, "default/a", write_checkpoint, steps=5, mtime=1000)
    b1 = _run(
        out,
        "default/b1",
        write_checkpoint,
        steps=10,
        mtime=2000,
        continues=_last(a),
        continued_step=5,
        tensorboard_dir="../a/tb/default",
    )
    b2 = _run(
        out,
        "default/b2",
        write_checkpoint,
        steps=8,
        mtime=3000,
        continues=_last(a),
        continued_step=5,
        tensorboard_dir="../a/tb/default",
    )
    c = _run(
        out,
        "default/c",
        write_checkpoint,
        steps=15,
        mtime=2500,
        continues=_last(b1),
        continued_step=10,
        tensorboard_dir="../a/tb/default",
    )
    return out, {"a": a, "b1": b1, "b2": b2, "c": c}


def _rows(gptmini_cli, out: Path) -> list[dict]:
    listed = gptmini_cli(["runs", "--runs-dir", out, "--json"])
    assert listed.returncode == 0, listed.stderr
    return json.loads(listed.stdout)


def test_a_sweep_of_prunes_over_a_tree_of_continuations_loses_no_run_s_last_checkpoint(tree, gptmini_cli):
    """Every continuation of one checkpoint logs into the first run's TensorBoard folder: prune, grouping runs by
    it, listed the older continuation's only last.ckpt as "resumed by" the other and deleted it. Now only a
    checkpoint that a later run continued (its record says so) and took past its step goes; every checkpoint
    `gptmini runs` lists as a run's last (a run no later run continued) stays and loads."""
    out, runs = tree
    rows = _rows(gptmini_cli, out)
    kept = {Path(r["checkpoint"]) for r in rows if r["state"] != "resumed"}
    assert kept == {_last(runs["b2"]), _last(runs["c"])}
    dry = gptmini_cli(["runs", "--runs-dir", out, "--prune"])
    listed = [line.split()[0] for line in dry.stdout.splitlines() if line.startswith("  ")]
    assert listed == [str(_last(runs["a"])), str(_last(runs["b1"]))], dry.stdout
    assert f"continued by {runs['c']}, which went on to step 15" in dry.stdout
    done = gptmini_cli(["runs", "--runs-dir", out, "--prune", "--yes"])
    assert done.returncode == 0, done.stderr
    for path in kept:
        assert load_checkpoint(path)["global_step"] > 0
    assert not _last(runs["a"]).exists() and not _last(runs["b1"]).exists()
    assert "nothing to prune" in gptmini_cli(["runs", "--runs-dir", out, "--prune"]).stdout


def test_gptmini_runs_shows_a_continuation_as_such(tree, gptmini_cli):
    out, _ = tree
    table = gptmini_cli(["runs", "--runs-dir", out]).stdout
    line = next(row for row in table.splitlines() if f"{out}/default/c" in row)
    assert "resumable, continues default/b1@10" in line, table
    line = next(row for row in table.splitlines() if f"{out}/default/a" in row)
    assert "resumed" in line and "continues" not in line, table


def test_runs_without_a_recorded_lineage_are_never_pruned_for_each_other(
    tmp_path, write_checkpoint, gptmini_cli
):
    """Two runs of an earlier version (no lineage in their records) logging into one TensorBoard folder: the
    folder layout says nothing of which continued which, so neither is pruned."""
    out = tmp_path / "outputs"
    first = _run(out, "default/old1", write_checkpoint, steps=5, mtime=1000)
    _run(
        out,
        "default/old2",
        write_checkpoint,
        steps=9,
        mtime=2000,
        continues=_last(first),
        lineage=False,
        tensorboard_dir="../old1/tb/default",
    )
    assert "nothing to prune" in gptmini_cli(["runs", "--runs-dir", out, "--prune"]).stdout


def test_a_continuation_whose_checkpoint_is_damaged_does_not_prune_what_it_continued(
    tmp_path, write_checkpoint, gptmini_cli
):
    out = tmp_path / "outputs"
    first = _run(out, "default/a", write_checkpoint, steps=5, mtime=1000)
    later = _run(
        out, "default/b", write_checkpoint, steps=9, mtime=2000, continues=_last(first), continued_step=5
    )
    _damage(_last(later), 2000)
    assert "nothing to prune" in gptmini_cli(["runs", "--runs-dir", out, "--prune"]).stdout


def test_a_damaged_newer_on_exception_ckpt_neither_prunes_nor_damages_an_intact_last_ckpt(
    tmp_path, write_checkpoint, gptmini_cli
):
    """A damaged on_exception.ckpt newer than an intact last.ckpt: prune listed the last.ckpt as older than it
    (which --ckpt and a resume skip), and `gptmini runs` called the run damaged."""
    out = tmp_path / "outputs"
    run = _run(out, "default/a", write_checkpoint, steps=5, mtime=1000)
    broken = run / "checkpoints" / "on_exception.ckpt"
    broken.write_bytes(_last(run).read_bytes())
    _damage(broken, 2000)
    assert "nothing to prune" in gptmini_cli(["runs", "--runs-dir", out, "--prune"]).stdout
    (row,) = _rows(gptmini_cli, out)
    assert row["state"] == "resumable" and row["checkpoint"] == str(_last(run)) and row["steps_done"] == 5
