"""``gptmini attention`` and ``gptmini analyze`` keep the results of an earlier run in ``--out`` unless ``--force``
(as export, import and eval do), refusing before any work with one line naming the files and the fix."""

from __future__ import annotations

import logging

import pytest

from gptmini.cli import main as gptmini
from gptmini.data.prepare import prepare

TEXT = "to be, or not to be: that is the question.\n" * 60


@pytest.fixture
def tiny_run(tmp_path, write_checkpoint):
    (tmp_path / "corpus.txt").write_text(TEXT)
    folder = prepare(str(tmp_path / "corpus.txt"), "char", tmp_path / "data").out_dir
    return write_checkpoint(tmp_path / "last.ckpt", data_dir=folder, block_size=16, n_layer=1, n_head=2)


COMMANDS = {
    "attention": (
        ["--text", "to be"],
        "layer0_heads.png",
        "the attention maps of an earlier run (entropy.json, layer0_heads.png, layer0_mean.png)",
    ),
    "analyze": (
        ["--probe-tokens", "16", "--probe-batch", "2", "--windows", "3", "--no-ablation"],
        "report.json",
        "the report of an earlier run (report.html, report.json)",
    ),
}


# analyze's run is the longer one: its refusal goes through the same check as attention's
@pytest.mark.parametrize(
    "command", [pytest.param(c, marks=pytest.mark.slow) if c == "analyze" else c for c in sorted(COMMANDS)]
)
def test_earlier_results_are_replaced_only_with_force(command, tiny_run, tmp_path, capsys, caplog):
    # the command line parsed in this process, its log at INFO (`gptmini attention` runs as a process in
    # tests/integration/test_reliability.py)
    extra, written, what = COMMANDS[command]
    out = tmp_path / "out"
    argv = [command, "--ckpt", str(tiny_run), "--out", str(out), "--device", "cpu", *extra]
    with caplog.at_level(logging.INFO):
        assert gptmini(argv) == 0, caplog.text
    (out / written).write_bytes(b"earlier")

    caplog.clear()
    with caplog.at_level(logging.INFO):
        status = gptmini(argv)
    text = capsys.readouterr().err + caplog.text
    assert status == 2, text
    errors = [message for message in caplog.messages if message.startswith("error:")]
    assert "Traceback" not in text
    assert errors == [
        f"error: --out {out} holds {what}: choose another --out, or pass --force to replace them"
    ]
    assert "loaded" not in text  # refused before the checkpoint was read
    assert (out / written).read_bytes() == b"earlier"

    with caplog.at_level(logging.INFO):
        assert gptmini([*argv, "--force"]) == 0, caplog.text
    assert (out / written).read_bytes() != b"earlier"


def test_without_out_each_call_writes_a_new_numbered_folder(tiny_run, tmp_path, gptmini_cli):
    """No --out: a new outputs/attention_png/N/ per call, never refused for an earlier call's maps; a refused call
    (a character the vocabulary lacks) leaves no folder behind."""
    maps = tmp_path / "outputs" / "attention_png"
    for n in (1, 2):
        proc = gptmini_cli(
            ["attention", "--ckpt", tiny_run, "--text", "to be", "--device", "cpu"], cwd=tmp_path
        )
        assert proc.returncode == 0, proc.stderr
        assert f"wrote 2 PNG files to outputs/attention_png/{n}" in proc.stderr
    assert sorted(p.name for p in maps.iterdir()) == ["1", "2"]
    proc = gptmini_cli(["attention", "--ckpt", tiny_run, "--text", "ZZZ", "--device", "cpu"], cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("error:") == 1, proc.stderr
    assert sorted(p.name for p in maps.iterdir()) == ["1", "2"]
