"""GPT-2 weights in/out (gptmini.hf) against Hugging Face transformers, on tiny random models, offline."""

import json
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: nothing may try the network
os.environ["TRANSFORMERS_OFFLINE"] = "1"

# safetensors and transformers come with the dev extra: a missing one is an install problem and must fail
# the suite, not skip these tests.
import pytest  # noqa: E402
import safetensors.torch as safetensors_torch  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from torch.testing import assert_close  # noqa: E402

from gptmini.hf import HFWeightsError, load_hf_model, load_hf_weights, save_hf_gpt2  # noqa: E402
from gptmini.hf.cli import main  # noqa: E402
from gptmini.model import GPT, GPTConfig  # noqa: E402
from gptmini.runs.loading import open_run  # noqa: E402

D, L, H, P, V = 64, 2, 4, 32, 100  # vocab 100 is not a multiple of 64: exercises the padded rows


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


def _hf_model(seed: int = 0, **overrides):
    torch.manual_seed(seed)
    kwargs = (
        dict(
            n_embd=D,
            n_layer=L,
            n_head=H,
            n_positions=P,
            vocab_size=V,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
        | overrides
    )
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**kwargs))
    with torch.no_grad():  # non-trivial LayerNorms and biases, so a mapping mistake there shows in the logits
        for name, p in model.named_parameters():
            if ".ln_" in name or "ln_f" in name:
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.05 * torch.randn_like(p))
    return model.eval()


def _randomise(model: GPT, seed: int = 1) -> GPT:
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln_" in name:
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.05 * torch.randn_like(p))
    return model.eval()


def _tokens(vocab: int = V, t: int = P) -> torch.Tensor:
    return torch.randint(0, vocab, (3, t), generator=torch.Generator().manual_seed(7))


@torch.no_grad()
def _hf_logits(hf, idx):
    return hf(input_ids=idx).logits


