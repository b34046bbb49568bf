"""The `gptmini` command: its table of subcommands, and that each hands its arguments to the tool behind it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import gptmini
from gptmini import __version__
from gptmini.cli import SUBCOMMANDS, main

# The subcommands issue 29 names, exactly.
EXPECTED = ["train", "data", "sample", "eval", "attention", "analyze", "export", "import", "bench", "board"]


def test_help_lists_every_subcommand_with_one_line(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert list(SUBCOMMANDS) == EXPECTED
    for name in EXPECTED:
        (line,) = [ln for ln in out.splitlines() if ln.strip().startswith(name + " ")]
        assert SUBCOMMANDS[name].summary in line


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"gptmini {__version__}"


def test_unknown_command_is_one_clear_error(capsys):
    assert main(["trian"]) == 2
    err = capsys.readouterr().err
    assert "'trian' is not a gptmini command" in err and "train" in err


@pytest.mark.parametrize(
    ("name", "option"),
    [
        ("sample", "--temperature"),
        ("eval", "--max-batches"),
        ("attention", "--max-tokens"),
        ("export", "--format"),
    ],
)
def test_subcommand_help_is_the_tools_own(name, option, capsys):
    assert main([name, "--help"]) == 0
    assert option in capsys.readouterr().out


def test_train_passes_hydra_arguments_through(tmp_path):
    # --cfg job is Hydra's own flag: the composed config is printed and nothing is trained
    proc = subprocess.run(
        [sys.executable, "-m", "gptmini.cli", "train", "--cfg", "job", "debug=smoke", "trainer.max_steps=3"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        # this checkout's gptmini, whichever one is installed
        env={**os.environ, "PYTHONPATH": str(Path(gptmini.__file__).resolve().parent.parent)},
    )
    assert proc.returncode == 0, proc.stderr
    assert "max_steps: 3" in proc.stdout
    assert not (tmp_path / "outputs").exists()
