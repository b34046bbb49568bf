"""Text -> token ids for preparation: documents cut into pieces where the ids cannot change, the pieces encoded by
a pool of threads (tiktoken releases the GIL) and written, in order, into token shards, resumable from any
recorded position. No torch or Lightning."""

from __future__ import annotations

import collections
import logging
import re
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

from gptmini.data.corpora import Corpus, Fragment
from gptmini.data.errors import DataError
from gptmini.data.progress import PrepareProgress, Reporter
from gptmini.data.reader import DTYPES
from gptmini.data.shards import ShardWriter
from gptmini.data.tokenizers import Tokenizer

log = logging.getLogger("gptmini.data.prepare")

# A piece of text encoded at once: ~64k characters, cut where the ids cannot change (see _CUT).
CHUNK_CHARS = 1 << 16
# Worst case bytes held per character in flight: the str (up to 4) and its ids (uint32, at most one per char).
_BYTES_PER_CHAR = 8

# Cut points: after a non-space character followed by a space, or after a letter or digit followed by a newline.
# No pre-token of GPT-2's pattern holds a non-space followed by whitespace, nor does one of cl100k's or o200k's
# hold a non-space followed by a space or a letter or digit followed by a newline; so encoding the pieces
# separately gives exactly the ids of encoding the whole text.
_CUT = re.compile(r"\S(?= )|[^\W_](?=\n)")


class Piece(NamedTuple):
    document: int
    offset: int  # characters into the document
    text: str
    end: bool  # the document's last piece


def pieces(fragments: Iterator[Fragment], chunk_chars: int = CHUNK_CHARS) -> Iterator[Piece]:
    """Each document cut into pieces of at least ``chunk_chars`` characters (its last one shorter) at the first cut
    point past that length: the cuts depend on the text only, not on how the fragments divide it, so a resumed
    preparation cuts exactly where the first one did. A stretch of ``4 * chunk_chars`` without a cut point (text
    without spaces or newlines) is cut there regardless, with a warning: the ids next to that cut may differ from
    encoding the document whole."""
    longest = 4 * chunk_chars
    # buf[pos:] is not emitted yet, and starts ``offset`` characters into the document
    buf, pos, offset = "", 0, 0
    warned = -1  # the last document warned about: once each
    for frag in fragments:
        buf = buf[pos:] + frag.text if pos < len(buf) else frag.text
        pos = 0
        while len(buf) - pos > chunk_chars:
            m = _CUT.search(buf, pos + chunk_chars - 1, pos + longest + 1)
            if m is not None:
                cut = m.end()
            elif len(buf) - pos > longest:
                cut = pos + longest
                if warned != frag.document:
                    warned = frag.document
                    log.warning(
                        "document %d has no space or newline in %d characters after character %d: cut there (and "
                        "wherever this happens again in it), so the ids next to such a cut may differ from "
                        "encoding the document whole",
                        frag.document,
                        longest,
                        offset,
                    )
            else:
                break  # wait for more of the document
            yield Piece(frag.document, offset, buf[pos:cut], False)
            offset += cut - pos
            pos = cut
        if frag.end:
            yield Piece(frag.document, offset, buf[pos:], True)
            buf, pos, offset = "", 0, 0


def split_for_encoding(text: str, chunk_chars: int = CHUNK_CHARS) -> list[str]:
    """``text`` cut as preparation cuts one document: the pieces encode to exactly the ids of the whole."""
    if not text:
        return []
    return [p.text for p in pieces(iter([Fragment(0, text, 0, True)]), chunk_chars)]


def token_dtype(vocab_size: int) -> np.dtype:
    return DTYPES["uint16"] if vocab_size <= 1 << 16 else DTYPES["uint32"]


def _encode_task(
    tokenizer: Tokenizer, task: Sequence[tuple[Piece, int]], eot: int | None, dtype: np.dtype
) -> tuple[np.ndarray, np.ndarray]:
    """In a worker thread: the ids of the pieces (each document's last one followed by ``eot``), the first
    ``skip`` ids of a piece left out, in the shards' dtype; and where each piece's ids start in them."""
    parts = []
    for piece, skip in task:
        ids = tokenizer.encode_array(piece.text)
        if piece.end and eot is not None:
            ids = np.append(ids, eot)
        parts.append(ids[skip:])
    starts = np.zeros(len(parts), dtype=np.int64)
    np.cumsum([len(p) for p in parts[:-1]], out=starts[1:])
    return np.concatenate(parts).astype(dtype, copy=False), starts


