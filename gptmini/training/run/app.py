"""The Hydra app: ``gptmini train [overrides]`` (or ``python -m gptmini.training``): plan, build, fit, report
(docs/architecture.md). Known user errors end the run with one ``error:`` line and exit status 2;
``HYDRA_FULL_ERROR=1`` shows tracebacks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
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
from omegaconf import DictConfig, OmegaConf

from gptmini.conf_dir import conf_dir
from gptmini.fileio import RUN_LOCK, release_folder, utf8_text
from gptmini.limits import SizeError, check_training_step
from gptmini.model import ConfigError, GPTConfig
from gptmini.training.errors import RunError
from gptmini.training.hardware import hardware_summary, trainer_processes
from gptmini.training.run.compose import register_configs
from gptmini.training.run.override_errors import EXIT_USER_ERROR, check_resolves
from gptmini.training.run.plan import RunPlan, check_data_files, node_values, plan_run
from gptmini.training.run.resume import check_resumed_data
from gptmini.training.run.run_folder import MADE_FOLDERS, hold_output_dir, hydra_config
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
    for pattern in LIGHTNING_WARNINGS_OFF:
        warnings.filterwarnings("ignore", message=pattern)


# Lightning's warnings that do not apply to a gptmini run, each with why
LIGHTNING_WARNINGS_OFF = (
    # With an OnExceptionCheckpoint, Lightning maps fit(ckpt_path=None) to "last" inside the fresh run folder
    # (always empty, so nothing is loaded) and warns about it; resuming is explicit here (ckpt_path=...).
    r".*ckpt_path=None\)` was called without a model",
    r".*is set, but there is no last checkpoint available",
    # Mid-epoch resume is exact here without a stateful loader (see TokenDataModule), so this warning misleads.
    r".*your dataloader is not resumable",
    r".*isinstance\(treespec, LeafSpec\)` is deprecated",
    # A resumed run writes into a folder of its own, so ModelCheckpoint says it reloads no best score from the
    # run it resumes: this folder's best.ckpt is the best of this run's validations (fit's log line says so).
    r"The dirpath has changed from",
    # Runs count steps, and log every trainer.log_every_n_steps of them whatever an epoch's length (a small
    # corpus's epoch is a few batches): the advice about an epoch's logs does not apply.
    r"The number of training batches \(\d+\) is smaller than the logging",
    # callbacks.ema: the model's configure_model compiles it and shards nothing, which is what this warns about.
    r"You're using the WeightAveraging callback with a model that overrides",
    # Under DDP: val/* are torchmetrics means, reduced across the processes by compute(); step is the same on each.
    r"It is recommended to use `self.log\('(?:val/\w+|step)', \.\.\., sync_dist=True\)`",
)


def train(cfg: DictConfig) -> dict[str, Any]:
    """plan -> build (trainer, data, module) -> fit -> report."""
    started = time.monotonic()
    # First, before any data or model: a bad config or resume checkpoint fails at once.
    plan = plan_run(cfg)
    # from here on the plan alone: the composed config does not travel past planning
    if plan.retain_freed_memory:
        from gptmini.training.hardware import retain_freed_memory

        retain_freed_memory()  # before the first large allocation
    import lightning as L

    from gptmini.training.lightning_compat import skip_idle_hooks

    _quiet_lightning()
    L.seed_everything(plan.seed, workers=True)
    trainer, callbacks = build_trainer(plan)
    if trainer.is_global_zero:  # the machine, the hardware option and how to pick another
        summary = hardware_summary(plan.hardware, plan.device)
        log.info(
            "%s; precision %s, compile %s", summary, plan.trainer.precision, "on" if plan.compile else "off"
        )
    datamodule, gpt_config = build_data(plan, trainer)
    # Before building the model: a step that cannot fit in memory fails now, not after minutes of allocating.
    device = trainer.strategy.root_device
    check_training_step(
        gpt_config, plan.data.batch_size, plan.trainer.precision, device, processes=trainer.num_devices
    )
    # The loggers' size settings (probe batch, sample length, ...), against the same memory, before any work.
    from gptmini.training.callbacks.loggers import LoggingCallback

    for name, callback in callbacks.named.items():
        if isinstance(callback, LoggingCallback):
            callback.check_sizes(gpt_config, device, f"callbacks.{name}.")
    module = build_module(plan, trainer, datamodule, gpt_config)
    callbacks.connect(module.validation_probe)
    skip_idle_hooks(callbacks.given)
    output_dir = Path(plan.output_dir)
    from gptmini.training.run.run_report import continued_history, report_run

    # now: a continuation in the folder of the run it continues replaces its scalars.csv at the end
    history = continued_history(plan.ckpt_path, plan.resumed_at or 0)
    # the first event written: a run that fails its checks leaves no TensorBoard events (nor its folder) behind
    _log_overrides(trainer, plan)
    try:
        fit(trainer, module, datamodule, plan, output_dir / "checkpoints" / "last.ckpt")
    except BaseException:  # a NaN loss, a signal, an error: the curves so far, as a finished run has them
        _write_curves_so_far(trainer, output_dir, history)
        raise
    wall_seconds = time.monotonic() - started  # the whole command, checks and data included
    tokens_per_step = plan.tokens_per_step(gpt_config.block_size, trainer.world_size)
    return report_run(
        trainer, _tensorboard(trainer), output_dir, wall_seconds, plan.output_root, tokens_per_step, history
    )


# The callbacks other parts of the run read, by their name in the config (callbacks.<name>, conf/callbacks/): the
# build hands them over (RunCallbacks.connect), so that none of the readers looks for them.
THROUGHPUT, BACKGROUND = "throughput", "background"


@dataclasses.dataclass(frozen=True)
class RunCallbacks:
    """The callbacks the build made: each of the config's by its name, every one handed to the trainer (those,
    the parameter summary, the time budget's Timer), and that Timer (None without ``trainer.max_time``)."""

    named: dict[str, Any]
    given: list[Any]
    timer: Any = None

    def connect(self, probe: Any) -> None:
        """Hands every callback that reads a part of the run it does not own (a ``Receiver``) those parts
        (``RunParts``: ``probe`` is the LightningModule's validation probe), so that none of them looks for it."""
        from gptmini.training.callbacks.loggers import Receiver, RunParts

        parts = RunParts(probe, self.named.get(THROUGHPUT), self.named.get(BACKGROUND), self.timer)
        for callback in self.given:
            if isinstance(callback, Receiver):
                callback.receive(parts)


