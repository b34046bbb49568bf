"""The checks every registered attention implementation must pass, as plain functions of a registry name.

``test_matrix.py`` runs each check for each registered name; ``test_registry.py`` registers one more
implementation inside a test and runs the same list, showing that a new mechanism is picked up with no other
file edited. Checks read what an implementation can do from its declared capabilities."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any
from unittest import mock

import numpy as np
import pytest
import torch
from numpy_reference import (
    numpy_additive_multihead_attention,
    numpy_multihead_attention,
    numpy_rms_norm,
    numpy_rope,
    numpy_softmax,
)
from torch.testing import assert_close

from gptmini.attention import ATTENTION_REGISTRY, AttentionWeights, KVCache, build_attention
from gptmini.attention.kernels import KERNELS, ChunkedKernel, FlexKernel
from gptmini.model import GPT, GPTConfig

D_MODEL, N_HEAD, CONTEXT = 32, 4, 12
HEAD = D_MODEL // N_HEAD
# the values each attention option is checked with, for the implementations that declare it
OPTION_VALUES: dict[str, list[Any]] = {
    "n_kv_head": [2, 1],  # grouped-query, multi-query
    "rope_base": [10000.0, 100.0],  # the usual base, and a small one that turns a lot within 12 positions
    "alibi": [True],
    "sliding_window": [3, 1],  # binding within 12 positions; 1: each token sees only itself
    "qk_norm": [True],
    "attn_gate": [True],
    "attn_sink": [True],
}


def configurations(name: str) -> list[dict[str, Any]]:
    """Plain attention, each option the implementation declares on its own, then all of them together."""
    options = sorted(ATTENTION_REGISTRY[name].options & OPTION_VALUES.keys())
    configs = [{}] + [{opt: value} for opt in options for value in OPTION_VALUES[opt]]
    if len(options) > 1:
        together = {opt: OPTION_VALUES[opt][0] for opt in options}
        # rope and alibi are both positions: a model has one, so each goes with all the other options
        for position in ("rope_base", "alibi"):
            configs.append(
                {k: v for k, v in together.items() if k not in {"rope_base", "alibi"} - {position}}
            )
    return configs


def gpt_settings(options: dict[str, Any]) -> dict[str, Any]:
    """The GPTConfig settings that produce these attention options (GPTConfig.attention_options, inverted)."""
    settings = dict(options)
    if "rope_base" in settings:
        settings["position"] = "rope"
    if settings.pop("alibi", False):
        settings["position"] = "alibi"
    return settings


def allowed_keys(T: int, options: dict[str, Any]) -> torch.Tensor:
    """(T, T) bool: the keys each query may see — the past and itself, within the window if there is one."""
    distance = torch.arange(T)[:, None] - torch.arange(T)[None, :]
    allowed = distance >= 0
    if options.get("sliding_window") is not None:
        allowed &= distance < options["sliding_window"]
    return allowed


def make(
    name: str, options: dict[str, Any] | None = None, dropout: float = 0.0, bias: bool = True
) -> torch.nn.Module:
    return build_attention(name, D_MODEL, N_HEAD, CONTEXT, dropout=dropout, bias=bias, **(options or {}))


def kv_heads(options: dict[str, Any]) -> int:
    return options.get("n_kv_head") or N_HEAD


def random_weights(module: torch.nn.Module, seed: int = 0) -> AttentionWeights:
    """Random canonical weights shaped for ``module`` (biases only if it has them, its extras too)."""
    g = torch.Generator().manual_seed(seed)
    current = module.get_weights()

    def rand(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else 0.3 * torch.randn(t.shape, generator=g)

    return AttentionWeights(
        qkv_weight=rand(current.qkv_weight),
        qkv_bias=rand(current.qkv_bias),
        out_weight=rand(current.out_weight),
        out_bias=rand(current.out_bias),
        extra={k: rand(v) for k, v in current.extra.items()},
    )


def _np(t: torch.Tensor | None) -> np.ndarray | None:
    return None if t is None else t.detach().double().numpy()


def _heads(W: torch.Tensor) -> np.ndarray:
    # (heads * hs, C_in) -> (N_HEAD, C_in, hs): head h owns rows h*hs:(h+1)*hs; with fewer (key/value) heads,
    # query head h reads head h // (N_HEAD // heads), as grouped-query attention shares them
    heads = W.shape[0] // HEAD
    per_head = _np(W).T.reshape(-1, heads, HEAD).transpose(1, 0, 2)
    return np.repeat(per_head, N_HEAD // heads, axis=0)


def _head_bias(b: torch.Tensor | None) -> np.ndarray | None:
    return None if b is None else np.repeat(_np(b).reshape(-1, HEAD), N_HEAD // (b.shape[0] // HEAD), axis=0)


def _numpy_dot_product_with_options(
    w: AttentionWeights, x: torch.Tensor, options: dict[str, Any]
) -> tuple[np.ndarray, np.ndarray]:
    # head by head in float64: projections, per-head RMS norm, rotation, causal softmax, values, gate, output
    X = _np(x)  # (B, T, C)
    (Wq, bq), (Wk, bk), (Wv, bv) = w.q_k_v()

    def project(W: torch.Tensor, b: torch.Tensor | None) -> np.ndarray:
        return X @ _np(W).T + (0.0 if b is None else _np(b))

    Q, K, V = project(Wq, bq), project(Wk, bk), project(Wv, bv)
    group = N_HEAD // kv_heads(options)
    T = X.shape[1]
    distance = np.arange(T)[:, None] - np.arange(T)[None, :]  # query i - key j
    hidden = distance < 0  # the future
    if options.get("sliding_window") is not None:
        hidden |= distance >= options["sliding_window"]
    # ALiBi's slopes for a power-of-two head count, written out: 2^(-8 (h + 1) / n)
    slopes = [2.0 ** (-8.0 * (h + 1) / N_HEAD) for h in range(N_HEAD)]
    heads, probs = [], []
    for h in range(N_HEAD):
        g = h // group  # the key/value head this query head reads
        q = Q[..., h * HEAD : (h + 1) * HEAD]
        k, v = K[..., g * HEAD : (g + 1) * HEAD], V[..., g * HEAD : (g + 1) * HEAD]
        if options.get("qk_norm"):
            q = numpy_rms_norm(q, _np(w.extra["q_norm.weight"]))
            k = numpy_rms_norm(k, _np(w.extra["k_norm.weight"]))
        if "rope_base" in options:
            q, k = numpy_rope(q, options["rope_base"]), numpy_rope(k, options["rope_base"])
        scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(HEAD)
        if options.get("alibi"):
            scores = scores - slopes[h] * distance
        scores = np.where(hidden, -np.inf, scores)
        if options.get("attn_sink"):  # one more column: the sink logit, whose value is zero
            sink = np.full((*scores.shape[:-1], 1), _np(w.extra["sink"])[h])
            p = numpy_softmax(np.concatenate([scores, sink], axis=-1), axis=-1)[..., :T]
        else:
            p = numpy_softmax(scores, axis=-1)
        heads.append(p @ v)
        probs.append(p)
    concat = np.concatenate(heads, axis=-1)  # (B, T, C)
    if options.get("attn_gate"):
        gate = X @ _np(w.extra["gate.weight"]).T + (
            _np(w.extra["gate.bias"]) if "gate.bias" in w.extra else 0.0
        )
        concat = concat / (1.0 + np.exp(-gate))
    out = concat @ _np(w.out_weight).T + (0.0 if w.out_bias is None else _np(w.out_bias))
    return out, np.stack(probs, axis=1)


def numpy_oracle(
    scoring: str, w: AttentionWeights, x: torch.Tensor, options: dict[str, Any] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The NumPy reference of a score function (and of the options that change q, k or the output), from
    canonical weights: (output, probabilities)."""
    if scoring == "dot_product" and set(options or {}) - {"n_kv_head"}:
        out, probs = _numpy_dot_product_with_options(w, x, options)
        return torch.from_numpy(out).float(), torch.from_numpy(probs).float()
    (Wq, bq), (Wk, bk), (Wv, bv) = w.q_k_v()
    common = dict(b_q=_head_bias(bq), b_k=_head_bias(bk), b_v=_head_bias(bv), b_o=_np(w.out_bias))
    args = (_np(x), _heads(Wq), _heads(Wk), _heads(Wv))
    if scoring == "dot_product":
        out, probs = numpy_multihead_attention(*args, _np(w.out_weight).T, causal=True, **common)
    elif scoring == "additive":
        out, probs = numpy_additive_multihead_attention(
            *args, _np(w.extra["v"]), _np(w.out_weight).T, **common
        )
    else:
        pytest.fail(
            f"no NumPy oracle for scoring={scoring!r}: add one to tests/unit/attention/numpy_reference.py"
        )
    return torch.from_numpy(out).float(), torch.from_numpy(probs).float()


