"""The GPT itself: a plain ``nn.Module`` usable without Lightning or Hydra.

Pre-norm transformer blocks whose causal self-attention comes from the registry in ``gptmini.attention``,
selected by ``GPTConfig.attention``: GPT-2's (LayerNorm, GELU MLP) by default, Llama's with ``norm=rmsnorm``,
``mlp=swiglu`` and ``position=rope``, attention-only with ``mlp=none``.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptmini import generation, ingredients, liger, lm_loss
from gptmini.attention import KVCache, attention_class, available_attention, build_attention
from gptmini.attention.base import QueryKeys
from gptmini.feed_forward import FEED_FORWARDS


class ConfigError(ValueError):
    """An invalid model configuration; the message names the field, the value and the fix."""


@dataclass
class GPTConfig:
    # Token ids the model embeds and predicts (null in a run's config: the tokenizer's, known once the data is
    # prepared).
    vocab_size: int = 50257
    # The context length: the most tokens one forward pass attends over.
    block_size: int = 1024
    # Transformer blocks.
    n_layer: int = 12
    # Attention heads per block (query heads, with n_kv_head); n_embd must be a multiple of it.
    n_head: int = 12
    # The residual stream's width (the embeddings' size).
    n_embd: int = 768
    # Dropout probability on the attention weights, the residual branches and the embeddings, in [0, 1).
    dropout: float = 0.0
    # A bias in the Linear layers and the LayerNorms (GPT-2: true).
    bias: bool = True
    # The causal attention implementation, by its registered name (gptmini/attention; docs/attention.md).
    attention: str = "sdpa"
    # One matrix for the token embedding and the LM head (GPT-2: true).
    tie_weights: bool = True
    # Embedding/LM-head rows are padded up to a multiple of this: matmuls with a width divisible by 64 run
    # faster on GPUs. Padded logits are set to -inf, so they are never sampled and add nothing to the loss.
    pad_vocab_multiple: int = 64
    # Grouped-query attention: key/value heads shared by n_head / n_kv_head query heads each (1: multi-query;
    # None: n_head, plain multi-head). The KV cache stores only these heads.
    n_kv_head: int | None = None
    # Where positions enter: "learned" (a position table added to the embeddings, GPT-2), "rope" (rotary
    # embeddings of queries and keys, base rope_base) or "none" (NoPE: the causal mask alone orders tokens).
    # "alibi": no embedding, per-head linear distance biases on the scores (Press et al.).
    position: str = "learned"
    # The base of RoPE's rotation frequencies (position=rope): a larger base, slower rotations, longer reach.
    rope_base: float = 10000.0
    # Each query sees at most the last sliding_window keys, itself included (None: every earlier key).
    sliding_window: int | None = None
    # Normalise queries and keys per head (RMSNorm with a learned gain) before their dot product.
    qk_norm: bool = False
    # A learned sigmoid gate on each head's output, elementwise, before the output projection.
    attn_gate: bool = False
    # One learned sink logit per head that takes part in the softmax but carries no value.
    attn_sink: bool = False
    # The blocks' normalisation: "layernorm" (GPT-2; a bias too when bias=true) or "rmsnorm" (Llama: a gain,
    # no mean subtraction, never a bias).
    norm: str = "layernorm"
    # Added to the variance of either norm (1e-5: GPT-2 and Llama 2).
    norm_eps: float = 1e-5
    # The feed-forward sublayer: "gelu" (GPT-2: Linear, tanh GELU, Linear), "swiglu" (Llama: silu(x W_gate) *
    # (x W_up), then W_down), "relu2" (Linear, relu(.)^2, Linear: modded-nanogpt's) or "none" (an
    # attention-only transformer: no MLP and no norm before it).
    mlp: str = "gelu"
    # The MLP's inner width; null: 4 * n_embd for gelu and relu2, 8/3 * n_embd rounded up to a multiple of 64 for
    # swiglu (the same parameter count as gelu's, spread over three matrices).
    mlp_hidden: int | None = None
    # The GELU of mlp=gelu (litgpt's name): "tanh", the approximation GPT-2 was trained with (its "gelu_new"), or
    # "none", the exact erf form (nanoGPT's nn.GELU(); less than half the time of tanh's on a CPU).
    gelu_approximate: str = "tanh"
    # Start the residual output projections (attention out_proj, MLP c_proj) and an untied LM head at zero
    # (modded-nanogpt): each block starts as the identity and the first steps shape the embeddings alone.
    zero_init: bool = False
    # Logit soft-capping (Gemma 2, modded-nanogpt): logits = cap * tanh(logits / cap) keeps every logit within
    # (-cap, cap). null: no cap.
    logit_softcap: float | None = None
    # The speedrun's input-side ingredients (gptmini/ingredients.py; docs/training-recipe.md). value_embeds layers
    # (the last, then every other one back) add a gated token table to their attention's values.
    value_embeds: int = 0
    # Mix the previous token's embedding into each token's, by a learned gate.
    smear_gate: bool = False
    # Add an embedding of (previous, current) token pairs: exact (vocab_size^2 + 1 rows) or hashed (bigram_buckets).
    bigram_embed: bool = False
    # bigram_embed's rows, the pairs hashed into them (null: exact, one row per pair).
    bigram_buckets: int | None = None
    # The training loss's path: "plain" (the logits, then F.cross_entropy; torch.compile fuses it on a GPU),
    # "chunked" (from the hidden states, a chunk of rows at a time: never the whole logits; not with logit_softcap),
    # "liger" (liger-kernel's fused linear cross-entropy: a CUDA GPU and pip install 'gptmini[gpu]') or "auto":
    # chunked on a machine without a CUDA GPU for a vocabulary of 2048 or more without a soft cap, else plain.
    loss: str = "auto"
    # The kernels of the blocks' norms and MLP activation: "none" (PyTorch's operations, which torch.compile fuses)
    # or "liger" (liger-kernel's LayerNorm, RMSNorm, SwiGLU and squared ReLU; GELU stays PyTorch's: a CUDA GPU and
    # pip install 'gptmini[gpu]'). The parameters are the same either way, and so are the checkpoints.
    fused_ops: str = "none"
    head_size: int = field(init=False)
    padded_vocab_size: int = field(init=False)
    kv_heads: int = field(init=False)
    mlp_width: int = field(init=False)  # the MLP's inner width (0 without an MLP)

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(GPTConfig)
        for f in fields(self):
            if f.init and hints[f.name] is bool and not isinstance(getattr(self, f.name), bool):
                raise ConfigError(f"model.{f.name}={getattr(self, f.name)!r} is invalid: true or false")
        for name, (kind, ok, want) in NUMBERS.items():
            value = getattr(self, name)
            if value is None and type(None) in typing.get_args(hints[name]):
                continue
            if isinstance(value, bool) or not isinstance(value, kind) or not ok(value):
                raise ConfigError(f"model.{name}={value!r} is invalid: {want}")
        if self.n_embd % self.n_head != 0:
            raise ConfigError(
                f"model.n_embd={self.n_embd} is not divisible by model.n_head={self.n_head}: choose n_head among "
                f"the divisors of n_embd ({', '.join(str(d) for d in _divisors(self.n_embd))}) or change n_embd"
            )
        if self.attention not in available_attention():
            raise ConfigError(
                f"model.attention={self.attention!r} is not a causal attention implementation; "
                f"valid names: {', '.join(available_attention())}"
            )
        self.kv_heads = self.n_head if self.n_kv_head is None else self.n_kv_head
        if self.n_head % self.kv_heads != 0:
            raise ConfigError(
                f"model.n_kv_head={self.n_kv_head} does not divide model.n_head={self.n_head}: choose among "
                f"{', '.join(str(d) for d in _divisors(self.n_head))} (1: multi-query; null: n_head)"
            )
        for name, valid in CHOICES.items():
            if getattr(self, name) not in valid:
                raise ConfigError(
                    f"model.{name}={getattr(self, name)!r} is invalid: valid values are {', '.join(valid)}"
                )
        if self.position == "rope" and (self.n_embd // self.n_head) % 2:
            raise ConfigError(
                f"model.position=rope needs an even head size, and n_embd / n_head = {self.n_embd // self.n_head}: "
                "change model.n_head or model.n_embd"
            )
        unsupported = set(self.attention_options()) - attention_class(self.attention).options
        if unsupported:
            option = sorted(unsupported)[0]
            setting = _OPTION_SETTINGS.get(option, option)
            able = [n for n in available_attention() if option in attention_class(n).options]
            raise ConfigError(
                f"model.{setting}={getattr(self, setting)!r} is not supported by model.attention={self.attention!r}: "
                f"use model.attention={' or '.join(able) or '(none yet)'}, or leave model.{setting} at its default"
            )
        hidden = self.mlp_hidden
        if self.mlp != "gelu" and self.gelu_approximate != "tanh":
            raise ConfigError(
                f"model.gelu_approximate={self.gelu_approximate} has no effect with model.mlp={self.mlp} (no GELU): "
                "leave it at tanh"
            )
        if self.loss == "chunked" and self.logit_softcap is not None:
            raise ConfigError(
                f"model.loss=chunked computes plain logits and model.logit_softcap={self.logit_softcap} caps them: use "
                "model.loss=plain (or liger on a CUDA GPU), or model.logit_softcap=null"
            )
        if self.mlp == "none":
            if hidden is not None:
                raise ConfigError(
                    f"model.mlp_hidden={hidden} has no effect with model.mlp=none (no MLP): set model.mlp_hidden=null"
                )
            self.mlp_width = 0
        elif hidden is not None:
            self.mlp_width = hidden
        elif self.mlp == "swiglu":
            self.mlp_width = swiglu_hidden(self.n_embd)
        else:
            self.mlp_width = 4 * self.n_embd
        self.head_size = self.n_embd // self.n_head
        m = self.pad_vocab_multiple
        self.padded_vocab_size = ((self.vocab_size + m - 1) // m) * m
        if (problem := ingredients.ingredient_problem(self)) is not None:
            raise ConfigError(problem)

    def attention_options(self) -> dict[str, Any]:
        """The attention options that differ from plain causal multi-head attention, as keyword arguments
        for the attention class (each class declares in ``options`` which ones it honours)."""
        options = {
            "n_kv_head": self.kv_heads if self.kv_heads != self.n_head else None,
            "rope_base": float(self.rope_base) if self.position == "rope" else None,
            "alibi": self.position == "alibi",
            "sliding_window": self.sliding_window,
            "qk_norm": self.qk_norm,
            "attn_gate": self.attn_gate,
            "attn_sink": self.attn_sink,
        }
        return {name: value for name, value in options.items() if value is not None and value is not False}

    def to_dict(self) -> dict:
        # Only the constructor fields: derived ones are recomputed on load.
        return {f.name: getattr(self, f.name) for f in fields(self) if f.init}

    @classmethod
    def from_dict(cls, d: dict) -> GPTConfig:
        known = {f.name for f in fields(cls) if f.init}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(
                f"unknown model config key(s) {unknown}; valid keys: {', '.join(sorted(known))}"
            )
        return cls(**d)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def swiglu_hidden(n_embd: int, multiple: int = 64) -> int:
    """SwiGLU's default inner width: 8/3 * n_embd (three matrices with the parameters of GELU's two at 4 *
    n_embd, as in Llama), rounded up to a multiple of ``multiple`` for matmul-friendly shapes."""
    return -(-8 * n_embd // (3 * multiple)) * multiple


# the numeric settings: their type, their range and what the refusal says they must be (null passes where the
# field's type allows None)
NUMBERS: dict[str, tuple[type | tuple[type, ...], Callable[[Any], bool], str]] = {
    **{
        name: (int, lambda v: v > 0, "it must be a positive integer")
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "pad_vocab_multiple")
    },
    "n_kv_head": (int, lambda v: v > 0, "a positive integer or null (n_head)"),
    "dropout": ((int, float), lambda v: 0 <= v < 1, "it must be in [0, 1)"),
    "rope_base": ((int, float), lambda v: v > 1, "it must be a number > 1 (10000 is usual)"),
    "sliding_window": (int, lambda v: v >= 1, "a number of keys >= 1, or null for full causal attention"),
    "norm_eps": (
        (int, float),
        lambda v: 0 < v < 1,
        "it must be a small positive number (1e-5 or 1e-6 are usual)",
    ),
    "mlp_hidden": (int, lambda v: v > 0, "a positive integer, or null for the default width"),
    "logit_softcap": (
        (int, float),
        lambda v: v > 0,
        "a positive number (15 or 30 are usual), or null for no cap",
    ),
    "bigram_buckets": (
        int,
        lambda v: v >= 2,
        "a number of hashed rows >= 2, or null for the exact table (vocab_size^2 + 1 rows)",
    ),
}
# the settings that take one of a few names, and their names
CHOICES = {
    "position": ("learned", "rope", "alibi", "none"),
    "norm": ("layernorm", "rmsnorm"),
    "mlp": ("gelu", "swiglu", "relu2", "none"),
    "gelu_approximate": ("tanh", "none"),
    "loss": lm_loss.LOSSES,
    "fused_ops": ("none", "liger"),
}
# the config setting behind an attention option, where the two are named differently (for messages)
_OPTION_SETTINGS = {"rope_base": "position", "alibi": "position"}


def build_norm(config: GPTConfig) -> nn.Module:
    """The normalisation ``config.norm`` names, over the model width, by the kernels ``config.fused_ops`` names
    (the same module and parameters either way)."""
    fused = config.fused_ops == "liger"
    rms, layer = (liger.RMSNorm, liger.LayerNorm) if fused else (nn.RMSNorm, nn.LayerNorm)
    if config.norm == "rmsnorm":
        return rms(config.n_embd, eps=config.norm_eps)
    return layer(config.n_embd, eps=config.norm_eps, bias=config.bias)


def softcap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """``cap * tanh(logits / cap)``: smooth, close to the identity for small logits, bounded by +-cap."""
    if cap is None:
        return logits
    return cap * torch.tanh(logits / cap)


@dataclass
class Inspection:
    """What ``GPT.inspect`` keeps of one pass."""

    maps: torch.Tensor  # (n_layer, B, nh, T, T): attention probabilities
    residuals: torch.Tensor  # (n_layer + 1, B, T, C): the embeddings, then each block's output
    vectors: list[QueryKeys] | None  # one per layer; None when the attention does not expose them


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``; with ``mlp=none`` only the
    attention sublayer (``ln_2`` and ``mlp`` are None)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = build_norm(config)
        self.attn = build_attention(
            config.attention,
            config.n_embd,
            config.n_head,
            config.block_size,
            config.dropout,
            config.bias,
            **config.attention_options(),
        )
        has_mlp = config.mlp != "none"
        self.ln_2 = build_norm(config) if has_mlp else None
        self.mlp = FEED_FORWARDS[config.mlp](config) if has_mlp else None
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(
        self,
        x: torch.Tensor,
        kv_cache: KVCache | None = None,
        values: ingredients.ValuesFn | None = None,
    ) -> torch.Tensor:
        h = self.ln_1(x)  # (B, T, C)
        if values is None:
            a = self.attn(h, kv_cache)  # (B, T, C)
        else:  # the layer's value embedding (model.value_embeds): from its normalised input to extra values
            a = self.attn(h, kv_cache, values(h))  # (B, T, C)
        x = x + self.resid_dropout(a)  # (B, T, C)
        if self.mlp is None:
            return x
        return x + self.mlp(self.ln_2(x))  # (B, T, C)

    def hidden_matrices(self) -> list[nn.Parameter]:
        """The block's hidden weight matrices, as its attention and MLP declare them (norm gains, biases and
        anything an attention keeps apart, such as a per-head scoring vector, are not among them)."""
        mlp = [] if self.mlp is None else self.mlp.hidden_matrices()
        return [*self.attn.hidden_matrices(), *mlp]


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.padded_vocab_size, config.n_embd)
        # a position table only for learned positions; rope rotates q and k inside attention, none uses neither
        self.wpe = nn.Embedding(config.block_size, config.n_embd) if config.position == "learned" else None
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = build_norm(config)
        self.lm_head = nn.Linear(config.n_embd, config.padded_vocab_size, bias=False)
        self.value_embeds = ingredients.ValueEmbeddings(config) if config.value_embeds else None
        self.smear = ingredients.SmearGate(config) if config.smear_gate else None
        self.bigram = ingredients.BigramEmbedding(config) if config.bigram_embed else None
        if config.tie_weights:
            # One tensor for both: the input embedding and the output projection learn together.
            self.lm_head.weight = self.wte.weight
        # the loss of forward(..., return_logits=False), chosen once (None: the logits, then F.cross_entropy)
        self._loss_alone = lm_loss.choose_loss(config.loss, config.vocab_size, config.logit_softcap)
        self.reset_parameters()

    # --- initialisation -------------------------------------------------------------------------------

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """GPT-2 initialisation: N(0, 0.02) for matrices and embeddings, zero biases, LayerNorm at identity,
        and residual output projections scaled by 1/sqrt(2 * n_layer) so the residual stream's variance does
        not grow with depth."""
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        norms = [m for m in self.modules() if isinstance(m, (nn.LayerNorm, nn.RMSNorm))]
        for norm in norms:
            norm.reset_parameters()  # gain 1, bias 0: a norm starts as the identity
        norm_params = {id(p) for norm in norms for p in norm.parameters()}
        for name, p in self.named_parameters():
            if id(p) in norm_params:
                continue
            if p.dim() >= 2:
                std = residual_std if name.endswith(("out_proj.weight", "mlp.c_proj.weight")) else 0.02
                nn.init.normal_(p, mean=0.0, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
            else:
                nn.init.normal_(p, mean=0.0, std=0.02)
        if self.config.zero_init:
            for p in self.zero_init_parameters():
                nn.init.zeros_(p)
        for module in (self.value_embeds, self.smear, self.bigram):
            if module is not None:  # each ingredient's own start (gates at zero, the bigram table at zero)
                module.reset_parameters()

    def _ingredient_tables(self) -> list[nn.Parameter]:
        return [p for m in (self.value_embeds, self.bigram) if m is not None for p in m.embeddings()]

    def zero_init_parameters(self) -> list[nn.Parameter]:
        """What ``zero_init`` starts at zero: each block's residual output projections and an untied LM head."""
        params = []
        for block in self.blocks:
            params.append(block.attn.out_proj.weight)
            if block.mlp is not None:
                params.append(block.mlp.c_proj.weight)
        if not self.config.tie_weights:
            params.append(self.lm_head.weight)
        return params

    def stacked_projections(self) -> dict[nn.Parameter, tuple[int, ...]]:
        """The hidden matrices that stack several projections by rows, with each one's row count, as the blocks'
        attention modules declare them (``LMAttention.stacked_projections``)."""
        return {p: rows for block in self.blocks for p, rows in block.attn.stacked_projections().items()}

    def parameter_roles(self) -> dict[str, list[nn.Parameter]]:
        """Every trainable parameter once, by what it is (an optimizer may treat each role its own way):

        - ``hidden``: the 2-D weight matrices of the blocks, as each block's attention and MLP declare them;
        - ``embedding``: the token (and learned position) tables;
        - ``head``: the untied LM head (a tied one is the token table);
        - ``matrix``: any other parameter of two or more dimensions (e.g. a per-head scoring vector table, or
          the 3-D per-head projections of the einsum attention);
        - ``vector``: 1-D parameters and scalars (norm gains, biases, attention sinks)."""
        roles: dict[str, list[nn.Parameter]] = {
            k: [] for k in ("hidden", "embedding", "head", "matrix", "vector")
        }
        seen: set[int] = set()

        def add(role: str, params: list[nn.Parameter]) -> None:
            for p in params:
                if p.requires_grad and id(p) not in seen:
                    seen.add(id(p))
                    roles[role].append(p)

        add("embedding", [self.wte.weight] + ([] if self.wpe is None else [self.wpe.weight]))
        add("embedding", self._ingredient_tables())  # value and bigram embeddings: token tables too
        add("head", [self.lm_head.weight])  # the token table itself when tied: already taken
        for block in self.blocks:
            add("hidden", block.hidden_matrices())
        for p in self.parameters():
            add("matrix" if p.dim() >= 2 else "vector", [p])
        return roles

    # --- forward ----------------------------------------------------------------------------------------

    @property
    def length_limit(self) -> str | None:
        """Why the model cannot run past ``block_size`` tokens, or None when it can (rotary, ALiBi or no
        positions with an attention that is not sized by its context): the length-extrapolation question."""
        c = self.config
        if c.position == "learned":
            return f"its learned position table has block_size={c.block_size} rows (model.position=learned)"
        if not attention_class(c.attention).any_length:
            return f"model.attention={c.attention!r} is built for block_size={c.block_size} tokens"
        return None

    def _check_length(self, t: int, offset: int = 0) -> None:
        if offset + t > self.config.block_size and (limit := self.length_limit) is not None:
            raise ValueError(
                f"sequence of length {offset + t} is longer than the model can take: {limit}; "
                "crop the input to the last block_size tokens"
            )

    def _embed(self, idx: torch.Tensor, offset: int = 0) -> torch.Tensor:
        x = self.wte(idx)  # (B, T, C)
        if self.smear is not None or self.bigram is not None:
            ingredients.check_no_offset(offset)
            x = x if self.smear is None else self.smear(x)
            x = x if self.bigram is None else x + self.bigram(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(offset, offset + idx.size(1), dtype=torch.long, device=idx.device))
        return self.drop(x)

    def hidden_states(self, idx: torch.Tensor, kv_caches: list[KVCache] | None = None) -> torch.Tensor:
        b, t = idx.shape  # (B, T)
        offset = kv_caches[0].pos if kv_caches is not None else 0
        self._check_length(t, offset)
        x = self._embed(idx, offset)  # (B, T, C)
        values = self._layer_values(idx)
        for i, block in enumerate(self.blocks):
            x = block(x, None if kv_caches is None else kv_caches[i], values[i])
        return self.ln_f(x)  # (B, T, C)

    def _layer_values(self, idx: torch.Tensor) -> list[ingredients.ValuesFn | None]:
        if self.value_embeds is None:
            return [None] * self.config.n_layer
        return self.value_embeds.per_layer(idx, self.config.n_layer)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        logits = softcap(self.lm_head(h), self.config.logit_softcap)  # (B, T, Vp)
        if self.config.padded_vocab_size != self.config.vocab_size:
            # In place: F.linear's backward does not need its output, and the -inf columns get zero gradient.
            logits[..., self.config.vocab_size :] = float("-inf")
        return logits

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None, return_logits: bool = True
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Logits (B, T, vocab) and, given targets (B, T; -1 is ignored), the mean cross entropy.

        ``return_logits=False`` asks for the loss alone (logits None), by the path ``config.loss`` chose when the
        model was built: the chunked or liger loss take the hidden states and the output weight and never
        materialise the logits; the plain path computes them (which ``torch.compile`` fuses on a GPU)."""
        h = self.hidden_states(idx)  # (B, T, C)
        if targets is not None and not return_logits and self._loss_alone is not None:
            flat = h.reshape(-1, h.size(-1))  # (B T, C)
            return None, self._loss_alone(flat, self._vocab_weight(), targets.reshape(-1))
        logits = self.logits(h)  # (B, T, Vp)
        loss = None
        if targets is not None:  # over the padded width: -inf logits add exp(-inf) = 0 to the normaliser
            loss = F.cross_entropy(
                logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1), ignore_index=-1
            )
        # A view: padded columns are never shown to callers.
        return (logits[..., : self.config.vocab_size] if return_logits else None), loss

    @torch.no_grad()
    def token_losses(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The cross entropy at each position, (B, T), without materialising the (B, T, vocab) logits."""
        h = self.hidden_states(idx)  # (B, T, C)
        if self.config.logit_softcap is not None:
            logits = self.logits(h).float()  # (B, T, Vp)
            return F.cross_entropy(logits.transpose(1, 2), targets, ignore_index=-1, reduction="none")
        flat = lm_loss.token_losses(h.reshape(-1, h.size(-1)), self._vocab_weight(), targets.reshape(-1))
        return flat.view(targets.shape)

    def _vocab_weight(self) -> torch.Tensor:
        # the output rows of the real vocabulary, (V, C): padding rows would give -inf logits, which add nothing
        return self.lm_head.weight[: self.config.vocab_size]

    # --- attention maps (explicit path, for visualisation) ------------------------------------------------

    @torch.no_grad()
    def attention_maps(self, idx: torch.Tensor) -> torch.Tensor:
        """Attention probabilities of every layer and head: (n_layer, B, n_head, T, T).

        Uses each attention module's explicit ``attention_probs`` path; the fused training kernels never
        materialise these matrices, so ordinary steps pay nothing for this."""
        return self.inspect(idx, vectors=False).maps

    @torch.no_grad()
    def inspect(self, idx: torch.Tensor, vectors: bool = True) -> Inspection:
        """One pass of the explicit path that keeps what the attention tab reads: every layer's attention, the
        residual stream before the first block and after each (the logit lens reads it through ``lens_logits``)
        and, with ``vectors`` where the attention exposes them, the queries and keys its scores come from (the
        neuron view)."""
        self._check_length(idx.size(1))
        x = self._embed(idx)  # (B, T, C)
        maps, residuals, keys = [], [x], []
        for block, v in zip(self.blocks, self._layer_values(idx), strict=True):
            h = block.ln_1(x)
            maps.append(block.attn.attention_probs(h))  # (B, nh, T, T)
            if vectors and block.attn.exposes_vectors:
                keys.append(block.attn.query_key_vectors(h))
            x = block(x, None, v)
            residuals.append(x)
        return Inspection(
            maps=torch.stack(maps),
            residuals=torch.stack(residuals),
            vectors=keys if len(keys) == len(self.blocks) else None,
        )

    @torch.no_grad()
    def lens_logits(self, residual: torch.Tensor) -> torch.Tensor:
        """The logit lens: the residual stream ``residual`` (..., C) read out as the last layer's is, through the
        final norm and the LM head: (..., vocab_size). On the last block's output these are the model's logits."""
        return self.logits(self.ln_f(residual))[..., : self.config.vocab_size]

    # --- generation -------------------------------------------------------------------------------------

    @property
    def supports_kv_cache(self) -> bool:
        # the smear gate and the bigram embedding read the previous token, which a cached step does not feed
        previous_token = self.smear is not None or self.bigram is not None
        return not previous_token and all(
            getattr(block.attn, "supports_kv_cache", False) for block in self.blocks
        )

    def new_kv_caches(self, batch_size: int, max_len: int | None = None) -> list[KVCache]:
        p = next(self.parameters())
        c = self.config
        return [
            KVCache(  # grouped-query attention caches only its key/value heads
                batch_size, c.kv_heads, max_len or c.block_size, c.head_size, device=p.device, dtype=p.dtype
            )
            for _ in range(c.n_layer)
        ]

    # model.generate(idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, eos_token=None, use_cache=True,
    # generator=None): the decoding loop and sampling live in gptmini.generation
    generate = generation.generate

    # --- accounting -------------------------------------------------------------------------------------

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())  # parameters() counts a tied tensor once
        if exclude_embeddings:
            n -= 0 if self.wpe is None else self.wpe.weight.numel()
            n -= sum(p.numel() for p in self._ingredient_tables())  # looked up, never multiplied
            if not self.config.tie_weights:
                n -= self.wte.weight.numel()
        return n

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs (forward + backward) per token, PaLM appendix B / nanoGPT: 6N + 12·L·H·Q·T."""
        c = self.config
        t = seq_len or c.block_size
        return 6 * self.num_parameters(exclude_embeddings=True) + 12 * c.n_layer * c.n_head * c.head_size * t
