import json
import logging
import pickle
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from gptmini.data import prepare as data
from gptmini.data.prepare import (
    DataError,
    RandomWindowDataset,
    StreamSampler,
    StridedWindowDataset,
    TokenDataModule,
    check_vocab,
    load_meta,
    load_split,
    load_tokenizer,
    prepare,
)
from gptmini.data.tokenizers import TiktokenTokenizer

SMALL = "".join(f"SPEAKER {i % 7}:\nLine number {i}, with words; and more words!\n\n" for i in range(400))


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "small.txt"
    path.write_text(SMALL, encoding="utf-8")
    return path


def _snapshot(folder):
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in folder.iterdir() if p.is_file()}


# ---------------------------------------------------------------------------------------------- corpus


def test_shakespeare_text_is_clean_and_deterministic():
    a = data.shakespeare_text()
    b = data.shakespeare_text()
    assert a == b
    assert len(a) > 4_000_000
    assert a.startswith("THESEUS:\nNow, fair Hippolyta, our nuptial hour\n")
    assert "**" not in a and "_" not in a and "\\" not in a
    assert not any(line.startswith("#") for line in a.splitlines())
    assert "\n\nHAMLET:\n" in a
    assert "  \n" not in a


def test_prepare_shakespeare_gpt2(tmp_path):
    result = prepare("shakespeare", "gpt2", tmp_path / "sh")
    meta = result.meta
    assert not result.skipped and meta["dtype"] == "uint16" and meta["vocab_size"] == 50257
    train, val = load_split(result.out_dir, "train"), load_split(result.out_dir, "val")
    assert isinstance(train, np.memmap) and train.dtype == np.uint16
    assert len(train) == result.train_tokens > 1_000_000
    assert abs(len(val) / (len(train) + len(val)) - 0.1) < 1e-3
    tok = load_tokenizer(result.out_dir)
    assert tok.decode(np.concatenate([train, val]).tolist()) == data.shakespeare_text()
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
        chunks = data.split_for_encoding(text, chunk_chars)
        assert "".join(chunks) == text
        assert [i for c in tok.encode_batch(chunks) for i in c] == tok.encode(text)
    assert data.encode_text(tok, text).tolist() == tok.encode(text)


# ---------------------------------------------------------------------------------------------- prepare


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
    real_write = data._write_array

    def crash_after_train(path, array):
        real_write(path, array)
        if path.name == "train.bin":
            raise RuntimeError("simulated crash")

    monkeypatch.setattr(data, "_write_array", crash_after_train)
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

    monkeypatch.setattr(data, "_write_array", real_write)
    assert not prepare(str(corpus), "gpt2", out).skipped
    assert load_meta(out)["source_chars"] == 2 * len(SMALL)


def test_sources_dir_glob_and_default_out(tmp_path, monkeypatch):
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "b.txt").write_text("second\n")
    (docs / "a.txt").write_text("first")
    (docs / "sub" / "c.txt").write_text("third\n")
    (docs / "skip.md").write_text("not text")
    assert data.read_source(str(docs)) == "first\n\nsecond\n\nthird\n"
    assert data.read_source(str(docs / "*.txt")) == "first\n\nsecond\n"
    assert data.source_name(str(docs / "*.txt")) == "docs"
    monkeypatch.chdir(tmp_path)
    result = prepare(str(docs / "a.txt"), "char", val_fraction=0.0)
    assert result.out_dir.as_posix() == "data/a_char" and result.val_tokens == 0
    assert len(load_split(result.out_dir, "val")) == 0


def test_uint32_for_large_vocabularies(corpus, tmp_path, monkeypatch):
    assert data.token_dtype(50257) == np.uint16 and data.token_dtype(65536) == np.uint16
    assert data.token_dtype(65537) == np.uint32 and data.token_dtype(200_019) == np.uint32

    class BigVocab:
        name, vocab_size, eot_id = "cl100k_base", 100_277, 100_257

        def encode_batch(self, texts, num_threads=None):
            return [[70_000 + ord(c) for c in t] for t in texts]

        def to_dict(self):
            return {"kind": "test", "name": self.name, "vocab_size": self.vocab_size, "eot_id": self.eot_id}

    monkeypatch.setattr(data, "build_tokenizer", lambda name, vocab_path=None: BigVocab())
    result = prepare(str(corpus), "cl100k_base", tmp_path / "big")
    train = load_split(result.out_dir, "train")
    assert result.meta["dtype"] == "uint32" and train.dtype == np.uint32
    assert int(train[0]) == 70_000 + ord(SMALL[0])


# ------------------------------------------------------------------------------------------------ errors


def test_missing_and_empty_and_bad_sources(tmp_path):
    with pytest.raises(DataError, match="'nope.txt' not found"):
        prepare("nope.txt", "char", tmp_path / "o")
    empty = tmp_path / "empty.txt"
    empty.write_text(" \n\n\t")
    with pytest.raises(DataError, match="is empty"):
        prepare(str(empty), "char", tmp_path / "o")
    (tmp_path / "nodocs").mkdir()
    with pytest.raises(DataError, match=r"no \*\.txt files"):
        prepare(str(tmp_path / "nodocs"), "char", tmp_path / "o")
    with pytest.raises(DataError, match="matches no files"):
        prepare(str(tmp_path / "*.nothing"), "char", tmp_path / "o")
    with pytest.raises(DataError, match="val_fraction must be in"):
        prepare(str(empty), "char", tmp_path / "o", val_fraction=1.0)


