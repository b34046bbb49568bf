"""What a validation adds besides its loss, against the training time between two validations at each run's
default validation cadence; the goal: at most 5% of training time. Two measurements:

- the head insight alone: one insight pass (scores on the probes, the loss by position, every image and scalar
  written to TensorBoard);
- the validation extras: every logger of conf/callbacks/default.yaml that runs at a validation (attention maps,
  head insight, the ATTENTION tab's summary, the text sample), driven through their own hooks as a validation
  drives them, with the one attention pass they share (``gptmini.training.loop.probe``)."""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from benchmarks.common import BenchOptions, log, preset_config, sync
from benchmarks.training import TrainSetup, _batches, run_bare_loop
from gptmini.insight.icl import loss_by_position
from gptmini.insight.probes import make_probes
from gptmini.insight.scores import head_scores
from gptmini.model import GPT, GPTConfig

INSIGHT_COLUMNS = [
    "run",
    "val_every",
    "step_ms",
    "pass_ms",
    "scores_ms",
    "loss_ms",
    "first_pass_ms",
    "share_pct",
    "target_pct",
    "met",
    "extras_ms",
    "extras_pct",
    "extras_met",
    "passes_per_validation",
    "detail_ms",
    "detail_pct",
    "detail_met",
    "projector_ms",
    "circuits_ms",
    "circuits_pct",
]
# the 65 characters of the Shakespeare char corpus (experiment=shakespeare_char_cpu, the GPU default)
CHARS = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
TARGET_SHARE = 0.05
# what the ATTENTION tab's neuron and lens views and the sink shares add to a validation: at most 2%
DETAIL_SHARE = 0.02


@dataclass
class InsightSetup:
    name: str
    train: TrainSetup
    val_every: int  # the run's trainer.val_check_interval
    steps_per_round: int


def insight_setups(opts: BenchOptions) -> list[InsightSetup]:
    if opts.quick:
        cfg = GPTConfig(vocab_size=65, block_size=16, n_layer=1, n_head=2, n_embd=16)
        return [InsightSetup("quick", TrainSetup(model=cfg, batch=2), val_every=100, steps_per_round=3)]
    setups = [
        # the default run (conf/model/small.yaml, GPT-2 BPE, batch 8, validation every 100 steps)
        InsightSetup(
            "default (small, BPE, T=128, batch 8)",
            TrainSetup(model=preset_config("small", vocab_size=50257), batch=8),
            val_every=100,
            steps_per_round=6,
        ),
        # experiment=shakespeare_char_cpu (validation every 250 steps)
        InsightSetup(
            "shakespeare_char_cpu (T=64, batch 12)",
            TrainSetup(model=preset_config("cpu", vocab_size=65), batch=12),
            val_every=250,
            steps_per_round=25,
        ),
    ]
    if opts.on_gpu:  # the GPU default (conf/hardware/gpu.yaml: baby GPT, chars, batch 128, every 500 steps)
        setups.append(
            InsightSetup(
                "GPU default (baby, T=256, batch 128)",
                TrainSetup(model=preset_config("baby", vocab_size=65), batch=128),
                val_every=500,
                steps_per_round=20,
            )
        )
    return setups


def _timed(device: str, fn: Any, *args: Any) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn(*args)
    sync(device)
    return time.perf_counter() - t0


def validation_extras(model: GPT, tokens: np.ndarray, logdir: str) -> tuple[Callable[[int], None], Any]:
    """``extras(step)``: what the default loggers add to a validation at ``step``, through their own hooks as
    Lightning calls them (every ``on_validation_epoch_end``, then every ``on_validation_end``), on a stand-in
    trainer (a TensorBoard logger in ``logdir``, the validation ``tokens``, the run's tokenizer); and the
    ``ValidationProbe`` they share. Without the background thread: the images are drawn inside the timing."""
    from lightning.pytorch.loggers import TensorBoardLogger

    from gptmini.data.tokenizers import CharTokenizer, TiktokenTokenizer
    from gptmini.training.callbacks.insight_logging import HeadInsightLogger
    from gptmini.training.callbacks.loggers import AttentionMapLogger, TextSampleLogger
    from gptmini.training.callbacks.summary_logging import AttentionSummaryLogger
    from gptmini.training.loop.probe import ValidationProbe

    vocab = model.config.vocab_size
    tokenizer = CharTokenizer(sorted(CHARS)) if vocab == len(CHARS) else TiktokenTokenizer("gpt2")
    loggers = [AttentionMapLogger(), HeadInsightLogger(log_hparams=False), AttentionSummaryLogger()]
    loggers.append(TextSampleLogger())
    trainer = SimpleNamespace(
        sanity_checking=False,
        loggers=[TensorBoardLogger(logdir, name="", version="extras")],
        datamodule=SimpleNamespace(tokenizer=tokenizer, val_dataset=SimpleNamespace(tokens=tokens)),
        callback_metrics={},
        precision_plugin=SimpleNamespace(forward_context=contextlib.nullcontext),
        global_step=0,
    )
    probe = ValidationProbe()
    # the readers of the validation's one attention pass share it, as in training; no background worker is
    # handed over, so the images are drawn inside the timing
    for logger in loggers[:3]:
        logger.probe = probe
    module = SimpleNamespace(model=model, device=next(model.parameters()).device)

    def extras(step: int) -> None:
        trainer.global_step = step
        for logger in loggers:
            logger.on_validation_epoch_end(trainer, module)
        for logger in loggers:
            logger.on_validation_end(trainer, module)
        trainer.loggers[0].experiment.flush()
        if loggers[2].last_seconds is None or loggers[1].last_scores is None:
            raise RuntimeError("a validation logger failed (see the warning above): nothing to time")

    return extras, probe


