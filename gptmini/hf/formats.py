"""Which Hugging Face format a folder holds (its ``config.json``'s ``model_type``), and loading by it: what
``model.init_from=DIR`` and ``gptmini import`` use, for GPT-2, Llama and Qwen3 folders alike."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gptmini.hf.common import CONFIG_FILE, HFWeightsError, read_config_json
from gptmini.hf.gpt2 import load_gpt2_weights, load_hf_gpt2
from gptmini.hf.llama import load_hf_llama, load_llama_weights
from gptmini.model import GPT


@dataclass(frozen=True)
class HFFormat:
    architecture: str  # the transformers class that reads it
    load_weights: Callable[[GPT, str | Path], None]  # into an existing model
    load_model: Callable[[str | Path], GPT]  # a new model of the folder's settings


# by config.json's model_type
FORMATS = {
    "gpt2": HFFormat("GPT2LMHeadModel", load_gpt2_weights, load_hf_gpt2),
    "llama": HFFormat("LlamaForCausalLM", load_llama_weights, load_hf_llama),
    "qwen3": HFFormat("Qwen3ForCausalLM", load_llama_weights, load_hf_llama),  # Llama's block with q/k norms
}


def hf_model_type(path: str | Path) -> str:
    """The ``model_type`` of a local Hugging Face folder, refused unless gptmini reads that format (GPT-2's
    original files carry none: "gpt2")."""
    path = Path(path)
    holds = f"pass a Hugging Face GPT-2, Llama or Qwen3 folder ({CONFIG_FILE} + model.safetensors)"
    model_type = read_config_json(path, holds).get("model_type", "gpt2")
    if not isinstance(model_type, str) or model_type not in FORMATS:
        raise HFWeightsError(
            f"{path / CONFIG_FILE}: model_type={model_type!r} is not a format gptmini reads: "
            + ", ".join(f"{name} ({f.architecture})" for name, f in FORMATS.items())
        )
    return model_type


def load_hf_model(path: str | Path) -> GPT:
    """A gptmini ``GPT`` (in eval mode) from a local GPT-2, Llama or Qwen3 folder."""
    return FORMATS[hf_model_type(path)].load_model(path)


def load_hf_weights(model: GPT, path: str | Path) -> None:
    """Fill ``model`` from a local GPT-2, Llama or Qwen3 folder (``model.init_from``); the model's settings must fit
    the folder (each format's loader names what differs)."""
    FORMATS[hf_model_type(path)].load_weights(model, path)
