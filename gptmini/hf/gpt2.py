"""GPT-2 weights in and out, in the Hugging Face format (``config.json`` + ``model.safetensors``); the commands
are in docs/export-import.md.

Hugging Face GPT-2 stores its projections as ``Conv1D`` weights of shape (in, out): the transpose of
``nn.Linear``'s (out, in). Keys may carry a ``transformer.`` prefix (what ``GPT2LMHeadModel.save_pretrained``
writes) or not (the original ``openai-community/gpt2`` files); both are accepted. Nothing here downloads.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from gptmini.attention import ATTENTION_REGISTRY, AttentionWeights, available_attention
from gptmini.hf.common import (
    BOOLEAN,
    CONFIG_FILE,
    INTEGER,
    NULL,
    NUMBER,
    STRING,
    HFWeightsError,
    check_json_types,
    export_tensor,
    read_state,
    refuse_extras,
    vocab_rows,
    write_export,
    wrong_shapes,
)
from gptmini.model import GPT, GPTConfig

__all__ = ["HFWeightsError", "save_hf_gpt2"]


# Hugging Face's activation_function names -> model.gelu_approximate
_GELUS = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "none"}
_LN_EPS = 1e-5  # GPT-2's layer_norm_epsilon and nn.LayerNorm's default
GPT2_EOT = 50256  # <|endoftext|> in the GPT-2 BPE
ARCHITECTURE = "GPT2LMHeadModel"  # the transformers class that reads the format
# per-layer buffers of old checkpoints (causal mask, masked-score constant): not weights, ignored
_IGNORED = re.compile(r"^h\.\d+\.attn\.(bias|masked_bias)$")


# --- reading ------------------------------------------------------------------------------------------------


GPT2_CONFIG_TYPES: dict[str, tuple[str, ...]] = {
    "model_type": (STRING,),
    "n_embd": (INTEGER,),
    "n_layer": (INTEGER,),
    "n_head": (INTEGER,),
    "vocab_size": (INTEGER,),
    "n_positions": (INTEGER,),
    "n_ctx": (INTEGER,),
    "activation_function": (STRING,),
    "n_inner": (INTEGER, NULL),
    "layer_norm_epsilon": (NUMBER,),
    "scale_attn_by_inverse_layer_idx": (BOOLEAN,),
    "scale_attn_weights": (BOOLEAN,),
    "add_cross_attention": (BOOLEAN,),
    "tie_word_embeddings": (BOOLEAN,),
}


def check_gpt2_config(cfg: dict[str, Any], where: Path) -> None:
    """Refuse a ``config.json`` gptmini cannot load as GPT-2; fills in GPT-2's activation where it names none."""
    cfg.setdefault("activation_function", "gelu_new")

    def bad(msg: str) -> HFWeightsError:
        return HFWeightsError(f"{where}: {msg}; gptmini only loads the original GPT-2 architecture")

    check_json_types(cfg, GPT2_CONFIG_TYPES, bad)

    for key in ("n_embd", "n_layer", "n_head", "vocab_size"):
        if not isinstance(cfg.get(key), int) or isinstance(cfg.get(key), bool) or cfg[key] <= 0:
            raise bad(f"{key}={cfg.get(key)!r} is missing or not a positive integer")
    if not isinstance(cfg.get("n_positions", cfg.get("n_ctx")), int):
        raise bad("n_positions is missing or not an integer")
    act = cfg["activation_function"]
    if act not in _GELUS:
        raise bad(f"activation_function={act!r} is unsupported (gptmini's MLP reads {', '.join(_GELUS)})")
    n_inner = cfg.get("n_inner")
    if n_inner is not None and n_inner != 4 * cfg["n_embd"]:
        raise bad(
            f"n_inner={n_inner} is unsupported (gptmini's MLP is 4 * n_embd = {4 * cfg['n_embd']} wide)"
        )
    eps = cfg.get("layer_norm_epsilon", _LN_EPS)
    if not math.isclose(float(eps), _LN_EPS, rel_tol=1e-6):
        raise bad(f"layer_norm_epsilon={eps} is unsupported (gptmini's LayerNorm uses {_LN_EPS})")
    if cfg.get("scale_attn_by_inverse_layer_idx", False):
        raise bad("scale_attn_by_inverse_layer_idx=true is unsupported (attention scores scaled by 1/layer)")
    if not cfg.get("scale_attn_weights", True):
        raise bad(
            "scale_attn_weights=false is unsupported (gptmini always scales scores by 1/sqrt(head_size))"
        )
    if cfg.get("add_cross_attention", False):
        raise bad("add_cross_attention=true is unsupported (an encoder-decoder variant)")
    if not cfg.get("tie_word_embeddings", True):
        raise bad("tie_word_embeddings=false is unsupported (gptmini ties lm_head to wte for GPT-2 weights)")
    # reorder_and_upcast_attn only changes the float precision of the score computation, not the function.
    if cfg["n_embd"] % cfg["n_head"] != 0:
        raise bad(f"n_embd={cfg['n_embd']} is not divisible by n_head={cfg['n_head']}")


