"""A tokenizer trained on the user's own corpus, end to end: ``tokenizer=bpe`` on Greek, Russian and Chinese text
written here trains, validates in bits per byte, samples, evaluates, draws attention, and goes out to a Hugging Face
Llama folder whose tokenizer gives the same ids, and back. Bits per byte of the char and GPT-2 tokenizers too,
each against an independent count of the validation text's bytes."""

from __future__ import annotations

import json
import math
import os
import random
import re

import pytest
import torch

from gptmini.data.reader import load_split, load_tokenizer
from gptmini.data.windows import StridedWindowDataset
from gptmini.runs.record import read_record

LINES = [
    "Καλημέρα κόσμε, η θάλασσα είναι ήρεμη σήμερα και ο ήλιος λάμπει.",
    "Привет, мир! Море спокойно, и солнце светит над городом.",
    "你好，世界。今天大海很平静，太阳照耀着城市。",
    "Η γλώσσα μας είναι παλιά· о языке говорят много; 语言很古老。",
]


def _corpus(n: int = 1500, seed: int = 0) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice(LINES) + "\n" for _ in range(n))


def _val_bytes(data_dir, tokenizer, block: int, windows: int) -> tuple[int, int]:
    """(targets, UTF-8 bytes they stand for) of the first ``windows`` validation windows, from the tokens' own
    byte strings: what a run validates with ``limit_val_batches``."""
    ds = StridedWindowDataset(load_split(data_dir, "val"), block, name="val")
    targets = torch.cat([ds[i][1] for i in range(min(windows, len(ds)))]).tolist()
    return len(targets), sum(len(tokenizer.decode_bytes([t])) for t in targets)


def _train(train_in_process, root, name, overrides):
    """A debug=smoke run in this process (what it writes is under test here, not the command's process: that is
    test_bad_vocabulary_is_one_line_before_any_work), in a run folder laid out as the command lays one out."""
    run_dir = root / "outputs" / name / "run"
    train_in_process(
        [
            "debug=smoke",
            f"run_name={name}",
            f"paths.output_root={root}/outputs",
            f"paths.data_root={root}/data",
            *overrides,
        ],
        run_dir,
    )
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    return run_dir


@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory, train_in_process):
    root = tmp_path_factory.mktemp("bpe")
    corpus = root / "multi.txt"
    corpus.write_text(_corpus(), encoding="utf-8")
    run_dir = _train(
        train_in_process,
        root,
        "bpe",
        [
            "data=text",
            f"data.source={corpus}",
            "tokenizer=bpe",
            "tokenizer.vocab_size=400",
            "model=llama_tiny",
        ],
    )
    (data_dir,) = (root / "data").iterdir()
    return root, run_dir, data_dir


def test_trained_bpe_round_trips_text_of_several_scripts(bpe_run):
    _, _, data_dir = bpe_run
    tok = load_tokenizer(data_dir)
    assert tok.name == "bpe" and tok.vocab_size == 400
    text = _corpus(20, seed=7) + "Ελληνικά 🙂 кириллица 汉字\r\n"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert len(ids) < len(text.encode())  # merges learnt on the corpus: fewer tokens than bytes
    assert all(len(tok.decode_bytes([i])) >= 1 for i in set(ids))


def test_bpe_run_logs_bits_per_byte_of_the_validation_bytes(bpe_run, tb_events):
    _, run_dir, data_dir = bpe_run
    ea = tb_events(run_dir)
    assert "val/bpb" in ea.Tags()["scalars"]
    loss, bpb = ea.Scalars("val/loss")[-1].value, ea.Scalars("val/bpb")[-1].value
    # smoke: 2 validation batches of 4 windows of the model's 64 tokens
    n, nbytes = _val_bytes(data_dir, load_tokenizer(data_dir), 64, 8)
    assert bpb == pytest.approx(loss * n / (math.log(2) * nbytes), rel=1e-5)
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert read_record(ckpt).data_identity["tokenizer"] == "bpe"


