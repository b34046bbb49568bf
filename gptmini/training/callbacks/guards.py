"""Guards of a training run: callbacks that stop it, save it or make it exact rather than log — a non-finite loss
stops the run without saving its weights, an interrupted run saves a checkpoint to resume from, every step's
randomness is a function of the step (exact resume), and the run ends once it reaches a target validation loss."""

from __future__ import annotations

import hashlib
import logging
import math
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import ModelCheckpoint, OnExceptionCheckpoint

from gptmini.limits import check_positive
from gptmini.training.lightning_compat import logs_after_step, request_graceful_stop, resume_hooks, skip_hooks

log = logging.getLogger(__name__)

# the key of StopAtTargetLoss's state in a checkpoint (read by training.run.resume.check_resume_plan): Lightning's
# Callback.state_key, the class's name (the old checkpoints in tests/fixtures hold it under this key)
TARGET_STATE_KEY = "StopAtTargetLoss"


class NonFiniteLossError(RuntimeError):
    """Training produced a NaN/inf loss; the run stops without saving the bad weights."""


def _last_checkpoint(trainer: L.Trainer) -> str | None:
    """The newest checkpoint file one of the run's savers (last.ckpt, best.ckpt) has written (or restored), if any."""
    # Checkpoints are written in the background (AsyncCheckpointIO): wait for the writes in flight, so that one
    # requested a step ago counts (a write that failed raises its error here). The executor restarts on demand.
    trainer.strategy.checkpoint_io.teardown()
    paths = [
        Path(p)
        for cb in trainer.checkpoint_callbacks
        if isinstance(cb, ModelCheckpoint)
        for p in (cb.last_model_path, cb.best_model_path)
        if p and Path(p).is_file()
    ]
    return str(max(paths, key=lambda p: p.stat().st_mtime)) if paths else None


class NonFiniteLossGuard(L.Callback):
    """Stops the run at the first non-finite training loss, naming the step, and refuses to write a checkpoint
    whose weights are not finite, so the last good checkpoint is never overwritten with NaNs.

    Reading the loss waits for the device, so every step only adds it to a sum on the device (finite exactly when
    each loss is), read every ``check_every_n_steps`` steps and before every save (docs/training.md).

    Callbacks' ``on_train_batch_end`` runs before the checkpoint callbacks' (Lightning orders ModelCheckpoint
    last), so the step that produced the NaN is never saved; ``SafeOnExceptionCheckpoint`` saves nothing
    either."""

    def __init__(
        self,
        # steps between two readings of the summed loss; null: trainer.log_every_n_steps
        check_every_n_steps: int | None = None,
    ) -> None:
        if check_every_n_steps is not None:
            key = "callbacks.nonfinite_guard.check_every_n_steps"
            check_positive(key, check_every_n_steps, note=", or null to check on the logging steps")
        self.check_every_n_steps = check_every_n_steps
        self.last_saved_step: int | None = None
        self._loss_sum: torch.Tensor | None = None  # the losses since the last check, on their device
        self._checked_step = 0  # the last step whose loss was checked

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._loss_sum = None
        self._checked_step = trainer.global_step

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is not None:
            if self._loss_sum is None:
                self._loss_sum = torch.zeros((), dtype=torch.float32, device=loss.device)
            self._loss_sum.add_(loss.detach())  # one kernel, no wait
        step = trainer.global_step
        due = (
            step % self.check_every_n_steps == 0
            if self.check_every_n_steps is not None
            else logs_after_step(trainer, step)
        )
        if due:
            self._check(trainer)

    def _check(self, trainer: L.Trainer) -> None:
        """Raises NonFiniteLossError when a loss since the last check was not finite (one device sync)."""
        step, first = trainer.global_step, self._checked_step + 1
        if self._loss_sum is None or step < first:
            return
        total = self._loss_sum.item()
        self._loss_sum.zero_()
        self._checked_step = step
        if math.isfinite(total):
            return
        last = _last_checkpoint(trainer)
        kept = (
            f"the last good checkpoint is {last}"
            + (f" (step {self.last_saved_step})" if self.last_saved_step is not None else "")
            if last
            else "no checkpoint had been saved by this run yet"
        )
        lr = trainer.optimizers[0].param_groups[0].get("lr") if trainer.optimizers else None
        lr_text = f" (the learning rate was {lr:.3g} at this step)" if isinstance(lr, float) else ""
        when = f"at step {step}" if first == step else f"at a step from {first} to {step}"
        raise NonFiniteLossError(
            f"training loss became {total} {when}; the run stopped without saving these weights and {kept}. "
            f"Lower the learning rate{lr_text} (optimizer.lr; with optimizer=muon optimizer.hidden.lr and "
            "optimizer.embedding.lr), raise scheduler.warmup_steps or set trainer.gradient_clip_val, check the "
            "data, then resume with ckpt_path=last or start over"
        )

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        self._check(trainer)
        if not all(bool(torch.isfinite(p).all()) for p in pl_module.parameters()):
            raise NonFiniteLossError(
                f"the weights became non-finite (NaN/inf) at step {trainer.global_step}; refusing to save them, "
                f"so the last good checkpoint ({_last_checkpoint(trainer) or 'none yet'}) was kept. Lower the "
                "learning rate (optimizer.lr; with optimizer=muon optimizer.hidden.lr and optimizer.embedding.lr) "
                "or set trainer.gradient_clip_val"
            )
        self.last_saved_step = trainer.global_step


