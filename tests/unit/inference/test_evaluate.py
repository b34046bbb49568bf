"""``gptmini eval`` evaluates a checkpoint on the data it was trained on, or refuses: a prepared folder re-prepared
from another corpus since gave a wrong loss with exit status 0."""

from __future__ import annotations

import json
import logging

from gptmini.data.prepare import prepare
from gptmini.inference.evaluate import main


def test_evaluation_refuses_a_folder_re_prepared_from_another_corpus(
    tmp_path, write_checkpoint, capsys, caplog
):
    first, second = tmp_path / "first.txt", tmp_path / "second.txt"
    first.write_text("to be, or not to be: that is the question.\n" * 60)
    second.write_text("that is the question: to be, or not to be.\n" * 60)  # same characters
    folder = prepare(str(first), "char", tmp_path / "data").out_dir
    ckpt = write_checkpoint(tmp_path / "last.ckpt", data_dir=folder)
    caplog.set_level(logging.INFO)
    assert main(["--ckpt", str(ckpt), "--max-batches", "1"]) == 0
    capsys.readouterr()

    prepare(str(second), "char", folder)
    assert main(["--ckpt", str(ckpt), "--max-batches", "1"]) == 2
    assert f"error: {folder} (source '{second}', tokenizer 'char', vocab " in caplog.text
    assert (
        f"holds other data than checkpoint {ckpt} was trained on: {folder} (source '{first}'" in caplog.text
    )
    assert (
        "prepare the original corpus again, or pass --data-dir to evaluate on this data on purpose"
        in caplog.text
    )
    assert capsys.readouterr().out == ""

    # Named explicitly, other data with the same tokenizer is evaluated, with a note.
    out = tmp_path / "eval.json"
    assert (
        main(["--ckpt", str(ckpt), "--data-dir", str(folder), "--max-batches", "1", "--out", str(out)]) == 0
    )
    assert "note: " in caplog.text and json.loads(out.read_text())["tokens"] > 0


def test_an_unwritable_out_is_refused_before_loading(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["--ckpt", str(tmp_path / "missing.ckpt"), "--out", str(blocker / "eval.json")]) == 2
    assert (
        f"error: --out {blocker}/eval.json cannot be written: {blocker} is a file, not a folder"
        in caplog.text
    )


def _windows_loss(model, tokens, context):
    # the oracle: every window of `context` tokens at 0, context, 2 context, ... plus the one ending at the last
    # token, each position scored once per window, averaged over all scored tokens
    import numpy as np
    import torch
    import torch.nn.functional as F

    last = len(tokens) - context - 1
    starts = sorted(set(range(0, last + 1, context)) | {last})
    x = torch.from_numpy(np.stack([tokens[s : s + context] for s in starts]).astype(np.int64))
    y = torch.from_numpy(np.stack([tokens[s + 1 : s + context + 1] for s in starts]).astype(np.int64))
    with torch.no_grad():
        logits, _ = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1)).item()


def test_context_sweep_runs_past_the_training_length_where_positions_allow(
    tmp_path, write_checkpoint, caplog
):
    from PIL import Image

    from gptmini.data.reader import load_meta, load_split
    from gptmini.runs.loading import open_run

    corpus = tmp_path / "c.txt"
    corpus.write_text("to be, or not to be: that is the question. " * 80)
    folder = prepare(str(corpus), "char", tmp_path / "data").out_dir
    runs = {}
    for position in ("learned", "rope", "alibi", "none"):
        (tmp_path / position / "checkpoints").mkdir(parents=True)
        runs[position] = write_checkpoint(
            tmp_path / position / "checkpoints" / "last.ckpt", data_dir=folder, position=position, seed=3
        )
    out = tmp_path / "sweep" / "lengths.json"
    out.parent.mkdir()
    caplog.set_level(logging.INFO)
    assert main(["--ckpt", *map(str, runs.values()), "--context", "32,8,16", "--out", str(out)]) == 0

    report = json.loads(out.read_text())
    assert [run["name"] for run in report["runs"]] == [f"{p}: {p} positions, trained at 8" for p in runs]
    tokens = load_split(folder, "val", load_meta(folder))
    for run in report["runs"]:
        assert [r["context"] for r in run["results"]] == [8, 16, 32]  # sorted, training length (8) first
        model = open_run(run["checkpoint"], "cpu", tokenizer=False).model
        for row in run["results"]:
            if run["position"] == "learned" and row["context"] > 8:
                assert row["loss"] is None
                assert row["skipped"] == (
                    f"cannot run {row['context']} tokens: its learned position table has block_size=8 rows "
                    "(model.position=learned)"
                )
                continue
            assert abs(row["loss"] - _windows_loss(model, tokens, row["context"])) < 1e-5
    assert "context 16: cannot run 16 tokens: its learned position table" in caplog.text
    image = Image.open(out.with_suffix(".png"))
    assert image.format == "PNG" and image.height > 200 and image.width > 300


def test_a_bad_context_list_is_refused_before_loading(tmp_path, capsys):
    import pytest

    for bad in ("0,64", "64,abc", ","):
        with pytest.raises(SystemExit) as exit_info:
            main(["--ckpt", str(tmp_path / "missing.ckpt"), "--context", bad])
        assert exit_info.value.code == 2
        assert f"--context {bad!r} is invalid: give context lengths > 1 separated by commas" in (
            capsys.readouterr().err
        )


