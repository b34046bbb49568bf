"""Loading checkpoints safely: ``torch.load(weights_only=True)`` only, so a file from elsewhere cannot run code."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch

from gptmini.model import GPT, GPTConfig


class CheckpointError(ValueError):
    """A checkpoint cannot be used; the message names the file and the reason."""


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist: pass the path of a .ckpt file written by training")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        raise CheckpointError(
            f"refusing to load {path}: it contains pickled Python objects beyond tensors and plain data, which "
            "could run arbitrary code (loaded with weights_only=True). Only a checkpoint written by gptmini is "
            f"accepted. Detail: {str(err).splitlines()[0]}"
        ) from None
    except (RuntimeError, EOFError, OSError) as err:
        raise CheckpointError(f"{path} is not a readable checkpoint ({err}); it may be truncated or not a .ckpt") from None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise CheckpointError(f"{path} is not a gptmini/Lightning checkpoint (no 'state_dict' entry)")
    return ckpt


def _model_config(ckpt: dict[str, Any], path: str | Path) -> dict[str, Any]:
    hp = ckpt.get("hyper_parameters") or {}
    if "model_config" not in hp:
        raise CheckpointError(f"{path} has no model_config in its hyper-parameters: it was not written by gptmini")
    return dict(hp["model_config"])


def model_from_checkpoint(
    path: str | Path, map_location: str | torch.device = "cpu"
) -> tuple[GPT, dict[str, Any]]:
    """The plain ``GPT`` stored in a training checkpoint, and the run's resolved config (a dict)."""
    ckpt = load_checkpoint(path, map_location)
    config = GPTConfig.from_dict(_model_config(ckpt, path))
    model = GPT(config)
    state = {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    missing, unexpected = model.load_state_dict(state, strict=False)
    # lm_head.weight is the tied embedding: absent from nothing, but tolerate either spelling.
    missing = [k for k in missing if not (config.tie_weights and k == "lm_head.weight")]
    if missing or unexpected:
        raise CheckpointError(f"{path} does not match its own model config: missing {missing}, unexpected {unexpected}")
    model.eval()
    return model, dict(ckpt["hyper_parameters"].get("run_config") or {})


def check_resume_compatible(path: str | Path, model_config: dict[str, Any]) -> None:
    """Refuses to resume a run whose model differs from the checkpoint's, naming the differing fields."""
    saved = _model_config(load_checkpoint(path), path)
    keys = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "bias", "attention", "tie_weights",
            "pad_vocab_multiple")
    diff = {k: (saved.get(k), model_config.get(k)) for k in keys if saved.get(k) != model_config.get(k)}
    if diff:
        desc = ", ".join(f"model.{k}: checkpoint {a!r} vs config {b!r}" for k, (a, b) in diff.items())
        raise CheckpointError(
            f"checkpoint {path} was trained with a different model shape ({desc}): resume with the same model "
            "settings (e.g. the same experiment), or start a new run without ckpt_path"
        )