def gpt2_model_config(cfg: dict[str, Any], *, attention: str = "sdpa", dropout: float = 0.0) -> GPTConfig:
    """The gptmini settings of a (validated) GPT-2 ``config.json``; HF's *_pdrop values are training settings and
    are not copied."""
    return GPTConfig(
        vocab_size=cfg["vocab_size"],
        block_size=int(cfg.get("n_positions", cfg.get("n_ctx"))),
        n_layer=cfg["n_layer"],
        n_head=cfg["n_head"],
        n_embd=cfg["n_embd"],
        dropout=dropout,
        bias=True,
        attention=attention,
        tie_weights=True,
        gelu_approximate=_GELUS[cfg["activation_function"]],
    )


def _expected_shapes(c: GPTConfig) -> dict[str, tuple[int, ...]]:
    d, vocab, n_pos = c.n_embd, c.vocab_size, c.block_size
    shapes: dict[str, tuple[int, ...]] = {
        "wte.weight": (vocab, d),
        "wpe.weight": (n_pos, d),
        "ln_f.weight": (d,),
        "ln_f.bias": (d,),
    }
    for i in range(c.n_layer):
        h = f"h.{i}."
        shapes |= {
            h + "ln_1.weight": (d,),
            h + "ln_1.bias": (d,),
            h + "attn.c_attn.weight": (d, 3 * d),  # Conv1D: (in, out)
            h + "attn.c_attn.bias": (3 * d,),
            h + "attn.c_proj.weight": (d, d),
            h + "attn.c_proj.bias": (d,),
            h + "ln_2.weight": (d,),
            h + "ln_2.bias": (d,),
            h + "mlp.c_fc.weight": (d, 4 * d),
            h + "mlp.c_fc.bias": (4 * d,),
            h + "mlp.c_proj.weight": (4 * d, d),
            h + "mlp.c_proj.bias": (d,),
        }
    return shapes


def read_gpt2(path: Path, config: GPTConfig) -> dict[str, Tensor]:
    """The state dict (keys without ``transformer.``, buffers dropped) of a folder whose settings are ``config``."""
    state = {k.removeprefix("transformer."): v for k, v in read_state(path).items()}
    state = {k: v for k, v in state.items() if not _IGNORED.match(k)}
    lm_head = state.pop("lm_head.weight", None)
    wrong = wrong_shapes(
        path,
        state,
        _expected_shapes(config),
        f"GPT-2 weights (n_layer={config.n_layer}, n_embd={config.n_embd})",
    )
    if wrong:
        raise HFWeightsError(f"{path}: tensor shapes do not match {CONFIG_FILE}: " + "; ".join(wrong[:8]))
    if lm_head is not None and not (
        lm_head.shape == state["wte.weight"].shape and torch.equal(lm_head, state["wte.weight"])
    ):
        raise HFWeightsError(
            f"{path}: lm_head.weight differs from wte.weight (untied output head); gptmini ties them for GPT-2"
        )
    return state


