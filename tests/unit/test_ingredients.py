"""The speedrun ingredients as model options, each against an independent computation: the ReLU^2 MLP (NumPy),
logit soft-capping (NumPy, through every path that produces logits or losses), zero-initialised output
projections and the untied head; gated value embeddings, the smear gate and the bigram embedding (hand-written
float64 references, worked examples, causality with every attention variant); their config-time checks and the
Hugging Face exports that refuse them."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.common import preset_config
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

    llama = preset_config("llama_tiny", vocab_size=40)
    capped = GPT(GPTConfig.from_dict({**llama.to_dict(), "logit_softcap": 30.0}))
    with pytest.raises(
        HFWeightsError, match=r"model\.logit_softcap=30\.0 in Llama's format: Llama has no logit soft-capping"
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


# --- value embeddings, smear gate, bigram embedding ----------------------------------------------------------

VARIANTS = sorted(
    p.stem for p in (Path(__file__).resolve().parents[2] / "conf" / "attention_variant").glob("*.yaml")
)
INGREDIENTS = {
    "value_embeds": {"value_embeds": 2},
    "smear_gate": {"smear_gate": True},
    "bigram_exact": {"bigram_embed": True},
    "bigram_hashed": {"bigram_embed": True, "bigram_buckets": 97},
}


def _variant(name: str) -> dict:
    from omegaconf import OmegaConf

    path = Path(__file__).resolve().parents[2] / "conf" / "attention_variant" / f"{name}.yaml"
    return OmegaConf.to_container(OmegaConf.load(path))


def _randomised(model: GPT) -> GPT:
    """The ingredients' parameters away from their zero start, so that each one changes the output."""
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith(("value_embeds.", "smear.", "bigram.")):
                p.normal_(0.0, 0.5)
    return model


def test_value_embeddings_add_a_gated_token_table_to_the_attention_values():
    """The attention of a layer with a value embedding, written out in float64: v = x W_v + 2 sigmoid(h[:32] W_g)
    * table[token] per key/value head (grouped-query heads shared), causal softmax, output projection."""
    torch.manual_seed(0)
    model = _randomised(GPT(_config(n_layer=3, n_head=4, n_kv_head=2, n_embd=64, value_embeds=2)))
    assert model.value_embeds.layers == [2, 0]  # the last layer and every other one back
    idx = torch.randint(0, 40, (2, 9))
    block = model.blocks[2]
    h = torch.randn(2, 9, 64)
    got = block.attn(h, values=model._layer_values(idx)[2](h))
    d = {n: t.detach().double() for n, t in block.attn.named_parameters()}
    table = model.value_embeds.tables[0].weight.detach().double()[idx]  # (B, T, 32): 2 kv heads of 16
    gate_w = model.value_embeds.gates[0].weight.detach().double()  # (2, 32)
    hd = h.double()
    qkv = hd @ d["qkv.weight"].T + d["qkv.bias"]
    q, k, v = qkv.split((64, 32, 32), dim=-1)
    gate = 2 / (1 + torch.exp(-(hd[..., :32] @ gate_w.T)))  # (B, T, 2)
    v = v + table * gate.repeat_interleave(16, dim=-1)
    out = torch.zeros(2, 9, 64, dtype=torch.float64)
    for head in range(4):
        kv = head // 2  # consecutive query heads share a key/value head
        qh, kh, vh = (
            q[..., head * 16 : (head + 1) * 16],
            k[..., kv * 16 : (kv + 1) * 16],
            v[..., kv * 16 : (kv + 1) * 16],
        )
        scores = qh @ kh.transpose(1, 2) / 4.0
        scores = scores.masked_fill(torch.ones(9, 9, dtype=torch.bool).triu(1), float("-inf"))
        out[..., head * 16 : (head + 1) * 16] = scores.softmax(-1) @ vh
    expected = out @ d["out_proj.weight"].T + d["out_proj.bias"]
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)
    # layers without a value embedding get none
    assert model._layer_values(idx)[1] is None


