"""Attention, concept by concept: from a weightless dot product to the fused kernel the GPT trains with.

One module per family, in teaching order:

- ``textbook``: chapter 3 of Raschka's book line for line (simplified, v1, v2, causal, multi-head wrapper,
  multi-head with weight splits), and the two multi-head classes as language-model attention (``wrapper``,
  ``mha``);
- ``numpy_reference``: an independent NumPy oracle of dot-product and additive attention;
- ``einsum``: per-head weight tensors and index contractions (``einsum``);
- ``additive``: Bahdanau's additive scores, and a causal multi-head self-attention on them (``additive``);
- ``sdpa``: the production path, fused QKV + ``scaled_dot_product_attention`` with a KV cache (``sdpa``);
- ``torch_module``: PyTorch's ``nn.MultiheadAttention`` (``torch``).

``base`` holds the interface they share (``LMAttention``: capabilities as class attributes, weights in and out
as ``AttentionWeights``), ``kv_cache`` the cache, ``registry`` the names, ``checks`` the shape checks. Adding
a mechanism: one module in this folder with an ``LMAttention`` subclass and one
``@register_attention("name")`` on it; every module here is imported (so registered) when the package is.
"""

from gptmini.attention.base import AttentionWeights, LMAttention, causal_probs
from gptmini.attention.checks import check_heads, check_length
from gptmini.attention.kv_cache import KVCache
from gptmini.attention.registry import (
    ATTENTION_REGISTRY,
    attention_class,
    available_attention,
    build_attention,
    register_attention,
    unregister_attention,
)

# the families register themselves on import, in teaching order
from gptmini.attention.textbook import (  # noqa: E402  (isort: skip)
    CausalAttention,
    MultiHeadAttention,
    MultiHeadAttentionAdapter,
    MultiHeadAttentionWrapper,
    MultiHeadAttentionWrapperAdapter,
    SelfAttention_v1,
    SelfAttention_v2,
    simplified_attention_scores,
    simplified_attention_weights,
    simplified_self_attention,
)
from gptmini.attention.numpy_reference import (  # noqa: E402  (isort: skip)
    numpy_additive_multihead_attention,
    numpy_attention,
    numpy_multihead_attention,
    numpy_rms_norm,
    numpy_rope,
    numpy_softmax,
)
from gptmini.attention.einsum import EinsumMultiHeadAttention  # noqa: E402  (isort: skip)
from gptmini.attention.additive import AdditiveSelfAttention, BahdanauAttention  # noqa: E402  (isort: skip)
from gptmini.attention.sdpa import CausalSelfAttention  # noqa: E402  (isort: skip)
from gptmini.attention.torch_module import TorchMultiheadAttention  # noqa: E402  (isort: skip)


def _import_every_family() -> None:
    # a module added to this folder registers itself without being listed here
    import importlib
    import pkgutil

    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")


_import_every_family()

__all__ = [
    "ATTENTION_REGISTRY",
    "AdditiveSelfAttention",
    "AttentionWeights",
    "BahdanauAttention",
    "CausalAttention",
    "CausalSelfAttention",
    "EinsumMultiHeadAttention",
    "KVCache",
    "LMAttention",
    "MultiHeadAttention",
    "MultiHeadAttentionAdapter",
    "MultiHeadAttentionWrapper",
    "MultiHeadAttentionWrapperAdapter",
    "SelfAttention_v1",
    "SelfAttention_v2",
    "TorchMultiheadAttention",
    "attention_class",
    "available_attention",
    "build_attention",
    "causal_probs",
    "check_heads",
    "check_length",
    "numpy_additive_multihead_attention",
    "numpy_attention",
    "numpy_multihead_attention",
    "numpy_rms_norm",
    "numpy_rope",
    "numpy_softmax",
    "register_attention",
    "simplified_attention_scores",
    "simplified_attention_weights",
    "simplified_self_attention",
    "unregister_attention",
]
