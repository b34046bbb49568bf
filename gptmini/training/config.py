"""The run's configuration: its typed schema (a typo or a wrongly-typed value fails at composition, naming the
key) and the checks that run before any expensive work, plus checkpoint lookup for resuming. Every failure is
one message naming the config key, the bad value and what would be valid.

Nothing here imports Lightning or prepares data: a bad run fails within the time it takes to import torch.
"""

from __future__ import annotations

import glob
import logging
import math
import os
import re
import sys
import types
import typing
from dataclasses import dataclass, field, fields, make_dataclass
from pathlib import Path
from typing import Any, Literal, Optional

import torch
from hydra.core.config_store import ConfigStore
from hydra.experimental.callback import Callback as HydraCallback
from omegaconf import DictConfig, OmegaConf

from gptmini.checkpoint import CheckpointError, resolve_checkpoint
from gptmini.checkpoint import find_last_checkpoint as _find_last_checkpoint
from gptmini.data.corpora import EMBEDDED_SOURCES, is_url, path_problem, prepared_folder_name
from gptmini.fileio import unwritable_reason
from gptmini.limits import device_memory
from gptmini.model import GPT, GPTConfig
from gptmini.training.hardware import DeviceFacts, detect_device, register_hardware_configs

log = logging.getLogger(__name__)

# --- schema -------------------------------------------------------------------------------------------------


def _model_schema() -> type:
    """The ``model`` node's schema, derived from ``GPTConfig`` (its fields, types and defaults: one source), plus
    ``init_from``. ``vocab_size`` may be null: the tokenizer's vocabulary size, known once the data is prepared."""
    hints = typing.get_type_hints(GPTConfig)
    specs: list[tuple[str, Any, Any]] = []
    for f in fields(GPTConfig):
        if not f.init:
            continue  # derived fields (head_size, padded_vocab_size) are recomputed, never configured
        if f.name == "vocab_size":
            specs.append((f.name, Optional[int], field(default=None)))
        else:
            hint = hints[f.name]
            if isinstance(hint, types.UnionType):  # OmegaConf reads typing.Optional, not `int | None`
                hint = typing.Union[typing.get_args(hint)]  # noqa: UP007
            specs.append((f.name, hint, field(default=f.default)))
    # Load weights before training: a Hugging Face GPT-2 or Llama directory (config.json + model.safetensors).
    specs.append(("init_from", Optional[str], field(default=None)))
    return make_dataclass("ModelSchema", specs)


ModelSchema = _model_schema()


@dataclass
class TokenizerSchema:
    name: str = "gpt2"


@dataclass
class PathsSchema:
    data_root: str = "data"
    output_root: str = "outputs"
    output_dir: str = "${hydra:runtime.output_dir}"


@dataclass
class PerfSchema:
    # Peak dense FLOP/s of one device, for perf/mfu; null: looked up by the GPU's name (gptmini.training.hardware)
    peak_flops: Optional[float] = None


@dataclass
class TrainSchema:
    model: ModelSchema = field(default_factory=ModelSchema)
    tokenizer: TokenizerSchema = field(default_factory=TokenizerSchema)
    paths: PathsSchema = field(default_factory=PathsSchema)
    perf: PerfSchema = field(default_factory=PerfSchema)
    # Groups whose content is instantiated (_target_) are checked by their targets' signatures.
    data: Any = field(default_factory=dict)
    optimizer: Any = field(default_factory=dict)
    scheduler: Any = None
    trainer: Any = field(default_factory=dict)
    callbacks: Any = field(default_factory=dict)
    logger: Any = field(default_factory=dict)
    run_name: str = "default"
    seed: int = 1337
    # null: start fresh; "last": the most recently written last/on_exception checkpoint of this run_name; or a path.
    ckpt_path: Optional[str] = None
    compile: bool = False
    # CPU speed: keep freed memory in the process instead of re-faulting it every step (gptmini.training.allocator).
    retain_freed_memory: bool = True
    # Steps between periodic "last.ckpt" saves (a hard kill loses at most this many steps).
    checkpoint_every_n_steps: int = 100
    # End training at the first validation with val/loss at or below this (callbacks.stop_at_target); null: never.
    target_val_loss: Optional[float] = None
    # Keys an experiment needs the user to set (a "???" cannot override a schema default when configs merge).
    required: list[str] = field(default_factory=list)


def register_configs() -> None:
    ConfigStore.instance().store(name="train_schema", node=TrainSchema)
    # hardware=auto (the default): an alias of hardware/gpu on a machine with a CUDA GPU, else of hardware/cpu
    register_hardware_configs()
    # ${attention_names:}: every causal attention in the registry, comma-separated, so a sweep over all of them
    # (conf/experiment/attention_sweep.yaml) picks up a newly registered implementation by itself
    if not OmegaConf.has_resolver("attention_names"):
        from gptmini.attention import available_attention

        OmegaConf.register_new_resolver("attention_names", lambda: ",".join(available_attention()))
    # ${prepared_folder:SOURCE,TOKENIZER}: the prepared-data folder name of a corpus, keyed by the corpus itself
    # (conf/data/text.yaml), so two corpora never share one folder
    if not OmegaConf.has_resolver("prepared_folder"):
        OmegaConf.register_new_resolver("prepared_folder", prepared_folder_name)


