import numpy as np
import pytest
import torch
from torch.testing import assert_close

from gptmini.attention import (
    ATTENTION_REGISTRY,
    AdditiveSelfAttention,
    BahdanauAttention,
    CausalAttention,
    CausalSelfAttention,
    EinsumMultiHeadAttention,
    KVCache,
    MultiHeadAttention,
    MultiHeadAttentionAdapter,
    MultiHeadAttentionWrapper,
    MultiHeadAttentionWrapperAdapter,
    SelfAttention_v1,
    SelfAttention_v2,
    TorchMultiheadAttention,
    available_attention,
    build_attention,
    numpy_attention,
    numpy_multihead_attention,
    numpy_softmax,
    simplified_attention_scores,
    simplified_attention_weights,
    simplified_self_attention,
)

# "Your journey starts with one step", embedded in 3 dimensions (book section 3.3.1)
INPUTS = torch.tensor(
    [
        [0.43, 0.15, 0.89],  # Your
        [0.55, 0.87, 0.66],  # journey
        [0.57, 0.85, 0.64],  # starts
        [0.22, 0.58, 0.33],  # with
        [0.77, 0.25, 0.10],  # one
        [0.05, 0.80, 0.55],  # step
    ]
)
BATCH = torch.stack((INPUTS, INPUTS), dim=0)  # (2, 6, 3), as in book section 3.5.3

# The book prints 4 decimals, so a rounding error of up to 5e-5.
BOOK = {"atol": 1e-4, "rtol": 0.0}

D_MODEL, N_HEAD, CONTEXT = 32, 4, 12
DOT_PRODUCT = ["sdpa", "mha", "wrapper", "einsum", "torch"]  # all compute the same function
CACHED = [name for name in available_attention() if ATTENTION_REGISTRY[name].supports_kv_cache]


# ---------------------------------------------------------------------------------------------------------
# Worked examples. Every expected number below is printed output of the reference notebook
# rasbt/LLMs-from-scratch, ch03/01_main-chapter-code/ch03.ipynb (section noted per test).
# ---------------------------------------------------------------------------------------------------------


def test_simplified_attention_second_token():
    # ch03.ipynb 3.3.1: scores, softmax weights and context vector z(2) for "journey"
    assert_close(
        simplified_attention_scores(INPUTS)[1],
        torch.tensor([0.9544, 1.4950, 1.4754, 0.8434, 0.7070, 1.0865]),
        **BOOK,
    )
    assert_close(
        simplified_attention_weights(INPUTS)[1],
        torch.tensor([0.1385, 0.2379, 0.2333, 0.1240, 0.1082, 0.1581]),
        **BOOK,
    )
    assert_close(simplified_self_attention(INPUTS)[1], torch.tensor([0.4419, 0.6515, 0.5683]), **BOOK)


def test_simplified_attention_all_tokens_and_batched():
    # ch03.ipynb 3.3.2: all context vectors
    expected = torch.tensor(
        [
            [0.4421, 0.5931, 0.5790],
            [0.4419, 0.6515, 0.5683],
            [0.4431, 0.6496, 0.5671],
            [0.4304, 0.6298, 0.5510],
            [0.4671, 0.5910, 0.5266],
            [0.4177, 0.6503, 0.5645],
        ]
    )
    assert_close(simplified_self_attention(INPUTS), expected, **BOOK)
    assert_close(simplified_attention_weights(INPUTS).sum(-1), torch.ones(6))
    batched = simplified_self_attention(BATCH)
    assert batched.shape == (2, 6, 3)
    assert_close(batched[1], simplified_self_attention(INPUTS))


def test_self_attention_v1_seeded():
    torch.manual_seed(123)
    sa_v1 = SelfAttention_v1(3, 2)
    # ch03.ipynb 3.4.1: step by step for the second token with the same seeded matrices
    query_2 = INPUTS[1] @ sa_v1.W_query
    keys = INPUTS @ sa_v1.W_key
    scores_2 = query_2 @ keys.T
    assert_close(query_2, torch.tensor([0.4306, 1.4551]), **BOOK)
    assert_close(scores_2, torch.tensor([1.2705, 1.8524, 1.8111, 1.0795, 0.5577, 1.5440]), **BOOK)
    assert_close(
        torch.softmax(scores_2 / 2**0.5, dim=-1),
        torch.tensor([0.1500, 0.2264, 0.2199, 0.1311, 0.0906, 0.1820]),
        **BOOK,
    )
    # ch03.ipynb 3.4.2: SelfAttention_v1 after torch.manual_seed(123)
    expected = torch.tensor(
        [
            [0.2996, 0.8053],
            [0.3061, 0.8210],
            [0.3058, 0.8203],
            [0.2948, 0.7939],
            [0.2927, 0.7891],
            [0.2990, 0.8040],
        ]
    )
    assert_close(sa_v1(INPUTS), expected, **BOOK)
    assert_close(sa_v1(BATCH)[0], expected, **BOOK)