def test_ingredients_at_their_start_leave_the_model_as_it_was_except_the_value_tables():
    """Smear gate and bigram table start at zero: the logits are the plain model's. Value embeddings start active
    (the gate at 1), and with their tables zeroed the logits are the plain model's too."""
    torch.manual_seed(0)
    model = GPT(_config(n_layer=3, value_embeds=2, smear_gate=True, bigram_embed=True))
    plain = GPT(_config(n_layer=3))
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    assert not missing and all(k.startswith(("value_embeds.", "smear.", "bigram.")) for k in unexpected)
    idx = torch.randint(0, 40, (2, 16))
    with torch.no_grad():
        for table in model.value_embeds.tables:
            table.weight.zero_()
    torch.testing.assert_close(model(idx)[0], plain(idx)[0])


def test_smear_gate_mixes_in_the_previous_token_embedding():
    torch.manual_seed(0)
    smear = _randomised(GPT(_config(smear_gate=True))).smear
    x = torch.randn(2, 7, 32)
    w = _np(smear.gate.weight)[0]  # (12,)
    lam = float(smear.scale.detach())
    xn = _np(x)
    expected = xn.copy()
    for t in range(1, 7):
        g = lam / (1 + np.exp(-(xn[:, t, :12] @ w)))  # (B,)
        expected[:, t] = xn[:, t] + g[:, None] * xn[:, t - 1]
    torch.testing.assert_close(smear(x).double(), torch.from_numpy(expected), rtol=1e-5, atol=1e-6)


def test_bigram_rows_exact_and_hashed_worked_examples():
    exact = GPT(_config(vocab_size=5, bigram_embed=True)).bigram
    idx = torch.tensor([[3, 1, 2, 2]])
    # row prev * V + token; the first position reads the reserved last row, 25
    assert exact.table.num_embeddings == 26
    assert exact.pair_rows(idx).tolist() == [[25, 16, 7, 12]]
    hashed = GPT(_config(vocab_size=40, bigram_embed=True, bigram_buckets=11)).bigram
    idx = torch.tensor([[7, 39, 0, 7]])
    pairs = [(7, 39), (39, 0), (0, 7)]
    want = [10] + [((36313 * cur) ^ (27191 * prev)) % 10 for prev, cur in pairs]
    assert hashed.table.num_embeddings == 11 and hashed.pair_rows(idx).tolist() == [want]
    # the model adds the pair's row to the token embedding
    model = _randomised(GPT(_config(vocab_size=5, bigram_embed=True, position="none")))
    x = model._embed(torch.tensor([[3, 1, 2, 2]]))
    rows = [25, 16, 7, 12]
    torch.testing.assert_close(x[0], model.wte.weight[[3, 1, 2, 2]] + model.bigram.table.weight[rows])


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("ingredient", list(INGREDIENTS))
def test_ingredients_stay_causal_with_every_attention_variant(ingredient, variant):
    """Changing a token never changes the logits before it, with each ingredient and each attention variant."""
    torch.manual_seed(0)
    model = _randomised(GPT(_config(n_layer=3, **_variant(variant), **INGREDIENTS[ingredient]))).eval()
    idx = torch.randint(0, 40, (2, 16))
    logits = model(idx)[0]
    for t in (1, 8, 15):
        changed = idx.clone()
        changed[:, t] = (changed[:, t] + 1) % 40
        other = model(changed)[0]
        torch.testing.assert_close(other[:, :t], logits[:, :t], rtol=0, atol=1e-6)
        assert not torch.allclose(other[:, t], logits[:, t])


