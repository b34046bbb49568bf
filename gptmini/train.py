"""The Hydra app: ``python -m gptmini.train [overrides]`` (or ``gptmini-train``).

Order of work: check the config (cheap) -> prepare the data -> build the model -> fit. Known user errors end
the run with one line naming the key and the fix, and exit status 2; ``HYDRA_FULL_ERROR=1`` shows tracebacks.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import hydra
import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from gptmini.config import register_configs
from gptmini.model import ConfigError, GPTConfig

log = logging.getLogger("gptmini.train")

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")


class RunError(ValueError):
    """A run cannot start as configured; the message says why and what to change."""


def _user_errors() -> tuple[type[BaseException], ...]:
    from gptmini.checkpoint import CheckpointError
    from gptmini.data import DataError
    from gptmini.tokenizer import TokenizerError

    return (ConfigError, RunError, DataError, TokenizerError, CheckpointError, InstantiationException)


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


# --- the run ------------------------------------------------------------------------------------------------


def _quiet_lightning() -> None:
    # Lightning adds its own console handler when imported before logging is configured; Hydra's handlers
    # (console + the run's train.log) already get everything, so route Lightning through them only.
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    # With an OnExceptionCheckpoint, Lightning maps fit(ckpt_path=None) to "last" inside the fresh run folder
    # (always empty, so nothing is loaded) and warns about it; resuming is explicit here (ckpt_path=...).
    warnings.filterwarnings("ignore", message=r".*ckpt_path=None\)` was called without a model")
    warnings.filterwarnings("ignore", message=r".*is set, but there is no last checkpoint available")
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated")


def train(cfg: DictConfig) -> dict[str, Any]:
    import lightning as L

    _quiet_lightning()

    from gptmini.checkpoint import check_resume_compatible
    from gptmini.data import check_vocab, load_meta
    from gptmini.lit import GPTLightningModule

    gpt_config = validate_config(cfg)
    ckpt_path = resolve_ckpt_path(cfg)
    L.seed_everything(cfg.seed, workers=True)
    output_dir = Path(cfg.paths.output_dir)

    trainer_cfg = OmegaConf.to_container(cfg.trainer, resolve=True)
    trainer_cfg["precision"] = resolve_precision(trainer_cfg)
    callbacks = [instantiate(c) for c in cfg.callbacks.values() if c is not None and "_target_" in c]
    loggers = [instantiate(c) for c in cfg.logger.values() if c is not None and "_target_" in c]
    trainer: L.Trainer = instantiate(trainer_cfg, callbacks=callbacks, logger=loggers or False)

    # Prepare the data (cheap when already prepared) so the tokenizer's vocabulary sizes the model.
    global_batches = cfg.trainer.max_steps * trainer.accumulate_grad_batches
    datamodule = instantiate(cfg.data, train_samples=global_batches * cfg.data.batch_size * trainer.world_size)
    datamodule.prepare_data()
    tokenizer_vocab = datamodule.vocab_size
    model_dict = OmegaConf.to_container(cfg.model, resolve=True)
    init_from = model_dict.pop("init_from", None)
    if model_dict["vocab_size"] is None:
        model_dict["vocab_size"] = tokenizer_vocab
    check_vocab(model_dict["vocab_size"], load_meta(datamodule.data_dir))
    gpt_config = GPTConfig.from_dict(model_dict)
    if ckpt_path is not None:
        check_resume_compatible(ckpt_path, gpt_config.to_dict())

    run_config = OmegaConf.to_container(cfg, resolve=True)
    module = GPTLightningModule(
        model_config=gpt_config.to_dict(),
        optimizer=instantiate(cfg.optimizer),
        scheduler=instantiate(cfg.scheduler) if cfg.scheduler is not None else None,
        compile=cfg.compile,
        run_config=run_config,
    )
    if init_from and ckpt_path is None:
        from gptmini.hf import load_hf_weights

        load_hf_weights(module.model, init_from)
        log.info("initialised weights from %s", init_from)
    n_params = module.model.num_parameters()
    log.info(
        "model: %s parameters (%d layers, %d heads, %d wide, attention=%s), tokenizer %s (vocab %d)",
        f"{n_params:,}", gpt_config.n_layer, gpt_config.n_head, gpt_config.n_embd, gpt_config.attention,
        cfg.tokenizer.name, tokenizer_vocab,
    )

    if ckpt_path:
        log.info("resuming from %s", ckpt_path)
    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True if ckpt_path else None)

    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
    ckpt_dir = output_dir / "checkpoints"
    result = {
        "output_dir": str(output_dir),
        "checkpoint": str(ckpt_dir / "last.ckpt"),
        "best_checkpoint": str(ckpt_dir / "best.ckpt"),
        "global_step": trainer.global_step,
        "metrics": metrics,
    }
    if trainer.is_global_zero:
        val = metrics.get("val/loss")
        log.info(
            "done: %d steps, val/loss %s. Checkpoints: %s. TensorBoard logs: %s (open with `make tensorboard`, "
            "then http://localhost:6006). Sample: make sample CKPT=%s",
            trainer.global_step, f"{val:.4f}" if val is not None else "n/a", ckpt_dir, output_dir / "tb",
            ckpt_dir / "last.ckpt",
        )
    return result


register_configs()


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="train")
def _hydra_main(cfg: DictConfig) -> float | None:
    try:
        result = train(cfg)
    except _user_errors() as err:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        msg = str(err)
        if isinstance(err, InstantiationException) and err.__cause__ is not None:
            msg = f"{msg.splitlines()[0]} {err.__cause__}"
        log.error("error: %s", msg)
        sys.exit(2)
    return result["metrics"].get("val/loss")  # for sweepers that optimise a value


def main() -> None:
    _hydra_main()


if __name__ == "__main__":
    main()