def test_self_attention_v2_seeded():
    # ch03.ipynb 3.4.2: SelfAttention_v2 after torch.manual_seed(789)
    torch.manual_seed(789)
    sa_v2 = SelfAttention_v2(3, 2)
    expected = torch.tensor(
        [
            [-0.0739, 0.0713],
            [-0.0748, 0.0703],
            [-0.0749, 0.0702],
            [-0.0760, 0.0685],
            [-0.0763, 0.0679],
            [-0.0754, 0.0693],
        ]
    )
    assert_close(sa_v2(INPUTS), expected, **BOOK)


def test_causal_attention_weights_from_v2_weights():
    # ch03.ipynb 3.5.1: the masked, renormalised weights computed from sa_v2's query/key matrices
    torch.manual_seed(789)
    sa_v2 = SelfAttention_v2(3, 2)
    ca = CausalAttention(3, 2, 6, 0.0)
    missing, unexpected = ca.load_state_dict(sa_v2.state_dict(), strict=False)
    assert missing == ["mask"] and unexpected == []
    expected = torch.tensor(
        [
            [1.0000, 0.0000, 0.0000, 0.0000, 0.0000, 0.0000],
            [0.5517, 0.4483, 0.0000, 0.0000, 0.0000, 0.0000],
            [0.3800, 0.3097, 0.3103, 0.0000, 0.0000, 0.0000],
            [0.2758, 0.2460, 0.2462, 0.2319, 0.0000, 0.0000],
            [0.2175, 0.1983, 0.1984, 0.1888, 0.1971, 0.0000],
            [0.1935, 0.1663, 0.1666, 0.1542, 0.1666, 0.1529],
        ]
    )
    assert_close(ca.attention_weights(BATCH)[0], expected, **BOOK)


# ch03.ipynb 3.5.3 / 3.6.1: CausalAttention after torch.manual_seed(123); it is also the wrapper's first head
CAUSAL_123 = [
    [-0.4519, 0.2216],
    [-0.5874, 0.0058],
    [-0.6300, -0.0632],
    [-0.5675, -0.0843],
    [-0.5526, -0.0981],
    [-0.5299, -0.1081],
]


def test_causal_attention_seeded():
    torch.manual_seed(123)
    ca = CausalAttention(3, 2, BATCH.shape[1], 0.0)
    out = ca(BATCH)
    assert out.shape == (2, 6, 2)
    assert_close(out, torch.tensor([CAUSAL_123, CAUSAL_123]), **BOOK)


def test_multi_head_attention_wrapper_seeded():
    # ch03.ipynb 3.6.1: MultiHeadAttentionWrapper(3, 2, 6, 0.0, num_heads=2) after torch.manual_seed(123)
    torch.manual_seed(123)
    mha = MultiHeadAttentionWrapper(3, 2, BATCH.shape[1], 0.0, num_heads=2)
    second_head = [
        [0.4772, 0.1063],
        [0.5891, 0.3257],
        [0.6202, 0.3860],
        [0.5478, 0.3589],
        [0.5321, 0.3428],
        [0.5077, 0.3493],
    ]
    expected = torch.cat([torch.tensor(CAUSAL_123), torch.tensor(second_head)], dim=-1)
    out = mha(BATCH)
    assert out.shape == (2, 6, 4)  # d_out * num_heads
    assert_close(out, torch.stack([expected, expected]), **BOOK)


