"""A prepared folder's meta.json and progress.json are validated field by field when read back: a crafted or
damaged index is refused with one DataError naming the field, never steers which files are read, and never makes
a preparation delete anything outside the data folder (``gptmini data`` and its re-preparation)."""

import json
import re

import numpy as np
import pytest

from gptmini.data.errors import DataError
from gptmini.data.prepare import prepare
from gptmini.data.reader import load_meta, load_split
from gptmini.data.schema import META_FIELDS
from gptmini.data.windows import RandomWindowDataset, StridedWindowDataset

TEXT = "".join(f"Line {i}: to be, or not to be, that is the question.\n" for i in range(300))


@pytest.fixture
def prepared(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    out = tmp_path / "data" / "prepared"
    prepare(str(corpus), "char", out)
    return corpus, out


def edit_meta(folder, change):
    meta = json.loads((folder / "meta.json").read_text())
    change(meta)
    (folder / "meta.json").write_text(json.dumps(meta))


def victim_folder(tmp_path):
    victim = tmp_path / "victim"
    (victim / "inner").mkdir(parents=True)
    (victim / "precious.txt").write_text("keep me")
    (victim / "inner" / "more.bin").write_bytes(b"\x00" * 64)
    return victim


def tree(folder):
    return sorted(
        (p.relative_to(folder).as_posix(), p.read_bytes()) for p in folder.rglob("*") if p.is_file()
    )


CRAFTED = {
    "shard_dir_parent": (lambda m: m.update(shard_dir="../victim"), r"field 'shard_dir' is '\.\./victim'"),
    "shard_dir_absolute": (lambda m: m.update(shard_dir="/tmp"), r"field 'shard_dir' is '/tmp'"),
    "shard_dir_not_a_string": (lambda m: m.update(shard_dir=["x"]), r"field 'shard_dir' is \['x'\]"),
    "shard_file_traversal": (
        lambda m: m["shards"][0].update(file="../../victim/precious.txt"),
        r"field 'shards' item 0 field 'file' is '\.\./\.\./victim/precious\.txt'",
    ),
    "vocab_file_outside": (
        lambda m: m.update(vocab_file="../victim/vocab.json"),
        r"vocab_file is null or a file in <shard_dir>/",
    ),
    "dtype": (lambda m: m.update(dtype="float32"), r"field 'dtype' is 'float32', but must be one of"),
    "vocab_size_string": (lambda m: m.update(vocab_size="65"), r"field 'vocab_size' is '65'"),
    "vocab_size_beyond_dtype": (lambda m: m.update(vocab_size=70000), r"vocab_size fits the dtype"),
    "tokens_negative": (lambda m: m["splits"]["val"].update(tokens=-5), r"field 'val' field 'tokens' is -5"),
    "split_beyond_the_tokens": (
        lambda m: m["splits"]["val"].update(start=m["tokens"]),
        r"the splits lie inside the tokens",
    ),
    "tokenizer_unknown": (lambda m: m.update(tokenizer="nope"), r"field 'tokenizer' is 'nope'"),
    "val_fraction_bool": (lambda m: m.update(val_fraction=True), r"field 'val_fraction' is True"),
    "unknown_field": (lambda m: m.update(extra=1), r"has unknown fields \['extra'\]"),
    "missing_field": (lambda m: m.pop("shards"), r"lacks \['shards'\]"),
    "eot_beyond_vocab": (lambda m: m.update(eot_id=m["vocab_size"]), r"eot_id < vocab_size"),
    "settings_type": (lambda m: m["settings"].update(chunk_chars="big"), r"field 'chunk_chars' is 'big'"),
}


@pytest.mark.parametrize("case", CRAFTED, ids=list(CRAFTED))
def test_every_field_of_meta_json_is_validated(prepared, case):
    _, out = prepared
    change, pattern = CRAFTED[case]
    edit_meta(out, change)
    with pytest.raises(DataError, match=pattern) as err:
        load_meta(out)
    assert "data.force_prepare=true" in str(err.value) and "\n" not in str(err.value)


def test_the_schema_covers_every_field_prepare_writes(prepared):
    _, out = prepared
    assert set(json.loads((out / "meta.json").read_text())) == set(META_FIELDS)


def test_a_symlinked_shard_folder_or_shard_leading_outside_is_not_read(prepared, tmp_path):
    _, out = prepared
    meta = load_meta(out)
    outside = tmp_path / "outside"
    (out / meta["shard_dir"]).rename(outside)
    (out / meta["shard_dir"]).symlink_to(outside, target_is_directory=True)
    with pytest.raises(DataError, match=r"shard_dir '.*' leads outside .* \(a symlink\)"):
        load_meta(out)
    (out / meta["shard_dir"]).unlink()
    (out / meta["shard_dir"]).mkdir()
    shard = out / meta["shard_dir"] / "shard_000000.bin"
    shard.symlink_to(outside / "shard_000000.bin")
    (out / meta["shard_dir"] / "vocab.json").write_bytes((outside / "vocab.json").read_bytes())
    with pytest.raises(DataError, match=r"shard '.*shard_000000\.bin' leads outside"):
        load_split(out, "train")


@pytest.mark.parametrize("shard_dir", ["../victim", "ABSOLUTE"])
def test_a_crafted_shard_dir_never_makes_gptmini_data_delete_a_folder(
    prepared, tmp_path, shard_dir, gptmini_cli
):
    """The re-preparation that a damaged index causes replaced the old shards by removing ``out / shard_dir``."""
    corpus, out = prepared
    victim = victim_folder(tmp_path / "data")
    before = tree(victim)
    target = str(victim) if shard_dir == "ABSOLUTE" else shard_dir
    edit_meta(out, lambda m: m.update(shard_dir=target))
    proc = gptmini_cli(
        ["data", "data=text", f"data.source={corpus}", "tokenizer=char", f"data.data_dir={out}"]
    )
    assert proc.returncode == 0, proc.stderr
    assert tree(victim) == before
    meta = load_meta(out)  # prepared again, inside its own folder
    assert re.fullmatch(r"tokens-[0-9a-f]{12}", meta["shard_dir"]) and (out / meta["shard_dir"]).is_dir()
    assert "".join(load_split(out, "train").astype(str)) != ""


def test_a_symlink_named_like_old_shards_is_not_followed_by_the_clean_up(prepared, tmp_path):
    corpus, out = prepared
    victim = victim_folder(tmp_path)
    before = tree(victim)
    (out / "tokens-0123456789ab").symlink_to(victim, target_is_directory=True)
    prepare(str(corpus), "char", out, force=True)
    assert tree(victim) == before


def test_a_damaged_progress_record_starts_the_preparation_again(prepared, tmp_path):
    corpus, out = prepared
    meta = load_meta(out)
    (out / meta["shard_dir"]).rename(out / "tokens-aaaaaaaaaaaa")  # an interrupted preparation's folder
    victim = victim_folder(tmp_path)
    before = tree(victim)
    fresh = prepare(str(corpus), "char", tmp_path / "fresh")
    # a progress record naming shards outside its folder, in the folder the next preparation resumes in
    folder = out / fresh.meta["shard_dir"]
    folder.mkdir()
    record = {
        "inputs": fresh.meta["shard_dir"],
        "dtype": "uint16",
        "scan": {"file_sha256": ["0" * 64], "text_sha256": None, "chars": ["a"]},
        "shards": [{"file": "../../victim/precious.txt", "tokens": 3}],
        "resume": [0, 0, 0],
    }
    (folder / "progress.json").write_text(json.dumps(record))
    result = prepare(str(corpus), "char", out)
    assert result.meta["shards"] == fresh.meta["shards"] and tree(victim) == before
    assert np.array_equal(
        np.asarray(load_split(out, "train")), np.asarray(load_split(tmp_path / "fresh", "train"))
    )


# --- token ids beyond the vocabulary --------------------------------------------------------------------------


def test_a_shard_with_ids_beyond_the_vocabulary_is_refused_when_loaded(prepared):
    _, out = prepared
    meta = load_meta(out)
    shard = out / meta["shard_dir"] / "shard_000000.bin"
    ids = np.fromfile(shard, dtype="<u2")
    ids[123] = 60000
    ids.tofile(shard)
    with pytest.raises(DataError, match=r"holds token id 60000 at token 123, but the vocabulary has \d+ ids"):
        load_split(out, "train")


@pytest.mark.parametrize("dataset", [RandomWindowDataset, StridedWindowDataset])
def test_every_window_served_is_checked_against_the_vocabulary(dataset):
    tokens = np.arange(64, dtype=np.uint16) % 10
    tokens[40] = 10
    windows = (
        dataset(tokens, 8, 200, seed=0, vocab_size=10)
        if dataset is RandomWindowDataset
        else dataset(tokens, 8, vocab_size=10)
    )
    served = 0
    for i in range(len(windows)):
        try:
            x, y = windows[i]
        except DataError as err:
            assert re.search(
                r"holds token id 10 in tokens \[\d+, \d+\), but the vocabulary has 10 ids", str(err)
            )
            continue
        assert int(max(x.max(), y.max())) < 10
        served += 1
    assert 0 < served < len(windows)
