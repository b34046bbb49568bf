"""What every command that reads a checkpoint (sample, evaluate, attention export, Hugging Face export) says
about a file it cannot use: one ``error:`` line naming the file, exit status 2, no traceback."""

from __future__ import annotations

import logging
import os
import re
import zipfile
from pathlib import Path

import pytest

from gptmini.hf.cli import main as hf_main
from gptmini.inference import evaluate, export_attention, sample


def run_command(name: str, ckpt: Path, tmp_path: Path, capsys, caplog) -> tuple[int, str]:
    """Runs one command's ``main`` on ``ckpt``; returns its exit status and everything it printed or logged."""
    argv = {
        "sample": (sample.main, ["--ckpt", str(ckpt), "--max-new-tokens", "3"]),
        "evaluate": (evaluate.main, ["--ckpt", str(ckpt)]),
        "attention": (
            export_attention.main,
            ["--ckpt", str(ckpt), "--text", "ab", "--out", str(tmp_path / "png")],
        ),
        "hf_export": (hf_main, ["export", "--ckpt", str(ckpt), "--out", str(tmp_path / "hf")]),
    }
    main, args = argv[name]
    with caplog.at_level(logging.INFO):
        try:
            status = main(args)
        except SystemExit as exc:  # argparse's parser.exit in the hf command
            status = exc.code
    captured = capsys.readouterr()
    return status, captured.out + captured.err + caplog.text


COMMANDS = ["sample", "evaluate", "attention", "hf_export"]


def _not_a_checkpoint(kind: str, path: Path) -> Path:
    if kind == "random_bytes":
        path.write_bytes(os.urandom(4096))
    elif kind == "text":
        path.write_text("this is a text file renamed .ckpt\n" * 50)
    else:
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("archive/data.pkl", b"\x80\x02garbage")
    return path


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("kind", ["random_bytes", "text", "zip_of_garbage"])
def test_a_file_that_is_not_a_checkpoint_is_one_line_in_every_command(
    command, kind, tmp_path, capsys, caplog
):
    path = _not_a_checkpoint(kind, tmp_path / "model.ckpt")
    status, text = run_command(command, path, tmp_path, capsys, caplog)
    assert status == 2, text
    assert len(re.findall(r"error: ", text)) == 1, text
    assert f"error: {path} is not a gptmini checkpoint (" in text
    assert "Traceback" not in text and "pickled Python objects" not in text


def _damage(path: Path) -> Path:
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if i.filename.endswith("/data/0"))
    with open(path, "r+b") as f:
        f.seek(info.header_offset + 30 + len(info.filename.encode()) + len(info.extra) + info.file_size // 2)
        f.write(b"\xff" * 8)
    return path


@pytest.mark.parametrize("command", COMMANDS)
def test_a_damaged_checkpoint_is_refused_by_every_command(
    command, tmp_path, write_checkpoint, capsys, caplog
):
    path = _damage(write_checkpoint(tmp_path / "last.ckpt"))
    status, text = run_command(command, path, tmp_path, capsys, caplog)
    assert status == 2, text
    assert f"error: {path} is damaged: its tensors" in text and "Traceback" not in text
    assert not (tmp_path / "png").exists() and not (tmp_path / "hf").exists()
