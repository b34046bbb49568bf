"""Each production kernel against the explicit-mask reference (``ExplicitKernel``: scores, mask, softmax, weights .
values) on the same queries, keys and values, for every combination of the features it declares, forward and
backward; the reference itself against a float64 loop; and the dispatch's choice by declared capability."""

from __future__ import annotations

import itertools
import math
import warnings

import pytest
import torch
from torch.testing import assert_close

from gptmini.attention.alibi import alibi_slopes
from gptmini.attention.kernels import (
    KERNELS,
    AttentionKernel,
    ChunkedKernel,
    ExplicitKernel,
    KernelDispatch,
    Scores,
    available_kernels,
)

B, NH, HS = 2, 4, 8
REFERENCE = ExplicitKernel()
CPU = torch.device("cpu")
# FlexAttention trains only on a CUDA device: there it joins the forward-and-backward cases
CUDA = torch.cuda.is_available()


def _subsets(features: frozenset[str]) -> list[frozenset[str]]:
    names = sorted(features)
    return [frozenset(c) for r in range(len(names) + 1) for c in itertools.combinations(names, r)]


def _case(
    features: frozenset[str], T: int = 7, seed: int = 0, device: str = "cpu"
) -> tuple[torch.Tensor, ...]:
    """q (B, nh, T, hs) and k, v (B, n_kv, S, hs) with S = T plus 5 cached keys under "cache", and the sink."""
    g = torch.Generator().manual_seed(seed)
    kv_heads = 2 if "gqa" in features else NH
    S = T + (5 if "cache" in features else 0)
    q = torch.randn(B, NH, T, HS, generator=g)
    k, v = (torch.randn(B, kv_heads, S, HS, generator=g) for _ in range(2))
    sink = torch.randn(NH, generator=g)
    return tuple(t.to(device) for t in (q, k, v, sink))


def _scores(features: frozenset[str], sink: torch.Tensor, start: int, dropout: float = 0.0) -> Scores:
    return Scores(
        n_head=NH,
        slopes=alibi_slopes(NH).to(sink.device) if "alibi" in features else None,
        window=3 if "window" in features else None,
        sink=sink if "sink" in features else None,
        start=start,
        cached="cache" in features,
        dropout=dropout,
    )


def _run(kernel: AttentionKernel, q, k, v, sink, features, grad: bool) -> tuple[torch.Tensor, list]:
    leaves = [t.clone().requires_grad_(grad) for t in (q, k, v, sink)]
    q, k, v, sink = leaves
    out = kernel(q, k, v, _scores(features, sink, k.shape[-2] - q.shape[-2]))
    if not grad:
        return out.detach(), []
    (out * torch.linspace(-1, 1, out.numel(), device=out.device).view_as(out)).sum().backward()
    return out.detach(), [t.grad for t in leaves]


def _cases(can_train: bool) -> list:
    # (kernel, features, device): every kernel but the reference, on a CPU; on a CUDA device too, where FlexAttention
    # trains (can_train: the cases checked forward and backward)
    cases = []
    devices = ["cpu", "cuda"] if CUDA else ["cpu"]
    for device, kernel in itertools.product(devices, KERNELS):
        if kernel.name == "chunked":
            kernel = ChunkedKernel(queries=3)
        trains = kernel.name != "flex" or device == "cuda"
        if kernel.name == "explicit" or trains != can_train:
            continue
        for features in _subsets(kernel.supports - {"dropout"}):
            name = f"{device}:{kernel.name}:{'+'.join(sorted(features)) or 'plain'}"
            cases.append(pytest.param(kernel, features, device, id=name))
    return cases


@pytest.mark.parametrize(("kernel", "features", "device"), _cases(can_train=True))
def test_each_kernel_equals_the_explicit_reference_for_each_feature_it_declares(kernel, features, device):
    # T=7 with the chunked kernel in chunks of 3: chunks from key 0, whole ones sharing a window's mask, a ragged one
    q, k, v, sink = _case(features, device=device)
    out, grads = _run(kernel, q, k, v, sink, features, grad=True)
    ref, ref_grads = _run(REFERENCE, q, k, v, sink, features, grad=True)
    assert_close(out, ref, atol=1e-5, rtol=1e-5)
    for name, got, want in zip(("q", "k", "v", "sink"), grads, ref_grads, strict=True):
        if want is None:  # the sink of a call without one
            assert got is None, name
        else:
            assert_close(got, want, atol=1e-5, rtol=1e-5, msg=name)


