"""The run plan: every check a run needs before any expensive work, and what they derive, in one frozen
``RunPlan`` that the rest of training reads (the composed config itself is never changed).

Each group's own values are checked by its schema (``gptmini.training.run.schema``); what depends on several groups
or on the machine (the precision, the optimizer under a strategy, CPU processes, the resume checkpoint) is
checked here. Nothing here imports Lightning or prepares data: a bad run fails within the time it takes to import
torch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from gptmini.fileio import name_too_long, unwritable_reason
from gptmini.model import GPTConfig
from gptmini.training import hardware
from gptmini.training.errors import RunError
from gptmini.training.hardware import FLOAT16_AMP, DeviceFacts, resolve_precision
from gptmini.training.run.resume import continued_event_folder, read_resume
from gptmini.training.run.schema import (
    DataSchema,
    TokenizerSchema,
    TrainerSchema,
    check_finite,
    check_top_level,
    typed_group,
)

log = logging.getLogger(__name__)

# the placeholder vocabulary of a model whose tokenizer's is known only once the data is prepared
VOCAB_PLACEHOLDER = 50257
# the char tokenizer's stand-in where the vocabulary's size matters before the corpus is read (an exact bigram table)
CHAR_VOCAB_PLACEHOLDER = 256


@dataclass(frozen=True)
class RunPlan:
    """What a run was checked to be, and the values derived from its config for the trainer, the data and the
    model."""

    model: GPTConfig  # vocab_size is a placeholder until the data is prepared when vocab_known is False
    vocab_known: bool
    trainer: TrainerSchema
    data: DataSchema | None  # None: a data module of the user's own (no schema)
    optimizer: Any  # the optimizer option's schema (AdamWSchema, MuonAdamWSchema, ...), or None
    scheduler: Any
    device: DeviceFacts
    precision: str  # trainer.precision made concrete for this machine
    val_check_interval: int | float | None  # trainer.val_check_interval, at most the run's training batches
    ckpt_path: str | None  # the checkpoint a resumed run starts from
    resume: dict[str, Any] | None  # that checkpoint, read once (memory-mapped)
    init_from: (
        str | None
    )  # model.init_from: the weights a fresh run starts from (checked with the input files)
    # the TensorBoard folder a resumed run logs on into (its first run's); None: a TensorBoard run of its own
    tensorboard_dir: str | None = None

    @property
    def training_batches(self) -> int:
        """Micro-batches one training process runs: trainer.max_steps x trainer.accumulate_grad_batches."""
        return self.trainer.max_steps * self.trainer.accumulate_grad_batches

    def trainer_overrides(self) -> dict[str, Any]:
        """What the plan decided for the Lightning Trainer, over the config's ``trainer`` node."""
        overrides: dict[str, Any] = {"precision": self.precision}
        if self.val_check_interval is not None:
            overrides["val_check_interval"] = self.val_check_interval
        return overrides


def plan_run(cfg: DictConfig, device: DeviceFacts | None = None) -> RunPlan:
    """Cheap checks of everything a run needs; raises ConfigError/RunError (or CheckpointError for a resume
    checkpoint that is unsafe or of another model shape) naming the key. ``device``: this machine's by default."""
    _check_missing(cfg)
    check_finite(cfg)
    model, vocab_known = _model_config(cfg)
    TokenizerSchema(
        name=str(cfg.tokenizer.name),
        vocab_size=cfg.tokenizer.get("vocab_size"),
        train_bytes=cfg.tokenizer.get("train_bytes"),
    ).check()
    optimizer = typed_group(cfg, "optimizer")
    scheduler = typed_group(cfg, "scheduler")
    trainer: TrainerSchema = typed_group(cfg, "trainer") or TrainerSchema()
    data: DataSchema | None = typed_group(cfg, "data")
    check_top_level(cfg)
    _check_optimizer_under_trainer(cfg.optimizer, optimizer, trainer)
    device = hardware.detect_device() if device is None else device
    precision = _precision(cfg, trainer, device)
    _check_cpu_processes(trainer, device)
    _check_data_dir(cfg.data.get("data_dir"))
    init_from = cfg.model.get("init_from")
    if init_from and cfg.get("ckpt_path") is not None:
        # a resumed run continues its own weights: init_from would be silently ignored
        raise RunError(
            f"model.init_from={init_from} and ckpt_path={cfg.ckpt_path} both say where the weights come from: "
            "drop model.init_from to resume that run, or drop ckpt_path to start a new run from those weights"
        )
    resume = read_resume(cfg, model, vocab_known) if cfg.get("ckpt_path") is not None else None
    return RunPlan(
        model=model,
        vocab_known=vocab_known,
        trainer=trainer,
        data=data,
        optimizer=optimizer,
        scheduler=scheduler,
        device=device,
        precision=precision,
        val_check_interval=_val_check_interval(trainer),
        ckpt_path=resume[0] if resume else None,
        resume=resume[1] if resume else None,
        init_from=str(init_from) if init_from and not resume else None,
        tensorboard_dir=continued_event_folder(*resume, cfg.paths.output_root) if resume else None,
    )


