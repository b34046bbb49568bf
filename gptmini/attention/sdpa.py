"""The production mechanism: one fused QKV projection, grouped-query heads, RoPE, QK-norm, a head gate and a sink,
with a key/value cache for decoding. Plain causal scores go straight to SDPA's ``is_causal``; ALiBi, windows and
sinks run in the kernel (``kernels``) chosen when the module is built."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from gptmini.attention.alibi import alibi_slopes
from gptmini.attention.base import AttentionWeights, LMAttention, QueryKeys, copy_param, set_fused_qkv
from gptmini.attention.checks import check_heads
from gptmini.attention.kernels import (
    MASK,
    AttentionKernel,
    CausalKernel,
    ExplicitKernel,
    MaskCache,
    choose_kernel,
)
from gptmini.attention.kernels.base import repeat_kv
from gptmini.attention.kernels.causal import cached_rows
from gptmini.attention.kv_cache import KVCache
from gptmini.attention.qk_norm import head_rms_norm
from gptmini.attention.registry import register_attention
from gptmini.attention.rope import apply_rope, rope_tables

_REFERENCE = ExplicitKernel()
# the q/k norms' epsilon, as Qwen3's (its config's rms_norm_eps: the export needs model.norm_eps equal to it)
QK_NORM_EPS = 1e-6


@register_attention("sdpa")
class CausalSelfAttention(LMAttention):
    """The default: fused QKV projection and PyTorch's fused scaled_dot_product_attention kernel.

    With ``n_kv_head < n_head`` (grouped-query attention, Ainslie et al. 2023) keys and values have fewer
    heads, each shared by ``n_head // n_kv_head`` consecutive query heads (SDPA's ``enable_gqa`` convention),
    and the KV cache holds only those. ``rope_base`` rotates queries and keys by their positions (RoPE, see
    ``rope``), ``qk_norm`` RMS-normalises them per head first, ``attn_gate`` multiplies each head's output by a
    learned sigmoid gate of the input before the output projection. All of these keep SDPA's fused kernel.

    ALiBi, sliding windows and sinks change the scores themselves. They run in the production kernel chosen once,
    here in ``__init__`` (``kernels.choose_kernel``): the one ``kernel`` names (or an ``AttentionKernel``
    instance), else the automatic choice for the options, FlexAttention where CUDA is, else the CPU's (SDPA per
    chunk of queries, the explicit softmax, the sink slot or a float mask). Calls with a KV cache run in the mask
    kernel where the chosen one takes no cache. ``kernel_for`` says which kernel a call runs.

    Nothing here is sized by ``context_length`` except the RoPE tables, which grow on demand: with rotary, ALiBi
    or no positions the module runs at any length, longer than it was trained on (length extrapolation)."""

    supports_kv_cache = True
    gpt2_compatible = True
    any_length = True
    fused = True
    takes_values = True
    exposes_vectors = True
    options = frozenset(
        {"n_kv_head", "rope_base", "alibi", "sliding_window", "qk_norm", "attn_gate", "attn_sink", "kernel"}
    )

    def __init__(
        self,
        d_model: int,
        n_head: int,
        context_length: int,
        dropout: float = 0.0,
        bias: bool = True,
        n_kv_head: int | None = None,
        rope_base: float | None = None,
        alibi: bool = False,
        sliding_window: int | None = None,
        qk_norm: bool = False,
        attn_gate: bool = False,
        attn_sink: bool = False,
        kernel: str | AttentionKernel = "auto",
    ):
        super().__init__()
        check_heads(d_model, n_head)
        self.d_model = d_model
        self.n_head = n_head
        self.n_kv_head = n_head if n_kv_head is None else n_kv_head
        if self.n_kv_head <= 0 or n_head % self.n_kv_head != 0:
            raise ValueError(f"n_kv_head={n_kv_head} must divide n_head={n_head}")
        self.head_size = d_model // n_head
        self.kv_dim = self.n_kv_head * self.head_size
        self.context_length = context_length
        self.dropout = dropout
        # one matmul instead of three: queries (C) and the keys and values of the kv heads (C_kv each)
        self.qkv = nn.Linear(d_model, d_model + 2 * self.kv_dim, bias=bias)  # [W_q; W_k; W_v]
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        # RMSNorm over each head's dimensions, one gain vector shared by the heads (as OLMo 2 / Qwen3 do)
        self.q_norm = nn.RMSNorm(self.head_size, eps=QK_NORM_EPS) if qk_norm else None
        self.k_norm = nn.RMSNorm(self.head_size, eps=QK_NORM_EPS) if qk_norm else None
        self.gate = nn.Linear(d_model, d_model, bias=bias) if attn_gate else None
        # one learned logit per head that joins each softmax row with a zero value: attention mass that has
        # nowhere useful to go can rest there instead of on real tokens (learned sinks, as in gpt-oss)
        self.sink = nn.Parameter(torch.zeros(n_head)) if attn_sink else None
        self.sliding_window = sliding_window
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window={sliding_window} must be >= 1")
        # ALiBi's per-head slopes; None without it (a buffer, so it follows the module across devices)
        self.register_buffer("alibi_slopes", alibi_slopes(n_head) if alibi else None, persistent=False)
        self.masks = MaskCache()  # the score masks its kernels build, once per length and device
        # the kernel of ALiBi, windows and sinks, chosen once; None: plain causal scores, SDPA's is_causal below
        self.kernel = choose_kernel(
            kernel, self.features | ({"dropout"} if dropout > 0 else set()), context_length
        )
        # a KV cache's calls: the mask kernel where the chosen kernel takes no cache (FlexAttention, chunks, sink slot)
        self.decode_kernel = (
            MASK if self.kernel is not None and "cache" not in self.kernel.supports else self.kernel
        )
        self.rope = rope_base is not None
        self.rope_base = rope_base
        if self.rope:
            cos, sin = rope_tables(self.head_size, context_length, rope_base)  # (T_max, hs) each
            self.register_buffer("rope_cos", cos, persistent=False)  # recomputed, never stored in checkpoints
            self.register_buffer("rope_sin", sin, persistent=False)

    @property
    def grouped(self) -> bool:
        return self.n_kv_head != self.n_head

    def _heads(
        self, x: Tensor, start: int = 0, values: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values as they enter the dot product: q and k normalised, then rotated to their
        absolute positions (``start`` is the first one). Queries and keys are adjacent in the fused projection,
        so both are normalised and rotated as one tensor, in (B, T, heads, hs) layout, before the heads move
        forward: half the small operations, which is what these options cost at training sizes. ``values``
        (B, T, C_kv), if given, is added to the values (value embeddings)."""
        B, T, C = x.shape
        qkv = self.qkv(x)  # (B, T, C + 2 C_kv)
        # split, not slicing: a split's backward is one concatenation, a slice's a zero-filled copy per slice
        heads = self.n_head + self.n_kv_head
        qk, v = qkv.split((C + self.kv_dim, self.kv_dim), dim=2)  # (B, T, C + C_kv), (B, T, C_kv)
        v = v if values is None else v + values.to(v.dtype)  # (B, T, C_kv)
        qk = qk.view(B, T, heads, self.head_size)  # (B, T, nh + n_kv, hs)
        v = v.view(B, T, self.n_kv_head, self.head_size)  # (B, T, n_kv, hs)
        if self.q_norm is not None:
            # the queries' gain on their heads, the keys' on theirs
            gains = (self.q_norm.weight, self.k_norm.weight)
            qk = head_rms_norm(
                qk, gains, (self.n_head, self.n_kv_head), self.q_norm.eps
            )  # (B, T, nh + n_kv, hs)
        if self.rope:
            if start + T > self.rope_cos.shape[0]:
                self._grow_rope(start + T)
            cos, sin = (t[start : start + T, None] for t in (self.rope_cos, self.rope_sin))  # (T, 1, hs)
            qk = apply_rope(qk, cos, sin)  # (B, T, nh + n_kv, hs)
        q, k = qk.split((self.n_head, self.n_kv_head), dim=2)  # (B, T, nh, hs), (B, T, n_kv, hs)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, nh, T, hs), (B, n_kv, T, hs) x2

    def _grow_rope(self, length: int) -> None:
        # positions past the training context (evaluation at longer lengths): double, so growth happens rarely
        size = max(length, 2 * self.rope_cos.shape[0])
        cos, sin = rope_tables(self.head_size, size, self.rope_base)  # (size, hs) each
        self.rope_cos, self.rope_sin = cos.to(self.rope_cos.device), sin.to(self.rope_sin.device)

    @property
    def features(self) -> frozenset[str]:
        """What every call of this module needs of a kernel besides a cache and dropout."""
        options = {
            "alibi": self.alibi_slopes is not None,
            "window": self.sliding_window is not None,
            "sink": self.sink is not None,
            "gqa": self.grouped,
        }
        return frozenset(name for name, on in options.items() if on)

    def kernel_for(self, device: torch.device, cached: bool = False) -> AttentionKernel:
        """The kernel a forward on ``device`` runs, with a KV cache or without."""
        kernel = self.decode_kernel if cached else self.kernel
        return CausalKernel() if kernel is None else kernel.runs_on(device)

    def forward(self, x: Tensor, kv_cache: KVCache | None = None, values: Tensor | None = None) -> Tensor:
        B, T, C = x.shape
        start = 0 if kv_cache is None else kv_cache.pos  # absolute position of the first new token
        q, k, v = self._heads(x, start, values)  # (B, nh, T, hs), (B, n_kv, T, hs) x2: keys rotated once
        if kv_cache is not None:
            k, v = kv_cache.update(k, v)  # (B, n_kv, start + T, hs) each
        kernel = self.kernel if kv_cache is None else self.decode_kernel
        dropout = self.dropout if self.training else 0.0
        if kernel is None:  # plain causal scores: PyTorch's fused kernel (flash / memory-efficient)
            mask = cached_rows(T, start, x.device)  # (T, start + T), or None: is_causal, or one new token
            # float32 on a CPU, under bf16 autocast too: PyTorch's CPU kernel is several times slower in bf16
            qkv = (q, k, v) if x.device.type != "cpu" else (q.float(), k.float(), v.float())
            with torch.autocast("cpu", enabled=False):
                y = F.scaled_dot_product_attention(
                    *qkv, attn_mask=mask, dropout_p=dropout, is_causal=start == 0, enable_gqa=self.grouped
                ).to(q.dtype)  # (B, nh, T, hs)
        else:  # ALiBi, a window or a sink: the kernel chosen in __init__
            y = kernel(q, k, v, self, start, dropout)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, nh, hs) -> (B, T, C): heads merged
        if self.gate is not None:
            y = y * torch.sigmoid(self.gate(x))  # (B, T, C): each head's output, dimension by dimension
        return self.out_proj(y)  # (B, T, C)

    def _reference(self, x: Tensor) -> tuple[Tensor, Tensor]:
        # the explicit path the fused kernels skip: scores -> mask/bias -> softmax, with each query head's values
        q, k, v = self._heads(x)  # (B, nh, T, hs), (B, n_kv, T, hs) x2
        return _REFERENCE.probs(q, k, self), repeat_kv(v, self.n_head)  # (B, nh, T, T), (B, nh, T, hs)

    def attention_probs(self, x: Tensor) -> Tensor:
        return self._reference(x)[0]

    def query_key_vectors(self, x: Tensor) -> QueryKeys:
        q, k, _ = self._heads(x)  # (B, nh, T, hs), (B, n_kv, T, hs)
        return QueryKeys(
            q=q,
            k=repeat_kv(k, self.n_head),  # (B, nh, T, hs)
            scale=self.head_size**-0.5,
            slopes=self.alibi_slopes,
            window=self.sliding_window,
            sink=None if self.sink is None else self.sink.detach(),
        )

    def reference_forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        probs, v = self._reference(x)  # (B, nh, T, T), (B, nh, T, hs)
        y = (probs @ v).transpose(1, 2).reshape(B, T, C)  # (B, nh, T, hs) -> (B, T, C)
        if self.gate is not None:
            y = y * torch.sigmoid(self.gate(x))  # (B, T, C)
        return self.out_proj(y)  # (B, T, C)

    def _extra(self) -> dict[str, Tensor | None]:
        # the parameters only some options add, by the names AttentionWeights.extra uses
        extra: dict[str, Tensor | None] = {}
        if self.q_norm is not None:
            extra |= {"q_norm.weight": self.q_norm.weight, "k_norm.weight": self.k_norm.weight}
        if self.gate is not None:
            extra |= {"gate.weight": self.gate.weight, "gate.bias": self.gate.bias}
        if self.sink is not None:
            extra["sink"] = self.sink
        return {name: p for name, p in extra.items() if p is not None}

    def stacked_projections(self) -> dict[nn.Parameter, tuple[int, ...]]:
        return {self.qkv.weight: (self.n_head * self.head_size, self.kv_dim, self.kv_dim)}

    def get_weights(self) -> AttentionWeights:
        weights = AttentionWeights(self.qkv.weight, self.qkv.bias, self.out_proj.weight, self.out_proj.bias)
        weights.extra = self._extra()
        return weights

    def set_weights(self, weights: AttentionWeights) -> None:
        mine = self._extra()
        if set(weights.extra) != set(mine):
            raise ValueError(f"expected extra weights {sorted(mine)}, got {sorted(weights.extra)}")
        set_fused_qkv(self.qkv.weight, self.qkv.bias, self.out_proj, weights)
        for name, param in mine.items():
            copy_param(param, weights.extra[name], name)
