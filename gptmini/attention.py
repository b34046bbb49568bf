"""Attention, concept by concept: from a weightless dot product to the fused kernel the GPT trains with.

Sections 1-6 follow chapter 3 of Raschka's "Build a Large Language Model (From Scratch)" line for line
(constructor signatures and parameter creation order included), so its worked examples reproduce under the
same ``torch.manual_seed``. Sections 7-8 give an independent NumPy oracle and the older additive
(Bahdanau) attention. Section 9 is what the language model uses: a common causal interface
(``forward(x, kv_cache=None)``, ``attention_probs(x)``, ``out_proj``), a key/value cache, several
interchangeable implementations and a registry to pick one by name.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor


def _check_length(num_tokens: int, context_length: int, start: int = 0) -> None:
    # Plain ints only: no tensor is read, so this never forces a device sync.
    if start + num_tokens > context_length:
        if start:
            raise ValueError(
                f"{start} cached + {num_tokens} new tokens exceed context_length={context_length}"
            )
        raise ValueError(f"input has T={num_tokens} tokens but context_length={context_length}")


def _check_heads(d_model: int, n_head: int) -> None:
    if n_head <= 0 or d_model % n_head != 0:
        raise ValueError(f"d_model={d_model} must be divisible by n_head={n_head}")


# ---------------------------------------------------------------------------------------------------------
# 1. Simplified self-attention, no trainable weights (book 3.3)
#    Every token is its own query, key and value: scores are raw dot products between the inputs.
# ---------------------------------------------------------------------------------------------------------


def simplified_attention_scores(x: Tensor) -> Tensor:
    return x @ x.transpose(-2, -1)  # (..., T, T): omega[i, j] = x_i . x_j


def simplified_attention_weights(x: Tensor) -> Tensor:
    # softmax (not division by the sum) keeps weights positive and handles negative or extreme scores
    return torch.softmax(simplified_attention_scores(x), dim=-1)  # (..., T, T), rows sum to 1


def simplified_self_attention(x: Tensor) -> Tensor:
    # each context vector is a weighted sum of all inputs
    return simplified_attention_weights(x) @ x  # (..., T, d)


# ---------------------------------------------------------------------------------------------------------
# 2. Self-attention with trainable weights (book 3.4.2): queries, keys and values are learned projections
# ---------------------------------------------------------------------------------------------------------


class SelfAttention_v1(nn.Module):
    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        # created in this order with torch.rand so a seeded run matches the book
        self.W_query = nn.Parameter(torch.rand(d_in, d_out))
        self.W_key = nn.Parameter(torch.rand(d_in, d_out))
        self.W_value = nn.Parameter(torch.rand(d_in, d_out))

    def forward(self, x: Tensor) -> Tensor:
        keys = x @ self.W_key  # (..., T, d_out)
        queries = x @ self.W_query
        values = x @ self.W_value

        attn_scores = queries @ keys.transpose(-2, -1)  # omega, (..., T, T)
        # dividing by sqrt(d_k) stops dot products growing with the dimension and saturating the softmax
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        return attn_weights @ values  # (..., T, d_out)


# ---------------------------------------------------------------------------------------------------------
# 3. The same with nn.Linear (book 3.4.2): better initialisation, optional bias
# ---------------------------------------------------------------------------------------------------------


class SelfAttention_v2(nn.Module):
    def __init__(self, d_in: int, d_out: int, qkv_bias: bool = False):
        super().__init__()
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)

    def forward(self, x: Tensor) -> Tensor:
        keys = self.W_key(x)  # (..., T, d_out)
        queries = self.W_query(x)
        values = self.W_value(x)

        attn_scores = queries @ keys.transpose(-2, -1)  # (..., T, T)
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        return attn_weights @ values


# ---------------------------------------------------------------------------------------------------------
# 4. Causal attention (book 3.5): hide future tokens, drop some attention weights while training
# ---------------------------------------------------------------------------------------------------------


class CausalAttention(nn.Module):
    def __init__(self, d_in: int, d_out: int, context_length: int, dropout: float, qkv_bias: bool = False):
        super().__init__()
        self.d_out = d_out
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.dropout = nn.Dropout(dropout)
        # 1 above the diagonal marks a future token; a buffer follows the module across devices
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))

    def attention_weights(self, x: Tensor) -> Tensor:
        num_tokens = x.shape[1]
        _check_length(num_tokens, self.mask.shape[0])
        keys = self.W_key(x)  # (B, T, d_out)
        queries = self.W_query(x)

        attn_scores = queries @ keys.transpose(1, 2)  # (B, T, T)
        # -inf before the softmax (rather than zeros after it) keeps every row summing to 1
        attn_scores.masked_fill_(self.mask.bool()[:num_tokens, :num_tokens], -torch.inf)
        return torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)  # (B, T, T), no dropout

    def forward(self, x: Tensor) -> Tensor:
        attn_weights = self.dropout(self.attention_weights(x))
        return attn_weights @ self.W_value(x)  # (B, T, d_out)


# ---------------------------------------------------------------------------------------------------------
# 5. Multi-head attention by stacking single heads (book 3.6.1): output width is d_out * num_heads
# ---------------------------------------------------------------------------------------------------------


class MultiHeadAttentionWrapper(nn.Module):
    def __init__(
        self,
        d_in: int,
        d_out: int,
        context_length: int,
        dropout: float,
        num_heads: int,
        qkv_bias: bool = False,
    ):
        super().__init__()
        self.heads = nn.ModuleList(
            [CausalAttention(d_in, d_out, context_length, dropout, qkv_bias) for _ in range(num_heads)]
        )

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([head(x) for head in self.heads], dim=-1)  # (B, T, num_heads * d_out)


# ---------------------------------------------------------------------------------------------------------
# 6. Multi-head attention with weight splits (book 3.6.2): one projection each for Q, K, V, split into
#    heads by a reshape, so all heads run in one batched matmul
# ---------------------------------------------------------------------------------------------------------


class MultiHeadAttention(nn.Module):
    def __init__(
        self,
        d_in: int,
        d_out: int,
        context_length: int,
        dropout: float,
        num_heads: int,
        qkv_bias: bool = False,
    ):
        super().__init__()
        if num_heads <= 0 or d_out % num_heads != 0:
            raise ValueError(f"d_out={d_out} must be divisible by num_heads={num_heads}")

        self.d_out = d_out
        self.num_heads = num_heads
        self.head_dim = d_out // num_heads  # heads share d_out instead of each producing d_out

        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)  # mixes the concatenated heads
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))

    def _split_heads(self, t: Tensor) -> Tensor:
        b, num_tokens, _ = t.shape
        # (b, T, d_out) -> (b, T, nh, hd) -> (b, nh, T, hd)
        return t.view(b, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, x: Tensor) -> Tensor:
        b, num_tokens, _ = x.shape
        _check_length(num_tokens, self.mask.shape[0])
        keys = self._split_heads(self.W_key(x))  # (b, nh, T, hd)
        queries = self._split_heads(self.W_query(x))
        values = self._split_heads(self.W_value(x))

        attn_scores = queries @ keys.transpose(2, 3)  # (b, nh, T, T): one score matrix per head
        attn_scores.masked_fill_(self.mask.bool()[:num_tokens, :num_tokens], -torch.inf)
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        attn_weights = self.dropout(attn_weights)

        context_vec = (attn_weights @ values).transpose(1, 2)  # (b, T, nh, hd)
        context_vec = context_vec.contiguous().view(b, num_tokens, self.d_out)  # merge the heads
        return self.out_proj(context_vec)


# ---------------------------------------------------------------------------------------------------------
# 7. A NumPy reference of general attention, softmax(Q K^T / sqrt(d_k)) V. Shares no code with the torch
#    modules, so tests can use it as an independent oracle. Computes in float64.
# ---------------------------------------------------------------------------------------------------------


def numpy_softmax(z: np.ndarray, axis: int = -1) -> np.ndarray:
    # subtracting the row max leaves softmax unchanged but keeps exp() from overflowing
    z = z - np.max(z, axis=axis, keepdims=True)
    e = np.exp(z)
    return e / np.sum(e, axis=axis, keepdims=True)


def numpy_attention(
    X: np.ndarray,
    W_q: np.ndarray,
    W_k: np.ndarray,
    W_v: np.ndarray,
    causal: bool = False,
    b_q: np.ndarray | None = None,
    b_k: np.ndarray | None = None,
    b_v: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    X = np.asarray(X, dtype=np.float64)  # (..., T, d)
    Q, K, V = X @ W_q, X @ W_k, X @ W_v  # (..., T, d_k), (..., T, d_k), (..., T, d_v)
    if b_q is not None:
        Q = Q + b_q
    if b_k is not None:
        K = K + b_k
    if b_v is not None:
        V = V + b_v
    scores = Q @ np.swapaxes(K, -1, -2) / np.sqrt(K.shape[-1])  # (..., T, T)
    if causal:
        T = scores.shape[-1]
        scores = np.where(np.triu(np.ones((T, T), dtype=bool), k=1), -np.inf, scores)
    weights = numpy_softmax(scores, axis=-1)
    return weights @ V, weights  # (..., T, d_v), (..., T, T)


def numpy_multihead_attention(
    X: np.ndarray,
    W_q: np.ndarray,
    W_k: np.ndarray,
    W_v: np.ndarray,
    W_o: np.ndarray,
    causal: bool = False,
    b_q: np.ndarray | None = None,
    b_k: np.ndarray | None = None,
    b_v: np.ndarray | None = None,
    b_o: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    # W_q, W_k, W_v: (h, d, d_k) one matrix per head; biases (h, d_k); W_o: (h * d_k, d_out); b_o: (d_out,)
    outputs, weights = [], []
    for h in range(W_q.shape[0]):
        out, w = numpy_attention(
            X,
            W_q[h],
            W_k[h],
            W_v[h],
            causal=causal,
            b_q=None if b_q is None else b_q[h],
            b_k=None if b_k is None else b_k[h],
            b_v=None if b_v is None else b_v[h],
        )
        outputs.append(out)
        weights.append(w)
    concat = np.concatenate(outputs, axis=-1)  # (..., T, h * d_k)
    output = concat @ W_o if b_o is None else concat @ W_o + b_o  # (..., T, d_out)
    return output, np.stack(weights, axis=-3)  # (..., h, T, T)


# ---------------------------------------------------------------------------------------------------------
# 8. Additive (Bahdanau) attention: a small MLP scores each (query, key) pair instead of a dot product.
#    The encoder-decoder RNN ancestor of self-attention (book 3.1-3.2).
# ---------------------------------------------------------------------------------------------------------


class BahdanauAttention(nn.Module):
    def __init__(self, query_dim: int, key_dim: int, hidden_dim: int):
        super().__init__()
        self.W_q = nn.Linear(query_dim, hidden_dim, bias=False)
        self.W_k = nn.Linear(key_dim, hidden_dim, bias=False)
        self.v = nn.Linear(hidden_dim, 1, bias=False)

    def forward(
        self, query: Tensor, keys: Tensor, values: Tensor | None = None, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        # query (B, dq), keys (B, S, dk), values (B, S, dv); mask (B, S) bool, True = may be attended
        values = keys if values is None else values
        hidden = torch.tanh(self.W_q(query).unsqueeze(1) + self.W_k(keys))  # (B, S, hidden)
        scores = self.v(hidden).squeeze(-1)  # (B, S): e = v^T tanh(W_q q + W_k k)
        if mask is not None:
            scores = scores.masked_fill(~mask, -torch.inf)
        weights = torch.softmax(scores, dim=-1)  # (B, S)
        context = (weights.unsqueeze(1) @ values).squeeze(1)  # (B, dv)
        return context, weights


# ---------------------------------------------------------------------------------------------------------
# 9. The language-model interface.
#    Every registered class takes (d_model, n_head, context_length, dropout, bias), maps (B, T, d_model) to
#    (B, T, d_model), is causal, exposes out_proj (the residual projection) and attention_probs(x), and
#    says whether it accepts a KVCache for incremental decoding.
# ---------------------------------------------------------------------------------------------------------


class KVCache:
    """Per-layer key/value cache, preallocated to max_len."""

    def __init__(
        self,
        batch_size: int,
        n_head: int,
        max_len: int,
        head_size: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        self.max_len = max_len
        # preallocated once: decoding then writes in place instead of concatenating every step
        self.k = torch.zeros(batch_size, n_head, max_len, head_size, device=device, dtype=dtype)
        self.v = torch.zeros(batch_size, n_head, max_len, head_size, device=device, dtype=dtype)
        self.pos = 0  # number of positions already stored

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        # k, v: (B, nh, T_new, hs) -> keys/values of all positions so far, (B, nh, pos + T_new, hs)
        end = self.pos + k.shape[2]
        if end > self.max_len:
            raise ValueError(
                f"KV cache full: {self.pos} cached + {k.shape[2]} new positions exceed max_len={self.max_len}"
            )
        self.k[:, :, self.pos : end] = k
        self.v[:, :, self.pos : end] = v
        self.pos = end
        # cast back so a cache kept in float32 still works under autocast
        return self.k[:, :, :end].to(k.dtype), self.v[:, :, :end].to(v.dtype)

    def reset(self) -> None:
        self.pos = 0  # old entries are simply overwritten


def _reject_cache(module: nn.Module, kv_cache: KVCache | None) -> None:
    if kv_cache is not None:
        raise ValueError(
            f"{type(module).__name__} does not support a KV cache (supports_kv_cache=False); "
            "use attention 'sdpa' or 'mha' for cached decoding"
        )


def _causal_probs(q: Tensor, k: Tensor) -> Tensor:
    # explicit softmax(q k^T / sqrt(hs)) with the future masked: (B, nh, T, hs) x2 -> (B, nh, T, T)
    T = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(k.shape[-1])
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(diagonal=1)
    return torch.softmax(scores.masked_fill(future, -torch.inf), dim=-1)


class MultiHeadAttentionWrapperAdapter(MultiHeadAttentionWrapper):
    """Registry 'wrapper': book 3.6.1 heads of width d_model // n_head, concatenated, plus out_proj."""

    supports_kv_cache = False

    def __init__(
        self, d_model: int, n_head: int, context_length: int, dropout: float = 0.0, bias: bool = True
    ):
        _check_heads(d_model, n_head)
        super().__init__(d_model, d_model // n_head, context_length, dropout, n_head, qkv_bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x: Tensor, kv_cache: KVCache | None = None) -> Tensor:
        _reject_cache(self, kv_cache)
        return self.out_proj(super().forward(x))  # (B, T, d_model)

    def attention_probs(self, x: Tensor) -> Tensor:
        return torch.stack([head.attention_weights(x) for head in self.heads], dim=1)  # (B, nh, T, T)


class MultiHeadAttentionAdapter(MultiHeadAttention):
    """Registry 'mha': book 3.6.2 with d_out = d_model and a KV cache (as in the book's chapter 4 bonus)."""

    supports_kv_cache = True

    def __init__(
        self, d_model: int, n_head: int, context_length: int, dropout: float = 0.0, bias: bool = True
    ):
        _check_heads(d_model, n_head)
        super().__init__(d_model, d_model, context_length, dropout, n_head, qkv_bias=bias)
        if not bias:
            # the book's out_proj always has a bias; here `bias` governs every projection
            self.out_proj = nn.Linear(d_model, d_model, bias=False)

    def _weights_and_values(self, x: Tensor, kv_cache: KVCache | None) -> tuple[Tensor, Tensor]:
        num_tokens = x.shape[1]
        start = 0 if kv_cache is None else kv_cache.pos  # absolute position of the first new token
        _check_length(num_tokens, self.mask.shape[0], start)
        queries = self._split_heads(self.W_query(x))  # (b, nh, T, hd)
        keys = self._split_heads(self.W_key(x))
        values = self._split_heads(self.W_value(x))
        if kv_cache is not None:
            keys, values = kv_cache.update(keys, values)  # (b, nh, start + T, hd)

        attn_scores = queries @ keys.transpose(2, 3)  # (b, nh, T, start + T)
        # rows start..start+T-1 of the book's mask: each new query sees the cache and itself, not the future
        mask_bool = self.mask.bool()[start : start + num_tokens, : start + num_tokens]
        attn_scores.masked_fill_(mask_bool, -torch.inf)
        return torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1), values

    def forward(self, x: Tensor, kv_cache: KVCache | None = None) -> Tensor:
        b, num_tokens, _ = x.shape
        attn_weights, values = self._weights_and_values(x, kv_cache)
        context_vec = (self.dropout(attn_weights) @ values).transpose(1, 2)  # (b, T, nh, hd)
        return self.out_proj(context_vec.reshape(b, num_tokens, self.d_out))

    def attention_probs(self, x: Tensor) -> Tensor:
        return self._weights_and_values(x, None)[0]  # (B, nh, T, T)