def test_all_ingredients_together_train_and_generate():
    torch.manual_seed(0)
    model = _randomised(
        GPT(
            _config(
                n_layer=3, position="rope", qk_norm=True, value_embeds=2, smear_gate=True, bigram_embed=True
            )
        )
    )
    idx = torch.randint(0, 40, (2, 16))
    _, loss = model(idx, idx.roll(-1, 1))
    loss.backward()
    assert torch.isfinite(loss)
    for name, p in model.named_parameters():
        if name.startswith(("value_embeds.", "smear.", "bigram.")):
            assert p.grad is not None and p.grad.abs().sum() > 0, name
    roles = model.parameter_roles()
    tables = {id(p) for p in model.value_embeds.embeddings() + model.bigram.embeddings()}
    assert tables <= {id(p) for p in roles["embedding"]}
    # the previous-token ingredients decode without a KV cache: the same text either way
    assert not model.supports_kv_cache
    model.eval()
    prompt = idx[:1, :4]
    torch.testing.assert_close(
        model.generate(prompt, 8, temperature=0), model.generate(prompt, 8, temperature=0, use_cache=False)
    )


def test_value_embeddings_decode_with_the_kv_cache_as_without():
    torch.manual_seed(0)
    model = _randomised(GPT(_config(n_layer=3, position="rope", value_embeds=2))).eval()
    assert model.supports_kv_cache
    prompt = torch.randint(0, 40, (2, 5))
    torch.testing.assert_close(
        model.generate(prompt, 10, temperature=0), model.generate(prompt, 10, temperature=0, use_cache=False)
    )


@pytest.mark.parametrize(
    "kw, message",
    [
        (
            {"value_embeds": 2, "n_layer": 2},
            r"model\.value_embeds=2 is invalid: .* from 0 to \(n_layer \+ 1\) // 2 = 1",
        ),
        ({"value_embeds": -1}, r"model\.value_embeds=-1 is invalid"),
        (
            {"value_embeds": 1, "attention": "mha"},
            r"model\.value_embeds=1 needs an attention that adds values to its own, and model\.attention='mha' does "
            r"not: use model\.attention=sdpa, or model\.value_embeds=0",
        ),
        ({"smear_gate": "yes"}, r"model\.smear_gate='yes' is invalid: true or false"),
        (
            {"bigram_buckets": 100},
            r"model\.bigram_buckets=100 has no effect without model\.bigram_embed=true",
        ),
        ({"bigram_embed": True, "bigram_buckets": 1}, r"model\.bigram_buckets=1 is invalid"),
        (
            {"bigram_embed": True, "vocab_size": 50257},
            r"model\.bigram_embed=true with model\.vocab_size=50257 needs an exact table of 2525766050 rows: hash "
            r"the pairs instead, e\.g\. model\.bigram_buckets=251285",
        ),
    ],
)
def test_bad_input_ingredient_settings_fail_at_config_time(kw, message):
    with pytest.raises(ConfigError, match=message):
        _config(**kw)


@pytest.mark.parametrize("ingredient", ["value_embeds", "smear_gate", "bigram_exact"])
def test_hugging_face_exports_refuse_the_input_ingredients(ingredient, tmp_path):
    from gptmini.hf import HFWeightsError
    from gptmini.hf.gpt2 import save_hf_gpt2
    from gptmini.hf.llama import save_hf_llama

    setting = {**INGREDIENTS[ingredient]}
    if "value_embeds" in setting:
        setting["value_embeds"] = 1  # one layer: _config has two
    key, value = next(iter(setting.items()))
    llama = preset_config("llama_tiny", vocab_size=40)
    with pytest.raises(
        HFWeightsError, match=rf"model\.{key}=.* in Llama's format: a Llama checkpoint has no weights"
    ):
        save_hf_llama(GPT(GPTConfig.from_dict({**llama.to_dict(), **setting})), tmp_path / "llama")
    with pytest.raises(
        HFWeightsError, match=rf"GPT-2 weights with model\.{key}={value}: a GPT-2 checkpoint has no"
    ):
        save_hf_gpt2(GPT(_config(**setting)), tmp_path / "gpt2")
    assert not (tmp_path / "llama").exists() and not (tmp_path / "gpt2").exists()


