"""Direct logit attribution and composition scores against NumPy computations from the module's own weights: a
full NumPy forward of a tiny GPT-2 that keeps every component of the residual stream, the final LayerNorm
linearised by hand; and TransformerLens's composition formulas on explicit d_model x d_model matrices."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gptmini.insight.circuits import (
    circuit_problem,
    composition_scores,
    composition_tags,
    direct_logit_attribution,
    token_circuits,
)
from gptmini.model import GPT, GPTConfig


def _model(**options) -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(
        **({"vocab_size": 50, "block_size": 16, "n_layer": 3, "n_head": 4, "n_embd": 32} | options)
    )
    model = GPT(config).eval().requires_grad_(False)
    with torch.no_grad():  # norm gains and biases away from their start, so that their folding counts; heads
        for name, p in model.named_parameters():  # that write enough to matter
            if name.endswith(("out_proj.weight", "qkv.weight")):
                p.mul_(15.0)
            elif name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
    return model


def _total(got) -> torch.Tensor:
    """Every component of an attribution summed: (B, T - 1)."""
    return got.embed + got.heads.sum((0, 1)) + got.out_bias.sum(0) + got.mlp.sum(0)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().numpy()


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * weight + bias


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def _numpy_components(model: GPT, ids: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Every component a GPT-2 block writes, (n_components, B, T, C) by name, from a NumPy forward; and the final
    residual stream (B, T, C)."""
    c = model.config
    nh, hs, C = c.n_head, c.head_size, c.n_embd
    b, t = ids.shape
    x = _np(model.wte.weight)[ids] + _np(model.wpe.weight)[:t]
    parts = {"embed": x[None]}
    heads, out_bias, mlps = [], [], []
    mask = np.tril(np.ones((t, t), dtype=bool))
    for block in model.blocks:
        h = _layer_norm(x, _np(block.ln_1.weight), _np(block.ln_1.bias), block.ln_1.eps)
        qkv = h @ _np(block.attn.qkv.weight).T + _np(block.attn.qkv.bias)  # (B, T, 3C)
        q, k, v = (
            qkv[..., i * C : (i + 1) * C].reshape(b, t, nh, hs).transpose(0, 2, 1, 3) for i in range(3)
        )
        s = np.where(mask, q @ k.transpose(0, 1, 3, 2) / np.sqrt(hs), -np.inf)  # (B, nh, T, T)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        z = p @ v  # (B, nh, T, hs)
        w_o = _np(block.attn.out_proj.weight)  # (C, C): head n reads columns n*hs:(n+1)*hs
        layer_heads = np.stack(
            [z[:, n] @ w_o[:, n * hs : (n + 1) * hs].T for n in range(nh)]
        )  # (nh, B, T, C)
        bias = np.broadcast_to(_np(block.attn.out_proj.bias), (b, t, C))
        x = x + layer_heads.sum(0) + bias
        h2 = _layer_norm(x, _np(block.ln_2.weight), _np(block.ln_2.bias), block.ln_2.eps)
        m = _gelu_tanh(h2 @ _np(block.mlp.c_fc.weight).T + _np(block.mlp.c_fc.bias))
        m = m @ _np(block.mlp.c_proj.weight).T + _np(block.mlp.c_proj.bias)
        x = x + m
        heads.append(layer_heads)
        out_bias.append(bias)
        mlps.append(m)
    parts |= {"heads": np.stack(heads), "out_bias": np.stack(out_bias), "mlp": np.stack(mlps)}
    return parts, x


