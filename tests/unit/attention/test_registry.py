"""The registry, and the three steps of adding an attention implementation: one module (here, a class in
this test), one registration, and it is checked by the whole matrix and selectable in the GPT."""

import math

import pytest
import torch
import torch.nn as nn
from attention_matrix import CHECKS, CONTEXT, D_MODEL, N_HEAD, make
from torch import Tensor

import gptmini.attention
from gptmini.attention import (
    ATTENTION_REGISTRY,
    AttentionWeights,
    CausalSelfAttention,
    KVCache,
    LMAttention,
    available_attention,
    build_attention,
    register_attention,
    unregister_attention,
)
from gptmini.attention.checks import check_heads, check_length
from gptmini.attention.teaching.additive import AdditiveSelfAttention
from gptmini.attention.teaching.textbook import CausalAttention, MultiHeadAttention
from gptmini.model import GPT, ConfigError, GPTConfig


def test_registry_names_and_classes():
    assert available_attention() == ["additive", "einsum", "mha", "sdpa", "torch", "wrapper"]
    assert ATTENTION_REGISTRY["sdpa"] is CausalSelfAttention
    assert ATTENTION_REGISTRY["additive"] is AdditiveSelfAttention
    assert isinstance(make("wrapper").heads[0], CausalAttention)
    assert isinstance(make("mha"), MultiHeadAttention)


def test_capabilities_are_declared_by_the_classes():
    cached = [n for n in available_attention() if ATTENTION_REGISTRY[n].supports_kv_cache]
    gpt2 = [n for n in available_attention() if ATTENTION_REGISTRY[n].gpt2_compatible]
    assert cached == ["mha", "sdpa"]
    assert gpt2 == ["einsum", "mha", "sdpa", "torch", "wrapper"]  # additive scores are not GPT-2's function
    assert all(issubclass(ATTENTION_REGISTRY[n], LMAttention) for n in available_attention())


def test_every_module_of_the_package_is_imported_so_its_registrations_happen():
    import sys
    from pathlib import Path

    root = Path(gptmini.attention.__file__).parent
    modules = {".".join(p.relative_to(root).with_suffix("").parts) for p in root.rglob("*.py")}
    modules = {m.removesuffix(".__init__") for m in modules} - {"__init__"}
    assert modules >= {"teaching.textbook", "teaching.einsum", "teaching.additive", "sdpa", "torch_module"}
    assert modules >= {
        "kernels.causal",
        "kernels.flex",
        "kernels.chunked",
        "kernels.masked",
        "kernels.explicit",
    }
    assert all(f"gptmini.attention.{m}" in sys.modules for m in modules), modules - {
        m.removeprefix("gptmini.attention.") for m in sys.modules
    }


def test_the_package_exports_its_public_api_only():
    # the registry, the interface a mechanism implements, the production mechanism and its kernel choice; the
    # book's mechanisms are gptmini.attention.teaching's, the kernels gptmini.attention.kernels'
    assert sorted(gptmini.attention.__all__) == [
        "ATTENTION_REGISTRY",
        "AttentionKernel",
        "AttentionWeights",
        "CausalSelfAttention",
        "KVCache",
        "LMAttention",
        "attention_class",
        "available_attention",
        "available_kernels",
        "build_attention",
        "register_attention",
        "unregister_attention",
    ]
    assert all(hasattr(gptmini.attention, name) for name in gptmini.attention.__all__)


def test_unknown_name_lists_valid_names():
    message = "unknown attention 'xyz'; valid names: additive, einsum, mha, sdpa, torch, wrapper"
    with pytest.raises(ValueError, match=f"^{message}$"):
        build_attention("xyz", D_MODEL, N_HEAD, CONTEXT)


@pytest.mark.parametrize("name", ["simplified", "v1", "v2", "bahdanau"])
def test_non_causal_names_are_refused(name):
    assert ATTENTION_REGISTRY[name].causal is False
    with pytest.raises(
        ValueError,
        match=r"is not causal and cannot be used in the language model; valid names: additive, einsum",
    ):
        build_attention(name, D_MODEL, N_HEAD, CONTEXT)
    with pytest.raises(ConfigError, match=rf"model.attention='{name}'"):
        GPTConfig(attention=name)


