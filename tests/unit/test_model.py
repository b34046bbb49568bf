import math

import pytest
import torch
import torch.nn.functional as F

from benchmarks.common import preset_config
from gptmini.attention import available_attention
from gptmini.generation import sample
from gptmini.model import GPT, ConfigError, GPTConfig


def tiny(**kw) -> GPTConfig:
    base = dict(vocab_size=100, block_size=32, n_layer=2, n_head=4, n_embd=32, dropout=0.0)
    base.update(kw)
    return GPTConfig(**base)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# --- config -------------------------------------------------------------------------------------------------


def test_config_derives_head_size_and_padded_vocab():
    c = tiny()
    assert c.head_size == 8
    assert c.padded_vocab_size == 128
    assert GPTConfig(vocab_size=50257).padded_vocab_size == 50304
    assert tiny(pad_vocab_multiple=1).padded_vocab_size == 100


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(n_embd=30, n_head=4), r"n_embd=30 is not divisible by model.n_head=4"),
        (dict(n_layer=0), r"model.n_layer=0 is invalid"),
        (dict(block_size=-3), r"model.block_size=-3 is invalid"),
        (dict(dropout=1.0), r"model.dropout=1.0 is invalid: it must be in \[0, 1\)"),
        (dict(dropout=-0.1), r"model.dropout=-0.1"),
        (dict(attention="flash9"), r"model.attention='flash9'.*valid names: .*sdpa"),
        (dict(vocab_size=2.5), r"model.vocab_size=2.5"),
    ],
)
def test_config_rejects_invalid_values_with_a_message(kw, match):
    with pytest.raises(ConfigError, match=match):
        tiny(**kw)


def test_config_round_trips_through_dict_and_rejects_unknown_keys():
    c = tiny(attention="mha", bias=False)
    assert GPTConfig.from_dict(c.to_dict()) == c
    with pytest.raises(ConfigError, match="n_embdd"):
        GPTConfig.from_dict({**c.to_dict(), "n_embdd": 3})


# --- structure ----------------------------------------------------------------------------------------------


def test_gpt2_small_has_124m_parameters():
    # GPT-2 small with tied weights, learned 1024 positions and no vocab padding: 124,439,808.
    with torch.device("meta"):
        model = GPT(preset_config("gpt2", pad_vocab_multiple=1))
    assert model.num_parameters() == 124_439_808
    assert model.num_parameters(exclude_embeddings=True) == 124_439_808 - 1024 * 768


def test_tied_weights_are_the_same_tensor():
    model = GPT(tiny())
    assert model.lm_head.weight is model.wte.weight
    untied = GPT(tiny(tie_weights=False))
    assert untied.lm_head.weight is not untied.wte.weight
    assert untied.num_parameters() == model.num_parameters() + untied.lm_head.weight.numel()


def test_gpt2_initialisation_scales_residual_projections():
    model = GPT(tiny(n_layer=8, n_embd=128, n_head=4))
    resid = torch.cat(
        [torch.cat([b.attn.out_proj.weight.flatten(), b.mlp.c_proj.weight.flatten()]) for b in model.blocks]
    )
    other = torch.cat([b.mlp.c_fc.weight.flatten() for b in model.blocks])
    assert resid.std().item() == pytest.approx(0.02 / math.sqrt(2 * 8), rel=0.05)
    assert other.std().item() == pytest.approx(0.02, rel=0.05)
    assert all(b.attn.out_proj.bias.abs().max() == 0 for b in model.blocks)
    assert torch.equal(model.ln_f.weight, torch.ones_like(model.ln_f.weight))


def test_flops_per_token_follows_the_6n_plus_attention_formula():
    c = tiny()
    model = GPT(c)
    n = model.num_parameters(exclude_embeddings=True)
    assert model.flops_per_token(16) == 6 * n + 12 * c.n_layer * c.n_head * c.head_size * 16


