"""Llama-format weights in/out (gptmini.hf.llama) against transformers' LlamaForCausalLM, on tiny random
models, offline; the rotary layout permutation against an interleaved reference RoPE; tokenizer files against
gptmini's tokenizers."""

import json
import os
import re

from benchmarks.common import preset_config

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: nothing may try the network
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import pytest  # noqa: E402
import safetensors.torch as safetensors_torch  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from torch.testing import assert_close  # noqa: E402

from gptmini.data.prepare import prepare  # noqa: E402
from gptmini.data.reader import load_tokenizer  # noqa: E402
from gptmini.data.tokenizers import build_tokenizer  # noqa: E402
from gptmini.hf import load_hf_model, load_hf_weights  # noqa: E402
from gptmini.hf.cli import main  # noqa: E402
from gptmini.hf.gpt2 import HFWeightsError, save_hf_gpt2  # noqa: E402
from gptmini.hf.llama import check_llama_model, save_hf_llama  # noqa: E402
from gptmini.model import GPT, GPTConfig  # noqa: E402
from gptmini.runs.loading import open_run  # noqa: E402

D, L, H, P, V = 64, 2, 4, 48, 100  # vocab 100 is not a multiple of 64: exercises gptmini's padded rows
TEXT = (
    "ROMEO:\nBut soft, what light through yonder window breaks?\n\tIt is the east, and Juliet is the sun.  "
)


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


def _perturb(named_parameters, seed: int) -> None:
    # norms away from 1 and biases away from 0, so a mapping mistake there shows in the logits
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in named_parameters:
            if "norm" in name or "ln_" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.05 * torch.randn_like(p))


def _hf_llama(n_kv: int = H, seed: int = 0, bias: bool = False, tie: bool = True, **overrides):
    torch.manual_seed(seed)
    settings = dict(
        vocab_size=V,
        hidden_size=D,
        intermediate_size=96,
        num_hidden_layers=L,
        num_attention_heads=H,
        num_key_value_heads=n_kv,
        max_position_embeddings=P,
        rms_norm_eps=1e-5,
        rope_theta=500.0,
        attention_bias=bias,
        mlp_bias=bias,
        tie_word_embeddings=tie,
        bos_token_id=None,
        eos_token_id=None,
    )
    config = transformers.LlamaConfig(**(settings | overrides))
    model = transformers.LlamaForCausalLM(config).eval()
    _perturb(model.named_parameters(), seed + 1)
    return model


def _ours(seed: int = 1, **overrides) -> GPT:
    """The llama_tiny preset (vocab V, context P) with ``overrides``, random weights, non-trivial norms."""
    torch.manual_seed(seed)
    model = GPT(preset_config("llama_tiny", **({"vocab_size": V, "block_size": P} | overrides))).eval()
    _perturb(model.named_parameters(), seed + 1)
    return model


def _tokens(t: int = 40) -> torch.Tensor:
    return torch.randint(0, V, (3, t), generator=torch.Generator().manual_seed(7))


