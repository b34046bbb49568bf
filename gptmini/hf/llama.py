"""Llama-style models in and out, in the Hugging Face Llama and Qwen3 formats (``config.json`` +
``model.safetensors``).

* ``save_hf_llama(model, dir, tokenizer=...)`` writes a folder that ``transformers.LlamaForCausalLM`` (or
  ``Qwen3ForCausalLM``) and ``AutoTokenizer`` load: the formats most serving and quantisation tools read for
  rotary, grouped-query models.
* ``gptmini.hf.formats`` reads such a folder into a new ``GPT`` or an existing one (``model.init_from=dir``).

A Llama block is a gptmini block with ``position=rope``, ``norm=rmsnorm``, ``mlp=swiglu`` (any ``n_kv_head``,
``mlp_hidden``, ``rope_base``, ``norm_eps``, tied or untied embeddings). gptmini's ``bias=true`` maps to Llama's
``attention_bias`` + ``mlp_bias``. A Qwen3 block is a Llama block whose queries and keys are RMS-normalised per
head first (``qk_norm=true``), without biases, one epsilon for every norm. Anything else (learned or ALiBi
positions, windows, sinks, gates, LayerNorm, GELU MLPs, other attention mechanisms) has no place in either format
and is refused, naming the setting.

Rotary positions pair a head's dimensions as halves (i, i + hs/2) in Hugging Face's Llama as in gptmini
(``gptmini.attention.rope``), so query and key rows are copied as they are (Meta's original checkpoints pair
neighbours (2i, 2i + 1): they are not this format).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from gptmini.attention import AttentionWeights
from gptmini.attention.sdpa import QK_NORM_EPS
from gptmini.hf.common import (
    BOOLEAN,
    CONFIG_FILE,
    INTEGER,
    NULL,
    NUMBER,
    OBJECT,
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

__all__ = ["check_llama_model", "save_hf_llama"]

# buffers older transformers versions saved with the weights: not weights, ignored on import
_IGNORED = re.compile(r"^model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq$")


# ---------------------------------------------------------------------------------------------------------
# what the format can hold
# ---------------------------------------------------------------------------------------------------------

# config.json's model_type -> the transformers class; Qwen3's block is Llama's with q/k norms
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}
# the attention options a Llama block has (grouped-query attention and rotary positions)
_LLAMA_OPTIONS = frozenset({"n_kv_head", "rope_base"})
_BLOCK = {
    "position": ("rope", "Llama's format has rotary positions only"),
    "norm": ("rmsnorm", "Llama's blocks normalise with RMSNorm"),
    "mlp": ("swiglu", "Llama's MLP is SwiGLU"),
}


def llama_format(config: GPTConfig) -> str:
    """The format of this family that holds ``config``'s attention: ``qwen3`` with q/k norms, else ``llama``."""
    return "qwen3" if config.qk_norm else "llama"


def check_llama_model(config: GPTConfig, what: str = "export", fmt: str | None = None) -> None:
    """Raises HFWeightsError naming the first setting of ``config`` that the format ``fmt`` (``llama`` or
    ``qwen3``; None: the one of ``llama_format``) cannot hold."""
    fmt = fmt or llama_format(config)
    qwen3 = fmt == "qwen3"
    refusals = {  # setting -> (the format cannot hold its value, why)
        "qk_norm": (
            config.qk_norm != qwen3,
            "Llama's blocks have no query/key norms, Qwen3's always have them: the other format holds this model",
        ),
        "bias": (qwen3 and config.bias, "Qwen3's MLP has no biases (train with model.bias=false)"),
        "norm_eps": (
            qwen3 and config.norm_eps != QK_NORM_EPS,
            f"Qwen3 has one epsilon for every norm and gptmini's q/k norms use {QK_NORM_EPS} (train with "
            f"model.norm_eps={QK_NORM_EPS})",
        ),
    }
    for setting, (wrong, why) in refusals.items():
        if wrong:
            value = getattr(config, setting)
            raise HFWeightsError(
                f"cannot {what} a model with model.{setting}={value} in {ARCHITECTURES[fmt]}'s format: {why}"
            )
    for setting, (wanted, why) in _BLOCK.items():
        value = getattr(config, setting)
        if value != wanted:
            raise HFWeightsError(
                f"cannot {what} a model with model.{setting}={value} in Llama's format: {why} "
                f"(train with model.{setting}={wanted}, e.g. model=llama_small)"
            )
    refuse_extras(
        config,
        lambda setting, value: f"cannot {what} a model with model.{setting}={value!r} in Llama's format",
        "Llama",
        "plain rotary grouped-query attention",
        allowed=_LLAMA_OPTIONS | {"qk_norm"},
    )
    if config.attention != "sdpa":  # rotary positions already need sdpa: this guards a future implementation
        raise HFWeightsError(
            f"cannot {what} a model with model.attention={config.attention!r} in Llama's format: use model.attention=sdpa"
        )


