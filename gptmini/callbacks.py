"""Lightning callbacks: everything that logs or guards lives here, so ``training_step`` stays short."""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import OnExceptionCheckpoint, RichProgressBar, ThroughputMonitor
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only

from gptmini.viz import attention_entropy, attention_figures, token_labels

log = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError):
    """Training produced a NaN/inf loss; the run stops without saving the bad weights."""


def _tensorboard(trainer: L.Trainer) -> Any | None:
    """The TensorBoard SummaryWriter of the trainer, if one of its loggers is TensorBoard."""
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            return logger.experiment
    return None


def _tokenizer(trainer: L.Trainer) -> Any | None:
    tokenizer = getattr(getattr(trainer, "datamodule", None), "tokenizer", None)
    return tokenizer() if callable(tokenizer) else tokenizer


class AttentionMapLogger(L.Callback):
    """At each validation, runs a fixed probe text through the model's explicit attention path and logs, for
    every layer, a grid of head heatmaps, the head-averaged map and each head's entropy. Nothing runs during
    ordinary training steps."""

    def __init__(self, probe_text: str = "ROMEO:\nBut soft, what light through yonder window breaks?", max_tokens: int = 24) -> None:
        self.probe_text = probe_text
        self.max_tokens = max_tokens

    @rank_zero_only
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        writer, tokenizer = _tensorboard(trainer), _tokenizer(trainer)
        if writer is None or tokenizer is None:
            return
        model = pl_module.model
        ids = tokenizer.encode(self.probe_text)[: min(self.max_tokens, model.config.block_size)]
        idx = torch.tensor([ids], dtype=torch.long, device=pl_module.device)
        was_training = model.training
        model.eval()
        maps = model.attention_maps(idx)[:, 0]  # (n_layer, n_head, T, T)
        model.train(was_training)
        step = trainer.global_step
        grids, means = attention_figures(maps, token_labels(tokenizer, ids))
        for layer, (grid, mean) in enumerate(zip(grids, means, strict=True)):
            writer.add_figure(f"attention/layer{layer}_heads", grid, step)
            writer.add_figure(f"attention/layer{layer}_mean", mean, step)
        entropy = attention_entropy(maps)  # (n_layer, n_head)
        for layer in range(entropy.size(0)):
            for head in range(entropy.size(1)):
                writer.add_scalar(f"attention/entropy/layer{layer}_head{head}", entropy[layer, head].item(), step)


class TextSampleLogger(L.Callback):
    """At each validation, continues a prompt and logs the text to TensorBoard (and the console log)."""

    def __init__(
        self,
        prompt: str = "ROMEO:\n",
        max_new_tokens: int = 100,
        temperature: float = 0.8,
        top_k: int | None = 200,
        seed: int = 1234,
    ) -> None:
        self.prompt = prompt
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_k = top_k
        self.seed = seed

    @rank_zero_only
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        tokenizer = _tokenizer(trainer)
        if tokenizer is None:
            return
        model = pl_module.model
        idx = torch.tensor([tokenizer.encode(self.prompt)], dtype=torch.long, device=pl_module.device)
        # A private generator: sampling must not disturb the global RNG streams (exact resume).
        gen = torch.Generator(device=pl_module.device).manual_seed(self.seed)
        was_training = model.training
        model.eval()
        out = model.generate(idx, self.max_new_tokens, self.temperature, self.top_k, generator=gen)
        model.train(was_training)
        text = tokenizer.decode(out[0].tolist())
        log.info("sample at step %d:\n%s", trainer.global_step, text)
        writer = _tensorboard(trainer)
        if writer is not None:
            # Markdown: indent by four spaces so line breaks survive TensorBoard's rendering.
            writer.add_text("samples/text", "    " + text.replace("\n", "\n    "), trainer.global_step)


def _batch_size(batch: Any) -> int:
    return int(batch[0].size(0))


def _batch_tokens(batch: Any) -> int:
    return int(batch[0].numel())


class TokenThroughputMonitor(ThroughputMonitor):
    """Lightning's ThroughputMonitor counting tokens, logged as ``perf/tokens_per_sec`` and ``perf/mfu``."""

    RENAME = {
        "train/device/items_per_sec": "perf/tokens_per_sec",
        "train/items_per_sec": "perf/global_tokens_per_sec",
        "train/device/mfu": "perf/mfu",
        "train/device/flops_per_sec": "perf/flops_per_sec",
        "train/device/samples_per_sec": "perf/samples_per_sec",
    }

    def __init__(self, window_size: int = 20) -> None:
        super().__init__(batch_size_fn=_batch_size, length_fn=_batch_tokens, window_size=window_size)
        self.last: dict[str, float] = {}

    def _compute(self, trainer: L.Trainer, iter_num: int | None = None) -> None:
        if not trainer._logger_connector.should_update_logs:
            return
        stage = trainer.state.stage
        throughput = self._throughputs[stage]
        metrics = {f"{stage.value}{throughput.separator}{k}": v for k, v in throughput.compute().items()}
        metrics = {self.RENAME.get(k, k): v for k, v in metrics.items() if k in self.RENAME}
        if metrics:
            self.last.update(metrics)
            trainer._logger_connector.log_metrics(metrics, step=iter_num)


class ProgressBar(RichProgressBar):
    """Rich progress bar that also shows the latest tokens/s."""

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        for cb in trainer.callbacks:
            if isinstance(cb, TokenThroughputMonitor) and "perf/tokens_per_sec" in cb.last:
                metrics["tok/s"] = f"{cb.last['perf/tokens_per_sec']:,.0f}"
        return metrics


class NonFiniteLossGuard(L.Callback):
    """Stops the run at the first non-finite training loss, naming the step, and refuses to write a checkpoint
    whose weights are not finite, so the last good checkpoint is never overwritten with NaNs."""

    def __init__(self, check_every_n_steps: int = 1) -> None:
        self.check_every_n_steps = check_every_n_steps

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step % self.check_every_n_steps != 0:
            return
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is not None and not bool(torch.isfinite(loss.detach()).all()):
            raise NonFiniteLossError(
                f"training loss became {loss.item()} at step {trainer.global_step} (batch {batch_idx}); the run "
                "stopped and the last good checkpoint was kept. Lower optimizer.lr, check the data, or raise "
                "trainer.gradient_clip_val"
            )

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        if not all(bool(torch.isfinite(p).all()) for p in pl_module.parameters()):
            raise NonFiniteLossError(
                f"refusing to save a checkpoint with non-finite weights at step {trainer.global_step}; the last "
                "good checkpoint was kept"
            )


class SafeOnExceptionCheckpoint(OnExceptionCheckpoint):
    """Saves a checkpoint when the run is interrupted (Ctrl-C, SIGTERM, a crash), except after a non-finite
    loss, whose weights are not worth keeping."""

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if isinstance(exception, NonFiniteLossError):
            return
        log.warning("run interrupted (%s): saving %s", type(exception).__name__, self.ckpt_path)
        super().on_exception(trainer, pl_module, exception)