# ---------------------------------------------------------------------------------------------------------
# the checks
# ---------------------------------------------------------------------------------------------------------


def check_shape_and_out_proj(name: str, options: dict[str, Any]) -> None:
    module = make(name, options)
    assert module(torch.randn(3, 5, D_MODEL)).shape == (3, 5, D_MODEL)
    assert isinstance(module.out_proj, torch.nn.Linear)
    assert module.out_proj.in_features == module.out_proj.out_features == D_MODEL


def check_weights_round_trip(name: str, options: dict[str, Any]) -> None:
    for bias in (True, False):
        module = make(name, options, bias=bias)
        w = random_weights(module)
        assert (w.qkv_bias is None) == (w.out_bias is None) == (not bias)
        kv_dim = kv_heads(options) * HEAD
        assert w.qkv_weight.shape == (D_MODEL + 2 * kv_dim, D_MODEL) and w.out_weight.shape == (
            D_MODEL,
            D_MODEL,
        )
        module.set_weights(w)
        back = module.get_weights()
        for got, want in ((back.qkv_weight, w.qkv_weight), (back.out_weight, w.out_weight)):
            assert_close(got, want, atol=0, rtol=0)
        if bias:
            assert_close(back.qkv_bias, w.qkv_bias, atol=0, rtol=0)
            assert_close(back.out_bias, w.out_bias, atol=0, rtol=0)
        assert back.extra.keys() == w.extra.keys()
        for key in w.extra:
            assert_close(back.extra[key], w.extra[key], atol=0, rtol=0)


