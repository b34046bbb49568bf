"""Corpora that cannot be prepared as they are say why (a symbolic link loop, a FIFO, a device), records without
text are counted and reported, and a corpus that changes while it is prepared is refused, keeping the data that
was there."""

from __future__ import annotations

import codecs
import json
import logging
import os
import re
from pathlib import Path

import pytest

from gptmini.data.corpora import path_problem
from gptmini.data.errors import DataError
from gptmini.data.prepare import prepare
from gptmini.data.progress import PrepareProgress
from gptmini.data.reader import load_meta

TEXT = "".join(f"Line {i}: some words, and more words.\n" for i in range(300))


def special_paths(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    loop = tmp_path / "loop.txt"
    loop.symlink_to(loop)
    dangling = tmp_path / "dangling.txt"
    dangling.symlink_to(tmp_path / "gone.txt")
    fifo = tmp_path / "pipe.txt"
    os.mkfifo(fifo)
    return {
        "symlink_loop": (
            loop,
            r"cannot be opened: Too many levels of symbolic links \(a symbolic link loop\)",
        ),
        "dangling_link": (
            dangling,
            rf"is a symbolic link to {re.escape(str(tmp_path))}/gone\.txt, which does not",
        ),
        "fifo": (fifo, r"is a FIFO \(named pipe\), not a regular file: .* save it to a file first"),
        "dev_zero": (Path("/dev/zero"), r"is a character device, not a regular file"),
    }


@pytest.mark.parametrize("kind", ["symlink_loop", "dangling_link", "fifo", "dev_zero"])
def test_a_corpus_that_is_not_a_file_names_the_real_cause(tmp_path, gptmini_cli, kind) -> None:
    path, cause = special_paths(tmp_path)[kind]
    assert re.fullmatch(cause + ".*", path_problem(path) or "")
    # the prepare command line (`gptmini data`) reports it in one line, exit status 2, reading nothing
    proc = gptmini_cli(
        ["data", "data=text", f"data.source={path}", "tokenizer=char", f"data.data_dir={tmp_path}/o"]
    )
    assert proc.returncode == 2
    assert re.fullmatch(rf"error: data.source={re.escape(str(path))} {cause}.*\n", proc.stderr), proc.stderr
    assert not (tmp_path / "o").exists()


def test_regular_files_and_folders_and_missing_paths_have_no_problem(tmp_path) -> None:
    (tmp_path / "a.txt").write_text("x")
    assert path_problem(tmp_path / "a.txt") is None and path_problem(tmp_path) is None
    assert path_problem(tmp_path / "missing.txt") is None  # "does not exist" is the callers' own message


def test_records_without_text_are_counted_and_reported(tmp_path, caplog) -> None:
    corpus = tmp_path / "docs.jsonl"
    rows = [{"text": TEXT}, {"text": None}, {"text": ""}, {"text": None}, {"text": "more text\n" * 50}]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with caplog.at_level(logging.WARNING):
        result = prepare(str(corpus), "char", tmp_path / "o")
    assert result.meta["documents"] == 2
    assert result.meta["dropped_records"] == {"empty": 1, "null": 2}
    assert (
        f"{corpus}: left out 1 record(s) whose text is empty and 2 record(s) whose text is null; they hold no "
        "text in field 'text'" in caplog.text
    )


def test_null_rows_of_a_parquet_file_are_counted(tmp_path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    corpus = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"text": [TEXT, None, "other text\n" * 40, None, None]}), corpus)
    result = prepare(str(corpus), "char", tmp_path / "o")
    assert result.meta["documents"] == 2 and result.meta["dropped_records"] == {"null": 3}


def test_a_corpus_changing_while_it_is_prepared_is_refused_and_the_old_data_kept(tmp_path) -> None:
    corpus = tmp_path / "live.txt"
    corpus.write_text(TEXT)
    out = tmp_path / "o"
    before = prepare(str(corpus), "char", out).meta
    corpus.write_text(TEXT + "a second version\n")  # a new version: prepared again...

    def append_once(progress: PrepareProgress) -> None:
        if progress.phase == "tokenizing" and not appended:
            appended.append(True)
            with open(corpus, "a") as f:  # ...and written to while that runs
                f.write("a third version\n" * 10)

    appended: list[bool] = []
    with pytest.raises(
        DataError, match=rf"corpus '{re.escape(str(corpus))}' changed while it was being prepared"
    ):
        prepare(str(corpus), "char", out, progress=append_once)
    assert appended and load_meta(out) == before  # the data prepared before is still the data


def test_prepare_writes_only_into_a_folder_of_its_own(tmp_path, gptmini_cli) -> None:
    corpus = tmp_path / "c.txt"
    corpus.write_text(TEXT)
    model = tmp_path / "hf_model"  # e.g. a Hugging Face GPT-2 folder, whose vocab.json a cleanup could take
    model.mkdir()
    (model / "vocab.json").write_text("{}")
    (model / "config.json").write_text("{}")
    proc = gptmini_cli(
        ["data", "data=text", f"data.source={corpus}", "tokenizer=char", f"data.data_dir={model}"]
    )
    assert proc.returncode == 2
    assert "holds files a preparation did not write (config.json, vocab.json)" in proc.stderr
    assert sorted(p.name for p in model.iterdir()) == ["config.json", "vocab.json"]
    out = tmp_path / "prepared"
    prepare(str(corpus), "char", out)
    prepare(str(corpus), "char", out, force=True)  # its own folder: prepared again


@pytest.mark.parametrize(
    ("encoding", "hint"),
    [("utf-16", "utf-16le"), ("utf-16-be", "utf-16be"), ("utf-32", "utf-32le"), ("latin-1", "latin1")],
)
def test_a_corpus_in_another_encoding_gets_the_matching_conversion_hint(
    tmp_path, gptmini_cli, encoding, hint
) -> None:
    corpus = tmp_path / "corpus.txt"
    text = "ROMEO: caf\u00e9 cr\u00e8me, but soft!\n" * 40
    data = text.encode(encoding)
    if encoding == "utf-16-be":
        data = codecs.BOM_UTF16_BE + data
    corpus.write_bytes(data)
    out = tmp_path / "out"
    proc = gptmini_cli(
        ["data", "data=text", f"data.source={corpus}", "tokenizer=char", f"data.data_dir={out}"]
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert (
        f"it looks like {hint}: convert it, e.g. `iconv -f {hint} -t utf-8 {corpus} > fixed.txt`"
        in proc.stderr
    )
    assert not out.exists()


@pytest.mark.parametrize("kind", ["dangling_link", "fifo"])
def test_a_corpus_folder_holding_a_txt_that_is_not_a_file_is_refused_as_that_path_alone_is(
    tmp_path, gptmini_cli, kind
) -> None:
    """A folder's *.txt that is a FIFO or a dangling link was skipped without a word (the rest prepared, exit 0),
    where the same path given alone is refused."""
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "good.txt").write_text(TEXT)
    path, cause = special_paths(tmp_path)[kind]
    path.rename(folder / path.name)  # the one special path in the folder (a link's target stays as it was)
    path = folder / path.name
    proc = gptmini_cli(
        ["data", "data=text", f"data.source={folder}", "tokenizer=char", f"data.data_dir={tmp_path}/o"]
    )
    assert proc.returncode == 2, proc.stderr
    assert re.fullmatch(
        rf"error: .*{re.escape(str(folder))}: {re.escape(str(path))} {cause}.*\n", proc.stderr
    ), proc.stderr
    assert not (tmp_path / "o").exists()
