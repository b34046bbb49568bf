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


def test_the_old_scripts_are_aliases_that_name_the_new_spelling(monkeypatch, capsys):
    import importlib

    from gptmini.cli import OLD_SCRIPTS, Subcommand

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    scripts = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    old = {name: target for name, target in scripts["scripts"].items() if name != "gptmini"}
    assert (
        set(old)
        == set(OLD_SCRIPTS)
        == {f"gptmini-{n}" for n in ("train", "sample", "prepare", "attention", "eval", "analyze")}
    )
    for name, target in old.items():
        if name == "gptmini-train":
            continue  # below: the training app itself, with its argv untouched
        module, function = target.split(":")
        alias = getattr(importlib.import_module(module), function)
        sub = OLD_SCRIPTS[name]
        seen = []
        monkeypatch.setitem(
            SUBCOMMANDS, sub, Subcommand("", lambda prog, argv, seen=seen: seen.append((prog, argv)) or 7)
        )
        monkeypatch.setattr(sys, "argv", [f"/venv/bin/{name}", "a=1", "--b", "c"])
        assert alias() == 7
        assert seen == [(f"gptmini {sub}", ["a=1", "--b", "c"])]  # the same arguments, to the subcommand
        assert (
            capsys.readouterr().err == f"{name} is now `gptmini {sub}`; this alias goes in the next release\n"
        )


def test_an_old_script_runs_the_subcommand_itself(monkeypatch, capsys):
    from gptmini.cli import old_sample

    monkeypatch.setattr(sys, "argv", ["gptmini-sample", "--help"])
    assert old_sample() == 0
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "gptmini-sample is now `gptmini sample`" in captured.err
    assert captured.out.startswith("usage: gptmini sample") and "--temperature" in captured.out


def test_the_old_train_script_runs_the_training_app_with_its_own_argv(monkeypatch, capsys):
    import gptmini.training.app
    from gptmini.cli import old_train

    seen = []
    monkeypatch.setattr(gptmini.training.app, "main", lambda: seen.append(list(sys.argv)))
    argv = ["/venv/bin/gptmini-train", "trainer=ddp", "trainer.devices=2"]
    monkeypatch.setattr(sys, "argv", argv)
    assert old_train() == 0
    # the script itself stays sys.argv[0]: Lightning runs it again for the other processes of a DDP run
    assert seen == [argv]
    assert (
        capsys.readouterr().err
        == "gptmini-train is now `gptmini train`; this alias goes in the next release\n"
    )
