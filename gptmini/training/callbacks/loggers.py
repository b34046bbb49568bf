"""Lightning callbacks that observe and log (attention maps, text samples, throughput), so ``training_step`` stays
short; none of them may stop a run (``LoggingCallback``: what happens when one fails)."""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.throughput import Throughput
from lightning.pytorch.callbacks import Timer
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only

from gptmini.data.tokenizers import encode_known
from gptmini.limits import SizeError, check_fits, check_positive, forward_bytes, generation_bytes
from gptmini.model import GPTConfig
from gptmini.training import hardware
from gptmini.training.callbacks.background import BackgroundWork, submit
from gptmini.training.lightning_compat import logs_after_step, resume_hooks, skip_hooks
from gptmini.training.loop.probe import ValidationProbe, eval_mode
from gptmini.viz import attention_entropy, attention_images, token_labels

log = logging.getLogger(__name__)


def tensorboard_writer(trainer: L.Trainer) -> Any | None:
    """The TensorBoard SummaryWriter of the trainer, if one of its loggers is TensorBoard."""
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            return logger.experiment
    return None


def run_tokenizer(trainer: L.Trainer) -> Any | None:
    tokenizer = getattr(getattr(trainer, "datamodule", None), "tokenizer", None)
    return tokenizer() if callable(tokenizer) else tokenizer


def corpus_tokens(trainer: L.Trainer) -> Any | None:
    """The validation split's tokens (the training split's without one), None without a datamodule holding any."""
    for name in ("val_dataset", "train_dataset"):
        dataset = getattr(getattr(trainer, "datamodule", None), name, None)
        if dataset is not None and len(dataset.tokens) > 0:
            return dataset.tokens
    return None


def _guarded(hook: Any) -> Any:
    @functools.wraps(hook)
    def guarded(self: Any, trainer: L.Trainer, *args: Any, **kwargs: Any) -> Any:
        if self.failed_at is not None:
            return None  # off since its first failure
        try:
            return hook(self, trainer, *args, **kwargs)
        except Exception as err:
            self.failed_at = f"{hook.__name__} at step {trainer.global_step}"
            log.warning(
                "%s.%s failed at step %d: %s: %s. This logger is off for the rest of the run; training goes on",
                type(self).__name__,
                hook.__name__,
                trainer.global_step,
                type(err).__name__,
                err,
                exc_info=True,
            )
            return None

    return guarded


@dataclass(frozen=True)
class RunParts:
    """What the app hands the callbacks once the LightningModule is built (``Receiver.receive``), so that none of
    them goes looking for it in the trainer or the module."""

    probe: ValidationProbe  # the module's: one attention pass per validation for every logger of attention
    throughput: TokenThroughputMonitor | None  # the run's throughput monitor, if it has one
    background: BackgroundWork | None  # the run's background worker, if it has one
    # Lightning's Timer, which stops the run when trainer.max_time is spent (None: no time budget)
    timer: Timer | None = None


class Receiver:
    """A callback that reads a part of the run it does not own: the app calls ``receive`` before training."""

    def receive(self, parts: RunParts) -> None:
        raise NotImplementedError


class LoggingCallback(L.Callback):
    """Base of the callbacks that only observe and log: none of them may ever stop a training run.

    The failure policy (docs/architecture.md): every Lightning hook a subclass defines is guarded. The first
    exception in any of them is logged as one warning, with its traceback, naming the callback, the hook and the
    step; that callback is then off for the rest of the run (none of its hooks runs again, so a broken logger
    neither floods the log nor half-logs), and training goes on. ``failed_at`` says where it failed."""

    failed_at: str | None = None  # "hook at step N" once a hook has failed

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name, value in list(vars(cls).items()):
            if name.startswith("on_") and callable(value) and hasattr(L.Callback, name):
                setattr(cls, name, _guarded(value))

    def check_sizes(self, config: GPTConfig, device: torch.device, prefix: str) -> None:
        """Raises ``gptmini.limits.SizeError`` naming ``prefix`` + the setting when a size setting of this callback
        cannot fit in the memory of ``device`` for a model of ``config`` (called before training starts; the
        app passes ``callbacks.<name>.``). Callbacks without size settings keep this no-op."""


