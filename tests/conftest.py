"""Fixtures shared by the whole test tree: where the repository and its configs are, one way to run a gptmini
command in a subprocess (``run_cli``), one way to compose the training config as the app receives it
(``compose_cfg``), two ways to train in this process (``train_in_process``: the app's ``train`` on a composed
config; ``gptmini_train``: the whole command), the other commands in this process (``gptmini_cli``), and one way to read a run's
TensorBoard events (``tb_events``).

Heavy imports (torch, Hydra, TensorBoard) happen inside the fixtures, so collecting tests that use none of them
stays cheap."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# `make test` runs one pytest-xdist worker per core; each keeps to one torch (OpenMP) thread, set before any
# test imports torch: two workers of two threads each on two cores spin-wait for their descheduled partners.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
# A test that asks for two threads (trainer.deterministic's) gets them; their idle waits sleep instead of spinning
# on a core the other worker needs (the spin made such a test four times slower with every core busy).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

REPO_ROOT = Path(__file__).resolve().parents[1]
TESTS_ROOT = REPO_ROOT / "tests"
# The training entry point (also `gptmini.training.run.app` and the command `gptmini train`).
TRAIN_MODULE = "gptmini.training"


@dataclass(frozen=True)
class Cli:
    """Runs ``python -m <module> <args>`` the way a user would, from the repository root, with ``env``.

    ``env`` is the caller's environment with: the repository root and ``tests/integration`` first on
    PYTHONPATH (a child can then import test-only code such as ``test_reliability.FaultInjector``, named in a
    Hydra override), unbuffered output, one OpenMP thread (several runs share 2 cores), and no
    HYDRA_FULL_ERROR (tests check the one-line errors a user sees; pass ``env={"HYDRA_FULL_ERROR": "1"}`` to
    ask for tracebacks)."""

    root: Path
    env: Mapping[str, str]
    train_module: str = TRAIN_MODULE

    def argv(self, module: str, args: Sequence[str]) -> list[str]:
        return [sys.executable, "-m", module, *map(str, args)]

    def __call__(
        self,
        module: str,
        args: Sequence[str],
        cwd: Path | None = None,
        timeout: float = 300,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.argv(module, args),
            cwd=cwd or self.root,
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def train(self, args: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess:
        """``python -m gptmini.training <args>``; ``kwargs`` as for a call."""
        return self(self.train_module, args, **kwargs)

    def popen(
        self, module: str, args: Sequence[str], env: Mapping[str, str] | None = None, **kwargs: Any
    ) -> subprocess.Popen:
        """The same command, started and not waited for (``kwargs`` go to ``subprocess.Popen``)."""
        return subprocess.Popen(
            self.argv(module, args), cwd=self.root, env={**self.env, **(env or {})}, **kwargs
        )


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def conf_path() -> Path:
    """The Hydra config folder the training app uses (the repository's ``conf/`` in a checkout)."""
    from gptmini.conf_dir import conf_dir

    return conf_dir()


@pytest.fixture(scope="session")
def cli_env() -> dict[str, str]:
    """The environment of every subprocess started through ``run_cli`` (see ``Cli``)."""
    env = dict(os.environ)
    env.pop("HYDRA_FULL_ERROR", None)
    path = [str(REPO_ROOT), str(TESTS_ROOT / "integration"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    env["PYTHONUNBUFFERED"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    return env


@pytest.fixture(scope="session")
def run_cli(repo_root: Path, cli_env: dict[str, str]) -> Cli:
    """``run_cli(module, args, cwd=repo_root, timeout=300, env=None) -> CompletedProcess`` (text, stdout and
    stderr captured); ``run_cli.train(args, ...)`` for the training entry point; ``run_cli.popen(...)``."""
    return Cli(repo_root, cli_env)


@pytest.fixture
def cli_help(capsys: pytest.CaptureFixture[str]) -> Callable[[str], str]:
    """``cli_help(command) -> str``: what ``gptmini COMMAND --help`` prints, the command line parsed in this
    process by ``gptmini.cli.main`` (no interpreter start per command; tests/unit/test_cli.py runs the command
    as a process too)."""
    from gptmini.cli import main

    def _help(command: str) -> str:
        try:
            status = main([command, "--help"])
        except SystemExit as exc:  # argparse's exit after printing the help
            status = exc.code
        out, err = capsys.readouterr()
        assert status == 0, err
        return out

    return _help


@pytest.fixture
def compose_cfg(conf_path: Path, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """``compose_cfg(overrides, keep_hydra=False)``: the training config as the app's task function receives
    it (no ``hydra`` node unless asked for), with its output and data folders under the test's ``tmp_path``."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from gptmini.training.run.compose import register_configs

    def _compose(overrides: Sequence[str], keep_hydra: bool = False) -> Any:
        register_configs()
        base = [f"paths.output_dir={tmp_path}/run", f"paths.data_root={tmp_path}/data"]
        with initialize_config_dir(config_dir=str(conf_path), version_base="1.3"):
            cfg = compose("train", overrides=[*base, *overrides], return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)
        if not keep_hydra:
            with open_dict(cfg):
                del cfg["hydra"]
        return cfg

    # the composed config becomes Hydra's current one (as in a run); the test after this one starts without it
    before = HydraConfig.instance().cfg
    yield _compose
    HydraConfig.instance().cfg = before


@pytest.fixture(scope="session")
def train_in_process(conf_path: Path) -> Callable[..., dict[str, Any]]:
    """``train_in_process(overrides, output_dir) -> dict``: the app's own ``train`` (plan, build, fit, report) in
    this process, on the config ``python -m gptmini.training <overrides>`` composes, its run folder
    ``output_dir``. For tests of what a run writes (checkpoints, events, prepared data) rather than of the
    command's process (its output, exit status, signals): no second interpreter start, torch and Lightning
    imported once."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from gptmini.training.run.app import train
    from gptmini.training.run.compose import register_configs

    def _train(overrides: Sequence[str], output_dir: Path) -> dict[str, Any]:
        register_configs()
        with initialize_config_dir(config_dir=str(conf_path), version_base="1.3"):
            cfg = compose(
                "train", overrides=[*overrides, f"paths.output_dir={output_dir}"], return_hydra_config=True
            )
        HydraConfig.instance().set_config(cfg)
        with open_dict(cfg):
            del cfg["hydra"]  # as the app's task function receives it
        return train(cfg)

    return _train


@pytest.fixture
def gptmini_train(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    """``gptmini_train(args) -> CompletedProcess``: ``gptmini train <args>`` through the command's own ``main`` in
    this process (Hydra composing from scratch, the run folder it chooses, the one-line errors, the exit status,
    what it prints and logs), a second or two instead of an interpreter, torch and Lightning started again.
    ``run_cli.train`` stays the way for what only a process shows (signals, a second process, the environment).
    What a run changes in this process (Hydra's global state, logging, torch's thread count and flags) is put back
    after each call."""
    import logging

    import torch
    from hydra.core.global_hydra import GlobalHydra

    from gptmini.training.run.app import main

    def _train(args: Sequence[str]) -> subprocess.CompletedProcess:
        capsys.readouterr()  # what the test printed before is not the command's
        GlobalHydra.instance().clear()
        monkeypatch.setattr(sys, "argv", ["gptmini train", *map(str, args)])
        loggers = {
            name: (lg.handlers[:], lg.level, lg.propagate, lg.disabled)
            for name, lg in logging.Logger.manager.loggerDict.items()
            if isinstance(lg, logging.Logger)
        }
        root = logging.getLogger()
        handlers, level = root.handlers[:], root.level
        torch_state = (
            torch.get_num_threads(),
            torch.are_deterministic_algorithms_enabled(),
            torch.get_float32_matmul_precision(),
        )
        status = 0
        try:
            main()
        except SystemExit as exit_:
            status = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        finally:
            GlobalHydra.instance().clear()
            root.handlers[:], root.level = handlers, level
            for name, lg in logging.Logger.manager.loggerDict.items():
                if isinstance(lg, logging.Logger):
                    lg.handlers[:], lg.level, lg.propagate, lg.disabled = loggers.get(
                        name, ([], 0, True, False)
                    )
            torch.set_num_threads(torch_state[0])
            torch.use_deterministic_algorithms(torch_state[1])
            torch.set_float32_matmul_precision(torch_state[2])
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["gptmini", "train", *map(str, args)], status, out, err)

    return _train


@pytest.fixture
def gptmini_cli(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Callable[..., subprocess.CompletedProcess]:
    """``gptmini_cli(args, cwd=None) -> CompletedProcess``: ``gptmini <args>`` (sample, eval, runs, export, data,
    ...) through ``gptmini.cli.main`` in this process, from ``cwd``; what it prints, and its log lines as the
    command's own ``%(message)s`` lines on stderr. Not for ``train`` (``gptmini_train``)."""
    import logging

    from gptmini.cli import main

    def _cli(args: Sequence[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
        argv = [str(a) for a in args]
        assert argv[:1] != ["train"], "gptmini_train runs the training command"
        capsys.readouterr()
        root = logging.getLogger()
        handlers, level = root.handlers[:], root.level
        # the commands' logging.basicConfig does nothing under pytest (its capture handler is on the root
        # logger): their lines go to stderr through this handler instead, as the command prints them
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        try:
            with monkeypatch.context() as m:
                if cwd is not None:
                    m.chdir(cwd)
                status = main(argv)
        finally:
            root.handlers[:], root.level = handlers, level
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["gptmini", *argv], status, out, err)

    return _cli


@pytest.fixture(scope="session")
def tb_events() -> Callable[[Path], Any]:
    """``tb_events(run_dir)``: an ``EventAccumulator`` holding every event (scalars, images, tensors) of the
    TensorBoard run the run in ``run_dir`` logged to (``gptmini.runs.discovery.run_event_folder``: ``run_dir/tb/<label>``;
    for a resumed run, the run's it resumed, which holds both)."""
    from gptmini.runs.discovery import read_events, run_event_folder

    def _events(run_dir: Path) -> Any:
        folder = run_event_folder(run_dir) or Path(run_dir) / "tb"
        return read_events(folder, images=0, tensors=0)

    return _events


@pytest.fixture(scope="session")
def write_checkpoint() -> Callable[..., Path]:
    """``write_checkpoint(path, data_dir=None, vocab_size=16, global_step=5, **model) -> path``: a checkpoint of a
    small freshly initialised GPT, written as training writes one (``gptmini.runs.checkpoint.atomic_save``: atomic,
    with the checksum of its tensors). With ``data_dir`` (a prepared folder), its vocabulary sizes the model and
    the checkpoint's run record holds that data (its ``data_identity``, ``data.data_dir``) as a training run's does."""

    def _write(
        path: Path,
        data_dir: Path | None = None,
        vocab_size: int = 16,
        global_step: int = 5,
        seed: int = 0,
        **model: Any,
    ) -> Path:
        import torch

        from gptmini.model import GPT, GPTConfig
        from gptmini.runs.checkpoint import atomic_save
        from gptmini.runs.record import RECORD_KEY, RunRecord

        recorded: dict[str, Any] = {}
        if data_dir is not None:
            from gptmini.data.reader import data_identity, load_meta

            meta = load_meta(data_dir)
            vocab_size = meta["vocab_size"]
            recorded = {
                "data_identity": data_identity(data_dir, meta),
                "data": {"data_dir": str(data_dir)},
                "tokenizer": {"name": meta["tokenizer"]},
            }
        settings = {"block_size": 8, "n_layer": 1, "n_head": 2, "n_embd": 8, "dropout": 0.0} | model
        config = GPTConfig(vocab_size=vocab_size, **settings)
        torch.manual_seed(seed)
        state = {f"model.{k}": v for k, v in GPT(config).state_dict().items()}
        hyper = {RECORD_KEY: RunRecord(model=config.to_dict(), **recorded).to_json()}
        atomic_save({"state_dict": state, "hyper_parameters": hyper, "global_step": global_step}, path)
        return Path(path)

    return _write


@pytest.fixture(autouse=True)
def _root_logging_handlers_restored() -> Iterator[None]:
    """Each test leaves the root logger's handlers as it found them: a command run in the test process (TensorBoard's
    absl app behind `gptmini board`, Hydra's job logging) may add its own, which would print every later test's
    log lines a second time in its own format."""
    import logging

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(scope="module")
def char_data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data root holding the embedded corpus prepared in characters, once per test module."""
    from gptmini.data.prepare import prepare

    root = tmp_path_factory.mktemp("data")
    prepare("shakespeare", "char", root / "shakespeare_char")
    return root