def check_numpy_oracle_parity(name: str, options: dict[str, Any]) -> None:
    scoring = ATTENTION_REGISTRY[name].scoring
    for bias in (True, False):
        module = make(name, options, bias=bias).eval()
        w = random_weights(module, seed=1)
        module.set_weights(w)
        x = torch.randn(2, 10, D_MODEL, generator=torch.Generator().manual_seed(2))
        expected_out, expected_probs = numpy_oracle(scoring, w, x, options)
        with torch.no_grad():
            assert_close(module(x), expected_out, atol=1e-5, rtol=1e-5)
            if module.returns_probs:
                assert_close(module.attention_probs(x), expected_probs, atol=1e-5, rtol=1e-5)


def check_same_function_as_sdpa(name: str, options: dict[str, Any]) -> None:
    # implementations of the same score function agree with each other given the same canonical weights
    cls, sdpa = ATTENTION_REGISTRY[name], ATTENTION_REGISTRY["sdpa"]
    if cls.scoring != sdpa.scoring or not set(options) <= sdpa.options:
        return
    module, ref = make(name, options).eval(), make("sdpa", options).eval()
    w = random_weights(module, seed=3)
    module.set_weights(w)
    ref.set_weights(w)
    x = torch.randn(2, 9, D_MODEL)
    with torch.no_grad():
        assert_close(module(x), ref(x), atol=1e-5, rtol=1e-5)


def check_causality(name: str, options: dict[str, Any]) -> None:
    torch.manual_seed(0)
    module = make(name, options).eval()
    x = torch.randn(2, 9, D_MODEL)
    with torch.no_grad():
        out = module(x)
        for t in (0, 3, 7):
            changed = x.clone()
            changed[:, t + 1 :] = torch.randn_like(changed[:, t + 1 :])
            out_changed = module(changed)
            assert_close(out_changed[:, : t + 1], out[:, : t + 1], atol=1e-6, rtol=1e-6)
            assert not torch.allclose(out_changed[:, t + 1 :], out[:, t + 1 :])


def check_probs_are_causal_distributions(name: str, options: dict[str, Any]) -> None:
    torch.manual_seed(0)
    module = make(name, options, dropout=0.5).train()  # dropout must not leak into the probabilities
    if not module.returns_probs:
        with pytest.raises(NotImplementedError):
            module.attention_probs(torch.randn(1, 3, D_MODEL))
        return
    with torch.no_grad():
        probs = module.attention_probs(torch.randn(2, 7, D_MODEL))
    assert probs.shape == (2, N_HEAD, 7, 7)
    if options.get("attn_sink"):  # part of each row rests on the sink, which is no token
        assert ((probs.sum(-1) < 1) & (probs.sum(-1) > 0)).all()
    else:
        assert_close(probs.sum(-1), torch.ones(2, N_HEAD, 7))
    allowed = allowed_keys(7, options)
    assert (probs[..., ~allowed] == 0).all()  # never the future, nor (with a window) beyond it
    assert (probs[..., allowed] > 0).all()  # everything allowed stays visible


