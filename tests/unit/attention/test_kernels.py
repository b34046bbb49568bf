"""Each production kernel against the explicit-mask reference (``ExplicitKernel``: scores, mask, softmax, weights .
values) on the same queries, keys and values, for every combination of the features it declares, forward and
backward; the reference itself against a float64 loop; the choice of a module's kernel, made once when it is built;
and the path from ``GPT.forward`` to PyTorch's SDPA."""

from __future__ import annotations

import itertools
import math
import sys
import warnings
from pathlib import Path
from unittest import mock

import pytest
import torch
from torch.testing import assert_close

import gptmini
from gptmini.attention import KVCache, build_attention
from gptmini.attention.alibi import alibi_slopes
from gptmini.attention.kernels import (
    KERNELS,
    MASK,
    AttentionKernel,
    ChunkedKernel,
    ExplicitKernel,
    FlexKernel,
    auto_kernel,
    available_kernels,
    choose_kernel,
)
from gptmini.attention.kernels.chunked import CHUNK_QUERIES
from gptmini.attention.sdpa import CausalSelfAttention
from gptmini.model import GPT, GPTConfig

B, NH, HS = 2, 4, 8
REFERENCE = ExplicitKernel()
CPU = torch.device("cpu")
# FlexAttention trains only on a CUDA device: there it joins the forward-and-backward cases
CUDA = torch.cuda.is_available()


def _subsets(features: frozenset[str]) -> list[frozenset[str]]:
    names = sorted(features)
    return [frozenset(c) for r in range(len(names) + 1) for c in itertools.combinations(names, r)]


def _module(features: frozenset[str], device: str = "cpu", seed: int = 0) -> CausalSelfAttention:
    """The attention module whose options the kernels read: ALiBi, a window of 3, a sink of random logits."""
    module = build_attention(
        "sdpa",
        NH * HS,
        NH,
        64,
        alibi="alibi" in features,
        sliding_window=3 if "window" in features else None,
        attn_sink="sink" in features,
        n_kv_head=2 if "gqa" in features else None,
    )
    if module.sink is not None:
        with torch.no_grad():
            module.sink.copy_(torch.randn(NH, generator=torch.Generator().manual_seed(seed + 1)))
    return module.to(device)


def _case(
    features: frozenset[str], T: int = 7, seed: int = 0, device: str = "cpu"
) -> tuple[torch.Tensor, ...]:
    """q (B, nh, T, hs) and k, v (B, n_kv, S, hs) with S = T plus 5 cached keys under "cache"."""
    g = torch.Generator().manual_seed(seed)
    kv_heads = 2 if "gqa" in features else NH
    S = T + (5 if "cache" in features else 0)
    q = torch.randn(B, NH, T, HS, generator=g)
    k, v = (torch.randn(B, kv_heads, S, HS, generator=g) for _ in range(2))
    return tuple(t.to(device) for t in (q, k, v))


def _run(
    kernel: AttentionKernel, q, k, v, module, grad: bool, dropout: float = 0.0
) -> tuple[torch.Tensor, list]:
    leaves = [t.clone().requires_grad_(grad) for t in (q, k, v)]
    module.zero_grad(set_to_none=True)
    out = kernel(*leaves, module, k.shape[-2] - q.shape[-2], dropout)
    if not grad:
        return out.detach(), []
    (out * torch.linspace(-1, 1, out.numel(), device=out.device).view_as(out)).sum().backward()
    return out.detach(), [t.grad for t in leaves] + [None if module.sink is None else module.sink.grad]


def _kernels() -> list[AttentionKernel]:
    # the chunked one in chunks of 3 of the 7 queries: chunks from key 0, whole ones sharing a window's mask, a
    # ragged one
    return [ChunkedKernel(queries=3) if cls is ChunkedKernel else cls() for cls in KERNELS.values()]