# --- forward ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("attention", available_attention())
def test_future_tokens_never_change_past_logits(attention):
    model = GPT(tiny(attention=attention)).eval()
    idx = torch.randint(0, 100, (2, 20))
    changed = idx.clone()
    changed[:, 12:] = torch.randint(0, 100, (2, 8))
    with torch.no_grad():
        a, _ = model(idx)
        b, _ = model(changed)
    torch.testing.assert_close(a[:, :12], b[:, :12])
    assert not torch.allclose(a[:, 12:], b[:, 12:])


def test_loss_at_init_is_close_to_ln_vocab():
    model = GPT(tiny(vocab_size=1000, n_embd=64)).eval()
    x = torch.randint(0, 1000, (8, 32))
    y = torch.randint(0, 1000, (8, 32))
    _, loss = model(x, y)
    assert loss.item() == pytest.approx(math.log(1000), abs=0.15)


def test_padded_logits_are_hidden_and_not_counted_in_the_loss():
    model = GPT(tiny())  # vocab 100 padded to 128
    x = torch.randint(0, 100, (2, 16))
    y = torch.randint(0, 100, (2, 16))
    logits, loss = model(x, y)
    assert logits.shape == (2, 16, 100)
    # Oracle: cross entropy over the 100 real columns only, computed from the raw LM head.
    raw = model.lm_head(model.hidden_states(x))[..., :100]
    expected = F.cross_entropy(raw.reshape(-1, 100), y.reshape(-1))
    torch.testing.assert_close(loss, expected)
    loss.backward()  # the in-place -inf fill must not break autograd
    assert torch.isfinite(model.wte.weight.grad).all()
    assert model.wte.weight.grad[100:].abs().sum() == 0


def test_input_longer_than_block_size_fails_clearly_where_the_model_cannot_extrapolate():
    model = GPT(tiny())
    with pytest.raises(
        ValueError, match=r"longer than the model can take: its learned position table has block_size=32 rows"
    ):
        model(torch.zeros(1, 33, dtype=torch.long))
    with pytest.raises(ValueError, match=r"model.attention='mha' is built for block_size=32 tokens"):
        GPT(tiny(position="none", attention="mha"))(torch.zeros(1, 33, dtype=torch.long))


@pytest.mark.parametrize("position", ["rope", "alibi", "none"])
def test_rope_alibi_and_nope_run_past_block_size_and_agree_with_themselves_within_it(position):
    # length extrapolation: the first 32 positions of a 80-token input are exactly the 32-token forward (causal,
    # and no table is sized by block_size: RoPE's grows)
    torch.manual_seed(0)
    model = GPT(tiny(position=position)).eval()
    idx = torch.randint(0, 100, (2, 80))
    with torch.no_grad():
        long_logits, _ = model(idx)
        short_logits, _ = model(idx[:, :32])
        maps = model.attention_maps(idx)
    assert model.length_limit is None
    torch.testing.assert_close(long_logits[:, :32], short_logits, atol=1e-5, rtol=1e-5)
    assert maps.shape == (2, 2, 4, 80, 80)  # (n_layer, B, nh, T, T)


def test_tiny_model_overfits_a_short_text():
    text = "To be, or not to be, that is the question."
    ids = torch.tensor([[ord(c) for c in text]])
    x, y = ids[:, :-1], ids[:, 1:]
    model = GPT(tiny(vocab_size=128, block_size=64, n_embd=64))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(150):
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05
    # Greedy continuation of the first character reproduces the memorised text.
    model.eval()
    out = model.generate(ids[:, :1], len(text) - 1, temperature=0)
    assert "".join(chr(i) for i in out[0].tolist()) == text


# --- attention maps -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("attention", available_attention())
def test_attention_maps_are_causal_distributions(attention):
    model = GPT(tiny(attention=attention)).eval()
    idx = torch.randint(0, 100, (2, 10))
    maps = model.attention_maps(idx)
    assert maps.shape == (2, 2, 4, 10, 10)  # (n_layer, B, n_head, T, T)
    torch.testing.assert_close(maps.sum(-1), torch.ones(2, 2, 4, 10))
    assert maps.triu(diagonal=1).abs().max() == 0


