"""No host-device sync inside a training step between two logging steps: reading a tensor's value (``.item()``,
``float()``, a truth test, ``.cpu()``, ``.tolist()``) waits for the device, which on a GPU leaves it idle while
the host catches up. Counted during a real fit through the app's own trainer, every default callback on (the CPU
has no device to wait for, but the calls that would wait are the same ones)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch

from gptmini.training.lightning_compat import PER_BATCH_HOOKS
from gptmini.training.run import app

# torch.Tensor's methods that read a value back to the host; on a GPU tensor each one waits for the device
READS = ("item", "cpu", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__")
LOG_EVERY = 5
QUIET = range(LOG_EVERY + 1, 2 * LOG_EVERY)
TRAINING_BATCH_HOOKS = tuple(
    h for h in PER_BATCH_HOOKS if not h.startswith("on_validation")
)  # the optimizer steps between the logging steps 5 and 10
# every default callback, validation once at the end, the console's progress line on the logging steps
QUIET_RUN = [
    "debug=smoke",
    "trainer.max_steps=12",
    f"trainer.log_every_n_steps={LOG_EVERY}",
    "trainer.val_check_interval=24",
    f"callbacks.progress_log.every_n_steps={LOG_EVERY}",
]


class ReadCounter(L.Callback):
    """Counts the reads of ``READS`` from the start of the first quiet step to the start of the step after the
    last one (the step's data, every callback's hooks, the module's step, the optimizer, Lightning's loop), by
    step and call site."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.step: int | None = None
        self.reads: dict[int, list[str]] = defaultdict(list)
        for name in READS:
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._counting(name, original))

    def _counting(self, name: str, original: Any) -> Any:
        import traceback

        def read(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if self.step is not None:
                frame = traceback.extract_stack(limit=2)[0]
                self.reads[self.step].append(f"{name} at {Path(frame.filename).name}:{frame.lineno}")
            return original(tensor, *args, **kwargs)

        return read

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        step = trainer.global_step + 1  # the optimizer step this batch makes
        self.step = step if step in QUIET else None


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["trainer.accumulate_grad_batches=2"],
        ["callbacks.ema={_target_: gptmini.training.loop.ema.EMAWeightAveraging, decay: 0.9}"],
    ],
    ids=["default", "accumulating", "ema"],
)
def test_no_value_is_read_from_the_device_between_two_logging_steps(
    train_in_process, tmp_path, monkeypatch, extra
):
    counter = ReadCounter(monkeypatch)
    build = app.build_trainer

    def with_counter(plan):
        trainer, named = build(plan)
        trainer.callbacks.insert(0, counter)  # first: the other callbacks' batch-start hooks are counted
        return trainer, named

    monkeypatch.setattr(app, "build_trainer", with_counter)
    train_in_process([*QUIET_RUN, *extra], tmp_path / "run")
    assert dict(counter.reads) == {}, dict(counter.reads)


def test_the_counter_sees_a_read_in_a_quiet_step(train_in_process, tmp_path, monkeypatch):
    """The oracle is not blind: a module that reads its loss every step is caught on each quiet step."""
    from gptmini.training.loop.module import GPTLightningModule

    counter = ReadCounter(monkeypatch)
    build = app.build_trainer

    def with_counter(plan):
        trainer, named = build(plan)
        trainer.callbacks.insert(0, counter)
        return trainer, named

    step = GPTLightningModule.training_step

    def reading_step(self, batch, batch_idx):
        loss = step(self, batch, batch_idx)
        loss.item()
        return loss

    monkeypatch.setattr(app, "build_trainer", with_counter)
    monkeypatch.setattr(GPTLightningModule, "training_step", reading_step)
    train_in_process(QUIET_RUN, tmp_path / "run")
    here = f"item at {Path(__file__).name}:{reading_step.__code__.co_firstlineno + 2}"
    assert {step: reads for step, reads in counter.reads.items()} == {step: [here] for step in QUIET}


