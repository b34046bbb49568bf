"""The chunked cross entropy from hidden states against logits then F.cross_entropy: values, gradients of the
hidden states and the weight, ignored targets, ragged chunks, no-grad use; and the model's loss paths
(``model.loss``) against its plain one."""

from __future__ import annotations

import re
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from gptmini import lm_loss
from gptmini.lm_loss import MIN_VOCAB, linear_cross_entropy, token_losses
from gptmini.model import GPT, ConfigError, GPTConfig


def _problem(N: int = 37, C: int = 16, V: int = 101, ignored: int = 5):
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(N, C, generator=gen, requires_grad=True)
    w = (0.5 * torch.randn(V, C, generator=gen)).requires_grad_()
    targets = torch.randint(0, V, (N,), generator=gen)
    targets[torch.randperm(N, generator=gen)[:ignored]] = -1
    return h, w, targets


@pytest.mark.parametrize("chunk", [1, 8, 37, 128])  # one row, ragged last chunk, exact, one chunk for all
def test_matches_logits_then_cross_entropy(chunk: int):
    h, w, targets = _problem()
    expected = F.cross_entropy(h @ w.t(), targets, ignore_index=-1)
    got = linear_cross_entropy(h, w, targets, ignore_index=-1, chunk=chunk)
    assert_close(got, expected)
    upstream = torch.tensor(1.7)  # a loss scaled on its way back (e.g. gradient accumulation)
    exp_grads = torch.autograd.grad(expected, (h, w), upstream)
    got_grads = torch.autograd.grad(got, (h, w), upstream)
    for name, a, b in zip(("h", "weight"), got_grads, exp_grads, strict=True):
        assert_close(a, b, msg=name)


def test_ignored_rows_get_no_gradient_and_leave_the_mean():
    h, w, targets = _problem()
    loss = linear_cross_entropy(h, w, targets)
    (dh,) = torch.autograd.grad(loss, (h,))
    ignored = targets == -1
    assert dh[ignored].abs().max() == 0
    assert dh[~ignored].abs().sum(-1).min() > 0
    kept = F.cross_entropy(h[~ignored] @ w.t(), targets[~ignored])
    assert_close(loss, kept)


def test_only_requested_gradients_and_no_grad_mode():
    h, w, targets = _problem()
    expected = F.cross_entropy(h @ w.t(), targets, ignore_index=-1)
    w.requires_grad_(False)
    loss = linear_cross_entropy(h, w, targets)
    loss.backward()
    assert h.grad is not None and w.grad is None
    with torch.no_grad():
        assert_close(linear_cross_entropy(h, w, targets), expected.detach())


def test_bad_shapes_are_refused():
    h, w, targets = _problem()
    with pytest.raises(ValueError, match=r"expected h \(N, C\) and targets \(N,\)"):
        linear_cross_entropy(h[None], w, targets)


def _loss_and_grads(loss: str, vocab: int, bf16: bool = False, **model: object) -> tuple[torch.Tensor, dict]:
    """The mean loss of ``GPT.forward(..., return_logits=False)`` with ``model.loss=loss`` (the same weights for
    every path: one seed) and every parameter's gradient, on targets with ignored (-1) positions."""
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=vocab,
        block_size=16,
        n_layer=2,
        n_head=2,
        n_embd=32,
        pad_vocab_multiple=64,
        loss=loss,
        **model,
    )
    net = GPT(config)
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(0, vocab, (3, 16), generator=gen)
    y = torch.randint(0, vocab, (3, 16), generator=gen)
    y[0, :4] = -1
    y[2, 9] = -1
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits, value = net(x, y, return_logits=False)
    assert logits is None
    value.backward()
    return value.detach(), {n: p.grad for n, p in net.named_parameters()}


# every path that runs on a CPU against plain (the logits, then F.cross_entropy): padded vocabulary, tied weights
# (the loss reads only the real rows of the shared matrix), ignored targets; liger on a CPU tensor is its fallback
# for a GPU-trained model evaluated there
@pytest.mark.parametrize(
    ("loss", "model"),
    [("chunked", {}), ("liger", {}), ("liger", {"logit_softcap": 15.0}), ("auto", {})],
)
def test_each_loss_path_matches_the_plain_loss_and_gradients(loss: str, model: dict) -> None:
    vocab = MIN_VOCAB + 53
    plain, plain_grads = _loss_and_grads("plain", vocab, **model)
    got, grads = _loss_and_grads(loss, vocab, **model)
    assert_close(got, plain)
    assert grads.keys() == plain_grads.keys()
    for name, grad in plain_grads.items():
        assert_close(grads[name], grad, atol=1e-6, rtol=1e-5, msg=name)