class PromptTokens:
    """A configured text (probe, prompt) as ids of the run's tokenizer, whatever its vocabulary: characters a
    char vocabulary lacks are left out, with one warning; when nothing but whitespace is left, the first tokens
    of the validation (else training) data stand in, so the logger still shows something of this corpus."""

    def __init__(self, key: str) -> None:
        self.key = key  # the config key, for the warning
        self._warned = False

    def __call__(self, text: str, tokenizer: Any, trainer: L.Trainer, limit: int) -> list[int]:
        ids, unknown = encode_known(tokenizer, text)
        from_data = not tokenizer.decode(ids).strip()
        if from_data:
            tokens = corpus_tokens(trainer)
            ids = [] if tokens is None else [int(t) for t in tokens[:limit]]
        if (unknown or from_data) and not self._warned:
            self._warned = True
            left_out = (
                f"the characters {' '.join(repr(c) for c in unknown)} are not in this corpus's vocabulary and "
                "are left out"
                if unknown
                else "it encodes to no tokens"
            )
            log.warning(
                "%s: %s%s; set %s to text of this corpus",
                self.key,
                left_out,
                "; nothing but whitespace is left, so the start of the validation data stands in"
                if from_data
                else "",
                self.key,
            )
        return ids[:limit]


class ProbeReader(Receiver, LoggingCallback):
    """Base of the loggers that read the validation's one attention pass (``gptmini.training.loop.probe``): the
    app hands each of them the LightningModule's probe (``receive``); one driven on its own keeps a private one."""

    background: BackgroundWork | None = None  # where images may be drawn; None: at once

    def __init__(self) -> None:
        self.probe = ValidationProbe()

    def receive(self, parts: RunParts) -> None:
        self.probe = parts.probe
        self.background = parts.background


class ProbeTextCallback(ProbeReader):
    """Base of the callbacks that read the model's attention on a fixed probe text at each validation: its size
    check, and the probe's token ids and attention from the validation's one attention pass (``probe``)."""

    probe_text: str
    max_tokens: int
    _probe: PromptTokens

    def check_sizes(self, config: GPTConfig, device: torch.device, prefix: str) -> None:
        per_sequence = forward_bytes(config, self.max_tokens, attention_maps=True)
        check_fits(f"{prefix}max_tokens", 1, per_sequence, device, "probe sequence")

    def probe_ids(
        self, trainer: L.Trainer, pl_module: L.LightningModule
    ) -> tuple[Any, Any, list[int]] | None:
        """(TensorBoard writer, tokenizer, probe ids), or None when there is nothing to log to or with."""
        if trainer.sanity_checking:
            return None
        writer, tokenizer = tensorboard_writer(trainer), run_tokenizer(trainer)
        if writer is None or tokenizer is None:
            return None
        block_size = pl_module.model.config.block_size
        ids = self._probe(self.probe_text, tokenizer, trainer, min(self.max_tokens, block_size))
        return (writer, tokenizer, ids) if ids else None

    @rank_zero_only
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        probe = self.probe_ids(trainer, pl_module)
        if probe is not None:
            self.probe.text(trainer.global_step, probe[2])

    def probe_maps(
        self, trainer: L.Trainer, pl_module: L.LightningModule
    ) -> tuple[Any, Any, list[int], torch.Tensor] | None:
        """``probe_ids`` and the attention on them, (n_layer, n_head, T, T) float32 on the CPU; None as there."""
        probe = self.probe_ids(trainer, pl_module)
        if probe is None:
            return None
        writer, tokenizer, ids = probe
        maps = self.probe.text_maps(pl_module.model, trainer.global_step, ids)
        return writer, tokenizer, ids, maps


class AttentionMapLogger(ProbeTextCallback):
    """At each validation, logs the model's attention on a fixed probe text (from the validation's one pass
    through the explicit attention path): for every layer, a grid of head heatmaps, the head-averaged map and
    each head's entropy. Nothing runs during ordinary training steps."""

    def __init__(
        self,
        # the text whose attention is drawn
        probe_text: str = "ROMEO:\nBut soft, what light through yonder window breaks?",
        # the probe's length in tokens (capped at the context)
        max_tokens: int = 24,
    ) -> None:
        super().__init__()
        self.probe_text = probe_text
        self.max_tokens = check_positive("callbacks.attention_maps.max_tokens", max_tokens)
        self._probe = PromptTokens("callbacks.attention_maps.probe_text")

    @rank_zero_only
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        probe = self.probe_maps(trainer, pl_module)
        if probe is None:
            return
        writer, tokenizer, ids, maps = probe  # maps: (n_layer, n_head, T, T)
        step = trainer.global_step
        for layer, heads in enumerate(attention_entropy(maps).tolist()):  # (n_layer, n_head)
            for head, value in enumerate(heads):
                writer.add_scalar(f"attention/entropy/layer{layer}_head{head}", value, step)
        # Drawing and PNG-encoding the images is the slow part: off the training thread, on NumPy arrays that
        # nothing changes afterwards.
        probs, labels = maps.numpy(), token_labels(tokenizer, ids)

        def draw_and_log() -> None:
            for layer, (grid, mean) in enumerate(attention_images(probs, labels)):
                writer.add_image(f"attention/layer{layer}_heads", grid, step, dataformats="HWC")
                writer.add_image(f"attention/layer{layer}_mean", mean, step, dataformats="HWC")

        submit(self.background, "attention maps", draw_and_log)


