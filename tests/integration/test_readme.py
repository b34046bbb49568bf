"""The README's commands cannot rot: every command in its shell blocks names a make target or a `gptmini`
subcommand that exists, every `gptmini train` line composes and passes the config checks (tinyshakespeare's
path replaced by a small file), and, in `make test-full`, each runs for real with tiny overrides in an empty
folder, followed by the command table's sample, eval, attention and analyze on what it trained."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHELL_BLOCK = re.compile(r"^```(?:bash|sh|shell)\n(.*?)^```", re.S | re.M)
TINYSHAKESPEARE = "/path/to/tinyshakespeare.txt"
# what makes a README command tiny; every key exists in every train config
TINY = [
    "model=tiny",
    "model.block_size=16",
    "trainer=cpu",
    "trainer.max_steps=2",
    "trainer.val_check_interval=2",
    "trainer.limit_val_batches=1",
    "data.batch_size=2",
]


def readme_commands() -> list[list[str]]:
    """Each command of README.md's shell blocks, split as the shell would (comments dropped)."""
    commands = []
    for block in SHELL_BLOCK.findall((ROOT / "README.md").read_text(encoding="utf-8")):
        for line in block.splitlines():
            argv = shlex.split(line, comments=True)
            if argv:
                commands.append(argv)
    return commands


def train_lines() -> list[list[str]]:
    return [argv[2:] for argv in readme_commands() if argv[:2] == ["gptmini", "train"]]


def test_the_readme_has_commands_to_check() -> None:
    programs = {argv[0] for argv in readme_commands()}
    assert programs == {"make", "gptmini"}, programs
    assert len(train_lines()) >= 3


def test_every_make_target_and_gptmini_subcommand_of_the_readme_exists() -> None:
    from gptmini.cli import SUBCOMMANDS

    targets = set(re.findall(r"^([a-zA-Z_-]+):.*##", (ROOT / "Makefile").read_text(), re.M))
    for argv in readme_commands():
        if argv[0] == "make":
            named = [a for a in argv[1:] if "=" not in a]
            assert set(named) <= targets, (argv, sorted(targets))
        else:
            assert argv[1] in SUBCOMMANDS, (argv, sorted(SUBCOMMANDS))


@pytest.mark.parametrize("overrides", train_lines(), ids=lambda o: " ".join(o))
def test_every_gptmini_train_line_of_the_readme_composes_and_passes_the_checks(
    overrides, compose_cfg, tmp_path
):
    from omegaconf import OmegaConf

    from gptmini.training.run.plan import validate_config

    corpus = tmp_path / "tinyshakespeare.txt"
    corpus.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 50)
    cfg = compose_cfg([o.replace(TINYSHAKESPEARE, str(corpus)) for o in overrides])
    validate_config(cfg)
    for override in overrides:  # what the line asks for is what the run gets
        key, _, value = override.partition("=")
        if "." in key and not key.startswith(("+", "~")):
            got = str(OmegaConf.select(cfg, key))
            assert got == value.replace(TINYSHAKESPEARE, str(corpus)), (key, got)


@pytest.mark.slow
def test_the_readme_commands_run_in_an_empty_folder(tmp_path, cli_env):
    """Each `gptmini train` line of the README, made tiny, trains in an empty folder; then the command table's
    sample, eval, attention and analyze open the newest run there (`--ckpt last`)."""
    corpus = tmp_path / "tinyshakespeare.txt"
    corpus.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 400)
    work = tmp_path / "work"
    work.mkdir()

    def gptmini(*argv: str) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [sys.executable, "-m", "gptmini.cli", *argv],
            cwd=work,
            env=cli_env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, (argv, proc.stderr[-3000:])
        return proc

    for overrides in train_lines():
        if any(o.startswith("experiment=attention_zoo") for o in overrides):
            overrides = [*overrides, "hydra.sweeper.params.attention_variant=rope"]  # one job of the sweep
        line = [o.replace(TINYSHAKESPEARE, str(corpus)) for o in overrides]
        gptmini("train", *line, *TINY)
    assert (work / "outputs").is_dir()
    sampled = gptmini("sample", "--ckpt", "last", "--prompt", "ROMEO:", "--max-new-tokens", "8")
    assert sampled.stdout.strip()
    gptmini("eval", "--ckpt", "last", "--max-batches", "1")
    gptmini("attention", "--ckpt", "last", "--text", "To be, or not", "--out", str(tmp_path / "maps"))
    assert list((tmp_path / "maps").glob("*.png"))
    gptmini("analyze", "--ckpt", "last", "--out", str(tmp_path / "report"))
    assert (tmp_path / "report" / "report.json").is_file()
