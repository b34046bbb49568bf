"""Config names -> attention classes. A mechanism joins with one decorator on its class:

    @register_attention("mine")
    class MyAttention(LMAttention): ...

and is then selectable as ``model.attention=mine``, checked by the test matrix, and converted to and from
GPT-2 weights if it declares ``gpt2_compatible``. Nothing else lists implementations.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch.nn as nn

from gptmini.attention.checks import check_heads

T = TypeVar("T")

# name -> class (or, for the weightless book mechanism, function); causal or not, as each declares
ATTENTION_REGISTRY: dict[str, Any] = {}


def register_attention(name: str) -> Callable[[T], T]:
    def register(obj: T) -> T:
        if name in ATTENTION_REGISTRY:
            raise ValueError(
                f"attention {name!r} is already registered ({ATTENTION_REGISTRY[name].__qualname__}): pick another name"
            )
        if not isinstance(getattr(obj, "causal", None), bool):
            raise TypeError(
                f"{obj.__qualname__} must declare `causal = True` or `causal = False` to be registered"
            )
        ATTENTION_REGISTRY[name] = obj
        return obj

    return register


def unregister_attention(name: str) -> None:
    ATTENTION_REGISTRY.pop(name, None)


def available_attention() -> list[str]:
    """The names a language model can use: the causal implementations."""
    return sorted(name for name, cls in ATTENTION_REGISTRY.items() if cls.causal)


def attention_class(name: str) -> Any:
    valid = ", ".join(available_attention())
    if name not in ATTENTION_REGISTRY:
        raise ValueError(f"unknown attention '{name}'; valid names: {valid}")
    cls = ATTENTION_REGISTRY[name]
    if not cls.causal:
        raise ValueError(
            f"attention '{name}' ({cls.__name__}) is not causal and cannot be used in the language model; "
            f"valid names: {valid}"
        )
    return cls


def build_attention(
    name: str,
    d_model: int,
    n_head: int,
    context_length: int,
    dropout: float = 0.0,
    bias: bool = True,
    **options: Any,
) -> nn.Module:
    """An instance of ``name``; ``options`` (e.g. ``n_kv_head``) must be among those its class declares."""
    cls = attention_class(name)
    check_heads(d_model, n_head)
    unsupported = sorted(set(options) - cls.options)
    if unsupported:
        able = [n for n in available_attention() if unsupported[0] in ATTENTION_REGISTRY[n].options]
        raise ValueError(
            f"attention '{name}' does not support {unsupported[0]}; implementations that do: {', '.join(able) or 'none'}"
        )
    return cls(d_model, n_head, context_length, dropout, bias, **options)
