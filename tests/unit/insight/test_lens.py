"""GPT.inspect, the logit lens and the sink shares against independent NumPy computations from the module's own
weights: the queries and keys the neuron view shows, recomputed (projection, QK-norm, RoPE) and their softmax
compared with the model's attention probabilities; the lens's last row is the model's own output."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gptmini.insight.lens import Lens, logit_lens, sink_shares
from gptmini.model import GPT, GPTConfig

OPTIONS = {
    "plain": {},
    "rope_qk_norm": {"position": "rope", "qk_norm": True},
    "gqa_sink": {"n_kv_head": 2, "attn_sink": True},
    "alibi_window": {"position": "alibi", "sliding_window": 5},
}


def _model(**options) -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=50, block_size=16, n_layer=2, n_head=4, n_embd=32, **options)
    model = GPT(config).eval().requires_grad_(False)
    with torch.no_grad():  # a sink and norm gains away from their starting values, so that they count
        for name, p in model.named_parameters():
            if name.endswith(("sink", "q_norm.weight", "k_norm.weight")):
                p.copy_(torch.randn_like(p) * 0.5 + (0.0 if name.endswith("sink") else 1.0))
    return model


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * weight + (0.0 if bias is None else bias)


def _rope(x: np.ndarray, base: float) -> np.ndarray:
    # pairs (d, d + hs/2) turned by position * base^(-2d/hs): x (T, hs)
    t, hs = x.shape
    angles = np.arange(t)[:, None] * base ** (-np.arange(0, hs, 2) / hs)[None, :]  # (T, hs/2)
    a, b = x[:, : hs // 2], x[:, hs // 2 :]
    return np.concatenate(
        (a * np.cos(angles) - b * np.sin(angles), b * np.cos(angles) + a * np.sin(angles)), -1
    )


def _numpy_queries_keys(model: GPT, layer: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(nh, T, hs) queries and keys (each query head's) of ``layer`` on its residual input ``x`` (T, C)."""
    c = model.config
    block = model.blocks[layer]
    ln = block.ln_1
    h = _layer_norm(x, ln.weight.numpy(), None if ln.bias is None else ln.bias.numpy(), ln.eps)
    attn = block.attn
    w, b = attn.qkv.weight.detach().numpy(), attn.qkv.bias.detach().numpy()
    kv = c.kv_heads * c.head_size
    q = h @ w[: c.n_embd].T + b[: c.n_embd]
    k = h @ w[c.n_embd : c.n_embd + kv].T + b[c.n_embd : c.n_embd + kv]
    q = q.reshape(-1, c.n_head, c.head_size).transpose(1, 0, 2)  # (nh, T, hs)
    k = k.reshape(-1, c.kv_heads, c.head_size).transpose(1, 0, 2)  # (n_kv, T, hs)
    if c.qk_norm:
        rms = lambda v, g: v / np.sqrt((v**2).mean(-1, keepdims=True) + 1e-6) * g  # noqa: E731
        q, k = rms(q, attn.q_norm.weight.detach().numpy()), rms(k, attn.k_norm.weight.detach().numpy())
    if c.position == "rope":
        q = np.stack([_rope(x, c.rope_base) for x in q])
        k = np.stack([_rope(x, c.rope_base) for x in k])
    return q, np.repeat(k, c.n_head // c.kv_heads, axis=0)


def _numpy_probs(q: np.ndarray, k: np.ndarray, model: GPT, layer: int) -> np.ndarray:
    """softmax(q . k / sqrt(hs) + bias) with the future (and beyond a window) masked, the sink as one more logit:
    (nh, T, T), the real keys' share."""
    c, attn = model.config, model.blocks[layer].attn
    t = q.shape[1]
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(c.head_size)  # (nh, T, T)
    distance = np.arange(t)[:, None] - np.arange(t)[None, :]
    allowed = distance >= 0
    if c.sliding_window is not None:
        allowed &= distance < c.sliding_window
    if c.position == "alibi":
        bias = -attn.alibi_slopes.numpy()[:, None, None] * distance
        scores = scores + bias
        allowed = allowed & (bias >= -80.0)
    scores = np.where(allowed, scores, -np.inf)
    if c.attn_sink:
        sink = np.broadcast_to(attn.sink.detach().numpy()[:, None, None], (c.n_head, t, 1))
        scores = np.concatenate((scores, sink), -1)
    e = np.exp(scores - scores.max(-1, keepdims=True))
    probs = e / e.sum(-1, keepdims=True)
    return probs[..., :t]


@pytest.mark.parametrize("name", list(OPTIONS))
def test_the_queries_and_keys_are_the_models_and_give_its_attention(name: str) -> None:
    model = _model(**OPTIONS[name])
    idx = torch.randint(0, 50, (1, 12), generator=torch.Generator().manual_seed(1))
    got = model.inspect(idx)
    maps = model.attention_maps(idx)  # (L, 1, nh, T, T)
    torch.testing.assert_close(got.maps, maps)
    assert got.residuals.shape == (3, 1, 12, 32) and got.vectors is not None
    for layer, v in enumerate(got.vectors):
        q, k = _numpy_queries_keys(model, layer, got.residuals[layer, 0].numpy())
        torch.testing.assert_close(v.q[0], torch.from_numpy(q).float(), atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(v.k[0], torch.from_numpy(k).float(), atol=1e-5, rtol=1e-4)
        assert v.scale == pytest.approx(model.config.head_size**-0.5)
        # the neuron view's arithmetic on these vectors gives the model's own probabilities
        probs = _numpy_probs(v.q[0].numpy(), v.k[0].numpy(), model, layer)
        torch.testing.assert_close(torch.from_numpy(probs).float(), maps[layer, 0], atol=1e-5, rtol=1e-4)
    # each residual is the block's output on the one before
    with torch.no_grad():
        for layer, block in enumerate(model.blocks):
            torch.testing.assert_close(block(got.residuals[layer]), got.residuals[layer + 1])


def test_the_lens_reads_each_layer_as_the_output_is_read() -> None:
    model = _model()
    idx = torch.randint(0, 50, (2, 10), generator=torch.Generator().manual_seed(2))
    lens = logit_lens(model, model.inspect(idx), idx)
    assert Lens.row_names(2) == ["embed", "layer0", "layer1"]
    assert lens.loss.shape == lens.top1.shape == (3,)
    assert lens.top_ids.shape == lens.top_prob.shape == (3, 2, 10) and lens.target_prob.shape == (3, 2, 9)
    # the last row is the model's own prediction: its loss and probabilities
    with torch.no_grad():
        logits, loss = model(idx[:, :-1], idx[:, 1:])
    assert lens.loss[-1].item() == pytest.approx(loss.item(), rel=1e-5)
    probs = logits.softmax(-1)
    torch.testing.assert_close(lens.target_prob[-1], probs.gather(-1, idx[:, 1:, None])[..., 0])
    # the embeddings' row, in NumPy: (token + position embedding) through the final LayerNorm and the tied head
    wte, wpe = model.wte.weight.detach().numpy(), model.wpe.weight.detach().numpy()
    h = _layer_norm(
        wte[idx.numpy()] + wpe[:10],
        model.ln_f.weight.detach().numpy(),
        model.ln_f.bias.detach().numpy(),
        1e-5,
    )
    z = h @ wte[:50].T  # (B, T, V)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    torch.testing.assert_close(lens.top_prob[0], torch.from_numpy(p.max(-1)).float(), atol=1e-5, rtol=1e-4)
    assert torch.equal(lens.top_ids[0], torch.from_numpy(p.argmax(-1)))
    target = np.take_along_axis(p[:, :-1], idx[:, 1:, None].numpy(), -1)[..., 0]
    want_loss = -np.log(target).mean()
    assert lens.loss[0].item() == pytest.approx(want_loss, rel=1e-4)
    assert lens.top1[0].item() == pytest.approx((p[:, :-1].argmax(-1) == idx[:, 1:].numpy()).mean())


def test_the_sink_shares_are_the_first_tokens_and_what_the_rows_leave_off() -> None:
    maps = torch.zeros(1, 2, 4, 4)
    maps[0, 0] = torch.tensor([[1.0, 0, 0, 0], [0.5, 0.5, 0, 0], [0.2, 0.4, 0.4, 0], [0.8, 0, 0, 0.2]])
    maps[0, 1] = torch.tensor([[0.5, 0, 0, 0], [0.0, 0.5, 0, 0], [0.1, 0.1, 0.2, 0], [0.0, 0, 0, 1.0]])
    first, learned = sink_shares(maps, learned_sink=True)
    # the first query (which sees the first token alone) is left out
    torch.testing.assert_close(first, torch.tensor([[(0.5 + 0.2 + 0.8) / 3, (0.0 + 0.1 + 0.0) / 3]]))
    torch.testing.assert_close(learned, torch.tensor([[0.0, (0.5 + 0.6 + 0.0) / 3]]))
    assert sink_shares(maps, learned_sink=False)[1] is None


def test_a_learned_sinks_share_is_its_softmax_weight() -> None:
    model = _model(attn_sink=True)
    idx = torch.randint(0, 50, (1, 8), generator=torch.Generator().manual_seed(3))
    got = model.inspect(idx)
    _, learned = sink_shares(got.maps[:, 0], True)
    for layer, v in enumerate(got.vectors):
        scores = (v.q[0] @ v.k[0].transpose(-1, -2) * v.scale).masked_fill(
            torch.ones(8, 8, dtype=torch.bool).triu(1), float("-inf")
        )
        sink = v.sink[:, None, None].expand(-1, 8, 1)
        weight = torch.cat((scores, sink), -1).softmax(-1)[..., -1]  # (nh, T)
        torch.testing.assert_close(learned[layer], weight[:, 1:].mean(-1), atol=1e-5, rtol=1e-4)


def test_the_lens_reads_residuals_a_bfloat16_pass_left() -> None:
    import dataclasses

    model = _model()
    idx = torch.randint(0, 50, (1, 10), generator=torch.Generator().manual_seed(4))
    found = model.inspect(idx)
    half = dataclasses.replace(found, residuals=found.residuals.bfloat16())
    got, want = logit_lens(model, half, idx), logit_lens(model, found, idx)
    torch.testing.assert_close(got.loss, want.loss, atol=0.05, rtol=0.02)
    torch.testing.assert_close(got.target_prob, want.target_prob, atol=0.02, rtol=0.05)