def _cases(can_train: bool) -> list:
    # (kernel, features, device): every kernel but the reference, on a CPU; on a CUDA device too, where FlexAttention
    # trains (can_train: the cases checked forward and backward)
    cases = []
    devices = ["cpu", "cuda"] if CUDA else ["cpu"]
    for device, kernel in itertools.product(devices, _kernels()):
        trains = kernel.name != "flex" or device == "cuda"
        if kernel.name == "explicit" or trains != can_train:
            continue
        for features in _subsets(kernel.supports - {"dropout"}):
            name = f"{device}:{kernel.name}:{'+'.join(sorted(features)) or 'plain'}"
            cases.append(pytest.param(kernel, features, device, id=name))
    return cases


@pytest.mark.parametrize(("kernel", "features", "device"), _cases(can_train=True))
def test_each_kernel_equals_the_explicit_reference_for_each_feature_it_declares(kernel, features, device):
    module = _module(features, device)
    q, k, v = _case(features, device=device)
    out, grads = _run(kernel, q, k, v, module, grad=True)
    ref, ref_grads = _run(REFERENCE, q, k, v, module, grad=True)
    assert_close(out, ref, atol=1e-5, rtol=1e-5)
    for name, got, want in zip(("q", "k", "v", "sink"), grads, ref_grads, strict=True):
        if want is None:  # the sink of a module without one
            assert got is None, name
        else:
            assert_close(got, want, atol=1e-5, rtol=1e-5, msg=name)