class RunError(ValueError):
    """A run cannot start as configured; the message says why and what to change."""


# Lightning's accepted precision inputs (lightning.fabric.connector._PRECISION_INPUT), plus our "auto".
PRECISIONS = (
    "auto",
    "32-true",
    "16-mixed",
    "bf16-mixed",
    "16-true",
    "bf16-true",
    "64-true",
    "transformer-engine",
    "transformer-engine-float16",
    "32",
    "16",
    "bf16",
    "64",
)
# float16 autocast, whose GradScaler keeps the gradients scaled until the optimizer step
FLOAT16_AMP = ("16-mixed", "16")


# --- checks that run before any expensive work --------------------------------------------------------------


def _on_gpu(accelerator: str, device: DeviceFacts) -> bool:
    return accelerator in ("gpu", "cuda") or (accelerator == "auto" and device.is_cuda)


# With AMX, bf16 pays on a CPU where the output layer's products dominate the step: on the default model the step
# measured slower in bf16 below this vocabulary and faster from it (docs/training.md, "What the default run does")
CPU_BF16_MIN_VOCAB = 8192


def output_vocab(cfg: DictConfig) -> int | None:
    """The model's vocabulary before the data is prepared: ``model.vocab_size`` when set, else the tokenizer's
    when it is fixed (a BPE; its encoding is cached for the run); None for the char tokenizer, whose vocabulary
    is the corpus's characters (a few hundred at most in practice)."""
    if cfg.model.get("vocab_size") is not None:
        return int(cfg.model.vocab_size)
    name = str(cfg.tokenizer.name)
    if name == "char":
        return None
    from gptmini.data.tokenizers import build_tokenizer

    return build_tokenizer(name).vocab_size


def resolve_precision(
    trainer_cfg: dict[str, Any], device: DeviceFacts | None = None, vocab_size: int | None = None
) -> str:
    """``trainer.precision`` made concrete for ``device`` (default: this machine's first GPU, else the CPU):
    "auto" -> bf16-mixed where matmuls run natively in bf16: a GPU from Ampere on, and a CPU with AMX tiles when
    the model's output layer is large (``vocab_size`` of at least ``CPU_BF16_MIN_VOCAB``; None: unknown, taken as
    small), where its products gain more than the model's small ones lose (docs/training.md, "What the default run does");
    else 32-true. Raises RunError for a value Lightning does not know or the device cannot run."""
    precision = str(trainer_cfg.get("precision", "auto"))
    accelerator = str(trainer_cfg.get("accelerator", "auto"))
    if precision not in PRECISIONS:
        raise RunError(f"trainer.precision={precision} is invalid: valid values are {', '.join(PRECISIONS)}")
    device = detect_device() if device is None else device
    on_gpu = _on_gpu(accelerator, device)
    if precision == "auto":
        if on_gpu:
            return "bf16-mixed" if device.bf16 else "32-true"
        # a CPU without AMX emulates bf16, slowly; a CPU run on a GPU machine keeps float32
        large_output = vocab_size is not None and vocab_size >= CPU_BF16_MIN_VOCAB
        return "bf16-mixed" if device.bf16 and not device.is_cuda and large_output else "32-true"
    if precision.startswith("bf16") and on_gpu and not device.bf16:
        raise RunError(
            f"trainer.precision={precision} is not supported by this GPU ({device.name}): "
            "use trainer.precision=16-mixed or 32-true"
        )
    if precision in ("16-mixed", "16") and not on_gpu:
        raise RunError(
            f"trainer.precision={precision} (float16 AMP) needs a CUDA GPU and this run is on the CPU: "
            "use trainer.precision=bf16-mixed or 32-true"
        )
    return precision


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _check_data_source(data: DictConfig) -> None:
    """A local corpus path that does not exist fails here, before Lightning is even imported."""
    source = data.get("source")
    if not isinstance(source, str) or not source:
        raise RunError(
            f"data.source={source!r} is invalid: expected 'shakespeare', a file, a folder, a glob or a URL"
        )
    if source in EMBEDDED_SOURCES or is_url(source):
        return
    if glob.has_magic(source):
        if not any(Path(p).is_file() for p in glob.iglob(source, recursive=True)):
            raise RunError(
                f"data.source={source!r} matches no files: check the pattern (quote it in the shell)"
            )
        return
    path = Path(source)
    problem = path_problem(path)
    if problem is not None:
        raise RunError(f"data.source={source} {problem}")
    if not path.exists():
        raise RunError(
            f"data.source={source} does not exist: expected 'shakespeare' (embedded), an existing text file, a "
            "folder or glob of text/JSONL/Parquet/Arrow files like 'texts/**/*.txt', or an http(s) URL"
        )
    if path.is_file() and path.stat().st_size == 0:
        raise RunError(f"data.source={source} is an empty file: point it at a UTF-8 text corpus")


