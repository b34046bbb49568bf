"""The Lightning internals in gptmini/training/lightning_compat.py, checked on a real Trainer of the installed
Lightning. A failure here means a Lightning release renamed or changed something gptmini relies on: fix
lightning_compat.py before raising the ``lightning`` cap in pyproject.toml."""

from __future__ import annotations

import logging

import lightning as L
import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.loggers import Logger
from lightning.pytorch.profilers import PassThroughProfiler
from lightning.pytorch.utilities.exceptions import SIGTERMException
from packaging.version import Version

from gptmini.training import lightning_compat

pytestmark = pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated")

LIGHTNING = Version(L.__version__)


def _trainer(tmp_path, **kwargs) -> L.Trainer:
    defaults = dict(
        accelerator="cpu",
        max_steps=5,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        default_root_dir=tmp_path,
    )
    return L.Trainer(**{**defaults, **kwargs})


def test_the_declared_lightning_range_covers_the_installed_version():
    # pyproject: lightning>=2.5.3,<2.7. A newer Lightning must pass this file before the cap moves.
    assert Version("2.5.3") <= LIGHTNING < Version("2.7"), L.__version__


def test_the_signal_connector_flag_backs_the_public_received_sigterm(tmp_path):
    trainer = _trainer(tmp_path)
    assert hasattr(trainer, "_signal_connector"), "Lightning moved the signal connector"
    assert hasattr(trainer._signal_connector, "received_sigterm"), "Lightning renamed received_sigterm"
    assert trainer.received_sigterm is False
    lightning_compat.request_graceful_stop(trainer)
    assert trainer.received_sigterm is True


def test_request_graceful_stop_ends_fit_at_the_next_batch_boundary_with_sigterm_exception(tmp_path):
    seen: dict[str, object] = {}

    class StopAtSecondStep(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if trainer.global_step == 2:
                lightning_compat.request_graceful_stop(trainer)

        def on_exception(self, trainer, pl_module, exception) -> None:
            seen["exception"], seen["step"] = exception, trainer.global_step

    trainer = _trainer(tmp_path, callbacks=[StopAtSecondStep()])
    # Lightning registers its own handlers (and restores them) while fitting, as in a real run.
    with pytest.raises(SIGTERMException):
        trainer.fit(BoringModel())
    # the step that asked finished (weights stepped), nothing after it ran, and callbacks saw the exception
    assert isinstance(seen["exception"], SIGTERMException) and seen["step"] == 2
    assert trainer.global_step == 2 and trainer.interrupted


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def lightning_records(monkeypatch):
    """Every record Lightning logs (as the app routes them: propagated to the root), captured at the root."""
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        monkeypatch.setattr(logging.getLogger(name), "propagate", True)
        monkeypatch.setattr(logging.getLogger(name), "handlers", [])
    for name in lightning_compat._RANK_ZERO_LOGGERS:
        # start without the filter (another test may have installed it); restored afterwards
        monkeypatch.setattr(logging.getLogger(name), "filters", [])
    capture = _Capture()
    root = logging.getLogger()
    monkeypatch.setattr(root, "level", logging.INFO)
    root.addHandler(capture)
    yield capture.records
    root.removeHandler(capture)


def _fit_once(tmp_path) -> None:
    # enable_checkpointing without a ModelCheckpoint: the Trainer adds one, and advertises litmodels
    trainer = _trainer(tmp_path, max_steps=1, enable_checkpointing=True)
    trainer.fit(BoringModel())


def test_tips_come_from_the_rank_zero_loggers_and_silence_tips_drops_only_them(tmp_path, lightning_records):
    torch.manual_seed(0)
    _fit_once(tmp_path / "a")
    tips = [r for r in lightning_records if r.getMessage().startswith(lightning_compat._TIP_PREFIX)]
    assert {r.name for r in tips} <= set(lightning_compat._RANK_ZERO_LOGGERS), [r.name for r in tips]
    # Not vacuous (every supported release prints one); if a release drops them, silence_tips can go too.
    assert tips, "no Lightning tip seen: has Lightning stopped printing them?"
    other = {r.getMessage() for r in lightning_records} - {r.getMessage() for r in tips}

    lightning_records.clear()
    lightning_compat.silence_tips()
    lightning_compat.silence_tips()  # idempotent
    _fit_once(tmp_path / "b")
    messages = [r.getMessage() for r in lightning_records]
    assert not [m for m in messages if "Tip:" in m]
    assert other and other <= set(messages)  # everything else Lightning says still gets through


def test_logs_after_step_is_lightnings_own_test_of_a_logging_step(tmp_path):
    """At every batch end (the step done) the same answer as Lightning's private test; before every optimizer step
    (the step to come), the cadence's."""
    seen = []

    class Compare(L.Callback):
        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            # Lightning's test counts the steps taken, as it will after this one
            seen.append(
                (
                    lightning_compat.logs_after_step(trainer, trainer.global_step + 1),
                    (trainer.global_step + 1) % trainer.log_every_n_steps == 0,
                )
            )

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            seen.append(
                (
                    lightning_compat.logs_after_step(trainer, trainer.global_step),
                    trainer._logger_connector.should_update_logs,
                )
            )

    _trainer(tmp_path, max_steps=7, log_every_n_steps=3, callbacks=[Compare()]).fit(BoringModel())
    assert len(seen) == 14 and all(ours == lightnings for ours, lightnings in seen[1::2]), seen
    assert [ours for ours, _ in seen[1::2]] == [False, False, True, False, False, True, False]


def test_averaged_model_is_the_one_weight_averaging_swaps_in_for_validation(tmp_path):
    from lightning.pytorch.callbacks import WeightAveraging

    callback = WeightAveraging()
    assert lightning_compat.averaged_model(callback) is None
    _trainer(tmp_path, max_steps=2, callbacks=[callback]).fit(BoringModel())
    average = lightning_compat.averaged_model(callback)
    assert average is not None and int(average.n_averaged) == 2


class _LoggedSteps(Logger):
    """Test-only logger: the (step, epoch) of every training loss Lightning hands to its loggers."""

    name, version = "steps", 0

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int, float]] = []

    def log_metrics(self, metrics, step=None) -> None:
        if "loss" in metrics:
            self.rows.append((step, metrics["epoch"]))

    def log_hyperparams(self, *args, **kwargs) -> None:
        pass