def build_trainer(plan: RunPlan) -> tuple[Any, RunCallbacks]:
    """The Lightning Trainer of the plan, with its callbacks and loggers; and the callbacks it was given."""
    from lightning.pytorch.callbacks import ProgressBar as LightningProgressBar
    from lightning.pytorch.callbacks import Timer
    from lightning.pytorch.plugins.io import AsyncCheckpointIO

    from gptmini.runs.checkpoint import atomic_checkpoint_io

    trainer_cfg = dataclasses.asdict(plan.trainer)
    named = {name: instantiate(node_values(node), _convert_="all") for name, node in plan.callbacks.items()}
    if plan.trainer.enable_progress_bar is False:
        # trainer.enable_progress_bar=false: the config's progress bar goes (Lightning refuses both at once)
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
    # trainer.max_time: the Timer Lightning would add itself, made here so that the run holds it
    timer = None
    if plan.trainer.max_time is not None:
        timer = Timer(duration=plan.trainer.max_time, interval="step")
        callbacks.append(timer)
    trainer_cfg["max_time"] = None
    _keep_the_guards(callbacks, trainer_cfg)
    loggers = [_logger(node_values(node), plan) for node in plan.loggers.values()]
    # AtomicCheckpointIO: temp file + fsync + rename, so a kill during a save never corrupts a .ckpt.
    # AsyncCheckpointIO: the state is copied on the training thread at the step it belongs to (so resuming stays
    # exact) and written by one background thread, in order, while training goes on; a failed write stops the run
    # at the next save or at the end.
    plugins = [AsyncCheckpointIO(atomic_checkpoint_io())]
    if trainer_processes(trainer_cfg) == 1:
        # A run of one process (its trainer.devices x trainer.num_nodes) is rank 0 of 1 whatever a launcher's
        # variables left in the environment say (RANK, LOCAL_RANK, WORLD_SIZE, SLURM_NTASKS): Lightning's own
        # environment for a process it starts itself, instead of the one it would detect from them.
        from lightning.fabric.utilities.rank_zero import rank_zero_only
        from lightning.pytorch.plugins.environments import LightningEnvironment

        rank_zero_only.rank = 0  # (Lightning reads it from RANK/LOCAL_RANK when imported)
        plugins.append(LightningEnvironment())
    trainer = instantiate(trainer_cfg, callbacks=callbacks, logger=loggers or False, plugins=plugins)
    return trainer, RunCallbacks(named, callbacks, timer)


