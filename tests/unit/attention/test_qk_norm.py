"""The hand-written RMSNorm behind model.qk_norm, against autograd through PyTorch's composite F.rms_norm and
against a NumPy reference; its backward checked by finite differences."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from numpy_reference import numpy_rms_norm
from torch.testing import assert_close

from gptmini.attention.qk_norm import head_rms_norm

COUNTS = (4, 2)  # four query heads, then two key heads


def _inputs(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    x = (3 * torch.randn(2, 5, 6, 8, generator=gen)).to(dtype).requires_grad_()  # (B, T, heads, hs)
    gq, gk = ((1 + 0.5 * torch.randn(8, generator=gen)).to(dtype).requires_grad_() for _ in range(2))
    return x, gq, gk


def _gain(gq: torch.Tensor, gk: torch.Tensor) -> torch.Tensor:
    return torch.cat((gq.expand(COUNTS[0], -1), gk.expand(COUNTS[1], -1)))  # (heads, hs), through autograd


def test_values_and_gradients_match_autograd_through_f_rms_norm():
    x, gq, gk = _inputs()
    upstream = torch.randn(2, 5, 6, 8, generator=torch.Generator().manual_seed(1))
    ours = head_rms_norm(x, (gq, gk), COUNTS, 1e-6)
    theirs = F.rms_norm(x, (8,), eps=1e-6) * _gain(gq, gk)
    assert_close(ours, theirs)
    grads_ours = torch.autograd.grad(ours, (x, gq, gk), upstream)
    grads_theirs = torch.autograd.grad(theirs, (x, gq, gk), upstream)
    for name, a, b in zip(("x", "q gain", "k gain"), grads_ours, grads_theirs, strict=True):
        assert_close(a, b, rtol=1e-5, atol=1e-5, msg=name)


def test_values_match_numpy():
    x, gq, gk = _inputs()
    expected = numpy_rms_norm(x.detach().numpy(), _gain(gq, gk).detach().numpy())
    got = head_rms_norm(x, (gq, gk), COUNTS, 1e-6).detach().numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_backward_matches_finite_differences():
    x, gq, gk = _inputs(torch.float64)
    assert torch.autograd.gradcheck(lambda a, q, k: head_rms_norm(a, (q, k), COUNTS, 1e-6), (x, gq, gk))


@pytest.mark.parametrize("needs", ["x", "gain"])
def test_only_the_gradients_asked_for_are_computed(needs: str):
    x, gq, gk = _inputs()
    for t in (x,) if needs == "gain" else (gq, gk):
        t.requires_grad_(False)
    head_rms_norm(x, (gq, gk), COUNTS, 1e-6).sum().backward()
    assert (x.grad is not None) == (needs == "x")
    assert (gq.grad is not None) == (gk.grad is not None) == (needs == "gain")


def test_gains_must_cover_the_heads():
    x, gq, gk = _inputs()
    with pytest.raises(ValueError, match=r"gains for \[4, 1\] heads do not cover the 6 heads"):
        head_rms_norm(x, (gq, gk), (4, 1), 1e-6)


def test_bf16_inputs_under_autocast_match_float32_to_bf16_precision():
    # bf16-mixed training: x arrives in bf16 (from an autocast matmul), the gains stay float32
    x, gq, gk = _inputs()
    upstream = torch.randn(2, 5, 6, 8, generator=torch.Generator().manual_seed(2))
    xb = x.detach().bfloat16().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = head_rms_norm(xb, (gq, gk), COUNTS, 1e-6)
    dx, dq, dk = torch.autograd.grad(out, (xb, gq, gk), upstream)
    assert dx.dtype == torch.bfloat16 and dq.dtype == dk.dtype == torch.float32
    ref = head_rms_norm(xb.detach().float().requires_grad_(), (gq, gk), COUNTS, 1e-6)
    assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    ref_grads = torch.autograd.grad(ref, (gq, gk), upstream)
    for a, b in zip((dq, dk), ref_grads, strict=True):
        assert_close(a, b, atol=5e-2, rtol=2e-2)
