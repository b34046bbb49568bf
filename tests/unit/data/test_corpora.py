"""Corpus sources: the embedded Shakespeare text, files, folders, globs and URLs, and their errors."""

import re

import pytest

from gptmini.data.corpora import is_url, read_source, shakespeare_text, source_name
from gptmini.data.errors import DataError
from gptmini.data.prepare import load_split, prepare

SMALL = "".join(f"SPEAKER {i % 7}:\nLine number {i}, with words; and more words!\n\n" for i in range(400))


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


def test_is_url():
    assert is_url("http://example.com/a.txt") and is_url("https://example.com/a.txt")
    assert not is_url("shakespeare") and not is_url("data/http.txt") and not is_url("ftp://example.com/a")


def test_sources_dir_glob_and_default_out(tmp_path, monkeypatch):
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "b.txt").write_text("second\n")
    (docs / "a.txt").write_text("first")
    (docs / "sub" / "c.txt").write_text("third\n")
    (docs / "skip.md").write_text("not text")
    assert read_source(str(docs)) == "first\n\nsecond\n\nthird\n"
    assert read_source(str(docs / "*.txt")) == "first\n\nsecond\n"
    assert source_name(str(docs / "*.txt")) == "docs"
    monkeypatch.chdir(tmp_path)
    result = prepare(str(docs / "a.txt"), "char", val_fraction=0.0)
    # data/<file name>_<hash of its absolute path>_<tokenizer>: another a.txt elsewhere gets another folder
    assert re.fullmatch(r"data/a_[0-9a-f]{8}_char", result.out_dir.as_posix()) and result.val_tokens == 0
    assert len(load_split(result.out_dir, "val")) == 0


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
    assert source_name(url) == "corpus"


def test_each_corpus_gets_its_own_prepared_folder(tmp_path, monkeypatch):
    """Two corpora never share a prepared folder, even with the same file name (issue 19, item 2): the folder is
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
