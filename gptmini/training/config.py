"""The run's configuration: its typed schema (a typo or a wrongly-typed value fails at composition, naming the
key) and the checks that run before any expensive work, plus checkpoint lookup for resuming. Every failure is
one message naming the config key, the bad value and what would be valid.

Nothing here imports Lightning or prepares data: a bad run fails within the time it takes to import torch.
"""

from __future__ import annotations

import glob
import os
import typing
from dataclasses import dataclass, field, fields, make_dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from gptmini.data.corpora import EMBEDDED_SOURCES, is_url
from gptmini.model import GPTConfig

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
            specs.append((f.name, hints[f.name], field(default=f.default)))
    # Load weights before training: a Hugging Face GPT-2 directory (config.json + model.safetensors).
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
class TrainSchema:
    model: ModelSchema = field(default_factory=ModelSchema)
    tokenizer: TokenizerSchema = field(default_factory=TokenizerSchema)
    paths: PathsSchema = field(default_factory=PathsSchema)
    # Groups whose content is instantiated (_target_) are checked by their targets' signatures.
    data: Any = field(default_factory=dict)
    optimizer: Any = field(default_factory=dict)
    scheduler: Any = None
    trainer: Any = field(default_factory=dict)
    callbacks: Any = field(default_factory=dict)
    logger: Any = field(default_factory=dict)
    run_name: str = "default"
    seed: int = 1337
    # null: start fresh; "last": the newest last/on_exception checkpoint of this run_name; or a path.
    ckpt_path: Optional[str] = None
    compile: bool = False
    # CPU speed: keep freed memory in the process instead of re-faulting it every step (gptmini.training.allocator).
    retain_freed_memory: bool = True
    # Steps between periodic "last.ckpt" saves (a hard kill loses at most this many steps).
    checkpoint_every_n_steps: int = 100
    # Keys an experiment needs the user to set (a "???" cannot override a schema default when configs merge).
    required: list[str] = field(default_factory=list)


def register_configs() -> None:
    ConfigStore.instance().store(name="train_schema", node=TrainSchema)
    # ${attention_names:}: every causal attention in the registry, comma-separated, so a sweep over all of them
    # (conf/experiment/attention_sweep.yaml) picks up a newly registered implementation by itself
    if not OmegaConf.has_resolver("attention_names"):
        from gptmini.attention import available_attention

        OmegaConf.register_new_resolver("attention_names", lambda: ",".join(available_attention()))


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


# --- checks that run before any expensive work --------------------------------------------------------------


def _on_gpu(accelerator: str) -> bool:
    return accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())