def test_the_training_command_dispatches_no_per_batch_hook_a_callback_leaves_as_a_no_op(
    train_in_process, tmp_path, monkeypatch
):
    """Lightning calls every hook of every callback at every batch; the app's trainer leaves out the ones a
    callback does not implement (``lightning_compat.skip_idle_hooks``), so that they cost nothing per step."""

    built = []
    build = app.build_trainer

    def keeping(plan):
        trainer, named = build(plan)
        built.append(trainer)
        return trainer, named

    monkeypatch.setattr(app, "build_trainer", keeping)
    train_in_process(["debug=smoke", "trainer.max_steps=2"], tmp_path / "run")
    (trainer,) = built
    dispatched = {
        (type(cb).__name__, hook)
        for cb in trainer.callbacks
        for hook in PER_BATCH_HOOKS
        if callable(getattr(cb, hook))
    }
    implemented = {
        (type(cb).__name__, hook)
        for cb in trainer.callbacks
        for hook in PER_BATCH_HOOKS
        if getattr(type(cb), hook) is not getattr(L.Callback, hook)
    }
    # nor, of those it implements, the ones with nothing to do for now (the bar where it is not drawn, the
    # throughput clock's batch start but after a validation)
    assert dispatched <= implemented
    idle = {"ProgressBar", "ProgressLog", "CpuThreads", "TokenThroughputMonitor", "RNGStateCallback"}
    assert {name for name, hook in implemented - dispatched} <= idle
    assert len(dispatched) < len(trainer.callbacks) * len(PER_BATCH_HOOKS) / 3, sorted(dispatched)


class DispatchCounter(L.Callback):
    """Lightning's do-nothing profiler in the trainer's place, keeping the per-batch training hooks of the
    callbacks Lightning dispatches at each optimizer step (``[Callback]<state key>.<hook>`` names, shortened to
    ``<class>.<hook>``)."""

    def __init__(self) -> None:
        from lightning.pytorch.profilers import PassThroughProfiler

        counter = self

        class Names(PassThroughProfiler):
            def start(self, action_name: str) -> None:
                if counter.step is not None and action_name.startswith("[Callback]"):
                    state_key, hook = action_name.removeprefix("[Callback]").rsplit(".", 1)
                    name = state_key.split("{")[0]
                    if name != type(counter).__qualname__ and hook in TRAINING_BATCH_HOOKS:
                        counter.hooks[counter.step].add(f"{name}.{hook}")

        self.profiler = Names()
        self.step: int | None = None
        self.hooks: dict[int, set[str]] = defaultdict(set)

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self.step = trainer.global_step + 1  # the optimizer step this batch makes

    def on_train_end(self, trainer: L.Trainer, *args: Any) -> None:
        self.step = None


def test_a_callback_with_nothing_to_do_at_a_step_is_not_called_at_it(train_in_process, tmp_path, monkeypatch):
    """Between logging steps, the per-batch hooks the training command dispatches are those with work at that
    step: not the progress bar's where it is not drawn (this console is not a terminal), not the progress
    line's where it is off, not the throughput clock's batch start except right after a validation."""
    counter = DispatchCounter()
    build = app.build_trainer

    def with_counter(plan):
        trainer, named = build(plan)
        trainer.callbacks.insert(0, counter)
        trainer.profiler = counter.profiler
        return trainer, named

    monkeypatch.setattr(app, "build_trainer", with_counter)
    run = [*QUIET_RUN, "trainer.val_check_interval=7", "callbacks.progress_log.when=never"]
    train_in_process(run, tmp_path / "run")
    quiet = {step: counter.hooks[step] for step in QUIET}  # a validation after step 7
    for step, hooks in quiet.items():
        assert not {h for h in hooks if h.startswith(("ProgressBar.", "ProgressLog."))}, (step, hooks)
        after_validation = step == 8
        assert ("TokenThroughputMonitor.on_train_batch_start" in hooks) is after_validation, (step, hooks)
        # the clock's batch end and the reseeding still run at every step
        assert {"TokenThroughputMonitor.on_train_batch_end", "RNGStateCallback.on_train_batch_start"} <= hooks
