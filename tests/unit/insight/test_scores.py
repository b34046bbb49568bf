"""The head-type detectors on constructed attention patterns, against values worked out by hand: a pure
previous-token pattern scores 1 on previous-token and 0 on induction, and so on for each score."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from gptmini.attention import available_attention
from gptmini.insight.probes import make_probes
from gptmini.insight.scores import (
    SCORES,
    duplicate_token_score,
    first_token_share,
    head_scores,
    induction_score,
    mean_distance,
    previous_token_score,
    score_patterns,
)
from gptmini.model import GPT, GPTConfig
from gptmini.viz import attention_entropy

P = 8  # period of the repeated probe
T = 2 * P


def one_hot_rows(target) -> torch.Tensor:
    """(T, T): row i puts all its attention on key target(i)."""
    maps = torch.zeros(T, T)
    for i in range(T):
        maps[i, target(i)] = 1.0
    return maps


PREVIOUS = one_hot_rows(lambda i: max(i - 1, 0))
DUPLICATE = one_hot_rows(lambda i: i - P if i >= P else i)  # first copy: itself
INDUCTION = one_hot_rows(lambda i: i - P + 1 if i >= P else i)
SINK = one_hot_rows(lambda i: 0)
UNIFORM = torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1)[:, None]  # row i: 1/(i+1) on keys 0..i


def scores(maps: torch.Tensor) -> dict[str, float]:
    return {
        "previous_token": float(previous_token_score(maps)),
        "duplicate_token": float(duplicate_token_score(maps, P)),
        "induction": float(induction_score(maps, P)),
        "first_token": float(first_token_share(maps)),
        "mean_distance": float(mean_distance(maps)),
        "entropy": float(attention_entropy(maps)),
    }


# worked out by hand for T = 16, P = 8: queries 1..15 for the per-query means, 8 second-copy queries for the
# repeated-sequence scores
EXPECTED = {
    "previous": (
        PREVIOUS,
        # only query 1 looks at key 0; every query looks one token back
        {
            "previous_token": 1,
            "duplicate_token": 0,
            "induction": 0,
            "first_token": 1 / 15,
            "mean_distance": 1,
        },
    ),
    "duplicate": (
        DUPLICATE,
        # queries 8..15 look 8 back (query 8 at key 0), queries 1..7 at themselves: mean distance 8 * 8 / 15
        {
            "previous_token": 0,
            "duplicate_token": 1,
            "induction": 0,
            "first_token": 1 / 15,
            "mean_distance": 64 / 15,
        },
    ),
    "induction": (
        INDUCTION,
        # queries 8..15 look 7 back
        {
            "previous_token": 0,
            "duplicate_token": 0,
            "induction": 1,
            "first_token": 0,
            "mean_distance": 56 / 15,
        },
    ),
    "sink": (
        SINK,
        # query i looks i back: mean of 1..15 = 8; key 0 is query 1's previous token and query 8's duplicate;
        # no second-copy query's induction target (keys 1..8) is key 0
        {
            "previous_token": 1 / 15,
            "duplicate_token": 1 / 8,
            "induction": 0,
            "first_token": 1,
            "mean_distance": 8,
        },
    ),
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_detectors_on_one_hot_patterns(name):
    maps, expected = EXPECTED[name]
    got = scores(maps)
    for key, value in expected.items():
        assert_close(got[key], float(value), rtol=0, atol=1e-6, msg=f"{name}: {key}")
    assert_close(got["entropy"], 0.0, rtol=0, atol=1e-5)  # every row one-hot


def test_detectors_on_uniform_causal_attention():
    got = scores(UNIFORM)
    prev = sum(1 / (i + 1) for i in range(1, T)) / (T - 1)
    assert_close(got["previous_token"], prev, rtol=1e-6, atol=0)
    assert_close(got["first_token"], prev, rtol=1e-6, atol=0)  # also 1/(i+1) on key 0
    assert_close(got["duplicate_token"], sum(1 / (i + 1) for i in range(P, T)) / P, rtol=1e-6, atol=0)
    assert_close(got["induction"], got["duplicate_token"], rtol=1e-6, atol=0)
    assert_close(got["mean_distance"], sum(i / 2 for i in range(1, T)) / (T - 1), rtol=1e-6, atol=0)  # T/4
    assert_close(got["entropy"], sum(math.log(i + 1) for i in range(T)) / T, rtol=1e-6, atol=0)


def test_a_sink_takes_a_share_but_not_the_distance():
    # half of every row rests on an attention sink (rows sum to 0.5): shares halve, the distance of the attention
    # that lands on tokens does not change
    full, half = scores(PREVIOUS), scores(0.5 * PREVIOUS)
    assert_close(half["previous_token"], full["previous_token"] / 2)
    assert_close(half["first_token"], full["first_token"] / 2)
    assert_close(half["mean_distance"], full["mean_distance"])


def test_score_patterns_gives_one_value_per_layer_and_head_averaged_over_the_batch():
    # layer 0: head 0 previous-token, head 1 induction; layer 1: head 0 sink, head 1 alternates previous / sink
    text = torch.stack(
        [
            torch.stack([torch.stack([PREVIOUS, INDUCTION]), torch.stack([SINK, PREVIOUS])]),
            torch.stack([torch.stack([PREVIOUS, INDUCTION]), torch.stack([SINK, SINK])]),
        ],
        dim=1,
    )  # (L=2, B=2, H=2, T, T)
    out = score_patterns(text, text, P)
    assert {s.name for s in SCORES} == set(out)
    assert all(v.shape == (2, 2) for v in out.values())
    assert_close(out["previous_token"], torch.tensor([[1.0, 0.0], [1 / 15, (1 + 1 / 15) / 2]]))
    assert_close(out["induction"], torch.tensor([[0.0, 1.0], [0.0, 0.0]]))
    assert_close(out["first_token"], torch.tensor([[1 / 15, 0.0], [1.0, (1 / 15 + 1) / 2]]))


ALL_OPTIONS = {
    "n_kv_head": 1,
    "position": "rope",
    "sliding_window": 6,
    "qk_norm": True,
    "attn_gate": True,
    "attn_sink": True,
}
OPTIONS = [{k: v} for k, v in ALL_OPTIONS.items()] + [
    {"position": "alibi"},
    {"position": "none"},
    ALL_OPTIONS,
]


def _options_cases():
    from gptmini.attention import attention_class

    cases = [(name, {}) for name in available_attention()]
    cases += [("sdpa", {"mlp": "none", "norm": "rmsnorm"}), ("sdpa", {"mlp": "swiglu"})]  # other blocks
    for options in OPTIONS:
        keys = set(
            GPTConfig(
                vocab_size=16, block_size=16, n_layer=1, n_head=2, n_embd=8, **options
            ).attention_options()
        )
        able = [n for n in available_attention() if keys <= attention_class(n).options]
        cases += [(name, options) for name in able]
    return cases


@pytest.mark.parametrize(("attention", "options"), _options_cases(), ids=str)
def test_every_attention_and_option_gives_scores_through_the_probabilities_path(attention, options):
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=40, block_size=16, n_layer=2, n_head=2, n_embd=16, attention=attention, **options
    )
    model = GPT(config).eval()
    probes = make_probes(np.arange(200) % 40, 40, 16, probe_tokens=16, probe_batch=2, loss_windows=2)
    out = head_scores(model, probes)
    maps = model.attention_maps(torch.cat([probes.text, probes.repeated]))  # the oracle: the model's own path
    expected = score_patterns(maps[:, :2], maps[:, 2:], probes.period)
    for name, value in out.items():
        assert value.shape == (2, 2) and bool(torch.isfinite(value).all()), name
        assert_close(value, expected[name])
    for name in ("previous_token", "duplicate_token", "induction", "first_token"):
        assert bool(((out[name] >= 0) & (out[name] <= 1 + 1e-6)).all()), name


def test_head_types_label_each_constructed_pattern() -> None:
    from gptmini.insight.scores import head_types

    diagonal = torch.eye(T)  # every query attends to itself: distance 0, no other score
    patterns = [INDUCTION, PREVIOUS, SINK, diagonal, UNIFORM]
    stack = torch.stack(patterns)[None, None]  # (n_layer=1, B=1, n_head=5, T, T)
    labels = head_types(score_patterns(stack, stack, P))
    assert labels == [["induction", "previous-token", "first-token", "local", "other"]]
