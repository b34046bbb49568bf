"""A byte-level BPE trained on the corpus: ``tokenizer=bpe tokenizer.vocab_size=8192``.

Trained with ``rustbpe`` (the merges, from a bounded sample of the training text) and encoded with ``tiktoken``
(training, sampling, evaluation): rustbpe's ranks are tiktoken's ``mergeable_ranks``, so tiktoken encodes exactly
as the trainer does. Ids 0..255 are the single bytes, so every text encodes (no unknown token) and decodes back
exactly; the merges follow in the order they were learnt, and ``<|endoftext|>`` is the last id, as in GPT-2.

The tokenizer is saved beside the token shards as ``bpe.json``: plain JSON (the pattern, the special tokens and
each token's bytes in base64, in rank order), never pickle. Its settings (vocabulary size, sample bound, pattern,
``val_fraction``) are part of the prepared data's settings, so it is trained again only when they or the corpus
change; training is deterministic (the same text and settings give the same ranks).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from gptmini.data.errors import DataError
from gptmini.data.reader import load_meta, load_split, load_tokenizer
from gptmini.data.tokenizers import (
    BPE_FORMAT,
    GPT4_PAT_STR,
    SPECIAL_TOKENS,
    BPETokenizer,
    TokenizerError,
    build_tokenizer,
)

log = logging.getLogger(__name__)

# The single bytes plus the special tokens: the smallest vocabulary that can encode every text.
MIN_VOCAB = 256 + len(SPECIAL_TOKENS)
# tiktoken's ids are uint32 in the shards
MAX_VOCAB = 1 << 32
# Text the trainer reads at most, by default. Its memory is the text in flight (TRAIN_BUFFER pieces of at most
# PIECE_CHARS characters) plus a count per distinct pre-token of the sample (docs/data.md): it grows with the sample's
# vocabulary, not its length; its time grows with the length.
DEFAULT_TRAIN_BYTES = 100_000_000
# The sample goes to the trainer in pieces of at most this many characters, cut after whitespace where there is
# some, TRAIN_BUFFER pieces at a time: at most 64 Mi characters in flight, whatever the corpus's blocks or rows.
PIECE_CHARS = 1 << 16
TRAIN_BUFFER = 1024
DEFAULT_VOCAB = 8192
# Held-out tokens the bytes-per-token report reads at most.
REPORT_TOKENS = 2_000_000


def check_settings(vocab_size: Any, train_bytes: Any) -> None:
    """Refuse a vocabulary or sample bound the trainer cannot use, naming the config key."""
    key = "tokenizer."
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise TokenizerError(
            f"{key}vocab_size={vocab_size!r} is not an integer: the bpe tokenizer needs a vocabulary size, "
            f"e.g. {key}vocab_size={DEFAULT_VOCAB}"
        )
    if not MIN_VOCAB <= vocab_size < MAX_VOCAB:
        raise TokenizerError(
            f"{key}vocab_size={vocab_size} is out of range: a byte-level BPE needs at least {MIN_VOCAB} tokens (256 "
            f"bytes + {len(SPECIAL_TOKENS)} special token), e.g. {key}vocab_size={DEFAULT_VOCAB}"
        )
    if isinstance(train_bytes, bool) or not isinstance(train_bytes, int) or train_bytes < 1:
        raise TokenizerError(
            f"{key}train_bytes={train_bytes!r} is invalid: the bound on the text the tokenizer is trained on must "
            f"be an integer >= 1 (default {DEFAULT_TRAIN_BYTES})"
        )


def bpe_settings(vocab_size: int | None, train_bytes: int | None, val_fraction: float) -> dict[str, Any]:
    """What decides a trained BPE besides the corpus, for the prepared data's settings (and so its identity)."""
    vocab_size = DEFAULT_VOCAB if vocab_size is None else vocab_size
    train_bytes = DEFAULT_TRAIN_BYTES if train_bytes is None else train_bytes
    check_settings(vocab_size, train_bytes)
    return {
        "format_version": BPE_FORMAT,
        "vocab_size": vocab_size,
        "train_bytes": train_bytes,
        "pattern": GPT4_PAT_STR,
        # the sample stops before the held-out part of the corpus, which depends on it
        "val_fraction": val_fraction,
    }