def test_the_chunked_path_under_bf16_autocast_matches_plain_to_bf16s_precision() -> None:
    # bf16-mixed precision: both paths multiply in bf16 and do the softmax in float32; their roundings differ
    vocab = MIN_VOCAB + 53
    plain, plain_grads = _loss_and_grads("plain", vocab, bf16=True)
    got, grads = _loss_and_grads("chunked", vocab, bf16=True)
    assert_close(got, plain, atol=2e-2, rtol=1e-2)
    for name, grad in plain_grads.items():
        assert grads[name].dtype == torch.float32, name
        # to 3 % of the parameter's largest gradient: a fixed tolerance would pass the norms' small ones if zero
        assert_close(grads[name], grad, atol=0.03 * grad.abs().max().item(), rtol=0.0, msg=name)
    fp32, _ = _loss_and_grads("chunked", vocab)
    assert got != fp32  # bf16 really ran


@pytest.mark.parametrize(
    ("loss", "vocab", "cuda", "model", "chunked"),
    [
        ("auto", MIN_VOCAB, False, {}, True),  # a CPU machine, a large vocabulary
        ("auto", MIN_VOCAB - 1, False, {}, False),  # small logits: one fused cross entropy is as fast
        ("auto", MIN_VOCAB, False, {"logit_softcap": 15.0}, False),  # the chunks compute uncapped logits
        ("auto", MIN_VOCAB, True, {}, False),  # a CUDA machine: plain until the GPU round measures the others
        ("chunked", 97, True, {}, True),  # named: anywhere, any vocabulary
        ("plain", MIN_VOCAB, False, {}, False),
    ],
)
def test_the_loss_path_is_chosen_once_when_the_model_is_built(loss, vocab, cuda, model, chunked) -> None:
    with (
        mock.patch.object(torch.cuda, "is_available", return_value=cuda),
        mock.patch.object(lm_loss, "linear_cross_entropy", wraps=lm_loss.linear_cross_entropy) as spy,
    ):
        net = GPT(
            GPTConfig(vocab_size=vocab, block_size=8, n_layer=1, n_head=2, n_embd=16, loss=loss, **model)
        )
        # the memory bound of a training step (gptmini.limits) counts the same path
        path = lm_loss.resolve_loss(loss, vocab, model.get("logit_softcap"))
    assert path == ("chunked" if chunked else "plain")
    x = torch.randint(0, vocab, (2, 8))
    with torch.no_grad():
        net(x, x, return_logits=False)
        net(x, x)  # logits asked for: always the plain path
    assert spy.call_count == chunked


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"loss": "fused"}, "model.loss='fused' is invalid: valid values are auto, plain, chunked, liger"),
        ({"loss": "chunked", "logit_softcap": 30.0}, "model.loss=chunked computes plain logits"),
        ({"fused_ops": "triton"}, "model.fused_ops='triton' is invalid: valid values are none, liger"),
    ],
)
def test_bad_loss_and_fused_ops_settings_are_refused(setting: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        GPTConfig(vocab_size=97, block_size=8, n_layer=1, n_head=2, n_embd=16, **setting)


def test_token_losses_match_unreduced_cross_entropy():
    h, w, targets = _problem(ignored=0)
    expected = F.cross_entropy(h @ w.t(), targets, reduction="none")
    assert_close(token_losses(h, w, targets, chunk=8), expected.detach())
    torch.manual_seed(0)
    model = GPT(
        GPTConfig(vocab_size=97, block_size=16, n_layer=1, n_head=2, n_embd=32, pad_vocab_multiple=64)
    )
    x, y = torch.randint(0, 97, (2, 16)), torch.randint(0, 97, (2, 16))
    with torch.no_grad():
        logits, _ = model(x)
    assert_close(model.token_losses(x, y), F.cross_entropy(logits.transpose(1, 2), y, reduction="none"))


def test_autocast_bf16_runs_the_matmuls_in_bf16_like_the_logits_path():
    # bf16-mixed precision: both paths multiply in bf16 and do the softmax in float32; their roundings differ
    # (bf16 products accumulated per chunk vs once), so they agree to bf16's precision, not float32's
    h, w, targets = _problem(N=64, C=32, V=300, ignored=0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = F.cross_entropy(F.linear(h, w).float(), targets)
        got = linear_cross_entropy(h, w, targets, chunk=16)
    assert_close(got, expected, atol=2e-2, rtol=1e-2)
    exp_grads = torch.autograd.grad(expected, (h, w))
    got_grads = torch.autograd.grad(got, (h, w))
    for name, a, b in zip(("h", "weight"), got_grads, exp_grads, strict=True):
        assert a.dtype == torch.float32, name  # gradients in the parameters' dtype
        assert_close(a, b.float(), atol=2e-3, rtol=5e-2, msg=name)
    fp32 = torch.autograd.grad(linear_cross_entropy(h, w, targets, chunk=16), (h,))[0]
    assert (got_grads[0] - fp32).abs().max() > 0  # bf16 really ran: the result is not the float32 one