def check_dropout_only_in_training(name: str, options: dict[str, Any]) -> None:
    torch.manual_seed(0)
    module = make(name, options, dropout=0.5)
    x = torch.randn(2, 8, D_MODEL)
    module.train()
    first, second = module(x), module(x)
    assert not torch.allclose(first, second)
    module.eval()
    with torch.no_grad():
        eval_out = module(x)
        assert_close(module(x), eval_out, atol=0, rtol=0)
    assert not torch.allclose(first, eval_out)


@torch.no_grad()
def _canonical_grads(module: torch.nn.Module) -> AttentionWeights:
    # get_weights is a pure re-layout of the parameters, so applied to the gradients it lays them out canonically
    params = [p for p in module.parameters()]
    for p in params:
        p.data, p.grad = p.grad, p.data
    try:
        g = module.get_weights()
        return AttentionWeights(
            *(None if t is None else t.clone() for t in (g.qkv_weight, g.qkv_bias, g.out_weight, g.out_bias)),
            extra={k: v.clone() for k, v in g.extra.items()},
        )
    finally:
        for p in params:
            p.data, p.grad = p.grad, p.data


def check_gradients_reach_every_parameter(name: str, options: dict[str, Any]) -> None:
    # a key bias adds the same q.b to a whole row of plain dot-product scores, which softmax cancels exactly;
    # normalised or rotated keys no longer shift a row uniformly, and a sink's score does not shift with it
    uniform_shift_breakers = {"qk_norm", "rope_base", "attn_sink"}
    key_bias_cancels = ATTENTION_REGISTRY[name].scoring == "dot_product" and not uniform_shift_breakers & set(
        options
    )
    for bias in (True, False):
        torch.manual_seed(0)
        module = make(name, options, bias=bias)
        x = torch.randn(2, 6, D_MODEL)
        (module(x) * torch.randn(2, 6, D_MODEL)).sum().backward()
        for pname, p in module.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all(), pname
        g = _canonical_grads(module)
        (W_q, b_q), (W_k, b_k), (W_v, b_v) = g.q_k_v()
        parts = {"W_q": W_q, "W_k": W_k, "W_v": W_v, "W_o": g.out_weight, **g.extra}
        if bias:
            parts |= {"b_q": b_q, "b_v": b_v, "b_o": g.out_bias}
            if key_bias_cancels:
                assert b_k.abs().max() < 1e-5
            else:
                parts["b_k"] = b_k
        for part, grad in parts.items():
            assert grad.abs().sum() > 0, part


def check_input_longer_than_context(name: str, options: dict[str, Any]) -> None:
    module = make(name, options).eval()
    x = torch.randn(1, CONTEXT + 6, D_MODEL, generator=torch.Generator().manual_seed(4))
    if not module.any_length:  # sized by its context (a mask buffer): a longer input is refused by name
        with pytest.raises(ValueError, match=rf"T={CONTEXT + 6} tokens but context_length={CONTEXT}"):
            module(x)
        if module.returns_probs:
            with pytest.raises(ValueError, match=rf"context_length={CONTEXT}"):
                module.attention_probs(x)
        return
    # length extrapolation: past the context it was built for, still the same function (RoPE tables grow)
    w = random_weights(module, seed=5)
    module.set_weights(w)
    expected_out, expected_probs = numpy_oracle(module.scoring, w, x, options)
    with torch.no_grad():
        assert_close(module(x), expected_out, atol=1e-5, rtol=1e-5)
        assert_close(module.attention_probs(x), expected_probs, atol=1e-5, rtol=1e-5)


def fast_and_reference(module: torch.nn.Module, x: torch.Tensor, upstream: torch.Tensor) -> list[tuple]:
    results = []
    for path in (module.forward, module.reference_forward):
        module.zero_grad()
        x.grad = None
        out = path(x)
        (out * upstream).sum().backward()
        grads = {n: p.grad.clone() for n, p in module.named_parameters()}
        results.append((out.detach(), x.grad.clone(), grads))
    return results


