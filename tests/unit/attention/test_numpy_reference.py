"""The NumPy oracle against the definition, written out row by row."""

import numpy as np
from numpy_reference import (
    numpy_additive_multihead_attention,
    numpy_attention,
    numpy_multihead_attention,
    numpy_softmax,
)


def test_numpy_attention_matches_definition():
    rng = np.random.default_rng(0)
    X, Wq, Wk, Wv = (
        rng.normal(size=(5, 4)),
        rng.normal(size=(4, 3)),
        rng.normal(size=(4, 3)),
        rng.normal(size=(4, 2)),
    )
    out, w = numpy_attention(X, Wq, Wk, Wv, causal=True)
    Q, K, V = X @ Wq, X @ Wk, X @ Wv
    for i in range(5):  # row by row: query i only sees keys 0..i
        s = Q[i] @ K[: i + 1].T / np.sqrt(3)
        p = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
        np.testing.assert_allclose(w[i, : i + 1], p, rtol=1e-12)
        np.testing.assert_allclose(w[i, i + 1 :], 0.0)
        np.testing.assert_allclose(out[i], p @ V[: i + 1], rtol=1e-12)
    # numerically stable: huge scores do not overflow
    assert np.allclose(numpy_softmax(np.array([1000.0, 1000.0])), [0.5, 0.5])


def test_multihead_is_per_head_attention_concatenated_then_projected():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(2, 4, 6))
    Wq, Wk, Wv = (rng.normal(size=(3, 6, 2)) for _ in range(3))
    Wo = rng.normal(size=(6, 6))
    out, w = numpy_multihead_attention(X, Wq, Wk, Wv, Wo, causal=True)
    heads = [numpy_attention(X, Wq[h], Wk[h], Wv[h], causal=True) for h in range(3)]
    np.testing.assert_allclose(out, np.concatenate([o for o, _ in heads], -1) @ Wo, rtol=1e-12)
    np.testing.assert_allclose(w, np.stack([p for _, p in heads], axis=1), rtol=1e-12)
    unbatched, _ = numpy_multihead_attention(X[0], Wq, Wk, Wv, Wo, causal=True)
    np.testing.assert_allclose(unbatched, out[0], rtol=1e-12)


def test_additive_oracle_on_a_hand_computed_example():
    # one head, d = d_k = 1, T = 2: e_ij = v * tanh(q_i + k_j) with q = k = x, value = 2x, W_o = 1
    X = np.array([[[0.5], [-1.0]]])
    one = np.ones((1, 1, 1))
    out, w = numpy_additive_multihead_attention(X, one, one, 2 * one, np.array([[3.0]]), np.eye(1))
    e10, e11 = 3 * np.tanh(-1.0 + 0.5), 3 * np.tanh(-2.0)
    p10 = np.exp(e10) / (np.exp(e10) + np.exp(e11))
    np.testing.assert_allclose(w[0, 0], [[1.0, 0.0], [p10, 1 - p10]], rtol=1e-12)
    np.testing.assert_allclose(out[0, :, 0], [1.0, p10 * 1.0 + (1 - p10) * -2.0], rtol=1e-12)


def test_rope_on_a_hand_computed_example():
    from numpy_reference import numpy_rope

    # d = 2: one pair, turned by the position itself (base^0 = 1) radians
    X = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 2.0]])
    out = numpy_rope(X)
    np.testing.assert_allclose(out[0], [1.0, 0.0])  # position 0: no rotation
    np.testing.assert_allclose(out[1], [np.cos(1.0), np.sin(1.0)])
    np.testing.assert_allclose(out[2], [-2.0 * np.sin(2.0), 2.0 * np.cos(2.0)])
    # d = 4: the second pair (dims 1 and 3) turns base^(-1/2) times as fast
    Y = np.array([[[0.0, 1.0, 0.0, 0.0]] * 2])
    np.testing.assert_allclose(numpy_rope(Y, base=100.0)[0, 1], [0, np.cos(0.1), 0, np.sin(0.1)], atol=1e-15)


