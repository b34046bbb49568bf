"""The README's commands cannot rot: every command in its shell blocks names a make target or a `gptmini`
subcommand that exists, every `gptmini` command of its blocks and of its command table runs as typed from a clean
shell after the README's set-up line (`source .venv/bin/activate`), every `gptmini train` line composes and passes
the config checks (tinyshakespeare's URL replaced by a small file), and, in `make test-full`, each runs for real
with tiny overrides in an empty folder, followed by every command of the table on what it trained, leaving
nothing but `outputs/` and `data/` behind."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
import torch

from gptmini.training.errors import RunError

ROOT = Path(__file__).resolve().parents[2]
SHELL_BLOCK = re.compile(r"^```(?:bash|sh|shell)\n(.*?)^```", re.S | re.M)
# the corpora the README's lines name, replaced by a small local file (nothing is fetched)
CORPORA = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
    "/path/to/corpus.txt",
)


def local(text: str, corpus: Path) -> str:
    for name in CORPORA:
        text = text.replace(name, str(corpus))
    return text


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


SETUP = "source .venv/bin/activate"
# a cell of the command table: | `gptmini ...` | what it does |
TABLE_COMMAND = re.compile(r"^\| `(gptmini [^`]*)` \|", re.M)


def table_commands() -> list[list[str]]:
    """Each command of README.md's command table, placeholders (``[overrides]``) dropped."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return [[a for a in shlex.split(cmd) if not a.startswith("[")] for cmd in TABLE_COMMAND.findall(text)]


def gptmini_commands() -> list[list[str]]:
    return [argv for argv in readme_commands() + table_commands() if argv[0] == "gptmini"]