def validate_config(cfg: DictConfig) -> GPTConfig:
    """Cheap checks of everything a run needs; raises ConfigError/RunError (or CheckpointError for a resume
    checkpoint that is unsafe or of another model shape) naming the key."""
    missing = sorted(OmegaConf.missing_keys(cfg))
    missing += [k for k in cfg.get("required", []) if OmegaConf.select(cfg, k) is None and k not in missing]
    if missing:
        hint = " (e.g. model.init_from=/path/to/hf/gpt2)" if "model.init_from" in missing else ""
        raise RunError(f"{', '.join(missing)} must be set for this run: pass {missing[0]}=...{hint}")

    _check_finite(cfg)
    model = OmegaConf.to_container(cfg.model, resolve=True)
    model.pop("init_from", None)
    vocab_known = model["vocab_size"] is not None
    if not vocab_known:
        model["vocab_size"] = 50257  # placeholder until the tokenizer is known; checked again later
        if model.get("bigram_embed") and str(cfg.tokenizer.name) == "char":
            # an exact bigram table is sized by the corpus's characters, known once the data is prepared
            model["vocab_size"] = 256
    gpt_config = GPTConfig.from_dict(model)

    tokenizer = str(cfg.tokenizer.name)
    from gptmini.data.tokenizers import available_tokenizers

    if tokenizer not in available_tokenizers():
        raise RunError(
            f"tokenizer.name={tokenizer!r} is unknown: valid names are {', '.join(available_tokenizers())}"
        )

    opt = cfg.optimizer
    if "lr" in opt and not float(opt.lr) > 0:
        raise RunError(
            f"optimizer.lr={opt.lr} is invalid: the learning rate must be > 0 (e.g. optimizer.lr=1e-3)"
        )
    if "weight_decay" in opt and float(opt.weight_decay) < 0:
        raise RunError(f"optimizer.weight_decay={opt.weight_decay} is invalid: it must be >= 0")
    _check_constructor_keys(opt, "optimizer")
    _check_role_optimizer(opt, cfg.trainer)
    sched = cfg.get("scheduler")
    if sched is not None:
        _check_constructor_keys(sched, "scheduler")
        if "decay_shape" in sched or "decay_fraction" in sched:
            from gptmini.training.schedulers import check_wsd

            try:
                check_wsd(
                    sched.get("decay_fraction", 0.3),
                    sched.get("min_lr_ratio", 0.0),
                    sched.get("decay_shape", "linear"),
                )
            except ValueError as err:
                raise RunError(str(err)) from None
        if int(sched.get("warmup_steps", 0)) < 0:
            raise RunError(f"scheduler.warmup_steps={sched.warmup_steps} is invalid: it must be >= 0")
        if "min_lr_ratio" in sched and not 0.0 <= float(sched.min_lr_ratio) <= 1.0:
            raise RunError(f"scheduler.min_lr_ratio={sched.min_lr_ratio} is invalid: it must be in [0, 1]")

    _check_ema((cfg.get("callbacks") or {}).get("ema"))
    tr = cfg.trainer
    max_steps = tr.get("max_steps", -1)
    if not _positive_int(max_steps):
        raise RunError(
            f"trainer.max_steps={max_steps} is invalid: it must be a positive number of optimizer steps"
        )
    accum = tr.get("accumulate_grad_batches", 1)
    if not _positive_int(accum):
        raise RunError(f"trainer.accumulate_grad_batches={accum} is invalid: it must be an integer >= 1")
    val_every = tr.get("val_check_interval")
    if isinstance(val_every, int) and not isinstance(val_every, bool):
        if val_every <= 0:
            raise RunError(
                f"trainer.val_check_interval={val_every} is invalid: it counts training batches and must be >= 1"
            )
        if val_every > max_steps * accum:
            # A short run of a long recipe (an experiment's interval, trainer.max_steps lowered): scaled down to
            # one validation at the end rather than refused, and said.
            log.warning(
                "trainer.val_check_interval=%d is more than the run's %d training batches (trainer.max_steps x "
                "trainer.accumulate_grad_batches): validating once, at the end (trainer.val_check_interval=%d)",
                val_every,
                max_steps * accum,
                max_steps * accum,
            )
            cfg.trainer.val_check_interval = max_steps * accum
    elif isinstance(val_every, float) and not 0.0 < val_every <= 1.0:
        raise RunError(f"trainer.val_check_interval={val_every} is invalid: a fraction must be in (0, 1]")
    clip = tr.get("gradient_clip_val")
    if clip is not None and float(clip) < 0:
        raise RunError(
            f"trainer.gradient_clip_val={clip} is invalid: it must be >= 0 (0 or null: no clipping)"
        )
    if opt.get("fused") and clip and str(tr.get("precision")) in FLOAT16_AMP:
        raise RunError(
            f"optimizer.fused=true cannot be combined with trainer.precision={tr.precision} and "
            f"trainer.gradient_clip_val={clip}: float16's GradScaler would have the fused step unscale the "
            "gradients after they are clipped. Drop optimizer.fused (gptmini then picks the multi-tensor kernel) "
            "or set trainer.gradient_clip_val=0"
        )

    data = cfg.data
    if not _positive_int(data.get("batch_size", 1)):
        raise RunError(f"data.batch_size={data.get('batch_size')} is invalid: it must be an integer >= 1")
    workers = data.get("num_workers", 0)
    if not (_positive_int(workers) or workers == 0):
        raise RunError(
            f"data.num_workers={workers} is invalid: it must be an integer >= 0 (0: load in the main process)"
        )
    if workers > max_loader_workers():
        # each worker is a process holding its own copy of the loader's state: far more of them than cores
        # only costs memory and start-up (and enough of them exhaust the machine's processes)
        raise RunError(
            f"data.num_workers={workers} is more than this machine can use: at most {max_loader_workers()} "
            f"loader processes here ({cpu_cores()} usable CPU cores x 4); lower it (0 loads in the main process)"
        )
    for key, low in (("shard_tokens", 1), ("buffer_mb", 1), ("prepare_threads", 1), ("val_stride", 1)):
        value = data.get(key)
        if value is not None and not (_positive_int(value) and value >= low):
            raise RunError(
                f"data.{key}={value} is invalid: it must be an integer >= {low}"
                + {
                    "prepare_threads": " (or null: one thread per core, at most 8)",
                    "val_stride": " (or null: non-overlapping windows, stride = block_size)",
                }.get(key, "")
            )
    val_fraction = float(data.get("val_fraction", 0.1))
    if not 0.0 <= val_fraction < 1.0:
        raise RunError(
            f"data.val_fraction={data.val_fraction} is invalid: it must be in [0, 1) (0.1 is a good default)"
        )
    target = cfg.get("target_val_loss")
    if target is not None:
        stoppers = [
            c
            for c in (cfg.get("callbacks") or {}).values()
            if c is not None and c.get("_target_") == "gptmini.training.guards.StopAtTargetLoss"
        ]
        if not stoppers:
            raise RunError(
                f"target_val_loss={target} needs the callback that stops there (callbacks.stop_at_target, in "
                "callbacks=default): drop target_val_loss or use callbacks=default"
            )
    seed = cfg.get("seed")
    if not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise RunError(f"seed={seed} is invalid: it must be an integer in [0, 2**32)")

    if str(tr.get("accelerator", "auto")) in ("gpu", "cuda") and not torch.cuda.is_available():
        raise RunError(
            "trainer.accelerator=gpu but no CUDA GPU is available on this machine: use trainer=auto or trainer=cpu"
        )
    resolve_precision(OmegaConf.to_container(tr, resolve=True))
    _check_cpu_devices(tr)
    data_dir = data.get("data_dir")
    if data_dir and not (Path(data_dir) / "meta.json").is_file():
        reason = unwritable_reason(data_dir)
        if reason is not None:
            raise RunError(
                f"the prepared-data folder {data_dir} cannot be created: {reason}; pass paths.data_root=<a writable "
                "folder> (or data.data_dir=...)"
            )
    if not _positive_int(cfg.checkpoint_every_n_steps):
        raise RunError(
            f"checkpoint_every_n_steps={cfg.checkpoint_every_n_steps} is invalid: it must be an integer >= 1"
        )

    if cfg.get("ckpt_path") is not None:
        # Refuse an unsafe or incompatible resume checkpoint now, not after preparing data and building a model.
        from gptmini.checkpoint import check_resume_compatible, load_checkpoint

        path = resolve_ckpt_path(cfg)
        ckpt = load_checkpoint(path, mmap=True)
        if "pytorch-lightning_version" not in ckpt or "optimizer_states" not in ckpt:
            raise RunError(
                f"ckpt_path={path} holds model weights only (imported from Hugging Face, or not written by a "
                "training run: no optimizer state, no progress), so there is no run to resume. To train from "
                f"these weights with a fresh optimizer, start a new run with model.init_from={path} and no ckpt_path"
            )
        check_resume_compatible(
            path, gpt_config.to_dict(), ignore=() if vocab_known else ("vocab_size",), ckpt=ckpt
        )
        check_resume_plan(path, ckpt, cfg)
    return gpt_config