SMOKE_OPTIONS = {
    "value_embeds": ["model.value_embeds=1"],
    "smear_gate": ["model.smear_gate=true"],
    "bigram_exact": ["model.bigram_embed=true"],
    "bigram_hashed": ["model.bigram_embed=true", "model.bigram_buckets=1000"],
    "normuon": ["optimizer.hidden.normuon=true"],
    "cautious_wd": ["optimizer.hidden.weight_decay=0.1", "optimizer.hidden.cautious_weight_decay=true"],
    "momentum_warmup": ["optimizer.hidden.momentum_warmup_steps=4"],
}


@pytest.mark.parametrize("option", list(SMOKE_OPTIONS))
def test_each_ingredient_composes_with_debug_smoke_and_the_zoo_and_trains_a_step(option, compose_cfg):
    """debug=smoke's config with the option and the best attention variant passes the config checks and builds the
    module, optimizer and schedule as the training command does; one step changes the ingredient's weights. (The
    real command line runs in tests/integration/test_ingredients_runs.py, marked slow.)"""
    import dataclasses

    from hydra.utils import instantiate

    from gptmini.training.loop.module import GPTLightningModule
    from gptmini.training.run.plan import plan_run

    cfg = compose_cfg(["debug=smoke", "tokenizer=char", "attention_variant=best", *SMOKE_OPTIONS[option]])
    gpt = plan_run(cfg).model
    plan = plan_run(cfg)
    module = GPTLightningModule(
        model_config={**gpt.to_dict(), "vocab_size": 40},
        optimizer=instantiate(dataclasses.asdict(plan.optimizer), _convert_="all"),
        scheduler=instantiate(dataclasses.asdict(plan.scheduler), _convert_="all"),
    )
    built = module.configure_optimizers()
    model, opt = module.model, built["optimizer"]
    _randomised(model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    idx = torch.randint(0, 40, (2, 16))
    _, loss = model(idx, idx.roll(-1, 1))
    loss.backward()
    opt.step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    ours = {n for n in before if n.startswith(("value_embeds.", "smear.", "bigram."))}
    assert ours <= changed and "blocks.0.attn.qkv.weight" in changed
    if option in ("normuon", "momentum_warmup"):
        muon = opt.optimizers["muon"]
        assert all(s["step"] == 1 for s in muon.state.values())
        assert ("second_momentum_buffer" in next(iter(muon.state.values()))) == (option == "normuon")


@pytest.mark.parametrize(
    "tokenizer, vocab",
    [
        (["tokenizer=char"], 256),
        (["tokenizer=bpe", "tokenizer.vocab_size=512"], 512),
        (["tokenizer=gpt2"], None),
    ],
)
def test_an_exact_bigram_table_is_planned_with_the_tokenizers_vocabulary(compose_cfg, tokenizer, vocab):
    """Before the data is prepared, an exact bigram table is checked against a vocabulary near the tokenizer's
    (char: 256 stands in; a BPE to be trained: its size), not GPT-2's 50257, whose table is refused."""
    from gptmini.training.errors import RunError
    from gptmini.training.run.plan import VOCAB_PLACEHOLDER, plan_run

    cfg = compose_cfg(["debug=smoke", *tokenizer, "model.bigram_embed=true"])
    if vocab is None:
        with pytest.raises((ConfigError, RunError), match=r"model\.vocab_size=50257 needs an exact table"):
            plan_run(cfg)
        hashed = plan_run(
            compose_cfg(["debug=smoke", *tokenizer, "model.bigram_embed=true", "model.bigram_buckets=64"])
        )
        assert hashed.model.vocab_size == VOCAB_PLACEHOLDER
        return
    plan = plan_run(cfg)
    assert not plan.vocab_known and plan.model.vocab_size == vocab
