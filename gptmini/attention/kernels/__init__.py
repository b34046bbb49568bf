"""The production kernels of ``model.attention=sdpa``, one module each, behind one dispatch by declared capability.

========== ============================================================ =========================================
kernel     what it runs                                                 supports
========== ============================================================ =========================================
causal     SDPA with ``is_causal`` (flash / memory-efficient), cached    gqa, cache, dropout
           decoding
flex       FlexAttention: ALiBi ``score_mod``, causal/window            alibi, window, sink, gqa
           ``block_mask``, a sink from the log-sum-exp
chunked    SDPA per chunk of queries on the keys it can see, with that   alibi, window, gqa, dropout
           rectangle of the mask
explicit   scores, mask, softmax, weights . values: the reference       every feature
sink_slot  SDPA with the sink as one more key and head dimension        sink, gqa, dropout
mask       SDPA with an additive float mask (a sink as one more column) every feature
========== ============================================================ =========================================

``KERNELS`` is the order of the automatic choice: the first kernel that supports a call and suits it (device,
length: see each kernel's ``suits``). ``CausalSelfAttention(kernel=...)`` (``build_attention("sdpa", ...,
kernel=...)``) names one to prefer wherever it supports the call, or passes a kernel instance (e.g. a
``ChunkedKernel`` with smaller chunks, or a new ``AttentionKernel`` subclass).
"""

from gptmini.attention.kernels.base import AttentionKernel, KernelDispatch, MaskCache, Scores
from gptmini.attention.kernels.causal import CausalKernel
from gptmini.attention.kernels.chunked import ChunkedKernel
from gptmini.attention.kernels.explicit import ExplicitKernel
from gptmini.attention.kernels.flex import FlexKernel
from gptmini.attention.kernels.masked import MaskKernel
from gptmini.attention.kernels.sink_slot import SinkSlotKernel

# the automatic choice's order; MaskKernel, which supports every feature, last
KERNELS: tuple[AttentionKernel, ...] = (
    CausalKernel(),
    FlexKernel(),
    ChunkedKernel(),
    ExplicitKernel(),
    SinkSlotKernel(),
    MaskKernel(),
)


def available_kernels() -> list[str]:
    """The names ``kernel=`` takes, besides ``"auto"``, in the automatic choice's order."""
    return [kernel.name for kernel in KERNELS]


__all__ = [
    "KERNELS",
    "AttentionKernel",
    "CausalKernel",
    "ChunkedKernel",
    "ExplicitKernel",
    "FlexKernel",
    "KernelDispatch",
    "MaskCache",
    "MaskKernel",
    "Scores",
    "SinkSlotKernel",
    "available_kernels",
]