def test_undecodable_bytes_name_file_and_offset(tmp_path):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"caf" + b"\xe9 au lait\n")
    with pytest.raises(DataError, match=r"latin1\.txt is not valid UTF-8: byte offset 3"):
        prepare(str(bad), "char", tmp_path / "o")


def test_url_source_offline_and_cached(tmp_path):
    url = "http://127.0.0.1:9/corpus.txt"  # discard port: connection refused, no real network needed
    with pytest.raises(DataError, match=r"cannot download http://127\.0\.0\.1:9/corpus\.txt"):
        prepare(url, "char", tmp_path / "u")
    assert not any((tmp_path / "u" / "raw").iterdir())  # no partial download left
    (tmp_path / "u" / "raw" / "corpus.txt").write_text(SMALL)
    assert prepare(url, "char", tmp_path / "u").train_tokens > 0
    assert data.source_name(url) == "corpus"


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


def test_split_too_short_for_block_size():
    tokens = np.arange(10, dtype=np.uint16)
    with pytest.raises(
        DataError, match=r"split 'val' has 10 tokens but block_size=10 needs at least 11.*val_fraction"
    ):
        StridedWindowDataset(tokens, 10, name="val")
    with pytest.raises(DataError, match="split 'train' has 10 tokens"):
        RandomWindowDataset(tokens, 64, num_samples=4)


def test_check_vocab():
    check_vocab(50304, {"tokenizer": "gpt2", "vocab_size": 50257})
    with pytest.raises(
        DataError, match=r"model vocab_size 50000 is smaller than tokenizer 'gpt2' vocab_size 50257"
    ):
        check_vocab(50000, {"tokenizer": "gpt2", "vocab_size": 50257})


# ---------------------------------------------------------------------------------------------- windows


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "tokens.bin"
    np.arange(10_000, dtype=np.uint16).tofile(path)
    return np.memmap(path, dtype=np.uint16, mode="r")


def test_random_windows_line_up_and_are_deterministic(token_file):
    ds = RandomWindowDataset(token_file, block_size=16, num_samples=10_000, seed=7)
    for i in (0, 1, 4095, 4096, 9999, 123_456):  # indices past len are valid (later epochs)
        x, y = ds[i]
        s = ds.start(i)
        assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (16,)
        assert torch.equal(x[1:], y[:-1])
        assert (
            x.tolist() == token_file[s : s + 16].tolist()
            and y.tolist() == token_file[s + 1 : s + 17].tolist()
        )
    other = RandomWindowDataset(token_file, block_size=16, num_samples=10_000, seed=7)
    order = [9999, 3, 5000, 3]
    assert [other.start(i) for i in order] == [ds.start(i) for i in order]  # any order, any instance
    starts = [ds.start(i) for i in range(5000)]
    assert min(starts) >= 0 and max(starts) <= 10_000 - 17 and len(set(starts)) > 3000
    reseeded = RandomWindowDataset(token_file, block_size=16, num_samples=10_000, seed=8)
    assert [reseeded.start(i) for i in range(50)] != starts[:50]
    clone = pickle.loads(pickle.dumps(ds))
    assert isinstance(clone.tokens, np.memmap) and torch.equal(clone[42][0], ds[42][0])


def test_strided_windows_cover_the_split(token_file):
    tokens = token_file[:1000]
    for block, stride in ((16, None), (16, 5), (33, 33), (999, None)):
        ds = StridedWindowDataset(tokens, block, stride)
        targets = set()
        for i in range(len(ds)):
            x, y = ds[i]
            assert torch.equal(x[1:], y[:-1])
            targets.update(y.tolist())
        assert targets == set(range(1, 1000))
        assert [int(s) for s in StridedWindowDataset(tokens, block, stride).starts] == [
            int(s) for s in ds.starts
        ]
    assert StridedWindowDataset(tokens, 100).starts.tolist() == [*range(0, 900, 100), 899]


def test_stream_sampler():
    sampler = StreamSampler(10)
    assert list(sampler) == list(range(10)) and len(sampler) == 10
    sampler.set_epoch(2)
    assert list(sampler) == list(range(20, 30))
    assert list(StreamSampler(4, start=lambda: 13)) == [13, 14, 15, 16]
    assert list(StreamSampler(4, start=lambda: None)) == [0, 1, 2, 3]


# ------------------------------------------------------------------------------------------- datamodule