class EinsumMultiHeadAttention(nn.Module):
    """Multi-head attention written as index contractions over explicit per-head weight tensors."""

    supports_kv_cache = False

    def __init__(
        self, d_model: int, n_head: int, context_length: int, dropout: float = 0.0, bias: bool = True
    ):
        super().__init__()
        _check_heads(d_model, n_head)
        self.n_head = n_head
        self.d_k = d_model // n_head
        self.d_model = d_model
        self.W_q = nn.Parameter(torch.empty(n_head, d_model, self.d_k))  # (h, d, d_k)
        self.W_k = nn.Parameter(torch.empty(n_head, d_model, self.d_k))
        self.W_v = nn.Parameter(torch.empty(n_head, d_model, self.d_k))
        for name in ("b_q", "b_k", "b_v"):
            self.register_parameter(name, nn.Parameter(torch.empty(n_head, self.d_k)) if bias else None)
        # W_o (h * d_k, d) lives in a Linear so the model finds and re-initialises it like any out_proj
        self.out_proj = nn.Linear(n_head * self.d_k, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer(
            "mask", torch.ones(context_length, context_length, dtype=torch.bool).triu(1), persistent=False
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1 / math.sqrt(self.d_model)  # the range nn.Linear(d_model, ...) draws from
        for p in (self.W_q, self.W_k, self.W_v, self.b_q, self.b_k, self.b_v):
            if p is not None:
                nn.init.uniform_(p, -bound, bound)

    @property
    def W_o(self) -> Tensor:
        return self.out_proj.weight.T  # (h * d_k, d)

    def _project(self, x: Tensor, W: Tensor, b: Tensor | None) -> Tensor:
        out = torch.einsum("btd,hdk->bhtk", x, W)  # (B, h, T, d_k)
        return out if b is None else out + b[:, None, :]

    def attention_probs(self, x: Tensor) -> Tensor:
        T = x.shape[1]
        _check_length(T, self.mask.shape[0])
        q = self._project(x, self.W_q, self.b_q)
        k = self._project(x, self.W_k, self.b_k)
        scores = torch.einsum("bhqk,bhsk->bhqs", q, k) / math.sqrt(self.d_k)  # (B, h, T, T)
        return torch.softmax(scores.masked_fill(self.mask[:T, :T], -torch.inf), dim=-1)

    def forward(self, x: Tensor, kv_cache: KVCache | None = None) -> Tensor:
        _reject_cache(self, kv_cache)
        B, T, _ = x.shape
        probs = self.dropout(self.attention_probs(x))
        v = self._project(x, self.W_v, self.b_v)  # (B, h, T, d_k)
        heads = torch.einsum("bhqs,bhsk->bqhk", probs, v)  # (B, T, h, d_k): heads land side by side
        return self.out_proj(heads.reshape(B, T, self.n_head * self.d_k))  # concat(heads) @ W_o


class AdditiveSelfAttention(nn.Module):
    """Causal multi-head self-attention with Bahdanau scores: e_ij = v_h^T tanh(q_i + k_j) per head."""

    supports_kv_cache = False

    def __init__(
        self, d_model: int, n_head: int, context_length: int, dropout: float = 0.0, bias: bool = True
    ):
        super().__init__()
        _check_heads(d_model, n_head)
        self.n_head = n_head
        self.head_size = d_model // n_head
        self.W_query = nn.Linear(d_model, d_model, bias=bias)
        self.W_key = nn.Linear(d_model, d_model, bias=bias)
        self.W_value = nn.Linear(d_model, d_model, bias=bias)
        self.v = nn.Parameter(torch.empty(n_head, self.head_size))  # one scoring vector per head
        nn.init.uniform_(self.v, -1 / math.sqrt(self.head_size), 1 / math.sqrt(self.head_size))
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer(
            "mask", torch.ones(context_length, context_length, dtype=torch.bool).triu(1), persistent=False
        )

    def _split_heads(self, t: Tensor) -> Tensor:
        B, T, _ = t.shape
        return t.view(B, T, self.n_head, self.head_size).transpose(1, 2)  # (B, nh, T, hs)

    def attention_probs(self, x: Tensor) -> Tensor:
        T = x.shape[1]
        _check_length(T, self.mask.shape[0])
        q = self._split_heads(self.W_query(x))
        k = self._split_heads(self.W_key(x))
        # every (query, key) pair gets its own hidden vector: O(B * nh * T^2 * hs) memory, unlike a dot product
        hidden = torch.tanh(q.unsqueeze(3) + k.unsqueeze(2))  # (B, nh, T, T, hs)
        scores = torch.einsum("bhqsk,hk->bhqs", hidden, self.v)  # (B, nh, T, T); no sqrt(d) scaling needed
        return torch.softmax(scores.masked_fill(self.mask[:T, :T], -torch.inf), dim=-1)

    def forward(self, x: Tensor, kv_cache: KVCache | None = None) -> Tensor:
        _reject_cache(self, kv_cache)
        B, T, C = x.shape
        probs = self.dropout(self.attention_probs(x))
        y = probs @ self._split_heads(self.W_value(x))  # (B, nh, T, hs)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, C))


class CausalSelfAttention(nn.Module):
    """The default: fused QKV projection and PyTorch's fused scaled_dot_product_attention kernel."""

    supports_kv_cache = True

    def __init__(
        self, d_model: int, n_head: int, context_length: int, dropout: float = 0.0, bias: bool = True
    ):
        super().__init__()
        _check_heads(d_model, n_head)
        self.d_model = d_model
        self.n_head = n_head
        self.head_size = d_model // n_head
        self.context_length = context_length
        self.dropout = dropout
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)  # one matmul instead of three
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def _qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(self.d_model, dim=2)  # 3 x (B, T, C)
        # (B, T, C) -> (B, T, nh, hs) -> (B, nh, T, hs)
        return tuple(t.view(B, T, self.n_head, self.head_size).transpose(1, 2) for t in (q, k, v))

    def forward(self, x: Tensor, kv_cache: KVCache | None = None) -> Tensor:
        B, T, C = x.shape
        _check_length(T, self.context_length)
        q, k, v = self._qkv(x)
        dropout_p = self.dropout if self.training else 0.0
        if kv_cache is None:
            # the kernel never materialises the (T, T) probabilities: flash / memory-efficient attention
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
        else:
            start = kv_cache.pos  # absolute position of the first new token
            k, v = kv_cache.update(k, v)  # (B, nh, start + T, hs)
            if T == 1:
                # a single new token may see every cached key
                y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=False)
            elif start == 0:
                # empty cache: square and causal, exactly the uncached case
                y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
            else:
                # is_causal aligns the mask top-left, wrong for T < start + T; build it explicitly instead:
                # query i (absolute start + i) may attend to keys 0..start + i (True = attend)
                allowed = torch.ones(T, start + T, dtype=torch.bool, device=x.device).tril(diagonal=start)
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout_p)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, nh, hs) -> merge heads
        return self.out_proj(y)

    def attention_probs(self, x: Tensor) -> Tensor:
        # the explicit path the fused kernel skips, for inspection and plotting
        _check_length(x.shape[1], self.context_length)
        q, k, _ = self._qkv(x)
        return _causal_probs(q, k)  # (B, nh, T, T)