def test_each_component_is_its_write_through_the_frozen_final_norm_and_they_sum_to_the_logit() -> None:
    model = _model()
    ids = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(1))
    got = direct_logit_attribution(model, ids)
    parts, final = _numpy_components(model, ids.numpy())
    targets = ids.numpy()[:, 1:]  # (B, T - 1)
    # TransformerLens's linearisation: the scale from the whole final residual, each component centred and
    # divided by it, then the gain and the unembedding row of the next token
    centred = final - final.mean(-1, keepdims=True)
    scale = np.sqrt((centred**2).mean(-1) + model.ln_f.eps)[:, :-1]  # (B, T - 1)
    u = _np(model.lm_head.weight)[targets]  # (B, T - 1, C)
    gain, beta = _np(model.ln_f.weight), _np(model.ln_f.bias)

    def attribution(part: np.ndarray) -> np.ndarray:  # (..., B, T, C) -> (..., B, T - 1)
        p = part[..., :-1, :]
        return ((p - p.mean(-1, keepdims=True)) / scale[..., None] * gain * u).sum(-1)

    expected = {name: attribution(part) for name, part in parts.items()}
    for name in ("heads", "out_bias", "mlp"):
        torch.testing.assert_close(
            getattr(got, name).double(), torch.from_numpy(expected[name]), atol=1e-6, rtol=1e-4
        )
    torch.testing.assert_close(
        got.embed.double(), torch.from_numpy(expected["embed"][0]), atol=1e-5, rtol=1e-4
    )
    # the identity: embed + sum of heads + sum of out biases + sum of MLPs = logit_t - ln_f.bias . U_t
    total = sum(e.reshape(-1, *targets.shape).sum(0) for e in expected.values())
    logits, _ = model(ids)
    logit = logits[:, :-1].gather(-1, ids[:, 1:, None])[..., 0].double()
    torch.testing.assert_close(torch.from_numpy(total + (beta * u).sum(-1)), logit, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(_total(got) + got.norm_bias, logit.float(), atol=1e-5, rtol=1e-5)
    # the heads write far more than the tolerance, each its own amount
    assert got.heads.abs().mean() > 0.01 and got.heads.mean((2, 3)).std() > 0.001


@pytest.mark.parametrize(
    "options",
    [
        {"norm": "rmsnorm", "mlp": "swiglu", "position": "rope", "n_kv_head": 2, "bias": False},
        {"mlp": "none", "attn_sink": True, "logit_softcap": 5.0},
    ],
    ids=["llama_gqa", "attention_only_sink_softcap"],
)
def test_the_components_sum_to_the_logit_for_other_blocks(options: dict) -> None:
    model = _model(**options)
    ids = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(2))
    got = direct_logit_attribution(model, ids)
    h = model.hidden_states(ids)  # (B, T, C): after the final norm, before any soft cap
    logit = (h[:, :-1] * model.lm_head.weight[ids[:, 1:]]).sum(-1)
    torch.testing.assert_close(_total(got) + got.norm_bias, logit, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.logit, logit, atol=1e-5, rtol=1e-5)


def test_a_gated_head_has_no_attribution() -> None:
    model = _model(attn_gate=True)
    assert "attn_gate" in circuit_problem(model)
    with pytest.raises(ValueError, match="attn_gate"):
        direct_logit_attribution(model, torch.zeros(1, 4, dtype=torch.long))


@pytest.mark.parametrize(
    "options", [{}, {"norm": "rmsnorm", "n_kv_head": 2}], ids=["layernorm", "rmsnorm_gqa"]
)
def test_composition_scores_are_transformerlens_formulas_on_full_matrices(options: dict) -> None:
    model = _model(**options)
    c = model.config
    nh, hs, C = c.n_head, c.head_size, c.n_embd
    ov, qk = {}, {}
    for layer, block in enumerate(model.blocks):
        w = _np(block.attn.qkv.weight)
        kv = c.kv_heads * hs
        w_q, w_k, w_v = w[:C], w[C : C + kv], w[C + kv :]
        gain = _np(block.ln_1.weight)[:, None]
        w_o = _np(block.attn.out_proj.weight)
        for n in range(nh):
            g = n // (nh // c.kv_heads)
            wq = gain * w_q[n * hs : (n + 1) * hs].T  # (C, hs): TransformerLens's W_Q, the gain folded in
            wk = gain * w_k[g * hs : (g + 1) * hs].T
            wv = gain * w_v[g * hs : (g + 1) * hs].T
            wo = w_o[:, n * hs : (n + 1) * hs].T  # (hs, C)
            if c.norm == "layernorm":
                wo = wo - wo.mean(-1, keepdims=True)  # centred writing weights
            ov[layer, n], qk[layer, n] = wv @ wo, wq @ wk.T  # (C, C) each

    def comp(a: np.ndarray, b: np.ndarray) -> float:
        return np.linalg.norm(a @ b) / (np.linalg.norm(a) * np.linalg.norm(b))

    got = composition_scores(model)
    for mode, right in (("Q", lambda k: qk[k]), ("K", lambda k: qk[k].T), ("V", lambda k: ov[k])):
        expected = np.zeros((c.n_layer, nh, c.n_layer, nh))
        for l1, h1, l2, h2 in np.ndindex(*expected.shape):
            if l1 < l2:
                expected[l1, h1, l2, h2] = comp(ov[l1, h1], right((l2, h2)))
        torch.testing.assert_close(got[mode].double(), torch.from_numpy(expected), atol=1e-5, rtol=1e-4)
    # the three kinds differ: K reads QK's other side
    assert not torch.allclose(got["Q"], got["K"])


def test_composition_tags_name_successive_layers() -> None:
    tags = composition_tags(3, 2)
    assert len(tags) == 3 * 2 * 2 * 2
    assert tags[0] == ("composition/Q/l0h0_to_l1h0", (0, 0, 1, 0))
    assert ("composition/K/l1h1_to_l2h0", (1, 1, 2, 0)) in tags