def training_sample(
    fragments: Iterable[Any], total_source_bytes: int, train_bytes: int, val_fraction: float
) -> Iterator[str]:
    """The training text: the corpus from its start, at most ``train_bytes`` of UTF-8 and never past the first
    ``1 - val_fraction`` of its source bytes (the held-out part is at the end of the stream). ``fragments``: the
    corpus's ``Fragment`` s (``text`` and the source ``nbytes`` read for it)."""
    stop_source = math.floor((1.0 - val_fraction) * total_source_bytes)
    read_source, taken = 0, 0
    for frag in fragments:
        if read_source >= stop_source or taken >= train_bytes:
            return
        text, left = frag.text, stop_source - read_source
        if frag.nbytes > left:  # the held-out part starts inside this block: its share of the text before
            text = text[: len(text) * left // frag.nbytes]
        read_source += frag.nbytes
        for piece in _pieces(text):
            data = piece.encode("utf-8", "surrogatepass")
            if taken + len(data) > train_bytes:
                # cut at a character boundary: a partial character would be a byte the text never holds
                yield data[: train_bytes - taken].decode("utf-8", "ignore")
                return
            taken += len(data)
            yield piece


def _pieces(text: str) -> Iterator[str]:
    """``text`` in pieces of at most ``PIECE_CHARS`` characters, each cut after its last whitespace character
    when it has one (so few words are split between two pieces)."""
    start = 0
    while len(text) - start > PIECE_CHARS:
        end = start + PIECE_CHARS
        space = max(text.rfind(" ", start, end), text.rfind("\n", start, end))
        cut = space + 1 if space > start else end
        yield text[start:cut]
        start = cut
    yield text[start:]


def train_bpe(texts: Iterable[str], vocab_size: int, pattern: str = GPT4_PAT_STR) -> BPETokenizer:
    """Learn ``vocab_size - 1`` ranks (256 bytes and the merges) from ``texts``; ``<|endoftext|>`` takes the
    last id. Raises TokenizerError when the text cannot give that many tokens."""
    check_settings(vocab_size, 1)
    import rustbpe

    trainer = rustbpe.Tokenizer()
    # rustbpe logs a line per percent of the merges through Python logging: shown only when debugging
    trainer_log = logging.getLogger("rustbpe")
    level = trainer_log.level
    trainer_log.setLevel(logging.DEBUG if log.isEnabledFor(logging.DEBUG) else logging.WARNING)
    try:
        trainer.train_from_iterator(
            iter(texts),
            vocab_size=vocab_size - len(SPECIAL_TOKENS),
            buffer_size=TRAIN_BUFFER,
            pattern=pattern,
        )
    finally:
        trainer_log.setLevel(level)
    ranks = sorted(
        ((bytes(token), rank) for token, rank in trainer.get_mergeable_ranks()), key=lambda r: r[1]
    )
    if [r for _, r in ranks] != list(range(len(ranks))) or len(ranks) < 256:
        raise TokenizerError(
            f"the BPE trainer returned {len(ranks)} ranks that are not 0..n-1; reinstall rustbpe"
        )
    supported = len(ranks) + len(SPECIAL_TOKENS)
    if supported < vocab_size:
        raise TokenizerError(
            f"tokenizer.vocab_size={vocab_size} is more than the training text supports: it has no pair left to "
            f"merge after {supported} tokens; use tokenizer.vocab_size={supported} or less, or more text"
        )
    return BPETokenizer([token for token, _ in ranks], pattern)


def bytes_per_token(tokenizer: Any, ids: np.ndarray) -> float:
    """UTF-8 bytes per token of ``ids`` (special tokens cover no bytes)."""
    if len(ids) == 0:
        return float("nan")
    return float(tokenizer.token_bytes()[np.asarray(ids, dtype=np.int64)].sum()) / len(ids)


def compare_with_gpt2(tokenizer: Any, ids: np.ndarray, max_tokens: int = REPORT_TOKENS) -> dict[str, float]:
    """Bytes per token of (up to ``max_tokens`` of) held-out ``ids`` and of the same text in GPT-2's BPE."""
    ids = np.asarray(ids[:max_tokens], dtype=np.int64)
    text = tokenizer.decode(ids.tolist())
    gpt2 = build_tokenizer("gpt2")
    n_gpt2 = len(gpt2.encode_array(text))
    n_bytes = len(text.encode("utf-8", "surrogatepass"))
    return {
        "bytes_per_token": bytes_per_token(tokenizer, ids),
        "gpt2_bytes_per_token": n_bytes / n_gpt2 if n_gpt2 else float("nan"),
    }


def trained_bpe(corpus: Any, settings: Mapping[str, Any], saved: Path | None = None) -> BPETokenizer:
    """The BPE of ``settings`` (``bpe_settings``) for ``corpus`` (a ``gptmini.data.corpora.Corpus``): the one a
    resumed preparation saved at ``saved``, else trained on ``training_sample`` of the corpus."""
    if saved is not None and saved.is_file():
        try:
            tok = BPETokenizer.load(saved)
        except TokenizerError:
            tok = None
        if tok is not None and tok.vocab_size == settings["vocab_size"]:
            return tok
    log.info(
        "training a byte-level BPE of %d tokens on at most %s bytes of %s",
        settings["vocab_size"],
        f"{settings['train_bytes']:,}",
        corpus.source,
    )
    sample = training_sample(
        corpus.fragments(), corpus.total_bytes, settings["train_bytes"], settings["val_fraction"]
    )
    try:
        return train_bpe(sample, settings["vocab_size"], settings["pattern"])
    except TokenizerError as e:  # the corpus cannot give that vocabulary: bad input, found before tokenizing
        raise DataError(str(e)) from None


def log_compression(data_dir: str | Path, meta: Mapping[str, Any] | None = None) -> dict[str, float] | None:
    """Log (and return) the bytes per token of a prepared folder's held-out text against GPT-2's BPE; None when
    the folder has no held-out tokens."""
    meta = load_meta(data_dir) if meta is None else meta
    ids = np.asarray(load_split(data_dir, "val", meta)[:REPORT_TOKENS])
    if len(ids) == 0:
        return None
    result = compare_with_gpt2(load_tokenizer(data_dir, meta), ids)
    log.info(
        "held-out text: %.3f bytes per token with this %s tokenizer (%d tokens), %.3f with GPT-2's BPE",
        result["bytes_per_token"],
        meta["tokenizer"],
        meta["vocab_size"],
        result["gpt2_bytes_per_token"],
    )
    return result
