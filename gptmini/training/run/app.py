"""The Hydra app: ``gptmini train [overrides]`` (or ``python -m gptmini.training``).

Order of work (``train``): plan (every check, cheap, before any data or model) -> build the trainer, the data
(prepared) and the module -> fit -> report. Known user errors end the run with one line naming the key and the
fix, and exit status 2; ``HYDRA_FULL_ERROR=1`` shows tracebacks.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import os
import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig

from gptmini.conf_dir import conf_dir
from gptmini.fileio import RUN_LOCK
from gptmini.limits import SizeError
from gptmini.model import ConfigError, GPTConfig
from gptmini.training.errors import RunError
from gptmini.training.hardware import hardware_summary
from gptmini.training.run.compose import register_configs
from gptmini.training.run.inputs import check_input_files
from gptmini.training.run.memory import check_training_memory
from gptmini.training.run.plan import RunPlan, plan_run
from gptmini.training.run.resume import check_resumed_data, resolve_init_from
from gptmini.training.run.sweeps import JobFailed

log = logging.getLogger("gptmini.training.run.app")


# --- the run ------------------------------------------------------------------------------------------------


def _quiet_lightning() -> None:
    # Lightning adds its own console handler when imported before logging is configured; Hydra's handlers
    # (console + the run's train.log) already get everything, so route Lightning through them only.
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    from gptmini.training.lightning_compat import silence_tips

    silence_tips()  # advertisements for Lightning's cloud products, on every run
    # With an OnExceptionCheckpoint, Lightning maps fit(ckpt_path=None) to "last" inside the fresh run folder
    # (always empty, so nothing is loaded) and warns about it; resuming is explicit here (ckpt_path=...).
    warnings.filterwarnings("ignore", message=r".*ckpt_path=None\)` was called without a model")
    warnings.filterwarnings("ignore", message=r".*is set, but there is no last checkpoint available")
    # Mid-epoch resume is exact here without a stateful loader (see TokenDataModule), so this warning misleads.
    warnings.filterwarnings("ignore", message=r".*your dataloader is not resumable")
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated")


def _log_hardware(plan: RunPlan) -> None:
    """One line, among a run's first: the machine, which defaults the run started from (hardware=auto|cpu|gpu)
    and how to pick the others, the precision and compile."""
    from hydra.core.hydra_config import HydraConfig
    from lightning.pytorch.utilities import rank_zero_only

    if rank_zero_only.rank != 0:
        return
    choice = HydraConfig.get().runtime.choices.get("hardware") if HydraConfig.initialized() else None
    log.info(
        "%s; precision %s, compile %s",
        hardware_summary(choice, plan.device),
        plan.precision,
        "on" if plan.compile else "off",
    )


def train(cfg: DictConfig) -> dict[str, Any]:
    """plan -> build (trainer, data, module) -> fit -> report."""
    started = time.monotonic()  # the summary's wall time: the whole command, checks and data included
    # First, before any data or model: a bad config or resume checkpoint fails at once.
    plan = plan_run(cfg)
    # from here on the plan alone: the composed config does not travel past planning
    return train_plan(plan, started)


def train_plan(plan: RunPlan, started: float | None = None) -> dict[str, Any]:
    """build (trainer, data, module) -> fit -> report, from the checked plan. ``started``: the command's start
    (``time.monotonic()``), for the summary's wall time; None: now."""
    if started is None:
        started = time.monotonic()
    if plan.retain_freed_memory:
        from gptmini.training.run.allocator import retain_freed_memory

        retain_freed_memory()  # before the first large allocation
    import lightning as L

    from gptmini.training.lightning_compat import skip_idle_hooks

    _quiet_lightning()
    L.seed_everything(plan.seed, workers=True)
    _log_hardware(plan)
    trainer, named_callbacks = build_trainer(plan)
    datamodule, gpt_config = build_data(plan, trainer)
    # Before building the model: a step that cannot fit in memory fails now, not after minutes of allocating.
    device = trainer.strategy.root_device
    check_training_memory(
        gpt_config, plan.data.batch_size, plan.precision, device, processes=trainer.num_devices
    )
    # The loggers' size settings (probe batch, sample length, ...), against the same memory, before any work.
    for name, callback in named_callbacks.items():
        check = getattr(callback, "check_sizes", None)
        if check is not None:
            check(gpt_config, device, f"callbacks.{name}.")
    module = build_module(plan, trainer, datamodule, gpt_config)
    connect_callbacks(trainer.callbacks, module)
    skip_idle_hooks(trainer.callbacks)
    output_dir = Path(plan.output_dir)
    # the first event written: a run that fails its checks leaves no TensorBoard events (nor its folder) behind
    _log_overrides(trainer, plan)
    fit(trainer, module, datamodule, plan, output_dir / "checkpoints" / "last.ckpt")
    return report(trainer, output_dir, time.monotonic() - started, plan.output_root)