def _world_size(trainer: Any) -> int | None:
    devices, nodes = trainer.get("devices", 1), trainer.get("num_nodes", 1)
    if isinstance(devices, int) and not isinstance(devices, bool) and isinstance(nodes, int):
        return max(devices, 1) * max(nodes, 1)
    return None  # "auto" or a list: known once the trainer exists


def check_resume_plan(path: str | Path, ckpt: dict[str, Any], cfg: DictConfig) -> None:
    """Refuses a resume that would not continue the run: a checkpoint already at ``trainer.max_steps`` (nothing
    would train, and the run would report no validation), or another global batch (``data.batch_size``,
    ``trainer.accumulate_grad_batches`` or the number of training processes): the resumed data stream and the
    progress count are positions in batches of the checkpoint's size."""
    step = int(ckpt.get("global_step") or 0)
    max_steps = int(cfg.trainer.max_steps)
    if step >= max_steps:
        raise RunError(
            f"checkpoint {path} is already at step {step} and trainer.max_steps={max_steps}: the run is finished "
            f"and resuming would train nothing. To train on, resume with a larger trainer.max_steps (e.g. "
            f"trainer.max_steps={max_steps + step}); to evaluate it, use the eval command"
        )
    saved = (ckpt.get("hyper_parameters") or {}).get("run_config") or {}
    saved_data, saved_trainer = saved.get("data") or {}, saved.get("trainer") or {}
    changes = []
    for key, was, now in (
        ("data.batch_size", saved_data.get("batch_size"), cfg.data.get("batch_size")),
        (
            "trainer.accumulate_grad_batches",
            saved_trainer.get("accumulate_grad_batches", 1 if saved_trainer else None),
            cfg.trainer.get("accumulate_grad_batches", 1),
        ),
        (
            "training processes (trainer.devices x trainer.num_nodes)",
            saved.get("world_size"),
            _world_size(cfg.trainer),
        ),
    ):
        if was is not None and now is not None and was != now:
            changes.append(f"{key}: checkpoint {was} vs now {now}")
    if changes:
        raise RunError(
            f"checkpoint {path} was trained with another batch ({'; '.join(changes)}): resuming would continue its "
            "data stream at the wrong place and count steps against the wrong epoch. Resume with the checkpoint's "
            f"settings, or start a new run from its weights (a fresh optimizer and schedule) with model.init_from={path}"
        )