# ---------------------------------------------------------------------------------------------------------
# writing
# ---------------------------------------------------------------------------------------------------------


def _llama_config_dict(model: GPT, bos: int | None, eos: int | None) -> dict[str, Any]:
    c = model.config
    rope = {"rope_type": "default", "rope_theta": float(c.rope_base)}
    fmt = llama_format(c)
    return {
        "architectures": [ARCHITECTURES[fmt]],
        "model_type": fmt,
        "vocab_size": c.vocab_size,  # gptmini's padding rows are left out: their logits are -inf, never used
        "hidden_size": c.n_embd,
        "intermediate_size": c.mlp_width,
        "num_hidden_layers": c.n_layer,
        "num_attention_heads": c.n_head,
        "num_key_value_heads": c.kv_heads,
        "head_dim": c.head_size,
        "hidden_act": "silu",
        "max_position_embeddings": c.block_size,
        "rms_norm_eps": float(c.norm_eps),
        # transformers 5 reads rope_parameters, 4.x rope_theta (with rope_scaling null: plain RoPE)
        "rope_parameters": rope,
        "rope_theta": rope["rope_theta"],
        "rope_scaling": None,
        "attention_bias": c.bias,
        **({"mlp_bias": c.bias} if fmt == "llama" else {"use_sliding_window": False}),
        "attention_dropout": 0.0,
        "tie_word_embeddings": c.tie_weights,
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "use_cache": True,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": None,
        "torch_dtype": "float32",
    }


@torch.no_grad()
def _llama_state(model: GPT) -> dict[str, Tensor]:
    c = model.config

    t = export_tensor

    state = {
        "model.embed_tokens.weight": t(model.wte.weight[: c.vocab_size]),
        "model.norm.weight": t(model.ln_f.weight),
    }
    if not c.tie_weights:
        state["lm_head.weight"] = t(model.lm_head.weight[: c.vocab_size])
    for i, block in enumerate(model.blocks):
        p = f"model.layers.{i}."
        attn = block.attn.get_weights()
        (wq, bq), (wk, bk), (wv, bv) = attn.q_k_v()
        layer = {
            "input_layernorm.weight": t(block.ln_1.weight),
            "post_attention_layernorm.weight": t(block.ln_2.weight),
            "self_attn.q_proj.weight": t(wq),
            "self_attn.k_proj.weight": t(wk),
            "self_attn.v_proj.weight": t(wv),
            "self_attn.o_proj.weight": t(attn.out_weight),
            "mlp.gate_proj.weight": t(block.mlp.w_gate.weight),
            "mlp.up_proj.weight": t(block.mlp.w_up.weight),
            "mlp.down_proj.weight": t(block.mlp.c_proj.weight),
        }
        layer |= {f"self_attn.{name}": t(w) for name, w in attn.extra.items()}  # Qwen3's q_norm, k_norm
        if c.bias:
            layer |= {
                "self_attn.q_proj.bias": t(bq),
                "self_attn.k_proj.bias": t(bk),
                "self_attn.v_proj.bias": t(bv),
                "self_attn.o_proj.bias": t(attn.out_bias),
                "mlp.gate_proj.bias": t(block.mlp.w_gate.bias),
                "mlp.up_proj.bias": t(block.mlp.w_up.bias),
                "mlp.down_proj.bias": t(block.mlp.c_proj.bias),
            }
        state |= {p + k: v for k, v in layer.items()}
    return state


def save_hf_llama(
    model: GPT, path: str | Path, *, tokenizer: Any | None = None, overwrite: bool = False
) -> list[str]:
    """Export ``model`` as a Hugging Face Llama (or, with q/k norms, Qwen3) folder: ``config.json`` +
    ``model.safetensors`` (float32), and
    with ``tokenizer`` (a gptmini ``gpt2`` or ``char`` tokenizer) ``tokenizer.json`` + ``tokenizer_config.json``.
    Returns the file names written.

    Every check runs before anything is written, and the folder is written under a temporary name and renamed
    into place, so a refused or failed export leaves nothing behind; an existing non-empty folder is replaced
    only with ``overwrite=True``."""
    check_llama_model(model.config, "export")
    # GPT-2's <|endoftext|> both starts and ends documents
    bos = eos = tokenizer.eot_id if tokenizer is not None else None
    config = _llama_config_dict(model, bos, eos)
    return write_export(
        path, _llama_state(model), config, tokenizer=tokenizer, model_config=model.config, overwrite=overwrite
    )


# ---------------------------------------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------------------------------------


