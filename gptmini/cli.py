"""The ``gptmini`` command: one entry point whose subcommands are gptmini's tools.

Each subcommand hands the rest of the command line, untouched, to the tool behind it, so ``gptmini train``
takes Hydra overrides, ``-m`` (multirun), ``--cfg job`` and Hydra's ``--help`` exactly as
``python -m gptmini.training`` does (it becomes that process). Tools are imported only when chosen.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import gptmini
from gptmini.options import starting


@dataclass(frozen=True)
class Subcommand:
    summary: str
    run: Callable[[str, list[str]], int]


def _argv_tool(module: str, prefix: Sequence[str] = ()) -> Callable[[str, list[str]], int]:
    """A tool whose ``main(argv)`` parses its own arguments (argparse); ``prefix`` goes before the user's."""

    def run(prog: str, argv: list[str]) -> int:
        main = importlib.import_module(module).main
        return int(main([*prefix, *argv]) or 0)

    return run


def _train(prog: str, argv: list[str]) -> int:
    """``python -m gptmini.training ARGV`` in place of this process (same process id, so signals and the exit
    status are the training run's own). Not in this process: Hydra reads sys.argv itself, and Lightning starts
    the other processes of a one-node DDP run by running this process's program again with sys.argv[1:], which
    must then be the training module, not ``gptmini`` (whose first argument is the subcommand)."""
    cmd = [sys.executable, "-m", "gptmini.training", *argv]
    starting(prog, "composing the config, then torch")
    if os.name != "posix":  # no exec that keeps the process (Windows): run it and wait
        return subprocess.call(cmd)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, cmd)
    return 0  # not reached


def _board(prog: str, argv: list[str]) -> int:
    from absl import app
    from absl import logging as absl_logging
    from tensorboard import default, program
    from tensorboard.plugins.base_plugin import FlagsError

    # TensorBoard's own command line; the runs folder unless the user names one.
    if "--help" in argv or "-h" in argv:
        sys.stdout.write(
            f"{prog}: TensorBoard with gptmini's ATTENTION tab (every layer and head's attention at each "
            "validation, runs side by side, your own text; docs/attention-tab.md). gptmini adds --logdir outputs "
            "(the runs folder) unless you pass --logdir; every other option is TensorBoard's own:\n\n"
        )
        sys.stdout.flush()
    elif not any(a == "--logdir" or a.startswith("--logdir=") for a in argv):
        argv = ["--logdir", "outputs", *argv]
    saved = sys.argv
    sys.argv = [prog, *argv]
    # tensorboard.main's run_main, without its note that TensorFlow is not installed (gptmini uses none)
    absl_logging.set_verbosity(absl_logging.WARNING)
    board = program.TensorBoard(plugins=default.get_plugins())
    try:
        app.run(board.main, flags_parser=board.configure)
    except FlagsError as err:
        sys.stderr.write(f"error: {err}\n")
        return 2
    finally:
        sys.argv = saved


def _bench(prog: str, argv: list[str]) -> int:
    # The benchmarks live beside the package in a source checkout (benchmarks/); a wheel does not ship them.
    root = Path(__file__).resolve().parent.parent
    if not (root / "benchmarks" / "cli.py").is_file():
        sys.stderr.write(
            "error: `gptmini bench` runs the benchmarks of a source checkout (its benchmarks/ folder), and this "
            f"gptmini is installed without one ({root}): clone the repository and run `gptmini bench` there\n"
        )
        return 2
    # A process of its own, in the checkout: the package never imports the benchmarks. Ctrl-C reaches it too, and
    # it ends with a line of its own.
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks", *argv], cwd=root)
    while True:
        try:
            code = proc.wait()
        except KeyboardInterrupt:
            continue
        return 128 - code if code < 0 else code  # ended by signal N: 128 + N, as a shell reports it


SUBCOMMANDS: dict[str, Subcommand] = {
    "train": Subcommand("train a model (Hydra overrides, -m for sweeps, --cfg job, --help)", _train),
    "data": Subcommand("prepare a run's data, no training", _argv_tool("gptmini.training.run.data_command")),
    "runs": Subcommand(
        "list the runs under outputs/: steps, val/loss, size, finished or resumable",
        _argv_tool("gptmini.runs.discovery"),
    ),
    "sample": Subcommand("continue a prompt with a checkpoint", _argv_tool("gptmini.inference.sample")),
    "eval": Subcommand(
        "validation loss and perplexity of a checkpoint, or benchmark tasks (--tasks hellaswag)",
        _argv_tool("gptmini.inference.evaluate"),
    ),
    "attention": Subcommand(
        "export a checkpoint's attention maps as PNG files", _argv_tool("gptmini.inference.export_attention")
    ),
    "analyze": Subcommand(
        "head report of a checkpoint (HTML + JSON)", _argv_tool("gptmini.inference.analyze")
    ),
    "export": Subcommand(
        "write a checkpoint as a Hugging Face GPT-2, Llama or Qwen3 folder",
        _argv_tool("gptmini.hf.cli", ["export"]),
    ),
    "import": Subcommand(
        "turn a Hugging Face GPT-2, Llama or Qwen3 folder into a checkpoint",
        _argv_tool("gptmini.hf.cli", ["import"]),
    ),
    "bench": Subcommand("run the benchmarks (source checkout)", _bench),
    "board": Subcommand("TensorBoard on the runs folder (outputs/), with the ATTENTION tab", _board),
}


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    lines = [
        "usage: gptmini [--version] [--help] COMMAND [ARGS...]",
        "",
        "A small GPT training pipeline centred on causal multi-head attention.",
        "",
        "commands:",
    ]
    lines += [f"  {name:<{width}}  {cmd.summary}" for name, cmd in SUBCOMMANDS.items()]
    lines += ["", "`gptmini COMMAND --help` explains each command."]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        sys.stdout.write(usage())
        return 0
    if args[0] in ("-V", "--version"):
        sys.stdout.write(f"gptmini {gptmini.__version__}\n")
        return 0
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        sys.stderr.write(
            f"error: {name!r} is not a gptmini command; choose one of {', '.join(SUBCOMMANDS)} "
            "(`gptmini --help` says what each does)\n"
        )
        return 2
    try:
        return SUBCOMMANDS[name].run(f"gptmini {name}", rest)
    except SystemExit as stop:  # argparse's --help and usage errors, Hydra's exits
        code = stop.code
        return code if isinstance(code, int) else (0 if code is None else 1)


# The console scripts of the previous release: one more release as aliases of the subcommands (pyproject.toml).
OLD_SCRIPTS = {
    "gptmini-train": "train",
    "gptmini-sample": "sample",
    "gptmini-prepare": "data",
    "gptmini-attention": "attention",
    "gptmini-eval": "eval",
    "gptmini-analyze": "analyze",
}


def old_script() -> int:
    """Every old script's entry point: the subcommand its name (``sys.argv[0]``) stands for."""
    name = Path(sys.argv[0]).name
    sub = OLD_SCRIPTS[name]
    sys.stderr.write(f"{name} is now `gptmini {sub}`; this alias goes in the next release\n")
    return main([sub, *sys.argv[1:]])


if __name__ == "__main__":
    raise SystemExit(main())