def resolve_precision(trainer_cfg: dict[str, Any]) -> str:
    """``trainer.precision`` made concrete for this machine ("auto" -> bf16-mixed on a bf16 GPU, else 32-true);
    raises RunError for a value Lightning does not know or this machine cannot run."""
    precision = str(trainer_cfg.get("precision", "auto"))
    accelerator = str(trainer_cfg.get("accelerator", "auto"))
    if precision not in PRECISIONS:
        raise RunError(f"trainer.precision={precision} is invalid: valid values are {', '.join(PRECISIONS)}")
    on_gpu = _on_gpu(accelerator)
    if precision == "auto":
        return "bf16-mixed" if on_gpu and torch.cuda.is_bf16_supported() else "32-true"
    if precision.startswith("bf16") and on_gpu and not torch.cuda.is_bf16_supported():
        raise RunError(
            f"trainer.precision={precision} is not supported by this GPU ({torch.cuda.get_device_name()}): "
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
    if not path.exists():
        raise RunError(
            f"data.source={source} does not exist: expected 'shakespeare' (embedded), an existing text file, a "
            "folder of *.txt files, a glob like 'texts/**/*.txt', or an http(s) URL"
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

    model = OmegaConf.to_container(cfg.model, resolve=True)
    model.pop("init_from", None)
    vocab_known = model["vocab_size"] is not None
    if not vocab_known:
        model["vocab_size"] = 50257  # placeholder until the tokenizer is known; checked again later
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
    sched = cfg.get("scheduler")
    if sched is not None:
        if int(sched.get("warmup_steps", 0)) < 0:
            raise RunError(f"scheduler.warmup_steps={sched.warmup_steps} is invalid: it must be >= 0")
        if "min_lr_ratio" in sched and not 0.0 <= float(sched.min_lr_ratio) <= 1.0:
            raise RunError(f"scheduler.min_lr_ratio={sched.min_lr_ratio} is invalid: it must be in [0, 1]")

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
        if val_every <= 0 or val_every > max_steps * accum:
            raise RunError(
                f"trainer.val_check_interval={val_every} is invalid: it counts training batches and must be in "
                f"[1, {max_steps * accum}] (trainer.max_steps x trainer.accumulate_grad_batches)"
            )
    elif isinstance(val_every, float) and not 0.0 < val_every <= 1.0:
        raise RunError(f"trainer.val_check_interval={val_every} is invalid: a fraction must be in (0, 1]")
    clip = tr.get("gradient_clip_val")
    if clip is not None and float(clip) < 0:
        raise RunError(
            f"trainer.gradient_clip_val={clip} is invalid: it must be >= 0 (0 or null: no clipping)"
        )

    data = cfg.data
    if not _positive_int(data.get("batch_size", 1)):
        raise RunError(f"data.batch_size={data.get('batch_size')} is invalid: it must be an integer >= 1")
    if int(data.get("num_workers", 0)) < 0:
        raise RunError(
            f"data.num_workers={data.num_workers} is invalid: it must be >= 0 (0: load in the main process)"
        )
    val_fraction = float(data.get("val_fraction", 0.1))
    if not 0.0 <= val_fraction < 1.0:
        raise RunError(
            f"data.val_fraction={data.val_fraction} is invalid: it must be in [0, 1) (0.1 is a good default)"
        )
    seed = cfg.get("seed")
    if not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise RunError(f"seed={seed} is invalid: it must be an integer in [0, 2**32)")

    if str(tr.get("accelerator", "auto")) in ("gpu", "cuda") and not torch.cuda.is_available():
        raise RunError(
            "trainer.accelerator=gpu but no CUDA GPU is available on this machine: use trainer=auto or trainer=cpu"
        )
    resolve_precision(OmegaConf.to_container(tr, resolve=True))
    if not _positive_int(cfg.checkpoint_every_n_steps):
        raise RunError(
            f"checkpoint_every_n_steps={cfg.checkpoint_every_n_steps} is invalid: it must be an integer >= 1"
        )

    if cfg.get("ckpt_path") is not None:
        # Refuse an unsafe or incompatible resume checkpoint now, not after preparing data and building a model.
        from gptmini.checkpoint import check_resume_compatible

        check_resume_compatible(
            resolve_ckpt_path(cfg), gpt_config.to_dict(), ignore=() if vocab_known else ("vocab_size",)
        )
    return gpt_config


def check_input_files(cfg: DictConfig) -> None:
    """The files a run reads, checked before anything else runs (the command line calls this before
    ``validate_config``; kept apart so that configs can be validated without the files existing)."""
    # '???' values are reported by validate_config.
    init_from = None if OmegaConf.is_missing(cfg.model, "init_from") else cfg.model.get("init_from")
    if init_from is not None and not (Path(init_from) / "config.json").is_file():
        raise RunError(
            f"model.init_from={init_from} is not a Hugging Face GPT-2 folder (no config.json there): pass a "
            "local folder holding config.json and model.safetensors"
        )
    if "source" in cfg.data and not OmegaConf.is_missing(cfg.data, "source"):
        _check_data_source(cfg.data)


# --- resuming ---------------------------------------------------------------------------------------------


def find_last_checkpoint(output_root: str | Path, run_name: str, exclude: str | Path | None = None) -> Path:
    """The newest ``last.ckpt`` / ``on_exception.ckpt`` among the runs of ``run_name``.

    Checkpoints are written atomically (temp file + rename), so any file found here is complete: a run killed
    while saving leaves its previous checkpoint in place and only a ``.last.ckpt.*.tmp`` file beside it."""
    root = Path(output_root) / run_name
    candidates = [
        p
        for pattern in (
            "*/checkpoints/last.ckpt",
            "*/checkpoints/on_exception.ckpt",
            "*/*/checkpoints/last.ckpt",
        )
        for p in root.glob(pattern)
        if exclude is None or Path(exclude).resolve() not in p.resolve().parents
    ]
    if not candidates:
        raise RunError(
            f"ckpt_path=last but no checkpoint of run_name={run_name!r} was found under {root}: train first, or "
            "pass ckpt_path=/path/to/file.ckpt (and the run's run_name and paths.output_root)"
        )
    return max(candidates, key=lambda p: p.stat().st_mtime)


def resolve_ckpt_path(cfg: DictConfig) -> str | None:
    if cfg.ckpt_path is None:
        return None
    if cfg.ckpt_path == "last":
        return str(find_last_checkpoint(cfg.paths.output_root, cfg.run_name, exclude=cfg.paths.output_dir))
    path = Path(cfg.ckpt_path)
    if not path.is_file():
        raise RunError(
            f"ckpt_path={cfg.ckpt_path} does not exist: pass an existing .ckpt file or ckpt_path=last"
        )
    if not os.access(path, os.R_OK):
        raise RunError(f"ckpt_path={cfg.ckpt_path} is not readable (permissions)")
    return str(path)