def test_attention_maps_match_a_manual_softmax_of_the_first_layer():
    model = GPT(tiny()).eval()
    idx = torch.randint(0, 100, (1, 8))
    maps = model.attention_maps(idx)
    with torch.no_grad():
        x = model.wte(idx) + model.wpe(torch.arange(8))
        h = model.blocks[0].ln_1(x)
        q, k, _ = model.blocks[0].attn.qkv(h).split(32, dim=-1)
        q = q.view(1, 8, 4, 8).transpose(1, 2)
        k = k.view(1, 8, 4, 8).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(8)
        scores = scores.masked_fill(torch.ones(8, 8, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(maps[0], scores.softmax(-1))


# --- generation ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("attention", ["sdpa", "mha"])
def test_cached_generation_equals_uncached_under_greedy_decoding(attention):
    model = GPT(tiny(attention=attention)).eval()
    assert model.supports_kv_cache
    prompt = torch.randint(0, 100, (3, 5))
    cached = model.generate(prompt, 25, temperature=0, use_cache=True)
    uncached = model.generate(prompt, 25, temperature=0, use_cache=False)
    assert cached.shape == (3, 30)
    assert torch.equal(cached, uncached)


def test_cached_sampling_matches_uncached_with_the_same_generator():
    model = GPT(tiny()).eval()
    prompt = torch.randint(0, 100, (2, 4))
    a = model.generate(prompt, 20, temperature=1.0, top_k=10, generator=torch.Generator().manual_seed(1))
    b = model.generate(
        prompt, 20, temperature=1.0, top_k=10, use_cache=False, generator=torch.Generator().manual_seed(1)
    )
    assert torch.equal(a, b)


def test_generation_past_block_size_keeps_going():
    model = GPT(tiny()).eval()
    out = model.generate(torch.zeros(1, 30, dtype=torch.long), 40, temperature=0)
    assert out.shape == (1, 70)
    assert out.max() < 100  # padded ids are never produced


def test_padded_ids_are_never_sampled():
    model = GPT(tiny()).eval()
    with torch.no_grad():
        model.lm_head.weight[100:] = 5.0  # would dominate if the padding were not masked
    out = model.generate(
        torch.zeros(4, 1, dtype=torch.long), 30, temperature=2.0, generator=torch.Generator().manual_seed(0)
    )
    assert out.max() < 100


def test_top_k_one_and_tiny_top_p_are_greedy():
    model = GPT(tiny()).eval()
    prompt = torch.randint(0, 100, (2, 3))
    greedy = model.generate(prompt, 10, temperature=0)
    assert torch.equal(model.generate(prompt, 10, temperature=1.0, top_k=1), greedy)
    assert torch.equal(model.generate(prompt, 10, temperature=1.0, top_p=1e-6), greedy)


def test_top_k_restricts_samples_to_the_k_most_likely():
    torch.manual_seed(0)
    logits = torch.randn(1, 50).repeat(2000, 1)
    allowed = set(torch.topk(logits[0], 5).indices.tolist())
    samples = sample(logits, 1.0, 5, None, torch.Generator().manual_seed(0))
    assert set(samples.flatten().tolist()) <= allowed
    assert len(set(samples.flatten().tolist())) == 5


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(3000, 1)
    samples = sample(logits, 1.0, None, 0.75, torch.Generator().manual_seed(0))
    assert set(samples.flatten().tolist()) == {0, 1}


def test_eos_stops_generation_and_pads_finished_rows():
    model = GPT(tiny()).eval()
    prompt = torch.randint(0, 100, (1, 3))
    first = model.generate(prompt, 1, temperature=0)[0, -1].item()
    out = model.generate(prompt, 20, temperature=0, eos_token=first)
    assert out.shape == (1, 4)  # stopped right after producing the eos token


@pytest.mark.parametrize(
    "kw, match",
    [(dict(temperature=-1), "temperature"), (dict(top_k=0), "top_k"), (dict(top_p=1.5), "top_p")],
)
def test_generate_rejects_bad_sampling_settings(kw, match):
    model = GPT(tiny()).eval()
    with pytest.raises(ValueError, match=match):
        model.generate(torch.zeros(1, 2, dtype=torch.long), 3, **kw)


def test_presets_build():
    for name in ("tiny", "cpu"):
        assert GPT(preset_config(name, vocab_size=65)).num_parameters() > 0


# --- grouped-query attention ----------------------------------------------------------------------------------


def test_grouped_query_attention_caches_only_its_key_value_heads():
    plain = GPT(tiny(n_head=4, n_embd=32))
    gqa = GPT(tiny(n_head=4, n_embd=32, n_kv_head=1))  # n_head / 4 key/value heads: multi-query
    (c_plain, *_), (c_gqa, *_) = plain.new_kv_caches(2), gqa.new_kv_caches(2)
    assert c_plain.k.shape == (2, 4, 32, 8) and c_gqa.k.shape == (2, 1, 32, 8)
    bytes_per_token = [(c.k.numel() + c.v.numel()) * c.k.element_size() / 32 for c in (c_plain, c_gqa)]
    assert bytes_per_token[0] == 4 * bytes_per_token[1]
    # the fused projection shrinks accordingly: q (32) + k, v (8 each) output rows instead of 3 x 32
    assert gqa.blocks[0].attn.qkv.weight.shape == (48, 32)
    idx = torch.randint(0, 64, (2, 6))
    assert torch.equal(
        gqa.generate(idx, 20, temperature=0.0), gqa.generate(idx, 20, temperature=0.0, use_cache=False)
    )


@pytest.mark.parametrize(
    "kw, match",
    [
        (
            dict(n_head=4, n_kv_head=3),
            r"model.n_kv_head=3 does not divide model.n_head=4: choose among 1, 2, 4",
        ),
        (dict(n_head=4, n_kv_head=0), r"model.n_kv_head=0 is invalid"),
        (
            dict(n_head=4, n_kv_head=2, attention="mha"),
            r"not supported by model.attention='mha': use model.attention=sdpa",
        ),
    ],
)
def test_n_kv_head_is_checked_at_config_time(kw, match):
    with pytest.raises(ConfigError, match=match):
        tiny(n_embd=32, **kw)
    assert tiny(n_head=4, n_embd=32, n_kv_head=4, attention="mha").kv_heads == 4  # = n_head: plain attention


# --- positions ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("position", ["rope", "alibi", "none"])
def test_rope_and_nope_have_no_position_table(position):
    learned, other = GPT(tiny()), GPT(tiny(position=position))
    assert other.wpe is None
    assert learned.num_parameters() - other.num_parameters() == 32 * 32  # block_size x n_embd
    assert other.num_parameters(exclude_embeddings=True) == learned.num_parameters(exclude_embeddings=True)
    idx = torch.randint(0, 100, (2, 8))
    logits, loss = other(idx, idx)
    assert logits.shape == (2, 8, 100) and torch.isfinite(loss)
    # order is still seen, through the causal mask (none) or the rotation (rope): the same token after
    # different prefixes gets different outputs
    out = other(torch.tensor([[7, 3, 7, 3, 7]]))[0][0]
    assert not torch.allclose(out[2], out[4])


def test_position_and_window_settings_are_checked_at_config_time():
    with pytest.raises(
        ConfigError, match=r"model.position='sinusoid' is invalid: valid values are learned, rope, alibi"
    ):
        tiny(position="sinusoid")
    for window in (0, -2, 2.5):
        with pytest.raises(ConfigError, match=rf"model.sliding_window={window} is invalid"):
            tiny(sliding_window=window)
    with pytest.raises(
        ConfigError, match=r"model.sliding_window=4 is not supported by model.attention='torch'"
    ):
        tiny(sliding_window=4, attention="torch")
    with pytest.raises(
        ConfigError, match=r"model.position='alibi' is not supported by model.attention='wrapper'"
    ):
        tiny(position="alibi", attention="wrapper")
    with pytest.raises(ConfigError, match=r"model.rope_base=1 is invalid"):
        tiny(position="rope", rope_base=1)
    with pytest.raises(ConfigError, match=r"needs an even head size, and n_embd / n_head = 5"):
        tiny(position="rope", n_embd=20, n_head=4)
    with pytest.raises(
        ConfigError,
        match=r"model.position='rope' is not supported by model.attention='mha': use model.attention=sdpa",
    ):
        tiny(position="rope", attention="mha")
    with pytest.raises(ConfigError, match=r"model.qk_norm=True is not supported by model.attention='einsum'"):
        tiny(qk_norm=True, attention="einsum")


def test_gpt2_export_refuses_positions_gpt2_does_not_have(tmp_path):
    from gptmini.hf.gpt2 import HFWeightsError, save_hf_gpt2

    with pytest.raises(HFWeightsError, match=r"model.position='none'"):
        save_hf_gpt2(GPT(tiny(position="none")), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_qk_norm_gains_start_at_one():
    model = GPT(tiny(qk_norm=True, attn_gate=True))
    attn = model.blocks[0].attn
    assert torch.equal(attn.q_norm.weight, torch.ones(8)) and torch.equal(attn.k_norm.weight, torch.ones(8))
    assert attn.gate.weight.std() > 0  # an ordinary Linear, initialised like the others


def test_a_sink_takes_attention_mass_and_gives_no_value():
    model = GPT(tiny(attn_sink=True)).eval()
    attn = model.blocks[0].attn
    idx = torch.randint(0, 100, (1, 10))
    with torch.no_grad():
        attn.sink.fill_(-30.0)  # a sink nobody uses: ordinary attention
        torch.testing.assert_close(model.attention_maps(idx)[0].sum(-1), torch.ones(1, 4, 10))
        attn.sink.fill_(
            30.0
        )  # a sink that takes everything: the layer adds (almost) nothing but out_proj's bias
        maps = model.attention_maps(idx)[0]
        assert maps.sum(-1).max() < 1e-6
        x = torch.randn(1, 10, 32)
        torch.testing.assert_close(attn(x), attn.out_proj.bias.expand(1, 10, 32), atol=1e-5, rtol=0)
    with pytest.raises(ConfigError, match=r"model.attn_sink=True is not supported by model.attention='mha'"):
        tiny(attn_sink=True, attention="mha")


# --- block options: norm, mlp ---------------------------------------------------------------------------------


def test_swiglu_default_width_is_eight_thirds_rounded_up():
    from gptmini.model import swiglu_hidden

    assert tiny(mlp="swiglu").mlp_width == 128  # 8/3 * 32 = 85.3 -> 128
    assert tiny().mlp_width == 128 and tiny(mlp="none").mlp_width == 0 and tiny(mlp_hidden=48).mlp_width == 48
    assert swiglu_hidden(768) == 2048
    assert swiglu_hidden(4096, multiple=256) == 11008  # Llama 7B's intermediate_size


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(norm="batchnorm"), r"model.norm='batchnorm' is invalid: valid values are layernorm, rmsnorm"),
        (dict(mlp="relu"), r"model.mlp='relu' is invalid: valid values are gelu, swiglu, relu2, none"),
        (dict(mlp_hidden=0), r"model.mlp_hidden=0 is invalid: a positive integer, or null"),
        (dict(mlp="none", mlp_hidden=64), r"model.mlp_hidden=64 has no effect with model.mlp=none.*=null"),
        (dict(norm_eps=0.0), r"model.norm_eps=0.0 is invalid"),
        (
            dict(gelu_approximate="sigmoid"),
            r"model.gelu_approximate='sigmoid' is invalid: valid values are tanh, none",
        ),
        (
            dict(mlp="swiglu", gelu_approximate="none"),
            r"gelu_approximate=none has no effect with model.mlp=swiglu",
        ),
    ],
)
def test_block_options_are_checked_at_config_time(kw, match):
    with pytest.raises(ConfigError, match=match):
        tiny(**kw)


