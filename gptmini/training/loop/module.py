"""The LightningModule: a thin wrapper that trains the plain ``GPT`` from ``gptmini.model``."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from torchmetrics.aggregation import MeanMetric

from gptmini.model import GPT, GPTConfig
from gptmini.runs.record import RECORD_KEY, RunRecord
from gptmini.training.hardware import FLOAT16_AMP
from gptmini.training.lightning_compat import logs_after_step, loops_as_at_last_batch_end
from gptmini.training.loop.ema import AVERAGE_KEY, TRAINED_KEY, average_into_weights_only
from gptmini.training.loop.optimizers import keep_own_settings
from gptmini.training.loop.probe import ValidationProbe

OptimizerFactory = Callable[..., torch.optim.Optimizer]
# device types whose fused AdamW kernel gptmini picks (PyTorch has one for CUDA and, since 2.4, for the CPU)
FUSED_DEVICES = ("cuda", "cpu")
SchedulerFactory = Callable[..., torch.optim.lr_scheduler.LRScheduler]


def optimizer_kernel_kwargs(
    factory: OptimizerFactory, device_type: str, precision: str | None = None
) -> dict[str, bool]:
    """The fastest AdamW kernel for the device type (such as "cuda") under ``trainer.precision``, unless the
    config already chose one.

    CUDA and CPU: ``fused=True``, one kernel for the whole update (on a CPU a vectorised loop over each
    parameter's elements instead of a dozen multi-tensor passes: docs/benchmarks.md). float16 AMP
    (``16-mixed``) takes the multi-tensor ``foreach=True`` path instead: its GradScaler must unscale the gradients
    before they are clipped, which a fused step would do only inside itself (Lightning refuses to clip then).
    Other devices: ``foreach=True``; PyTorch picks the per-parameter loop by default."""
    accepted = inspect.signature(factory).parameters
    preset = getattr(factory, "keywords", None) or {}  # what the config already chose
    # the plan's optimizer node carries every setting of the constructor's signature: None is "not chosen"
    if preset.get("fused") is not None or preset.get("foreach") is not None:
        return {}
    if device_type in FUSED_DEVICES and "fused" in accepted and precision not in FLOAT16_AMP:
        return {"fused": True}
    if "foreach" in accepted:
        return {"foreach": True}
    return {}


def weight_decay_groups(model: torch.nn.Module) -> list[dict[str, Any]]:
    """Weight decay on matrices (and embeddings) only; biases and LayerNorm gains are left alone."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    # named, so TensorBoard shows each group's learning rate as lr-AdamW/decay and lr-AdamW/no_decay
    return [{"params": decay, "name": "decay"}, {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"}]


def build_optimizer(
    factory: OptimizerFactory, model: GPT, device: str, precision: str | None = None
) -> torch.optim.Optimizer:
    """The optimizer of ``factory`` (a partial from conf/optimizer/) over ``model``'s parameters, with the fastest
    kernel for ``device`` (``optimizer_kernel_kwargs``). An optimizer class that declares
    ``takes_parameter_roles`` (optimizer=muon) gets the model's parameters by role (``GPT.parameter_roles``) and
    its stacked projections (``GPT.stacked_projections``);
    any other gets two groups, weight decay on matrices only (``weight_decay_groups``)."""
    kwargs = optimizer_kernel_kwargs(factory, device, precision)
    if getattr(getattr(factory, "func", factory), "takes_parameter_roles", False):
        return factory(model.parameter_roles(), stacked=model.stacked_projections(), **kwargs)
    return factory(weight_decay_groups(model), **kwargs)


class GPTLightningModule(L.LightningModule):
    def __init__(
        self,
        model_config: dict[str, Any],
        optimizer: OptimizerFactory | None = None,
        scheduler: SchedulerFactory | None = None,
        compile: bool = False,
        run_record: str | None = None,
    ) -> None:
        super().__init__()
        # The checkpoint's one hyper-parameter, plain data so that it loads with torch.load(weights_only=True):
        # run_record, the run's plan as JSON (gptmini.runs.record), with the model and the data it trains on.
        self.save_hyperparameters({RECORD_KEY: run_record or RunRecord(model=dict(model_config)).to_json()})
        self.config = GPTConfig.from_dict(dict(model_config))
        self.model = GPT(self.config)
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.compile_model = compile
        self.val_loss = MeanMetric()
        # the attention of each validation's probes, computed once for every logger that reads it
        # (the pass runs under the run's precision, bf16 autocast on GPUs, as the validation steps)
        self.validation_probe = ValidationProbe(lambda: self.trainer.precision_plugin.forward_context())
        # bits per byte: comparable across tokenizers (val/loss is per token of each one's own vocabulary)
        self.val_bpb = MeanMetric()
        self._byte_table: torch.Tensor | None = None  # UTF-8 bytes per token id, from the datamodule
        self.flops_per_batch = 0  # read by ThroughputMonitor
        # FLOPs per token by sequence length: counting parameters is not per-step work
        self._flops_per_token: dict[int, float] = {}

    def configure_model(self) -> None:
        if self.compile_model and not getattr(self, "_compiled", False):
            # In place, so state_dict keys stay free of the "_orig_mod." prefix.
            self.model.compile()
            self._compiled = True

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        return self.model(idx, targets)

    def _shared_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch  # (B, T), (B, T)
        _, loss = self.model(x, y, return_logits=False)  # the loss alone: a CPU skips the logits
        return loss

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        b, t = batch[0].shape
        if t not in self._flops_per_token:
            self._flops_per_token[t] = self.model.flops_per_token(t)
        flops = int(self._flops_per_token[t] * b * t)
        if flops != self.flops_per_batch:  # an nn.Module attribute write costs more than the comparison
            self.flops_per_batch = flops
        loss = self._shared_step(batch)
        # Logged only on the steps Lightning writes the logs after (every other step's value would never be
        # written, and self.log costs more host time than the rest of this method). A tensor, not .item():
        # Lightning reads it only when it writes. Not prog_bar=True: Lightning would turn it into a number after
        # every batch (a device sync); the progress bar reads it itself when it redraws (callbacks.ProgressBar).
        if self._logs_this_step():
            self.log("train/loss", loss, on_step=True, on_epoch=False)
        return loss

    def _logs_this_step(self) -> bool:
        """Whether Lightning writes the logs after the optimizer step under way (``global_step + 1``); True
        outside a Trainer (training_step called alone)."""
        try:
            trainer = self.trainer
        except RuntimeError:
            return True
        return logs_after_step(trainer, trainer.global_step + 1)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        loss = self._shared_step(batch)
        self.val_loss.update(loss, weight=batch[0].numel())  # token-weighted mean, reduced across ranks
        nbytes = self._target_bytes(batch[1])
        if nbytes is not None:
            # the batch's nats / (ln 2 x the bytes its targets stand for), weighted by those bytes: the mean over
            # the pass is sum(nats) / (ln 2 x sum(bytes)); special tokens cost nats and stand for no bytes
            nats = loss * batch[1].numel()
            self.val_bpb.update(nats / (math.log(2) * nbytes.clamp(min=1)), weight=nbytes)

    def _target_bytes(self, targets: torch.Tensor) -> torch.Tensor | None:
        """The UTF-8 bytes the target ids stand for (0-dim, on their device); None when the data cannot say."""
        if self._byte_table is None:
            token_bytes = getattr(self.trainer.datamodule, "token_bytes", None)
            if token_bytes is None:
                return None
            self._byte_table = token_bytes().to(targets.device)
        return self._byte_table[targets].sum()

    def on_validation_epoch_end(self) -> None:
        val_loss = self.val_loss.compute()
        self.val_loss.reset()
        self.log("val/loss", val_loss, prog_bar=True)
        self.log("val/ppl", torch.exp(val_loss))
        if self.val_bpb.update_called:
            self.log("val/bpb", self.val_bpb.compute())
            self.val_bpb.reset()
        # Lightning's documented "step" key sets the step these are logged at: the optimizer steps taken, as the
        # callbacks log (samples, insight, the ATTENTION tab), instead of Lightning's count of batches stepped
        # before this one (one less during training)
        self.log("step", float(self.trainer.global_step))

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if "optimizer_states" not in checkpoint:  # weights alone (best.ckpt): no callback's hook ran
            average_into_weights_only(self.trainer, checkpoint)
        elif self.trainer.state.finished:  # the final last.ckpt, written once fit has returned
            loops_as_at_last_batch_end(checkpoint)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # A checkpoint of callbacks.ema holds the average as "state_dict" and the trained weights beside it. A run
        # continues from the trained weights, whether or not it keeps an average (the optimizer's state is theirs):
        # they go where Lightning restores the model from, and the average aside for the EMA callback, if any.
        trained = checkpoint.get(TRAINED_KEY)
        if trained is not None:
            checkpoint[AVERAGE_KEY] = checkpoint["state_dict"]
            checkpoint["state_dict"] = trained

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        # Pre-clipping global gradient norm, only on the steps Lightning writes the logs after (this step's
        # number is global_step + 1): elsewhere it would be computed and never written.
        if not self._logs_this_step():
            return
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        if grads:
            # One multi-tensor kernel per device and dtype where available; stays on the device (no sync).
            norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
            self.log("train/grad_norm", norm, on_step=True, on_epoch=False)

    def _precision(self) -> str | None:
        # the trainer's precision; None for a module not attached to a Trainer (configure_optimizers called alone)
        try:
            return str(self.trainer.precision)
        except RuntimeError:
            return None

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        # Lightning's mixed-precision plugin refuses to clip for any fused optimizer, for float16's sake (its
        # GradScaler leaves the gradients scaled until a fused step unscales them). bf16-mixed has no scaler: the
        # gradients are the true ones, so they are clipped here as Lightning clips them in float32.
        scaler = getattr(self.trainer.precision_plugin, "scaler", None)  # float16 AMP's GradScaler
        if not optimizer.defaults.get("fused") or scaler is not None:
            self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)
            return
        if not gradient_clip_val:
            return
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if gradient_clip_algorithm == "value":
            torch.nn.utils.clip_grad_value_(params, gradient_clip_val)
        else:
            torch.nn.utils.clip_grad_norm_(params, gradient_clip_val)

    def configure_optimizers(self) -> Any:
        if self.optimizer_factory is None:
            raise ValueError("no optimizer configured: pass optimizer=partial(torch.optim.AdamW, lr=...)")
        optimizer = build_optimizer(self.optimizer_factory, self.model, self.device.type, self._precision())
        # a resumed run loads the checkpoint's buffers and keeps this run's settings (lr, weight decay, ...)
        optimizer.register_load_state_dict_pre_hook(keep_own_settings)
        if self.scheduler_factory is None:
            return optimizer
        scheduler = self.scheduler_factory(optimizer)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
