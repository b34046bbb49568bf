"""What a default run keeps on disk: last.ckpt, the full state a run resumes from, and best.ckpt, the weights alone
(no optimizer state twice), which every command that reads weights opens, and which a resume refuses in one line
naming last.ckpt. A resume says in its log what its best.ckpt is, and no raw Lightning warning shows."""

from __future__ import annotations

import json
import subprocess
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

EMA = "callbacks.ema={_target_:gptmini.training.loop.ema.EMAWeightAveraging,decay:0.8}"


def output(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout + proc.stderr


@pytest.fixture
def train(gptmini_train: Any, char_data_root: Path, tmp_path: Path) -> Any:
    """``train(run_name, *overrides)``: a short char run with the default callbacks (last.ckpt and best.ckpt), in
    this process."""

    def _train(name: str, *overrides: str) -> subprocess.CompletedProcess:
        return gptmini_train(
            [
                "debug=smoke",
                "callbacks=default",
                "~callbacks.attention_maps",
                "~callbacks.attention_summary",
                "~callbacks.text_samples",
                "tokenizer=char",
                f"run_name={name}",
                f"paths.output_root={tmp_path / 'out'}",
                f"paths.data_root={char_data_root}",
                *overrides,
            ]
        )

    return _train


def folders(root: Path, name: str) -> list[Path]:
    return sorted(p for p in (root / name).iterdir() if p.is_dir())


def load(path: Path) -> dict[str, Any]:
    return torch.load(path, weights_only=True, map_location="cpu")


def test_best_holds_the_weights_alone_and_opens_everywhere_but_in_a_resume(train, gptmini_cli, tmp_path):
    first = train("keep")
    assert first.returncode == 0, output(first)[-3000:]
    (run,) = folders(tmp_path / "out", "keep")
    ckpts = run / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["best.ckpt", "last.ckpt"]
    best, last = load(ckpts / "best.ckpt"), load(ckpts / "last.ckpt")
    assert "optimizer_states" in last and "optimizer_states" not in best and "lr_schedulers" not in best
    assert best["state_dict"].keys() == last["state_dict"].keys()
    assert (ckpts / "best.ckpt").stat().st_size < (ckpts / "last.ckpt").stat().st_size

    # what reads weights opens it: eval, sample, export
    evaluated = gptmini_cli(
        ["eval", "--ckpt", ckpts / "best.ckpt", "--max-batches", "1", "--out", tmp_path / "e.json"],
        cwd=tmp_path,
    )
    assert evaluated.returncode == 0, evaluated.stderr
    assert json.loads((tmp_path / "e.json").read_text())["loss"] > 0
    sampled = gptmini_cli(["sample", "--ckpt", ckpts / "best.ckpt", "--max-new-tokens", "4", "--prompt", "A"])
    assert sampled.returncode == 0, sampled.stderr

    # a resume from it is refused in one line naming last.ckpt, and leaves no run folder
    refused = train("keep", f"ckpt_path={ckpts / 'best.ckpt'}", "trainer.max_steps=9")
    assert refused.returncode == 2, output(refused)[-3000:]
    errors = [line for line in output(refused).splitlines() if "error:" in line]
    assert len(errors) == 1 and "holds model weights only (a best.ckpt" in errors[0], errors
    assert "ckpt_path=last" in errors[0] and f"model.init_from={ckpts / 'best.ckpt'}" in errors[0]
    assert folders(tmp_path / "out", "keep") == [run]


def test_a_resume_says_what_its_best_is_and_shows_no_raw_lightning_warning(train, tmp_path):
    assert train("again").returncode == 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = train("again", "ckpt_path=last", "trainer.max_steps=9")
    assert resumed.returncode == 0, output(resumed)[-3000:]
    lightning = [str(w.message) for w in caught if "lightning" in w.filename]
    assert lightning == []
    assert "this run's best.ckpt is the best of its own validations" in output(resumed)


def test_an_ema_runs_best_holds_the_average_its_validation_scored(train, gptmini_cli, tmp_path):
    """best.ckpt of a run with callbacks.ema: evaluated on the windows validation scored, its loss is the best
    val/loss the run logged (the average's, not the trained weights')."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        proc = train("ema", EMA, "trainer.val_check_interval=2")
    assert [str(w.message) for w in caught if "lightning" in w.filename] == []
    assert proc.returncode == 0, output(proc)[-3000:]
    (run,) = folders(tmp_path / "out", "ema")
    best = load(run / "checkpoints" / "best.ckpt")
    logged = [
        float(line.split("val loss ")[1].split(",")[0])
        for line in output(proc).splitlines()
        if "val loss " in line
    ]
    # debug=smoke's validation: the first 2 batches of 4 windows
    evaluated = gptmini_cli(
        [
            "eval",
            "--ckpt",
            run / "checkpoints" / "best.ckpt",
            "--max-batches",
            "2",
            "--batch-size",
            "4",
            "--out",
            tmp_path / "e.json",
        ],
        cwd=tmp_path,
    )
    assert evaluated.returncode == 0, evaluated.stderr
    loss = json.loads((tmp_path / "e.json").read_text())["loss"]
    torch.testing.assert_close(loss, min(logged), atol=1e-4, rtol=0)
    assert int(best["global_step"]) in (2, 4, 6)


def test_runs_prune_lists_first_and_deletes_only_with_yes(train, gptmini_cli, tmp_path):
    """`gptmini runs --prune` lists, with sizes, the checkpoints no longer needed: the last.ckpt of a run that a
    later run resumed and took further, and an on_exception.ckpt older than the last.ckpt beside it; nothing is
    deleted until `--yes`, and then only those: best.ckpt and what `--ckpt last` opens stay, and a resume of the
    run name still continues from the later run."""
    import os

    from gptmini.runs.discovery import human_size

    root = tmp_path / "out"
    assert train("p").returncode == 0
    resumed = train("p", "ckpt_path=last", "trainer.max_steps=9")
    assert resumed.returncode == 0, output(resumed)[-3000:]
    first, second = folders(root, "p")
    superseded = first / "checkpoints" / "last.ckpt"
    stale = second / "checkpoints" / "on_exception.ckpt"
    stale.write_bytes((second / "checkpoints" / "last.ckpt").read_bytes())
    os.utime(stale, ns=(1, 1))  # written before the last.ckpt beside it
    before = {p: p.stat().st_size for p in root.rglob("*.ckpt")}
    size = superseded.stat().st_size + stale.stat().st_size

    dry = gptmini_cli(["runs", "--runs-dir", root, "--prune"])
    assert dry.returncode == 0, dry.stderr
    listed = [line.split()[0] for line in dry.stdout.splitlines() if line.startswith("  ")]
    assert listed == [str(superseded), str(stale)]
    assert f"continued by {second}, which went on to step 9" in dry.stdout
    assert f"2 file(s), {human_size(size)}: gptmini runs --prune --yes deletes them" in dry.stdout
    assert {p: p.stat().st_size for p in root.rglob("*.ckpt")} == before  # nothing deleted

    refused = gptmini_cli(["runs", "--runs-dir", root, "--yes"])
    assert refused.returncode == 2 and "error: --yes deletes what --prune lists" in refused.stderr

    done = gptmini_cli(["runs", "--runs-dir", root, "--prune", "--yes"])
    assert done.returncode == 0, done.stderr
    assert f"2 file(s), {human_size(size)} freed" in done.stdout
    assert sorted(root.rglob("*.ckpt")) == sorted(set(before) - {superseded, stale})
    assert (first / "checkpoints" / "best.ckpt").is_file() and (
        second / "checkpoints" / "last.ckpt"
    ).is_file()
    assert "nothing to prune" in gptmini_cli(["runs", "--runs-dir", root, "--prune"]).stdout
    again = train("p", "ckpt_path=last", "trainer.max_steps=12")
    assert again.returncode == 0 and f"resuming from {second / 'checkpoints' / 'last.ckpt'}" in output(again)
