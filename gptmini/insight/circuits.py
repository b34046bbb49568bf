"""Circuits: what each head writes to the prediction (direct logit attribution) and how heads feed each other
(Q-, K- and V-composition, Elhage et al. 2021), computed as TransformerLens does; the maths is in docs/insight.md.

The composition norms are computed from the (head_size x head_size) Gram matrices of the factors, never forming
a d_model x d_model product.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from gptmini.model import GPT, GPTConfig

COMPOSITIONS = ("Q", "K", "V")


def circuit_problem(model: GPT) -> str | None:
    """Why the per-head decomposition does not hold for ``model`` (a head's output is not ``probs @ values`` through
    its own columns of the output projection), or None when it does."""
    c: GPTConfig = model.config
    if c.attn_gate:
        return "model.attn_gate=true multiplies each head's output by a gate of the input"
    if c.value_embeds:
        return "model.value_embeds adds value embeddings to the heads' values"
    attn = model.blocks[0].attn
    if not attn.returns_probs:
        return f"model.attention={c.attention!r} has no explicit probabilities"
    try:
        attn.get_weights()
    except NotImplementedError:
        return f"model.attention={c.attention!r} does not give its weights in the shared layout"
    return None


def _require_circuits(model: GPT, what: str) -> None:
    if (problem := circuit_problem(model)) is not None:
        raise ValueError(f"{what}: {problem}")


@dataclass(frozen=True)
class Attribution:
    """Each component's direct contribution to the logit of the token that comes next, at every position but the
    last: (..., B, T - 1) each, summing to ``logit - norm_bias``. ``heads`` sums over nothing: one row per head."""

    embed: Tensor  # (B, T - 1): token (and position) embeddings
    heads: Tensor  # (n_layer, n_head, B, T - 1)
    out_bias: Tensor  # (n_layer, B, T - 1): each attention output projection's bias
    mlp: Tensor  # (n_layer, B, T - 1): zero without MLPs
    norm_bias: Tensor  # (B, T - 1): the final norm's bias . U_t (zero without one)
    logit: Tensor  # (B, T - 1): the model's logit of that token, before any soft cap


def _head_weights(
    model: GPT, layer: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None, Tensor | None]:
    """Layer ``layer``'s per-head matrices in TransformerLens's orientation: W_Q, W_K, W_V (nh, C, hs), each key
    and value head repeated for the query heads sharing it, W_O (nh, hs, C); and the value and output biases."""
    c = model.config
    w = model.blocks[layer].attn.get_weights()
    (w_q, _), (w_k, _), (w_v, b_v) = w.q_k_v()
    group = c.n_head // c.kv_heads

    def per_head(m: Tensor, heads: int) -> Tensor:  # (heads * hs, C) -> (n_head, C, hs)
        return m.view(heads, c.head_size, c.n_embd).transpose(1, 2).repeat_interleave(c.n_head // heads, 0)

    w_o = w.out_weight.view(c.n_embd, c.n_head, c.head_size).permute(1, 2, 0)  # (nh, hs, C)
    b_v = None if b_v is None else b_v.view(c.kv_heads, c.head_size).repeat_interleave(group, 0)  # (nh, hs)
    return per_head(w_q, c.n_head), per_head(w_k, c.kv_heads), per_head(w_v, c.kv_heads), w_o, b_v, w.out_bias


@torch.no_grad()
def direct_logit_attribution(model: GPT, ids: Tensor) -> Attribution:
    """The direct logit attribution of ``model`` on ``ids`` (B, T), in float32 (docs/insight.md)."""
    _require_circuits(model, "no per-head attribution")
    c = model.config
    model._check_length(ids.size(1))
    targets = ids[:, 1:]  # (B, T - 1)
    ln_f = model.ln_f
    unembed = model.lm_head.weight[targets].float()  # (B, T - 1, C)
    direction = unembed * ln_f.weight.float()  # (B, T - 1, C): gain, then the token's unembedding row
    layer_norm = c.norm == "layernorm"
    if layer_norm:  # centring is linear: centre the direction instead of each component
        direction = direction - direction.mean(-1, keepdim=True)

    def read(part: Tensor) -> Tensor:  # (..., B, T, C) -> (..., B, T - 1), before dividing by the scale
        return (part[..., :-1, :].float() * direction).sum(-1)

    # (B, T, C), in the weights' dtype (a bf16-true model runs in bfloat16); reads in float32
    x = model._embed(ids)
    dtype = x.dtype
    embed = read(x)
    heads, out_bias, mlp = [], [], []
    b, t = ids.shape
    for layer, block in enumerate(model.blocks):
        h = block.ln_1(x)  # (B, T, C)
        probs = block.attn.attention_probs(h).to(dtype)  # (B, nh, T, T)
        _, _, w_v, w_o, b_v, b_o = _head_weights(model, layer)
        v = torch.einsum("btc,nch->bnth", h, w_v.to(dtype))  # (B, nh, T, hs)
        if b_v is not None:
            v = v + b_v.to(dtype)[None, :, None, :]
        z = probs @ v  # (B, nh, T, hs)
        out = torch.einsum("bnth,nhc->nbtc", z, w_o.to(dtype))  # (nh, B, T, C): each head's write
        bias = torch.zeros(c.n_embd, device=x.device, dtype=dtype) if b_o is None else b_o.to(dtype)
        heads.append(read(out))
        out_bias.append(read(bias.expand(b, t, -1)))
        x = x + out.sum(0) + bias
        m = torch.zeros_like(x) if block.mlp is None else block.mlp(block.ln_2(x))
        mlp.append(read(m))
        x = x + m
    final = x[:, :-1].float()  # (B, T - 1, C)
    if layer_norm:
        final = final - final.mean(-1, keepdim=True)
    scale = (final.pow(2).mean(-1) + ln_f.eps).sqrt()  # (B, T - 1): the frozen norm scale
    norm_bias = (
        torch.zeros_like(scale)
        if getattr(ln_f, "bias", None) is None
        else (unembed * ln_f.bias.float()).sum(-1)
    )
    logit = (ln_f(x[:, :-1]).float() * unembed).sum(-1)  # (B, T - 1): the next token's only, before any cap
    return Attribution(
        embed=embed / scale,
        heads=torch.stack(heads) / scale,
        out_bias=torch.stack(out_bias) / scale,
        mlp=torch.stack(mlp) / scale,
        norm_bias=norm_bias,
        logit=logit,
    )


def _gram(m: Tensor) -> Tensor:  # (..., C, hs) -> (..., hs, hs): m^T m
    return m.transpose(-1, -2) @ m


@torch.no_grad()
def composition_scores(model: GPT) -> dict[str, Tensor]:
    """Q-, K- and V-composition of every head on every head of a later layer: name -> (n_layer, n_head, n_layer,
    n_head), entry ``[l1, h1, l2, h2]`` the score of ``h1`` in ``l1`` on ``h2`` in ``l2``, zero unless l1 < l2."""
    _require_circuits(model, "no composition scores")
    c = model.config
    n = c.n_layer
    qs, ks, vs, os_ = [], [], [], []
    for layer, block in enumerate(model.blocks):
        w_q, w_k, w_v, w_o = (w.float() for w in _head_weights(model, layer)[:4])
        gain = block.ln_1.weight.float()[:, None]  # (C, 1): folded into the reading side
        qs.append(w_q * gain)
        ks.append(w_k * gain)
        vs.append(w_v * gain)
        os_.append(w_o - w_o.mean(-1, keepdim=True) if c.norm == "layernorm" else w_o)
    w_q, w_k, w_v, w_o = (torch.stack(m) for m in (qs, ks, vs, os_))  # (L, nh, C, hs) / (L, nh, hs, C)
    g_q, g_k, g_v = _gram(w_q), _gram(w_k), _gram(w_v)  # (L, nh, hs, hs)
    g_o = w_o @ w_o.transpose(-1, -2)  # (L, nh, hs, hs): W_O W_O^T
    ov_norm = (g_v * g_o).sum((-1, -2)).sqrt()  # (L, nh): ||W_V W_O||_F = sqrt(tr(W_V^T W_V W_O W_O^T))
    qk_norm = (g_q * g_k).sum((-1, -2)).sqrt()  # (L, nh)

    def score(middle_from: Tensor, right: Tensor, right_norm: Tensor) -> Tensor:
        # ||W_V1 M B^T||_F^2 = tr(G_V1 M G_B M^T), M = W_O1 middle_from2 (hs, hs), G_B = right's Gram (hs, hs)
        # (L nh, L nh, hs, hs)
        m = torch.einsum("ahc,bcd->abhd", w_o.flatten(0, 1), middle_from.flatten(0, 1))
        g_left = g_v.flatten(0, 1)[:, None]  # (L nh, 1, hs, hs)
        g_right = right.flatten(0, 1)[None]  # (1, L nh, hs, hs)
        sq = ((g_left @ m @ g_right) * m).sum((-1, -2)).clamp_min(0.0)  # (L nh, L nh)
        norms = ov_norm.flatten()[:, None] * right_norm.flatten()[None, :]
        # a head that writes or reads nothing (zero_init's output projections at the start) composes with none
        score = torch.where(norms > 0, sq.sqrt() / norms.clamp_min(1e-30), torch.zeros_like(sq))
        return score.view(n, c.n_head, n, c.n_head)

    scores = {
        "Q": score(w_q, g_k, qk_norm),  # OV1 QK2 = W_V1 (W_O1 W_Q2) W_K2^T
        "K": score(w_k, g_q, qk_norm),  # OV1 QK2^T = W_V1 (W_O1 W_K2) W_Q2^T
        "V": score(w_v, g_o, ov_norm),  # OV1 OV2 = W_V1 (W_O1 W_V2) W_O2
    }
    later = torch.arange(n)[:, None, None, None] < torch.arange(n)[None, None, :, None]  # (L, 1, L, 1)
    return {k: torch.where(later.to(v.device), v, torch.zeros_like(v)).cpu() for k, v in scores.items()}


def composition_tags(n_layer: int, n_head: int) -> list[tuple[str, tuple[int, int, int, int]]]:
    """The logged composition scalars, between heads of successive layers: (``composition/<Q|K|V>/lAhB_to_lChD``,
    index) for every score."""
    return [
        (f"composition/{mode}/l{l1}h{h1}_to_l{l1 + 1}h{h2}", (l1, h1, l1 + 1, h2))
        for mode in COMPOSITIONS
        for l1 in range(n_layer - 1)
        for h1 in range(n_head)
        for h2 in range(n_head)
    ]


@torch.no_grad()
def token_circuits(model: GPT, ids: Tensor) -> tuple[Tensor, Tensor]:
    """Every head's QK and OV circuits over the tokens ``ids`` (n,), on their embeddings alone (no positions, the
    layer's norm gain folded in, no norm scale), as TransformerLens's ``full_QK`` and ``full_OV``: ``qk[l, h, i, j]``
    the score (scaled by 1/sqrt(head_size)) head h of layer l gives key token j from query token i;
    ``ov[l, h, i, j]`` what attending to token i adds to the logit of token j. (n_layer, n_head, n, n) each, float32
    on the CPU."""
    _require_circuits(model, "no QK and OV circuits")
    c = model.config
    e = model.wte.weight[ids].float()  # (n, C)
    u = model.lm_head.weight[ids].float()  # (n, C)
    qks, ovs = [], []
    for layer, block in enumerate(model.blocks):
        w_q, w_k, w_v, w_o = (w.float() for w in _head_weights(model, layer)[:4])
        x = e * block.ln_1.weight.float()  # (n, C)
        q = torch.einsum("ic,nch->nih", x, w_q)  # (nh, n, hs)
        k = torch.einsum("ic,nch->nih", x, w_k)
        qks.append(q @ k.transpose(1, 2) * c.head_size**-0.5)  # (nh, n, n)
        written = torch.einsum("ic,nch->nih", x, w_v) @ w_o  # (nh, n, C)
        ovs.append(written @ u.T)  # (nh, n, n)
    return torch.stack(qks).cpu(), torch.stack(ovs).cpu()
