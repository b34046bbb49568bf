"""Mean ablation: against a hand-written attention-only transformer, and equal across implementations that hold
the same weights (fused SDPA, chapter-3 MHA, PyTorch's nn.MultiheadAttention)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from gptmini.insight.ablation import head_outputs, mean_ablation
from gptmini.model import GPT, GPTConfig

V, T, C, H = 30, 12, 8, 2


def _windows(n: int = 3, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, V, (n, T + 1), generator=torch.Generator().manual_seed(seed))


def _scaled(model: GPT) -> GPT:
    """Every matrix 20x its initial size: heads with outputs large enough that ablating one shows in the loss."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(20)
    return model.eval()


@torch.no_grad()
def _oracle_loss(model: GPT, windows: torch.Tensor, ablate: int | None) -> float:
    """The 1-layer attention-only model written out in float64 from its weights; head ``ablate``'s output
    replaced by its mean over every position of every window."""
    d = {k: v.double() for k, v in model.state_dict().items()}
    x_ids, y = windows[:, :-1], windows[:, 1:]
    x = d["wte.weight"][x_ids] + d["wpe.weight"][:T]  # (B, T, C)
    h = F.layer_norm(x, (C,), d["blocks.0.ln_1.weight"], d["blocks.0.ln_1.bias"])
    w = model.blocks[0].attn.get_weights()
    qkv = h @ w.qkv_weight.double().T + w.qkv_bias.double()  # (B, T, 3C)
    q, k, v = (t.reshape(-1, T, H, C // H).transpose(1, 2) for t in qkv.split(C, -1))  # (B, H, T, hs)
    scores = q @ k.transpose(-1, -2) / math.sqrt(C // H)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    z = scores.softmax(-1) @ v  # (B, H, T, hs)
    if ablate is not None:
        z[:, ablate] = z[:, ablate].mean((0, 1))
    out = z.transpose(1, 2).reshape(-1, T, C) @ w.out_weight.double().T + w.out_bias.double()
    x = x + out
    logits = F.layer_norm(x, (C,), d["ln_f.weight"], d["ln_f.bias"]) @ d["wte.weight"][:V].T
    return float(F.cross_entropy(logits.reshape(-1, V), y.reshape(-1)))


def test_mean_ablation_matches_a_hand_written_attention_only_model():
    torch.manual_seed(1)
    model = _scaled(GPT(GPTConfig(vocab_size=V, block_size=T, n_layer=1, n_head=H, n_embd=C, mlp="none")))
    windows = _windows()
    base, delta = mean_ablation(model, windows, batch_size=2)
    assert base == pytest.approx(_oracle_loss(model, windows, None), rel=1e-5)
    expected = torch.tensor(
        [[_oracle_loss(model, windows, h) - _oracle_loss(model, windows, None) for h in range(H)]]
    )
    assert expected.abs().min() > 1e-3  # the check is not vacuous
    assert_close(delta, expected.float(), rtol=1e-3, atol=2e-5)


def test_head_outputs_are_the_probabilities_times_the_values():
    torch.manual_seed(2)
    attn = GPT(GPTConfig(vocab_size=V, block_size=T, n_layer=1, n_head=H, n_embd=C)).blocks[0].attn.eval()
    x = torch.randn(2, T, C)
    w = attn.get_weights()
    v = (x @ w.q_k_v()[2][0].T + w.q_k_v()[2][1]).reshape(2, T, H, C // H).transpose(1, 2)  # (B, H, T, hs)
    expected = (attn.attention_probs(x) @ v).transpose(1, 2).reshape(2, T, C)
    weight_before = attn.out_proj.weight.clone()
    assert_close(head_outputs(attn, x), expected, rtol=1e-5, atol=1e-6)
    assert torch.equal(attn.out_proj.weight, weight_before)  # nothing was changed in place


@pytest.mark.parametrize("other", ["mha", "torch", "einsum"])
def test_ablation_is_the_same_for_every_implementation_given_the_same_weights(other):
    torch.manual_seed(3)
    config = dict(vocab_size=V, block_size=T, n_layer=2, n_head=H, n_embd=C)
    reference = _scaled(GPT(GPTConfig(**config, attention="sdpa")))
    model = GPT(GPTConfig(**config, attention=other)).eval()
    state = {k: v for k, v in reference.state_dict().items() if ".attn." not in k}
    model.load_state_dict(state, strict=False)
    for mine, theirs in zip(model.blocks, reference.blocks, strict=True):
        mine.attn.set_weights(theirs.attn.get_weights())
    windows = _windows(seed=4)
    base_ref, delta_ref = mean_ablation(reference, windows)
    base, delta = mean_ablation(model, windows)
    assert base == pytest.approx(base_ref, rel=1e-5)
    assert delta_ref.abs().max() > 1e-3
    assert_close(delta, delta_ref, rtol=1e-3, atol=2e-5)
