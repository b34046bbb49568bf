"""Checks that run before any expensive work, and checkpoint lookup for resuming. Every failure is one message
naming the config key, the bad value and what would be valid."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from gptmini.model import GPTConfig


class RunError(ValueError):
    """A run cannot start as configured; the message says why and what to change."""


# --- checks that run before any expensive work --------------------------------------------------------------


def resolve_precision(trainer_cfg: dict[str, Any]) -> str:
    precision = str(trainer_cfg.get("precision", "auto"))
    accelerator = str(trainer_cfg.get("accelerator", "auto"))
    on_gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
    if precision == "auto":
        return "bf16-mixed" if on_gpu and torch.cuda.is_bf16_supported() else "32-true"
    if precision.startswith("bf16") and on_gpu and not torch.cuda.is_bf16_supported():
        raise RunError(
            f"trainer.precision={precision} is not supported by this GPU ({torch.cuda.get_device_name()}): "
            "use trainer.precision=16-mixed or 32-true"
        )
    return precision


def validate_config(cfg: DictConfig) -> GPTConfig:
    """Cheap checks of everything a run needs; raises ConfigError/RunError naming the key."""
    model = OmegaConf.to_container(cfg.model, resolve=True)
    model.pop("init_from", None)
    if model["vocab_size"] is None:
        model["vocab_size"] = 50257  # placeholder until the tokenizer is known; checked again later
    gpt_config = GPTConfig.from_dict(model)

    opt = cfg.optimizer
    if "lr" in opt and not float(opt.lr) > 0:
        raise RunError(f"optimizer.lr={opt.lr} is invalid: the learning rate must be > 0 (e.g. optimizer.lr=1e-3)")
    tr = cfg.trainer
    max_steps = tr.get("max_steps", -1)
    if max_steps is None or int(max_steps) <= 0:
        raise RunError(f"trainer.max_steps={max_steps} is invalid: it must be a positive number of optimizer steps")
    accum = int(tr.get("accumulate_grad_batches", 1))
    if accum <= 0:
        raise RunError(f"trainer.accumulate_grad_batches={accum} is invalid: it must be >= 1")
    if cfg.data.get("batch_size", 1) <= 0:
        raise RunError(f"data.batch_size={cfg.data.batch_size} is invalid: it must be >= 1")
    if str(tr.get("accelerator", "auto")) in ("gpu", "cuda") and not torch.cuda.is_available():
        raise RunError(
            "trainer.accelerator=gpu but no CUDA GPU is available on this machine: use trainer=auto or trainer=cpu"
        )
    resolve_precision(OmegaConf.to_container(tr, resolve=True))
    if cfg.checkpoint_every_n_steps <= 0:
        raise RunError(f"checkpoint_every_n_steps={cfg.checkpoint_every_n_steps} must be >= 1")
    return gpt_config


def find_last_checkpoint(output_root: str | Path, run_name: str, exclude: str | Path | None = None) -> Path:
    """The newest ``last.ckpt`` / ``on_exception.ckpt`` among the runs of ``run_name``."""
    root = Path(output_root) / run_name
    candidates = [
        p
        for pattern in ("*/checkpoints/last.ckpt", "*/checkpoints/on_exception.ckpt", "*/*/checkpoints/last.ckpt")
        for p in root.glob(pattern)
        if exclude is None or Path(exclude).resolve() not in p.resolve().parents
    ]
    if not candidates:
        raise RunError(
            f"ckpt_path=last but no checkpoint of run_name={run_name!r} was found under {root}: train first, or "
            "pass ckpt_path=/path/to/file.ckpt"
        )
    return max(candidates, key=lambda p: p.stat().st_mtime)


def resolve_ckpt_path(cfg: DictConfig) -> str | None:
    if cfg.ckpt_path is None:
        return None
    if cfg.ckpt_path == "last":
        return str(find_last_checkpoint(cfg.paths.output_root, cfg.run_name, exclude=cfg.paths.output_dir))
    path = Path(cfg.ckpt_path)
    if not path.is_file():
        raise RunError(f"ckpt_path={cfg.ckpt_path} does not exist: pass an existing .ckpt file or ckpt_path=last")
    return str(path)