# The config groups whose numbers must be finite (a NaN or inf learning rate, weight decay, clipping value, RoPE
# base or target loss trained into NaNs, or never stopped, without a word).
NUMERIC_GROUPS = ("model", "optimizer", "scheduler", "trainer", "data", "callbacks", "perf")


def _check_finite(cfg: DictConfig) -> None:
    def walk(node: Any, key: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{key}.{k}" if key else str(k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{key}[{i}]")
        elif isinstance(node, float) and not math.isfinite(node):
            raise RunError(f"{key}={node} is invalid: it must be a finite number")

    for group in NUMERIC_GROUPS:
        if group in cfg and cfg[group] is not None:
            walk(OmegaConf.to_container(cfg[group], resolve=False), group)
    target = cfg.get("target_val_loss")
    if isinstance(target, float) and not math.isfinite(target):
        raise RunError(f"target_val_loss={target} is invalid: a finite loss, or null (train to the end)")


# the parameter roles of a role-built optimizer's settings (optimizer.hidden.lr, ...)
ROLE_KEYS = ("hidden", "embedding", "head", "matrix", "vector")


def _check_role_optimizer(opt: DictConfig, tr: DictConfig) -> None:
    """An optimizer built from the model's parameter roles (``optimizer=muon``): its settings are per role, each
    role's lr and weight decay valid, and the strategy one it can run under."""
    target = opt.get("_target_")
    if not target:
        return
    from hydra.utils import get_class

    try:
        cls = get_class(str(target))
    except Exception:  # noqa: BLE001 - an unknown target is reported when it is instantiated
        return
    if not getattr(cls, "takes_parameter_roles", False):
        return
    import inspect

    accepted = set(inspect.signature(cls).parameters) - {"roles", "stacked"}
    extra = sorted(k for k in opt if k not in accepted and not str(k).startswith("_"))
    if extra:
        raise RunError(
            f"{', '.join(f'optimizer.{k}' for k in extra)} {'is not a setting' if len(extra) == 1 else 'are not settings'}"
            f" of {target}: its settings are per parameter "
            f"role ({', '.join(sorted(accepted - {'fused', 'foreach'}))}), e.g. optimizer.hidden.lr=0.02 (Muon) or "
            "optimizer.embedding.lr=3e-3 (AdamW); drop the flat key (an experiment written for optimizer=adamw sets "
            "optimizer.lr)"
        )
    from gptmini.training.optimizers import check_role_settings

    try:
        check_role_settings(OmegaConf.to_container(opt, resolve=True))
    except ValueError as err:
        raise RunError(str(err)) from None
    for role in ROLE_KEYS:
        group = opt.get(role) or {}
        if "lr" in group and not float(group.lr) > 0:
            raise RunError(f"optimizer.{role}.lr={group.lr} is invalid: the learning rate must be > 0")
        if "weight_decay" in group and float(group.weight_decay) < 0:
            raise RunError(f"optimizer.{role}.weight_decay={group.weight_decay} is invalid: it must be >= 0")
    strategy = tr.get("strategy", "auto")
    name = str(strategy.get("_target_", "") if isinstance(strategy, DictConfig) else strategy).lower()
    if "fsdp" in name:
        raise RunError(
            f"optimizer={target.rsplit('.', 1)[-1]} cannot run under FSDP (trainer.strategy={name}): Muon "
            "orthogonalises each whole matrix, which FSDP shards across devices. Use trainer=ddp, or "
            "optimizer=adamw with FSDP"
        )