@torch.no_grad()
def _logits_both(ours: GPT, hf, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return ours(idx)[0], hf(input_ids=idx).logits


# --- transformers -> gptmini ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n_kv", "bias", "tie"),
    [(H, False, True), (2, False, False), (1, True, True)],
    ids=["mha", "gqa", "mqa-bias"],
)
def test_random_transformers_llama_loads_with_the_same_logits(tmp_path, n_kv, bias, tie):
    hf = _hf_llama(n_kv, bias=bias, tie=tie)
    hf.save_pretrained(tmp_path)
    model = load_hf_model(tmp_path)
    c = model.config
    assert (c.n_kv_head, c.bias, c.tie_weights, c.mlp_width, c.rope_base, c.norm_eps) == (
        n_kv,
        bias,
        tie,
        96,
        500.0,
        1e-5,
    )
    assert (c.position, c.norm, c.mlp, c.block_size, c.padded_vocab_size) == (
        "rope",
        "rmsnorm",
        "swiglu",
        P,
        128,
    )
    ours, theirs = _logits_both(model, hf, _tokens())
    assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_init_from_a_llama_folder_checks_the_model_and_fills_it(tmp_path):
    hf = _hf_llama(2)
    hf.save_pretrained(tmp_path)
    settings = dict(n_kv_head=2, mlp_hidden=96, rope_base=500.0, tie_weights=True)
    model = _ours(
        **settings, vocab_size=V + 3
    )  # a larger vocabulary: the extra rows start at the mean embedding
    load_hf_weights(model, tmp_path)  # what model.init_from calls: the format comes from config.json
    idx = _tokens()
    ours, theirs = _logits_both(model, hf, idx)
    assert_close(ours[..., :V], theirs, atol=1e-4, rtol=1e-4)
    assert_close(model.wte.weight[V : V + 3], hf.model.embed_tokens.weight.mean(0).expand(3, -1))
    for change, message in [
        ({"n_kv_head": 4}, r"model.n_kv_head=4 but the folder has num_key_value_heads=2"),
        ({"mlp_hidden": None}, r"model.mlp_hidden=null \(192\) but the folder has intermediate_size=96"),
        ({"norm_eps": 1e-6}, r"model.norm_eps=1e-06 but the folder has rms_norm_eps=1e-05"),
        ({"rope_base": 10000.0}, r"model.rope_base=10000.0 but the folder has rope_theta=500.0"),
        ({"position": "learned"}, r"cannot load a model with model.position=learned in Llama's format"),
    ]:
        with pytest.raises(HFWeightsError, match=message):
            load_hf_weights(_ours(**(settings | change)), tmp_path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, r"rope_type='llama3' \(rotary scaling\)"),
        ({"hidden_act": "gelu"}, r"hidden_act='gelu' is unsupported"),
        ({"attention_bias": True, "mlp_bias": False}, r"attention_bias=True with mlp_bias=False"),
        ({"head_dim": 32}, r"head_dim=32 is unsupported"),
        ({"model_type": "mistral"}, r"model_type='mistral' is not a format gptmini reads"),
    ],
)
def test_unsupported_llama_configs_are_named(tmp_path, change, message):
    hf = _hf_llama()
    hf.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    if "rope_scaling" in change:  # the transformers 4 form of a scaled RoPE
        del cfg["rope_parameters"]
    (tmp_path / "config.json").write_text(json.dumps(cfg | change))
    with pytest.raises(HFWeightsError, match=message):
        load_hf_model(tmp_path)


def test_a_training_run_refuses_an_unreadable_format_before_preparing_data(tmp_path, compose_cfg):
    from gptmini.training.run.plan import plan_run

    (tmp_path / "mistral").mkdir()
    (tmp_path / "mistral" / "config.json").write_text(json.dumps({"model_type": "mistral"}))
    cfg = compose_cfg([f"model.init_from={tmp_path / 'mistral'}"])
    with pytest.raises(
        HFWeightsError, match=r"model_type='mistral' is not a format gptmini reads: gpt2 .*, llama"
    ):
        plan_run(cfg)
    assert not (tmp_path / "data").exists()


def test_weights_that_disagree_with_the_config_are_named(tmp_path):
    hf = _hf_llama()
    hf.save_pretrained(tmp_path)
    state = safetensors_torch.load_file(str(tmp_path / "model.safetensors"))
    state["model.layers.1.mlp.up_proj.weight"] = state["model.layers.1.mlp.up_proj.weight"].t().contiguous()
    safetensors_torch.save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(HFWeightsError, match=r"up_proj\.weight: \(64, 96\) \(expected \(96, 64\)\)"):
        load_hf_model(tmp_path)