# --- mapping between the two layouts ------------------------------------------------------------------------


def gpt2_attention() -> list[str]:
    """The registered attentions whose weights are exactly GPT-2's fused q/k/v + output projection."""
    return [name for name in available_attention() if ATTENTION_REGISTRY[name].gpt2_compatible]


def check_gpt2_model(c: GPTConfig, what: str) -> None:
    """Raises HFWeightsError naming the first setting of ``c`` that GPT-2's format cannot hold."""
    if c.attention not in gpt2_attention():
        raise HFWeightsError(
            f"cannot {what} GPT-2 weights with model.attention={c.attention!r}: only "
            f"{', '.join(gpt2_attention())} hold GPT-2's q/k/v projections (use model.attention=sdpa)"
        )
    if c.position != "learned":
        raise HFWeightsError(
            f"cannot {what} GPT-2 weights with model.position={c.position!r}: GPT-2 learns a table of positions "
            "(use model.position=learned)"
        )
    refuse_extras(
        c,
        lambda setting, value: f"cannot {what} GPT-2 weights with model.{setting}={value}",
        "GPT-2",
        "plain multi-head attention",
    )
    block = {
        "norm": ("layernorm", "GPT-2 normalises with LayerNorm"),
        "mlp": ("gelu", "GPT-2's MLP is Linear, GELU, Linear"),
        "mlp_width": (4 * c.n_embd, "GPT-2's MLP is 4 * n_embd wide"),
    }
    # Llama's format holds RMSNorm + SwiGLU blocks: say so where an export is refused for them
    other = "; or export with --format llama" if what == "export" else ""
    for name, (wanted, why) in block.items():
        if getattr(c, name) != wanted:
            setting = "mlp_hidden" if name == "mlp_width" else name
            raise HFWeightsError(
                f"cannot {what} GPT-2 weights with model.{setting}={getattr(c, setting)}: {why} "
                f"(use model.{setting}={'null' if name == 'mlp_width' else wanted}{other})"
            )
    if what == "load" and not math.isclose(c.norm_eps, _LN_EPS, rel_tol=1e-6):
        raise HFWeightsError(
            f"cannot load GPT-2 weights with model.norm_eps={c.norm_eps}: GPT-2's LayerNorm uses {_LN_EPS} "
            f"(use model.norm_eps={_LN_EPS})"
        )


@torch.no_grad()
def copy_gpt2(model: GPT, state: dict[str, Tensor]) -> None:
    c = model.config
    emb = vocab_rows(c, state["wte.weight"])
    model.wte.weight.copy_(emb)
    if not c.tie_weights:
        model.lm_head.weight.copy_(emb)
    model.wpe.weight.copy_(state["wpe.weight"][: c.block_size])  # a shorter context keeps the first positions
    model.ln_f.weight.copy_(state["ln_f.weight"])
    model.ln_f.bias.copy_(state["ln_f.bias"])
    for i, block in enumerate(model.blocks):
        h = f"h.{i}."
        for ln in ("ln_1", "ln_2"):
            getattr(block, ln).weight.copy_(state[h + ln + ".weight"])
            getattr(block, ln).bias.copy_(state[h + ln + ".bias"])
        block.attn.set_weights(
            AttentionWeights(
                qkv_weight=state[h + "attn.c_attn.weight"].t(),  # Conv1D (in, out) -> Linear (out, in)
                qkv_bias=state[h + "attn.c_attn.bias"],
                out_weight=state[h + "attn.c_proj.weight"].t(),
                out_bias=state[h + "attn.c_proj.bias"],
            )
        )
        block.mlp.c_fc.weight.copy_(state[h + "mlp.c_fc.weight"].t())
        block.mlp.c_fc.bias.copy_(state[h + "mlp.c_fc.bias"])
        block.mlp.c_proj.weight.copy_(state[h + "mlp.c_proj.weight"].t())
        block.mlp.c_proj.bias.copy_(state[h + "mlp.c_proj.bias"])


