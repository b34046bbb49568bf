"""The speedrun ingredients as model options, each against an independent computation: the ReLU^2 MLP (NumPy),
logit soft-capping (NumPy, through every path that produces logits or losses), zero-initialised output
projections and the untied head; their config-time checks and the Hugging Face exports that refuse them."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gptmini.model import GPT, ConfigError, GPTConfig


def _config(**kw) -> GPTConfig:
    base = {
        "vocab_size": 40,
        "block_size": 16,
        "n_layer": 2,
        "n_head": 2,
        "n_embd": 32,
        "pad_vocab_multiple": 64,
    }
    return GPTConfig(**{**base, **kw})


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().numpy()


def test_relu2_mlp_is_linear_squared_relu_linear():
    torch.manual_seed(0)
    mlp = GPT(_config(mlp="relu2")).blocks[0].mlp
    x = torch.randn(2, 5, 32)
    hidden = np.maximum(_np(x) @ _np(mlp.c_fc.weight).T + _np(mlp.c_fc.bias), 0.0) ** 2
    expected = hidden @ _np(mlp.c_proj.weight).T + _np(mlp.c_proj.bias)
    torch.testing.assert_close(mlp(x).double(), torch.from_numpy(expected), rtol=1e-5, atol=1e-6)
    assert mlp.c_fc.weight.shape == (4 * 32, 32)  # 4 * n_embd wide by default, as GELU's


def _reference_logits(model: GPT, idx: torch.Tensor, cap: float) -> np.ndarray:
    h = _np(model.hidden_states(idx))
    raw = h @ _np(model.lm_head.weight[: model.config.vocab_size]).T
    return cap * np.tanh(raw / cap)


@pytest.mark.parametrize("vocab_size", [40, 3000])  # 3000: the CPU's chunked-loss vocabulary size
def test_logit_softcap_bounds_logits_and_every_loss_path_uses_it(vocab_size):
    torch.manual_seed(0)
    cap = 2.0  # small, so the cap really bends the logits of a freshly initialised model
    model = GPT(_config(vocab_size=vocab_size, logit_softcap=cap, tie_weights=False))
    with torch.no_grad():
        model.lm_head.weight.mul_(30)  # raw logits far beyond the cap
    idx = torch.randint(0, vocab_size, (2, 16))
    targets = idx.roll(-1, 1)
    expected = _reference_logits(model, idx, cap)
    logits, loss = model(idx, targets)
    torch.testing.assert_close(logits.double(), torch.from_numpy(expected), rtol=1e-5, atol=1e-5)
    assert logits.abs().max() <= cap  # float32 tanh rounds to 1 far out
    # the loss as NumPy computes it from the capped logits
    z = expected - expected.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    token_nll = -np.take_along_axis(logp, _np(targets).astype(np.int64)[..., None], -1)[..., 0]
    torch.testing.assert_close(
        loss.double(), torch.tensor(token_nll.mean(), dtype=torch.float64), rtol=1e-5, atol=1e-5
    )
    _, loss_only = model(idx, targets, return_logits=False)
    torch.testing.assert_close(loss_only, loss)
    torch.testing.assert_close(
        model.token_losses(idx, targets).double(), torch.from_numpy(token_nll), rtol=1e-5, atol=1e-5
    )
    # padded vocabulary columns stay impossible: never sampled
    padded = model.logits(model.hidden_states(idx))
    if model.config.padded_vocab_size > vocab_size:
        assert torch.isneginf(padded[..., vocab_size:]).all()


def test_zero_init_starts_output_projections_and_the_untied_head_at_zero():
    torch.manual_seed(0)
    model = GPT(_config(zero_init=True, tie_weights=False, mlp="relu2"))
    for block in model.blocks:
        assert not block.attn.out_proj.weight.any() and not block.mlp.c_proj.weight.any()
        assert block.attn.qkv.weight.std() > 0 and block.mlp.c_fc.weight.std() > 0
    assert not model.lm_head.weight.any()
    # every block starts as the identity and the head outputs zeros: the first loss is log(vocab) exactly
    idx = torch.randint(0, 40, (2, 16))
    _, loss = model(idx, idx.roll(-1, 1))
    torch.testing.assert_close(loss, torch.tensor(math.log(40)))
    # tied: the head is the token table, which keeps its N(0, 0.02) start
    tied = GPT(_config(zero_init=True))
    assert float(tied.wte.weight.detach().std()) == pytest.approx(0.02, rel=0.1)


def test_untied_head_is_a_separate_trained_matrix():
    model = GPT(_config(tie_weights=False))
    assert model.lm_head.weight is not model.wte.weight
    idx = torch.randint(0, 40, (2, 16))
    _, loss = model(idx, idx.roll(-1, 1))
    loss.backward()
    assert model.lm_head.weight.grad is not None and model.wte.weight.grad is not None
    assert not torch.equal(model.lm_head.weight.grad, model.wte.weight.grad)


def test_ingredients_compose_with_the_zoo_and_train():
    torch.manual_seed(0)
    for extra in (
        {"position": "rope", "qk_norm": True},
        {"n_kv_head": 1, "attn_gate": True},
        {"attention": "mha"},
    ):
        model = GPT(_config(mlp="relu2", zero_init=True, tie_weights=False, logit_softcap=15.0, **extra))
        idx = torch.randint(0, 40, (2, 16))
        _, loss = model(idx, idx.roll(-1, 1))
        loss.backward()
        assert torch.isfinite(loss)


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"logit_softcap": 0.0}, r"model\.logit_softcap=0\.0 is invalid: a positive number"),
        ({"logit_softcap": -3}, r"model\.logit_softcap=-3 is invalid"),
        ({"mlp": "relu3"}, r"model\.mlp='relu3' is invalid: valid values are gelu, swiglu, relu2, none"),
        (
            {"mlp": "relu2", "gelu_approximate": "none"},
            r"model\.gelu_approximate=none has no effect with model\.mlp=relu2",
        ),
    ],
)
def test_bad_ingredient_settings_fail_at_config_time(kw, message):
    with pytest.raises(ConfigError, match=message):
        _config(**kw)


def test_hugging_face_exports_refuse_what_their_checkpoints_cannot_express(tmp_path):
    from gptmini.hf import HFWeightsError
    from gptmini.hf.gpt2 import save_hf_gpt2
    from gptmini.hf.llama import save_hf_llama

    llama = GPTConfig.from_preset("llama_tiny", vocab_size=40)
    capped = GPT(GPTConfig.from_dict({**llama.to_dict(), "logit_softcap": 30.0}))
    with pytest.raises(
        HFWeightsError, match=r"model\.logit_softcap=30\.0 in Llama's format: a Llama checkpoint has no"
    ):
        save_hf_llama(capped, tmp_path / "llama")
    relu2 = GPT(GPTConfig.from_dict({**llama.to_dict(), "mlp": "relu2"}))
    with pytest.raises(HFWeightsError, match=r"model\.mlp=relu2 in Llama's format"):
        save_hf_llama(relu2, tmp_path / "llama")
    with pytest.raises(HFWeightsError, match=r"model\.logit_softcap=30\.0: GPT-2 has no logit soft-capping"):
        save_hf_gpt2(GPT(_config(logit_softcap=30.0)), tmp_path / "gpt2")
    assert not (tmp_path / "llama").exists() and not (tmp_path / "gpt2").exists()
    # zero_init and an untied head are only how training starts and what it trains: Llama holds both
    save_hf_llama(
        GPT(GPTConfig.from_dict({**llama.to_dict(), "zero_init": True, "tie_weights": False})),
        tmp_path / "ok",
    )
    assert (tmp_path / "ok" / "config.json").is_file()
