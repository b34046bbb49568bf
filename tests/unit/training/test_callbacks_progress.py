"""Progress where no bar can be drawn: ``ProgressLog`` writes a plain line every N steps (step, loss, tokens/s,
elapsed, ETA) when the console is not a terminal, the last step always; ``ProgressBar`` never draws Lightning's
"Epoch 0/-2" label of a step-based run."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from gptmini.training.callbacks import console as callbacks
from gptmini.training.callbacks.console import ProgressBar, ProgressLog
from gptmini.training.callbacks.loggers import TokenThroughputMonitor


def _trainer(max_steps: int, start: int = 0) -> SimpleNamespace:
    """The trainer's attributes ProgressLog reads (no ``callbacks``: it is handed its throughput monitor, not
    looking for one), and ``monitor``, the monitor the app hands it; the steps advance as the test drives the
    hooks."""
    return SimpleNamespace(
        is_global_zero=True,
        global_step=start,
        max_steps=max_steps,
        accumulate_grad_batches=1,
        monitor=TokenThroughputMonitor(),
    )


def _drive(
    progress: ProgressLog, trainer: SimpleNamespace, steps: range, clock: list[float], monkeypatch
) -> None:
    monkeypatch.setattr(callbacks.time, "monotonic", lambda: clock[0])
    progress.throughput = trainer.monitor
    progress.on_train_start(trainer, None)
    for step in steps:
        clock[0] += 2.0  # two seconds a step
        trainer.global_step = step
        trainer.monitor.last["perf/tokens_per_sec"] = 1000.0 * step
        hook = progress.on_train_batch_end  # None where the line is off: Lightning calls it only if callable
        if callable(hook):
            hook(trainer, None, {"loss": torch.tensor(10.0 / step)}, None, step - 1)


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "gptmini.training.callbacks.console"]


def test_a_line_every_n_steps_and_at_the_last_with_loss_rate_and_eta(monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    progress = ProgressLog(every_n_steps=4, when="always")
    _drive(progress, _trainer(10), range(1, 11), [100.0], monkeypatch)
    assert _lines(caplog) == [
        "step 4/10 | loss 2.5000 | 4,000 tok/s | elapsed 8s | ETA 12s",
        "step 8/10 | loss 1.2500 | 8,000 tok/s | elapsed 16s | ETA 4s",
        "step 10/10 | loss 1.0000 | 10,000 tok/s | elapsed 20s",
    ]


def test_a_resumed_run_counts_its_rate_from_its_own_start(monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    progress = ProgressLog(every_n_steps=100, when="always")
    _drive(progress, _trainer(1000, start=600), range(601, 701), [0.0], monkeypatch)
    # 100 steps in 200 s: 300 steps to go take 600 s
    assert _lines(caplog) == ["step 700/1000 | loss 0.0143 | 700,000 tok/s | elapsed 3m20s | ETA 10m00s"]


def test_a_terminal_has_the_bar_and_no_lines(monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(callbacks.sys.stdout, "isatty", lambda: True, raising=False)
    _drive(ProgressLog(every_n_steps=1), _trainer(3), range(1, 4), [0.0], monkeypatch)
    never = ProgressLog(every_n_steps=1, when="never")
    _drive(never, _trainer(3), range(1, 4), [0.0], monkeypatch)
    assert _lines(caplog) == []
    assert never.on_train_batch_end is None  # nothing to write: not called at any step
    monkeypatch.setattr(callbacks.sys.stdout, "isatty", lambda: False, raising=False)
    _drive(ProgressLog(every_n_steps=1), _trainer(3), range(1, 4), [0.0], monkeypatch)
    assert len(_lines(caplog)) == 3


def test_bad_settings_are_refused_naming_the_key():
    with pytest.raises(ValueError, match=r"callbacks\.progress_log\.when='sometimes' is not one of"):
        ProgressLog(when="sometimes")
    with pytest.raises(ValueError, match=r"callbacks\.progress_log\.every_n_steps"):
        ProgressLog(every_n_steps=0)


def _fit_tiny(tmp_path, bar: ProgressBar, max_steps: int = 3, ckpt_path: str | None = None) -> None:
    """A real fit of a one-layer model, 3 steps of a step-based trainer (max_epochs=-1), with ``bar``; its
    checkpoint in ``tmp_path/last.ckpt``, or resumed from ``ckpt_path``."""
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2)
    trainer = L.Trainer(
        max_steps=max_steps,
        max_epochs=-1,
        callbacks=[bar],
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(Tiny(), data, ckpt_path=ckpt_path)
    trainer.save_checkpoint(tmp_path / "last.ckpt")


def test_the_bar_of_a_step_based_run_is_never_drawn_with_lightnings_epoch_label(tmp_path, monkeypatch):
    """Every frame Rich draws in a real fit is recorded (a new task draws one at once), and none shows
    Lightning's "Epoch 0/-2"."""
    from rich.progress import Progress

    monkeypatch.setattr(callbacks.sys.stdout, "isatty", lambda: True, raising=False)
    drawn: list[str] = []
    refresh = Progress.refresh

    def recording(progress: Progress) -> None:
        refresh(progress)
        drawn.extend(str(task.description) for task in progress.tasks if task.visible)

    monkeypatch.setattr(Progress, "refresh", recording)
    _fit_tiny(tmp_path, ProgressBar())
    assert drawn and not any("Epoch" in d for d in drawn), drawn
    assert any("Training" in d for d in drawn)