class TextSampleLogger(LoggingCallback):
    """At each validation, continues a prompt and logs the text to TensorBoard (and the console log)."""

    def __init__(
        self,
        # the text continued
        prompt: str = "ROMEO:\n",
        # tokens sampled after the prompt
        max_new_tokens: int = 100,
        # the logits are divided by it before sampling (lower: more predictable text)
        temperature: float = 0.8,
        # sample among the top_k likeliest tokens only (null: all)
        top_k: int | None = 200,
        # the sampling's random generator, the same text for the same weights
        seed: int = 1234,
    ) -> None:
        self.prompt = prompt
        self.max_new_tokens = check_positive("callbacks.text_samples.max_new_tokens", max_new_tokens, low=0)
        from gptmini.generation import temperature_problem

        problem = (
            temperature_problem(temperature) if isinstance(temperature, (int, float)) else "is not a number"
        )
        if problem is not None:
            raise SizeError(f"callbacks.text_samples.temperature={temperature!r} {problem}")
        if top_k is not None:
            check_positive("callbacks.text_samples.top_k", top_k)
        self.temperature = temperature
        self.top_k = top_k
        self.seed = seed
        self._prompt = PromptTokens("callbacks.text_samples.prompt")

    def check_sizes(self, config: GPTConfig, device: torch.device, prefix: str) -> None:
        # one sample; its prompt is at most a context
        fixed = generation_bytes(config, config.block_size)
        check_fits(f"{prefix}max_new_tokens", self.max_new_tokens, 24, device, "new tokens", fixed=fixed)

    @rank_zero_only
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        tokenizer = run_tokenizer(trainer)
        if tokenizer is None:
            return
        model = pl_module.model
        ids = self._prompt(self.prompt, tokenizer, trainer, model.config.block_size)
        if not ids:
            return
        idx = torch.tensor([ids], dtype=torch.long, device=pl_module.device)
        # A private generator: sampling must not disturb the global RNG streams (exact resume).
        gen = torch.Generator(device=pl_module.device).manual_seed(self.seed)
        with eval_mode(model):
            out = model.generate(idx, self.max_new_tokens, self.temperature, self.top_k, generator=gen)
        text = tokenizer.decode(out[0].tolist())
        log.info("sample at step %d:\n%s", trainer.global_step, text)
        writer = tensorboard_writer(trainer)
        if writer is not None:
            # Markdown: indent by four spaces so line breaks survive TensorBoard's rendering.
            writer.add_text("samples/text", "    " + text.replace("\n", "\n    "), trainer.global_step)


