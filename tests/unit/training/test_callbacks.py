"""The logging callbacks never stop a training run: probe texts and prompts adapt to the run's vocabulary (a char
vocabulary of a lower-case corpus lacks the "R" of the built-in "ROMEO:"), and the first exception in a logging
callback is reported once, with its traceback, and turns that callback off while training goes on."""

from __future__ import annotations

import logging
import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from benchmarks.common import preset_config
from gptmini.data.tokenizers import CharTokenizer
from gptmini.model import GPT, GPTConfig
from gptmini.training.callbacks import loggers as callbacks
from gptmini.training.callbacks.console import ParameterSummary, ProgressLog
from gptmini.training.callbacks.loggers import (
    AttentionMapLogger,
    TextSampleLogger,
    TokenThroughputMonitor,
)

LOWER = "but soft, what light through yonder window breaks?\nit is the east.\n"


def _run(tmp_path, tokenizer: CharTokenizer, val_text: str = LOWER):
    """A stand-in for the trainer and module the hooks read: a TensorBoard logger, the datamodule's tokenizer
    and validation tokens, and a small model in training mode."""
    from lightning.pytorch.loggers import TensorBoardLogger

    datamodule = SimpleNamespace(
        tokenizer=lambda: tokenizer,
        val_dataset=SimpleNamespace(tokens=np.array(tokenizer.encode(val_text), dtype=np.uint16)),
        train_dataset=None,
    )
    trainer = SimpleNamespace(
        sanity_checking=False,
        loggers=[TensorBoardLogger(str(tmp_path), name="tb", version="")],
        datamodule=datamodule,
        global_step=3,
    )
    config = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=32, n_layer=1, n_head=2, n_embd=8)
    module = SimpleNamespace(model=GPT(config).train(), device=torch.device("cpu"))
    return trainer, module


def _warnings(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and text in r.getMessage()]


def test_probe_and_prompt_drop_what_the_vocabulary_lacks_with_one_warning(tmp_path, caplog):
    tokenizer = CharTokenizer(set(LOWER))  # no capital letters, no ":"
    trainer, module = _run(tmp_path, tokenizer)
    maps, samples = AttentionMapLogger(max_tokens=8), TextSampleLogger(max_new_tokens=5)
    with caplog.at_level(logging.INFO):
        for _ in range(2):  # two validations: still one warning each
            maps.on_validation_end(trainer, module)
            samples.on_validation_end(trainer, module)
    (probe_warning,) = _warnings(caplog, "callbacks.attention_maps.probe_text")
    assert "'R' 'O' 'M' 'E' ':'" in probe_warning and "left out" in probe_warning
    (prompt_warning,) = _warnings(caplog, "callbacks.text_samples.prompt")
    assert "'R' 'O' 'M' 'E' ':'" in prompt_warning
    assert sum("sample at step 3" in r.getMessage() for r in caplog.records) == 2
    assert module.model.training  # restored after the maps and the sample
    assert not [r for r in caplog.records if "failed at step" in r.getMessage()]  # nothing was skipped


def test_a_probe_with_nothing_left_uses_the_validation_data(tmp_path, caplog):
    tokenizer = CharTokenizer(set("0123456789 \n"))
    trainer, module = _run(tmp_path, tokenizer, val_text="3141592653 5897932384\n")
    logger = AttentionMapLogger(max_tokens=6)
    seen = []
    module.model.attention_maps = lambda idx: seen.append(idx.tolist()) or torch.full((1, 1, 2, 6, 6), 1 / 6)
    with caplog.at_level(logging.WARNING):
        logger.on_validation_end(trainer, module)
    assert seen == [[tokenizer.encode("314159")]]
    (warning,) = _warnings(caplog, "callbacks.attention_maps.probe_text")
    assert "the start of the validation data stands in" in warning


def test_an_exception_in_a_logging_hook_is_reported_once_with_its_traceback_and_turns_the_logger_off(
    tmp_path, caplog
):
    tokenizer = CharTokenizer(set(LOWER + "ROMEO:"))
    trainer, module = _run(tmp_path, tokenizer)

    def broken(idx):
        raise RuntimeError("out of memory in the probe")

    module.model.attention_maps = broken
    logger = AttentionMapLogger()
    with caplog.at_level(logging.WARNING):
        logger.on_validation_end(trainer, module)  # does not raise
        logger.on_validation_end(trainer, module)
    (report,) = _warnings(caplog, "failed at step")
    assert report == (
        "AttentionMapLogger.on_validation_end failed at step 3: RuntimeError: out of memory in the probe. "
        "This logger is off for the rest of the run; training goes on"
    )
    (record,) = [r for r in caplog.records if "failed at step" in r.getMessage()]
    assert record.exc_info is not None and "out of memory in the probe" in str(record.exc_info[1])
    assert logger.failed_at == "on_validation_end at step 3"
    assert module.model.training  # the model is back in training mode (dropout) despite the failure


def test_a_failed_logger_runs_none_of_its_hooks_again(tmp_path, caplog):
    """Off after its first failure, in every hook: a broken logger neither floods the log nor half-logs."""
    tokenizer = CharTokenizer(set(LOWER + "ROMEO:"))
    trainer, module = _run(tmp_path, tokenizer)
    calls = []

    def broken(idx):
        calls.append("maps")
        raise RuntimeError("a bug in the maps")

    module.model.attention_maps = broken
    logger = AttentionMapLogger()
    with caplog.at_level(logging.WARNING):
        logger.on_validation_end(trainer, module)
        trainer.global_step = 4
        logger.on_validation_epoch_end(trainer, module)  # another hook of the same logger: skipped too
        logger.on_validation_end(trainer, module)
    assert calls == ["maps"]
    assert len(_warnings(caplog, "failed at step")) == 1
    other = AttentionMapLogger()  # the policy is per callback: another logger still runs
    other.on_validation_end(trainer, module)
    assert calls == ["maps", "maps"]