def tab_detail(
    model: GPT, logdir: str
) -> tuple[Callable[[int], None], Callable[[int], None], Callable[[], None]]:
    """``detail(step)``: what the ATTENTION tab's summary logger adds to a validation for the neuron, lens and
    circuits views and the sinks (one ``GPT.inspect`` pass over its default probe, the lens, the queries and keys,
    the circuits, the sink and lens scalars, the lens image drawn inline); ``projector(step)``: the PROJECTOR
    embeddings written at the end; ``circuits()``: the circuits part of ``detail`` alone."""
    from lightning.pytorch.loggers import TensorBoardLogger

    from gptmini.board.detail import circuits, probe_detail
    from gptmini.data.tokenizers import CharTokenizer, TiktokenTokenizer
    from gptmini.training.callbacks.summary_logging import (
        AttentionSummaryLogger,
        attention_summary,
        inspect,
        write_projector,
    )

    vocab = model.config.vocab_size
    tokenizer = CharTokenizer(sorted(CHARS)) if vocab == len(CHARS) else TiktokenTokenizer("gpt2")
    logger = AttentionSummaryLogger()
    ids = tokenizer.encode(logger.probe_text)[: min(logger.max_tokens, model.config.block_size)]
    tokens = [tokenizer.token_text(i) for i in ids]
    writer = TensorBoardLogger(logdir, name="", version="detail").experiment  # no BackgroundWork: drawn here

    def detail(step: int) -> None:
        found = inspect(model, ids)
        summary = attention_summary(found.maps[:, 0], tokens)
        summary = dataclasses.replace(summary, **probe_detail(model, found, ids, tokenizer))
        logger.log_detail(writer, summary, ids, tokenizer, step)
        writer.flush()

    def projector(step: int) -> None:
        write_projector(writer, inspect(model, ids), tokens, step)

    def tab_circuits() -> None:
        circuits(model, ids, tokenizer)

    return detail, projector, tab_circuits