@torch.no_grad()
def _our_logits(model, idx):
    return model(idx)[0]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A transformers-written folder (save_pretrained: safetensors, keys prefixed with 'transformer.')."""
    hf = _hf_model()
    path = tmp_path_factory.mktemp("hf") / "gpt2"
    hf.save_pretrained(path)
    return hf, path


def test_load_safetensors_matches_transformers(hf_dir):
    hf, path = hf_dir
    assert (path / "model.safetensors").is_file()
    model = load_hf_model(path)
    c = model.config
    assert (c.n_embd, c.n_layer, c.n_head, c.block_size, c.vocab_size) == (D, L, H, P, V)
    assert c.padded_vocab_size == 128 and c.attention == "sdpa" and c.tie_weights and c.bias
    assert torch.count_nonzero(model.wte.weight[V:]) == 0  # padded rows: zeros (their logits are -inf)
    idx = _tokens()
    assert_close(_our_logits(model, idx), _hf_logits(hf, idx), atol=1e-5, rtol=1e-5)


def test_load_pytorch_bin_unprefixed_with_legacy_buffers(tmp_path):
    # The layout of the original openai-community/gpt2 pytorch_model.bin: no 'transformer.' prefix, the
    # causal-mask buffers h.N.attn.bias / h.N.attn.masked_bias stored, and (tied) lm_head.weight present.
    hf = _hf_model(seed=3)
    hf.config.save_pretrained(tmp_path)  # transformers 5 always writes safetensors, so the .bin by hand
    state = dict(hf.transformer.state_dict())
    for i in range(L):
        state[f"h.{i}.attn.bias"] = torch.tril(torch.ones(P, P)).view(1, 1, P, P)
        state[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    state["lm_head.weight"] = hf.lm_head.weight.detach().clone()
    torch.save(state, tmp_path / "pytorch_model.bin")
    model = load_hf_model(tmp_path)
    idx = _tokens()
    assert_close(_our_logits(model, idx), _hf_logits(hf, idx), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attention", ["sdpa", "mha", "torch"])
def test_load_gpt2_weights_into_existing_model(hf_dir, attention):
    hf, path = hf_dir
    model = GPT(GPTConfig(vocab_size=V, block_size=P, n_layer=L, n_head=H, n_embd=D, attention=attention))
    load_hf_weights(model, path)
    idx = _tokens()
    assert_close(_our_logits(model.eval(), idx), _hf_logits(hf, idx), atol=1e-5, rtol=1e-5)


def test_load_gpt2_weights_shorter_context_and_larger_vocab(hf_dir):
    hf, path = hf_dir
    model = GPT(GPTConfig(vocab_size=V + 5, block_size=P // 2, n_layer=L, n_head=H, n_embd=D))
    load_hf_weights(model, path)
    idx = _tokens(t=P // 2)
    assert_close(_our_logits(model.eval(), idx)[..., :V], _hf_logits(hf, idx), atol=1e-5, rtol=1e-5)
    # extra real tokens start at the mean embedding, not at zero
    assert_close(model.wte.weight[V], hf.transformer.wte.weight.mean(0), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(n_embd=32), "model.n_embd=32 but the folder has n_embd=64"),
        (dict(n_layer=3), "model.n_layer=3 but the folder has n_layer=2"),
        (dict(n_head=2), "model.n_head=2 but the folder has n_head=4"),
        (dict(block_size=64), "model.block_size=64 exceeds the folder's n_positions=32"),
        (dict(vocab_size=50), "model.vocab_size=50 is smaller than the folder's vocab_size=100"),
        (dict(bias=False), "model.bias=false but the folder has bias=true"),
        (dict(attention="additive"), "only einsum, mha, sdpa, torch, wrapper"),
    ],
)
def test_load_gpt2_weights_mismatch_is_named(hf_dir, overrides, message):
    _, path = hf_dir
    kwargs = dict(vocab_size=V, block_size=P, n_layer=L, n_head=H, n_embd=D) | overrides
    with pytest.raises(HFWeightsError, match=message):
        load_hf_weights(GPT(GPTConfig(**kwargs)), path)


def test_missing_files_are_named(tmp_path, hf_dir):
    with pytest.raises(HFWeightsError, match="is not a directory"):
        load_hf_model(tmp_path / "nowhere")
    with pytest.raises(HFWeightsError, match=r"has no config\.json.*model\.safetensors.*pytorch_model\.bin"):
        load_hf_model(tmp_path)
    (tmp_path / "config.json").write_text((hf_dir[1] / "config.json").read_text())
    with pytest.raises(
        HFWeightsError, match=rf"{tmp_path} has no weights: expected model\.safetensors or pytorch_model\.bin"
    ):
        load_hf_model(tmp_path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"activation_function": "relu"}, "activation_function='relu' is unsupported"),
        ({"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx=true"),
        ({"scale_attn_weights": False}, "scale_attn_weights=false"),
        ({"n_inner": 100}, "n_inner=100"),
        ({"layer_norm_epsilon": 1e-6}, "layer_norm_epsilon"),
        ({"model_type": "gpt_neo"}, "model_type='gpt_neo'"),
        ({"tie_word_embeddings": False}, "tie_word_embeddings=false"),
    ],
)
def test_unsupported_config_is_rejected(tmp_path, hf_dir, change, message):
    cfg = json.loads((hf_dir[1] / "config.json").read_text()) | change
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(HFWeightsError, match=message):
        load_hf_model(tmp_path)


def test_tensor_shape_mismatch_is_named(tmp_path, hf_dir):
    hf, path = hf_dir
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    state = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    state["transformer.h.1.mlp.c_fc.weight"] = state["transformer.h.1.mlp.c_fc.weight"].t().contiguous()
    del state["lm_head.weight"]
    safetensors_torch.save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(
        HFWeightsError, match=r"h\.1\.mlp\.c_fc\.weight: \(256, 64\) \(expected \(64, 256\)\)"
    ):
        load_hf_model(tmp_path)
    del state["transformer.h.1.mlp.c_fc.weight"]
    safetensors_torch.save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(HFWeightsError, match=r"missing \['h\.1\.mlp\.c_fc\.weight'\]"):
        load_hf_model(tmp_path)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch.manual_seed(0)
    model = _randomise(GPT(GPTConfig(vocab_size=V, block_size=P, n_layer=L, n_head=H, n_embd=D)))
    path = tmp_path_factory.mktemp("export") / "mine"
    save_hf_gpt2(model, path)
    return model, path


def test_export_roundtrip_is_exact(exported):
    model, path = exported
    assert sorted(p.name for p in path.iterdir()) == [
        "config.json",
        "gptmini-export.json",
        "model.safetensors",
    ]
    manifest = json.loads((path / "gptmini-export.json").read_text())  # what --force may later replace
    assert manifest["files"] == ["config.json", "model.safetensors"]
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["model_type"] == "gpt2" and cfg["architectures"] == ["GPT2LMHeadModel"]
    assert cfg["vocab_size"] == V and cfg["bos_token_id"] is None and cfg["activation_function"] == "gelu_new"
    keys = safetensors_torch.load_file(str(path / "model.safetensors"))
    assert keys["transformer.wte.weight"].shape == (V, D)  # unpadded
    assert keys["transformer.h.0.attn.c_attn.weight"].shape == (D, 3 * D)  # Conv1D layout
    reloaded = load_hf_model(path)
    ours, theirs = model.state_dict(), reloaded.state_dict()
    assert ours.keys() == theirs.keys()
    for k in ours:
        assert torch.equal(
            ours[k][:V] if k in ("wte.weight", "lm_head.weight") else ours[k],
            theirs[k][:V] if k in ("wte.weight", "lm_head.weight") else theirs[k],
        ), k
    idx = _tokens()
    assert torch.equal(_our_logits(model, idx), _our_logits(reloaded, idx))


def test_export_loads_in_transformers(exported):
    model, path = exported
    hf = transformers.GPT2LMHeadModel.from_pretrained(path).eval()
    idx = _tokens()
    assert_close(_hf_logits(hf, idx), _our_logits(model, idx), atol=1e-5, rtol=1e-5)


def test_export_from_mha_model_matches(tmp_path):
    model = _randomise(
        GPT(GPTConfig(vocab_size=V, block_size=P, n_layer=L, n_head=H, n_embd=D, attention="mha"))
    )
    save_hf_gpt2(model, tmp_path / "mha")
    idx = _tokens()
    assert_close(
        _our_logits(load_hf_model(tmp_path / "mha"), idx), _our_logits(model, idx), atol=1e-6, rtol=1e-6
    )


def test_export_is_atomic(tmp_path, monkeypatch, exported):
    model, _ = exported
    target = tmp_path / "out"

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(safetensors_torch, "save_file", boom)
    with pytest.raises(OSError, match="disk full"):
        save_hf_gpt2(model, target)
    assert list(tmp_path.iterdir()) == []  # neither the target nor a temporary folder is left behind

    monkeypatch.undo()
    save_hf_gpt2(model, target)
    before = {p.name: p.read_bytes() for p in target.iterdir()}
    monkeypatch.setattr(safetensors_torch, "save_file", boom)
    with pytest.raises(OSError, match="disk full"):
        save_hf_gpt2(model, target, overwrite=True)
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before  # the previous export is intact
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_export_refuses_non_empty_dir_without_overwrite(tmp_path, exported):
    model, _ = exported
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(HFWeightsError, match="not empty"):
        save_hf_gpt2(model, tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "keep me"
    untied = GPT(GPTConfig(vocab_size=V, block_size=P, n_layer=L, n_head=H, n_embd=D, tie_weights=False))
    with pytest.raises(HFWeightsError, match="tie_weights=false"):
        save_hf_gpt2(untied, tmp_path / "untied")


def test_missing_safetensors_says_how_to_install(monkeypatch, exported, tmp_path):
    import sys

    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    with pytest.raises(ImportError, match=r"pip install 'gptmini\[hf\]'"):
        save_hf_gpt2(exported[0], tmp_path / "x")
    with pytest.raises(ImportError, match="safetensors"):
        load_hf_model(exported[1])


def test_cli_export_and_import(tmp_path, exported, capsys):
    model, _ = exported
    ckpt = tmp_path / "last.ckpt"
    torch.save(
        {
            "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
            "hyper_parameters": {"model_config": model.config.to_dict(), "run_config": {}},
        },
        ckpt,
    )
    assert main(["export", "--ckpt", str(ckpt), "--out", str(tmp_path / "hf")]) == 0
    assert main(["import", "--hf", str(tmp_path / "hf"), "--out", str(tmp_path / "back.ckpt")]) == 0
    opened = open_run(tmp_path / "back.ckpt", "cpu", tokenizer=False)
    back, saved = opened.model, opened.checkpoint
    idx = _tokens()
    assert torch.equal(_our_logits(back, idx), _our_logits(model, idx))
    # the import writes a run record of this version, not a composed config: where the weights came from
    from gptmini.runs.record import RECORD_VERSION, read_record

    record = read_record(saved)
    assert "run_config" not in saved["hyper_parameters"] and record.version == RECORD_VERSION
    assert record.init_from == str((tmp_path / "hf").absolute()) and record.model == model.config.to_dict()
    with pytest.raises(SystemExit) as exc:  # non-empty target without --force: a clean error, exit 2
        main(["export", "--ckpt", str(ckpt), "--out", str(tmp_path / "hf")])
    assert exc.value.code == 2 and "--force" in capsys.readouterr().err
    assert main(["export", "--ckpt", str(ckpt), "--out", str(tmp_path / "hf"), "--force"]) == 0


def test_exact_gelu_goes_both_ways_with_transformers(tmp_path):
    """model.gelu_approximate=none is GPT-2's format with activation_function="gelu" (erf GELU): transformers
    reads an export of it with the same logits, and a transformers model with that activation loads as it."""
    model = _randomise(
        GPT(GPTConfig(vocab_size=V, block_size=P, n_layer=L, n_head=H, n_embd=D, gelu_approximate="none"))
    )
    save_hf_gpt2(model, tmp_path / "exact")
    assert json.loads((tmp_path / "exact" / "config.json").read_text())["activation_function"] == "gelu"
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "exact").eval()
    idx = _tokens()
    assert_close(_hf_logits(hf, idx), _our_logits(model, idx), atol=1e-5, rtol=1e-5)

    theirs = _hf_model(activation_function="gelu")
    theirs.save_pretrained(tmp_path / "theirs")
    loaded = load_hf_model(tmp_path / "theirs")
    assert loaded.config.gelu_approximate == "none"
    assert_close(_our_logits(loaded, idx), _hf_logits(theirs, idx), atol=1e-5, rtol=1e-5)
    # the two GELUs differ enough that loading into the other one is refused, not silently approximated
    tanh_model = GPT(GPTConfig(vocab_size=V, block_size=P, n_layer=L, n_head=H, n_embd=D))
    with pytest.raises(
        HFWeightsError, match=r"model\.gelu_approximate=tanh but the folder has activation_function=gelu"
    ):
        load_hf_weights(tanh_model, tmp_path / "theirs")
    # a folder naming no activation has GPT-2's own: the refusal says so in Hugging Face's name for it
    cfg = json.loads((tmp_path / "theirs" / "config.json").read_text())
    del cfg["activation_function"]
    (tmp_path / "theirs" / "config.json").write_text(json.dumps(cfg))
    exact = GPT(GPTConfig(vocab_size=V, block_size=P, n_layer=L, n_head=H, n_embd=D, gelu_approximate="none"))
    with pytest.raises(
        HFWeightsError, match=r"model\.gelu_approximate=none but the folder has activation_function=gelu_new"
    ):
        load_hf_weights(exact, tmp_path / "theirs")