def clean_shell(script: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    """``script`` in bash with a new user's environment: no virtual environment active, a bare PATH, a home folder
    of its own beside ``cwd`` (what lands in ~/.cache is not left where the commands ran)."""
    home = cwd.parent / f"{cwd.name}.home"
    home.mkdir(exist_ok=True)
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.run(
        ["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def setup_line() -> str:
    """README's line that puts `gptmini` on PATH, run from the repository's root (where README says to)."""
    if not (ROOT / ".venv" / "bin" / "activate").is_file():
        pytest.skip("no .venv in the checkout (README's set-up, `make install`, was not run)")
    return f"cd {shlex.quote(str(ROOT))} && {SETUP}"


def test_the_readme_puts_gptmini_on_path_before_its_first_gptmini_command() -> None:
    lines = [
        line.strip()
        for block in SHELL_BLOCK.findall((ROOT / "README.md").read_text())
        for line in block.splitlines()
    ]
    setup = next(i for i, line in enumerate(lines) if line.startswith(SETUP))
    first = next(i for i, line in enumerate(lines) if line.startswith("gptmini "))
    assert setup < first, lines
    assert [argv[:2] for argv in table_commands()][:3] == [
        ["gptmini", "train"],
        ["gptmini", "data"],
        ["gptmini", "runs"],
    ]


def test_without_the_setup_line_gptmini_is_not_found(tmp_path) -> None:
    """The check below is real: a clean shell does not find `gptmini` until README's line has run."""
    assert clean_shell("gptmini --help", tmp_path).returncode == 127


def test_the_setup_line_puts_gptmini_on_path_in_a_clean_shell(tmp_path) -> None:
    """README's set-up line, then its `gptmini --help`, in a new user's shell from another folder."""
    proc = clean_shell(f"{setup_line()} && cd {shlex.quote(str(tmp_path))} && gptmini --help", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: gptmini") and "command not found" not in proc.stderr


@pytest.mark.parametrize(
    "argv",
    [a for a in gptmini_commands() if a[1] not in ("train", "--help")],
    ids=lambda a: " ".join(a),
)
def test_every_gptmini_command_of_the_readme_parses_as_typed(argv, capfd, monkeypatch, tmp_path) -> None:
    """Each command of the README (train's lines are composed below), its options as typed and then --help: the
    subcommand exists, every option it names is one the command takes, and nothing is written."""
    from gptmini.cli import main

    monkeypatch.chdir(tmp_path)
    assert main([*argv[1:], "--help"]) == 0
    out = capfd.readouterr().out  # bench answers from a process of its own
    assert out.startswith(f"usage: gptmini {argv[1]}") or argv[1] == "board", out[:300]
    options = [a.split("=", 1)[0] for a in argv[2:] if a.startswith("--")]
    for option in options:
        assert option in out, (option, out)
    assert list(tmp_path.iterdir()) == []


def train_lines() -> list[list[str]]:
    return [argv[2:] for argv in readme_commands() if argv[:2] == ["gptmini", "train"]]


def test_the_readme_has_commands_to_check() -> None:
    programs = {argv[0] for argv in readme_commands()}
    assert programs == {"make", "gptmini", "source"}, programs
    assert len(train_lines()) >= 3


def test_every_make_target_and_gptmini_subcommand_of_the_readme_exists() -> None:
    from gptmini.cli import SUBCOMMANDS

    targets = set(re.findall(r"^([a-zA-Z_-]+):.*##", (ROOT / "Makefile").read_text(), re.M))
    for argv in readme_commands():
        if argv[0] == "make":
            named = [a for a in argv[1:] if "=" not in a]
            assert set(named) <= targets, (argv, sorted(targets))
        elif argv[0] == "gptmini":
            assert argv[1] in SUBCOMMANDS or argv[1].startswith("-"), (argv, sorted(SUBCOMMANDS))


def needs_a_gpu(overrides: list[str]) -> bool:
    """Whether a README line names an experiment whose defaults list picks ``hardware: gpu``."""
    from omegaconf import OmegaConf

    from gptmini.conf_dir import conf_dir

    for o in overrides:
        if o.startswith("experiment="):
            defaults = OmegaConf.load(conf_dir() / "experiment" / f"{o.partition('=')[2]}.yaml").get(
                "defaults", []
            )
            if any(dict(d).get("override /hardware") == "gpu" for d in defaults if not isinstance(d, str)):
                return True
    return False


@pytest.mark.parametrize("overrides", train_lines(), ids=lambda o: " ".join(o))
def test_every_gptmini_train_line_of_the_readme_composes_and_passes_the_checks(
    overrides, compose_cfg, tmp_path
):
    from omegaconf import OmegaConf

    from gptmini.training.run.plan import plan_run

    corpus = tmp_path / "tinyshakespeare.txt"
    corpus.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 50)
    cfg = compose_cfg([local(o, corpus) for o in overrides])
    if needs_a_gpu(overrides) and not torch.cuda.is_available():
        # a GPU line composes and passes every check before the machine's: that one refuses in one line
        with pytest.raises(RunError, match="asks for a CUDA GPU and no CUDA GPU is available"):
            plan_run(cfg)
    else:
        plan_run(cfg)
    for override in overrides:  # what the line asks for is what the run gets
        key, _, value = override.partition("=")
        if "." in key and not key.startswith(("+", "~")):
            got = str(OmegaConf.select(cfg, key))
            assert got == local(value, corpus), (key, got)


@pytest.mark.slow
def test_the_readme_commands_run_in_an_empty_folder(tmp_path, cli_env):
    """Each `gptmini train` line of the README, made tiny, trains in an empty folder; then every other command of
    the README opens what it trained there, as typed from a clean shell after README's set-up line (a shorter
    sample, one eval batch); nothing but `outputs/` and `data/` is left in the folder."""
    corpus = tmp_path / "tinyshakespeare.txt"
    corpus.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 400)
    work = tmp_path / "work"
    work.mkdir()
    setup = setup_line()

    def gptmini(*argv: str) -> subprocess.CompletedProcess:
        proc = clean_shell(
            f"{setup} && cd {shlex.quote(str(work))} && {shlex.join(['gptmini', *argv])}", work
        )
        assert proc.returncode == 0, (argv, proc.stderr[-3000:])
        return proc

    for overrides in train_lines():
        if needs_a_gpu(overrides) and not torch.cuda.is_available():
            continue  # checked up to the machine's refusal above
        if any(o.startswith("experiment=attention_zoo") for o in overrides):
            overrides = [*overrides, "hydra.sweeper.params.attention_variant=rope"]  # one job of the sweep
        line = [local(o, corpus) for o in overrides]
        gptmini("train", *line, *TINY)
    assert (work / "outputs").is_dir()
    cheaper = {
        "sample": ["--max-new-tokens", "8"],
        "eval": ["--max-batches", "1"],
        "bench": None,
        "board": None,
    }
    ran = set()
    for argv in gptmini_commands():
        name = argv[1]
        if name in ("train", "data") or name in ran or cheaper.get(name, []) is None:
            continue  # trained above; data is prepared by training; bench and board run until stopped or long
        ran.add(name)
        gptmini(*argv[1:], *cheaper.get(name, []))
    assert ran >= {"runs", "sample", "eval", "attention", "analyze", "export", "import"}, ran
    assert list((work / "outputs" / "attention_png").glob("1/*.png"))
    assert (work / "outputs" / "head_report" / "report.json").is_file()
    assert sorted(p.name for p in work.iterdir()) == ["data", "outputs"]