@pytest.mark.parametrize(("kernel", "features", "device"), _cases(can_train=False))
def test_flex_attention_equals_the_explicit_reference_forward_on_a_cpu(kernel, features, device):
    # a CPU's FlexAttention has no backward: its eager reference, forward (on a CUDA device it is checked both ways)
    module = _module(features, device)
    q, k, v = _case(features, T=9, device=device)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager FlexAttention says it is unfused: here it is a reference
        out, _ = _run(kernel, q, k, v, module, grad=False)
    assert_close(out, _run(REFERENCE, q, k, v, module, grad=False)[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("T", [1, 4])
@pytest.mark.parametrize("kernel", [k for k in _kernels() if "cache" in k.supports], ids=lambda k: k.name)
def test_cached_decoding_equals_the_rows_of_the_whole_sequence(kernel, T):
    # one or four new queries after 5 cached keys: the last rows of the uncached reference over all 5 + T
    features = frozenset({"alibi", "window", "sink", "gqa"}) & kernel.supports
    module = _module(features)
    q, k, v = _case(features | {"cache"}, T=T)
    whole_q = torch.cat((torch.randn(B, NH, 5, HS), q), dim=2)
    with torch.no_grad():
        got = kernel(q, k, v, module, 5, 0.0)
        whole = REFERENCE(whole_q, k, v, module, 0, 0.0)
    assert_close(got, whole[:, :, 5:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "features",
    _subsets(frozenset({"alibi", "window", "sink", "gqa", "cache"})),
    ids=lambda f: "+".join(sorted(f)) or "plain",
)
def test_the_reference_is_softmax_of_the_biased_scores(features):
    # a float64 loop, query by query, written from the definitions: what the explicit kernel is trusted for
    module = _module(features)
    q, k, v = (t.double() for t in _case(features))
    sink = torch.zeros(NH) if module.sink is None else module.sink.detach().double()
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
    with torch.no_grad():
        got = REFERENCE(q.float(), k.float(), v.float(), module, start, 0.0)
    assert_close(got, want.float(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kernel", [k for k in _kernels() if "dropout" in k.supports], ids=lambda k: k.name)
def test_a_kernel_that_declares_dropout_drops_attention_without_bias(kernel):
    # inverted dropout: each call differs from the others and from no dropout, and their mean is the output without
    features = frozenset({"alibi", "window", "sink"}) & kernel.supports
    module = _module(features)
    q, k, v = _case(features, T=6)
    with torch.no_grad():
        plain = kernel(q, k, v, module, 0, 0.0)
        torch.manual_seed(0)
        n = 2000  # draws, as one batch: each batch row gets its own dropout mask
        q, k, v = (t.repeat(n, 1, 1, 1) for t in (q, k, v))
        draws = kernel(q, k, v, module, 0, 0.3).unflatten(0, (n, B))
    assert not torch.allclose(draws[0], draws[1]) and not torch.allclose(draws[0], plain)
    # within 5 standard errors of the mean, element by element
    assert ((draws.mean(0) - plain).abs() <= 5 * draws.std(0) / math.sqrt(len(draws)) + 1e-6).all()


def test_the_automatic_choice_follows_the_options_and_the_context():
    def pick(features: set[str], context: int = 64) -> str:
        kernel = auto_kernel(frozenset(features), context)
        return kernel.runs_on(CPU).name  # a CUDA machine's FlexAttention hands a CPU's calls to this one

    assert pick(set()) == pick({"gqa", "dropout"}) == "causal"
    assert pick({"alibi"}) == pick({"window", "gqa"}) == "mask"
    assert pick({"alibi"}, context=2 * CHUNK_QUERIES) == pick({"window"}, context=4096) == "chunked"
    assert pick({"sink"}) == pick({"sink", "alibi"}) == "explicit"  # built for short sequences
    assert pick({"sink"}, context=129) == "sink_slot" and pick({"sink", "window"}, context=129) == "mask"
    with mock.patch("torch.cuda.is_available", return_value=True):
        on_gpu = auto_kernel(frozenset({"alibi"}), 1024)
        assert on_gpu.runs_on(CPU).name == "chunked"
        assert isinstance(on_gpu, FlexKernel) and on_gpu.runs_on(torch.device("cuda")) is on_gpu
        assert (
            auto_kernel(frozenset({"alibi", "dropout"}), 1024).name == "chunked"
        )  # FlexAttention has no dropout
    assert available_kernels() == ["causal", "flex", "chunked", "explicit", "sink_slot", "mask"]


def test_on_a_cuda_machine_flex_attention_hands_a_cpus_calls_to_the_cpu_kernel():
    with mock.patch("torch.cuda.is_available", return_value=True):
        module = build_attention("sdpa", 32, 4, 64, alibi=True, attn_sink=True).train()
    assert isinstance(module.kernel, FlexKernel) and module.kernel_for(CPU).name == "explicit"
    x = torch.randn(2, 10, 32)
    with mock.patch("gptmini.attention.kernels.flex.flex_attend") as flex:
        assert_close(module(x), module.reference_forward(x))  # trains on a CPU, where FlexAttention cannot
    flex.assert_not_called()


def test_the_kernel_is_chosen_once_when_the_module_is_built():
    with mock.patch("gptmini.attention.sdpa.choose_kernel", wraps=choose_kernel) as chosen:
        module = build_attention("sdpa", 32, 4, 64, alibi=True, kernel="chunked").eval()
        cache = KVCache(1, 4, 64, 8)
        with torch.no_grad():
            module(torch.randn(1, 10, 32))
            module.train()(torch.randn(1, 10, 32))
            module.eval()(torch.randn(1, 3, 32), kv_cache=cache)
            module(torch.randn(1, 1, 32), kv_cache=cache)
    assert chosen.call_count == 1
    assert module.kernel_for(CPU).name == "chunked" and module.kernel_for(CPU, cached=True) is MASK


def test_a_new_kernel_joins_by_declaring_what_it_supports():
    calls = []

    class Recording(AttentionKernel):
        name = "recording"
        supports = frozenset({"window"})

        def __call__(self, q, k, v, module, start, dropout):
            calls.append(module.sliding_window)
            return REFERENCE(q, k, v, module, start, dropout)

    recording = Recording()
    module = build_attention("sdpa", 32, 4, 64, sliding_window=3, kernel=recording).eval()
    assert module.kernel is recording
    with pytest.raises(ValueError, match="kernel 'recording' does not support alibi"):
        build_attention("sdpa", 32, 4, 64, sliding_window=3, alibi=True, kernel=recording)
    x = torch.randn(1, 6, 32)
    with torch.no_grad():
        assert_close(module(x), module.reference_forward(x))
        assert calls == [3]
        # a cache it does not support: the mask kernel decodes
        cache = KVCache(1, 4, 64, 8)
        module(x[:, :5], kv_cache=cache)
        module(x[:, 5:], kv_cache=cache)
    assert calls == [3]


def test_a_kernel_declares_only_known_features():
    with pytest.raises(
        TypeError, match=r"Misspelt.supports names unknown features \['windows'\]; known: alibi"
    ):

        class Misspelt(AttentionKernel):
            name = "misspelt"
            supports = frozenset({"windows", "gqa"})


# --- the path from GPT.forward to SDPA ------------------------------------------------------------------------

PACKAGE = str(Path(gptmini.__file__).parent)


def _paths_to_sdpa(model: GPT, idx: torch.Tensor) -> list[list[str]]:
    """For each call of ``F.scaled_dot_product_attention`` in ``model(idx)``, the gptmini functions on the stack
    from ``GPT.forward`` to its caller, outermost first (PyTorch's own frames, such as ``nn.Module.__call__``'s,
    are not the code a reader follows)."""
    paths: list[list[str]] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        frame, names = sys._getframe(1), []
        while frame is not None:
            if frame.f_code.co_filename.startswith(PACKAGE):
                names.append(frame.f_code.co_qualname)
            if frame.f_code is GPT.forward.__code__:
                break
            frame = frame.f_back
        paths.append(names[::-1])
        return sdpa(*args, **kwargs)

    with mock.patch.object(torch.nn.functional, "scaled_dot_product_attention", spy), torch.no_grad():
        model(idx)
    return paths


def test_the_default_attention_is_four_frames_from_gpt_forward_to_sdpa():
    # nanoGPT's shape: the model, its loop over blocks, the block, the attention that calls SDPA itself
    model = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=16)).eval()
    paths = _paths_to_sdpa(model, torch.randint(64, (1, 8)))
    assert paths == [["GPT.forward", "GPT.hidden_states", "Block.forward", "CausalSelfAttention.forward"]] * 2


@pytest.mark.parametrize(
    ("options", "kernel"),
    [
        ({"position": "alibi"}, "MaskKernel.__call__"),
        ({"sliding_window": 4, "block_size": 2 * CHUNK_QUERIES}, "ChunkedKernel.__call__"),
        ({"attn_sink": True, "block_size": 256}, "SinkSlotKernel.__call__"),
        ({"attn_sink": True, "sliding_window": 4, "block_size": 256}, "MaskKernel.__call__"),
    ],
    ids=["alibi", "window", "sink", "sink+window"],
)
def test_a_score_kernel_is_one_frame_more(options, kernel):
    config = GPTConfig(vocab_size=64, n_layer=1, n_head=2, n_embd=16, **({"block_size": 16} | options))
    with mock.patch("torch.cuda.is_available", return_value=False):  # a CPU's kernels, not FlexAttention's
        model = GPT(config).eval()
    paths = _paths_to_sdpa(model, torch.randint(64, (1, 8)))
    assert paths == [
        ["GPT.forward", "GPT.hidden_states", "Block.forward", "CausalSelfAttention.forward", kernel]
    ]


def test_under_cpu_bf16_autocast_sdpa_runs_in_float32_and_the_result_matches():
    # PyTorch's CPU kernel is several times slower in bf16: the projections take bf16, the attention float32
    torch.manual_seed(0)
    model = GPT(
        GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=16, position="rope", qk_norm=True)
    )
    idx = torch.randint(64, (2, 8))
    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, **kwargs):
        seen.append((q.dtype, k.dtype, v.dtype, torch.is_autocast_enabled("cpu")))
        return sdpa(q, k, v, **kwargs)

    with mock.patch.object(torch.nn.functional, "scaled_dot_product_attention", spy):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits, loss = model(idx, idx)
        loss.backward()
    assert seen == [(torch.float32, torch.float32, torch.float32, False)] * 2
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())
    # against the same model in float32: bf16 projections change the loss by bf16's rounding only
    with torch.no_grad():
        _, loss32 = model(idx, idx)
    assert_close(loss.float(), loss32, rtol=2e-2, atol=0.0)