class _FinalSave(BoringModel):
    """Logs its loss; its checkpoint written once fit has returned goes through loops_as_at_last_batch_end, as
    gptmini's module's does."""

    def training_step(self, batch, batch_idx):
        out = super().training_step(batch, batch_idx)
        self.log("loss", out["loss"])
        return out

    def on_save_checkpoint(self, checkpoint) -> None:
        if self.trainer.state.finished:
            lightning_compat.loops_as_at_last_batch_end(checkpoint)


@pytest.mark.parametrize("stop", [4, 6], ids=["mid_epoch", "epoch_end_after_validation"])
def test_a_fit_resumed_from_its_final_state_logs_every_step_where_an_uninterrupted_one_does(tmp_path, stop):
    """6 batches an epoch, validation every 3 steps: trained to ``stop``, saved, resumed to 12, then resumed again
    to 15, the loss of every step is logged at the step and in the epoch of one fit to 15."""
    settings = dict(
        limit_train_batches=6, val_check_interval=3, check_val_every_n_epoch=None, limit_val_batches=1
    )

    def fit(max_steps, ckpt_path=None):
        logger = _LoggedSteps()
        trainer = _trainer(tmp_path, max_steps=max_steps, logger=logger, log_every_n_steps=1, **settings)
        trainer.fit(_FinalSave(), ckpt_path=ckpt_path)
        trainer.save_checkpoint(tmp_path / f"{max_steps}.ckpt")
        return logger.rows

    whole = fit(15)
    pieces = fit(stop) + fit(12, tmp_path / f"{stop}.ckpt") + fit(15, tmp_path / "12.ckpt")
    assert pieces == whole == [(k, float(k // 6)) for k in range(15)]


def test_labelled_rich_progress_bar_adds_its_bar_with_its_own_label(tmp_path, monkeypatch):
    """Lightning makes every training bar's label in ``_get_train_description``: each bar Rich adds, at the
    epoch start and when a bar is first made at a batch, carries ``train_label``'s text, and None keeps
    Lightning's "Epoch N/M"."""
    from rich.progress import Progress

    added: list[str] = []
    add_task = Progress.add_task

    def recording(progress, description, *args, **kwargs):
        added.append(str(description))
        return add_task(progress, description, *args, **kwargs)

    monkeypatch.setattr(Progress, "add_task", recording)

    class Steps(lightning_compat.LabelledRichProgressBar):
        def train_label(self, trainer):
            return f"steps of {trainer.max_steps}"

    _trainer(tmp_path, max_steps=2, enable_progress_bar=True, callbacks=[Steps()]).fit(BoringModel())
    assert added == ["steps of 2"]
    bar = Steps()
    _trainer(tmp_path, max_steps=2, enable_progress_bar=True, callbacks=[bar]).fit(BoringModel())
    bar.train_progress_bar_id = (
        None  # as after a resume mid-epoch: Lightning makes the bar at the batch's end
    )
    bar.on_train_batch_end(bar.trainer, None, None, None, 0)
    assert added[-1] == "steps of 2"
    added.clear()
    _trainer(
        tmp_path,
        max_steps=2,
        enable_progress_bar=True,
        callbacks=[lightning_compat.LabelledRichProgressBar()],
    ).fit(BoringModel())
    assert added == ["Epoch 0/-2"]


class _ActionNames(PassThroughProfiler):
    """Lightning's do-nothing profiler, keeping the name of every action Lightning profiles."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def start(self, action_name: str) -> None:
        self.names.add(action_name)


class _Idle(L.Callback):
    pass


class _CountsBatchEnds(L.Callback):
    def __init__(self) -> None:
        self.batch_ends = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.batch_ends += 1


@pytest.mark.parametrize("skip", [False, True], ids=["as_lightning_does", "skipped"])
def test_skip_idle_hooks_spares_lightnings_dispatch_and_still_calls_the_overridden_hooks(tmp_path, skip):
    idle, counting, profiler = _Idle(), _CountsBatchEnds(), _ActionNames()
    trainer = _trainer(tmp_path, callbacks=[idle, counting], profiler=profiler)
    if skip:
        lightning_compat.skip_idle_hooks(trainer.callbacks)
    trainer.fit(BoringModel())
    assert counting.batch_ends == 5
    dispatched = {
        hook
        for hook in lightning_compat.PER_BATCH_HOOKS
        if f"[Callback]{idle.state_key}.{hook}" in profiler.names
    }
    training_hooks = {h for h in lightning_compat.PER_BATCH_HOOKS if not h.startswith("on_validation")}
    # Lightning dispatches every per-batch training hook to the idle callback; skipped, none of them
    assert dispatched == (set() if skip else training_hooks)
    assert f"[Callback]{counting.state_key}.on_train_batch_end" in profiler.names
    assert (f"[Callback]{counting.state_key}.on_train_batch_start" in profiler.names) is not skip


def test_skip_hooks_stops_a_hooks_dispatch_until_resume_hooks_and_resume_keeps_no_op_hooks_skipped(tmp_path):
    counting, profiler = _CountsBatchEnds(), _ActionNames()
    lightning_compat.skip_idle_hooks([counting])
    lightning_compat.skip_hooks(counting, "on_train_batch_end")
    _trainer(tmp_path, callbacks=[counting], profiler=profiler).fit(BoringModel())
    assert counting.batch_ends == 0
    assert f"[Callback]{counting.state_key}.on_train_batch_end" not in profiler.names

    lightning_compat.resume_hooks(counting, "on_train_batch_end", "on_train_batch_start")
    assert counting.on_train_batch_start is None  # Callback's no-op: stays skipped
    _trainer(tmp_path, callbacks=[counting]).fit(BoringModel())
    assert counting.batch_ends == 5