def validate_config(cfg: DictConfig) -> GPTConfig:
    """``plan_run``'s checks, for callers that need only the checked model config."""
    return plan_run(cfg).model


def _check_missing(cfg: DictConfig) -> None:
    missing = sorted(OmegaConf.missing_keys(cfg))
    missing += [k for k in cfg.get("required", []) if OmegaConf.select(cfg, k) is None and k not in missing]
    if missing:
        hint = " (e.g. model.init_from=/path/to/hf/gpt2)" if "model.init_from" in missing else ""
        raise RunError(f"{', '.join(missing)} must be set for this run: pass {missing[0]}=...{hint}")


def _model_config(cfg: DictConfig) -> tuple[GPTConfig, bool]:
    """The model's config, checked by ``GPTConfig`` itself; a vocabulary not set yet is a placeholder (the
    tokenizer's, once the data is prepared, is checked again then)."""
    values = OmegaConf.to_container(cfg.model, resolve=True)
    values.pop("init_from", None)
    vocab_known = values["vocab_size"] is not None
    if not vocab_known:
        values["vocab_size"] = _vocab_placeholder(cfg, values)
    return GPTConfig.from_dict(values), vocab_known


def _vocab_placeholder(cfg: DictConfig, model: dict[str, Any]) -> int:
    """``VOCAB_PLACEHOLDER``, or for an exact bigram table (``model.bigram_embed`` without buckets, sized by the
    vocabulary squared) a size nearer the tokenizer's: 256 for the char tokenizer (the corpus's characters, known
    once the data is prepared, and checked then) and a BPE's ``tokenizer.vocab_size``."""
    if not model.get("bigram_embed") or model.get("bigram_buckets") is not None:
        return VOCAB_PLACEHOLDER
    name = str(cfg.tokenizer.name)
    if name == "char":
        return CHAR_VOCAB_PLACEHOLDER
    if name == "bpe" and cfg.tokenizer.get("vocab_size") is not None:
        return int(cfg.tokenizer.vocab_size)
    return VOCAB_PLACEHOLDER


def _check_optimizer_under_trainer(node: DictConfig, optimizer: Any, trainer: TrainerSchema) -> None:
    """An optimizer the trainer's strategy or precision cannot run: one that orthogonalises whole matrices under
    FSDP, and a fused AdamW step under float16 AMP with clipping."""
    if optimizer is not None and not getattr(optimizer, "runs_under_fsdp", True):
        if "fsdp" in trainer.strategy_name:
            target = str(node.get("_target_"))
            raise RunError(
                f"optimizer={target.rsplit('.', 1)[-1]} cannot run under FSDP (trainer.strategy="
                f"{trainer.strategy_name}): Muon orthogonalises each whole matrix, which FSDP shards across "
                "devices. Use trainer=ddp, or optimizer=adamw with FSDP"
            )
    clip = trainer.gradient_clip_val
    if node.get("fused") and clip and trainer.precision in FLOAT16_AMP:
        raise RunError(
            f"optimizer.fused=true cannot be combined with trainer.precision={trainer.precision} and "
            f"trainer.gradient_clip_val={clip:g}: float16's GradScaler would have the fused step unscale the "
            "gradients after they are clipped. Drop optimizer.fused (gptmini then picks the multi-tensor kernel) "
            "or set trainer.gradient_clip_val=0"
        )


