"""How model.attention=sdpa trains ALiBi, windows and sinks on a CPU: which kernel a module chooses for its options
and the length it is built for, and that the chosen kernel is the function the explicit reference computes, at
lengths either side of a switch. (tests/unit/attention/attention_matrix.py asks for every kernel on every option
combination at a short length; test_kernels.py holds each kernel against the explicit one for each feature it
declares.)"""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest
import torch
from attention_matrix import cpu_kernels, fast_and_reference
from torch.testing import assert_close

from gptmini.attention import KVCache, build_attention
from gptmini.attention.kernels.chunked import CHUNK_QUERIES, ChunkedKernel
from gptmini.attention.kernels.explicit import EXPLICIT_SINK_MAX_LEN

CPU = torch.device("cpu")
SHORT, LONG = EXPLICIT_SINK_MAX_LEN, EXPLICIT_SINK_MAX_LEN + 37


@pytest.fixture(autouse=True)
def a_cpu_machine():
    # the kernels a machine without CUDA chooses (one with CUDA chooses FlexAttention, which hands these the CPU's)
    with mock.patch("torch.cuda.is_available", return_value=False):
        yield


@pytest.mark.parametrize(
    ("options", "short", "long"),
    [
        ({"alibi": True}, "mask", "mask"),
        ({"sliding_window": 8}, "mask", "mask"),
        ({"sliding_window": 8, "alibi": True}, "mask", "mask"),
        ({"attn_sink": True}, "explicit", "sink_slot"),
        ({"attn_sink": True, "n_kv_head": 2}, "explicit", "sink_slot"),
        ({"attn_sink": True, "alibi": True}, "explicit", "mask"),
        ({"attn_sink": True, "sliding_window": 8}, "explicit", "mask"),
    ],
    ids=lambda o: o if isinstance(o, str) else "+".join(o),
)
def test_cpu_kernel_by_options_and_context(options: dict[str, Any], short: str, long: str):
    built_short = build_attention("sdpa", 32, 4, SHORT, **options)
    built_long = build_attention("sdpa", 32, 4, LONG, **options)
    assert built_short.kernel_for(CPU).name == short
    assert built_long.kernel_for(CPU).name == long
    # decoding: the chosen kernel where it takes a cache (explicit, mask), else the mask kernel
    assert built_short.kernel_for(CPU, cached=True).name == short
    assert built_long.kernel_for(CPU, cached=True).name == "mask"
    chosen = build_attention("sdpa", 32, 4, LONG, kernel="explicit", **options)  # a kernel asked for wins
    assert chosen.kernel_for(CPU).name == "explicit"


def assert_default_path_is_the_reference(
    module: torch.nn.Module, x: torch.Tensor, upstream: torch.Tensor
) -> None:
    # forward and backward, at lengths whose float32 sums leave a little more rounding than the matrix's
    (fast, fast_dx, fast_grads), (ref, ref_dx, ref_grads) = fast_and_reference(module, x, upstream)
    assert_close(fast, ref, atol=2e-5, rtol=1e-5)
    assert_close(fast_dx, ref_dx, atol=2e-5, rtol=1e-5)
    for name, grad in ref_grads.items():
        assert_close(
            fast_grads[name], grad, atol=2e-5 * max(1.0, grad.abs().max().item()), rtol=1e-5, msg=name
        )


@pytest.mark.parametrize("T", [SHORT, LONG])
@pytest.mark.parametrize(
    "options",
    [{"attn_sink": True}, {"attn_sink": True, "n_kv_head": 2, "rope_base": 10000.0}],
    ids=["sink", "sink+gqa+rope"],
)
def test_default_path_equals_the_reference_either_side_of_the_switch(T: int, options: dict[str, Any]):
    # built for T tokens: the explicit softmax up to SHORT, the sink slot beyond
    torch.manual_seed(0)
    module = build_attention("sdpa", 32, 4, T, **options).train()
    assert module.kernel_for(CPU).name == ("explicit" if T <= SHORT else "sink_slot")
    with torch.no_grad():
        module.sink.copy_(torch.randn(4))  # a sink that matters: zeros would be a special case
    x = torch.randn(2, T, 32, requires_grad=True)
    upstream = torch.randn(2, T, 32)
    assert_default_path_is_the_reference(module, x, upstream)


