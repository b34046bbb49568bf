"""The hand-written RMSNorm behind model.qk_norm, against autograd through PyTorch's composite F.rms_norm and
against a NumPy reference; its backward checked by finite differences."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from gptmini.attention.numpy_reference import numpy_rms_norm
from gptmini.attention.qk_norm import head_rms_norm


def _inputs(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    x = (3 * torch.randn(2, 5, 6, 8, generator=gen)).to(dtype).requires_grad_()  # (B, T, heads, hs)
    gain = (1 + 0.5 * torch.randn(6, 8, generator=gen)).to(dtype).requires_grad_()  # a gain per head
    return x, gain


def test_values_and_gradients_match_autograd_through_f_rms_norm():
    x, gain = _inputs()
    upstream = torch.randn(2, 5, 6, 8, generator=torch.Generator().manual_seed(1))
    ours = head_rms_norm(x, gain, 1e-6)
    theirs = F.rms_norm(x, (8,), eps=1e-6) * gain
    assert_close(ours, theirs)
    grads_ours = torch.autograd.grad(ours, (x, gain), upstream)
    grads_theirs = torch.autograd.grad(theirs, (x, gain), upstream)
    for name, a, b in zip(("x", "gain"), grads_ours, grads_theirs, strict=True):
        assert_close(a, b, rtol=1e-5, atol=1e-5, msg=name)


def test_values_match_numpy():
    x, gain = _inputs()
    expected = numpy_rms_norm(x.detach().numpy(), gain.detach().numpy())
    np.testing.assert_allclose(head_rms_norm(x, gain, 1e-6).detach().numpy(), expected, rtol=1e-5, atol=1e-6)


def test_backward_matches_finite_differences():
    x, gain = _inputs(torch.float64)
    assert torch.autograd.gradcheck(lambda a, g: head_rms_norm(a, g, 1e-6), (x, gain))


@pytest.mark.parametrize("needs", ["x", "gain"])
def test_only_the_gradients_asked_for_are_computed(needs: str):
    x, gain = _inputs()
    (x if needs == "gain" else gain).requires_grad_(False)
    out = head_rms_norm(x, gain, 1e-6)
    out.sum().backward()
    assert (x.grad is not None) == (needs == "x")
    assert (gain.grad is not None) == (needs == "gain")
