"""Every attention mechanism the GPT can use, behind one registry.

- ``sdpa``: the production mechanism (``CausalSelfAttention``, the default): fused QKV, grouped-query heads, RoPE,
  ALiBi, windows, QK-norm, a gate, a sink and a KV cache; plain causal scores go to SDPA's ``is_causal`` from its
  own forward, ALiBi, windows and sinks to one of the production kernels of ``kernels`` (FlexAttention, chunked,
  sink slot, float mask, explicit softmax), chosen once when the module is built by the capabilities each kernel
  declares;
- ``torch_module``: PyTorch's ``nn.MultiheadAttention`` behind the same interface (``torch``);
- ``teaching``: the book's mechanisms, from simplified self-attention to multi-head attention, Bahdanau's additive
  scores and per-head Q/K/V tensors (``wrapper``, ``mha``, ``einsum``, ``additive`` and the non-causal ones).

``base`` holds the interface they share (``LMAttention``: capabilities as class attributes, weights in and out as
``AttentionWeights``), ``kv_cache`` the cache, ``registry`` the names, ``checks`` the shape checks; ``alibi``,
``rope`` and ``qk_norm`` what the options compute. Adding a mechanism: one module with an ``LMAttention`` subclass
and one ``@register_attention("name")`` on it; every module of this package is imported (so registered) when the
package is.
"""

import importlib
import pkgutil

from gptmini.attention.base import AttentionWeights, LMAttention
from gptmini.attention.kernels import AttentionKernel, available_kernels
from gptmini.attention.kv_cache import KVCache
from gptmini.attention.registry import (
    ATTENTION_REGISTRY,
    attention_class,
    available_attention,
    build_attention,
    register_attention,
    unregister_attention,
)
from gptmini.attention.sdpa import CausalSelfAttention


def _import_every_module() -> None:
    # a module added anywhere in this package registers itself without being listed here
    for info in pkgutil.walk_packages(__path__, prefix=f"{__name__}."):
        importlib.import_module(info.name)


_import_every_module()

__all__ = [
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