def build_trainer(plan: RunPlan) -> tuple[Any, dict[str, Any]]:
    """The Lightning Trainer of the plan's ``trainer`` settings and values, its callbacks and loggers; and the
    callbacks by their config name."""
    from lightning.pytorch.callbacks import ProgressBar as LightningProgressBar
    from lightning.pytorch.plugins.io import AsyncCheckpointIO

    from gptmini.checkpoint import AtomicCheckpointIO

    trainer_cfg = {**dataclasses.asdict(plan.trainer), **plan.trainer_overrides()}
    named = {
        name: instantiate(settings, _convert_="all") for name, settings in _nodes(plan.callbacks).items()
    }
    if plan.trainer.enable_progress_bar is False:
        # +trainer.enable_progress_bar=false: the config's progress bar goes (Lightning refuses both at once)
        named = {n: c for n, c in named.items() if not isinstance(c, LightningProgressBar)}
    callbacks = list(named.values())
    if plan.trainer.enable_model_summary:
        from lightning.pytorch.callbacks import ModelSummary

        from gptmini.training.callbacks.console import ParameterSummary

        # In place of Lightning's default summary, whose FLOPs column and total read 0 for this model; a
        # summary callback in the config wins.
        if not any(isinstance(c, ModelSummary) for c in callbacks):
            callbacks.append(ParameterSummary())
    # Either way Lightning adds no summary of its own (nor logs that it skipped one).
    trainer_cfg["enable_model_summary"] = False
    loggers = [_logger(settings, plan) for settings in _nodes(plan.loggers).values()]
    trainer = instantiate(
        trainer_cfg,
        callbacks=callbacks,
        logger=loggers or False,
        # AtomicCheckpointIO: temp file + fsync + rename, so a kill during a save never corrupts a .ckpt.
        # AsyncCheckpointIO: the state is copied on the training thread at the step it belongs to (so resuming
        # stays exact) and written by one background thread, in order, while training goes on; a failed write
        # stops the run at the next save or at the end.
        plugins=[AsyncCheckpointIO(AtomicCheckpointIO())],
    )
    return trainer, named


def connect_callbacks(callbacks: list[Any], module: Any) -> None:
    """Hands every callback that reads a part of the run it does not own (a ``Receiver``) the parts, so that none
    of them goes looking for it: the LightningModule's validation probe (one attention pass for every logger of
    attention), the throughput monitor (tokens/s for the progress bar and lines), the background worker, and
    Lightning's Timer (trainer.max_time, for the progress lines' ETA)."""
    from lightning.pytorch.callbacks import Timer

    from gptmini.training.callbacks.background import BackgroundWork
    from gptmini.training.callbacks.loggers import Receiver, RunParts, TokenThroughputMonitor

    def first(kind: type) -> Any:
        return next((c for c in callbacks if isinstance(c, kind)), None)

    parts = RunParts(
        module.validation_probe, first(TokenThroughputMonitor), first(BackgroundWork), first(Timer)
    )
    for callback in callbacks:
        if isinstance(callback, Receiver):
            callback.receive(parts)


# the TensorBoard logger's targets: its events are placed by the run (run_folder.tensorboard_place)
TENSORBOARD_LOGGERS = (
    "lightning.pytorch.loggers.TensorBoardLogger",
    "lightning.pytorch.loggers.tensorboard.TensorBoardLogger",
)