def test_multi_head_attention_seeded():
    # ch03.ipynb 3.6.2: MultiHeadAttention(3, 2, 6, 0.0, num_heads=2) after torch.manual_seed(123)
    torch.manual_seed(123)
    mha = MultiHeadAttention(3, 2, BATCH.shape[1], 0.0, num_heads=2)
    expected = torch.tensor(
        [
            [0.3190, 0.4858],
            [0.2943, 0.3897],
            [0.2856, 0.3593],
            [0.2693, 0.3873],
            [0.2639, 0.3928],
            [0.2575, 0.4028],
        ]
    )
    assert_close(mha(BATCH), torch.stack([expected, expected]), **BOOK)


def test_multi_head_attention_rejects_indivisible_width():
    with pytest.raises(ValueError, match=r"d_out=3 must be divisible by num_heads=2"):
        MultiHeadAttention(3, 3, 6, 0.0, num_heads=2)


# ---------------------------------------------------------------------------------------------------------
# Weight mapping: copy one CausalSelfAttention's weights into every other implementation and the oracle
# ---------------------------------------------------------------------------------------------------------


def _qkv_parts(ref: CausalSelfAttention):
    C = ref.d_model
    weights = ref.qkv.weight.detach().split(C, dim=0)  # 3 x (C_out, C_in)
    biases = (None,) * 3 if ref.qkv.bias is None else ref.qkv.bias.detach().split(C)
    return weights, biases


@torch.no_grad()
def load_from_sdpa(module: torch.nn.Module, ref: CausalSelfAttention) -> None:
    (Wq, Wk, Wv), (bq, bk, bv) = _qkv_parts(ref)
    nh, hs = ref.n_head, ref.head_size
    if isinstance(module, CausalSelfAttention):
        module.load_state_dict(ref.state_dict())
        return
    if isinstance(module, MultiHeadAttentionAdapter):
        for lin, W, b in ((module.W_query, Wq, bq), (module.W_key, Wk, bk), (module.W_value, Wv, bv)):
            lin.weight.copy_(W)
            if b is not None:
                lin.bias.copy_(b)
    elif isinstance(module, MultiHeadAttentionWrapperAdapter):
        for h, head in enumerate(module.heads):
            rows = slice(h * hs, (h + 1) * hs)  # head h owns these output features of the fused projection
            for lin, W, b in ((head.W_query, Wq, bq), (head.W_key, Wk, bk), (head.W_value, Wv, bv)):
                lin.weight.copy_(W[rows])
                if b is not None:
                    lin.bias.copy_(b[rows])
    elif isinstance(module, EinsumMultiHeadAttention):
        for P, bP, W, b in (
            (module.W_q, module.b_q, Wq, bq),
            (module.W_k, module.b_k, Wk, bk),
            (module.W_v, module.b_v, Wv, bv),
        ):
            P.copy_(W.T.reshape(-1, nh, hs).permute(1, 0, 2))  # (C_in, C_out) -> (h, C_in, hs)
            if b is not None:
                bP.copy_(b.view(nh, hs))
    elif isinstance(module, TorchMultiheadAttention):
        module.mha.in_proj_weight.copy_(ref.qkv.weight)  # same [q; k; v] stacking
        if ref.qkv.bias is not None:
            module.mha.in_proj_bias.copy_(ref.qkv.bias)
    else:
        raise TypeError(type(module))
    module.out_proj.load_state_dict(ref.out_proj.state_dict())


def numpy_oracle(ref: CausalSelfAttention, x: torch.Tensor):
    (Wq, Wk, Wv), (bq, bk, bv) = _qkv_parts(ref)
    nh, hs = ref.n_head, ref.head_size

    def heads(W):  # (C_out, C_in) -> (h, C_in, hs)
        return W.double().numpy().T.reshape(-1, nh, hs).transpose(1, 0, 2)

    def head_bias(b):
        return None if b is None else b.double().numpy().reshape(nh, hs)

    b_o = ref.out_proj.bias
    out, weights = numpy_multihead_attention(
        x.double().numpy(),
        heads(Wq),
        heads(Wk),
        heads(Wv),
        ref.out_proj.weight.detach().double().numpy().T,
        causal=True,
        b_q=head_bias(bq),
        b_k=head_bias(bk),
        b_v=head_bias(bv),
        b_o=None if b_o is None else b_o.detach().double().numpy(),
    )
    return torch.from_numpy(out).float(), torch.from_numpy(weights).float()


def _make(name: str, dropout: float = 0.0, bias: bool = True) -> torch.nn.Module:
    return build_attention(name, D_MODEL, N_HEAD, CONTEXT, dropout=dropout, bias=bias)