class TokenThroughputMonitor(LoggingCallback):
    """Training throughput in tokens: ``perf/tokens_per_sec`` (this device), ``perf/mfu``, ``perf/flops_per_sec``,
    ``perf/samples_per_sec``, ``perf/global_tokens_per_sec`` (several devices) and ``perf/tokens_seen``.

    Built on Lightning's public ``Throughput`` (rolling averages over its last readings) rather
    than its ``ThroughputMonitor`` callback, whose customisation points are private. The clock is wall time from
    the start of training, data loading included, with validation (and the callbacks that follow it) left out,
    read on global rank zero only.

    ``perf/mfu`` divides by the peak dense FLOP/s of one device for the run's compute dtype: ``peak_flops`` when
    given (``perf.peak_flops``), else looked up by the GPU's name (``gptmini.training.hardware.peak_flops``); the
    log says which peak it used, or that there is none and how to give it."""

    RENAME = {
        "device/items_per_sec": "perf/tokens_per_sec",
        "items_per_sec": "perf/global_tokens_per_sec",
        "device/mfu": "perf/mfu",
        "device/flops_per_sec": "perf/flops_per_sec",
        "device/samples_per_sec": "perf/samples_per_sec",
    }

    def __init__(
        self,
        # readings the rolling averages cover
        window_size: int = 20,
        peak_flops: float | None = None,
    ) -> None:
        if window_size < 2:
            raise ValueError(f"callbacks.throughput.window_size={window_size} must be >= 2")
        if peak_flops is not None and not float(peak_flops) > 0:
            raise ValueError(f"perf.peak_flops={peak_flops} must be > 0 FLOP/s (null: looked up by the GPU)")
        self.window_size = window_size
        self.peak_flops = peak_flops
        self.peak: hardware.PeakFlops | None = None  # the peak perf/mfu uses, once training starts
        self.last: dict[str, float] = {}
        self.global_batch_tokens: int | None = None  # tokens per optimizer step, all ranks together
        self._throughput: Throughput | None = None
        self._t0 = 0.0
        self._paused_at: float | None = None
        self._batches = self._samples = self._tokens = 0
        self._last_step = -1

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        facts = hardware.detect_device(trainer.strategy.root_device)
        dtype = hardware.compute_dtype(trainer.precision, facts)
        self.peak = hardware.peak_flops(facts, dtype, self.peak_flops)
        if trainer.is_global_zero:
            log.info(self.peak.describe(facts))
        self._throughput = Throughput(
            available_flops=self.peak.flops,
            world_size=trainer.world_size,
            window_size=self.window_size,
        )
        self._batches = self._samples = self._tokens = 0
        self._last_step = trainer.global_step
        self._paused_at = None
        self._t0 = time.perf_counter()
        # the batch-start hook has work only on the batch after a validation: off until then
        skip_hooks(self, "on_train_batch_start")

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking and self._throughput is not None:
            self._paused_at = time.perf_counter()
            resume_hooks(self, "on_train_batch_start")

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._paused_at is not None:  # back from validation: its time is not training time
            self._t0 += time.perf_counter() - self._paused_at
            self._paused_at = None
        skip_hooks(self, "on_train_batch_start")

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.global_batch_tokens is None:
            self._record_global_batch(trainer, batch)
        if not trainer.is_global_zero or self._throughput is None:
            return
        b, t = batch[0].shape
        self._batches += 1
        self._samples += b
        self._tokens += b * t
        if trainer.global_step == self._last_step:
            return  # gradient accumulation: the optimizer step (and its time) is not done yet
        self._last_step = trainer.global_step
        # The clock is read (and a GPU waited for) only on the steps Lightning writes the logs after, and after
        # the first step of the run as the start of the first interval: every other step the host runs ahead of
        # the device. The rolling averages are over the last window_size of those readings.
        first = self._batches == trainer.accumulate_grad_batches
        logging = logs_after_step(trainer, trainer.global_step)
        if not (first or logging):
            return
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize()  # the step's kernels are queued, not done, when the hook runs
        elapsed = time.perf_counter() - self._t0
        flops = getattr(pl_module, "flops_per_batch", 0) or None
        self._throughput.update(
            time=elapsed, batches=self._batches, samples=self._samples, lengths=self._tokens, flops=flops
        )
        if not logging:
            return
        metrics = {
            self.RENAME[k]: float(v) for k, v in self._throughput.compute().items() if k in self.RENAME
        }
        if self.global_batch_tokens is not None:
            # from the optimizer step, so a resumed run counts on from where it stopped
            metrics["perf/tokens_seen"] = float(trainer.global_step * self.global_batch_tokens)
        self.last.update(metrics)
        # Straight to the loggers, as Lightning's LearningRateMonitor writes: plain numbers need none of what
        # self.log does per key (a result entry moved to the value's device, reduced, then written)
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)

    def _record_global_batch(self, trainer: L.Trainer, batch: Any) -> None:
        b, t = batch[0].shape  # one device's micro-batch: (B, T)
        accumulate = trainer.accumulate_grad_batches
        sequences = b * trainer.num_devices * trainer.num_nodes * accumulate
        self.global_batch_tokens = sequences * t
        if trainer.is_global_zero:
            log.info(
                "global batch: %d sequences x %d tokens = %s tokens per optimizer step (batch %d per device x "
                "%d device(s) x %d node(s) x accumulate_grad_batches %d)",
                sequences,
                t,
                f"{self.global_batch_tokens:,}",
                b,
                trainer.num_devices,
                trainer.num_nodes,
                accumulate,
            )