def test_rmsnorm_swiglu_block_matches_a_hand_written_oracle():
    model = GPT(tiny(norm="rmsnorm", mlp="swiglu", norm_eps=1e-6, bias=False, n_layer=1)).eval()
    block = model.blocks[0]
    with torch.no_grad():
        for p in (block.ln_1.weight, block.ln_2.weight):
            p.copy_(1 + 0.1 * torch.randn_like(p))
    x = torch.randn(2, 7, 32)

    def rms(v, gain):  # y = v / sqrt(mean(v^2) + eps) * gain: no mean subtraction, no bias
        return v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6) * gain

    mlp = block.mlp
    with torch.no_grad():
        h = x + block.attn(rms(x, block.ln_1.weight))
        u = rms(h, block.ln_2.weight)
        # SwiGLU: silu(u W_gate^T) * (u W_up^T), then W_down; silu(z) = z * sigmoid(z)
        gate = u @ mlp.w_gate.weight.T
        expected = h + ((gate * torch.sigmoid(gate)) * (u @ mlp.w_up.weight.T)) @ mlp.c_proj.weight.T
        torch.testing.assert_close(block(x), expected, atol=1e-5, rtol=1e-5)
    assert isinstance(model.ln_f, torch.nn.RMSNorm) and model.ln_f.eps == 1e-6
    assert all(m.bias is None for m in (mlp.w_gate, mlp.w_up, mlp.c_proj))


