"""What the heads learn, live: head-type scores, the loss by position and the ICL score at every validation, the
induction phase change, and the run's hyperparameters for TensorBoard's HPARAMS tab.

All of it runs at validation (and once for the untrained model, as the baseline), never in a training step. The
computations and the drawing live in ``gptmini.insight``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import math
import time
from collections.abc import Mapping
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_only

from gptmini.fileio import utf8_text
from gptmini.insight.circuits import (
    COMPOSITIONS,
    circuit_problem,
    composition_scores,
    composition_tags,
    direct_logit_attribution,
)
from gptmini.insight.icl import PhaseChangeDetector, icl_bands, icl_score, loss_by_position
from gptmini.insight.probes import Probes, check_probe_settings, make_probes
from gptmini.insight.scores import SCORES, head_scores
from gptmini.limits import check_fits, forward_bytes
from gptmini.model import GPTConfig
from gptmini.runs.record import read_record
from gptmini.training.callbacks.loggers import ProbeReader, corpus_tokens, tensorboard_writer
from gptmini.training.loop.probe import eval_mode
from gptmini.viz import loss_curve, score_grid

log = logging.getLogger(__name__)

# the hparams metrics: TensorBoard shows each one's latest value per run (final val/loss, the best, ...)
HPARAM_METRICS = (
    "val/loss",
    "val/best_loss",
    "perf/tokens_per_sec",
    "insight/icl_score",
    "insight/induction_max",
)
# run-config groups that are not hyperparameters (folders, logging)
_NOT_HPARAMS = ("paths", "callbacks", "logger", "hydra", "overrides", "output_dir", "tensorboard_dir")
_NOT_HPARAM_KEYS = ("_target_", "_partial_", "_convert_", "default_root_dir", "data_dir")


def flat_hparams(settings: Mapping[str, Any], prefix: str = "") -> dict[str, bool | int | float | str]:
    """The run's settings (its record) as TensorBoard hyperparameters: dotted keys, scalar values (None as "null",
    lists as text), without folders and logging settings."""
    out: dict[str, bool | int | float | str] = {}
    for key, value in settings.items():
        name = f"{prefix}{key}"
        if (not prefix and key in _NOT_HPARAMS) or key in _NOT_HPARAM_KEYS:
            continue
        if isinstance(value, Mapping):
            out |= flat_hparams(value, name + ".")
        elif value is None:
            out[name] = "null"
        elif isinstance(value, str):
            out[name] = utf8_text(value)  # a corpus path that is not UTF-8, by its bytes
        elif isinstance(value, (bool, int, float)):
            out[name] = value
        else:
            out[name] = utf8_text(str(value))
    return out


def custom_scalars_layout(n_layer: int) -> dict[str, dict[str, list]]:
    """TensorBoard's CUSTOM SCALARS layout: per score, one multi-line chart per layer holding all its heads; the ICL
    score with the strongest induction head; each layer's heads' attribution, and each kind of composition per pair
    of successive layers."""
    layout: dict[str, dict[str, list]] = {
        "insight: in-context learning": {
            "ICL score (nats; negative: later tokens predicted better)": ["Multiline", ["insight/icl_score"]],
            "strongest induction head": ["Multiline", ["insight/induction_max"]],
        }
    }
    for score in SCORES:
        layout[f"insight: {score.title}"] = {
            f"layer {layer}": ["Multiline", [rf"insight/{score.name}/layer{layer}_head\d+"]]
            for layer in range(n_layer)
        }
    layout["circuits: direct logit attribution"] = {
        f"layer {layer}": ["Multiline", [rf"attribution/layer{layer}_head\d+"]] for layer in range(n_layer)
    }
    for mode in COMPOSITIONS:
        layout[f"circuits: {mode}-composition"] = {
            f"layer {layer} -> {layer + 1}": [
                "Multiline",
                [rf"composition/{mode}/l{layer}h\d+_to_l{layer + 1}h\d+"],
            ]
            for layer in range(n_layer - 1)
        }
    return layout


class HeadInsightLogger(ProbeReader):
    """At each validation (and once for the untrained model, the baseline, logged as step 0): every head's
    scores, the loss by position, the ICL score and the induction phase change, as docs/insight.md lists them.
    Also ``val/best_loss``, and at the start the run's hyperparameters for the HPARAMS tab (``log_hparams``)."""

    def __init__(
        self,
        # each probe sequence (capped at the context); the repeated probe is 2 copies of half
        probe_tokens: int = 128,
        # sequences per probe (text and repeated random tokens)
        probe_batch: int = 4,
        # validation windows of the full context for the loss by position
        loss_windows: int = 32,
        # the probes' random tokens
        seed: int = 1234,
        # the phase change when some head's induction score is at least this (and min_rise, icl_drop hold)
        induction_threshold: float = PhaseChangeDetector.induction_threshold,
        # the phase change needs that head's induction score risen by at least this since the first validation
        min_rise: float = PhaseChangeDetector.min_rise,
        # the phase change needs the ICL score at least this many nats below its highest so far
        icl_drop: float = PhaseChangeDetector.icl_drop,
        # the run's hyperparameters and the HPARAM_METRICS, for TensorBoard's HPARAMS tab
        log_hparams: bool = True,
    ) -> None:
        check_probe_settings(probe_tokens, probe_batch, loss_windows, where="callbacks.head_insight.")
        super().__init__()
        self.probe_tokens = probe_tokens
        self.probe_batch = probe_batch
        self.loss_windows = loss_windows
        self.seed = seed
        self.log_hparams = log_hparams
        self.detector = PhaseChangeDetector(induction_threshold, min_rise, icl_drop)
        self.best_val_loss: float | None = None
        self.last_seconds: float | None = None  # how long the last insight pass took
        # (step, name -> (n_layer, n_head) on the CPU) of the last pass
        self.last_scores: tuple[int, dict[str, torch.Tensor]] | None = None
        self._probes: Probes | None = None
        self._curves: list[tuple[str, torch.Tensor]] = []
        self._session_end: Any = None
        self._circuits_skipped = False  # the model has no per-head decomposition (said once in the log)
        # a copy of the untrained model, scored at the first validation (or the end of training)
        self._untrained: torch.nn.Module | None = None

    def check_sizes(self, config: GPTConfig, device: torch.device, prefix: str) -> None:
        # the text and the repeated-token probes together, every layer's attention kept; the loss windows are
        # full contexts scored a batch at a time
        per_probe = 2 * forward_bytes(config, self.probe_tokens, attention_maps=True)
        check_fits(f"{prefix}probe_batch", self.probe_batch, per_probe, device, "probe sequences (x2)")
        per_window = forward_bytes(config, config.block_size) + 8 * (config.block_size + 1)
        check_fits(f"{prefix}loss_windows", self.loss_windows, per_window, device, "validation windows")

    # --- hooks ---

    @rank_zero_only
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        writer = tensorboard_writer(trainer)
        if writer is None:
            return
        writer.add_custom_scalars(custom_scalars_layout(pl_module.model.config.n_layer))
        if self.log_hparams:
            self._write_hparams(writer, pl_module)
        if trainer.global_step == 0:
            # the untrained model is the baseline the phase change is measured from; it is scored later, on a
            # copy taken now, so that the first training step does not wait for a pass over the probes (whose
            # first forward also pays the kernels' one-time set-up)
            self._untrained = copy.deepcopy(pl_module.model).requires_grad_(False)

    @rank_zero_only
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        writer = tensorboard_writer(trainer)
        if writer is None:
            return
        self._score_untrained(trainer, pl_module, writer)  # a run that ended before its first validation
        if self._session_end is not None:
            writer.file_writer.add_summary(self._session_end)
            writer.flush()

    @rank_zero_only
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # asks the validation's one attention pass for the head scores (see gptmini.training.loop.probe)
        if trainer.sanity_checking or tensorboard_writer(trainer) is None:
            return
        probes = self._probe_data(trainer, pl_module)
        if probes is not None:
            self.probe.scores(trainer.global_step, probes)

    @rank_zero_only
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        writer = tensorboard_writer(trainer)
        if writer is None:
            return
        val = trainer.callback_metrics.get("val/loss")
        if val is not None and math.isfinite(float(val)):
            self.best_val_loss = min(float(val), self.best_val_loss or math.inf)
            writer.add_scalar("val/best_loss", self.best_val_loss, trainer.global_step)
        self._score_untrained(trainer, pl_module, writer)
        self._insight(trainer, pl_module, writer)

    # --- state: a resumed run keeps its best loss and does not report the phase change twice ---

    def state_dict(self) -> dict[str, Any]:
        return {"best_val_loss": self.best_val_loss, "detector": self.detector.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.best_val_loss = state_dict.get("best_val_loss")
        self.detector.load_state_dict(state_dict.get("detector") or {})

    # --- the pass ---

    def _probe_data(self, trainer: L.Trainer, pl_module: L.LightningModule) -> Probes | None:
        if self._probes is None:
            tokens = corpus_tokens(trainer)
            if tokens is None:
                return None
            c = pl_module.model.config
            probes = make_probes(
                tokens,
                c.vocab_size,
                c.block_size,
                self.probe_tokens,
                self.probe_batch,
                self.loss_windows,
                self.seed,
            )
            self._probes = probes.to(pl_module.device)
        return self._probes

    def _score_untrained(self, trainer: L.Trainer, pl_module: L.LightningModule, writer: Any) -> None:
        model, self._untrained = self._untrained, None
        if model is not None:
            self._insight(trainer, pl_module, writer, model=model, step=0)

    def _insight(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        writer: Any,
        model: torch.nn.Module | None = None,
        step: int | None = None,
    ) -> None:
        probes = self._probe_data(trainer, pl_module)
        if probes is None:
            return
        scores = None
        if model is None:  # the validation's model: its scores come from the validation's one attention pass
            self.probe.scores(trainer.global_step, probes)
            scores = self.probe.head_scores(pl_module.model, trainer.global_step)
        # the run's precision (bf16 autocast on GPUs), as in the validation steps
        self.insight_pass(
            pl_module.model if model is None else model,
            probes,
            writer,
            trainer.global_step if step is None else step,
            trainer.precision_plugin.forward_context(),
            scores,
        )

    def insight_pass(
        self,
        model: torch.nn.Module,
        probes: Probes,
        writer: Any,
        step: int,
        precision: contextlib.AbstractContextManager | None = None,
        scores: Mapping[str, torch.Tensor] | None = None,
    ) -> None:
        """Log every head's scores on ``probes`` and the loss by position of ``model`` to ``writer`` (a
        SummaryWriter) at ``step``: what head insight adds to a validation (``make bench`` times it). ``scores``:
        the heads' scores from the validation's attention pass (``ValidationProbe``); None: scored here."""
        t0 = time.perf_counter()
        with eval_mode(model), precision or contextlib.nullcontext():
            if scores is None:
                scores = head_scores(model, probes)  # name -> (n_layer, n_head)
            losses = loss_by_position(model, probes.windows)  # (T,)
        icl = icl_score(losses)
        self.last_scores = (step, dict(scores))
        self._write(writer, step, scores, losses, icl, probes.text.size(1))
        self._write_circuits(model, probes, writer, step)
        change = self.detector.update(step, scores["induction"], icl)
        if change is not None:
            text = change.describe()
            log.info(text)
            writer.add_text("insight/phase_change", text, step)
        self.last_seconds = time.perf_counter() - t0
        writer.add_scalar("perf/insight_seconds", self.last_seconds, step)

    def _write(
        self,
        writer: Any,
        step: int,
        scores: Mapping[str, torch.Tensor],
        losses: torch.Tensor,
        icl: float,
        probe_length: int,
    ) -> None:
        for score in SCORES:
            values = scores[score.name]
            vmin, vmax = score.scale(probe_length)
            image = score_grid(values, score.title, vmin, vmax, score.fmt, subtitle=f"step {step}")
            writer.add_image(f"insight/grid/{score.name}", image, step, dataformats="HWC")
            for layer in range(values.size(0)):
                for head in range(values.size(1)):
                    writer.add_scalar(
                        f"insight/{score.name}/layer{layer}_head{head}", values[layer, head].item(), step
                    )
        writer.add_scalar("insight/icl_score", icl, step)
        writer.add_scalar("insight/induction_max", scores["induction"].max().item(), step)
        self._curves = [*self._curves[-6:], (f"step {step}", losses)]
        writer.add_image(
            "insight/loss_by_position",
            loss_curve(self._curves, icl_bands(losses.numel()), icl),
            step,
            dataformats="HWC",
        )

    def _write_circuits(self, model: torch.nn.Module, probes: Probes, writer: Any, step: int) -> None:
        # direct logit attribution on the text probe and the composition scores of successive layers, in float32
        # outside the run's autocast (see gptmini.insight.circuits)
        problem = circuit_problem(model)
        if problem is not None:
            if not self._circuits_skipped:
                log.info("no attribution/ or composition/ scalars: %s", problem)
                self._circuits_skipped = True
            return
        with eval_mode(model):
            attribution = direct_logit_attribution(model, probes.text).heads.mean((2, 3)).cpu()  # (L, nh)
            composition = composition_scores(model)  # mode -> (L, nh, L, nh)
        for layer in range(attribution.size(0)):
            for head in range(attribution.size(1)):
                writer.add_scalar(
                    f"attribution/layer{layer}_head{head}", attribution[layer, head].item(), step
                )
        c = model.config
        for tag, index in composition_tags(c.n_layer, c.n_head):
            writer.add_scalar(tag, composition[tag.split("/")[1]][index].item(), step)

    def _write_hparams(self, writer: Any, pl_module: L.LightningModule) -> None:
        from torch.utils.tensorboard.summary import hparams

        record = read_record({"hyper_parameters": getattr(pl_module, "hparams", {}) or {}})
        experiment, session_start, self._session_end = hparams(
            flat_hparams(dataclasses.asdict(record)), dict.fromkeys(HPARAM_METRICS, 0.0)
        )
        # the metrics' values are read by TensorBoard from these tags' scalars as the run logs them; the session's
        # end (its status: success) is written when training finishes
        writer.file_writer.add_summary(experiment)
        writer.file_writer.add_summary(session_start)