def _keep_the_guards(callbacks: list[Any], trainer_cfg: dict[str, Any]) -> None:
    """What docs/reliability.md promises holds whatever the callbacks (``callbacks=none``, ``~callbacks``): a
    NaN/inf loss stops the run without saving it (a ``NonFiniteLossGuard`` is added where the config has none), and
    the run's checkpoints are its own (without a checkpoint callback Lightning would add a ModelCheckpoint of its
    own, writing ``epoch=..-step=...ckpt`` files into the TensorBoard folder; the final last.ckpt is saved anyway)."""
    from lightning.pytorch.callbacks import Checkpoint

    from gptmini.training.callbacks.guards import NonFiniteLossGuard

    if not any(isinstance(c, NonFiniteLossGuard) for c in callbacks):
        callbacks.append(NonFiniteLossGuard())
    if not any(isinstance(c, Checkpoint) for c in callbacks):
        trainer_cfg["enable_checkpointing"] = False


# the TensorBoard logger's targets: its events are placed by the run (run_folder.tensorboard_place)
TENSORBOARD_LOGGERS = (
    "lightning.pytorch.loggers.TensorBoardLogger",
    "lightning.pytorch.loggers.tensorboard.TensorBoardLogger",
)


def _logger(settings: dict[str, Any], plan: RunPlan) -> Any:
    """A logger of the plan; TensorBoard's writes where ``tensorboard_place`` says."""
    if settings.get("_target_") not in TENSORBOARD_LOGGERS:
        return instantiate(settings, _convert_="all")
    from gptmini.training.run.run_folder import tensorboard_place

    place = tensorboard_place(settings, plan.run_name, plan.resumed_at)
    return instantiate({**settings, **place}, _convert_="all")


def _tensorboard(trainer: Any) -> Any:
    from lightning.pytorch.loggers import TensorBoardLogger

    return next((lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)), None)


def _log_overrides(trainer: Any, plan: RunPlan) -> None:
    """The run's command line as text in its TensorBoard run (``run/overrides``, TEXT tab): every override in
    full, where the run's label may be cut; a resumed run adds its own at the step it resumes from."""
    logger = _tensorboard(trainer)
    if logger is None:
        return
    step = plan.resumed_at or 0
    lines = [f"run_name `{plan.run_name}`, run folder `{plan.output_dir}`"]
    if plan.ckpt_path is not None:
        lines.append(f"resumed from `{plan.ckpt_path}` at step {step}")
    lines += [f"- `{o}`" for o in plan.overrides] if plan.overrides else ["no overrides: the defaults"]
    # a corpus path that is not UTF-8 shown by its bytes
    logger.experiment.add_text("run/overrides", utf8_text("\n\n".join(lines)), global_step=step)


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
        check_resumed_data(plan.ckpt_path, plan.resume["record"], datamodule.data_dir, meta, gpt_config)
    return datamodule, gpt_config