@pytest.mark.slow
def test_resume_reuses_the_saved_tokenizer(bpe_run, run_cli):
    root, run_dir, data_dir = bpe_run
    (saved,) = data_dir.glob("tokens-*/bpe.json")
    before = saved.stat().st_mtime_ns
    proc = run_cli.train(
        [
            "debug=smoke",
            "run_name=bpe",
            "ckpt_path=last",
            "trainer.max_steps=9",
            "data=text",
            f"data.source={root / 'multi.txt'}",
            "tokenizer=bpe",
            "tokenizer.vocab_size=400",
            "model=llama_tiny",
            f"paths.output_root={root}/outputs",
            f"paths.data_root={root}/data",
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "training a byte-level BPE" not in proc.stdout + proc.stderr  # the data was up to date
    assert saved.stat().st_mtime_ns == before
    resumed = max((root / "outputs" / "bpe").iterdir(), key=lambda p: p.stat().st_mtime_ns)
    assert resumed != run_dir
    assert torch.load(resumed / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 9


@pytest.mark.slow
def test_sample_eval_and_attention_with_the_trained_bpe(bpe_run, run_cli, tmp_path):
    _, run_dir, data_dir = bpe_run
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    proc = run_cli(
        "gptmini.inference.sample", ["--ckpt", ckpt, "--prompt", "Καλημέρα", "--max-new-tokens", "8"]
    )
    assert proc.returncode == 0, proc.stderr
    assert "Καλημέρα" in proc.stdout
    proc = run_cli("gptmini.inference.evaluate", ["--ckpt", ckpt, "--out", tmp_path / "eval.json"])
    assert proc.returncode == 0, proc.stderr
    assert "bits per byte" in proc.stderr + proc.stdout
    result = json.loads((tmp_path / "eval.json").read_text())
    n, nbytes = _val_bytes(data_dir, load_tokenizer(data_dir), 64, 10**9)
    assert result["tokens"] == n
    assert result["bpb"] == pytest.approx(result["loss"] * n / (math.log(2) * nbytes), rel=1e-6)
    out = tmp_path / "png"
    proc = run_cli(
        "gptmini.inference.export_attention", ["--ckpt", ckpt, "--text", "Привет, мир!", "--out", out]
    )
    assert proc.returncode == 0, proc.stderr
    labels = json.loads(next(out.glob("*.json")).read_text())["tokens"]
    # every label readable: a token holding part of a character shows its bytes, never U+FFFD
    tok = load_tokenizer(data_dir)
    ids = tok.encode("Привет, мир!")
    assert "\ufffd" not in "".join(labels) and len(labels) == len(ids)
    for label, i in zip(labels, ids, strict=True):
        raw = tok.decode_bytes([i])
        try:
            assert label.replace("·", " ") == raw.decode("utf-8")
        except UnicodeDecodeError:  # part of a character: its bytes, written out
            assert label == "".join(f"\\x{b:02x}" for b in raw)


def test_llama_export_tokenizer_gives_the_same_ids_and_imports_back(bpe_run, tmp_path):
    os.environ["HF_HUB_OFFLINE"] = "1"
    transformers = pytest.importorskip("transformers")
    from gptmini.hf.cli import main
    from gptmini.runs.loading import open_run

    _, run_dir, data_dir = bpe_run
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    assert main(["export", "--format", "llama", "--ckpt", str(ckpt), "--out", str(tmp_path / "hf")]) == 0
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    ours = load_tokenizer(data_dir)
    text = _corpus(40, seed=3) + "  mixed: ASCII 123, ünï, 🙂\n\n"
    ids = ours.encode(text)
    assert hf_tok(text)["input_ids"] == ids
    assert hf_tok.decode(ids) == text and hf_tok.eos_token_id == ours.eot_id
    back = tmp_path / "back.ckpt"
    assert (
        main(["import", "--hf", str(tmp_path / "hf"), "--out", str(back), "--data-dir", str(data_dir)]) == 0
    )
    model = open_run(ckpt, "cpu", tokenizer=False).model
    again = open_run(back, "cpu")
    x = torch.tensor([ids[:32]])
    assert torch.equal(again.model(x)[0], model(x)[0])
    assert again.tokenizer.name == "bpe" and again.tokenizer.encode(text) == ids


def test_gpt2_export_with_the_trained_bpe(bpe_run, tmp_path, write_checkpoint):
    os.environ["HF_HUB_OFFLINE"] = "1"
    transformers = pytest.importorskip("transformers")
    from gptmini.hf.cli import main
    from gptmini.runs.loading import open_run

    _, _, data_dir = bpe_run
    ckpt = write_checkpoint(tmp_path / "gpt2.ckpt", data_dir=data_dir, block_size=32, n_embd=16)
    # a trained BPE's files go with a GPT-2 export by default; --tokenizer none writes the weights alone
    assert main(["export", "--ckpt", str(ckpt), "--out", str(tmp_path / "bare"), "--tokenizer", "none"]) == 0
    assert not (tmp_path / "bare" / "tokenizer.json").exists()
    assert main(["export", "--ckpt", str(ckpt), "--out", str(tmp_path / "default")]) == 0
    assert (tmp_path / "default" / "tokenizer.json").is_file()
    assert main(["export", "--ckpt", str(ckpt), "--out", str(tmp_path / "hf"), "--tokenizer", "auto"]) == 0
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    ours = load_tokenizer(data_dir)
    text = _corpus(10, seed=5) + "ASCII too, 42!\n"
    ids = ours.encode(text)
    assert hf_tok(text)["input_ids"] == ids and hf_tok.decode(ids) == text
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    assert hf.config.eos_token_id == ours.eot_id
    model = open_run(ckpt, "cpu", tokenizer=False).model
    x = torch.tensor([ids[:32]])
    torch.testing.assert_close(hf(x).logits[..., : ours.vocab_size], model(x)[0][..., : ours.vocab_size])


@pytest.mark.parametrize("tokenizer", ["char", pytest.param("gpt2", marks=pytest.mark.slow)])
def test_char_and_gpt2_runs_log_bits_per_byte(tokenizer, tmp_path, train_in_process, tb_events):
    """ASCII text: for characters a token is a byte, so bits per byte is the loss over ln 2."""
    corpus = tmp_path / "ascii.txt"
    rng = random.Random(1)
    words = ["the", "sea", "is", "calm", "and", "bright", "today", "over", "town"]
    corpus.write_text("".join(" ".join(rng.choice(words) for _ in range(9)) + ".\n" for _ in range(1500)))
    run_dir = _train(
        train_in_process,
        tmp_path,
        tokenizer,
        ["data=text", f"data.source={corpus}", f"tokenizer={tokenizer}"],
    )
    ea = tb_events(run_dir)
    loss, bpb = ea.Scalars("val/loss")[-1].value, ea.Scalars("val/bpb")[-1].value
    if tokenizer == "char":
        assert bpb == pytest.approx(loss / math.log(2), rel=1e-5)
    else:
        (data_dir,) = (tmp_path / "data").iterdir()
        n, nbytes = _val_bytes(data_dir, load_tokenizer(data_dir), 32, 8)
        assert nbytes > n  # GPT-2's tokens are several bytes each
        assert bpb == pytest.approx(loss * n / (math.log(2) * nbytes), rel=1e-5)


def test_bad_vocabulary_is_one_line_before_any_work(tmp_path, gptmini_train):
    corpus = tmp_path / "c.txt"
    corpus.write_text(_corpus(50))
    proc = gptmini_train(
        [
            "debug=smoke",
            "data=text",
            f"data.source={corpus}",
            "tokenizer=bpe",
            "tokenizer.vocab_size=100",
            f"paths.data_root={tmp_path}/data",
            f"paths.output_root={tmp_path}/out",
        ]
    )
    assert proc.returncode == 2
    out = proc.stdout + proc.stderr
    assert "tokenizer.vocab_size=100 is out of range" in out and "Traceback" not in out
    assert len(re.findall(r"\berror: ", out)) == 1, out
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["tokenizer=bpe", "tokenizer.vocab_size=256"], "tokenizer.vocab_size=256 is out of range"),
        (["tokenizer=bpe", "tokenizer.train_bytes=0"], "tokenizer.train_bytes=0 is invalid"),
        (["tokenizer=gpt2", "tokenizer.vocab_size=4096"], "applies to tokenizer=bpe only"),
        (["tokenizer=char", "tokenizer.train_bytes=1000"], "applies to tokenizer=bpe only"),
    ],
)
def test_config_checks_name_the_tokenizer_key(overrides, message, compose_cfg):
    from gptmini.training.errors import RunError
    from gptmini.training.run.plan import plan_run

    with pytest.raises(RunError, match=message):
        plan_run(compose_cfg(overrides))


def test_bpe_settings_reach_the_data_and_size_the_model(compose_cfg):
    from gptmini.training.run.plan import plan_run

    data = plan_run(
        compose_cfg(["tokenizer=bpe", "tokenizer.vocab_size=4096"])
    ).data  # derived by the plan from the tokenizer group
    assert (data.tokenizer, data.tokenizer_vocab_size, data.tokenizer_train_bytes) == (
        "bpe",
        4096,
        100_000_000,
    )
    # an exact bigram table, sized by the vocabulary squared, is sized by the BPE's before the data is prepared
    bigram = ["tokenizer=bpe", "tokenizer.vocab_size=512", "model.bigram_embed=true"]
    assert plan_run(compose_cfg(bigram)).model.vocab_size == 512
    default = plan_run(compose_cfg([])).data
    assert default.tokenizer_vocab_size is None and default.tokenizer_train_bytes is None