# ---------------------------------------------------------------------------------------------------------
# Independent oracle and cross-implementation agreement
# ---------------------------------------------------------------------------------------------------------


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


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("name", DOT_PRODUCT)
def test_same_weights_same_function(name, bias):
    torch.manual_seed(0)
    ref = _make("sdpa", bias=bias).eval()
    module = _make(name, bias=bias).eval()
    load_from_sdpa(module, ref)
    x = torch.randn(2, 10, D_MODEL)
    expected_out, expected_probs = numpy_oracle(ref, x)
    with torch.no_grad():
        out, probs = module(x), module.attention_probs(x)
        assert_close(out, ref(x), atol=1e-5, rtol=1e-5)
    assert_close(out, expected_out, atol=1e-5, rtol=1e-5)
    assert_close(probs, expected_probs, atol=1e-5, rtol=1e-5)


def test_numpy_oracle_handles_unbatched_input():
    torch.manual_seed(0)
    ref = _make("sdpa").eval()
    x = torch.randn(1, 7, D_MODEL)
    batched, _ = numpy_oracle(ref, x)
    unbatched, _ = numpy_oracle(ref, x[0])
    assert_close(unbatched, batched[0])


def _numpy_additive(module: AdditiveSelfAttention, x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    # plain loops over batch, heads, queries and keys: e_ij = v_h . tanh(q_i + k_j), masked, softmaxed
    def np_(t):
        return t.detach().double().numpy()

    def linear(lin, X):
        return X @ np_(lin.weight).T + (0.0 if lin.bias is None else np_(lin.bias))

    X = np_(x)
    B, T, C = X.shape
    nh, hs = module.n_head, module.head_size
    Q, K, V = linear(module.W_query, X), linear(module.W_key, X), linear(module.W_value, X)
    v = np_(module.v)
    probs = np.zeros((B, nh, T, T))
    heads = np.zeros((B, T, C))
    for b in range(B):
        for h in range(nh):
            cols = slice(h * hs, (h + 1) * hs)
            for i in range(T):
                e = np.array([v[h] @ np.tanh(Q[b, i, cols] + K[b, j, cols]) for j in range(i + 1)])
                p = numpy_softmax(e)
                probs[b, h, i, : i + 1] = p
                heads[b, i, cols] = p @ V[b, : i + 1, cols]
    return linear(module.out_proj, heads), probs


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_additive_matches_loop_reference(bias):
    torch.manual_seed(0)
    module = _make("additive", bias=bias).eval()
    x = torch.randn(2, 6, D_MODEL)
    expected_out, expected_probs = _numpy_additive(module, x)
    with torch.no_grad():
        assert_close(module(x), torch.from_numpy(expected_out).float(), atol=1e-5, rtol=1e-5)
        assert_close(
            module.attention_probs(x), torch.from_numpy(expected_probs).float(), atol=1e-6, rtol=1e-5
        )


def test_einsum_exposes_per_head_weights():
    module = _make("einsum")
    assert module.W_q.shape == (N_HEAD, D_MODEL, D_MODEL // N_HEAD)
    assert module.W_o.shape == (D_MODEL, D_MODEL)  # (heads * d_k, d)


# ---------------------------------------------------------------------------------------------------------
# Properties every registered implementation must have
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", available_attention())
def test_shape_and_out_proj(name):
    module = _make(name)
    assert module(torch.randn(3, 5, D_MODEL)).shape == (3, 5, D_MODEL)
    assert isinstance(module.out_proj, torch.nn.Linear)
    assert module.out_proj.in_features == module.out_proj.out_features == D_MODEL


@pytest.mark.parametrize("name", available_attention())
def test_causality(name):
    torch.manual_seed(0)
    module = _make(name).eval()
    x = torch.randn(2, 9, D_MODEL)
    with torch.no_grad():
        out = module(x)
        for t in (0, 3, 7):
            changed = x.clone()
            changed[:, t + 1 :] = torch.randn_like(changed[:, t + 1 :])
            out_changed = module(changed)
            assert_close(out_changed[:, : t + 1], out[:, : t + 1], atol=1e-6, rtol=1e-6)
            assert not torch.allclose(out_changed[:, t + 1 :], out[:, t + 1 :])


@pytest.mark.parametrize("name", available_attention())
def test_attention_probs_are_causal_distributions(name):
    torch.manual_seed(0)
    module = _make(name, dropout=0.5).train()  # dropout must not leak into the probabilities
    with torch.no_grad():
        probs = module.attention_probs(torch.randn(2, 7, D_MODEL))
    assert probs.shape == (2, N_HEAD, 7, 7)
    assert_close(probs.sum(-1), torch.ones(2, N_HEAD, 7))
    assert (probs.triu(diagonal=1) == 0).all()
    assert (probs[..., torch.ones(7, 7, dtype=torch.bool).tril()] > 0).all()  # the past stays visible


@pytest.mark.parametrize("name", available_attention())
def test_dropout_only_in_training(name):
    torch.manual_seed(0)
    module = _make(name, dropout=0.5)
    x = torch.randn(2, 8, D_MODEL)
    module.train()
    first, second = module(x), module(x)
    assert not torch.allclose(first, second)
    module.eval()
    with torch.no_grad():
        eval_out = module(x)
        assert_close(module(x), eval_out, atol=0, rtol=0)
    assert not torch.allclose(first, eval_out)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("name", available_attention())
def test_gradients_reach_every_parameter(name, bias):
    torch.manual_seed(0)
    module = _make(name, bias=bias)
    x = torch.randn(2, 6, D_MODEL)
    (module(x) * torch.randn(2, 6, D_MODEL)).sum().backward()
    for pname, p in module.named_parameters():
        assert p.grad is not None, pname
        assert torch.isfinite(p.grad).all(), pname
        if name != "additive" and pname.endswith(("W_key.bias", "b_k")):
            # a key bias adds the same q.b to a whole row of dot-product scores: softmax cancels it
            assert p.grad.abs().max() < 1e-5, pname
        else:
            assert p.grad.abs().sum() > 0, pname


@pytest.mark.parametrize("name", available_attention())
def test_input_longer_than_context_fails(name):
    module = _make(name)
    x = torch.randn(1, CONTEXT + 1, D_MODEL)
    with pytest.raises(ValueError, match=rf"T={CONTEXT + 1} tokens but context_length={CONTEXT}"):
        module(x)
    with pytest.raises(ValueError, match=rf"context_length={CONTEXT}"):
        module.attention_probs(x)


@pytest.mark.parametrize("name", available_attention())
def test_bias_flag_controls_projections(name):
    without = _make(name, bias=False)
    assert without.out_proj.bias is None
    assert not any(n.endswith("bias") or n.startswith("b_") for n, _ in without.named_parameters())
    assert any("bias" in n or n.startswith("b_") for n, _ in _make(name, bias=True).named_parameters())


# ---------------------------------------------------------------------------------------------------------
# KV cache
# ---------------------------------------------------------------------------------------------------------


def test_kv_cache_update_and_overflow():
    cache = KVCache(batch_size=2, n_head=3, max_len=5, head_size=4)
    k1, v1 = torch.randn(2, 3, 3, 4), torch.randn(2, 3, 3, 4)
    keys, values = cache.update(k1, v1)
    assert cache.pos == 3
    assert_close(keys, k1)
    k2, v2 = torch.randn(2, 3, 2, 4), torch.randn(2, 3, 2, 4)
    keys, values = cache.update(k2, v2)
    assert cache.pos == 5
    assert_close(keys, torch.cat([k1, k2], dim=2))
    assert_close(values, torch.cat([v1, v2], dim=2))
    with pytest.raises(ValueError, match=r"5 cached \+ 1 new positions exceed max_len=5"):
        cache.update(torch.randn(2, 3, 1, 4), torch.randn(2, 3, 1, 4))
    cache.reset()
    assert cache.pos == 0
    keys, _ = cache.update(k2, v2)
    assert_close(keys, k2)


def test_cached_classes():
    assert "sdpa" in CACHED and "mha" in CACHED


@pytest.mark.parametrize(
    "chunks", [[1] * 10, [4, 1, 1, 1, 1, 1, 1], [4, 6], [10]], ids=["tokens", "prefill", "two-chunks", "one"]
)
@pytest.mark.parametrize("name", CACHED)
def test_kv_cache_matches_full_forward(name, chunks):
    torch.manual_seed(0)
    module = _make(name).eval()
    x = torch.randn(2, sum(chunks), D_MODEL)
    cache = KVCache(2, N_HEAD, CONTEXT, D_MODEL // N_HEAD)
    outputs, start = [], 0
    with torch.no_grad():
        full = module(x)
        for n in chunks:
            outputs.append(module(x[:, start : start + n], kv_cache=cache))
            start += n
    assert cache.pos == x.shape[1]
    assert_close(torch.cat(outputs, dim=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", CACHED)
def test_kv_cache_overflow_is_reported(name):
    module = _make(name).eval()
    cache = KVCache(1, N_HEAD, CONTEXT, D_MODEL // N_HEAD)
    with torch.no_grad():
        module(torch.randn(1, CONTEXT, D_MODEL), kv_cache=cache)
        with pytest.raises(ValueError, match=r"exceed"):
            module(torch.randn(1, 1, D_MODEL), kv_cache=cache)


@pytest.mark.parametrize("name", [n for n in available_attention() if n not in CACHED])
def test_uncached_classes_reject_a_cache(name):
    module = _make(name)
    assert module.supports_kv_cache is False
    with pytest.raises(ValueError, match="does not support a KV cache"):
        module(torch.randn(1, 2, D_MODEL), kv_cache=KVCache(1, N_HEAD, CONTEXT, D_MODEL // N_HEAD))


# ---------------------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------------------


def test_registry_names_and_classes():
    assert available_attention() == ["additive", "einsum", "mha", "sdpa", "torch", "wrapper"]
    assert ATTENTION_REGISTRY["sdpa"] is CausalSelfAttention
    assert ATTENTION_REGISTRY["additive"] is AdditiveSelfAttention
    assert isinstance(_make("wrapper").heads[0], CausalAttention)
    assert isinstance(_make("mha"), MultiHeadAttention)


def test_unknown_name_lists_valid_names():
    message = "unknown attention 'xyz'; valid names: additive, einsum, mha, sdpa, torch, wrapper"
    with pytest.raises(ValueError, match=f"^{message}$"):
        build_attention("xyz", D_MODEL, N_HEAD, CONTEXT)


@pytest.mark.parametrize("name", ["simplified", "v1", "v2", "bahdanau"])
def test_non_causal_names_are_refused(name):
    with pytest.raises(
        ValueError,
        match=r"is not causal and cannot be used in the language model; valid names: additive, einsum",
    ):
        build_attention(name, D_MODEL, N_HEAD, CONTEXT)


@pytest.mark.parametrize("name", available_attention())
def test_heads_must_divide_width(name):
    with pytest.raises(ValueError, match=r"d_model=30 must be divisible by n_head=4"):
        build_attention(name, 30, 4, CONTEXT)
    with pytest.raises(ValueError, match=r"d_model=30 must be divisible by n_head=4"):
        ATTENTION_REGISTRY[name](30, 4, CONTEXT)


# ---------------------------------------------------------------------------------------------------------
# Bahdanau attention
# ---------------------------------------------------------------------------------------------------------


def test_bahdanau_attention():
    torch.manual_seed(0)
    attn = BahdanauAttention(query_dim=5, key_dim=4, hidden_dim=7)
    query, keys, values = torch.randn(3, 5), torch.randn(3, 6, 4), torch.randn(3, 6, 2)
    with torch.no_grad():
        context, weights = attn(query, keys, values)
        assert context.shape == (3, 2) and weights.shape == (3, 6)
        assert_close(weights.sum(-1), torch.ones(3))
        assert_close(context, torch.einsum("bs,bsd->bd", weights, values))

        # manual computation, one (query, key) pair at a time
        Wq, Wk, v = attn.W_q.weight, attn.W_k.weight, attn.v.weight[0]
        for b in range(3):
            e = torch.stack([v @ torch.tanh(Wq @ query[b] + Wk @ keys[b, s]) for s in range(6)])
            assert_close(weights[b], torch.softmax(e, dim=0))

        # values default to the keys
        self_context, _ = attn(query, keys)
        assert_close(self_context, torch.einsum("bs,bsd->bd", weights, keys))

        mask = torch.ones(3, 6, dtype=torch.bool)
        mask[:, 4:] = False  # e.g. padding
        mask[1, 1] = False
        _, masked = attn(query, keys, values, mask=mask)
        assert (masked[~mask] == 0).all()
        assert_close(masked.sum(-1), torch.ones(3))
        assert_close(masked[0, :4], torch.softmax(torch.log(weights[0, :4]), dim=0))