def build_module(plan: RunPlan, trainer: Any, datamodule: Any, gpt_config: GPTConfig) -> Any:
    """The LightningModule: the model, its optimizer and schedule, the run record for its checkpoints (and the run
    folder's run_record.json), and the starting weights of ``model.init_from``."""
    from gptmini.data.reader import data_identity, load_meta, saved_tokenizer
    from gptmini.training.loop.module import GPTLightningModule

    meta = load_meta(datamodule.data_dir)
    # the tokenizer travels with the checkpoint: a re-prepared or moved data folder does not orphan it
    identity = data_identity(datamodule.data_dir, meta) | {
        "saved_tokenizer": saved_tokenizer(datamodule.data_dir, meta)
    }
    tensorboard = _tensorboard(trainer)
    # where the run's events are, relative to its folder
    events = (
        os.path.relpath(os.path.abspath(tensorboard.log_dir), os.path.abspath(plan.output_dir))
        if tensorboard is not None
        else None
    )
    # the training processes are recorded too, which a resume must keep (resume.RESUME_POLICY)
    record = dataclasses.replace(plan.record(gpt_config, trainer.world_size, events), data_identity=identity)
    if trainer.is_global_zero:
        record.write(plan.output_dir)
    module = GPTLightningModule(
        model_config=gpt_config.to_dict(),
        optimizer=instantiate(dataclasses.asdict(plan.optimizer), _convert_="all"),
        scheduler=instantiate(dataclasses.asdict(plan.scheduler), _convert_="all")
        if plan.scheduler
        else None,
        compile=plan.compile,
        run_record=record.to_json(),
    )
    if plan.init_from is not None:
        _load_initial_weights(module.model, plan.init_kind, plan.init_from)
    log.info(
        "model: %s parameters (%d layers, %d heads, %d wide, attention=%s), tokenizer %s (vocab %d)",
        f"{module.model.num_parameters():,}",
        gpt_config.n_layer,
        gpt_config.n_head,
        gpt_config.n_embd,
        gpt_config.attention,
        plan.tokenizer.name,
        datamodule.vocab_size,
    )
    return module


def _load_initial_weights(model: Any, kind: str, source: str) -> None:
    if kind == "checkpoint":  # a gptmini checkpoint: its weights, a fresh optimizer
        from gptmini.runs.checkpoint import load_weights_into

        load_weights_into(model, source)
    else:
        from gptmini.hf import load_hf_weights

        load_hf_weights(model, source)
    log.info("initialised weights from %s", source)


def fit(trainer: Any, module: Any, datamodule: Any, plan: RunPlan, last: Path) -> None:
    """Trains; a finished run's final state is its last.ckpt, written before the run is reported done."""
    if plan.ckpt_path:
        keeps_best = any(getattr(callback, "monitor", None) for callback in trainer.checkpoint_callbacks)
        log.info(
            "resuming from %s%s",
            plan.ckpt_path,
            "; this run's best.ckpt is the best of its own validations (the run it resumes keeps its own)"
            if keeps_best
            else "",
        )
    if not gc.isenabled():  # held off through start-up by the training process (gptmini/training/__main__.py)
        gc.freeze()
        gc.enable()
    trainer.fit(
        module, datamodule=datamodule, ckpt_path=plan.ckpt_path, weights_only=True if plan.ckpt_path else None
    )
    if trainer.state.finished and not trainer.interrupted:
        # The periodic "last" save runs every checkpoint_every_n_steps; make last.ckpt the final state.
        trainer.save_checkpoint(last, weights_only=False)  # full state: resumable
    # Waits for the background writes (raising the error of one that failed) before the run is reported done.
    trainer.strategy.checkpoint_io.teardown()


def _write_curves_so_far(trainer: Any, output_dir: Path, history: Any) -> None:
    """``scalars.csv`` and ``loss_curve.png`` of a run stopped after some steps (on the first process); a run
    stopped before its first step leaves none (its folder is then removed as a failed start's)."""
    tensorboard = _tensorboard(trainer)
    if not trainer.is_global_zero or tensorboard is None or trainer.global_step == 0:
        return
    from gptmini.training.run.run_report import read_scalars, write_curves

    try:
        tensorboard.experiment.flush()
        title = f"{output_dir.parent.name}/{output_dir.name}: stopped at step {trainer.global_step:,}"
        write_curves(read_scalars(Path(tensorboard.log_dir)).after(history), output_dir, title)
    except Exception as err:  # the run's own error is the one to report
        log.warning("could not write the curves of the stopped run: %s: %s", type(err).__name__, err)