@pytest.mark.parametrize(
    "options",
    [
        {"sliding_window": 8},
        {"sliding_window": 8, "alibi": True, "n_kv_head": 2},
        {"sliding_window": 5000},
        {"alibi": True},
    ],
    ids=["window", "window+alibi+gqa", "window-longer-than-T", "alibi"],
)
def test_alibi_and_windows_on_a_long_sequence_train_in_chunks(options: dict[str, Any]):
    module = build_attention("sdpa", 32, 4, 4096, **options)
    assert module.kernel_for(CPU).name == "chunked"
    assert len(module.kernel.chunks(2 * CHUNK_QUERIES - 1, CPU, module)) == 1  # the whole mask, as fast there
    assert len(module.kernel.chunks(2 * CHUNK_QUERIES, CPU, module)) == 2
    with_sink = build_attention("sdpa", 32, 4, 4096, attn_sink=True, **options)
    assert with_sink.kernel_for(CPU).name == "mask"
    # the chunked default at a length where it is the default (2 chunks and a ragged third), forward and backward
    torch.manual_seed(0)
    module.train()
    T = 2 * CHUNK_QUERIES + 37
    x = torch.randn(1, T, 32, requires_grad=True)
    upstream = torch.randn(1, T, 32)
    assert_default_path_is_the_reference(module, x, upstream)
    chunks = module.kernel.chunks(T, CPU, module)
    assert [(a, b) for a, b, _, _ in chunks] == [(0, 256), (256, 512), (512, T)]
    window = options.get("sliding_window", T)
    assert [k0 for _, _, k0, _ in chunks] == [max(0, a - window + 1) for a, _, _, _ in chunks]


def test_a_kernel_asked_for_must_support_the_options():
    with pytest.raises(ValueError, match=r"^attention kernel 'chunked' does not support sink; kernels that"):
        build_attention("sdpa", 32, 4, 256, attn_sink=True, sliding_window=4, kernel="chunked")
    with pytest.raises(
        ValueError, match=r"kernel 'sink_slot' does not support alibi; .*: flex, explicit, mask \(or auto\)"
    ):
        build_attention("sdpa", 32, 4, 256, attn_sink=True, alibi=True, kernel="sink_slot")
    with pytest.raises(
        ValueError, match=r"^unknown attention kernel 'fast'; valid kernels: auto, causal, flex"
    ):
        build_attention("sdpa", 32, 4, 256, kernel="fast")
    with pytest.raises(ValueError, match=r"^attention kernel 'flex' does not support dropout; .*: chunked"):
        build_attention("sdpa", 32, 4, 256, 0.1, alibi=True, kernel="flex")


def test_a_kernel_asked_for_runs_only_the_calls_it_supports():
    # chunked has no cache: the mask kernel decodes, and still equals the uncached forward
    torch.manual_seed(0)
    module = build_attention("sdpa", 32, 4, 64, alibi=True, kernel=ChunkedKernel(queries=2)).eval()
    assert module.kernel_for(CPU).name == "chunked"
    assert module.kernel_for(CPU, cached=True).name == "mask"
    x = torch.randn(1, 6, 32)
    cache = KVCache(1, 4, 64, 8)
    with torch.no_grad():
        steps = torch.cat(
            [
                module(x[:, :4], kv_cache=cache),
                module(x[:, 4:5], kv_cache=cache),
                module(x[:, 5:], kv_cache=cache),
            ],
            dim=1,
        )
        assert_close(steps, module(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "options",
    [
        {"qk_norm": True},
        {"rope_base": 10000.0, "qk_norm": True, "attn_gate": True, "n_kv_head": 2},
        {"alibi": True},
        {"sliding_window": 5},
        {"attn_sink": True},
        {"alibi": True, "sliding_window": 5, "attn_sink": True, "n_kv_head": 2},
    ],
    ids=lambda o: "+".join(o),
)
def test_every_cpu_kernel_trains_under_bf16_autocast(options: dict[str, Any]):
    # bf16-mixed is the CPU default where AMX multiplies bf16: every kernel must take bf16 activations forward and
    # backward and stay within bf16's rounding of the float32 result
    torch.manual_seed(0)
    reference = build_attention("sdpa", 32, 4, 64, **options).train()
    if reference.sink is not None:
        with torch.no_grad():
            reference.sink.copy_(torch.randn(4))
    x = torch.randn(2, 12, 32)
    expected = reference.reference_forward(x).detach()
    for kernel in cpu_kernels("sdpa", options):
        if isinstance(kernel, ChunkedKernel):
            kernel = ChunkedKernel(queries=5)  # three chunks of the 12 queries
        module = build_attention(
            "sdpa", 32, 4, 64, **options, **({} if kernel is None else {"kernel": kernel})
        )
        module.load_state_dict(reference.state_dict())
        module.train()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = module(x)
        out.float().square().mean().backward()
        assert_close(out.float(), expected, atol=5e-2, rtol=5e-2, msg=f"kernel {kernel}")
        for name, p in module.named_parameters():
            assert p.grad is not None and p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all(), name