def test_swiglu_down_projection_gets_the_residual_init():
    model = GPT(tiny(mlp="swiglu", n_layer=8, n_embd=256, n_head=4))
    residual = 0.02 / math.sqrt(2 * 8)
    assert model.blocks[0].mlp.c_proj.weight.std().item() == pytest.approx(residual, rel=0.05)
    assert model.blocks[0].mlp.w_gate.weight.std().item() == pytest.approx(0.02, rel=0.05)


def test_attention_only_model_has_no_mlp_and_no_second_norm():
    model = GPT(tiny(mlp="none")).eval()
    block = model.blocks[0]
    assert block.mlp is None and block.ln_2 is None
    assert not any(".mlp." in n or ".ln_2." in n for n, _ in model.named_parameters())
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        torch.testing.assert_close(block(x), x + block.attn(block.ln_1(x)))
        # the cached path and attention maps work without an MLP too
        idx = torch.randint(0, 100, (1, 6))
        cached, uncached = (model.generate(idx, 5, temperature=0, use_cache=u) for u in (True, False))
        assert torch.equal(cached, uncached)
        assert model.attention_maps(idx).shape == (2, 1, 4, 6, 6)
    # per layer: attention (4 C^2 + 4 C biases) and one LayerNorm (2 C)
    c = 32
    assert model.num_parameters() == 128 * c + 32 * c + 2 * (4 * c * c + 4 * c + 2 * c) + 2 * c