def test_a_resumed_runs_bar_counts_its_own_steps_from_its_start_to_its_end(tmp_path, monkeypatch):
    """A 3-step run, then resumed to step 5 (mid-epoch: 4 batches an epoch): each bar goes from 1 to the steps its
    own run does, so its rate and ETA are its own."""
    from rich.progress import Progress

    monkeypatch.setattr(callbacks.sys.stdout, "isatty", lambda: True, raising=False)
    drawn: list[tuple[float, float | None]] = []  # the training bar's count after each update
    update = Progress.update

    def recording(progress: Progress, *args, **kwargs) -> None:
        update(progress, *args, **kwargs)
        drawn.extend((t.completed, t.total) for t in progress.tasks if "Training" in str(t.description))

    monkeypatch.setattr(Progress, "update", recording)
    _fit_tiny(tmp_path, ProgressBar(refresh_rate=1000))
    assert drawn[-1] == (3, 3) and all(total == 3 for _, total in drawn), drawn
    drawn.clear()
    _fit_tiny(
        tmp_path / "resumed", ProgressBar(refresh_rate=1000), max_steps=5, ckpt_path=tmp_path / "last.ckpt"
    )
    assert drawn[-1] == (2, 2) and all(total == 2 and done <= 2 for done, total in drawn), drawn


def test_the_bar_is_not_drawn_when_the_console_is_not_a_terminal(tmp_path, monkeypatch):
    """Output to a file or a pipe: the bar never starts (Rich would print its last frame at the end of the log)."""
    monkeypatch.setattr(callbacks.sys.stdout, "isatty", lambda: False, raising=False)
    bar = ProgressBar()
    _fit_tiny(tmp_path, bar)
    assert not bar.is_enabled and bar.progress is None


def test_the_bar_shows_no_logger_version(monkeypatch):
    """Lightning adds the logger's version (`v_num: s=12`), which names nothing here; tok/s stays."""
    throughput = TokenThroughputMonitor()
    throughput.last["perf/tokens_per_sec"] = 1234.0
    logger = SimpleNamespace(version="s=12", name="tb")
    trainer = SimpleNamespace(
        loggers=[logger],
        logger=logger,
        progress_bar_metrics={},
        callback_metrics={"train/loss": torch.tensor(2.5)},  # read by the bar on its logging steps
        callbacks=[throughput],
    )
    bar = ProgressBar()
    bar.throughput = throughput  # what the app hands it (receive)
    metrics = bar.get_metrics(trainer, None)
    assert "v_num" not in metrics
    assert metrics["tok/s"] == "1,234" and metrics["train/loss"] == 2.5


def test_log_lines_follow_stdout_while_the_bar_redirects_it(monkeypatch):
    """Rich redirects sys.stdout while it draws the bar so that text lands above it; a console log handler holding
    the original stream would write onto the bar's line. Followed, the handler writes to the redirected stream,
    and gets its own stream back afterwards; a file handler (train.log) is left alone."""
    import io
    import sys

    console = logging.StreamHandler(sys.stdout)
    file_handler = logging.FileHandler("/dev/null")
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [console, file_handler])
    original = console.stream
    changed = callbacks.follow_console_streams()
    assert [h for h, _ in changed] == [console]
    redirected = io.StringIO()
    monkeypatch.setattr(sys, "stdout", redirected)
    console.handle(logging.makeLogRecord({"msg": "step 3: val loss 2.0", "levelno": logging.INFO}))
    assert redirected.getvalue() == "step 3: val loss 2.0\n"
    assert file_handler.stream.name == "/dev/null"
    for handler, stream in changed:
        handler.setStream(stream)
    assert console.stream is original
    file_handler.close()
