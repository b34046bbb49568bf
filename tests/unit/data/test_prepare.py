"""Encoding a corpus into token files, the prepared folder's validation, and the ``gptmini-prepare`` CLI."""

import json
import logging
import random
import subprocess
import sys

import numpy as np
import pytest

from gptmini.data import prepare as prep  # the module, for monkeypatching its globals
from gptmini.data.corpora import shakespeare_text
from gptmini.data.errors import DataError
from gptmini.data.prepare import check_vocab, load_meta, load_split, load_tokenizer, prepare
from gptmini.data.tokenizers import TiktokenTokenizer

SMALL = "".join(f"SPEAKER {i % 7}:\nLine number {i}, with words; and more words!\n\n" for i in range(400))


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "small.txt"
    path.write_text(SMALL, encoding="utf-8")
    return path


def _snapshot(folder):
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in folder.iterdir() if p.is_file()}


def test_prepare_shakespeare_gpt2(tmp_path):
    result = prepare("shakespeare", "gpt2", tmp_path / "sh")
    meta = result.meta
    assert not result.skipped and meta["dtype"] == "uint16" and meta["vocab_size"] == 50257
    train, val = load_split(result.out_dir, "train"), load_split(result.out_dir, "val")
    assert isinstance(train, np.memmap) and train.dtype == np.uint16
    assert len(train) == result.train_tokens > 1_000_000
    assert abs(len(val) / (len(train) + len(val)) - 0.1) < 1e-3
    tok = load_tokenizer(result.out_dir)
    assert tok.decode(np.concatenate([train, val]).tolist()) == shakespeare_text()
    assert prepare("shakespeare", "gpt2", tmp_path / "sh").skipped


def test_chunked_encoding_equals_single_shot():
    rng = random.Random(0)
    pieces = [
        "word",
        " word",
        "  ",
        "\n",
        "\n\n",
        "\n \n",
        " \t",
        "é",
        "漢字",
        "👋",
        "'s",
        "123",
        "!?",
        "<|endoftext|>",
    ]
    text = "".join(rng.choice(pieces) for _ in range(5000))
    tok = TiktokenTokenizer("gpt2")
    for chunk_chars in (1, 7, 64, 10_000):
        chunks = prep.split_for_encoding(text, chunk_chars)
        assert "".join(chunks) == text
        assert [i for c in tok.encode_batch(chunks) for i in c] == tok.encode(text)
    assert prep.encode_text(tok, text).tolist() == tok.encode(text)


def test_prepare_writes_meta_and_is_idempotent(corpus, tmp_path):
    out = tmp_path / "out"
    first = prepare(str(corpus), "char", out)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["tokenizer"] == "char" and meta["vocab_file"] == "vocab.json" and meta["eot_id"] is None
    assert meta["splits"]["train"]["tokens"] + meta["splits"]["val"]["tokens"] == len(SMALL)
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "train.bin", "val.bin", "vocab.json"]
    before = _snapshot(out)
    second = prepare(str(corpus), "char", out)
    assert second.skipped and not first.skipped and _snapshot(out) == before
    assert load_tokenizer(out).decode(load_split(out, "train").tolist()) == SMALL[: first.train_tokens]
    # Anything that changes the result re-prepares.
    assert not prepare(str(corpus), "char", out, force=True).skipped
    assert not prepare(str(corpus), "char", out, val_fraction=0.2).skipped
    assert not prepare(str(corpus), "gpt2", out).skipped
    assert not (out / "vocab.json").exists()
    corpus.write_text(SMALL + "more\n")
    assert not prepare(str(corpus), "gpt2", out).skipped


def test_prepare_reruns_when_files_are_damaged(corpus, tmp_path):
    out = tmp_path / "out"
    prepare(str(corpus), "gpt2", out)
    with open(out / "val.bin", "ab") as f:
        f.write(b"\0\0")
    assert not prepare(str(corpus), "gpt2", out).skipped
    assert prepare(str(corpus), "gpt2", out).skipped