class SafeOnExceptionCheckpoint(OnExceptionCheckpoint):
    """Saves ``on_exception.ckpt`` when the run is interrupted (Ctrl-C, SIGTERM/preemption, a crash) so that
    ``ckpt_path=last`` resumes from there (docs/training.md, "Resuming and failures").

    - SIGTERM, and a first Ctrl-C while fitting: Lightning stops at the next batch boundary
      (``SIGTERMException``), so the saved state is a consistent end-of-step state. A second Ctrl-C stops at once
      and saves nothing (the state may be mid-step).
    - Nothing is saved after a non-finite loss (the weights are not worth keeping), after a failed checkpoint
      save (full disk, unwritable folder: it would fail the same way), or before the first step of the run (an
      untrained model would otherwise become the "newest" checkpoint of the run_name).
    - A failure while saving is logged and never hides the original exception."""

    def __init__(self, dirpath: str | Path, filename: str = "on_exception") -> None:
        super().__init__(dirpath, filename)
        self._previous_sigint: Any = None
        self._sigint_installed = False
        self.interrupted_by: int | None = None

    # --- Ctrl-C -> graceful stop at the next batch boundary, like SIGTERM ---

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if stage != "fit" or threading.current_thread() is not threading.main_thread():
            return
        self.interrupted_by = None

        def on_sigint(signum: int, frame: Any) -> None:
            if self.interrupted_by is not None:
                raise KeyboardInterrupt
            self.interrupted_by = signal.SIGINT
            log.warning(
                "Ctrl-C: finishing step %d, then saving %s and exiting (press Ctrl-C again to stop at once "
                "without saving)",
                trainer.global_step + 1,
                self.ckpt_path,
            )
            request_graceful_stop(trainer)

        self._previous_sigint = signal.signal(signal.SIGINT, on_sigint)
        self._sigint_installed = True

    def _restore_sigint(self) -> None:
        if self._sigint_installed:
            signal.signal(signal.SIGINT, self._previous_sigint)
            self._sigint_installed = False

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._restore_sigint()

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self._restore_sigint()
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        if isinstance(exception, SIGTERMException):
            exception.signum = (
                self.interrupted_by or signal.SIGTERM
            )  # read by _hydra_main for the exit status
        from gptmini.runs.checkpoint import CheckpointSaveError

        # weights not worth keeping; a checkpoint that could not be written (full disk...): another save fails too
        if isinstance(exception, (NonFiniteLossError, CheckpointSaveError)):
            return
        if isinstance(exception, KeyboardInterrupt):
            log.warning(
                "stopped at once (second Ctrl-C) without saving: the state may be mid-step. The last periodic "
                "checkpoint is %s",
                _last_checkpoint(trainer) or "none (no step was checkpointed yet)",
            )
            return
        if trainer.global_step == 0:
            log.info("run stopped before its first step (%s): nothing to save", type(exception).__name__)
            return
        name = signal.Signals(exception.signum).name if isinstance(exception, SIGTERMException) else None
        log.warning(
            "run %s at step %d: saving %s",
            f"interrupted by {name}" if name else f"failed ({type(exception).__name__})",
            trainer.global_step,
            self.ckpt_path,
        )
        try:
            # Lightning's own on_exception leaves weights_only unset, which it logs as a default on every save;
            # the full state is what a resume needs.
            trainer.save_checkpoint(self.ckpt_path, weights_only=False)
        except Exception as err:  # never mask the original exception
            log.error("could not save %s: %s", self.ckpt_path, err)