def _rope_theta(cfg: dict[str, Any], bad: Any) -> float:
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling")
    kind = params.get("rope_type", params.get("type", "default"))
    if scaling and scaling.get("rope_type", scaling.get("type", "default")) != "default":
        kind = scaling.get("rope_type", scaling.get("type"))
    if kind != "default":
        raise bad(f"rope_type={kind!r} (rotary scaling) is unsupported: gptmini's RoPE is the plain one")
    if float(params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))) != 1.0:
        raise bad("partial_rotary_factor is unsupported: gptmini rotates every dimension of a head")
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    if not isinstance(theta, (int, float)) or isinstance(theta, bool) or theta <= 1:
        raise bad(f"rope_theta={theta!r} is not a number > 1")
    return float(theta)


LLAMA_CONFIG_TYPES: dict[str, tuple[str, ...]] = {
    "model_type": (STRING,),
    "hidden_size": (INTEGER,),
    "intermediate_size": (INTEGER,),
    "num_hidden_layers": (INTEGER,),
    "num_attention_heads": (INTEGER,),
    "vocab_size": (INTEGER,),
    "max_position_embeddings": (INTEGER,),
    "num_key_value_heads": (INTEGER, NULL),
    "head_dim": (INTEGER, NULL),
    "hidden_act": (STRING,),
    "attention_bias": (BOOLEAN,),
    "mlp_bias": (BOOLEAN,),
    "rms_norm_eps": (NUMBER,),
    "tie_word_embeddings": (BOOLEAN,),
    "rope_theta": (NUMBER,),
    "partial_rotary_factor": (NUMBER,),
    "rope_parameters": (OBJECT, NULL),
    "rope_scaling": (OBJECT, NULL),
    "use_sliding_window": (BOOLEAN,),
}
ROPE_TYPES: dict[str, tuple[str, ...]] = {
    "rope_type": (STRING,),
    "type": (STRING,),
    "rope_theta": (NUMBER,),
    "partial_rotary_factor": (NUMBER,),
}


def check_llama_config(cfg: dict[str, Any], where: Path) -> None:
    def bad(msg: str) -> HFWeightsError:
        return HFWeightsError(
            f"{where}: {msg}; gptmini loads the Llama architecture as LlamaForCausalLM defines it"
        )

    check_json_types(cfg, LLAMA_CONFIG_TYPES, bad)
    for group in ("rope_parameters", "rope_scaling"):
        check_json_types(cfg.get(group) or {}, ROPE_TYPES, lambda m, g=group: bad(f"{g}.{m}"))

    keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
    for key in (*keys, "max_position_embeddings"):
        value = cfg.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise bad(f"{key}={value!r} is missing or not a positive integer")
    d, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads") or heads
    if d % heads or heads % kv:
        raise bad(
            f"hidden_size={d}, num_attention_heads={heads}, num_key_value_heads={kv} do not divide evenly"
        )
    head_dim = cfg.get("head_dim") or d // heads
    if head_dim * heads != d:
        raise bad(
            f"head_dim={head_dim} is unsupported: gptmini's heads are hidden_size / num_attention_heads wide"
        )
    if cfg.get("hidden_act", "silu") != "silu":
        raise bad(f"hidden_act={cfg.get('hidden_act')!r} is unsupported (gptmini's SwiGLU uses silu)")
    if bool(cfg.get("attention_bias", False)) != bool(cfg.get("mlp_bias", False)):
        raise bad(
            f"attention_bias={cfg.get('attention_bias')} with mlp_bias={cfg.get('mlp_bias')} is unsupported: "
            "gptmini's model.bias sets both"
        )
    eps = cfg.get("rms_norm_eps", 1e-6)
    if not isinstance(eps, (int, float)) or not 0 < eps < 1:
        raise bad(f"rms_norm_eps={eps!r} is not a small positive number")
    if cfg["model_type"] == "qwen3":
        if eps != QK_NORM_EPS:
            raise bad(
                f"rms_norm_eps={eps!r} is unsupported in Qwen3's format: gptmini's q/k norms use {QK_NORM_EPS}"
            )
        if cfg.get("use_sliding_window"):
            raise bad(
                "use_sliding_window=true is unsupported: gptmini's Qwen3 blocks attend to the whole context"
            )
    _rope_theta(cfg, bad)


def llama_model_config(cfg: dict[str, Any], *, attention: str = "sdpa", dropout: float = 0.0) -> GPTConfig:
    """The gptmini settings of a (validated) Llama or Qwen3 ``config.json``."""
    return GPTConfig(
        vocab_size=cfg["vocab_size"],
        block_size=cfg["max_position_embeddings"],
        n_layer=cfg["num_hidden_layers"],
        n_head=cfg["num_attention_heads"],
        n_kv_head=cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
        n_embd=cfg["hidden_size"],
        dropout=dropout,
        bias=bool(cfg.get("attention_bias", False)),
        attention=attention,
        tie_weights=bool(cfg.get("tie_word_embeddings", False)),
        position="rope",
        rope_base=_rope_theta(cfg, HFWeightsError),
        norm="rmsnorm",
        norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        mlp="swiglu",
        mlp_hidden=cfg["intermediate_size"],
        qk_norm=cfg["model_type"] == "qwen3",
    )


