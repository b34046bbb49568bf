"""Which Hugging Face format a folder holds (its ``config.json``'s ``model_type``), and loading by it: what
``model.init_from=DIR`` and ``gptmini import`` use, for GPT-2, Llama and Qwen3 folders alike."""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gptmini.hf import gpt2, llama
from gptmini.hf.common import CONFIG_FILE, PYTORCH_FILE, SAFETENSORS_FILE, HFWeightsError, read_config_json
from gptmini.model import GPT, GPTConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HFFormat:
    architecture: str  # the transformers class that reads it
    check_config: Callable[[dict[str, Any], Path], None]  # refuses a config.json it cannot load
    model_config: Callable[..., GPTConfig]  # (config.json, attention=, dropout=): the folder's settings
    check: Callable[[GPTConfig, str], None]  # refuses a model the format cannot hold
    read: Callable[[Path, GPTConfig], Any]  # the weights, checked against the folder's settings
    copy: Callable[[GPT, Any], None]  # those weights into a model
    save: Callable[..., list[str]]  # (model, folder, tokenizer=, overwrite=): an export; the files written
    # what must agree for init_from: gptmini's resolved value -> (its setting, the config.json field)
    settings: dict[str, tuple[str, str]]
    positions: str  # the config.json field of the context length


_LLAMA = HFFormat(
    llama.ARCHITECTURES["llama"],
    llama.check_llama_config,
    llama.llama_model_config,
    functools.partial(llama.check_llama_model, fmt="llama"),
    llama.read_llama,
    llama.copy_llama,
    llama.save_hf_llama,
    {
        "n_layer": ("n_layer", "num_hidden_layers"),
        "n_head": ("n_head", "num_attention_heads"),
        "kv_heads": ("n_kv_head", "num_key_value_heads"),
        "n_embd": ("n_embd", "hidden_size"),
        "mlp_width": ("mlp_hidden", "intermediate_size"),
        "bias": ("bias", "attention_bias"),
        "tie_weights": ("tie_weights", "tie_word_embeddings"),
        "rope_base": ("rope_base", "rope_theta"),
        "norm_eps": ("norm_eps", "rms_norm_eps"),
    },
    "max_position_embeddings",
)
# by config.json's model_type
FORMATS = {
    "gpt2": HFFormat(
        gpt2.ARCHITECTURE,
        gpt2.check_gpt2_config,
        gpt2.gpt2_model_config,
        gpt2.check_gpt2_model,
        gpt2.read_gpt2,
        gpt2.copy_gpt2,
        gpt2.save_hf_gpt2,
        {
            **{k: (k, k) for k in ("n_layer", "n_head", "n_embd", "bias")},
            "gelu_approximate": ("gelu_approximate", "activation_function"),
        },
        "n_positions",
    ),
    "llama": _LLAMA,
    # Llama's block with q/k norms
    "qwen3": replace(
        _LLAMA,
        architecture=llama.ARCHITECTURES["qwen3"],
        check=functools.partial(llama.check_llama_model, fmt="qwen3"),
    ),
}


def _json(value: Any) -> Any:
    return str(value).lower() if isinstance(value, bool) else value


def hf_model_type(path: str | Path) -> str:
    """The ``model_type`` of a local Hugging Face folder, refused unless gptmini reads that format (GPT-2's
    original files carry none: "gpt2") and its ``config.json`` holds a model of it that gptmini can load."""
    return _read_config(Path(path))[0]


def _read_config(path: Path) -> tuple[str, dict[str, Any]]:
    holds = f"pass a Hugging Face GPT-2, Llama or Qwen3 folder ({CONFIG_FILE} + {SAFETENSORS_FILE} or {PYTORCH_FILE})"
    cfg = read_config_json(path, holds)
    model_type = cfg.get("model_type", "gpt2")
    if not isinstance(model_type, str) or model_type not in FORMATS:
        raise HFWeightsError(
            f"{path / CONFIG_FILE}: model_type={model_type!r} is not a format gptmini reads: "
            + ", ".join(f"{name} ({f.architecture})" for name, f in FORMATS.items())
        )
    FORMATS[model_type].check_config(cfg, path / CONFIG_FILE)
    return model_type, cfg


def load_hf_model(path: str | Path, *, attention: str = "sdpa", dropout: float = 0.0) -> GPT:
    """A gptmini ``GPT`` (in eval mode) holding the weights of a local GPT-2, Llama or Qwen3 folder, of the
    folder's settings (``block_size``: its context length)."""
    path = Path(path)
    model_type, cfg = _read_config(path)
    fmt = FORMATS[model_type]
    config = fmt.model_config(cfg, attention=attention, dropout=dropout)
    fmt.check(config, "load")
    model = GPT(config)
    fmt.copy(model, fmt.read(path, config))
    return model.eval()


def load_hf_weights(model: GPT, path: str | Path) -> None:
    """Fill ``model`` from a local GPT-2, Llama or Qwen3 folder (``model.init_from``).

    The model must have the folder's settings (``FORMATS``' table: shape, biases, tied embeddings, and the
    format's own such as the rope base) and blocks the format holds; its vocab_size may be larger (extra tokens
    start at the mean embedding) and its block_size smaller (a learned position table keeps its first rows;
    rotary positions have no table and also run longer, with a warning)."""
    path = Path(path)
    model_type, cfg = _read_config(path)  # checked before reading possibly large weights
    fmt, c = FORMATS[model_type], model.config
    fmt.check(c, "load")
    theirs = fmt.model_config(cfg)
    problems = []
    for ours, (setting, field) in fmt.settings.items():
        mine, folder = getattr(c, ours), getattr(theirs, ours)
        if not (math.isclose(mine, folder, rel_tol=1e-6) if isinstance(mine, float) else mine == folder):
            value = getattr(c, setting)
            shown = f"null ({mine})" if value is None else _json(value)
            problems.append(
                f"model.{setting}={shown} but the folder has {field}={_json(cfg.get(field, folder))}"
            )
    if c.vocab_size < theirs.vocab_size:
        problems.append(
            f"model.vocab_size={c.vocab_size} is smaller than the folder's vocab_size={theirs.vocab_size}"
        )
    longer = c.block_size > theirs.block_size
    if longer and c.position == "learned":
        problems.append(
            f"model.block_size={c.block_size} exceeds the folder's {fmt.positions}={theirs.block_size}"
        )
    if problems:
        raise HFWeightsError(
            f"the model does not match the {fmt.architecture} weights in {path} ({path / CONFIG_FILE}): "
            + "; ".join(problems)
            + " — set those model settings to the folder's values, or load the folder as it is with load_hf_model"
        )
    if longer:
        log.warning(
            "model.block_size=%d is longer than the %d positions %s was trained with (%s)",
            c.block_size,
            theirs.block_size,
            path,
            fmt.positions,
        )
    fmt.copy(model, fmt.read(path, theirs))