def test_eval_says_what_it_measures_and_shows_its_progress(tmp_path, write_checkpoint, caplog, monkeypatch):
    """The whole split by default, said before the work (and why it differs from training's val/loss); one
    progress line per batch here (the interval set to 0) with an ETA until the last; the tokens it scored."""
    import functools
    import math
    import re

    from gptmini.data.reader import load_split
    from gptmini.inference import evaluate as command
    from gptmini.options import EtaProgress

    monkeypatch.setattr(command, "EtaProgress", functools.partial(EtaProgress, every_s=0.0))
    (tmp_path / "c.txt").write_text("to be, or not to be: that is the question.\n" * 60)
    folder = prepare(str(tmp_path / "c.txt"), "char", tmp_path / "data").out_dir
    ckpt = write_checkpoint(tmp_path / "last.ckpt", data_dir=folder)
    caplog.set_level(logging.INFO)
    assert main(["--ckpt", str(ckpt), "--batch-size", "2"]) == 0
    tokens = load_split(folder, "val")
    last = len(tokens) - 8 - 1  # the oracle's windows: every 8 tokens, plus the one ending at the last token
    windows = len(set(range(0, last + 1, 8)) | {last})
    batches = math.ceil(windows / 2)
    assert f"evaluating the whole val split of {folder}" in caplog.text
    assert "trainer.limit_val_batches" in caplog.text
    lines = re.findall(
        r"^eval: (\d+)/(\d+) batches \(\d+%\), elapsed \d+s(, ETA \d+s)?$", "\n".join(caplog.messages), re.M
    )
    assert [(int(d), int(t)) for d, t, _ in lines] == [(d, batches) for d in range(1, batches + 1)]
    assert all(eta for *_, eta in lines[:-1]) and not lines[-1][2]
    assert f"over {windows * 8:,} tokens (the whole val split)" in caplog.text


def test_a_sweep_with_no_length_to_evaluate_draws_why_and_warns_nothing(tmp_path, write_checkpoint, recwarn):
    """Learned positions past their table: every length is skipped; the chart says so (no empty legend, no
    warning), and the legend names a run by its name and shape, not its folder's time stamp."""
    from PIL import Image

    (tmp_path / "c.txt").write_text("to be, or not to be: that is the question.\n" * 60)
    folder = prepare(str(tmp_path / "c.txt"), "char", tmp_path / "data").out_dir
    (tmp_path / "2026-01-01_10-00-00" / "checkpoints").mkdir(parents=True)
    ckpt = write_checkpoint(
        tmp_path / "2026-01-01_10-00-00" / "checkpoints" / "last.ckpt", data_dir=folder, position="learned"
    )
    out = tmp_path / "sweep.json"
    assert main(["--ckpt", str(ckpt), "--context", "16,32", "--out", str(out)]) == 0
    (run,) = json.loads(out.read_text())["runs"]
    assert run["name"] == "2026-01-01_10-00-00: learned positions, trained at 8"
    assert all(r["loss"] is None and "learned position table" in r["skipped"] for r in run["results"])
    assert [str(w.message) for w in recwarn] == []
    image = Image.open(out.with_suffix(".png")).convert("RGB")
    assert len(image.getcolors(1 << 20)) > 20  # axes and the reason drawn


def test_a_run_is_named_by_its_run_name_in_the_legend(tmp_path):
    from types import SimpleNamespace

    from gptmini.inference.evaluate import _label
    from gptmini.runs.record import RunRecord

    config = SimpleNamespace(position="rope", block_size=64)
    record = RunRecord(run_name="zoo")
    run = SimpleNamespace(record=record, name="2026-01-01", model=SimpleNamespace(config=config))
    assert _label(run) == "zoo: rope positions, trained at 64"


def test_a_context_sweep_scores_only_the_first_max_batches(tmp_path, write_checkpoint):
    """`--context ... --max-batches N` scores N batches at each length, as `--max-batches` does without
    `--context`; with `--max-tokens` too, the smaller of the two limits."""
    (tmp_path / "c.txt").write_text("to be, or not to be: that is the question. " * 80)
    folder = prepare(str(tmp_path / "c.txt"), "char", tmp_path / "data").out_dir
    ckpt = write_checkpoint(tmp_path / "last.ckpt", data_dir=folder, position="rope")
    out = tmp_path / "sweep.json"
    args = ["--ckpt", str(ckpt), "--context", "4,8", "--batch-size", "2", "--out", str(out)]
    assert main([*args, "--max-batches", "1"]) == 0
    (run,) = json.loads(out.read_text())["runs"]
    assert [(r["context"], r["tokens"]) for r in run["results"]] == [(4, 2 * 4), (8, 2 * 8)]
    assert main([*args, "--max-batches", "3", "--max-tokens", "16"]) == 0
    (run,) = json.loads(out.read_text())["runs"]
    assert [(r["context"], r["tokens"]) for r in run["results"]] == [(4, 2 * 2 * 4), (8, 2 * 8)]