def _expected_shapes(config: GPTConfig) -> dict[str, tuple[int, ...]]:
    c = config
    d, kv, hidden = c.n_embd, c.kv_heads * c.head_size, c.mlp_width
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (c.vocab_size, d),
        "model.norm.weight": (d,),
    }
    for i in range(c.n_layer):
        p = f"model.layers.{i}."
        linears = {
            "self_attn.q_proj": (d, d),
            "self_attn.k_proj": (kv, d),
            "self_attn.v_proj": (kv, d),
            "self_attn.o_proj": (d, d),
            "mlp.gate_proj": (hidden, d),
            "mlp.up_proj": (hidden, d),
            "mlp.down_proj": (d, hidden),
        }
        shapes |= {p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,)}
        if c.qk_norm:
            shapes |= {
                p + "self_attn.q_norm.weight": (c.head_size,),
                p + "self_attn.k_norm.weight": (c.head_size,),
            }
        for name, shape in linears.items():
            shapes[p + name + ".weight"] = shape
            if c.bias:
                shapes[p + name + ".bias"] = shape[:1]
    return shapes


def read_llama(path: Path, config: GPTConfig) -> tuple[dict[str, Tensor], Tensor | None]:
    """The state dict (without lm_head) of a folder whose settings are ``config``, and its lm_head weight (None
    when tied)."""
    state = {k: v for k, v in read_state(path).items() if not _IGNORED.match(k)}
    lm_head = state.pop("lm_head.weight", None)
    wrong = wrong_shapes(
        path,
        state,
        _expected_shapes(config),
        f"Llama weights (num_hidden_layers={config.n_layer}, hidden_size={config.n_embd})",
    )
    vocab_shape = (config.vocab_size, config.n_embd)
    if config.tie_weights:
        if lm_head is not None and not torch.equal(lm_head, state["model.embed_tokens.weight"]):
            raise HFWeightsError(
                f"{path}: lm_head.weight differs from model.embed_tokens.weight but {CONFIG_FILE} says "
                "tie_word_embeddings=true"
            )
        lm_head = None
    elif lm_head is None:
        raise HFWeightsError(
            f"{path}: lm_head.weight is missing and {CONFIG_FILE} says tie_word_embeddings=false"
        )
    elif tuple(lm_head.shape) != vocab_shape:
        wrong.append(f"lm_head.weight: {tuple(lm_head.shape)} (expected {vocab_shape})")
    if wrong:
        raise HFWeightsError(f"{path}: tensor shapes do not match {CONFIG_FILE}: " + "; ".join(wrong[:8]))
    return state, lm_head


@torch.no_grad()
def copy_llama(model: GPT, weights: tuple[dict[str, Tensor], Tensor | None]) -> None:
    c, (state, lm_head) = model.config, weights
    model.wte.weight.copy_(vocab_rows(c, state["model.embed_tokens.weight"]))
    if not c.tie_weights:
        model.lm_head.weight.copy_(vocab_rows(c, lm_head))
    model.ln_f.weight.copy_(state["model.norm.weight"])

    for i, block in enumerate(model.blocks):
        layer = {
            k.removeprefix(f"model.layers.{i}."): v
            for k, v in state.items()
            if k.startswith(f"model.layers.{i}.")
        }
        get = layer.get  # a bias the model has no room for is absent (bias=false): None
        block.ln_1.weight.copy_(get("input_layernorm.weight"))
        block.ln_2.weight.copy_(get("post_attention_layernorm.weight"))
        qkv = [f"self_attn.{x}_proj" for x in "qkv"]
        block.attn.set_weights(
            AttentionWeights(
                qkv_weight=torch.cat([get(f"{p}.weight") for p in qkv]),  # rows [W_q; W_k; W_v]
                qkv_bias=torch.cat([get(f"{p}.bias") for p in qkv]) if c.bias else None,
                out_weight=get("self_attn.o_proj.weight"),
                out_bias=get("self_attn.o_proj.bias"),
                extra={f"{x}_norm.weight": get(f"self_attn.{x}_norm.weight") for x in "qk" if c.qk_norm},
            )
        )
        for ours, theirs in (("w_gate", "gate_proj"), ("w_up", "up_proj"), ("c_proj", "down_proj")):
            linear = getattr(block.mlp, ours)
            linear.weight.copy_(get(f"mlp.{theirs}.weight"))
            if c.bias:
                linear.bias.copy_(get(f"mlp.{theirs}.bias"))