class TorchMultiheadAttention(nn.Module):
    """torch.nn.MultiheadAttention behind the same causal interface."""

    supports_kv_cache = False

    def __init__(
        self, d_model: int, n_head: int, context_length: int, dropout: float = 0.0, bias: bool = True
    ):
        super().__init__()
        _check_heads(d_model, n_head)
        self.n_head = n_head
        self.mha = nn.MultiheadAttention(d_model, n_head, dropout=dropout, bias=bias, batch_first=True)
        # True = may NOT attend (nn.MultiheadAttention's convention, the opposite of sdpa's boolean mask)
        self.register_buffer(
            "mask", torch.ones(context_length, context_length, dtype=torch.bool).triu(1), persistent=False
        )

    @property
    def out_proj(self) -> nn.Linear:
        return self.mha.out_proj  # a property, so state_dict holds it once

    def forward(self, x: Tensor, kv_cache: KVCache | None = None) -> Tensor:
        _reject_cache(self, kv_cache)
        T = x.shape[1]
        _check_length(T, self.mask.shape[0])
        # need_weights=False lets it dispatch to the fused kernel
        y, _ = self.mha(x, x, x, attn_mask=self.mask[:T, :T], need_weights=False, is_causal=True)
        return y

    def attention_probs(self, x: Tensor) -> Tensor:
        # the module's own returned weights would include dropout in training, so recompute them
        B, T, C = x.shape
        _check_length(T, self.mask.shape[0])
        q, k, _ = F.linear(x, self.mha.in_proj_weight, self.mha.in_proj_bias).split(C, dim=2)
        q, k = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k))
        return _causal_probs(q, k)  # (B, nh, T, T)


