"""The `gptmini` command: its table of subcommands, and that each hands its arguments to the tool behind it."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gptmini
from gptmini import __version__
from gptmini.cli import SUBCOMMANDS, main

# gptmini's subcommands, exactly, in the order `gptmini --help` lists them.
EXPECTED = [
    "train",
    "data",
    "runs",
    "sample",
    "eval",
    "attention",
    "analyze",
    "export",
    "import",
    "bench",
    "board",
]


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
    from gptmini.cli import old_script

    monkeypatch.setattr(sys, "argv", ["gptmini-sample", "--help"])
    assert old_script() == 0
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "gptmini-sample is now `gptmini sample`" in captured.err
    assert captured.out.startswith("usage: gptmini sample") and "--temperature" in captured.out


def test_train_becomes_the_training_module_with_its_argv_untouched(monkeypatch):
    # Lightning starts the other processes of a one-node DDP run by running the program again with sys.argv[1:]:
    # that program must be the training module itself (the slow test below runs such a run)
    seen = []

    def execv(path, args):
        seen.append((path, args))
        raise SystemExit(0)

    monkeypatch.setattr("os.execv", execv)
    assert main(["train", "trainer=ddp", "-m", "--cfg", "job"]) == 0
    assert seen == [
        (sys.executable, [sys.executable, "-m", "gptmini.training", "trainer=ddp", "-m", "--cfg", "job"])
    ]


@pytest.mark.slow
def test_train_runs_a_two_process_ddp_run(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gptmini.cli",
            "train",
            "debug=smoke",
            "trainer=ddp",
            "trainer.accelerator=cpu",
            "trainer.devices=2",
            "trainer.precision=32-true",
            "trainer.max_steps=2",
            f"paths.output_root={tmp_path / 'out'}",
            f"paths.data_root={tmp_path / 'data'}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={
            **os.environ,
            "PYTHONPATH": str(Path(gptmini.__file__).resolve().parent.parent),
            "OMP_NUM_THREADS": "1",
        },
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = (tmp_path / "out" / "smoke").iterdir()
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()


def test_train_help_starts_with_gptminis_own_description(gptmini_train):
    # the training command's own main in this process (test_train_passes_hydra_arguments_through runs
    # `gptmini train` as a process, through to it)
    proc = gptmini_train(["--help"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("gptmini train: train a GPT")
    assert "powered by Hydra" not in proc.stdout
    # then Hydra's lists: the groups with their options, and the config with its defaults
    assert "callbacks: default, final, last, none" in proc.stdout
    assert "run_name: ${default_run_name:" in proc.stdout


# each subcommand's options with a default, and one default of each
DEFAULTS = {
    "sample": "--max-new-tokens MAX_NEW_TOKENS tokens to generate (default: 200)",
    "eval": "--batch-size BATCH_SIZE windows per forward pass (default: 16)",
    "attention": "each call writes a new numbered folder under outputs/attention_png/",
    "analyze": "(default: outputs/head_report)",
    "export": "--format {auto,gpt2,llama,qwen3}",
    "import": "--force replace an existing --out file (default: False)",
    "runs": "--runs-dir RUNS_DIR the runs folder (paths.output_root of training) (default: outputs)",
    "data": "`gptmini train --cfg job` lists them",
}


@pytest.mark.parametrize("name", sorted(DEFAULTS))
def test_every_subcommand_help_has_a_description_and_its_defaults(name, cli_help):
    out = cli_help(name)
    text = " ".join(out.split())
    assert DEFAULTS[name] in text
    # a description between the usage lines and the options
    usage, rest = out.split("\n\n", 1)
    assert usage.startswith(f"usage: gptmini {name}") and not rest.startswith(("options:", "positional"))


def test_export_takes_the_newest_run_without_ckpt_like_the_other_commands(
    tmp_path, write_checkpoint, gptmini_cli
):
    """`gptmini export --out DIR` exports what `--ckpt last` opens (the default, as in sample, eval, attention,
    analyze): the newest run under outputs/."""
    import json

    (tmp_path / "outputs" / "r" / "t" / "checkpoints").mkdir(parents=True)
    ckpt = write_checkpoint(tmp_path / "outputs" / "r" / "t" / "checkpoints" / "last.ckpt")
    proc = gptmini_cli(["export", "--out", "outputs/hf"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"exported {ckpt.relative_to(tmp_path)} -> outputs/hf" in proc.stderr
    assert json.loads((tmp_path / "outputs" / "hf" / "config.json").read_text())["n_layer"] == 1


def test_every_default_output_of_a_command_is_under_outputs(cli_help):
    """What a command writes when no --out is named goes under the runs folder, never loose where it is run."""
    from gptmini.inference import analyze, evaluate

    assert analyze.parse_args([]).out == "outputs/head_report"
    assert evaluate.SWEEP_OUT == "outputs/length_extrapolation.json"
    assert "a new numbered folder under outputs/attention_png/" in " ".join(cli_help("attention").split())
    assert "outputs/length_extrapolation.json when not given" in " ".join(cli_help("eval").split())


def test_make_help_aligns_every_target(repo_root):
    proc = subprocess.run(["make", "help"], cwd=repo_root, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("  ")]
    assert any(line.split()[0] == "bench-tokenizers" for line in rows)
    # each description starts in the same column, after at least one space
    columns = {len(line) - len(line[2:].split(None, 1)[1]) for line in rows}
    assert len(columns) == 1, rows
    assert all(len(line.split()[0]) + 2 < next(iter(columns)) for line in rows)


def test_bench_help_names_its_command_and_imports_no_benchmark(repo_root, cli_env):
    """`gptmini bench --help` answers from the parser alone: no section (nor Lightning, TensorBoard, matplotlib)
    is imported for it."""
    code = (
        "import sys\n"
        "from benchmarks.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = ('lightning', 'tensorboard', 'matplotlib', 'benchmarks.training', 'benchmarks.attention')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=repo_root, env=cli_env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: gptmini bench")
    assert proc.stdout.splitlines()[-1] == "[]"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("terminal", [True, False])
def test_train_and_data_say_at_once_that_they_started(monkeypatch, terminal):
    """On a terminal, one line before the seconds of composing and importing: `gptmini train` before it becomes
    the training process, `gptmini data` before it composes. Off a terminal nothing (an error stays one line)."""
    err = _Terminal() if terminal else io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    at_exec = []

    def execv(path, args):
        at_exec.append(err.getvalue())
        raise SystemExit(0)

    monkeypatch.setattr("os.execv", execv)
    assert main(["train", "--help"]) == 0
    assert at_exec == (["gptmini train: composing the config, then torch...\n"] if terminal else [""])

    class Composing(Exception):
        pass

    def compose() -> None:
        raise Composing(err.getvalue())

    monkeypatch.setattr("gptmini.training.run.compose.register_configs", compose)
    err.seek(0)
    err.truncate()
    with pytest.raises(Composing) as seen:
        main(["data", "data.val_fraction=0.2"])
    assert seen.value.args[0] == (
        "gptmini data: composing the config, then the data...\n" if terminal else ""
    )