def test_a_head_whose_keys_read_what_an_earlier_head_writes_is_k_composed_with_it() -> None:
    # the induction circuit's wiring by hand: head 0 of layer 0 writes into dims 0-7, head 1 into dims 8-15; head 0
    # of layer 1 reads its keys from dims 0-7, its queries from dims 16-23 and its values from dims 24-31
    model = _model(norm="rmsnorm", mlp="none", n_layer=2, bias=False)
    c = model.config
    hs, C = c.head_size, c.n_embd
    with torch.no_grad():
        for block in model.blocks:
            block.ln_1.weight.fill_(1.0)
            block.attn.qkv.weight.zero_()
            block.attn.out_proj.weight.zero_()
        eye = torch.eye(hs)
        w_o0 = model.blocks[0].attn.out_proj.weight  # (C, C): head n's columns n*hs:(n+1)*hs
        w_o0[0:8, 0:hs] = eye
        w_o0[8:16, hs : 2 * hs] = eye
        model.blocks[0].attn.qkv.weight[2 * C : 2 * C + 2 * hs] = torch.randn(2 * hs, C)  # some values
        qkv1 = model.blocks[1].attn.qkv.weight  # rows [W_q; W_k; W_v], head 0 first in each
        qkv1[0:hs, 16:24] = eye
        qkv1[C : C + hs, 0:8] = eye
        qkv1[2 * C : 2 * C + hs, 24:32] = eye
        model.blocks[1].attn.out_proj.weight[:, 0:hs] = torch.randn(C, hs)
    scores = composition_scores(model)
    k, q, v = scores["K"][0, :, 1, 0], scores["Q"][0, :, 1, 0], scores["V"][0, :, 1, 0]
    assert k[0] > 0.3 and k[1] < 1e-6  # keys read head 0's output, not head 1's
    assert q[0] < 1e-6 and v[0] < 1e-6  # queries and values read neither
    assert (scores["K"][1] == 0).all() and (scores["K"][:, :, 0] == 0).all()  # only earlier -> later layers


def test_qk_and_ov_circuits_are_the_heads_bilinear_forms_on_the_token_embeddings() -> None:
    model = _model(n_kv_head=2)
    c = model.config
    nh, hs, C = c.n_head, c.head_size, c.n_embd
    ids = torch.tensor([3, 7, 11, 42])
    qk, ov = token_circuits(model, ids)
    assert qk.shape == ov.shape == (c.n_layer, nh, 4, 4)
    e, u = _np(model.wte.weight)[ids.numpy()], _np(model.lm_head.weight)[ids.numpy()]
    for layer, block in enumerate(model.blocks):
        w = _np(block.attn.qkv.weight)
        kv = c.kv_heads * hs
        x = e * _np(block.ln_1.weight)  # the token embeddings through the norm's gain
        w_o = _np(block.attn.out_proj.weight)
        for n in range(nh):
            g = n // (nh // c.kv_heads)
            q = x @ w[n * hs : (n + 1) * hs].T
            k = x @ w[C + g * hs : C + (g + 1) * hs].T
            v = x @ w[C + kv + g * hs : C + kv + (g + 1) * hs].T
            expected_qk = q @ k.T / np.sqrt(hs)
            expected_ov = v @ w_o[:, n * hs : (n + 1) * hs].T @ u.T  # (query token's write) . U
            torch.testing.assert_close(
                qk[layer, n].double(), torch.from_numpy(expected_qk), atol=1e-6, rtol=1e-4
            )
            torch.testing.assert_close(
                ov[layer, n].double(), torch.from_numpy(expected_ov), atol=1e-6, rtol=1e-4
            )


def test_a_head_that_writes_nothing_composes_with_none() -> None:
    model = _model(zero_init=True)  # every output projection starts at zero
    scores = composition_scores(model)
    for mode in ("Q", "K", "V"):
        assert torch.isfinite(scores[mode]).all() and (scores[mode] == 0).all()


def _attentions() -> list[str]:
    from gptmini.attention import available_attention

    return available_attention()


@pytest.mark.parametrize("attention", _attentions())
def test_every_attention_of_the_registry_decomposes_into_its_heads(attention: str) -> None:
    # each mechanism's heads, read through the shared weight layout, add up to the model's own logits
    model = _model(attention=attention, n_layer=2, n_head=2, n_embd=16)
    assert circuit_problem(model) is None
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(3))
    got = direct_logit_attribution(model, ids)
    logits, _ = model(ids)
    logit = logits[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]
    torch.testing.assert_close(_total(got) + got.norm_bias, logit, atol=1e-5, rtol=1e-5)
    assert all(torch.isfinite(s).all() for s in composition_scores(model).values())


def test_a_bfloat16_model_is_attributed_in_its_own_dtype() -> None:
    # a run with trainer.precision=bf16-true holds its weights in bfloat16
    model = _model().to(torch.bfloat16)
    ids = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(4))
    got = direct_logit_attribution(model, ids)
    assert got.heads.dtype == torch.float32
    logits, _ = model(ids)
    logit = logits[:, :-1].gather(-1, ids[:, 1:, None])[..., 0].float()
    torch.testing.assert_close(_total(got) + got.norm_bias, logit, atol=0.05, rtol=0.02)