# ---------------------------------------------------------------------------------------------------------
# Registry: only causal implementations can drive a language model
# ---------------------------------------------------------------------------------------------------------

ATTENTION_REGISTRY: dict[str, type[nn.Module]] = {
    "sdpa": CausalSelfAttention,
    "mha": MultiHeadAttentionAdapter,
    "wrapper": MultiHeadAttentionWrapperAdapter,
    "einsum": EinsumMultiHeadAttention,
    "additive": AdditiveSelfAttention,
    "torch": TorchMultiheadAttention,
}

# the teaching mechanisms above that let every token see the future, by the names people try
_NOT_CAUSAL = {
    "simplified": "simplified_self_attention",
    "v1": "SelfAttention_v1",
    "v2": "SelfAttention_v2",
    "bahdanau": "BahdanauAttention",
}


def available_attention() -> list[str]:
    return sorted(ATTENTION_REGISTRY)


def build_attention(
    name: str, d_model: int, n_head: int, context_length: int, dropout: float = 0.0, bias: bool = True
) -> nn.Module:
    valid = ", ".join(available_attention())
    if name in _NOT_CAUSAL:
        raise ValueError(
            f"attention '{name}' ({_NOT_CAUSAL[name]}) is not causal and cannot be used in the language model; "
            f"valid names: {valid}"
        )
    if name not in ATTENTION_REGISTRY:
        raise ValueError(f"unknown attention '{name}'; valid names: {valid}")
    _check_heads(d_model, n_head)
    return ATTENTION_REGISTRY[name](d_model, n_head, context_length, dropout, bias)