def test_rope_scores_depend_only_on_the_distance():
    from numpy_reference import numpy_rope

    rng = np.random.default_rng(0)
    q, k = rng.normal(size=8), rng.normal(size=8)
    seq_q, seq_k = np.tile(q, (12, 1)), np.tile(k, (12, 1))
    Q, K = numpy_rope(seq_q, base=50.0), numpy_rope(seq_k, base=50.0)
    for m, n in ((3, 1), (9, 7), (11, 9)):  # distance 2 each time
        np.testing.assert_allclose(Q[m] @ K[n], Q[2] @ K[0], rtol=1e-12)
    assert not np.isclose(Q[3] @ K[0], Q[2] @ K[0])


def test_alibi_slopes_are_the_papers():
    from gptmini.attention.alibi import alibi_slopes

    # Press et al.: 8 heads -> 1/2, 1/4, ..., 1/256; a non-power of two (6) takes the 4-head slopes, then every
    # other slope of the 8-head sequence
    np.testing.assert_allclose(alibi_slopes(8).numpy(), [2.0**-i for i in range(1, 9)])
    np.testing.assert_allclose(alibi_slopes(6).numpy(), [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3])


def test_alibi_and_window_mask_on_a_hand_computed_example():
    import torch

    from gptmini.attention.alibi import score_mask

    slopes = torch.tensor([0.5])
    # two new queries at absolute positions 2 and 3 against keys 0..3, window 2
    mask = score_mask(1, 2, 2, slopes, 2, torch.device("cpu"))[0, 0]
    inf = float("inf")
    np.testing.assert_allclose(mask.numpy(), [[-inf, -0.5, 0.0, -inf], [-inf, -inf, -0.5, 0.0]])
    plain = score_mask(1, 2, 2, None, None, torch.device("cpu"))[0, 0]
    np.testing.assert_allclose(plain.numpy(), [[0.0, 0.0, 0.0, -inf], [0.0, 0.0, 0.0, 0.0]])


def test_alibi_biases_below_the_floor_are_masked_and_lose_nothing():
    import torch

    from gptmini.attention import build_attention
    from gptmini.attention.alibi import ALIBI_BIAS_FLOOR, score_mask

    # slope 1/2: keys more than 160 tokens back fall below the floor of -80; the rest keep -slope * distance
    mask = score_mask(1, 1, 200, torch.tensor([0.5]), None, torch.device("cpu"))[
        0, 0, 0
    ]  # query 200, keys 0..200
    distance = np.arange(200, -1, -1)
    expected = np.where(-0.5 * distance < ALIBI_BIAS_FLOOR, -np.inf, -0.5 * distance)
    np.testing.assert_array_equal(mask.numpy(), expected.astype(np.float32))

    # the attention of every CPU path at a length where the floor masks the steepest head's farthest keys equals
    # softmax with the exact biases, computed independently in NumPy float64
    torch.manual_seed(0)
    T, heads, hs = 600, 4, 8
    module = build_attention("sdpa", heads * hs, heads, T, alibi=True).eval()
    x = torch.randn(1, T, heads * hs)
    with torch.no_grad():
        qkv = module.qkv(x).double().numpy()[0]  # (T, 3C)
        q, k, v = (qkv[:, i * heads * hs : (i + 1) * heads * hs].reshape(T, heads, hs) for i in range(3))
        slopes = module.alibi_slopes.double().numpy()
        pos = np.arange(T)
        dist = pos[:, None] - pos[None, :]  # (T, T)
        y = np.empty((T, heads, hs))
        for h in range(heads):
            scores = q[:, h] @ k[:, h].T / np.sqrt(hs) - slopes[h] * dist
            scores[dist < 0] = -np.inf
            p = np.exp(scores - scores.max(axis=1, keepdims=True))
            y[:, h] = (p / p.sum(axis=1, keepdims=True)) @ v[:, h]
        expected_out = module.out_proj(torch.from_numpy(y.reshape(1, T, heads * hs)).float())
        floor_mask = score_mask(heads, T, 0, module.alibi_slopes, None, x.device)[0, 0]  # slope 1/4
        assert (
            floor_mask[T - 1, 0] == -torch.inf and floor_mask[T - 1, T - 1 - 300] == -75.0
        )  # cut beyond 320
        for kernel in ("mask", "chunked", "explicit"):
            forced = build_attention("sdpa", heads * hs, heads, T, alibi=True, kernel=kernel).eval()
            forced.load_state_dict(module.state_dict())
            torch.testing.assert_close(forced(x), expected_out, atol=1e-5, rtol=1e-5, msg=kernel)