def test_a_name_is_registered_once_and_a_class_must_declare_causality():
    with pytest.raises(ValueError, match="'sdpa' is already registered"):
        register_attention("sdpa")(CausalSelfAttention)

    class Undeclared(nn.Module):
        pass

    with pytest.raises(TypeError, match="must declare `causal = True` or `causal = False`"):
        register_attention("undeclared")(Undeclared)
    assert "undeclared" not in ATTENTION_REGISTRY


class LoopAttention(LMAttention):
    """A deliberately plain implementation: one Python loop over the heads, fused q/k/v in one Linear."""

    gpt2_compatible = True

    def __init__(
        self, d_model: int, n_head: int, context_length: int, dropout: float = 0.0, bias: bool = True
    ):
        super().__init__()
        check_heads(d_model, n_head)
        self.n_head, self.context_length = n_head, context_length
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def _per_head(self, x: Tensor) -> list[tuple[Tensor, Tensor, Tensor]]:
        check_length(x.shape[1], self.context_length)
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # 3 x (B, T, C)
        return list(
            zip(q.chunk(self.n_head, -1), k.chunk(self.n_head, -1), v.chunk(self.n_head, -1), strict=True)
        )

    def _probs(self, q: Tensor, k: Tensor) -> Tensor:
        T = q.shape[1]
        scores = q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])  # (B, T, T)
        return scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -torch.inf).softmax(-1)

    def forward(self, x: Tensor, kv_cache: KVCache | None = None) -> Tensor:
        self.reject_cache(kv_cache)
        heads = [self.dropout(self._probs(q, k)) @ v for q, k, v in self._per_head(x)]
        return self.out_proj(torch.cat(heads, dim=-1))

    def attention_probs(self, x: Tensor) -> Tensor:
        return torch.stack([self._probs(q, k) for q, k, _ in self._per_head(x)], dim=1)  # (B, nh, T, T)

    def get_weights(self) -> AttentionWeights:
        return AttentionWeights(self.qkv.weight, self.qkv.bias, self.out_proj.weight, self.out_proj.bias)

    @torch.no_grad()
    def set_weights(self, w: AttentionWeights) -> None:
        self.qkv.weight.copy_(w.qkv_weight)
        self.out_proj.weight.copy_(w.out_weight)
        if self.qkv.bias is not None:
            self.qkv.bias.copy_(w.qkv_bias)
            self.out_proj.bias.copy_(w.out_bias)


@pytest.fixture
def loop_registered():
    register_attention("loop")(LoopAttention)  # step 2 of 3: one registration
    yield "loop"
    unregister_attention("loop")


def test_a_new_implementation_is_picked_up_by_the_whole_matrix_and_the_gpt(loop_registered):
    assert "loop" in available_attention()
    for check in CHECKS:  # the same list test_matrix.py runs for the built-in implementations
        check(loop_registered, {})
    model = GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=1, n_head=2, n_embd=16, attention="loop"))
    assert isinstance(model.blocks[0].attn, LoopAttention)
    assert not model.supports_kv_cache


def test_the_matrix_catches_a_broken_implementation(loop_registered):
    # a matrix that passed anything would prove nothing: an implementation that peeks one token ahead fails

    class Leaky(LoopAttention):
        def _probs(self, q: Tensor, k: Tensor) -> Tensor:
            T = q.shape[1]
            scores = q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])
            return scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(2), -torch.inf).softmax(-1)

    register_attention("leaky")(Leaky)
    try:
        from attention_matrix import check_causality, check_numpy_oracle_parity

        for check in (check_causality, check_numpy_oracle_parity):
            with pytest.raises(AssertionError):
                check("leaky", {})
    finally:
        unregister_attention("leaky")