def test_datamodule_batches_and_resume_position(corpus, tmp_path):
    kwargs = dict(
        source=str(corpus), tokenizer="char", data_dir=tmp_path / "dm", block_size=32, batch_size=4, seed=3
    )
    dm = TokenDataModule(**kwargs)
    dm.prepare_data()
    dm.setup("fit")
    assert dm.vocab_size == len(set(SMALL)) and dm.tokenizer().decode(dm.tokenizer().encode("Line")) == "Line"
    batches = [b for _, b in zip(range(5), dm.train_dataloader(), strict=False)]
    x, y = batches[0]
    assert x.shape == y.shape == (4, 32) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    val1 = [torch.cat(b) for b in dm.val_dataloader()]
    val2 = [torch.cat(b) for b in dm.val_dataloader()]
    assert len(val1) > 0 and all(torch.equal(a, b) for a, b in zip(val1, val2, strict=False))

    # A module whose trainer has trained 3 batches continues with batch 4 (this is what a resume sees).
    resumed = TokenDataModule(**kwargs)
    resumed.setup("fit")
    resumed.trainer = SimpleNamespace(
        global_rank=0,
        world_size=1,
        fit_loop=SimpleNamespace(
            epoch_loop=SimpleNamespace(batch_progress=SimpleNamespace(total=SimpleNamespace(processed=3)))
        ),
    )
    first = next(iter(resumed.train_dataloader()))
    assert torch.equal(first[0], batches[3][0]) and torch.equal(first[1], batches[3][1])
    assert len(resumed.train_dataloader()) == len(dm.train_dataloader())


def test_datamodule_with_workers(corpus, tmp_path):
    kwargs = dict(block_size=8, batch_size=2, train_samples=12)
    dm = TokenDataModule(str(corpus), "char", tmp_path / "dm", num_workers=2, **kwargs)
    dm.prepare_data()
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert loader.persistent_workers and loader.pin_memory == torch.cuda.is_available()
    single = TokenDataModule(str(corpus), "char", tmp_path / "dm", **kwargs)
    single.setup("fit")
    # Read every batch: abandoning a persistent-worker iterator mid-epoch makes its shutdown slow.
    got, want = list(loader), list(single.train_dataloader())
    assert len(got) == len(want) == 6
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(got, want, strict=True))
    # Stop the persistent workers here: left to a later GC pass, their shutdown can stall for seconds.
    loader._iterator._shutdown_workers()


# ----------------------------------------------------------------------------------------------- CLI


def test_cli(corpus, tmp_path, caplog):
    out = tmp_path / "cli"
    with caplog.at_level(logging.INFO, logger="gptmini.data.prepare"):
        assert data.main(["--source", str(corpus), "--tokenizer", "char", "--out", str(out)]) == 0
        assert data.main(["--source", str(corpus), "--tokenizer", "char", "--out", str(out)]) == 0
    lines = [r.getMessage() for r in caplog.records]
    assert lines[-2].startswith("prepared ") and lines[-1].startswith("skipped (up to date) ")
    assert "train" in lines[-1] and "val" in lines[-1]
    assert data.main(["--source", str(tmp_path / "missing.txt"), "--out", str(out)]) == 2


class _TinyLM:
    """A minimal LightningModule factory (built lazily so collecting this file stays cheap)."""

    @staticmethod
    def make(vocab_size: int):
        import lightning as L

        class Tiny(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.emb = torch.nn.Embedding(vocab_size, 8)
                self.seen: list[tuple[int, list[int]]] = []

            def training_step(self, batch, batch_idx):
                x, y = batch
                self.seen.append((self.global_step, x[:, 0].tolist()))
                logits = self.emb(x) @ self.emb.weight.T
                return torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        return Tiny()


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore:.*LeafSpec")
def test_trainer_resume_continues_the_exact_batch_stream(corpus, tmp_path):
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    def fit(max_steps, ckpt_dir, ckpt_path=None):
        # 12 samples / batch 4 = 3 batches per epoch, so the runs cross epoch boundaries.
        dm = TokenDataModule(
            str(corpus), "char", tmp_path / "dm", block_size=8, batch_size=4, train_samples=12
        )
        dm.prepare_data()
        dm.setup("fit")
        model = _TinyLM.make(dm.vocab_size)
        trainer = L.Trainer(
            max_steps=max_steps,
            callbacks=[ModelCheckpoint(str(ckpt_dir), "{step}", every_n_train_steps=1, save_top_k=-1)],
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            limit_val_batches=0,
        )
        trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
        return model.seen

    straight = fit(7, tmp_path / "a")
    for step in (4, 6):  # mid-epoch and end-of-epoch checkpoints
        resumed = fit(7, tmp_path / f"r{step}", tmp_path / "a" / f"step={step}.ckpt")
        assert resumed == straight[step:]


def test_stream_and_shard_samplers_split_one_stream_across_ranks():
    from gptmini.data.prepare import ShardSampler, StreamSampler

    single = list(StreamSampler(12, start=lambda: 24))
    ranks = [list(StreamSampler(12, start=lambda: 24, rank=r, world_size=2)) for r in range(2)]
    assert single == list(range(24, 36))
    assert sorted(ranks[0] + ranks[1]) == single and ranks[0][:2] == [24, 26]
    assert len(StreamSampler(13, rank=1, world_size=2)) == 6
    shards = [list(ShardSampler(7, r, 3)) for r in range(3)]
    assert sorted(sum(shards, [])) == list(range(7))  # every validation window exactly once, no padding
