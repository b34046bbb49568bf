"""Chapter 3's worked examples: every expected number is printed output of the reference notebook
rasbt/LLMs-from-scratch, ch03/01_main-chapter-code/ch03.ipynb (section noted per test), plus Bahdanau attention
against a hand computation."""

import pytest
import torch
from torch.testing import assert_close

from gptmini.attention.teaching.additive import BahdanauAttention
from gptmini.attention.teaching.textbook import (
    CausalAttention,
    MultiHeadAttention,
    MultiHeadAttentionWrapper,
    SelfAttention_v1,
    SelfAttention_v2,
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