def _nodes(typed: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Named typed nodes (the plan's callbacks or loggers) as what ``instantiate`` takes."""
    return {
        name: dataclasses.asdict(node) if dataclasses.is_dataclass(node) else dict(node)
        for name, node in typed.items()
    }


def _logger(settings: dict[str, Any], plan: RunPlan) -> Any:
    """A logger of the plan; TensorBoard's writes where ``tensorboard_place`` says."""
    if settings.get("_target_") not in TENSORBOARD_LOGGERS:
        return instantiate(settings, _convert_="all")
    from gptmini.training.run.run_folder import tensorboard_place

    place = tensorboard_place(settings, plan.run_name, plan.tensorboard_dir)
    return instantiate({**settings, **place}, _convert_="all")


def _tensorboard(trainer: Any) -> Any:
    """The run's TensorBoard logger, None without one."""
    from lightning.pytorch.loggers import TensorBoardLogger

    return next((lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)), None)


def _log_overrides(trainer: Any, plan: RunPlan) -> None:
    """The run's command line as text in its TensorBoard run (``run/overrides``, TEXT tab): every override in
    full, where the run's label may be cut; a resumed run adds its own at the step it resumes from."""
    from gptmini.training.run.run_folder import command_overrides

    logger = _tensorboard(trainer)
    if logger is None:
        return
    step = int(plan.resume.get("global_step") or 0) if plan.resume is not None else 0
    lines = [f"run_name `{plan.run_name}`, run folder `{plan.output_dir}`"]
    if plan.ckpt_path is not None:
        lines.append(f"resumed from `{plan.ckpt_path}` at step {step}")
    overrides = command_overrides()
    lines += [f"- `{o}`" for o in overrides] if overrides else ["no overrides: the defaults"]
    logger.experiment.add_text("run/overrides", "\n\n".join(lines), global_step=step)


def build_data(plan: RunPlan, trainer: Any) -> tuple[Any, GPTConfig]:
    """The DataModule, its data prepared (cheap when already prepared), and the model's config with the
    tokenizer's vocabulary, checked against the prepared data (and the resume checkpoint, when resuming)."""
    from gptmini.data.reader import check_block_size, check_vocab, load_meta

    samples = plan.training_batches * plan.data.batch_size * trainer.world_size
    datamodule = instantiate(dataclasses.asdict(plan.data), train_samples=samples, _convert_="all")
    datamodule.prepare_data()
    vocab = plan.model.vocab_size if plan.vocab_known else datamodule.vocab_size
    meta = load_meta(datamodule.data_dir)
    check_vocab(vocab, meta)
    check_block_size(plan.model.block_size, meta)
    gpt_config = dataclasses.replace(plan.model, vocab_size=vocab)
    if plan.resume is not None:
        check_resumed_data(plan.ckpt_path, plan.resume, datamodule.data_dir, meta, gpt_config)
    return datamodule, gpt_config


def build_module(plan: RunPlan, trainer: Any, datamodule: Any, gpt_config: GPTConfig) -> Any:
    """The LightningModule: the model, its optimizer and schedule, the run's config for its checkpoints, and
    the starting weights of ``model.init_from``."""
    from gptmini.checkpoint import SAVED_TOKENIZER_KEY
    from gptmini.data.reader import data_identity, load_meta, saved_tokenizer
    from gptmini.training.loop.module import GPTLightningModule

    run_config = copy.deepcopy(plan.run_config)
    meta = load_meta(datamodule.data_dir)
    # the tokenizer travels with the checkpoint: a re-prepared or moved data folder does not orphan it
    identity = data_identity(datamodule.data_dir, meta) | {
        SAVED_TOKENIZER_KEY: saved_tokenizer(datamodule.data_dir, meta)
    }
    run_config["trainer"]["val_check_interval"] = plan.val_check_interval
    # the number of training processes, which a resume must keep (resume.check_resume_plan)
    run_config["world_size"] = trainer.world_size
    tensorboard = _tensorboard(trainer)
    if tensorboard is not None:
        # where the run's events are, relative to its folder: a run resumed from it logs on into them
        here = os.path.abspath(plan.output_dir)
        run_config["tensorboard_dir"] = os.path.relpath(os.path.abspath(tensorboard.log_dir), here)
    module = GPTLightningModule(
        model_config=gpt_config.to_dict(),
        optimizer=instantiate(dataclasses.asdict(plan.optimizer), _convert_="all"),
        scheduler=instantiate(dataclasses.asdict(plan.scheduler), _convert_="all")
        if plan.scheduler
        else None,
        compile=plan.compile,
        run_config=run_config,
        data_identity=identity,
    )
    if plan.init_from is not None:
        _load_initial_weights(module.model, *resolve_init_from(plan.init_from, plan.output_root))
    log.info(
        "model: %s parameters (%d layers, %d heads, %d wide, attention=%s), tokenizer %s (vocab %d)",
        f"{module.model.num_parameters():,}",
        gpt_config.n_layer,
        gpt_config.n_head,
        gpt_config.n_embd,
        gpt_config.attention,
        plan.tokenizer,
        datamodule.vocab_size,
    )
    return module


def _load_initial_weights(model: Any, kind: str, source: str) -> None:
    if kind == "checkpoint":  # a gptmini checkpoint: its weights, a fresh optimizer
        from gptmini.checkpoint import load_weights_into

        load_weights_into(model, source)
    else:
        from gptmini.hf import load_hf_weights

        load_hf_weights(model, source)
    log.info("initialised weights from %s", source)


def fit(trainer: Any, module: Any, datamodule: Any, plan: RunPlan, last: Path) -> None:
    """Trains; a finished run's final state is its last.ckpt, written before the run is reported done."""
    if plan.ckpt_path:
        log.info("resuming from %s", plan.ckpt_path)
    resuming = plan.ckpt_path is not None
    trainer.fit(
        module, datamodule=datamodule, ckpt_path=plan.ckpt_path, weights_only=True if resuming else None
    )
    if trainer.state.finished and not trainer.interrupted:
        # The periodic "last" save runs every checkpoint_every_n_steps; make last.ckpt the final state.
        trainer.save_checkpoint(last, weights_only=False)  # full state: resumable
    # Waits for the background writes (raising the error of one that failed) before the run is reported done.
    trainer.strategy.checkpoint_io.teardown()


def report(
    trainer: Any, output_dir: Path, wall_seconds: float = 0.0, output_root: str = "outputs"
) -> dict[str, Any]:
    """What the run reached: on the first process, the scalars as ``scalars.csv``, the loss curves as
    ``loss_curve.png`` and a summary in the log (``training.run.run_report``); its folder, checkpoints, step and
    final metrics."""
    ckpt_dir = output_dir / "checkpoints"
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
    result: dict[str, Any] = {
        "output_dir": str(output_dir),
        "checkpoint": str(ckpt_dir / "last.ckpt"),
        "best_checkpoint": str(ckpt_dir / "best.ckpt"),
        "global_step": trainer.global_step,
        "metrics": metrics,
    }
    if not trainer.is_global_zero:
        return result
    from gptmini.training.run.run_report import RunFacts, report_run

    tensorboard = _tensorboard(trainer)
    facts = RunFacts(
        run_dir=output_dir,
        steps=trainer.global_step,
        wall_seconds=wall_seconds,
        tokens_seen=trainer.global_step * _tokens_per_step(trainer),
        checkpoints=sorted(ckpt_dir.glob("*.ckpt")),
        event_folder=Path(tensorboard.log_dir) if tensorboard is not None else None,
        output_root=output_root,
    )
    title = f"{output_dir.parent.name}/{output_dir.name}: {trainer.global_step:,} steps"
    return result | report_run(facts, title)


def _tokens_per_step(trainer: Any) -> int:
    """Tokens per optimizer step, all processes together: the throughput callback's count of a real batch, else
    the data's batch and context."""
    from gptmini.training.callbacks.loggers import TokenThroughputMonitor

    counts = [cb.global_batch_tokens for cb in trainer.callbacks if isinstance(cb, TokenThroughputMonitor)]
    if any(counts):
        return int(next(c for c in counts if c))
    data = trainer.datamodule
    return int(data.batch_size * data.block_size * trainer.accumulate_grad_batches * trainer.world_size)


def _user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean "the input is wrong", reported as one line. Classes are taken from modules already
    imported (an instance of a class implies its module was imported), so a bad config that fails in
    plan_run does not pay for importing Lightning here."""
    errors: list[type[BaseException]] = [ConfigError, RunError, SizeError, InstantiationException]
    for module, name in (
        ("gptmini.data.errors", "DataError"),
        ("gptmini.data.tokenizers", "TokenizerError"),
        ("gptmini.checkpoint", "CheckpointError"),
        ("gptmini.hf", "HFWeightsError"),
        ("lightning.fabric.utilities.exceptions", "MisconfigurationException"),
    ):
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            errors.append(cls)
    return tuple(errors)


# Exit statuses (documented in docs/training.md, "Resuming and failures").
EXIT_USER_ERROR = 2  # invalid config or input; nothing was trained
EXIT_NONFINITE = 3  # the loss became NaN/inf; the last good checkpoint is kept
EXIT_SIGINT = 130  # 128 + SIGINT: Ctrl-C, on_exception.ckpt saved at a step boundary
EXIT_SIGTERM = 143  # 128 + SIGTERM: preemption, on_exception.ckpt saved at a step boundary


register_configs()


def _run_folder_given() -> bool:
    """Whether the user named the run folder (``hydra.run.dir``/``hydra.sweep.dir``): a folder that may have
    existed before this run, unlike the fresh time-stamped one Hydra makes by default."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return False
    keys = (str(o).split("=", 1)[0].lstrip("+~") for o in HydraConfig.get().overrides.hydra)
    return any(k in ("hydra.run.dir", "hydra.sweep.dir") for k in keys)


def _remove_failed_run_folder(output_dir: Path, keep_folder: bool = False) -> None:
    """Cleans up after a run that failed before doing anything, when its folder holds only Hydra's own files
    (``.hydra/``, ``train.log``) and empty folders: a failed check leaves no run behind. The folder goes, and its
    run_name folder if that is left empty, unless ``keep_folder`` (a folder the user named, which may have existed
    before: only the files this run wrote go). Anything else in it (a checkpoint, TensorBoard events) keeps it."""
    if not output_dir.is_dir():
        return
    for path in output_dir.rglob("*"):
        rel = path.relative_to(output_dir)
        if not (path.is_dir() or rel.parts[0] == ".hydra" or rel in (Path("train.log"), Path(RUN_LOCK))):
            return
    if keep_folder:
        shutil.rmtree(output_dir / ".hydra", ignore_errors=True)
        for own in ("train.log", RUN_LOCK):
            with contextlib.suppress(OSError):
                (output_dir / own).unlink()
        return
    shutil.rmtree(output_dir, ignore_errors=True)
    with contextlib.suppress(OSError):
        output_dir.parent.rmdir()  # only when empty


def _in_sweep() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def _hydra_main(cfg: DictConfig) -> float | JobFailed | None:
    """The Hydra task function (see ``main``)."""
    full_error = os.environ.get("HYDRA_FULL_ERROR") == "1"
    try:
        check_input_files(cfg)  # corpus / init_from paths: before anything else
        result = train(cfg)
    except _user_errors() as err:
        if full_error:
            raise
        msg = str(err)
        if isinstance(err, InstantiationException) and err.__cause__ is not None:
            msg = f"{msg.splitlines()[0]} {err.__cause__}"
        _remove_failed_run_folder(Path(cfg.paths.output_dir), keep_folder=_run_folder_given())
        if _in_sweep():
            log.error("error: %s", msg)  # in the job's log: the sweep goes on
            return JobFailed(EXIT_USER_ERROR, msg)  # SweepSummary reports it at the end
        # the one line docs/reliability.md promises: "error: ...", no logging prefix, exit status 2
        sys.stderr.write(f"error: {msg}\n")
        sys.exit(EXIT_USER_ERROR)
    except (
        KeyboardInterrupt
    ):  # Ctrl-C before/after fitting (during fitting, Lightning turns it into SystemExit)
        if full_error:
            raise
        log.error("interrupted (Ctrl-C) outside training: nothing to save")
        sys.exit(EXIT_SIGINT)
    except SystemExit as exc:
        if full_error:
            raise
        import signal

        if isinstance(exc.__context__, KeyboardInterrupt):
            # Lightning's handler of a raw KeyboardInterrupt (a second Ctrl-C) calls sys.exit(1).
            log.error(
                "interrupted (Ctrl-C twice): stopped at once; resume from the last periodic checkpoint "
                "with ckpt_path=last run_name=%s",
                cfg.run_name,
            )
            sys.exit(EXIT_SIGINT)
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        if not isinstance(exc, SIGTERMException):
            raise
        signum = getattr(exc, "signum", signal.SIGTERM)
        ckpt = Path(cfg.paths.output_dir) / "checkpoints" / "on_exception.ckpt"
        saved = f"saved {ckpt}" if ckpt.is_file() else "no checkpoint saved (no step was done)"
        log.error(
            "interrupted by %s: %s; resume with ckpt_path=last run_name=%s paths.output_root=%s",
            signal.Signals(signum).name,
            saved,
            cfg.run_name,
            cfg.paths.output_root,
        )
        sys.exit(EXIT_SIGINT if signum == signal.SIGINT else EXIT_SIGTERM)
    except Exception as err:
        from gptmini.training.callbacks.guards import NonFiniteLossError

        if full_error or not isinstance(err, NonFiniteLossError):
            raise
        log.error("error: %s", err)
        if _in_sweep():
            return JobFailed(EXIT_NONFINITE, str(err))
        sys.exit(EXIT_NONFINITE)
    return result["metrics"].get("val/loss")  # for sweepers that optimise a value


def main() -> None:
    # The config folder is looked up here, not at import: without it (a broken install) even --help is one
    # clear line instead of a traceback.
    try:
        config_path = str(conf_dir())
    except FileNotFoundError as err:
        sys.stderr.write(f"error: {err}\n")
        sys.exit(EXIT_USER_ERROR)
    from gptmini.training.run.override_errors import run_hydra

    run_hydra(_hydra_main, config_path)  # Hydra's command-line errors as one line


if __name__ == "__main__":
    main()