def _derived_seed(*parts: int) -> int:
    """A 63-bit seed that is a pure function of ``parts`` (well mixed: neighbouring steps are unrelated); a hash
    costs the host far less than numpy's ``SeedSequence`` before every training batch."""
    text = ",".join(str(int(p)) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1


class RNGStateCallback(L.Callback):
    """Exact resume of everything random in a training step (dropout masks), which Lightning does not restore.

    - Before every training batch, the global RNGs (torch CPU and CUDA, numpy, python ``random``) are seeded
      from ``(seed, global_step, batch_idx, global_rank)``. The randomness of step N thus depends on nothing but
      N: not on how many draws happened before (a DataLoader draws a seed from the global RNG each time an
      iterator is created, e.g. once per validation and once more after resuming), so a resumed run makes the
      same draws as one never interrupted.
    - The RNG states themselves are also stored in the checkpoint (tensors and plain numbers: loadable with
      ``torch.load(weights_only=True)``) and restored on load, so randomness outside training steps continues
      the saved streams."""

    def __init__(
        self,
        seed: int,  # the run's top-level seed
        # seed the global RNGs from (seed, step, batch, rank) before every training batch (false: only the
        # checkpoint's RNG states are kept)
        reseed_every_step: bool = True,
    ) -> None:
        self.seed = int(seed)
        self.reseed_every_step = reseed_every_step

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.reseed_every_step:
            resume_hooks(self, "on_train_batch_start")
        else:  # nothing to do at any batch
            skip_hooks(self, "on_train_batch_start")

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        seed = _derived_seed(self.seed, trainer.global_step, batch_idx, trainer.global_rank)
        if pl_module.device.type == "cpu":
            # The CPU generator is all a CPU step draws from; torch.manual_seed also visits every other device
            # type's generators, 0.1 ms a step (more than the rest of this hook).
            torch.default_generator.manual_seed(seed)
        else:
            torch.manual_seed(seed)  # CPU and every CUDA device
        random.seed(seed)
        np.random.seed(seed % 2**32)

    def state_dict(self) -> dict[str, Any]:
        version, internal, gauss = random.getstate()
        _, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
        state: dict[str, Any] = {
            "seed": self.seed,
            "torch": torch.get_rng_state(),
            "python": {
                "version": version,
                "state": torch.tensor(internal, dtype=torch.int64),
                "gauss": gauss,
            },
            "numpy": {
                "keys": torch.from_numpy(keys.astype(np.int64)),
                "pos": int(pos),
                "has_gauss": int(has_gauss),
                "cached_gaussian": float(cached),
            },
        }
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        torch.set_rng_state(state_dict["torch"].cpu())
        py, npy = state_dict["python"], state_dict["numpy"]
        random.setstate((int(py["version"]), tuple(py["state"].tolist()), py["gauss"]))
        keys = npy["keys"].numpy().astype(np.uint32)
        np.random.set_state(
            ("MT19937", keys, int(npy["pos"]), int(npy["has_gauss"]), float(npy["cached_gaussian"]))
        )
        cuda = state_dict.get("cuda")
        if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all([s.cpu() for s in cuda])
        if int(state_dict["seed"]) != self.seed:
            log.warning(
                "resuming with seed=%d but the checkpoint was trained with seed=%s: dropout masks from here on "
                "differ from the original run",
                self.seed,
                state_dict["seed"],
            )

    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if self.state_key not in (checkpoint.get("callbacks") or {}):
            log.warning(
                "the checkpoint holds no RNG state (older gptmini?): the resumed run is not bit-exact"
            )


def process_start_time() -> float | None:
    """When this process started, as a ``time.time()`` value (Linux: from /proc); None where unknown."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime")
        )
    except (OSError, StopIteration, IndexError, ValueError):
        return None
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of stat: start time in clock ticks


class StopAtTargetLoss(L.Callback):
    """Ends training at the first validation whose val/loss is at or below ``target`` (null: never), logs
    ``perf/time_to_target`` (seconds since ``fit`` started: training and validation, data and model already
    set up) and ``perf/time_to_target_process`` (seconds since the process started: imports and data
    preparation too), and says so in one log line. Time spent before a resume is not counted."""

    def __init__(self, target: float | None = None) -> None:
        if target is not None and not (isinstance(target, (int, float)) and math.isfinite(target)):
            raise ValueError(f"target_val_loss={target!r} is invalid: a number, or null for no target")
        self.target = target
        self.reached_at: int | None = None
        self._reached_loss: float | None = None
        self._fit_start: float | None = None
        # the last validation's val/loss and step, whatever the target: in every checkpoint, for the run's
        # summary (``gptmini runs`` shows it without reading the event files)
        self._last_val: tuple[float, int] | None = None

    def state_dict(self) -> dict[str, Any]:
        last_loss, last_step = self._last_val or (None, None)
        return {
            "target": self.target,
            "reached_at": self.reached_at,
            "val_loss": self._reached_loss,
            "last_val_loss": last_loss,
            "last_val_step": last_step,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.reached_at = state_dict.get("reached_at")
        self._reached_loss = state_dict.get("val_loss")
        last = state_dict.get("last_val_loss"), state_dict.get("last_val_step")
        self._last_val = last if None not in last else None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._fit_start = time.time()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        loss = trainer.callback_metrics.get("val/loss")
        if loss is not None and not trainer.sanity_checking:
            self._last_val = (float(loss), trainer.global_step)
        if self.target is None or trainer.sanity_checking or self.reached_at is not None:
            return
        if loss is None or not float(loss) <= self.target:
            return
        now = time.time()
        since_fit = now - (self._fit_start or now)
        started = process_start_time()
        since_process = None if started is None else now - started
        self.reached_at = trainer.global_step
        self._reached_loss = float(loss)
        trainer.should_stop = True
        metrics = {"perf/time_to_target": since_fit}
        if since_process is not None:
            metrics["perf/time_to_target_process"] = since_process
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
        if trainer.is_global_zero:
            log.info(
                "reached val/loss %.4f <= target %.4f at step %d: %.1f s after fit start, %s after process start; "
                "stopping",
                float(loss),
                self.target,
                trainer.global_step,
                since_fit,
                "unknown" if since_process is None else f"{since_process:.1f} s",
            )