def test_default_blocks_stay_gpt2s():
    block = GPT(tiny()).blocks[0]
    assert isinstance(block.ln_1, torch.nn.LayerNorm) and block.ln_1.eps == 1e-5
    assert block.ln_1.bias is not None and block.ln_2.bias is not None
    names = [n for n, _ in block.mlp.named_parameters()]
    assert names == ["c_fc.weight", "c_fc.bias", "c_proj.weight", "c_proj.bias"]
    assert block.mlp.c_fc.weight.shape == (128, 32)


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_gelu_mlp_matches_the_closed_forms(approximate):
    """GPT-2's tanh approximation and the exact erf GELU (nanoGPT's), each against its formula in NumPy."""
    import math

    import numpy as np

    model = GPT(tiny(n_layer=1, gelu_approximate=approximate)).eval()
    mlp = model.blocks[0].mlp
    u = torch.randn(2, 5, 32, dtype=torch.float64)
    mlp = mlp.double()
    z = (u @ mlp.c_fc.weight.T + mlp.c_fc.bias).detach().numpy()
    if approximate == "tanh":
        g = 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))
    else:
        g = 0.5 * z * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))
    with torch.no_grad():
        expected = torch.from_numpy(g) @ mlp.c_proj.weight.T + mlp.c_proj.bias
        torch.testing.assert_close(mlp(u), expected, atol=1e-10, rtol=1e-10)
