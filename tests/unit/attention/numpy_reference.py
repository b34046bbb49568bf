"""General attention, softmax(Q K^T / sqrt(d_k)) V, and additive attention, in NumPy. Shares no code with the
torch modules, so tests can use it as an independent oracle. Computes in float64.
"""

from __future__ import annotations

import numpy as np


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


def numpy_additive_multihead_attention(
    X: np.ndarray,
    W_q: np.ndarray,
    W_k: np.ndarray,
    W_v: np.ndarray,
    v: np.ndarray,
    W_o: np.ndarray,
    b_q: np.ndarray | None = None,
    b_k: np.ndarray | None = None,
    b_v: np.ndarray | None = None,
    b_o: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Causal additive (Bahdanau) self-attention per head, one (query, key) pair at a time:
    e_ij = v_h . tanh(q_i + k_j). Shapes as ``numpy_multihead_attention``, plus v: (h, d_k)."""
    X = np.asarray(X, dtype=np.float64)  # (B, T, d)
    B, T, _ = X.shape
    outputs, weights = [], []
    for h in range(W_q.shape[0]):
        Q, K, V = X @ W_q[h], X @ W_k[h], X @ W_v[h]  # (B, T, d_k)
        if b_q is not None:
            Q, K, V = Q + b_q[h], K + b_k[h], V + b_v[h]
        scores = np.full((B, T, T), -np.inf)
        for i in range(T):
            for j in range(i + 1):  # causal: key j <= query i
                scores[:, i, j] = np.tanh(Q[:, i] + K[:, j]) @ v[h]
        w = numpy_softmax(scores, axis=-1)
        outputs.append(w @ V)
        weights.append(w)
    concat = np.concatenate(outputs, axis=-1)  # (B, T, h * d_k)
    output = concat @ W_o if b_o is None else concat @ W_o + b_o
    return output, np.stack(weights, axis=1)  # (B, T, d_out), (B, h, T, T)


def numpy_rope(X: np.ndarray, base: float = 10000.0, start: int = 0) -> np.ndarray:
    """Rotary embeddings of X (..., T, d) at positions start..start+T-1, written as explicit 2x2 rotations of
    the dimension pairs (i, i + d/2) by angle position * base^(-2i/d)."""
    X = np.asarray(X, dtype=np.float64)
    T, d = X.shape[-2], X.shape[-1]
    out = np.empty_like(X)
    for t in range(T):
        for i in range(d // 2):
            a = (start + t) * base ** (-2 * i / d)
            rot = np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])
            pair = np.stack([X[..., t, i], X[..., t, i + d // 2]], axis=-1)  # (..., 2)
            turned = pair @ rot.T
            out[..., t, i], out[..., t, i + d // 2] = turned[..., 0], turned[..., 1]
    return out


def numpy_rms_norm(X: np.ndarray, weight: np.ndarray | None = None, eps: float = 1e-6) -> np.ndarray:
    """X / sqrt(mean(X^2) + eps) over the last axis, times weight."""
    X = np.asarray(X, dtype=np.float64)
    Y = X / np.sqrt(np.mean(X * X, axis=-1, keepdims=True) + eps)
    return Y if weight is None else Y * weight
