"""The production kernels of ``model.attention=sdpa``, one module each (docs/attention.md, "Kernels, and the
reference path", says what each runs and supports). An attention module chooses its kernel once, when it is built
(``choose_kernel``): the one named by ``kernel=`` (a name in ``KERNELS`` or an instance such as
``ChunkedKernel(queries=64)``), which must support every feature of the module, or ``auto_kernel``'s choice.
"""

from __future__ import annotations

import torch

from gptmini.attention.kernels.base import AttentionKernel
from gptmini.attention.kernels.base import MaskCache as MaskCache  # re-exported
from gptmini.attention.kernels.base import ScoreOptions as ScoreOptions  # re-exported
from gptmini.attention.kernels.causal import CausalKernel
from gptmini.attention.kernels.chunked import CHUNK_QUERIES, ChunkedKernel
from gptmini.attention.kernels.explicit import EXPLICIT_SINK_MAX_LEN, ExplicitKernel
from gptmini.attention.kernels.flex import FlexKernel, flex_available
from gptmini.attention.kernels.masked import MASK as MASK  # re-exported
from gptmini.attention.kernels.masked import MaskKernel
from gptmini.attention.kernels.sink_slot import SinkSlotKernel

KERNELS: dict[str, type[AttentionKernel]] = {
    kernel.name: kernel
    for kernel in (CausalKernel, FlexKernel, ChunkedKernel, ExplicitKernel, SinkSlotKernel, MaskKernel)
}


def available_kernels() -> list[str]:
    """The names ``kernel=`` takes, besides ``"auto"``."""
    return list(KERNELS)


def auto_kernel(features: frozenset[str], context_length: int) -> AttentionKernel:
    """The kernel for a module's features when none is named, by the length it is built for (``context_length``).
    Plain causal scores keep SDPA's ``is_causal``. On a CPU: ALiBi and windows in the float mask, or per chunk of
    queries from two chunks' length; a sink in the explicit softmax up to ``EXPLICIT_SINK_MAX_LEN``, beyond it in
    the sink slot, or in the float mask with ALiBi or a window too. A machine with a CUDA device trains them in
    FlexAttention (not with dropout, which it lacks), which hands the calls on a CPU to that CPU kernel."""
    scores = features & {"alibi", "window"}
    if not scores and "sink" not in features:
        return CausalKernel()
    if "sink" not in features:
        cpu: AttentionKernel = ChunkedKernel() if context_length >= 2 * CHUNK_QUERIES else MaskKernel()
    elif context_length <= EXPLICIT_SINK_MAX_LEN:
        cpu = ExplicitKernel()
    else:
        cpu = MaskKernel() if scores else SinkSlotKernel()
    if "dropout" in features or not (torch.cuda.is_available() and flex_available()):
        return cpu
    return FlexKernel(cpu=cpu)


def choose_kernel(
    kernel: str | AttentionKernel, features: frozenset[str], context_length: int
) -> AttentionKernel | None:
    """A module's kernel, once, when it is built: ``kernel`` (``"auto"``, a name in ``KERNELS`` or an instance),
    refused where it does not support one of ``features``. None: plain ``is_causal``, the module's own SDPA call."""
    if kernel == "auto":
        chosen = auto_kernel(features, context_length)
    elif isinstance(kernel, AttentionKernel):
        chosen = kernel
    elif kernel in KERNELS:
        chosen = KERNELS[kernel]()
    else:
        raise ValueError(f"unknown attention kernel {kernel!r}; valid kernels: auto, {', '.join(KERNELS)}")
    if not features <= chosen.supports:
        missing = sorted(features - chosen.supports)
        able = [name for name, cls in KERNELS.items() if features <= cls.supports]
        raise ValueError(
            f"attention kernel {chosen.name!r} does not support {', '.join(missing)}; "
            f"kernels that support {', '.join(sorted(features))}: {', '.join(able) or 'none'} (or auto)"
        )
    return None if type(chosen) is CausalKernel else chosen
