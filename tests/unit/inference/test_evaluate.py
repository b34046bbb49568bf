"""gptmini-eval evaluates a checkpoint on the data it was trained on, or refuses: a prepared folder re-prepared
from another corpus since gave a wrong loss with exit status 0 (issue 19, item 2)."""

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