def _bench_one(setup: InsightSetup, opts: BenchOptions, rounds: int) -> dict[str, Any]:
    from torch.utils.tensorboard import SummaryWriter

    from gptmini.training.callbacks.insight_logging import HeadInsightLogger

    dev, s, c = opts.device, setup.train, setup.train.model
    torch.manual_seed(opts.seed)
    model = GPT(c).to(dev)
    # random ids stand in for validation text: the pass costs the same whatever the tokens
    tokens = np.random.default_rng(opts.seed).integers(0, c.vocab_size, size=200_000)
    probes = make_probes(tokens, c.vocab_size, c.block_size).to(dev)
    logger = HeadInsightLogger()
    step_times, pass_times, score_times, loss_times, extras_times, detail_times = [], [], [], [], [], []
    circuit_times = []
    with tempfile.TemporaryDirectory(prefix="gptmini-bench-insight-") as tmp:
        writer = SummaryWriter(tmp)
        extras, probe = validation_extras(model, tokens, tmp)
        detail, projector, tab_circuits = tab_detail(model, tmp)

        def circuits(step: int) -> None:  # what the circuits add: head insight's scalars and the tab's entry
            logger._write_circuits(model, probes, writer, step)
            tab_circuits()

        first = _timed(dev, logger.insight_pass, model, probes, writer, 0)  # also pays imports, fonts
        extras(0)  # warm-up: the loggers' probes, the sampler's first call
        detail(0)
        projector_s = _timed(dev, projector, 0)
        run_bare_loop(model, _batches(s, 2, dev, opts.seed), s, dev)  # warm-up
        passes = probe.passes
        for r in range(rounds):
            ends = run_bare_loop(model, _batches(s, setup.steps_per_round + 1, dev, opts.seed + r), s, dev)
            step_times += [b - a for a, b in zip(ends[:-1], ends[1:], strict=True)]
            pass_times.append(_timed(dev, logger.insight_pass, model, probes, writer, r + 1))
            extras_times.append(_timed(dev, extras, r + 1))
            detail_times.append(_timed(dev, detail, r + 1))
            circuit_times.append(_timed(dev, circuits, r + 1))
            model.eval()
            score_times.append(_timed(dev, head_scores, model, probes))
            loss_times.append(_timed(dev, loss_by_position, model, probes.windows))
        writer.close()
    step = statistics.median(step_times)
    pass_s = statistics.median(pass_times)
    share = pass_s / (setup.val_every * step)
    extras_s = statistics.median(extras_times)
    extras_share = extras_s / (setup.val_every * step)
    detail_s = statistics.median(detail_times)
    detail_share = detail_s / (setup.val_every * step)
    log.info(
        "insight %s: pass %.0f ms vs %d steps of %.1f ms: %.2f%%",
        setup.name,
        pass_s * 1e3,
        setup.val_every,
        step * 1e3,
        100 * share,
    )
    return {
        "run": setup.name,
        "val_every": setup.val_every,
        "step_ms": step * 1e3,
        "pass_ms": pass_s * 1e3,
        "scores_ms": statistics.median(score_times) * 1e3,
        "loss_ms": statistics.median(loss_times) * 1e3,
        "first_pass_ms": first * 1e3,
        "share_pct": 100 * share,
        "target_pct": 100 * TARGET_SHARE,
        "met": share <= TARGET_SHARE,
        "extras_ms": extras_s * 1e3,
        "extras_pct": 100 * extras_share,
        "extras_met": extras_share <= TARGET_SHARE,
        "passes_per_validation": (probe.passes - passes) / rounds,
        "detail_ms": detail_s * 1e3,
        "detail_pct": 100 * detail_share,
        "detail_met": detail_share <= DETAIL_SHARE,
        "projector_ms": projector_s * 1e3,
        "circuits_ms": statistics.median(circuit_times) * 1e3,
        "circuits_pct": 100 * statistics.median(circuit_times) / (setup.val_every * step),
    }


def bench_insight(opts: BenchOptions, rounds: int = 3) -> tuple[list[dict[str, Any]], list[str]]:
    """Training steps and insight passes interleaved in ``rounds`` (a busy neighbour slows both alike)."""
    rows = [_bench_one(setup, opts, rounds) for setup in insight_setups(opts)]
    notes = [
        "pass_ms: one whole insight pass as a validation runs it (probes through the explicit attention path, "
        "loss by position over 32 windows, 6 score grids, the loss curve, every per-head scalar written to "
        "TensorBoard); median of the passes interleaved with the training steps. scores_ms and loss_ms are its two "
        "model passes alone; the rest is drawing and writing",
        "share_pct: pass_ms / (val_every x step_ms), the cost relative to the training between two validations, "
        "at each run's default validation cadence; step_ms: bare training step (forward, backward, clip, AdamW)",
        "first_pass_ms: the run's first pass (before step 0), which also pays one-off imports (matplotlib) and "
        "font loading",
        "extras_ms: everything the default loggers add to a validation (attention maps with their images, head "
        "insight, the ATTENTION tab's summary, a 100-token text sample), through their own hooks, with the one "
        "attention pass they share; the images drawn inside the timing (a run draws them on a background "
        "thread). extras_pct: extras_ms / (val_every x step_ms); passes_per_validation: the attention passes "
        "each validation ran (1: the probes of every logger in one batch)",
        "detail_ms: the part of extras_ms that the ATTENTION tab's neuron and lens views and the sink shares add "
        "(one more pass over the tab's probe keeping the residual stream and the queries and keys, the logit lens, "
        "the sink and lens scalars, the lens image drawn inline); detail_pct: detail_ms / (val_every x step_ms), "
        f"target {100 * DETAIL_SHARE:g}%; projector_ms: the PROJECTOR embeddings, once at the end of training",
        "circuits_ms: what the circuits add to a validation, part of pass_ms and detail_ms (head insight's "
        "attribution on its text probe, the composition scores and their scalars; the tab's per-token attribution, "
        f"composition and QK/OV circuits); circuits_pct: circuits_ms / (val_every x step_ms), target "
        f"{100 * DETAIL_SHARE:g}%",
    ]
    return rows, notes