def _pieces_from(
    corpus: Corpus, fragments: Iterator[Fragment], resume: Sequence[int] | None
) -> Iterator[tuple[Piece, int]]:
    """The pieces of ``fragments`` from ``resume`` = (document, offset, ids to skip) on, each with the ids of it to
    skip (all 0 but the first's)."""
    r_doc, r_offset, r_skip = resume or (0, 0, 0)
    found = resume is None
    for piece in pieces(fragments):
        key = (piece.document, piece.offset)
        if key < (r_doc, r_offset):
            continue
        if not found:
            if key != (r_doc, r_offset):
                raise DataError(
                    f"cannot resume the preparation of {corpus.source!r}: its text no longer divides as it did; "
                    "prepare again with --force"
                )
            found = True
            yield piece, r_skip
            continue
        yield piece, 0


def tokenize_corpus(
    corpus: Corpus,
    tokenizer: Tokenizer,
    writer: ShardWriter,
    resume: Sequence[int] | None,
    threads: int,
    buffer_mb: int,
    callback: Callable[[PrepareProgress], None] | None,
    dropped: collections.Counter[str] | None = None,
) -> tuple[int, int]:
    """Read, cut, encode (threads) and write the whole stream, from ``resume`` = (document, offset, ids to skip)
    on: the text before it is read again, not encoded. Returns (documents, characters) of the whole corpus."""
    eot = None if corpus.single_text else tokenizer.eot_id
    r_doc = resume[0] if resume else 0
    in_flight = max(2, 2 * threads)
    task_chars = max(CHUNK_CHARS, buffer_mb * (1 << 20) // (_BYTES_PER_CHAR * in_flight))
    report = Reporter("tokenizing", corpus.total_bytes, callback)
    stats = [0, 0, 0]  # documents, characters, bytes read

    def fragments() -> Iterator[Fragment]:
        for frag in corpus.fragments(dropped=dropped):
            stats[0] += frag.end
            stats[1] += len(frag.text)
            stats[2] += frag.nbytes
            report(stats[0], writer.tokens, stats[2])
            if frag.document >= r_doc:
                yield frag

    def write(task: list[tuple[Piece, int]], result: Future) -> None:
        tokens, starts = result.result()

        def position_at(i: int) -> list[int]:
            j = int(np.searchsorted(starts, i, side="right")) - 1
            piece, skip = task[j]
            return [piece.document, piece.offset, int(i - starts[j]) + skip]

        writer.write(tokens, position_at)
        report(stats[0], writer.tokens, stats[2])

    pending: collections.deque[tuple[list[tuple[Piece, int]], Future]] = collections.deque()
    pool = ThreadPoolExecutor(
        threads, thread_name_prefix="gptmini-tokenize"
    )  # threads start at the first submit
    try:
        task: list[tuple[Piece, int]] = []
        size = 0
        warmed = False
        for item in _pieces_from(corpus, fragments(), resume):
            if not warmed:
                # The first encode on this thread, before any worker's. Measured (tiktoken, 2 threads, a 40 MB
                # corpus): when the workers make a fresh encoder's first calls themselves, they encode at about
                # 14 MB/s for the whole preparation; after this call, 21-23 MB/s, tiktoken's own batch speed.
                tokenizer.encode_array(item[0].text[:1000])
                warmed = True
            task.append(item)
            size += len(item[0].text)
            if size >= task_chars:
                pending.append((task, pool.submit(_encode_task, tokenizer, task, eot, writer.dtype)))
                task, size = [], 0
                while len(pending) >= in_flight:
                    write(*pending.popleft())
        if task:
            pending.append((task, pool.submit(_encode_task, tokenizer, task, eot, writer.dtype)))
        while pending:
            write(*pending.popleft())
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    report(stats[0], writer.tokens, corpus.total_bytes, force=True)
    return stats[0], stats[1]