def _user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean "the input is wrong", reported as one line. Classes are taken from modules already
    imported (an instance of a class implies its module was imported), so a bad config that fails in
    plan_run does not pay for importing Lightning here."""
    errors: list[type[BaseException]] = [ConfigError, RunError, SizeError, InstantiationException]
    for module, name in (
        ("gptmini.data.errors", "DataError"),
        ("gptmini.data.tokenizers", "TokenizerError"),
        ("gptmini.runs.checkpoint", "CheckpointError"),
        ("gptmini.hf", "HFWeightsError"),
        ("lightning.fabric.utilities.exceptions", "MisconfigurationException"),
    ):
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            errors.append(cls)
    return tuple(errors)


# Exit statuses (documented in docs/training.md, "Resuming and failures"), after EXIT_USER_ERROR (2).
EXIT_NONFINITE = 3  # the loss became NaN/inf; the last good checkpoint is kept
EXIT_SIGINT = 130  # 128 + SIGINT: Ctrl-C, on_exception.ckpt saved at a step boundary
EXIT_SIGTERM = 143  # 128 + SIGTERM: preemption, on_exception.ckpt saved at a step boundary


register_configs()


def _remove_failed_run_folder(
    output_dir: Path, keep_folder: bool = False, log_name: str = "train.log"
) -> None:
    """Cleans up after a run that failed before doing anything, when its folder holds only Hydra's own files
    (``.hydra/``, the job's log ``log_name``) and empty folders: a failed check leaves no run behind. The folder goes, and its
    run_name folder if that is left empty, unless ``keep_folder`` (a folder the user named, which may have existed
    before: only the files this run wrote go). Anything else in it (a checkpoint, TensorBoard events) keeps it."""
    if not output_dir.is_dir():
        return
    for path in output_dir.rglob("*"):
        rel = path.relative_to(output_dir)
        if not (path.is_dir() or rel.parts[0] == ".hydra" or rel in (Path(log_name), Path(RUN_LOCK))):
            return
    if keep_folder:
        shutil.rmtree(output_dir / ".hydra", ignore_errors=True)
        for own in (log_name, RUN_LOCK):
            with contextlib.suppress(OSError):
                (output_dir / own).unlink()
        return
    shutil.rmtree(output_dir, ignore_errors=True)
    # its run_name folder, and the folders above it that the run's start made (an output root), when empty
    top = Path(os.environ[MADE_FOLDERS]) if os.environ.get(MADE_FOLDERS) else None
    folder = output_dir.absolute().parent
    while True:
        try:
            folder.rmdir()
        except OSError:
            break
        if top is None or top not in folder.parents:
            break
        folder = folder.parent


def _output_dir(cfg: DictConfig) -> Path | None:
    """``paths.output_dir``, None where it does not resolve (refused by ``check_resolves``)."""
    folder = OmegaConf.select(cfg, "paths.output_dir", default=None, throw_on_resolution_failure=False)
    return None if folder is None else Path(str(folder))


def _clean_failed_start(output_dir: Path | None, made: bool) -> None:
    """What a run that failed its checks wrote goes: Hydra's run folder (``_remove_failed_run_folder``) and, where
    ``paths.output_dir`` points elsewhere, its lock there, and that folder if this run ``made`` it."""
    hydra = hydra_config()
    hydra_dir = Path(hydra.runtime.output_dir) if hydra else output_dir
    if hydra_dir is not None:
        log_name = f"{hydra.job.name}.log" if hydra else "train.log"
        # a run folder the user named may have existed before this run, unlike the time-stamped one Hydra makes
        keys = (str(o).split("=", 1)[0].lstrip("+~") for o in (hydra.overrides.hydra if hydra else ()))
        named = any(k in ("hydra.run.dir", "hydra.sweep.dir") for k in keys)
        _remove_failed_run_folder(hydra_dir, keep_folder=named, log_name=log_name)
    if output_dir is None or hydra_dir is None or output_dir.absolute() == hydra_dir.absolute():
        return
    _remove_failed_run_folder(output_dir, keep_folder=True)
    if made:
        with contextlib.suppress(OSError):
            output_dir.rmdir()  # only when empty


def _check_own_config() -> None:
    """A primary config of the user's own (``--config-name``) composes gptmini's: without it the run would have
    none of the run folder's checks (``hydra.callbacks``), the schema or the settings every run needs."""
    hydra = hydra_config()
    if hydra is None or "output_folder_check" in (hydra.callbacks or {}):
        return
    raise RunError(
        f"--config-name {hydra.job.config_name}: a config of your own starts from gptmini's: put "
        "`defaults: [train, _self_]` first in it (then its own values, or `override /model: tiny`-style lines)"
    )


def _in_sweep() -> bool:
    from hydra.types import RunMode

    return getattr(hydra_config(), "mode", None) == RunMode.MULTIRUN


def _resume_hint(output_dir: str) -> str:
    """The end of an interrupted run's last line: the command that resumes it, typed as printed."""
    from gptmini.training.run.run_folder import resume_command

    command = resume_command(output_dir)
    return f"resume with: {command}" if command else "this run saved no checkpoint to resume from"


def _hydra_main(cfg: DictConfig) -> float | JobFailed | None:
    """The Hydra task function (see ``main``)."""
    output_dir = _output_dir(cfg)  # read once: after planning only the plan travels
    try:
        return _job(cfg, output_dir)
    finally:
        # the run is over, whatever its end: its folders are free again, also where this process goes on (a
        # sweep's next job, a run started in-process), so `gptmini runs` no longer lists it as running
        hydra = hydra_config()
        for folder in (output_dir, hydra.runtime.output_dir if hydra else None):
            if folder is not None:
                release_folder(folder)


def _job(cfg: DictConfig, output_dir: Path | None) -> float | JobFailed | None:
    full_error = os.environ.get("HYDRA_FULL_ERROR") == "1"
    made = output_dir is not None and not output_dir.exists()
    try:
        _check_own_config()
        check_resolves(cfg)  # every interpolation, before any value is used
        hold_output_dir(cfg)  # paths.output_dir elsewhere than Hydra's folder: free, and held
        check_data_files(cfg)  # the corpus's path: before anything else
        result = train(cfg)
    except _user_errors() as err:
        if full_error:
            raise
        msg = str(err)
        if isinstance(err, InstantiationException) and err.__cause__ is not None:
            msg = f"{msg.splitlines()[0]} {err.__cause__}"
        _clean_failed_start(output_dir, made)
        if _in_sweep():
            log.error("error: %s", msg)  # in the job's log: the sweep goes on
            return JobFailed(EXIT_USER_ERROR, msg)  # SweepSummary reports it at the end
        # the one line docs/reliability.md promises: "error: ...", no logging prefix, exit status 2
        sys.stderr.write(f"error: {msg}\n")
        sys.exit(EXIT_USER_ERROR)
    # Ctrl-C before/after fitting (during fitting, Lightning turns it into SystemExit)
    except KeyboardInterrupt:
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
                "interrupted (Ctrl-C twice): stopped at once without saving; %s",
                _resume_hint(str(output_dir)),
            )
            sys.exit(EXIT_SIGINT)
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        if not isinstance(exc, SIGTERMException):
            raise
        signum = getattr(exc, "signum", signal.SIGTERM)
        ckpt = Path(str(output_dir)) / "checkpoints" / "on_exception.ckpt"
        saved = f"saved {ckpt}" if ckpt.is_file() else "no checkpoint saved (no step was done)"
        log.error(
            "interrupted by %s: %s; %s",
            signal.Signals(signum).name,
            saved,
            _resume_hint(str(output_dir)),
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