def cpu_kernels(name: str, options: dict[str, Any]) -> list[Any]:
    """What ``kernel=`` can ask for to train these options on a CPU: the automatic choice, then every kernel that
    supports them (FlexAttention has no CPU backward), the chunked one in chunks of 3 of the 10 queries (chunks whose
    keys start at 0, whole ones sharing a window's mask, a ragged last one)."""
    if "kernel" not in ATTENTION_REGISTRY[name].options:
        return [None]
    features = make(name, options).features
    kernels = [
        ChunkedKernel(queries=3) if k is ChunkedKernel else k()
        for k in KERNELS.values()
        if k is not FlexKernel
    ]
    return [None, *(k for k in kernels if features <= k.supports)]


def check_fast_path_matches_reference(name: str, options: dict[str, Any]) -> None:
    # the fused training path and the explicit one whose probabilities are plotted: forward and backward, with
    # every kernel that can run these options
    x = torch.randn(2, 10, D_MODEL, generator=torch.Generator().manual_seed(7), requires_grad=True)
    upstream = torch.randn(2, 10, D_MODEL, generator=torch.Generator().manual_seed(8))
    w = random_weights(make(name, options), seed=6)
    for kernel in cpu_kernels(name, options):
        chosen = {} if kernel is None else {"kernel": kernel}
        module = make(name, options | chosen).train()  # dropout 0: training changes nothing but the kernel
        module.set_weights(w)
        if (
            kernel is not None
        ):  # the kernel asked for is the one that runs (causal: the module's own SDPA call)
            assert module.kernel is (None if kernel.name == "causal" else kernel)
        (fast, fast_dx, fast_grads), (ref, ref_dx, ref_grads) = fast_and_reference(module, x, upstream)
        assert_close(fast, ref, atol=1e-5, rtol=1e-5, msg=f"kernel {kernel}")
        assert_close(fast_dx, ref_dx, atol=1e-5, rtol=1e-5, msg=f"kernel {kernel}")
        for pname, ref_grad in ref_grads.items():
            # 1e-5 of the gradient's scale: a key bias's gradient is zero in exact arithmetic (softmax cancels
            # it) and float32 rounding of sums over ~30-sized terms leaves about 1e-5 there, in either path
            scale = max(1.0, ref_grad.abs().max().item())
            assert_close(
                fast_grads[pname], ref_grad, atol=1e-5 * scale, rtol=1e-5, msg=f"{pname}, kernel {kernel}"
            )
    if "kernel" in ATTENTION_REGISTRY[name].options and make(name, options).features & {
        "alibi",
        "window",
        "sink",
    }:
        # FlexAttention (score_mod / block_mask): forward only on a CPU, whose FlexAttention has no backward;
        # tests/integration/test_gpu_paths.py checks its gradients on a GPU
        import gptmini.attention.kernels.flex as flex_module

        module = make(name, options | {"kernel": "flex"}).eval()
        module.set_weights(w)
        with (
            torch.no_grad(),
            warnings.catch_warnings(),  # eager FlexAttention says it is unfused: here it is a reference
            mock.patch.object(flex_module, "flex_attend", wraps=flex_module.flex_attend) as flex,
        ):
            warnings.simplefilter("ignore")
            assert_close(module(x), module.reference_forward(x), atol=1e-5, rtol=1e-5)
        assert isinstance(module.kernel_for(torch.device("cpu")), FlexKernel)
        assert flex.call_count == 1


def check_heads_must_divide_width(name: str, options: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"d_model=30 must be divisible by n_head=4"):
        build_attention(name, 30, 4, CONTEXT)
    with pytest.raises(ValueError, match=r"d_model=30 must be divisible by n_head=4"):
        ATTENTION_REGISTRY[name](30, 4, CONTEXT, **options)


