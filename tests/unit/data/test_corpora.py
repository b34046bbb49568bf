"""Corpus sources: the embedded Shakespeare text, files, folders, globs, JSON Lines, Parquet, Arrow and URLs, read
as a stream of documents, and their errors."""

import gzip
import json
import re

import numpy as np
import pytest

from benchmarks.common import shakespeare_text
from gptmini.data import corpora
from gptmini.data.corpora import is_url, resolve_source, source_name
from gptmini.data.errors import DataError
from gptmini.data.prepare import prepare
from gptmini.data.reader import load_split, load_tokenizer
from gptmini.data.tokenizers import gpt2_encoding

SMALL = "".join(f"SPEAKER {i % 7}:\nLine number {i}, with words; and more words!\n\n" for i in range(400))
EOT = 50256


def _ids(folder):
    return np.concatenate([np.asarray(load_split(folder, s)) for s in ("train", "val")]).tolist()


def _documents(corpus):
    """The documents of a resolved corpus, joined from their fragments."""
    docs: dict[int, str] = {}
    for frag in corpus.fragments():
        docs[frag.document] = docs.get(frag.document, "") + frag.text
    return [docs[i] for i in sorted(docs)]


def test_shakespeare_text_is_clean_and_deterministic():
    a = shakespeare_text()
    b = shakespeare_text()
    assert a == b
    assert len(a) > 4_000_000
    assert a.startswith("THESEUS:\nNow, fair Hippolyta, our nuptial hour\n")
    assert "**" not in a and "_" not in a and "\\" not in a
    assert not any(line.startswith("#") for line in a.splitlines())
    assert "\n\nHAMLET:\n" in a
    assert "  \n" not in a
    # streamed play by play, it is the same single text
    embedded = resolve_source("shakespeare")
    assert embedded.single_text and len(embedded.files) == 38 and _documents(embedded) == [a]


def test_is_url():
    assert is_url("http://example.com/a.txt") and is_url("https://example.com/a.txt")
    assert not is_url("shakespeare") and not is_url("data/http.txt") and not is_url("ftp://example.com/a")


def test_folder_and_glob_documents_end_with_end_of_text(tmp_path, monkeypatch):
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "b.txt").write_text("second\n")
    (docs / "a.txt").write_text("first")
    (docs / "sub" / "c.txt").write_text("third\n")
    (docs / "skip.md").write_text("not text")
    (docs / "empty.txt").write_text("")
    (docs / ".cache").mkdir()  # what `hf download --local-dir` keeps beside the files
    (docs / ".cache" / "partial.txt").write_text("hidden")
    assert _documents(resolve_source(str(docs))) == ["first", "second\n", "third\n"]
    assert _documents(resolve_source(str(docs / "*.txt"))) == ["first", "second\n"]
    assert source_name(str(docs / "*.txt")) == "docs"
    # gpt2: each document followed by <|endoftext|>, encoded on its own (the oracle: tiktoken directly)
    enc = gpt2_encoding()
    out = prepare(str(docs), "gpt2", tmp_path / "bpe", val_fraction=0.0).out_dir
    want = [i for text in ("first", "second\n", "third\n") for i in [*enc.encode_ordinary(text), EOT]]
    assert _ids(out) == want
    # char has no end-of-text token: nothing is added
    out = prepare(str(docs), "char", tmp_path / "char", val_fraction=0.0).out_dir
    assert load_tokenizer(out).decode(_ids(out)) == "firstsecond\nthird\n"
    # one text file is one continuous text: nothing added, ids exactly tiktoken's
    out = prepare(str(docs / "b.txt"), "gpt2", tmp_path / "one", val_fraction=0.0).out_dir
    assert _ids(out) == enc.encode_ordinary("second\n")
    monkeypatch.chdir(tmp_path)
    result = prepare(str(docs / "a.txt"), "char", val_fraction=0.0)
    # data/<file name>_<hash of its absolute path>_<tokenizer>: another a.txt elsewhere gets another folder
    assert (
        re.fullmatch(r"data/a_[0-9a-f]{8}_char", result.out_dir.as_posix())
        and result.meta["splits"]["val"]["tokens"] == 0
    )
    assert len(load_split(result.out_dir, "val")) == 0


def test_missing_and_empty_and_bad_sources(tmp_path):
    with pytest.raises(DataError, match="'nope.txt' not found"):
        prepare("nope.txt", "char", tmp_path / "o")
    empty = tmp_path / "empty.txt"
    empty.write_text(" \n\n\t")
    with pytest.raises(DataError, match="is empty"):
        prepare(str(empty), "char", tmp_path / "o")
    assert not (tmp_path / "o").exists()  # found before anything was written
    (tmp_path / "nodocs").mkdir()
    with pytest.raises(
        DataError, match=r"contains no \*\.txt, \*\.jsonl, \*\.jsonl\.gz, \*\.parquet, \*\.arrow"
    ):
        prepare(str(tmp_path / "nodocs"), "char", tmp_path / "o")
    with pytest.raises(DataError, match="matches no files"):
        prepare(str(tmp_path / "*.nothing"), "char", tmp_path / "o")
    with pytest.raises(DataError, match=r"data.val_fraction=1 is invalid: it must be in \[0, 1\)"):
        prepare(str(empty), "char", tmp_path / "o", val_fraction=1.0)
    with pytest.raises(DataError, match="data.shard_tokens=0 is invalid: it must be an integer >= 1"):
        prepare(str(empty), "char", tmp_path / "o", shard_tokens=0)


def test_undecodable_bytes_name_file_and_offset(tmp_path, monkeypatch):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"caf" + b"\xe9 au lait\n")
    with pytest.raises(DataError, match=r"latin1\.txt is not valid UTF-8: byte offset 3"):
        prepare(str(bad), "char", tmp_path / "o")
    # Read in 5-byte blocks: a character split across two blocks is decoded whole, and a bad byte far into the
    # file is reported at its offset in the file, not in its block.
    monkeypatch.setattr(corpora, "BLOCK_BYTES", 5)
    good = tmp_path / "split.txt"
    good.write_text("abcdé漢字👋 end\n" * 3, encoding="utf-8")
    assert _documents(resolve_source(str(good))) == ["abcdé漢字👋 end\n" * 3]
    late = tmp_path / "late.txt"
    late.write_bytes("été ".encode() * 10 + b"\xff tail")
    with pytest.raises(DataError, match=r"late\.txt is not valid UTF-8: byte offset 60 \(b'\\xff'"):
        list(resolve_source(str(late)).fragments())
    truncated = tmp_path / "truncated.txt"
    truncated.write_bytes(b"abcdefgh" + "é".encode()[:1])  # ends inside a character
    with pytest.raises(DataError, match=r"truncated\.txt is not valid UTF-8: byte offset 8"):
        list(resolve_source(str(truncated)).fragments())


def test_jsonl_records_are_documents(tmp_path):
    rows = [{"text": "first doc", "id": 1}, {"text": ""}, {"text": None}, {"text": "second doc\n"}]
    lines = "\n".join(json.dumps(r) for r in rows) + "\n\n"
    (tmp_path / "a.jsonl").write_text(lines)
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as f:
        f.write(json.dumps({"text": "third"}) + "\n")
    assert _documents(resolve_source(str(tmp_path))) == ["first doc", "second doc\n", "third"]
    out = prepare(str(tmp_path / "a.jsonl"), "gpt2", tmp_path / "o", val_fraction=0.0).out_dir
    enc = gpt2_encoding()
    assert _ids(out) == [*enc.encode_ordinary("first doc"), EOT, *enc.encode_ordinary("second doc\n"), EOT]

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "x.jsonl").write_text('{"text": "ok"}\n{"text": "broken\n')
    with pytest.raises(DataError, match=r"x\.jsonl:2 is not a JSON object"):
        prepare(str(bad / "x.jsonl"), "gpt2", tmp_path / "o2")
    (bad / "x.jsonl").write_text('{"content": "ok", "url": "u"}\n')
    with pytest.raises(
        DataError, match=r"x\.jsonl:1 has no field 'text' \(fields: content, url\).*text_field"
    ):
        prepare(str(bad / "x.jsonl"), "gpt2", tmp_path / "o2")
    result = prepare(str(bad / "x.jsonl"), "gpt2", tmp_path / "o2", text_field="content", val_fraction=0.0)
    assert _ids(result.out_dir) == [*enc.encode_ordinary("ok"), EOT]
    (bad / "x.jsonl").write_text('{"text": 3}\n')
    with pytest.raises(DataError, match=r"x\.jsonl:1: field 'text' holds int, not text"):
        prepare(str(bad / "x.jsonl"), "gpt2", tmp_path / "o3")
    (bad / "y.jsonl.gz").write_bytes(gzip.compress(b'{"text": "a"}\n' * 100)[:-12])  # a cut-off download
    with pytest.raises(DataError, match=r"cannot read .*y\.jsonl\.gz after line \d+.*is the file complete"):
        list(resolve_source(str(bad / "y.jsonl.gz")).fragments())


def test_parquet_and_arrow_files_and_datasets_folders(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    texts = [f"row {i} says hello" if i % 5 else None for i in range(3000)]
    table = pa.table({"id": list(range(3000)), "text": texts})
    pq.write_table(table, tmp_path / "fw.parquet", row_group_size=700)
    want = [t for t in texts if t]
    assert _documents(resolve_source(str(tmp_path / "fw.parquet"))) == want

    # A datasets save_to_disk folder: Arrow stream files (+ json metadata); a map() cache beside them is left out
    ds = tmp_path / "ds"
    ds.mkdir()
    for i, part in enumerate((texts[:1500], texts[1500:])):
        with pa.OSFile(str(ds / f"data-0000{i}-of-00002.arrow"), "wb") as sink:
            t = pa.table({"text": part})
            with pa.ipc.new_stream(sink, t.schema) as writer:
                for batch in t.to_batches(max_chunksize=1000):
                    writer.write_batch(batch)
    (ds / "state.json").write_text("{}")
    (ds / "dataset_info.json").write_text("{}")
    with pa.OSFile(str(ds / "cache-0123abcd.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, pa.schema([("text", pa.string())])) as writer:
            writer.write_batch(pa.record_batch([pa.array(["not part of the data"])], names=["text"]))
    corpus = resolve_source(str(ds))
    assert [f.path.name for f in corpus.files] == ["data-00000-of-00002.arrow", "data-00001-of-00002.arrow"]
    assert _documents(corpus) == want
    # the Arrow file (random access) format reads the same
    with pa.OSFile(str(tmp_path / "file.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=999)
    assert _documents(resolve_source(str(tmp_path / "file.arrow"))) == want

    out = prepare(str(ds), "gpt2", tmp_path / "o", val_fraction=0.0).out_dir
    enc = gpt2_encoding()
    assert _ids(out) == [i for t in want for i in [*enc.encode_ordinary(t), EOT]]

    with pytest.raises(DataError, match=r"fw\.parquet has no column 'content' \(columns: id, text\)"):
        prepare(str(tmp_path / "fw.parquet"), "gpt2", tmp_path / "o2", text_field="content")
    with pytest.raises(DataError, match=r"fw\.parquet: column 'id' is int64, not text"):
        prepare(str(tmp_path / "fw.parquet"), "gpt2", tmp_path / "o2", text_field="id")
    (tmp_path / "dd" / "train").mkdir(parents=True)
    (tmp_path / "dd" / "test").mkdir()
    (tmp_path / "dd" / "dataset_dict.json").write_text('{"splits": ["train", "test"]}')
    with pytest.raises(DataError, match=r"DatasetDict folder with splits \['test', 'train'\].*dd/test"):
        prepare(str(tmp_path / "dd"), "gpt2", tmp_path / "o2")


def test_url_source_offline_and_cached(tmp_path):
    url = "http://127.0.0.1:9/corpus.txt"  # discard port: connection refused, no real network needed
    with pytest.raises(DataError, match=r"cannot download http://127\.0\.0\.1:9/corpus\.txt") as refused:
        prepare(url, "char", tmp_path / "u")
    assert "pass it as data.source=<the local file>, or put it at " in str(refused.value)
    assert not (tmp_path / "u").exists()  # no partial download, no empty folder left
    (tmp_path / "u" / "raw").mkdir(parents=True)
    (tmp_path / "u" / "raw" / "corpus.txt").write_text(SMALL)
    assert prepare(url, "char", tmp_path / "u").meta["splits"]["train"]["tokens"] > 0
    assert source_name(url) == "corpus"


def test_each_corpus_gets_its_own_prepared_folder(tmp_path, monkeypatch):
    """Two corpora never share a prepared folder, even with the same file name: the folder is
    keyed by the source's identity (absolute path or URL) and the tokenizer."""
    from gptmini.data.corpora import default_out_dir, prepared_folder_name

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, second = tmp_path / "a" / "corpus.txt", tmp_path / "b" / "corpus.txt"
    assert prepared_folder_name("shakespeare", "gpt2") == "shakespeare_gpt2"
    name = prepared_folder_name(str(first), "char")
    assert re.fullmatch(r"corpus_[0-9a-f]{8}_char", name)
    assert name != prepared_folder_name(str(second), "char") != prepared_folder_name(str(first), "gpt2")
    monkeypatch.chdir(tmp_path / "a")
    assert prepared_folder_name("corpus.txt", "char") == name  # relative or absolute: one corpus, one folder
    assert prepared_folder_name("https://example.com/corpus.txt", "char") != name
    assert default_out_dir(str(first), "char", tmp_path / "data") == tmp_path / "data" / name