# --- writing ------------------------------------------------------------------------------------------------


def _hf_config_dict(model: GPT, eot: int | None = None) -> dict[str, Any]:
    c = model.config
    if eot is None:  # no tokenizer given: GPT-2's <|endoftext|> when the vocabulary holds it
        eot = GPT2_EOT if c.vocab_size > GPT2_EOT else None
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "gpt2",
        "vocab_size": c.vocab_size,
        "n_positions": c.block_size,
        "n_ctx": c.block_size,
        "n_embd": c.n_embd,
        "n_layer": c.n_layer,
        "n_head": c.n_head,
        "n_inner": None,
        "activation_function": "gelu_new" if c.gelu_approximate == "tanh" else "gelu",
        "resid_pdrop": c.dropout,
        "embd_pdrop": c.dropout,
        "attn_pdrop": c.dropout,
        "layer_norm_epsilon": model.ln_f.eps,
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": True,
        "use_cache": True,
        "bos_token_id": eot,
        "eos_token_id": eot,
        "torch_dtype": "float32",
    }


@torch.no_grad()
def _hf_state(model: GPT) -> dict[str, Tensor]:
    c = model.config
    state: dict[str, Tensor | None] = {
        "wte.weight": model.wte.weight[: c.vocab_size],
        "wpe.weight": model.wpe.weight,
        "ln_f.weight": model.ln_f.weight,
        "ln_f.bias": model.ln_f.bias,
    }
    for i, block in enumerate(model.blocks):
        h = f"h.{i}."
        attn = block.attn.get_weights()
        state |= {
            h + "ln_1.weight": block.ln_1.weight,
            h + "ln_1.bias": block.ln_1.bias,
            h + "attn.c_attn.weight": attn.qkv_weight.t(),  # Linear (out, in) -> Conv1D (in, out)
            h + "attn.c_attn.bias": attn.qkv_bias,
            h + "attn.c_proj.weight": attn.out_weight.t(),
            h + "attn.c_proj.bias": attn.out_bias,
            h + "ln_2.weight": block.ln_2.weight,
            h + "ln_2.bias": block.ln_2.bias,
            h + "mlp.c_fc.weight": block.mlp.c_fc.weight.t(),
            h + "mlp.c_fc.bias": block.mlp.c_fc.bias,
            h + "mlp.c_proj.weight": block.mlp.c_proj.weight.t(),
            h + "mlp.c_proj.bias": block.mlp.c_proj.bias,
        }
    shapes = _expected_shapes(model.config)  # a bias the model lacks (bias=false): zeros of its shape
    # the prefix GPT2LMHeadModel.save_pretrained writes; lm_head.weight is tied to wte and left out, as there
    return {
        "transformer." + k: torch.zeros(shapes[k]) if x is None else export_tensor(x)
        for k, x in state.items()
    }


def save_hf_gpt2(
    model: GPT, path: str | Path, *, overwrite: bool = False, tokenizer: Any | None = None
) -> list[str]:
    """Export ``model`` as a Hugging Face GPT-2 folder (float32) that ``GPT2LMHeadModel.from_pretrained`` loads,
    written as ``write_export`` writes (with the tokenizer's files when given); a model without biases gets zero
    biases. Returns the file names written."""
    check_gpt2_model(model.config, "export")
    if not model.config.tie_weights:
        raise HFWeightsError(
            "cannot export a model with tie_weights=false: GPT-2 ties lm_head to wte (train with model.tie_weights=true)"
        )
    config = _hf_config_dict(model, tokenizer.eot_id if tokenizer is not None else None)
    return write_export(
        path, _hf_state(model), config, tokenizer=tokenizer, model_config=model.config, overwrite=overwrite
    )
