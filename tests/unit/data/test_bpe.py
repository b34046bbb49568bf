"""The trained byte-level BPE: training (rustbpe) against its own encoder, tiktoken encoding, exact round trips on
text of several scripts, the saved file, the prepared folder's identity, and the refusals of bad settings."""

import json
import random

import numpy as np
import pytest

from gptmini.data.bpe import (
    MIN_VOCAB,
    PIECE_CHARS,
    check_settings,
    compare_with_gpt2,
    train_bpe,
    training_sample,
)
from gptmini.data.corpora import Fragment
from gptmini.data.encoding import split_for_encoding
from gptmini.data.errors import DataError
from gptmini.data.prepare import prepare
from gptmini.data.reader import data_identity, load_meta, load_split, load_tokenizer
from gptmini.data.tokenizers import (
    BPE_FILE,
    GPT4_PAT_STR,
    BPETokenizer,
    CharTokenizer,
    TokenizerError,
    build_tokenizer,
)

WORDS = [
    "καλημέρα",
    "κόσμε",
    "θάλασσα",
    "привет",
    "мир",
    "море",
    "солнце",
    "你好",
    "世界",
    "大海",
    "the",
    "sea",
]


def _text(lines: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    return "".join(" ".join(rng.choice(WORDS) for _ in range(10)) + ".\n" for _ in range(lines))


@pytest.fixture(scope="module")
def text():
    return _text(2000)


@pytest.fixture(scope="module")
def bpe(text):
    return train_bpe([text], 320)


def test_the_pattern_is_the_trainers_default():
    import rustbpe

    trainer = rustbpe.Tokenizer()
    trainer.train_from_iterator(iter(["ab ab"]), vocab_size=257)
    assert trainer.get_pattern() == GPT4_PAT_STR


def test_tiktoken_encodes_as_the_trainer_does(text):
    """The oracle: rustbpe's own encoder, trained with the same text and settings."""
    import rustbpe

    trainer = rustbpe.Tokenizer()
    trainer.train_from_iterator(iter([text]), vocab_size=319, pattern=GPT4_PAT_STR)
    tok = train_bpe([text], 320)
    held_out = _text(200, seed=1) + "Ünïcödé 🙂 mixed: 12345, tabs\tand  spaces\n"
    assert tok.encode(held_out) == trainer.encode(held_out)
    assert tok.vocab_size == 320 and tok.eot_id == 319 and len(tok.tokens) == 319


def test_round_trip_is_exact_for_multibyte_text(bpe):
    for sample in (_text(50, seed=2), "日本語のテキスト 🙂🙃 — ελληνικά, русский\r\n\t\x00end", ""):
        ids = bpe.encode(sample)
        assert bpe.decode(ids) == sample
        assert all(0 <= i < bpe.eot_id for i in ids)
        assert bpe.encode_array(sample).tolist() == ids
    # merges were learnt: a common word of the training text takes fewer tokens than its bytes
    assert len(bpe.encode(" θάλασσα")) < len(" θάλασσα".encode())
    assert "<|endoftext|>" in bpe.decode(bpe.encode("<|endoftext|>"))  # ordinary text, never the special id
    assert bpe.eot_id not in bpe.encode("<|endoftext|>")


def test_training_is_deterministic(text, bpe):
    assert train_bpe([text], 320).sha256 == bpe.sha256
    assert train_bpe([text], 300).sha256 != bpe.sha256


def test_token_bytes_count_the_text_bytes(bpe, tmp_path):
    sample = _text(30, seed=3) + "🙂"
    char = CharTokenizer(set(sample))
    for tok in (bpe, build_tokenizer("gpt2"), char):
        table = tok.token_bytes()
        assert table.shape == (tok.vocab_size,)
        assert int(table[tok.encode(sample)].sum()) == len(sample.encode())
    assert bpe.token_bytes()[bpe.eot_id] == 0 and build_tokenizer("gpt2").token_bytes()[50256] == 0


def test_preparation_pieces_encode_as_the_whole(bpe):
    """Preparation encodes a document in pieces cut where no pre-token of GPT-4's pattern spans the cut."""
    long = _text(6000, seed=4).replace(".\n", ".\n\n", 50)
    assert [i for piece in split_for_encoding(long) for i in bpe.encode(piece)] == bpe.encode(long)


def test_saved_file_round_trips_and_is_json(bpe, tmp_path):
    path = tmp_path / BPE_FILE
    bpe.save(path)
    payload = json.loads(path.read_text())
    assert payload["kind"] == "bpe" and len(payload["tokens"]) == 319
    loaded = BPETokenizer.load(path)
    assert loaded.sha256 == bpe.sha256 and loaded.encode("мир") == bpe.encode("мир")
    path.write_text(json.dumps(payload | {"tokens": payload["tokens"][1:]}))
    with pytest.raises(TokenizerError, match="single bytes"):
        BPETokenizer.load(path)
    path.write_text("{not json")
    with pytest.raises(TokenizerError, match="unreadable"):
        BPETokenizer.load(path)


def _refuse_decoding(monkeypatch) -> None:
    """Any parse of a JSON text or decoding of a token fails the test: a refusal must come before them."""
    import base64

    from gptmini.data import tokenizers

    def called(*args, **kwargs):
        raise AssertionError("decoded before it was checked")

    monkeypatch.setattr(tokenizers.json, "loads", called)
    monkeypatch.setattr(base64, "b64decode", called)


def test_a_padded_or_replaced_bpe_file_is_refused_before_it_is_parsed(bpe, tmp_path, monkeypatch):
    from gptmini.data.tokenizers import bpe_file_facts, build_tokenizer

    path = tmp_path / BPE_FILE
    bpe.save(path)
    spec = bpe.to_dict() | bpe_file_facts(path)
    assert build_tokenizer("bpe", path, spec).sha256 == bpe.sha256
    original = path.read_bytes()
    with monkeypatch.context() as patch:
        _refuse_decoding(patch)
        path.write_bytes(original + b" " * 4096)  # the same JSON, padded: the recorded size differs
        with pytest.raises(TokenizerError, match=r"bytes but meta\.json records .*refused unread"):
            build_tokenizer("bpe", path, spec)
        path.write_bytes(original.replace(b'"kind"', b'"kinD"'))  # the same size, other bytes
        with pytest.raises(TokenizerError, match=r"has sha256 .* \(refused unparsed\)"):
            build_tokenizer("bpe", path, spec)
        # data prepared before the file's size was recorded: refused when far over what its vocabulary takes
        old_spec = bpe.to_dict()
        path.write_bytes(original + b" " * (bpe.vocab_size * 1024 + (1 << 16)))
        with pytest.raises(TokenizerError, match=r"far more than a BPE of 320 tokens takes"):
            build_tokenizer("bpe", path, old_spec)
    # ... and within it, its content's digest compared before any token is decoded
    other = json.loads(original) | {"pattern": r"\s+"}
    path.write_text(json.dumps(other))
    with monkeypatch.context() as patch:
        import base64

        patch.setattr(base64, "b64decode", lambda *a, **k: pytest.fail("a token was decoded"))
        with pytest.raises(TokenizerError, match="its sha256 differs"):
            build_tokenizer("bpe", path, old_spec)


@pytest.mark.parametrize(
    ("vocab", "train_bytes", "match"),
    [
        (256, 10, "at least 257"),
        (100, 10, "at least 257"),
        ("8k", 10, "not an integer"),
        (None, 10, "not an integer"),
        (1000, 0, "train_bytes=0"),
        (1 << 33, 10, "out of range"),
    ],
)
def test_bad_settings_refused(vocab, train_bytes, match):
    with pytest.raises(TokenizerError, match=match):
        check_settings(vocab, train_bytes)
    check_settings(MIN_VOCAB, 1)


def test_a_vocabulary_the_text_cannot_support_is_refused():
    with pytest.raises(
        TokenizerError, match=r"vocab_size=5000 is more than the training text supports.*vocab_size="
    ):
        train_bpe(["abc abd abc"], 5000)


def test_training_sample_stops_at_its_bounds():
    frags = [Fragment(0, "ααα" * 10, 60, False), Fragment(0, "b" * 40, 40, True)]  # 60 + 40 source bytes
    assert "".join(training_sample(frags, 100, 1000, 0.0)) == "ααα" * 10 + "b" * 40
    # the held-out tail is never read: 40% held out leaves the first fragment (60 bytes) only
    assert "".join(training_sample(frags, 100, 1000, 0.4)) == "ααα" * 10
    # a block holding the start of the held-out part is cut there
    assert "".join(training_sample([Fragment(0, "a" * 100, 100, True)], 100, 1000, 0.1)) == "a" * 90
    # a byte bound cuts at a character boundary (α is two bytes)
    assert "".join(training_sample(frags, 100, 5, 0.0)) == "αα"


def test_training_sample_goes_in_bounded_pieces_cut_after_whitespace():
    text = ("word " * 40_000) + "x" * 200_000  # 200k characters with spaces, then 200k without
    pieces = list(training_sample([Fragment(0, text, len(text), True)], len(text), 10**9, 0.0))
    assert "".join(pieces) == text
    assert max(len(p) for p in pieces) <= PIECE_CHARS
    assert all(p.endswith(" ") for p in pieces[:3])  # no word split while there are spaces


@pytest.fixture
def corpus(tmp_path, text):
    path = tmp_path / "multi.txt"
    path.write_text(text, encoding="utf-8")
    return path


def test_prepare_trains_saves_and_reuses_the_tokenizer(corpus, tmp_path, caplog):
    out = tmp_path / "d"
    first = prepare(str(corpus), "bpe", out, tokenizer_options={"vocab_size": 320})
    meta = first.meta
    assert meta["tokenizer"] == "bpe" and meta["vocab_size"] == 320 and meta["eot_id"] == 319
    assert meta["vocab_file"].endswith(BPE_FILE) and meta["settings"]["bpe"]["vocab_size"] == 320
    tok = load_tokenizer(out)
    assert isinstance(tok, BPETokenizer) and tok.sha256 == meta["tokenizer_spec"]["sha256"]
    ids = np.concatenate([np.asarray(load_split(out, s)) for s in ("train", "val")])
    assert tok.decode(ids.tolist()) == corpus.read_text(encoding="utf-8")  # one continuous text, exactly
    identity = data_identity(out)

    # up to date: neither trained nor tokenized again
    assert prepare(str(corpus), "bpe", out, tokenizer_options={"vocab_size": 320}).skipped
    # another vocabulary: trained again, and the data's identity changes with it
    other = prepare(str(corpus), "bpe", out, tokenizer_options={"vocab_size": 300})
    assert not other.skipped and other.meta["vocab_size"] == 300
    assert data_identity(out)["tokenizer_fingerprint"] != identity["tokenizer_fingerprint"]


def test_a_saved_tokenizer_that_does_not_match_its_data_is_refused(corpus, tmp_path, text):
    out = tmp_path / "d"
    meta = prepare(str(corpus), "bpe", out, tokenizer_options={"vocab_size": 320}).meta
    train_bpe([text[:5000]], 320).save(out / meta["vocab_file"])  # another BPE of the same size
    with pytest.raises(TokenizerError, match="not the tokenizer its data was prepared with"):
        load_tokenizer(out)


def test_bad_input_is_refused_before_any_work(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    with pytest.raises(DataError, match="empty"):
        prepare(str(empty), "bpe", tmp_path / "e", tokenizer_options={"vocab_size": 300})
    binary = tmp_path / "blob.txt"
    binary.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(DataError, match="UTF-8"):
        prepare(str(binary), "bpe", tmp_path / "b", tokenizer_options={"vocab_size": 300})
    with pytest.raises(TokenizerError, match="at least 257"):
        prepare(str(binary), "bpe", tmp_path / "v", tokenizer_options={"vocab_size": 200})
    small = tmp_path / "small.txt"
    small.write_text("abc abd abc\n" * 10)
    with pytest.raises(DataError, match=r"vocab_size=5000 is more than the training text supports"):
        prepare(str(small), "bpe", tmp_path / "s", tokenizer_options={"vocab_size": 5000})
    for name in "ebvs":
        assert not (tmp_path / name).exists(), name  # no folder left behind


def test_bytes_per_token_against_gpt2(corpus, tmp_path):
    out = tmp_path / "d"
    prepare(str(corpus), "bpe", out, tokenizer_options={"vocab_size": 320})
    val = np.asarray(load_split(out, "val"))
    report = compare_with_gpt2(load_tokenizer(out), val)
    tok = load_tokenizer(out)
    # the split may cut a character's bytes between two tokens: count the tokens' own bytes
    assert report["bytes_per_token"] == pytest.approx(len(b"".join(tok.tokens[i] for i in val)) / len(val))
    text = tok.decode(val.tolist())
    assert report["gpt2_bytes_per_token"] == pytest.approx(
        len(text.encode()) / len(build_tokenizer("gpt2").encode(text))
    )
    # trained on this very mix of scripts, the small BPE packs more bytes in a token than GPT-2's
    assert report["bytes_per_token"] > report["gpt2_bytes_per_token"]
    assert load_meta(out)["tokenizer_spec"]["kind"] == "bpe"


def test_cli_trains_reports_and_refuses_bpe_settings_elsewhere(corpus, tmp_path, gptmini_cli):
    out = tmp_path / "cli"
    settings = ["data=text", f"data.source={corpus}", f"data.data_dir={out}", "tokenizer=bpe"]
    trained = gptmini_cli(["data", *settings, "tokenizer.vocab_size=300"])
    assert trained.returncode == 0, trained.stderr
    assert load_meta(out)["vocab_size"] == 300
    assert (
        "bytes per token with this bpe tokenizer" in trained.stderr and "with GPT-2's BPE" in trained.stderr
    )
    small = gptmini_cli(["data", *settings, "tokenizer.vocab_size=99"])
    assert small.returncode == 2 and "vocab_size=99 is out of range" in small.stderr
    gpt2 = gptmini_cli(["data", *settings[:-1], "tokenizer=gpt2", "tokenizer.vocab_size=300"])
    assert gpt2.returncode == 2 and "applies to tokenizer=bpe only" in gpt2.stderr, gpt2.stderr
