"""The production path: one fused QKV projection and PyTorch's ``scaled_dot_product_attention`` kernel
(flash / memory-efficient attention where the device has them), with a key/value cache for decoding."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from gptmini.attention.alibi import alibi_slopes, score_mask
from gptmini.attention.base import (
    AttentionWeights,
    LMAttention,
    causal_probs,
    copy_param,
    set_fused_qkv,
    set_out_proj,
)
from gptmini.attention.checks import check_heads
from gptmini.attention.kv_cache import KVCache
from gptmini.attention.qk_norm import head_rms_norm
from gptmini.attention.registry import register_attention
from gptmini.attention.rope import apply_rope, rope_tables


@register_attention("sdpa")
class CausalSelfAttention(LMAttention):
    """The default: fused QKV projection and PyTorch's fused scaled_dot_product_attention kernel.

    With ``n_kv_head < n_head`` (grouped-query attention, Ainslie et al. 2023) keys and values have fewer
    heads, each shared by ``n_head // n_kv_head`` consecutive query heads (SDPA's ``enable_gqa`` convention),
    and the KV cache holds only those. ``rope_base`` rotates queries and keys by their positions (RoPE, see
    ``rope``), ``qk_norm`` RMS-normalises them per head first, ``attn_gate`` multiplies each head's output by a
    learned sigmoid gate of the input before the output projection. All of these keep SDPA's fused kernel.

    ALiBi, sliding windows and sinks change the scores themselves. Where FlexAttention can train (a CUDA
    device) they run as its ``score_mod`` / ``block_mask``, so no (T, T) mask is built and fully masked blocks of
    a window are skipped; elsewhere (CPU, whose FlexAttention has no backward; dropout, which it lacks) ALiBi and
    windows become an additive (1, heads, T, T) float mask that SDPA's fused kernel reads (a 3-D mask would send
    the CPU to its unfused math path). A sink's slot carries no value: with FlexAttention it is exact to rescale
    each row by its share ``exp(lse) / (exp(lse) + exp(sink))``; with SDPA the sink becomes one more key, whose
    score comes from an extra head dimension (see ``_attend_sink_slot``), except on short CPU sequences, where
    the explicit softmax is cheaper than the fused kernel's extra dimension. ``score_path`` names the choice.

    Nothing here is sized by ``context_length`` except the RoPE tables, which grow on demand: with rotary, ALiBi
    or no positions the module runs at any length, longer than it was trained on (length extrapolation)."""

    supports_kv_cache = True
    gpt2_compatible = True
    any_length = True
    fused = True
    takes_values = True
    options = frozenset(
        {"n_kv_head", "rope_base", "alibi", "sliding_window", "qk_norm", "attn_gate", "attn_sink"}
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
        self.q_norm = nn.RMSNorm(self.head_size, eps=1e-6) if qk_norm else None
        self.k_norm = nn.RMSNorm(self.head_size, eps=1e-6) if qk_norm else None
        self.gate = nn.Linear(d_model, d_model, bias=bias) if attn_gate else None
        # one learned logit per head that joins each softmax row with a zero value: attention mass that has
        # nowhere useful to go can rest there instead of on real tokens (learned sinks, as in gpt-oss)
        self.sink = nn.Parameter(torch.zeros(n_head)) if attn_sink else None
        self.sliding_window = sliding_window
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window={sliding_window} must be >= 1")
        # ALiBi's per-head slopes; None without it (a buffer, so it follows the module across devices)
        self.register_buffer("alibi_slopes", alibi_slopes(n_head) if alibi else None, persistent=False)
        self._masks: dict[
            tuple[int, torch.device], Tensor
        ] = {}  # score masks of uncached forwards, by (T, device)
        # how an uncached forward computes score-changing options (see score_path); None: by device and length
        self.path: str | None = None
        self._block_masks: dict[
            tuple[int, torch.device], object
        ] = {}  # FlexAttention block masks, by (T, device)
        # the chunked path: queries per chunk, and each length's chunks (first query, end, first key, mask)
        self.chunk_queries = CHUNK_QUERIES
        self._chunk_plans: dict[tuple[int, int, torch.device], list[tuple[int, int, int, Tensor]]] = {}
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
        if self.q_norm is None and not self.rope:
            q, k, v = qkv.split((C, self.kv_dim, self.kv_dim), dim=2)
            v = v if values is None else v + values.to(v.dtype)
            q = q.view(B, T, self.n_head, self.head_size)  # (B, T, nh, hs)
            k, v = (t.view(B, T, self.n_kv_head, self.head_size) for t in (k, v))  # (B, T, n_kv, hs)
            return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        heads = self.n_head + self.n_kv_head
        qk, v = qkv.split((C + self.kv_dim, self.kv_dim), dim=2)
        v = v if values is None else v + values.to(v.dtype)
        qk = qk.view(B, T, heads, self.head_size)  # (B, T, nh + n_kv, hs)
        v = v.view(B, T, self.n_kv_head, self.head_size)  # (B, T, n_kv, hs)
        if self.q_norm is not None:
            # the queries' gain on their heads, the keys' on theirs
            gains = (self.q_norm.weight, self.k_norm.weight)
            qk = head_rms_norm(qk, gains, (self.n_head, self.n_kv_head), self.q_norm.eps)
        if self.rope:
            if start + T > self.rope_cos.shape[0]:
                self._grow_rope(start + T)
            cos, sin = (t[start : start + T, None] for t in (self.rope_cos, self.rope_sin))  # (T, 1, hs)
            qk = apply_rope(qk, cos, sin)
        q, k = qk.split((self.n_head, self.n_kv_head), dim=2)
        # (B, nh, T, hs), (B, n_kv, T, hs), (B, n_kv, T, hs)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def _grow_rope(self, length: int) -> None:
        # positions past the training context (evaluation at longer lengths): double, so growth happens rarely
        size = max(length, 2 * self.rope_cos.shape[0])
        cos, sin = rope_tables(self.head_size, size, self.rope_base)
        self.rope_cos, self.rope_sin = cos.to(self.rope_cos.device), sin.to(self.rope_sin.device)

    @property
    def changes_scores(self) -> bool:
        # options that SDPA's is_causal cannot express: they need a mask, or FlexAttention
        return self.alibi_slopes is not None or self.sliding_window is not None or self.sink is not None

    def score_path(self, T: int, device: torch.device) -> str:
        """How an uncached forward of T tokens with ALiBi, a window or a sink runs on ``device``: "flex"
        (FlexAttention), "mask" (SDPA with the additive float mask, the sink as a masked column), "chunked" (SDPA
        per chunk of queries, on the keys they can see, with that rectangle of the mask), "sink_slot" (SDPA with
        the sink as an extra key dimension) or "explicit" (scores, mask, softmax, weights . values)."""
        if self.path is not None:
            return self.path
        if device.type == "cuda" and flex_available() and not (self.training and self.dropout > 0):
            return "flex"  # FlexAttention has no dropout
        if self.sink is None:
            return "chunked" if device.type == "cpu" and T >= 2 * self.chunk_queries else "mask"
        if device.type == "cpu" and T <= EXPLICIT_SINK_MAX_LEN:
            return "explicit"
        # the sink slot leaves the scores of real keys as they are: plain causal ones only
        return "mask" if self.alibi_slopes is not None or self.sliding_window is not None else "sink_slot"

    def _key_mask(self, queries: int, start: int, device: torch.device) -> Tensor | None:
        # what the scores of real keys get added, (1, nh or 1, T, start + T); None: plain causal attention, which
        # the kernel does without a mask
        if not self.changes_scores:
            return None
        if start == 0:
            # the training shape: the same (T, T) mask every step, built once per length and device
            key = (queries, device)
            if key not in self._masks:
                self._masks[key] = score_mask(
                    self.n_head, queries, 0, self.alibi_slopes, self.sliding_window, device
                )
            return self._masks[key]
        # decoding: a new offset each token, a (T, start + T) mask that costs little
        return score_mask(self.n_head, queries, start, self.alibi_slopes, self.sliding_window, device)

    def _score_mask(self, queries: int, start: int, device: torch.device) -> Tensor | None:
        # the key mask, and with a sink one more key column whose score is the head's sink logit (SDPA sees the
        # sink as an appended zero key, see _with_sink_slot)
        mask = self._key_mask(queries, start, device)
        if mask is None or self.sink is None:
            return mask
        mask = mask.expand(1, self.n_head, *mask.shape[-2:])  # (1, nh, T, S)
        sink = self.sink.to(mask.dtype)[None, :, None, None].expand(1, -1, queries, 1)  # (1, nh, T, 1)
        return torch.cat((mask, sink), dim=-1)  # (1, nh, T, S + 1)

    def _repeat_kv(self, t: Tensor) -> Tensor:
        # (B, n_kv, T, hs) -> (B, nh, T, hs): query head h reads kv head h // group
        return t if not self.grouped else t.repeat_interleave(self.n_head // self.n_kv_head, dim=1)

    def _with_sink_slot(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if self.sink is None:
            return k, v
        zero = k.new_zeros(*k.shape[:2], 1, k.shape[-1])  # (B, n_kv, 1, hs): a key with score 0, a zero value
        return torch.cat((k, zero), dim=2), torch.cat((v, zero), dim=2)

    def _attend_sink_slot(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        # The sink as a real key at position 0 for SDPA's fused kernel, without a mask that needs a gradient:
        # each query gains a dimension holding sink_h / scale and keys one that is 1 on the sink key only, so the
        # sink key's score is exactly sink_h and every other score is unchanged; its value is zero. A leading
        # dummy query (it sees only the sink) keeps the causal mask square, so is_causal still applies.
        if self.alibi_slopes is not None or self.sliding_window is not None:
            raise ValueError(
                "the sink slot path takes plain causal scores: use path='mask' with ALiBi or a window"
            )
        B, nh, T, hs = q.shape
        scale = 1.0 / math.sqrt(hs)
        sink = (self.sink.to(q.dtype) / scale)[None, :, None, None].expand(B, nh, T, 1)
        q = F.pad(torch.cat((q, sink), dim=-1), (0, 0, 1, 0))  # (B, nh, 1 + T, hs + 1)
        k = F.pad(k, (0, 1, 1, 0))  # (B, n_kv, 1 + T, hs + 1)
        k[:, :, 0, hs] = 1.0  # the sink key's extra dimension (in place: the pad's backward does not read it)
        v = F.pad(v, (0, 1, 1, 0))  # (B, n_kv, 1 + T, hs + 1): the sink's value is zero
        y = self._attend(q, k, v, is_causal=True, scale=scale)  # (B, nh, 1 + T, hs + 1)
        return y[:, :, 1:, :hs]

    def _chunks(self, T: int, device: torch.device) -> list[tuple[int, int, int, Tensor]]:
        # Chunks of C queries [a, b) and the keys they can see, [max(0, a - W + 1), b) with a window W, else
        # [0, b), with the mask of that rectangle. With a window, every whole chunk past the first W - 1 keys sees
        # the same relative positions, so they share one mask (ALiBi's bias too depends only on the distance).
        C, W = self.chunk_queries, self.sliding_window
        key = (T, C, device)
        if key not in self._chunk_plans:
            plan, shared = [], None
            for a in range(0, T, C):
                b, k0 = min(a + C, T), (0 if W is None else max(0, a - W + 1))
                whole = k0 > 0 and b - a == C
                if whole and shared is not None:
                    mask = shared
                else:
                    mask = score_mask(self.n_head, b - a, a, self.alibi_slopes, W, device)[
                        ..., k0:
                    ].contiguous()
                    shared = mask if whole else None
                plan.append((a, b, k0, mask))  # mask: (1, nh or 1, b - a, b - k0)
            self._chunk_plans[key] = plan
        return self._chunk_plans[key]

    def _attend_chunked(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        # With a mask SDPA's kernel computes every block of the (T, T) scores, the future's too, and on a long
        # sequence most of a window's past; a chunk of queries needs only the keys up to its last one (with a
        # window, from W - 1 before its first), so each chunk is one SDPA call on its own keys (slices of k and v:
        # no copies): a window's work grows as T * (C + W), not T^2, and ALiBi reads half its bias.
        if self.sink is not None:
            raise ValueError("the chunked path takes no sink: use path='mask' or 'explicit'")
        chunks = self._chunks(q.shape[-2], q.device)
        outs = [
            self._attend(q[:, :, a:b], k[:, :, k0:b], v[:, :, k0:b], attn_mask=m) for a, b, k0, m in chunks
        ]
        return torch.cat(outs, dim=2)  # (B, nh, T, hs)

    def _probs(self, q: Tensor, k: Tensor) -> Tensor:
        # explicit softmax of each query head against its group's keys, (B, nh, T, T); with a sink, the real keys'
        # share only: rows sum to 1 minus what rests on the sink, whose value is zero
        T = q.shape[-2]
        k = self._repeat_kv(k)
        mask = self._key_mask(T, 0, q.device)
        if mask is None:
            return causal_probs(q, k)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_size) + mask  # (B, nh, T, T)
        if self.sink is None:
            return torch.softmax(scores, dim=-1)
        sink = self.sink.to(scores.dtype)[None, :, None, None].expand(*scores.shape[:-1], 1)  # (B, nh, T, 1)
        return torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1)[..., :T]

    def _attend_explicit(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        probs = self._probs(q, k)
        if self.training and self.dropout > 0:
            probs = F.dropout(probs, self.dropout)
        return probs @ self._repeat_kv(v)  # (B, nh, T, hs)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, **kwargs: object) -> Tensor:
        if self.grouped:  # the kernel repeats each kv head for its group of query heads without copying
            kwargs["enable_gqa"] = True
        return F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, **kwargs
        )

    def _flex(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        # ALiBi as a score_mod, causality and the window as a block mask (blocks wholly outside are skipped)
        T = q.shape[-2]
        key = (T, q.device)
        if key not in self._block_masks:
            self._block_masks[key] = flex_block_mask(T, self.sliding_window, q.device)
        slopes = self.alibi_slopes
        score_mod = None if slopes is None else alibi_score_mod(slopes)
        y, lse = flex_attend(
            q, k, v, score_mod, self._block_masks[key], self.grouped, lse=self.sink is not None
        )
        if lse is None:  # no sink
            return y
        # the sink's share of each row is exp(sink) / (exp(lse) + exp(sink)); its value is zero, so the real
        # keys' output shrinks by the rest: sigmoid(lse - sink)
        keep = torch.sigmoid(lse - self.sink.to(lse.dtype)[None, :, None])  # (B, nh, T)
        return y * keep[..., None].to(y.dtype)

    def forward(self, x: Tensor, kv_cache: KVCache | None = None, values: Tensor | None = None) -> Tensor:
        B, T, C = x.shape
        start = 0 if kv_cache is None else kv_cache.pos  # absolute position of the first new token
        q, k, v = self._heads(x, start, values)  # keys enter the cache already rotated: each is rotated once
        if kv_cache is not None:
            k, v = kv_cache.update(k, v)  # (B, n_kv, start + T, hs)
        path = self.score_path(T, x.device) if kv_cache is None and self.changes_scores else None
        if path == "flex":
            y = self._flex(q, k, v)
        elif path == "sink_slot":
            y = self._attend_sink_slot(q, k, v)
        elif path == "chunked":
            y = self._attend_chunked(q, k, v)
        elif path == "explicit":
            y = self._attend_explicit(q, k, v)
        elif (mask := self._score_mask(T, start, x.device)) is not None:
            # ALiBi biases, windows and the sink as an additive mask: (1, nh or 1, T, start + T [+ 1])
            k, v = self._with_sink_slot(k, v)
            y = self._attend(q, k, v, attn_mask=mask)
        elif kv_cache is None:
            # the kernel never materialises the (T, T) probabilities: flash / memory-efficient attention
            y = self._attend(q, k, v, is_causal=True)
        else:
            if T == 1:
                # a single new token may see every cached key
                y = self._attend(q, k, v, is_causal=False)
            elif start == 0:
                # empty cache: square and causal, exactly the uncached case
                y = self._attend(q, k, v, is_causal=True)
            else:
                # is_causal aligns the mask top-left, wrong for T < start + T; build it explicitly instead:
                # query i (absolute start + i) may attend to keys 0..start + i (True = attend)
                allowed = torch.ones(T, start + T, dtype=torch.bool, device=x.device).tril(diagonal=start)
                y = self._attend(q, k, v, attn_mask=allowed)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, nh, hs) -> merge heads
        if self.gate is not None:
            y = y * torch.sigmoid(self.gate(x))  # each head's output, dimension by dimension
        return self.out_proj(y)

    def _reference(self, x: Tensor) -> tuple[Tensor, Tensor]:
        # the explicit path the fused kernel skips: scores -> mask/bias -> softmax, with each query head's values
        q, k, v = self._heads(x)
        return self._probs(q, k), self._repeat_kv(v)  # (B, nh, T, T), (B, nh, T, hs)

    def attention_probs(self, x: Tensor) -> Tensor:
        return self._reference(x)[0]

    def reference_forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        probs, v = self._reference(x)
        y = (probs @ v).transpose(1, 2).reshape(B, T, C)  # (B, nh, T, hs) -> (B, T, C)
        if self.gate is not None:
            y = y * torch.sigmoid(self.gate(x))
        return self.out_proj(y)

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
        set_fused_qkv(self.qkv.weight, self.qkv.bias, weights)
        set_out_proj(self.out_proj, weights)
        for name, param in mine.items():
            copy_param(param, weights.extra[name], name)


# On a CPU, up to this many tokens the explicit softmax with a sink beats SDPA's fused kernel with the sink slot
# (one more head dimension and one more query and key): measured both ways with ``make bench`` (attention options)
EXPLICIT_SINK_MAX_LEN = 128
# Queries per chunk of the chunked path; a CPU takes it for ALiBi and windows from two chunks on (shorter sequences
# run as fast with the whole mask): measured with ``make bench`` (attention options) for windows of 32 to 1,024
# keys and for ALiBi
CHUNK_QUERIES = 256


# --- FlexAttention (PyTorch >= 2.5), used where it can train: see CausalSelfAttention ---------------------------


@functools.cache
def flex_available() -> bool:
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def _compiled_flex() -> Callable[..., object]:
    # FlexAttention is fast only compiled: the eager version is a reference that materialises the scores
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def flex_block_mask(T: int, window: int | None, device: torch.device) -> object:
    from torch.nn.attention.flex_attention import create_block_mask

    def causal(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return q_idx >= kv_idx

    def windowed(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return (q_idx >= kv_idx) & (q_idx - kv_idx < window)

    return create_block_mask(causal if window is None else windowed, None, None, T, T, device=device)


def alibi_score_mod(slopes: Tensor) -> Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]:
    def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return score - slopes[h] * (q_idx - kv_idx)

    return score_mod


def flex_attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    score_mod: Callable | None,
    block_mask: object,
    gqa: bool,
    lse: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """FlexAttention's output (B, nh, T, hs) and, if ``lse``, each row's log-sum-exp of the scores (B, nh, T),
    else None (the compiled CPU kernel, inference only, computes no log-sum-exp)."""
    # compiled on CUDA; the eager reference elsewhere (CPU inference, tests), which compiles nothing
    flex = _compiled_flex() if q.is_cuda else _eager_flex()
    if not lse:
        return flex(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=gqa), None
    from torch.nn.attention import flex_attention as api

    if hasattr(api, "AuxRequest"):  # PyTorch >= 2.9; return_lse before
        y, aux = flex(
            q,
            k,
            v,
            score_mod=score_mod,
            block_mask=block_mask,
            enable_gqa=gqa,
            return_aux=api.AuxRequest(lse=True),
        )
        return y, aux.lse
    return flex(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=gqa, return_lse=True)


def _eager_flex() -> Callable[..., object]:
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention
