"""Encoding a corpus into token shards, the up-to-date check, resuming, the prepared folder's validation, and the
``gptmini data`` command line."""

import hashlib
import json
import logging
import pickle
import random
import subprocess
import sys
import threading

import numpy as np
import pytest

from benchmarks.common import shakespeare_text
from gptmini.data import corpora
from gptmini.data import prepare as prep  # the module, for monkeypatching its globals
from gptmini.data import progress as progress_module
from gptmini.data.corpora import Fragment
from gptmini.data.encoding import pieces, split_for_encoding, token_dtype
from gptmini.data.errors import DataError
from gptmini.data.prepare import prepare
from gptmini.data.reader import check_vocab, data_identity, load_meta, load_split, load_tokenizer
from gptmini.data.shards import ShardWriter, TokenStream
from gptmini.data.tokenizers import TiktokenTokenizer, gpt2_encoding

SMALL = "".join(f"SPEAKER {i % 7}:\nLine number {i}, with words; and more words!\n\n" for i in range(400))


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "small.txt"
    path.write_text(SMALL, encoding="utf-8")
    return path


def _snapshot(folder):
    return {
        p.relative_to(folder).as_posix(): (p.stat().st_mtime_ns, p.read_bytes())
        for p in folder.rglob("*")
        if p.is_file()
    }


def _ids(folder):
    return np.concatenate([np.asarray(load_split(folder, s)) for s in ("train", "val")]).tolist()


def test_prepare_shakespeare_gpt2_as_before(tmp_path):
    """The embedded corpus is one continuous text: the ids are tiktoken's for the whole text, the split is
    nanoGPT's, and the data identity is computed from the same fields as before the shards (so checkpoints
    trained on it before still match it)."""
    result = prepare("shakespeare", "gpt2", tmp_path / "sh")
    meta = result.meta
    assert not result.skipped and meta["dtype"] == "uint16" and meta["vocab_size"] == 50257
    train, val = load_split(result.out_dir, "train"), load_split(result.out_dir, "val")
    assert isinstance(train, np.memmap) and train.dtype == np.uint16 and len(meta["shards"]) == 1
    text = shakespeare_text()
    want = gpt2_encoding().encode_ordinary(text)
    assert np.concatenate([train, val]).tolist() == want
    assert (
        len(train) == result.meta["splits"]["train"]["tokens"] == int(len(want) * 0.9)
        and not meta["end_of_text"]
    )
    assert meta["source_sha256"] == hashlib.sha256(text.encode()).hexdigest()
    tokenizer = hashlib.sha256(json.dumps({"tokenizer": "gpt2", "vocab_size": 50257}).encode()).hexdigest()[
        :16
    ]
    fields = {
        "dtype": "uint16",
        "source_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "splits": {"train": len(train), "val": len(val)},
        "tokenizer": tokenizer,
        "val_fraction": 0.1,
    }
    fingerprint = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
    assert data_identity(result.out_dir) | {"data_dir": None} == {
        "fingerprint": fingerprint,
        "tokenizer_fingerprint": tokenizer,
        "data_dir": None,
        "source": "shakespeare",
        "tokenizer": "gpt2",
        "vocab_size": 50257,
    }
    assert prepare("shakespeare", "gpt2", tmp_path / "sh").skipped


def test_pieces_encode_to_the_ids_of_the_whole(caplog):
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
        ".\n",
        "<|endoftext|>",
    ]
    text = "".join(rng.choice(pieces) for _ in range(5000))
    tok = TiktokenTokenizer("gpt2")
    for chunk_chars in (64, 1000, 10_000):
        chunks = split_for_encoding(text, chunk_chars)
        assert "".join(chunks) == text and len(chunks) > len(text) // (4 * chunk_chars)
        assert [i for c in chunks for i in tok.encode(c)] == tok.encode(text)
    assert [i for piece in split_for_encoding(text) for i in tok.encode(piece)] == tok.encode(text)
    assert tok.encode_array(text).tolist() == tok.encode(text)  # "<|endoftext|>" stays ordinary text
    assert "no space or newline" not in caplog.text
    # Text without a cut point is cut at 4x the length anyway, with one warning per document.
    chunks = split_for_encoding("漢字" * 100, 16)
    assert [len(c) for c in chunks] == [64, 64, 64, 8] and caplog.text.count("no space or newline") == 1


def test_cuts_do_not_depend_on_how_the_text_arrives():
    """A resumed preparation must cut exactly where the first one did, whatever the block boundaries."""
    rng = random.Random(1)
    text = "".join(rng.choice(["ab", " ", "\n", "xyz.", "  ", "q" * 50]) for _ in range(20_000))
    whole = list(pieces(iter([Fragment(0, text, 0, True)]), 64))
    for _ in range(5):
        cuts = sorted(rng.sample(range(1, len(text)), 300))
        bounds = [0, *cuts, len(text)]
        frags = [Fragment(0, text[a:b], 0, b == len(text)) for a, b in zip(bounds, bounds[1:], strict=False)]
        assert list(pieces(iter(frags), 64)) == whole
    assert "".join(p.text for p in whole) == text and whole[-1].end and not any(p.end for p in whole[:-1])
    assert [p.offset for p in whole] == list(np.cumsum([0] + [len(p.text) for p in whole[:-1]]))


def test_prepare_writes_meta_and_is_idempotent(corpus, tmp_path):
    out = tmp_path / "out"
    first = prepare(str(corpus), "char", out)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["tokenizer"] == "char" and meta["eot_id"] is None and meta["format_version"] == 2
    assert meta["vocab_file"] == f"{meta['shard_dir']}/vocab.json"
    assert meta["splits"]["train"]["tokens"] + meta["splits"]["val"]["tokens"] == len(SMALL) == meta["tokens"]
    assert sorted(p.name for p in out.iterdir()) == [".lock", "meta.json", meta["shard_dir"]]
    assert sorted(p.name for p in (out / meta["shard_dir"]).iterdir()) == ["shard_000000.bin", "vocab.json"]
    before = _snapshot(out)
    second = prepare(str(corpus), "char", out)
    assert second.skipped and not first.skipped and _snapshot(out) == before
    assert (
        load_tokenizer(out).decode(load_split(out, "train").tolist())
        == SMALL[: first.meta["splits"]["train"]["tokens"]]
    )
    # Anything that changes the result re-prepares; the folder of the replaced data goes.
    assert not prepare(str(corpus), "char", out, force=True).skipped
    assert not prepare(str(corpus), "gpt2", out).skipped
    assert [p.name for p in out.glob("tokens-*")] == [load_meta(out)["shard_dir"]]
    corpus.write_text(SMALL + "more\n")
    assert not prepare(str(corpus), "gpt2", out).skipped
    assert load_meta(out)["source_chars"] == len(SMALL) + 5


def test_up_to_date_check_reads_no_text(corpus, tmp_path, monkeypatch):
    """Nothing changed: sizes and modification times alone say so. A file touched but unchanged is hashed (and
    found the same); one changed to the same size is hashed and found different. A new val_fraction re-splits
    the tokens already there."""
    import os

    out = prepare(str(corpus), "gpt2", tmp_path / "o").out_dir
    identity = data_identity(out)

    def no_reading(*args, **kwargs):
        raise AssertionError("the corpus was read")

    with monkeypatch.context() as m:
        m.setattr(corpora.Corpus, "fragments", no_reading)
        m.setattr(prep, "file_sha256", no_reading)
        assert prepare(str(corpus), "gpt2", out).skipped
        resplit = prepare(str(corpus), "gpt2", out, val_fraction=0.2)
        assert not resplit.skipped and resplit.meta["splits"]["val"]["tokens"] == resplit.meta[
            "tokens"
        ] - int(0.8 * resplit.meta["tokens"])
        assert data_identity(out)["fingerprint"] != identity["fingerprint"]  # other splits: other data
        assert prepare(str(corpus), "gpt2", out, val_fraction=0.2).skipped
    stat = corpus.stat()
    os.utime(corpus, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    hashed = []
    real = prep.file_sha256
    monkeypatch.setattr(prep, "file_sha256", lambda p: hashed.append(p) or real(p))
    assert prepare(str(corpus), "gpt2", out, val_fraction=0.2).skipped and hashed == [corpus.absolute()]
    assert load_meta(out)["files"][0]["mtime_ns"] == stat.st_mtime_ns + 10**9  # remembered: not hashed again
    assert prepare(str(corpus), "gpt2", out, val_fraction=0.2).skipped and len(hashed) == 1
    corpus.write_text(SMALL.replace("SPEAKER 3", "SPEAKER 4"))  # same size, other text
    again = prepare(str(corpus), "gpt2", out, val_fraction=0.2)
    assert (
        not again.skipped
        and len(hashed) == 2
        and data_identity(out)["fingerprint"] != identity["fingerprint"]
    )


def test_a_folder_of_the_previous_format_is_prepared_again(corpus, tmp_path):
    out = tmp_path / "old"
    out.mkdir()
    np.arange(100, dtype=np.uint16).tofile(out / "train.bin")
    np.arange(10, dtype=np.uint16).tofile(out / "val.bin")
    meta = {"format_version": 1, "dtype": "uint16", "vocab_size": 50257, "tokenizer": "gpt2", "splits": {}}
    (out / "meta.json").write_text(json.dumps(meta))
    result = prepare(str(corpus), "gpt2", out)
    assert not result.skipped and result.meta["format_version"] == 2
    assert not (out / "train.bin").exists() and not (out / "val.bin").exists()
    assert _ids(out) == gpt2_encoding().encode_ordinary(SMALL)


def test_prepare_reruns_when_files_are_damaged(corpus, tmp_path):
    out = tmp_path / "out"
    meta = prepare(str(corpus), "gpt2", out).meta
    with open(out / meta["shard_dir"] / "shard_000000.bin", "ab") as f:
        f.write(b"\0\0")
    assert not prepare(str(corpus), "gpt2", out).skipped
    assert prepare(str(corpus), "gpt2", out).skipped


def test_shards_read_as_one_stream(corpus, tmp_path):
    one = prepare(str(corpus), "gpt2", tmp_path / "one").out_dir
    many = prepare(str(corpus), "gpt2", tmp_path / "many", shard_tokens=1000).out_dir
    meta = load_meta(many)
    assert len(meta["shards"]) == -(-meta["tokens"] // 1000) and meta["tokens"] == load_meta(one)["tokens"]
    assert all(s["tokens"] == 1000 for s in meta["shards"][:-1])
    for split in ("train", "val"):
        a, b = load_split(one, split), load_split(many, split)
        assert isinstance(a, np.memmap) and isinstance(b, TokenStream) and len(a) == len(b)
        assert np.asarray(b).tolist() == a.tolist()
        for start, stop in ((0, 5), (990, 1010), (1500, 3600), (len(a) - 7, len(a))):
            assert b[start:stop].tolist() == a[start:stop].tolist()  # across shard boundaries
        assert (
            b[-1] == a[-1] and b[len(a) // 2] == a[len(a) // 2] and b[10:40:3].tolist() == a[10:40:3].tolist()
        )
        assert pickle.loads(pickle.dumps(b))[995:1005].tolist() == a[995:1005].tolist()
    with pytest.raises(IndexError):
        load_split(many, "val")[10**9]
    assert data_identity(many)["fingerprint"] == data_identity(one)["fingerprint"]


def test_an_interrupted_preparation_keeps_the_old_data_and_resumes(corpus, tmp_path, monkeypatch, caplog):
    out = tmp_path / "out"
    prepare(str(corpus), "gpt2", out, shard_tokens=1000)
    old = _snapshot(out)
    corpus.write_text(SMALL * 2)
    real_finish = ShardWriter._finish
    finished = []

    def crash_after_three(self, position):  # the fourth shard is full, then the process dies
        if len(self.shards) == 3:
            raise RuntimeError("simulated crash")
        real_finish(self, position)
        finished.append(self.shards[-1]["file"])

    monkeypatch.setattr(ShardWriter, "_finish", crash_after_three)
    with pytest.raises(RuntimeError, match="simulated crash"):
        prepare(str(corpus), "gpt2", out, shard_tokens=1000)
    new_dir = next(p for p in out.glob("tokens-*") if p.name != load_meta(out)["shard_dir"])
    assert {
        k: v for k, v in _snapshot(out).items() if not k.startswith(new_dir.name)
    } == old  # old data intact
    assert sorted(p.name for p in new_dir.iterdir()) == sorted([*finished, "progress.json"])  # no temp file
    assert load_meta(out)["source_chars"] == len(SMALL)

    monkeypatch.setattr(ShardWriter, "_finish", real_finish)
    kept = {f: (new_dir / f).stat().st_mtime_ns for f in finished}
    with caplog.at_level(logging.INFO, logger="gptmini.data.prepare"):
        resumed = prepare(str(corpus), "gpt2", out, shard_tokens=1000)
    assert "resuming after 3 finished shard(s) (3,000 tokens)" in caplog.text
    assert {f: (new_dir / f).stat().st_mtime_ns for f in finished} == kept  # not written again
    fresh = prepare(str(corpus), "gpt2", tmp_path / "fresh", shard_tokens=1000)
    assert (
        _snapshot(out / resumed.meta["shard_dir"]).keys()
        == _snapshot(fresh.out_dir / fresh.meta["shard_dir"]).keys()
    )
    for name in fresh.meta["shards"]:
        path = f"{fresh.meta['shard_dir']}/{name['file']}"
        assert (out / path).read_bytes() == (fresh.out_dir / path).read_bytes()
    assert (out / "meta.json").read_bytes() == (fresh.out_dir / "meta.json").read_bytes()
    assert [p.name for p in out.glob("tokens-*")] == [resumed.meta["shard_dir"]]


def test_a_failed_first_preparation_leaves_no_data(corpus, tmp_path, monkeypatch):
    def crash(self, position):
        raise RuntimeError("simulated crash")

    monkeypatch.setattr(ShardWriter, "_finish", crash)
    fresh = tmp_path / "fresh"
    with pytest.raises(RuntimeError):
        prepare(str(corpus), "gpt2", fresh, shard_tokens=100)
    assert not (fresh / "meta.json").exists()
    with pytest.raises(DataError, match="not a prepared data folder"):
        load_split(fresh, "train")


def test_two_preparations_of_one_folder_take_turns(corpus, tmp_path):
    results, errors = [], []

    def run():
        try:
            results.append(prepare(str(corpus), "gpt2", tmp_path / "o", shard_tokens=500))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and sorted(r.skipped for r in results) == [False, True, True]
    assert _ids(tmp_path / "o") == gpt2_encoding().encode_ordinary(SMALL)


def test_progress_reports_every_phase(tmp_path, monkeypatch):
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(30):
        (docs / f"{i:02d}.txt").write_text(SMALL[: 500 + 100 * i])
    seen = []
    monkeypatch.setattr(progress_module, "BAR_EVERY_S", 0.0)
    result = prepare(str(docs), "gpt2", tmp_path / "o", progress=seen.append)
    total = sum(p.stat().st_size for p in docs.iterdir())
    phases = [p.phase for p in seen]
    assert phases.index("tokenizing") > 0 and set(phases[: phases.index("tokenizing")]) == {"checking"}
    last = seen[-1]
    assert (last.phase, last.documents, last.tokens, last.bytes_done, last.bytes_total) == (
        "tokenizing",
        30,
        result.meta["tokens"],
        total,
        total,
    )
    done = [p.bytes_done for p in seen if p.phase == "tokenizing"]
    assert done == sorted(done) and result.meta["documents"] == 30


def test_uint32_for_large_vocabularies(corpus, tmp_path, monkeypatch):
    assert token_dtype(50257) == np.uint16 and token_dtype(65536) == np.uint16
    assert token_dtype(65537) == np.uint32 and token_dtype(200_019) == np.uint32

    class BigVocab:
        name, vocab_size, eot_id = "cl100k_base", 100_277, 100_257

        def encode_array(self, text):
            return np.array([70_000 + ord(c) for c in text], dtype=np.uint32)

        def to_dict(self):
            return {"kind": "test", "name": self.name, "vocab_size": self.vocab_size, "eot_id": self.eot_id}

    monkeypatch.setattr(prep, "build_tokenizer", lambda name, vocab_path=None: BigVocab())
    result = prepare(str(corpus), "cl100k_base", tmp_path / "big")
    train = load_split(result.out_dir, "train")
    assert result.meta["dtype"] == "uint32" and train.dtype == np.uint32
    assert int(train[0]) == 70_000 + ord(SMALL[0])


def test_size_and_dtype_mismatch_refused(corpus, tmp_path):
    out = prepare(str(corpus), "gpt2", tmp_path / "o").out_dir
    meta = load_meta(out)
    with open(out / meta["shard_dir"] / "shard_000000.bin", "r+b") as f:
        f.truncate(f.seek(0, 2) - 1)
    with pytest.raises(DataError, match=r"shard_000000\.bin has \d+ bytes but meta\.json says \d+ uint16"):
        load_split(out, "train")
    (out / "meta.json").write_text(json.dumps({**meta, "dtype": "float32"}))
    with pytest.raises(DataError, match="field 'dtype' is 'float32'"):
        load_split(out, "val")
    (out / "meta.json").write_text(json.dumps({**meta, "format_version": 1}))
    with pytest.raises(DataError, match="format_version 1, expected 2; re-run prepare"):
        load_meta(out)
    (out / "meta.json").write_text("not json")
    with pytest.raises(DataError, match="not readable JSON"):
        load_meta(out)


def test_check_vocab():
    check_vocab(50304, {"tokenizer": "gpt2", "vocab_size": 50257})
    with pytest.raises(
        DataError, match=r"model vocab_size 50000 is smaller than tokenizer 'gpt2' vocab_size 50257"
    ):
        check_vocab(50000, {"tokenizer": "gpt2", "vocab_size": 50257})


def test_cli(corpus, tmp_path, gptmini_cli):
    out = tmp_path / "cli"
    settings = [f"data.source={corpus}", "tokenizer=char", f"data.data_dir={out}", "data.shard_tokens=5000"]
    first, again = (
        gptmini_cli(["data", "data=text", *settings]),
        gptmini_cli(["data", "data=text", *settings]),
    )
    assert first.returncode == again.returncode == 0, first.stderr
    lines = [first.stderr.splitlines()[-1], again.stderr.splitlines()[-1]]
    assert lines[0].startswith("data prepared ") and lines[1].startswith("data skipped (up to date) ")
    assert "train" in lines[1] and "val" in lines[1] and f"{-(-len(SMALL) // 5000)} shard(s)" in lines[1]
    missing = gptmini_cli(
        ["data", "data=text", f"data.source={tmp_path / 'missing.txt'}", f"data.data_dir={out}"]
    )
    assert missing.returncode == 2 and "missing.txt does not exist" in missing.stderr
    assert gptmini_cli(["data", "data=text", *settings, "data.buffer_mb=0"]).returncode == 2


def test_package_exports_the_light_api_without_torch_or_lightning():
    # A fresh interpreter: this one has torch loaded already. The config checks rely on this.
    code = (
        "import sys, gptmini.data.corpora, gptmini.data.prepare, gptmini.data.reader\n"
        "from gptmini.data.prepare import DataError, prepare\n"
        "from gptmini.data.reader import load_split\n"
        "assert callable(prepare) and callable(load_split)\n"
        "assert DataError is sys.modules['gptmini.data.errors'].DataError\n"
        "assert not {'torch', 'lightning'} & set(sys.modules), sorted({'torch', 'lightning'} & set(sys.modules))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