def _check_ema(ema: Any) -> None:
    # callbacks.ema (an EMA of the weights): its decay and start step, before any work
    if not isinstance(ema, DictConfig) or "_target_" not in ema:
        return
    from hydra.utils import get_class

    from gptmini.training.ema import EMAWeightAveraging, check_ema

    try:
        cls = get_class(str(ema._target_))
    except Exception:  # noqa: BLE001 - an unknown target is reported when it is instantiated
        return
    if isinstance(cls, type) and issubclass(cls, EMAWeightAveraging):
        try:
            check_ema(ema.get("decay", 0.99), ema.get("start_step", 0))
        except ValueError as err:
            raise RunError(str(err)) from None


def _check_constructor_keys(node: DictConfig, group: str) -> None:
    """A partial built from ``group`` (``optimizer=adamw``, every scheduler) takes its constructor's keywords only: a
    key left by an experiment written for another choice of the group (the speedrun's ``optimizer.hidden.lr`` or
    ``scheduler.decay_fraction`` under ``optimizer=adamw scheduler=warmup_cosine``) would otherwise reach the
    constructor and fail in the middle of the start with a traceback."""
    import inspect

    from hydra.utils import get_class

    target = str(node.get("_target_") or "")
    try:
        cls = get_class(target)
    except Exception:  # noqa: BLE001 - an unknown target is reported when it is instantiated
        return
    if getattr(cls, "takes_parameter_roles", False):
        return  # settings per parameter role: _check_role_optimizer
    params = inspect.signature(cls).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    accepted = set(params) - {"params", "optimizer"}
    extra = sorted(str(k) for k in node if k not in accepted and not str(k).startswith("_"))
    if not extra:
        return
    one = len(extra) == 1
    drop = " ".join(f"~{group}.{k}" for k in extra)
    if group == "optimizer" and all(k in ROLE_KEYS for k in extra):
        hint = (
            f"{'it is a per-role setting' if one else 'they are per-role settings'} of optimizer=muon: use "
            f"optimizer=muon, or drop {'it' if one else 'them'} ({drop})"
        )
    else:
        hint = f"its settings are {', '.join(sorted(accepted))}; drop {'it' if one else 'them'} ({drop})"
    raise RunError(
        f"{', '.join(f'{group}.{k}' for k in extra)} {'is not a setting' if one else 'are not settings'} of "
        f"{target}: {hint}"
    )


def max_loader_workers() -> int:
    """The most data-loader processes a run may ask for: four per usable core, and never fewer than 8."""
    return max(8, 4 * cpu_cores())


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity mask, e.g. a container's share)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _check_cpu_devices(tr: DictConfig) -> None:
    """Several CPU "devices" are several training processes (DDP over gloo): refused beyond the cores there
    are (each process would be slower than one alone), and said out loud when the config did not ask for DDP."""
    accelerator = str(tr.get("accelerator", "auto"))
    if not (accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())):
        return
    devices = tr.get("devices", 1)
    try:
        n = int(devices)
    except (TypeError, ValueError):
        return  # "auto" (one process on a CPU) or a list: Lightning checks those
    if n <= 1:
        return
    cores = cpu_cores()
    if n > cores:
        raise RunError(
            f"trainer.devices={n} on the CPU would start {n} training processes (DDP over gloo) on this machine's "
            f"{cores} CPU cores, each slower than one process alone: use trainer.devices={cores} or fewer "
            f"(e.g. trainer=ddp trainer.accelerator=cpu trainer.devices={cores}), or trainer.devices=1"
        )
    strategy = tr.get("strategy", "auto")
    if strategy in (None, "auto"):
        log.warning(
            "trainer.devices=%d on the CPU: %d training processes (DDP over gloo) share this machine's %d cores, "
            "each with its own batch, so the global batch is %d x data.batch_size (trainer=ddp says so explicitly)",
            n,
            n,
            cores,
            n,
        )