# --- gptmini -> transformers ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_kv", [H, 2], ids=["mha", "gqa"])
def test_export_loads_in_transformers_with_the_same_logits_and_greedy_text(tmp_path, n_kv):
    model = _ours(n_kv_head=n_kv)
    assert save_hf_llama(model, tmp_path / "out") == ["config.json", "model.safetensors"]
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert hf.config.num_key_value_heads == n_kv and hf.config.vocab_size == V  # unpadded
    idx = _tokens()
    ours, theirs = _logits_both(model, hf, idx)
    assert_close(theirs, ours, atol=1e-4, rtol=1e-4)
    prompt = idx[:, :8]
    ours_text = model.generate(prompt, 30, temperature=0)  # gptmini's KV cache
    theirs_text = hf.generate(prompt, max_new_tokens=30, min_new_tokens=30, do_sample=False)
    assert torch.equal(ours_text, theirs_text)
    # and back: the same tensors, so exactly the same logits
    back = load_hf_model(tmp_path / "out")
    assert torch.equal(_logits_both(back, hf, idx)[0], ours)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"position": "learned"}, r"model.position=learned in Llama's format: Llama's format has rotary"),
        ({"position": "alibi"}, r"model.position=alibi"),
        ({"norm": "layernorm"}, r"model.norm=layernorm in Llama's format.*model.norm=rmsnorm"),
        ({"mlp": "gelu"}, r"model.mlp=gelu in Llama's format: Llama's MLP is SwiGLU"),
        ({"mlp": "none"}, r"model.mlp=none"),
        (
            {"attn_sink": True},
            r"model.attn_sink=True in Llama's format.*leave model.attn_sink at its default",
        ),
        ({"attn_gate": True}, r"model.attn_gate=True"),
        ({"sliding_window": 8}, r"model.sliding_window=8"),
    ],
)
def test_export_of_what_llama_cannot_hold_fails_by_name_and_writes_nothing(tmp_path, change, message):
    model = GPT(preset_config("llama_tiny", vocab_size=V, **change))
    with pytest.raises(HFWeightsError, match=message):
        save_hf_llama(model, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []  # no folder, no temporary folder


# --- Qwen3: Llama's block with q/k norms ----------------------------------------------------------------------------

QWEN3 = dict(qk_norm=True, norm_eps=1e-6, n_kv_head=2)


def test_random_transformers_qwen3_loads_with_the_same_logits(tmp_path):
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=V,
        hidden_size=D,
        intermediate_size=96,
        num_hidden_layers=L,
        num_attention_heads=H,
        num_key_value_heads=2,
        head_dim=D // H,
        max_position_embeddings=P,
        rms_norm_eps=1e-6,
        rope_theta=500.0,
        tie_word_embeddings=False,
    )
    hf = transformers.Qwen3ForCausalLM(config).eval()
    _perturb(hf.named_parameters(), 1)  # the q/k norms' gains away from 1 too
    hf.save_pretrained(tmp_path)
    model = load_hf_model(tmp_path)  # by config.json's model_type
    c = model.config
    assert (c.qk_norm, c.n_kv_head, c.bias, c.tie_weights, c.norm_eps) == (True, 2, False, False, 1e-6)
    ours, theirs = _logits_both(model, hf, _tokens())
    assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_qwen3_export_loads_in_transformers_with_the_same_logits_and_greedy_text(tmp_path):
    model = _ours(**QWEN3)
    save_hf_llama(model, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert type(hf) is transformers.Qwen3ForCausalLM
    idx = _tokens()
    ours, theirs = _logits_both(model, hf, idx)
    assert_close(theirs, ours, atol=1e-4, rtol=1e-4)
    prompt = idx[:, :8]
    theirs_text = hf.generate(prompt, max_new_tokens=30, min_new_tokens=30, do_sample=False)
    assert torch.equal(model.generate(prompt, 30, temperature=0), theirs_text)
    back = load_hf_model(tmp_path / "out")
    assert torch.equal(_logits_both(back, hf, idx)[0], ours)
    load_hf_weights(_ours(seed=5, **QWEN3), tmp_path / "out")  # init_from a Qwen3 folder
    with pytest.raises(
        HFWeightsError, match=r"cannot load a model with model.qk_norm=False in Qwen3ForCausalLM's format"
    ):
        load_hf_weights(_ours(n_kv_head=2, norm_eps=1e-6), tmp_path / "out")


@pytest.mark.parametrize(
    ("change", "fmt", "message"),
    [
        (
            {},
            "llama",
            r"model.qk_norm=True in LlamaForCausalLM's format: Llama's blocks have no query/key norms",
        ),
        (
            {"qk_norm": False},
            "qwen3",
            r"model.qk_norm=False in Qwen3ForCausalLM's format: .*Qwen3's always have",
        ),
        ({"bias": True}, "qwen3", r"model.bias=True in Qwen3ForCausalLM's format: Qwen3's MLP has no biases"),
        (
            {"norm_eps": 1e-5},
            "qwen3",
            r"model.norm_eps=1e-05 in Qwen3ForCausalLM's format: .*model.norm_eps=1e-06",
        ),
    ],
)
def test_what_the_qwen3_and_llama_formats_cannot_hold_is_named(change, fmt, message):
    config = preset_config("llama_tiny", vocab_size=V, **(QWEN3 | change))
    with pytest.raises(HFWeightsError, match=message):
        check_llama_model(config, fmt=fmt)


def test_export_auto_picks_the_format_of_the_blocks(tmp_path, char_run, write_checkpoint, caplog, capsys):
    _, data_dir = char_run
    blocks = dict(position="rope", norm="rmsnorm", mlp="swiglu", bias=False, n_embd=32)
    cases = [({}, "gpt2"), (blocks, "llama"), (blocks | QWEN3, "qwen3")]
    for i, (settings, fmt) in enumerate(cases):
        ckpt = write_checkpoint(tmp_path / f"{i}.ckpt", data_dir=data_dir, block_size=P, **settings)
        caplog.clear()
        with caplog.at_level("INFO", logger="gptmini.hf"):
            assert main(["export", "--ckpt", str(ckpt), "--out", str(tmp_path / f"hf{i}")]) == 0
        assert f"--format auto: {fmt}" in caplog.text
        model_type = json.loads((tmp_path / f"hf{i}" / "config.json").read_text()).get("model_type")
        assert model_type == fmt
    # a format named against the blocks: one line, exit 2, nothing written
    for fmt, message in [
        ("llama", "model.qk_norm=True in LlamaForCausalLM's"),
        ("qwen3", "model.qk_norm=False"),
    ]:
        ckpt = tmp_path / ("2.ckpt" if fmt == "llama" else "1.ckpt")
        with pytest.raises(SystemExit) as exc:
            main(["export", "--format", fmt, "--ckpt", str(ckpt), "--out", str(tmp_path / f"wrong-{fmt}")])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and message in err and err.count("error:") == 1, err
        assert not (tmp_path / f"wrong-{fmt}").exists()


def test_gpt2_export_refuses_llama_blocks_by_name(tmp_path):
    for change, message in [
        ({"norm": "rmsnorm"}, r"model.norm=rmsnorm: GPT-2 normalises with LayerNorm.*--format llama"),
        ({"mlp": "swiglu"}, r"model.mlp=swiglu: GPT-2's MLP"),
        ({"mlp": "none"}, r"model.mlp=none"),
        ({"mlp_hidden": 96}, r"model.mlp_hidden=96: GPT-2's MLP is 4 \* n_embd wide"),
    ]:
        with pytest.raises(HFWeightsError, match=message):
            save_hf_gpt2(
                GPT(GPTConfig(vocab_size=V, block_size=P, n_layer=1, n_head=H, n_embd=D, **change)), tmp_path
            )
    assert list(tmp_path.iterdir()) == []


# --- tokenizer files and the command line -------------------------------------------------------------------------


def test_gpt2_tokenizer_files_encode_like_tiktoken(tmp_path):
    model = GPT(preset_config("llama_tiny", vocab_size=50257))
    tok = build_tokenizer("gpt2")
    save_hf_llama(model, tmp_path / "out", tokenizer=tok)
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    # contractions, runs of spaces and digits, non-ASCII, trailing whitespace: where BPE pre-tokenizers differ
    text = TEXT * 3 + " it's   they'll 1234567 ünïcödé — 東京\r\n\n  \t"
    ids = tok.encode(text)
    assert hf_tok(text)["input_ids"] == ids  # no BOS added
    assert hf_tok.decode(ids) == text
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["eos_token_id"] == cfg["bos_token_id"] == 50256 == hf_tok.eos_token_id


@pytest.fixture(scope="module")
def char_run(tmp_path_factory):
    """A prepared char corpus and a Llama-style checkpoint trained (as recorded) on it."""
    root = tmp_path_factory.mktemp("char")
    corpus = root / "corpus.txt"
    corpus.write_text(TEXT * 40)
    data_dir = root / "data"
    prepare(str(corpus), "char", data_dir, val_fraction=0.2)
    return root, data_dir


def test_cli_exports_a_char_llama_run_that_transformers_loads_tokenizes_and_generates_with(
    tmp_path, char_run, write_checkpoint
):
    root, data_dir = char_run
    ckpt = write_checkpoint(
        tmp_path / "last.ckpt",
        data_dir=data_dir,
        block_size=P,
        n_layer=2,
        n_head=4,
        n_kv_head=2,
        n_embd=32,
        position="rope",
        norm="rmsnorm",
        mlp="swiglu",
        bias=False,
    )
    assert main(["export", "--format", "llama", "--ckpt", str(ckpt), "--out", str(tmp_path / "hf")]) == 0
    files = sorted(p.name for p in (tmp_path / "hf").iterdir())
    assert files == [
        "config.json",
        "gptmini-export.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert {(tmp_path / "hf" / f).stat().st_mode & 0o777 for f in files} == {0o644}  # readable by others
    ours = open_run(ckpt, "cpu", tokenizer=False).model
    chars = load_tokenizer(data_dir)
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ids = hf_tok(TEXT, return_tensors="pt")["input_ids"]
    assert ids[0].tolist() == chars.encode(TEXT)  # no BOS, one id per character
    out = hf.generate(ids[:, :10], max_new_tokens=20, min_new_tokens=20, do_sample=False)
    assert torch.equal(out, ours.generate(ids[:, :10], 20, temperature=0))
    assert hf_tok.decode(out[0]) == chars.decode(out[0].tolist())
    # import, by config.json's model_type, back into a checkpoint with the same logits
    assert main(["import", "--hf", str(tmp_path / "hf"), "--out", str(tmp_path / "back.ckpt")]) == 0
    back = open_run(tmp_path / "back.ckpt", "cpu", tokenizer=False).model
    assert torch.equal(back(ids)[0], ours(ids)[0])


def test_cli_refuses_unsupported_models_and_missing_vocabularies_writing_nothing(
    tmp_path, char_run, write_checkpoint, capsys
):
    _, data_dir = char_run
    gpt2_style = write_checkpoint(tmp_path / "gpt2.ckpt", data_dir=data_dir)
    with pytest.raises(SystemExit) as exc:
        main(["export", "--format", "llama", "--ckpt", str(gpt2_style), "--out", str(tmp_path / "a")])
    assert exc.value.code == 2
    assert "model.position=learned in Llama's format" in capsys.readouterr().err
    llama = write_checkpoint(
        tmp_path / "llama.ckpt", data_dir=data_dir, position="rope", norm="rmsnorm", mlp="swiglu"
    )
    moved = tmp_path / "elsewhere"
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "export",
                "--format",
                "llama",
                "--ckpt",
                str(llama),
                "--out",
                str(tmp_path / "b"),
                "--data-dir",
                str(moved),
            ]
        )
    assert (
        exc.value.code == 2
        and "pass --data-dir pointing at the prepared data folder" in capsys.readouterr().err
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpt2.ckpt", "llama.ckpt"]
    # --tokenizer none: the weights alone
    assert (
        main(
            [
                "export",
                "--format",
                "llama",
                "--ckpt",
                str(llama),
                "--out",
                str(tmp_path / "c"),
                "--tokenizer",
                "none",
            ]
        )
        == 0
    )
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == [
        "config.json",
        "gptmini-export.json",
        "model.safetensors",
    ]


@pytest.mark.slow
def test_training_starts_from_a_transformers_llama_folder(tmp_path, run_cli):
    # model.init_from with a Llama folder, through the training command: the format comes from config.json
    shape = dict(vocab_size=50257, hidden_size=32, num_attention_heads=2, max_position_embeddings=32)
    hf = _hf_llama(n_kv=1, **shape)
    hf.save_pretrained(tmp_path / "llama-tiny")
    proc = run_cli.train(
        [
            "debug=smoke",
            "model=llama_tiny",
            "model.n_embd=32",
            "model.n_head=2",
            "model.n_kv_head=1",
            "model.mlp_hidden=96",
            "model.rope_base=500.0",
            "model.block_size=32",
            f"model.init_from={tmp_path / 'llama-tiny'}",
            "trainer.max_steps=1",
            "trainer.val_check_interval=1",
            "optimizer=adamw",
            "optimizer.lr=1e-9",
            "scheduler=constant",
            f"paths.output_root={tmp_path}/outputs",
            f"paths.data_root={tmp_path}/data",
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "initialised weights from" in proc.stdout + proc.stderr
    (run_dir,) = (tmp_path / "outputs" / "smoke").iterdir()
    trained = open_run(run_dir / "checkpoints" / "last.ckpt", "cpu", tokenizer=False).model
    idx = torch.randint(0, 50257, (1, 16))
    # One step at lr 1e-9 barely moves the weights: the run started from the transformers ones.
    ours, theirs = _logits_both(trained, hf, idx)
    assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


WRONG_TYPES = [
    ("llama", {"rms_norm_eps": "1e-5"}, r"rms_norm_eps='1e-5' is not number"),
    ("llama", {"rms_norm_eps": None}, r"rms_norm_eps=None is not number"),
    ("llama", {"hidden_act": ["silu"]}, r"hidden_act=\['silu'\] is not string"),
    ("llama", {"model_type": ["llama"]}, r"model_type=\['llama'\] is not a format gptmini reads"),
    (
        "llama",
        {"rope_parameters": {"rope_type": "default", "rope_theta": "big"}},
        r"rope_parameters\.rope_theta",
    ),
    ("llama", {"tie_word_embeddings": "yes"}, r"tie_word_embeddings='yes' is not boolean"),
    ("gpt2", {"layer_norm_epsilon": "1e-5"}, r"layer_norm_epsilon='1e-5' is not number"),
    ("gpt2", {"layer_norm_epsilon": None}, r"layer_norm_epsilon=None is not number"),
    ("gpt2", {"activation_function": ["gelu_new"]}, r"activation_function=\['gelu_new'\] is not string"),
    ("gpt2", {"model_type": {"a": 1}}, r"model_type=\{'a': 1\} is not a format gptmini reads"),
    ("gpt2", {"n_inner": 2.5}, r"n_inner=2\.5 is not integer or null"),
]


@pytest.mark.parametrize(
    ("kind", "change", "message"), WRONG_TYPES, ids=[f"{k}-{next(iter(c))}" for k, c, _ in WRONG_TYPES]
)
def test_import_refuses_config_values_of_the_wrong_json_type_in_one_line(
    tmp_path, kind, change, message, capsys
):
    folder = tmp_path / "hf"
    if kind == "llama":
        _hf_llama().save_pretrained(folder)
    else:
        save_hf_gpt2(GPT(GPTConfig(vocab_size=V, block_size=16, n_layer=1, n_head=2, n_embd=16)), folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(cfg | change))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(["import", "--hf", str(folder), "--out", str(tmp_path / "out.ckpt")])
    status, err = exit_.value.code, capsys.readouterr().err
    assert status == 2 and re.search(message, err), err
    assert "Traceback" not in err and err.count("error:") == 1 and not (tmp_path / "out.ckpt").exists()