def output_vocab(cfg: DictConfig) -> int | None:
    """The model's vocabulary before the data is prepared: ``model.vocab_size`` when set, else the tokenizer's
    when it is fixed (a BPE; its encoding is cached for the run); None for the char tokenizer, whose vocabulary
    is the corpus's characters (a few hundred at most in practice)."""
    if cfg.model.get("vocab_size") is not None:
        return int(cfg.model.vocab_size)
    name = str(cfg.tokenizer.name)
    if name == "char":
        return None
    if name == "bpe":
        return cfg.tokenizer.get("vocab_size")  # the vocabulary it will be trained to
    from gptmini.data.tokenizers import build_tokenizer

    return build_tokenizer(name).vocab_size


def _precision(cfg: DictConfig, trainer: TrainerSchema, device: DeviceFacts) -> str:
    """The GPU a run asks for exists, and ``trainer.precision`` made concrete for ``device`` (the vocabulary
    matters only for "auto" on a CPU with bf16 tiles, so the tokenizer is built only there)."""
    if trainer.accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        from hydra.core.hydra_config import HydraConfig

        # hardware=gpu (or an experiment naming it) sets trainer=gpu: name what the user chose
        chosen = HydraConfig.get().runtime.choices.get("hardware") if HydraConfig.initialized() else None
        raise RunError(
            "hardware=gpu asks for a CUDA GPU and no CUDA GPU is available on this machine (conf/hardware/gpu.yaml): "
            "use hardware=cpu, or run on a machine with a CUDA GPU"
            if chosen == "gpu"
            else "trainer.accelerator=gpu asks for a CUDA GPU and no CUDA GPU is available on this machine: use "
            "trainer=default or trainer=cpu, or run on a machine with a CUDA GPU"
        )
    settings = {"precision": trainer.precision, "accelerator": trainer.accelerator}
    cpu_bf16 = trainer.precision == "auto" and device.bf16 and not device.is_cuda
    return resolve_precision(settings, device, output_vocab(cfg) if cpu_bf16 else None)


def _check_cpu_processes(trainer: TrainerSchema, device: DeviceFacts) -> None:
    """Several CPU "devices" are several training processes (DDP over gloo): refused beyond the cores there
    are (each process would be slower than one alone), and said out loud when the config did not ask for DDP."""
    if not (
        trainer.accelerator == "cpu" or (trainer.accelerator == "auto" and not torch.cuda.is_available())
    ):
        return
    try:
        n = int(trainer.devices)
    except (TypeError, ValueError):
        return  # "auto" (one process on a CPU) or a list: Lightning checks those
    if n <= 1:
        return
    cores = hardware.cpu_cores()
    if n > cores:
        raise RunError(
            f"trainer.devices={n} on the CPU would start {n} training processes (DDP over gloo) on this machine's "
            f"{cores} CPU cores, each slower than one process alone: use trainer.devices={cores} or fewer "
            f"(e.g. trainer=ddp trainer.accelerator=cpu trainer.devices={cores}), or trainer.devices=1"
        )
    if trainer.strategy in (None, "auto"):
        log.warning(
            "trainer.devices=%d on the CPU: %d training processes (DDP over gloo) share this machine's %d cores, "
            "each with its own batch, so the global batch is %d x data.batch_size (trainer=ddp says so explicitly)",
            n,
            n,
            cores,
            n,
        )


def _check_data_dir(data_dir: Any) -> None:
    if data_dir and name_too_long(data_dir):
        raise RunError(
            f"the prepared-data folder {str(data_dir)[:80]}...: {name_too_long(data_dir)}; pass a shorter path "
            "(paths.data_root or data.data_dir)"
        )
    if data_dir and not (Path(data_dir) / "meta.json").is_file():
        reason = unwritable_reason(data_dir)
        if reason is not None:
            raise RunError(
                f"the prepared-data folder {data_dir} cannot be created: {reason}; pass paths.data_root=<a writable "
                "folder> (or data.data_dir=...)"
            )


def _val_check_interval(trainer: TrainerSchema) -> int | float | None:
    """``trainer.val_check_interval``, at most the run's training batches: a short run of a long recipe (an
    experiment's interval, trainer.max_steps lowered) validates once, at the end, rather than being refused."""
    every = trainer.val_check_interval
    batches = trainer.max_steps * trainer.accumulate_grad_batches
    if isinstance(every, int) and not isinstance(every, bool) and every > batches:
        log.warning(
            "trainer.val_check_interval=%d is more than the run's %d training batches (trainer.max_steps x "
            "trainer.accumulate_grad_batches): validating once, at the end (trainer.val_check_interval=%d)",
            every,
            batches,
            batches,
        )
        return batches
    return every
