import socket

import pytest
import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks
from tiktoken_ext.openai_public import r50k_pat_str

from gptmini.data import tokenizers as tk
from gptmini.data.tokenizers import (
    CharTokenizer,
    TiktokenTokenizer,
    Tokenizer,
    TokenizerError,
    build_tokenizer,
)

TRICKY = [
    "",
    "Hello world",
    "emoji 👩‍👩‍👧‍👦 🚀 flags 🇫🇷",
    "CJK 漢字かなカナ 한국어",
    "combining e\u0301 a\u0308 \u0915\u094d\u0937",
    "nul \u0000 and \x1f controls",
    "literal <|endoftext|> in text",
    "whitespace   runs\t\t\n\n\n  \r\n \u00a0\u2003 end  ",
    "To be, or not to be: that is the question:\nWhether 'tis nobler in the mind to suffer\n\n",
]


@pytest.fixture
def no_network(monkeypatch, tmp_path):
    """Every connection attempt fails and tiktoken's cache is an empty folder."""

    def refuse(*args, **kwargs):
        raise OSError("network disabled by test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty-cache"))
    tk.gpt2_encoding.cache_clear()
    yield
    tk.gpt2_encoding.cache_clear()


def test_gpt2_known_ids():
    tok = build_tokenizer("gpt2")
    assert isinstance(tok, Tokenizer)
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.encode(" the") == [262]
    assert tok.vocab_size == 50257
    assert tok.eot_id == 50256
    assert tok.decode([50256]) == "<|endoftext|>"
    # The literal string is ordinary text, never the special id.
    assert 50256 not in tok.encode("<|endoftext|>")
    assert tok.to_dict() == {"kind": "tiktoken", "name": "gpt2", "vocab_size": 50257, "eot_id": 50256}


def test_gpt2_matches_tiktoken_construction(monkeypatch, tmp_path):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    d = tk.gpt2_data_dir()
    ranks = data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=str(d / "vocab.bpe"),
        encoder_json_file=str(d / "encoder.json"),
        vocab_bpe_hash=tk.GPT2_FILES_SHA256["vocab.bpe"],
        encoder_json_hash=tk.GPT2_FILES_SHA256["encoder.json"],
    )
    enc = tk.gpt2_encoding()
    assert enc._mergeable_ranks == ranks
    assert enc._pat_str == r50k_pat_str
    assert enc._special_tokens == {"<|endoftext|>": 50256}
    assert enc.n_vocab == 50257


@pytest.mark.parametrize("text", TRICKY)
def test_gpt2_round_trip(text):
    tok = TiktokenTokenizer("gpt2")
    assert tok.decode(tok.encode(text)) == text


@pytest.mark.parametrize("text", [t for t in TRICKY if t])
def test_char_round_trip(text):
    tok = CharTokenizer(set(text))
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.encode_array(text).tolist() == ids
    assert tok.vocab_size == len(set(text)) and tok.eot_id is None


def test_round_trip_on_corpus_sample():
    from benchmarks.common import shakespeare_text

    sample = shakespeare_text()[:200_000]
    for tok in (build_tokenizer("gpt2"), CharTokenizer(set(sample))):
        assert tok.decode(tok.encode(sample)) == sample


def test_char_unknown_character_names_char_and_position():
    tok = CharTokenizer(set("abc "))
    with pytest.raises(TokenizerError, match=r"'z' \(U\+007A\) at position 4"):
        tok.encode("abc z")
    with pytest.raises(TokenizerError, match=r"'é' \(U\+00E9\) at position 1"):
        tok.encode_array("aé")
    with pytest.raises(TokenizerError, match="outside the char vocabulary"):
        tok.decode([0, 99])


def test_char_save_load(tmp_path):
    tok = CharTokenizer(set("hello, wörld \u0000 👋"))
    path = tmp_path / "sub" / "vocab.json"
    tok.save(path)
    assert [p.name for p in path.parent.iterdir()] == ["vocab.json"]  # no temp file left behind
    loaded = build_tokenizer("char", path)
    assert loaded.chars == tok.chars and loaded.encode("wörld 👋") == tok.encode("wörld 👋")
    path.write_text("{not json")
    with pytest.raises(TokenizerError, match="unreadable"):
        CharTokenizer.load(path)
    with pytest.raises(TokenizerError, match="not found"):
        CharTokenizer.load(tmp_path / "missing.json")
    with pytest.raises(TokenizerError, match="needs vocab_path"):
        build_tokenizer("char")


def test_unknown_tokenizer_lists_valid_names():
    with pytest.raises(TokenizerError, match=r"unknown tokenizer 'gpt5'.*gpt2, char"):
        build_tokenizer("gpt5")


def test_gpt2_works_offline(no_network):
    with pytest.raises(OSError):
        socket.create_connection(("example.com", 443))
    tok = build_tokenizer("gpt2")
    assert tok.encode("Hello world") == [15496, 995]


def test_other_encoding_offline_is_a_clear_error(no_network):
    with pytest.raises(TokenizerError) as err:
        build_tokenizer("cl100k_base")
    msg = str(err.value)
    assert "'cl100k_base' is not available offline" in msg
    assert "'gpt2'" in msg and "TIKTOKEN_CACHE_DIR" in msg and "empty-cache" in msg


def test_corrupted_gpt2_files_are_refused(monkeypatch, tmp_path):
    src = tk.gpt2_data_dir()
    for name in ("encoder.json", "vocab.bpe"):
        (tmp_path / name).write_bytes((src / name).read_bytes())
    with open(tmp_path / "vocab.bpe", "ab") as f:
        f.write(b"x")
    monkeypatch.setattr(tk, "gpt2_data_dir", lambda: tmp_path)
    tk.gpt2_encoding.cache_clear()
    try:
        with pytest.raises(TokenizerError, match=r"vocab\.bpe has sha256 .* expected 1ce16647"):
            build_tokenizer("gpt2")
    finally:
        tk.gpt2_encoding.cache_clear()


def test_available_names_are_tiktoken_names():
    names = tk.available_tokenizers()
    assert names[:3] == ["gpt2", "char", "bpe"]
    assert set(names) - {"char", "bpe"} == set(tiktoken.list_encoding_names())