def training_memory_estimate(
    config: GPTConfig, batch_size: int, precision: str = "32-true"
) -> dict[str, int]:
    """A lower bound of the memory (bytes) one training step of ``config`` on a batch of ``batch_size`` needs on
    one device, by part: the weights with their gradients and AdamW's two moments (16 bytes a parameter), the
    logits with their gradient, and the activations kept for the backward pass (10 values of width n_embd per
    token and layer; the attention matrices of implementations that materialise them are not counted)."""
    with torch.device("meta"):  # counts parameters without allocating or initialising them
        params = GPT(config).num_parameters()
    act = 2 if precision.startswith(("bf16", "16")) else 4  # bytes per activation value
    tokens = batch_size * config.block_size
    return {
        "weights, gradients and AdamW state": 16 * params,
        "logits and their gradient": 2 * act * tokens * config.padded_vocab_size,
        "activations": 10 * act * tokens * config.n_embd * config.n_layer,
    }


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def check_training_memory(
    config: GPTConfig,
    batch_size: int,
    precision: str,
    device: torch.device,
    processes: int = 1,
    available: tuple[int, str] | None = None,
) -> None:
    """Refuses a run whose training step cannot fit in the device's memory (``training_memory_estimate``, a
    lower bound, times ``processes`` sharing one machine's RAM), naming the largest part and the fix."""
    available = available or device_memory(device)
    if available is None:
        return
    parts = training_memory_estimate(config, batch_size, precision)
    need = sum(parts.values()) * (processes if device.type == "cpu" else 1)
    if need <= available[0]:
        return
    largest = max(parts, key=lambda k: parts[k])
    raise RunError(
        f"model.block_size={config.block_size} with data.batch_size={batch_size} needs at least {_gib(need)} of "
        f"memory for one training step ({largest}: {_gib(parts[largest])}) but {available[1]} has "
        f"{_gib(available[0])}: lower model.block_size or data.batch_size (trainer.accumulate_grad_batches keeps "
        "the global batch), or use a smaller model"
    )


def check_input_files(cfg: DictConfig) -> None:
    """The files a run reads, checked before anything else runs (the command line calls this before
    ``validate_config``; kept apart so that configs can be validated without the files existing)."""
    # '???' values are reported by validate_config.
    init_from = None if OmegaConf.is_missing(cfg.model, "init_from") else cfg.model.get("init_from")
    if init_from is not None:
        kind, path = resolve_init_from(init_from, cfg.paths.output_root)
        if kind == "checkpoint":
            from gptmini.checkpoint import load_checkpoint

            load_checkpoint(path, mmap=True)  # a gptmini checkpoint (trained or imported): refused if not one
        else:
            from gptmini.hf.formats import hf_model_type

            # a folder of a format gptmini cannot read (its model_type) is refused before the data is prepared
            hf_model_type(path)
    _check_data_files(cfg)


def _check_data_files(cfg: DictConfig) -> None:
    if "source" in cfg.data and not OmegaConf.is_missing(cfg.data, "source"):
        _check_data_source(cfg.data)


# --- resuming ---------------------------------------------------------------------------------------------


def find_last_checkpoint(output_root: str | Path, run_name: str) -> Path:
    """``ckpt_path=last``: :func:`gptmini.checkpoint.find_last_checkpoint`, the one rule every command uses (the
    most recently written last.ckpt or on_exception.ckpt of any run of ``run_name``, multirun jobs included)."""
    found = _find_last_checkpoint(output_root, run_name)
    if found is None:
        raise RunError(
            f"ckpt_path=last but no checkpoint of run_name={run_name!r} was found under "
            f"{Path(output_root) / run_name}: train first, or pass ckpt_path=/path/to/file.ckpt (and the run's "
            "run_name and paths.output_root)"
        )
    return found


def resolve_ckpt_path(cfg: DictConfig) -> str | None:
    """The checkpoint a run resumes from: None (a fresh run); ``last``: the newest checkpoint of the run folder
    itself when it already holds one (``hydra.run.dir`` given), else of any run of ``run_name``; else what
    :func:`gptmini.checkpoint.resolve_checkpoint` makes of it, the rule of every command (a file; a run folder or
    a run name under ``paths.output_root``: its newest checkpoint)."""
    if cfg.ckpt_path is None:
        return None
    if cfg.ckpt_path == "last":
        own = _find_last_checkpoint(cfg.paths.output_dir)
        if own is not None:
            return str(own)
        return str(find_last_checkpoint(cfg.paths.output_root, cfg.run_name))
    try:  # a file, a run folder or a run name, as every command opens one
        return str(resolve_checkpoint(cfg.ckpt_path, cfg.paths.output_root, option="ckpt_path"))
    except CheckpointError as err:
        raise RunError(str(err)) from None


def resolve_init_from(init_from: str, output_root: str | Path) -> tuple[Literal["checkpoint", "hf"], str]:
    """``model.init_from``: a Hugging Face GPT-2 or Llama folder (it holds config.json), else a gptmini
    checkpoint as every command opens one (a file, a run folder, a run name under ``output_root``)."""
    if (Path(init_from) / "config.json").is_file():
        return "hf", str(init_from)
    try:
        return "checkpoint", str(resolve_checkpoint(init_from, output_root, option="model.init_from"))
    except CheckpointError as err:
        raise RunError(
            f"{err} (or a local Hugging Face GPT-2 or Llama folder holding config.json and model.safetensors)"
        ) from None


# --- the run folder -----------------------------------------------------------------------------------------

# A run name is one folder name under paths.output_root: no separators, no "..", nothing hidden.
RUN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.,=+@-]*")