@pytest.mark.parametrize(("kernel", "features", "device"), _cases(can_train=False))
def test_flex_attention_equals_the_explicit_reference_forward_on_a_cpu(kernel, features, device):
    # a CPU's FlexAttention has no backward: its eager reference, forward (on a CUDA device it is checked both ways)
    q, k, v, sink = _case(features, T=9, device=device)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager FlexAttention says it is unfused: here it is a reference
        out, _ = _run(kernel, q, k, v, sink, features, grad=False)
    assert_close(out, _run(REFERENCE, q, k, v, sink, features, grad=False)[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("T", [1, 4])
@pytest.mark.parametrize("kernel", [k for k in KERNELS if "cache" in k.supports], ids=lambda k: k.name)
def test_cached_decoding_equals_the_rows_of_the_whole_sequence(kernel, T):
    # one or four new queries after 5 cached keys: the last rows of the uncached reference over all 5 + T
    features = frozenset({"alibi", "window", "sink", "gqa"}) & kernel.supports
    q, k, v, sink = _case(features | {"cache"}, T=T)
    whole_q = torch.cat((torch.randn(B, NH, 5, HS), q), dim=2)
    with torch.no_grad():
        got = kernel(q, k, v, _scores(features | {"cache"}, sink, start=5))
        whole = REFERENCE(whole_q, k, v, _scores(features, sink, start=0))
    assert_close(got, whole[:, :, 5:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "features",
    _subsets(frozenset({"alibi", "window", "sink", "gqa", "cache"})),
    ids=lambda f: "+".join(sorted(f)) or "plain",
)
def test_the_reference_is_softmax_of_the_biased_scores(features):
    # a float64 loop, query by query, written from the definitions: what the explicit kernel is trusted for
    q, k, v, sink = (t.double() for t in _case(features))
    T, S = q.shape[-2], k.shape[-2]
    start, group = S - T, NH // k.shape[1]
    slopes = alibi_slopes(NH).double()
    want = torch.zeros_like(q)
    for h, i in itertools.product(range(NH), range(T)):
        pos = start + i
        logits = []
        for j in range(S):
            visible = j <= pos and ("window" not in features or pos - j < 3)
            bias = -slopes[h].item() * (pos - j) if "alibi" in features else 0.0
            score = (q[:, h, i] * k[:, h // group, j]).sum(-1) / math.sqrt(HS) + bias  # (B,)
            logits.append(torch.where(torch.tensor(visible), score, torch.full_like(score, -math.inf)))
        logits = torch.stack(logits, dim=-1)  # (B, S)
        if "sink" in features:
            logits = torch.cat((logits, sink[h].expand(B, 1)), dim=-1)
        p = torch.softmax(logits, dim=-1)[:, :S]
        want[:, h, i] = (p[:, :, None] * v[:, h // group]).sum(1)  # (B, hs)
    got = REFERENCE(q.float(), k.float(), v.float(), _scores(features, sink.float(), start))
    assert_close(got, want.float(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kernel", [k for k in KERNELS if "dropout" in k.supports], ids=lambda k: k.name)
def test_a_kernel_that_declares_dropout_drops_attention_without_bias(kernel):
    # inverted dropout: each call differs from the others and from no dropout, and their mean is the output without
    features = frozenset({"alibi", "window", "sink"}) & kernel.supports
    q, k, v, sink = _case(features, T=6)
    start = 0
    plain = kernel(q, k, v, _scores(features, sink, start))
    torch.manual_seed(0)
    n = 2000  # draws, as one batch: each batch row gets its own dropout mask
    q, k, v = (t.repeat(n, 1, 1, 1) for t in (q, k, v))
    draws = kernel(q, k, v, _scores(features, sink, start, dropout=0.3)).unflatten(0, (n, B))
    assert not torch.allclose(draws[0], draws[1]) and not torch.allclose(draws[0], plain)
    # within 5 standard errors of the mean, element by element
    assert ((draws.mean(0) - plain).abs() <= 5 * draws.std(0) / math.sqrt(len(draws)) + 1e-6).all()


def test_the_dispatch_takes_the_first_kernel_that_supports_and_suits_the_call():
    dispatch = KernelDispatch(KERNELS)

    def pick(features: set[str], T: int = 10, device: str = "cpu") -> str:
        scores = _scores(frozenset(features), torch.zeros(NH), 0)
        return dispatch.select(frozenset(features), T, torch.device(device), scores).name

    assert pick(set()) == pick({"gqa", "cache", "dropout"}) == "causal"
    assert pick({"alibi"}) == pick({"window", "cache"}) == "mask"
    assert pick({"alibi"}, T=512) == "chunked"
    assert pick({"sink"}) == "explicit" and pick({"sink"}, T=129) == "sink_slot"
    assert pick({"sink", "window"}, T=129) == "mask"
    assert available_kernels() == ["causal", "flex", "chunked", "explicit", "sink_slot", "mask"]


def test_a_new_kernel_joins_by_declaring_what_it_supports():
    calls = []

    class Recording(AttentionKernel):
        name = "recording"
        supports = frozenset({"window"})

        def __call__(self, q, k, v, scores):
            calls.append(scores.window)
            return REFERENCE(q, k, v, scores)

    dispatch = KernelDispatch(KERNELS, preferred=Recording())
    dispatch.check(frozenset({"window"}))
    with pytest.raises(ValueError, match="kernel 'recording' does not support alibi"):
        dispatch.check(frozenset({"alibi"}))
    q, k, v, sink = _case(frozenset({"window"}))
    assert_close(
        dispatch(q, k, v, _scores(frozenset({"window"}), sink, 0)),
        REFERENCE(q, k, v, _scores(frozenset({"window"}), sink, 0)),
    )
    assert calls == [3]
    # a call it does not support (a cache) goes to the automatic choice
    q, k, v, sink = _case(frozenset({"window", "cache"}))
    dispatch(q, k, v, _scores(frozenset({"window", "cache"}), sink, k.shape[-2] - q.shape[-2]))
    assert calls == [3]


def test_a_kernel_declares_only_known_features():
    with pytest.raises(
        TypeError, match=r"Misspelt.supports names unknown features \['windows'\]; known: alibi"
    ):

        class Misspelt(AttentionKernel):
            name = "misspelt"
            supports = frozenset({"windows", "gqa"})