def check_kv_cache(name: str, options: dict[str, Any]) -> None:
    module = make(name, options).eval()
    if not module.supports_kv_cache:
        with pytest.raises(ValueError, match="does not support a KV cache"):
            module(torch.randn(1, 2, D_MODEL), kv_cache=KVCache(1, kv_heads(options), CONTEXT, HEAD))
        return
    torch.manual_seed(0)
    for chunks in ([1] * 10, [4, 1, 1, 1, 1, 1, 1], [4, 6], [10]):  # token by token, prefill, two chunks, one
        x = torch.randn(2, sum(chunks), D_MODEL)
        cache = KVCache(2, kv_heads(options), CONTEXT, HEAD)
        outputs, start = [], 0
        with torch.no_grad():
            full = module(x)
            for n in chunks:
                outputs.append(module(x[:, start : start + n], kv_cache=cache))
                start += n
        assert cache.pos == x.shape[1]
        assert_close(torch.cat(outputs, dim=1), full, atol=1e-5, rtol=1e-5)
    cache = KVCache(1, kv_heads(options), CONTEXT, HEAD)
    with torch.no_grad():
        module(torch.randn(1, CONTEXT, D_MODEL), kv_cache=cache)
        with pytest.raises(ValueError, match=r"exceed"):
            module(torch.randn(1, 1, D_MODEL), kv_cache=cache)


def tiny_gpt(name: str, options: dict[str, Any], seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    config = GPTConfig(
        vocab_size=61, block_size=16, n_layer=2, n_head=4, n_embd=16, attention=name, **gpt_settings(options)
    )
    model = GPT(config).eval()
    with torch.no_grad():  # non-zero biases everywhere, so a bias mapped to the wrong place shows
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def check_selectable_in_the_gpt(name: str, options: dict[str, Any]) -> None:
    model = tiny_gpt(name, options)
    assert model.config.attention == name
    assert all(isinstance(block.attn, ATTENTION_REGISTRY[name]) for block in model.blocks)
    idx = torch.randint(0, 61, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits, _ = model(idx)
        changed = idx.clone()
        changed[:, 6:] = (changed[:, 6:] + 1) % 61
        assert_close(model(changed)[0][:, :6], logits[:, :6], atol=1e-5, rtol=1e-5)  # causal end to end
        if model.blocks[0].attn.returns_probs:
            maps = model.attention_maps(idx)
            assert maps.shape == (2, 2, 4, 12, 12)
            if not options.get("attn_sink"):
                assert_close(maps.sum(-1), torch.ones(2, 2, 4, 12))
    cached = model.generate(idx[:, :4], 8, temperature=0.0, use_cache=True)
    uncached = model.generate(idx[:, :4], 8, temperature=0.0, use_cache=False)
    assert model.supports_kv_cache == ATTENTION_REGISTRY[name].supports_kv_cache
    assert torch.equal(cached, uncached)


def check_gpt2_weights_exchange(name: str, options: dict[str, Any]) -> None:
    import tempfile

    from gptmini.hf import HFWeightsError, load_hf_model, save_hf_gpt2

    model = tiny_gpt(name, options, seed=1)
    with tempfile.TemporaryDirectory() as tmp:
        if not ATTENTION_REGISTRY[name].gpt2_compatible:
            with pytest.raises(HFWeightsError, match=rf"model.attention='{name}'"):
                save_hf_gpt2(model, tmp + "/out")
            return
        if options:  # GPT-2 is plain multi-head attention with learned positions
            with pytest.raises(
                HFWeightsError,
                match=r"GPT-2 weights with model\.(position|n_kv_head|sliding_window|qk_norm|attn_gate|attn_sink)",
            ):
                save_hf_gpt2(model, tmp + "/out")
            return
        save_hf_gpt2(model, tmp + "/out")
        back = load_hf_model(
            tmp + "/out", attention="sdpa"
        )  # through GPT-2's layout into another implementation
        idx = torch.randint(0, 61, (2, 10), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            assert_close(back(idx)[0], model(idx)[0], atol=1e-5, rtol=1e-5)
            from transformers import GPT2LMHeadModel

            hf = GPT2LMHeadModel.from_pretrained(tmp + "/out").eval()
            assert_close(hf(idx).logits, model(idx)[0], atol=1e-5, rtol=1e-5)


CHECKS: list[Callable[[str, dict[str, Any]], None]] = [
    check_shape_and_out_proj,
    check_weights_round_trip,
    check_numpy_oracle_parity,
    check_same_function_as_sdpa,
    check_causality,
    check_probs_are_causal_distributions,
    check_dropout_only_in_training,
    check_gradients_reach_every_parameter,
    check_input_longer_than_context,
    check_fast_path_matches_reference,
    check_heads_must_divide_width,
    check_kv_cache,
    check_selectable_in_the_gpt,
    check_gpt2_weights_exchange,
]