def check_run_name(name: Any) -> None:
    """Refuses a ``run_name`` that is not one plain folder name (``../x`` would write outside the output root,
    and ``last`` could not find it again)."""
    text = str(name)
    if not RUN_NAME.fullmatch(text) or ".." in text or len(text) > 200:
        raise RunError(
            f"run_name={text!r} is invalid: it names one folder under paths.output_root, so it may hold letters, "
            "digits and _ . , = + @ - (not starting with '.' or '-', no '/' and no '..'), e.g. run_name=my_run"
        )


# What a run writes into its folder: one of these there means the folder already holds a run.
RUN_FILES = (".hydra", "checkpoints", "tb", "train.log")


def check_run_folder_free(folder: str | Path, ckpt_path: Any, key: str) -> None:
    """A new run never writes into a folder that already holds something (another run's checkpoints, logs and
    TensorBoard events would be mixed with its own, and Lightning would silently resume the old ``last.ckpt``):
    refused unless the run resumes (``ckpt_path`` set), naming both ways out. An empty folder is used."""
    path = Path(folder)
    if ckpt_path is not None or not path.is_dir():
        return
    contents = sorted(p.name for p in path.iterdir())
    if not contents:
        return
    held = [name for name in RUN_FILES if name in contents]
    what = (
        f"already holds a run ({', '.join(held)})" if held else f"is not empty ({', '.join(contents[:3])}...)"
    )
    raise RunError(
        f"the run folder {folder} {what}: a new run never writes into it. Resume that run with ckpt_path=last "
        f"{key}={folder} (or ckpt_path={folder}), or start a new run in a folder of its own (another run_name, "
        f"or leave {key} unset)"
    )


def _refuse(err: RunError) -> None:
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        raise err
    # Hydra has not set up logging yet: the one line goes to stderr as the app's own errors do.
    sys.stderr.write(f"error: {err}\n")
    sys.exit(2)  # EXIT_USER_ERROR


def _refuse_unwritable(folder: str, key: str) -> None:
    reason = unwritable_reason(folder)
    if reason is not None:
        _refuse(RunError(f"cannot create the run folder {folder}: {reason}; pass {key}=<a writable folder>"))


def _one_of_several_processes() -> bool:
    """This process is one of a distributed launch (torchrun, srun, or a DDP process Lightning started in the
    first one's run folder): they share one run folder, which the launch names (hydra.run.dir) or the first
    process checked, so only a lone process checks that its folder is free."""

    def number(var: str, default: int) -> int:
        try:
            return int(os.environ.get(var, default))
        except ValueError:
            return default

    return (
        number("WORLD_SIZE", 1) > 1
        or number("SLURM_NTASKS", 1) > 1
        or any(number(v, 0) != 0 for v in ("RANK", "LOCAL_RANK", "SLURM_PROCID"))
    )


def _check_run_start(config: DictConfig, folder: str, key: str) -> None:
    try:
        check_run_name(config.get("run_name"))
        if not _one_of_several_processes():
            check_run_folder_free(folder, config.get("ckpt_path"), key)
    except RunError as err:
        _refuse(err)
    _refuse_unwritable(folder, "paths.output_root")


class OutputFolderCheck(HydraCallback):
    """A Hydra callback (``hydra.callbacks`` in conf/train.yaml), run before Hydra creates or writes anything:
    a ``run_name`` that is not one folder name, a run folder that already holds a run (unless resuming), and a
    run folder that cannot be created (an unwritable ``paths.output_root``, or a file in its place) each fail with
    one ``error:`` line and exit status 2, the existing folder untouched."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check_run_start(config, str(config.hydra.run.dir), "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check_run_start(config, str(config.hydra.sweep.dir), "hydra.sweep.dir")


# --- sweeps -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobFailed:
    """What a sweep job whose run failed returns in place of its val/loss (the app logged the error already): the
    sweep goes on to its next job, and ``SweepSummary`` reports it at the end."""

    exit_status: int
    message: str


class SweepSummary(HydraCallback):
    """A Hydra callback (``hydra.callbacks`` in conf/train.yaml): every job of a sweep (``-m``) runs, whichever
    fail; the sweep ends with one line per failed job (its overrides and error) and the exit status of the first
    failure (2: invalid input, 3: non-finite loss). Jobs run in this process (Hydra's basic launcher)."""

    def __init__(self) -> None:
        self.jobs = 0
        self.failed: list[tuple[str, JobFailed]] = []

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        from hydra.core.utils import JobStatus

        self.jobs += 1
        # (an unexpected exception, status FAILED, is raised by Hydra itself once the sweep's jobs have run)
        if job_return.status == JobStatus.COMPLETED and isinstance(job_return.return_value, JobFailed):
            self.failed.append((" ".join(job_return.overrides or []), job_return.return_value))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if not self.failed:
            return
        lines = [f"error: {len(self.failed)} of {self.jobs} sweep jobs failed:"]
        lines += [f"  [{overrides}] {failure.message}" for overrides, failure in self.failed]
        sys.stderr.write("\n".join(lines) + "\n")
        sys.exit(self.failed[0][1].exit_status)