def test_every_logging_callback_is_guarded():
    LoggingCallback = callbacks.LoggingCallback
    for cls in (AttentionMapLogger, TextSampleLogger, TokenThroughputMonitor, ParameterSummary, ProgressLog):
        assert issubclass(cls, LoggingCallback), cls

    class Mine(LoggingCallback):
        def on_train_batch_end(self, trainer, *args):
            raise ValueError("a bug in a new logger")

        def helper(self):
            raise ValueError("not a hook: not guarded")

    Mine().on_train_batch_end(SimpleNamespace(global_step=1), None, None, None, 0)
    with pytest.raises(ValueError):
        Mine().helper()


def test_attention_images_are_drawn_in_the_background_from_the_maps_of_their_step(tmp_path, tb_events):
    """The images logged are those of the weights at the validation, even when the worker draws them after
    training has changed the weights; the entropy scalars are written at once."""
    import io

    from PIL import Image

    from gptmini.training.callbacks.background import BackgroundWork
    from gptmini.viz import attention_images, token_labels

    tokenizer = CharTokenizer(set(LOWER + "ROMEO:"))
    trainer, module = _run(tmp_path, tokenizer)
    work = BackgroundWork()
    logger = AttentionMapLogger(probe_text="ROMEO: but soft", max_tokens=8)
    logger.background = work  # what the app hands over (RunCallbacks.connect)
    ids = tokenizer.encode("ROMEO: b")
    expected = attention_images(
        module.model.eval().attention_maps(torch.tensor([ids]))[:, 0], token_labels(tokenizer, ids)
    )
    module.model.train()
    gate = threading.Event()
    work.submit("hold", lambda: gate.wait(5))  # the worker is busy: the maps job waits in the queue
    logger.on_validation_end(trainer, module)
    with torch.no_grad():  # training goes on and changes the weights before the images are drawn
        for p in module.model.parameters():
            p.add_(torch.randn_like(p))
    gate.set()
    work.close()
    trainer.loggers[0].experiment.flush()
    ea = tb_events(tmp_path)
    for layer, (heads, mean) in enumerate(expected):
        for tag, want in ((f"attention/layer{layer}_heads", heads), (f"attention/layer{layer}_mean", mean)):
            (event,) = ea.Images(tag)
            assert event.step == 3
            got = np.asarray(Image.open(io.BytesIO(event.encoded_image_string)).convert("RGB"))
            np.testing.assert_array_equal(got, want)
    assert len(ea.Scalars("attention/entropy/layer0_head1")) == 1


@pytest.mark.filterwarnings("ignore:You defined a `validation_step` but have no `val_dataloader`")
@pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated")
def test_a_nan_loss_names_the_checkpoint_still_being_written_in_the_background(tmp_path):
    """Checkpoints are written by AsyncCheckpointIO's thread: the guard's message waits for the write in flight
    instead of reporting that no checkpoint was saved."""
    import time
    from functools import partial

    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.plugins.io import AsyncCheckpointIO, TorchCheckpointIO

    from gptmini.training.callbacks.guards import NonFiniteLossError, NonFiniteLossGuard
    from gptmini.training.loop.module import GPTLightningModule

    class SlowIO(TorchCheckpointIO):
        def save_checkpoint(self, *args, **kwargs):
            time.sleep(0.5)  # still writing when the next step's loss is checked
            super().save_checkpoint(*args, **kwargs)

    class NanAtStep2(GPTLightningModule):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            return loss * float("nan") if self.trainer.global_step == 2 else loss

    module = NanAtStep2(
        model_config=preset_config("tiny", vocab_size=64).to_dict(),
        optimizer=partial(torch.optim.AdamW, lr=1e-3),
    )
    x = torch.randint(0, 64, (8, 9), generator=torch.Generator().manual_seed(0))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:, :-1], x[:, 1:]), batch_size=2)
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True, every_n_train_steps=1, save_top_k=0)
    guard = NonFiniteLossGuard()
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=4,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[guard, ckpt],
        plugins=[AsyncCheckpointIO(SlowIO())],
        default_root_dir=tmp_path,
    )
    with pytest.raises(NonFiniteLossError, match=r"the last good checkpoint is \S+last\.ckpt \(step 2\)"):
        trainer.fit(module, train_dataloaders=loader)


def test_the_draws_of_a_step_depend_on_the_seed_and_the_step_alone():
    """RNGStateCallback reseeds every generator a step may draw from before each batch: the same (seed, step)
    draws the same numbers whatever was drawn before; another step or seed draws others. Turned off
    (``reseed_every_step=false``), it is not called at any batch."""
    import random

    from gptmini.training.callbacks.guards import RNGStateCallback

    def draws(seed: int, step: int, drawn_before: int) -> tuple:
        torch.rand(drawn_before), np.random.rand(drawn_before), [random.random() for _ in range(drawn_before)]
        cb = RNGStateCallback(seed=seed)
        trainer = SimpleNamespace(global_step=step, global_rank=0)
        cb.on_train_start(trainer, None)
        cb.on_train_batch_start(trainer, SimpleNamespace(device=torch.device("cpu")), None, 0)
        return tuple(torch.rand(4).tolist()), tuple(np.random.rand(2)), random.random()

    assert draws(7, 5, 0) == draws(7, 5, 13)
    assert draws(7, 5, 0) != draws(7, 6, 0)
    assert draws(7, 5, 0) != draws(8, 5, 0)
    off = RNGStateCallback(seed=7, reseed_every_step=False)
    off.on_train_start(SimpleNamespace(global_step=0, global_rank=0), None)
    assert off.on_train_batch_start is None
