"""``gptmini analyze``: the head report of a checkpoint, on the data it was trained on."""

from __future__ import annotations

import json
import logging

import torch
from torch.testing import assert_close

from gptmini.data.prepare import prepare
from gptmini.data.reader import load_split
from gptmini.inference.analyze import main
from gptmini.insight.probes import make_probes
from gptmini.insight.report import ABLATION
from gptmini.insight.scores import SCORES, head_scores
from gptmini.runs.loading import open_run

TEXT = "to be, or not to be: that is the question.\n" * 60


def test_the_report_of_a_checkpoint_scores_every_head(tmp_path, write_checkpoint, caplog):
    (tmp_path / "corpus.txt").write_text(TEXT)
    folder = prepare(str(tmp_path / "corpus.txt"), "char", tmp_path / "data").out_dir
    ckpt = write_checkpoint(tmp_path / "last.ckpt", data_dir=folder, block_size=16, n_layer=2, n_head=2)
    out = tmp_path / "report"
    caplog.set_level(logging.INFO)
    args = [
        "--ckpt",
        str(ckpt),
        "--out",
        str(out),
        "--probe-tokens",
        "16",
        "--probe-batch",
        "2",
        "--windows",
        "3",
    ]
    assert main(args) == 0
    report = json.loads((out / "report.json").read_text())
    assert [(h["layer"], h["head"]) for h in report["heads"]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # the scores are those of the model in the checkpoint on the same probes (the oracle: the library call)
    model = open_run(ckpt, "cpu", tokenizer=False).model
    probes = make_probes(load_split(folder, "val"), model.config.vocab_size, 16, 16, 2, 3, seed=1234)
    expected = head_scores(model, probes)
    for score in SCORES:
        got = torch.tensor(
            [[h[score.name] for h in report["heads"][2 * layer : 2 * layer + 2]] for layer in (0, 1)]
        )
        assert_close(got, expected[score.name], rtol=1e-5, atol=1e-6)
    assert all(ABLATION in h for h in report["heads"])
    assert report["about"]["checkpoint"] == str(ckpt) and report["about"]["step"] == 5
    page = (out / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count("data:image/png;base64,") >= len(SCORES)
    assert "top induction:" in caplog.text and f"wrote {out / 'report.html'}" in caplog.text


def test_bad_input_is_refused_before_any_work_and_an_earlier_report_is_kept(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert main(["--ckpt", str(tmp_path / "missing.ckpt"), "--out", str(blocker / "report")]) == 2
    assert (
        f"error: --out {blocker / 'report'} cannot be written: {blocker} is a file, not a folder"
        in caplog.text
    )
    out = tmp_path / "report"
    out.mkdir()
    (out / "report.json").write_text('{"earlier": true}')
    assert main(["--ckpt", str(tmp_path / "missing.ckpt"), "--out", str(out)]) == 2
    assert (out / "report.json").read_text() == '{"earlier": true}'
    assert main(["--ckpt", "x.ckpt", "--out", str(out), "--probe-tokens", "2"]) == 2
    assert "error: --probe_tokens=2 is invalid: it must be an integer >= 4" in caplog.text


def test_analyze_shows_its_progress_with_an_eta(tmp_path, write_checkpoint, caplog, monkeypatch):
    """One line per pass here (the interval set to 0): the probes, the loss by position, the ablation's baseline
    and one pass per head (2 layers x 2 heads), each with how many are left and an ETA until the last."""
    import functools
    import re

    from gptmini.inference import analyze as command
    from gptmini.options import EtaProgress

    monkeypatch.setattr(command, "EtaProgress", functools.partial(EtaProgress, every_s=0.0))
    (tmp_path / "corpus.txt").write_text(TEXT)
    folder = prepare(str(tmp_path / "corpus.txt"), "char", tmp_path / "data").out_dir
    ckpt = write_checkpoint(tmp_path / "last.ckpt", data_dir=folder, block_size=16, n_layer=2, n_head=2)
    caplog.set_level(logging.INFO)
    args = ["--ckpt", str(ckpt), "--out", str(tmp_path / "r"), "--probe-tokens", "16", "--probe-batch", "2"]
    assert main([*args, "--windows", "3"]) == 0
    lines = re.findall(
        r"^analyze: (\d+)/(\d+) passes \((\d+)%\), elapsed \d+s(, ETA \d+s)?$",
        "\n".join(caplog.messages),
        re.M,
    )
    total = 2 + 1 + 2 * 2
    assert [(int(d), int(t)) for d, t, _, _ in lines] == [(d, total) for d in range(1, total + 1)]
    assert all(eta for *_, eta in lines[:-1]) and not lines[-1][3] and lines[-1][2] == "100"