def test_interrupted_prepare_keeps_previous_data(corpus, tmp_path, monkeypatch):
    out = tmp_path / "out"
    prepare(str(corpus), "gpt2", out)
    old = _snapshot(out)
    real_write = prep.atomic_write

    def crash_after_train(path, write):  # train.bin fully written, then the process dies
        real_write(path, write)
        if path.name == "train.bin":
            raise RuntimeError("simulated crash")

    monkeypatch.setattr(prep, "atomic_write", crash_after_train)
    corpus.write_text(SMALL * 2)
    with pytest.raises(RuntimeError, match="simulated crash"):
        prepare(str(corpus), "gpt2", out)
    assert _snapshot(out) == old  # previous data intact, no temp folder left
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "train.bin", "val.bin"]

    fresh = tmp_path / "fresh"
    with pytest.raises(RuntimeError):
        prepare(str(corpus), "gpt2", fresh)
    assert not (fresh / "meta.json").exists()
    with pytest.raises(DataError, match="not a prepared data folder"):
        load_split(fresh, "train")

    monkeypatch.setattr(prep, "atomic_write", real_write)
    assert not prepare(str(corpus), "gpt2", out).skipped
    assert load_meta(out)["source_chars"] == 2 * len(SMALL)


def test_uint32_for_large_vocabularies(corpus, tmp_path, monkeypatch):
    assert prep.token_dtype(50257) == np.uint16 and prep.token_dtype(65536) == np.uint16
    assert prep.token_dtype(65537) == np.uint32 and prep.token_dtype(200_019) == np.uint32

    class BigVocab:
        name, vocab_size, eot_id = "cl100k_base", 100_277, 100_257

        def encode_batch(self, texts, num_threads=None):
            return [[70_000 + ord(c) for c in t] for t in texts]

        def to_dict(self):
            return {"kind": "test", "name": self.name, "vocab_size": self.vocab_size, "eot_id": self.eot_id}

    monkeypatch.setattr(prep, "build_tokenizer", lambda name, vocab_path=None: BigVocab())
    result = prepare(str(corpus), "cl100k_base", tmp_path / "big")
    train = load_split(result.out_dir, "train")
    assert result.meta["dtype"] == "uint32" and train.dtype == np.uint32
    assert int(train[0]) == 70_000 + ord(SMALL[0])


def test_size_and_dtype_mismatch_refused(corpus, tmp_path):
    out = prepare(str(corpus), "gpt2", tmp_path / "o").out_dir
    with open(out / "train.bin", "r+b") as f:
        f.truncate(f.seek(0, 2) - 1)
    with pytest.raises(DataError, match=r"train\.bin has \d+ bytes but meta\.json says \d+ uint16"):
        load_split(out, "train")
    meta = json.loads((out / "meta.json").read_text())
    (out / "meta.json").write_text(json.dumps({**meta, "dtype": "float32"}))
    with pytest.raises(DataError, match="dtype 'float32'"):
        load_split(out, "val")
    (out / "meta.json").write_text("not json")
    with pytest.raises(DataError, match="not readable JSON"):
        load_meta(out)


def test_check_vocab():
    check_vocab(50304, {"tokenizer": "gpt2", "vocab_size": 50257})
    with pytest.raises(
        DataError, match=r"model vocab_size 50000 is smaller than tokenizer 'gpt2' vocab_size 50257"
    ):
        check_vocab(50000, {"tokenizer": "gpt2", "vocab_size": 50257})


def test_cli(corpus, tmp_path, caplog):
    out = tmp_path / "cli"
    with caplog.at_level(logging.INFO, logger="gptmini.data.prepare"):
        assert prep.main(["--source", str(corpus), "--tokenizer", "char", "--out", str(out)]) == 0
        assert prep.main(["--source", str(corpus), "--tokenizer", "char", "--out", str(out)]) == 0
    lines = [r.getMessage() for r in caplog.records]
    assert lines[-2].startswith("prepared ") and lines[-1].startswith("skipped (up to date) ")
    assert "train" in lines[-1] and "val" in lines[-1]
    assert prep.main(["--source", str(tmp_path / "missing.txt"), "--out", str(out)]) == 2


def test_package_exports_the_light_api_without_torch_or_lightning():
    # A fresh interpreter: this one has torch loaded already. The CLI and the config checks rely on this.
    code = (
        "import sys, gptmini.data.corpora, gptmini.data.prepare\n"
        "from gptmini.data.prepare import DataError, load_split, prepare\n"
        "assert callable(prepare) and DataError is sys.modules['gptmini.data.errors'].DataError\n"
        "assert not {'torch', 'lightning'} & set(sys.modules), sorted({'torch', 'lightning'} & set(sys.modules))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
