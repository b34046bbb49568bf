"""The readers of record files (JSON lines, plain or gzipped; Parquet and Arrow via pyarrow): each record's text,
in order, at most one block or row batch in memory; records whose text is null or empty are counted, not
returned. Used by ``gptmini.data.corpora``."""

from __future__ import annotations

import collections
import gzip
import io
import json
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

from gptmini.data.errors import DataError

# Raw bytes read at a time from text and JSONL files.
BLOCK_BYTES = 1 << 20
# Rows converted to Python strings at a time from Parquet and Arrow files.
BATCH_ROWS = 1024


class _CountingReader(io.RawIOBase):
    """A raw file that counts (and optionally hashes) the bytes read through it: gzip's compressed bytes too."""

    def __init__(self, raw: io.BufferedReader, hasher: Any) -> None:
        self.raw, self.hasher, self.count = raw, hasher, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = self.raw.readinto(buffer)
        if n:
            self.count += n
            if self.hasher is not None:
                self.hasher.update(memoryview(buffer)[:n])
        return n


def open_corpus_file(path: Path) -> io.BufferedReader:
    try:
        return open(path, "rb")
    except OSError as e:
        raise DataError(f"cannot read corpus file {path}: {e.strerror or e}") from e


def _record_text(value: Any, where: str, text_field: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise DataError(
        f"{where}: field {text_field!r} holds {type(value).__name__}, not text; pass the field that holds the "
        "text (data.text_field=...)"
    )


def _texts(
    texts: list[str | None], share: int, dropped: collections.Counter[str]
) -> Generator[tuple[str, int, bool], None, int]:
    """Each record's text, one document each, the first carrying ``share`` source bytes; the share still to give."""
    for text in texts:
        if text:
            yield text, share, True
            share = 0
        else:
            dropped["null" if text is None else "empty"] += 1
    return share


def read_jsonl(
    path: Path, text_field: str, hasher: Any, dropped: collections.Counter[str]
) -> Iterator[tuple[str, int, bool]]:
    raw = open_corpus_file(path)
    counter = _CountingReader(raw, hasher)
    stream: Any = io.BufferedReader(counter, BLOCK_BYTES)
    if path.name.lower().endswith(".gz"):
        stream = gzip.GzipFile(fileobj=stream, mode="rb")
    consumed = 0
    with raw, stream:
        lineno = 0
        try:
            for lineno, line in enumerate(stream, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError as e:
                    raise DataError(
                        f"{path}:{lineno} is not a JSON object ({e}); fix or remove that line"
                    ) from e
                if not isinstance(record, dict):
                    raise DataError(f"{path}:{lineno} is a JSON {type(record).__name__}, not an object")
                if text_field not in record:
                    raise DataError(
                        f"{path}:{lineno} has no field {text_field!r} (fields: {', '.join(sorted(record))}); "
                        "pass the one that holds the text (data.text_field=...)"
                    )
                text = _record_text(record[text_field], f"{path}:{lineno}", text_field)
                if text:
                    yield text, counter.count - consumed, True
                    consumed = counter.count
                else:
                    dropped["null" if text is None else "empty"] += 1
        except (OSError, EOFError) as e:  # a truncated .gz download fails here, not silently
            raise DataError(f"cannot read {path} after line {lineno}: {e}; is the file complete?") from e


def _pyarrow() -> Any:
    try:
        import pyarrow as pa
        import pyarrow.parquet  # noqa: F401
    except ImportError as e:
        raise DataError(
            "Parquet and Arrow sources are read with pyarrow, which is not installed: pip install 'gptmini[data]' "
            "(or pip install pyarrow)"
        ) from e
    return pa


def _text_column(schema: Any, path: Path, text_field: str) -> int:
    pa = _pyarrow()
    index = schema.get_field_index(text_field)
    if index < 0:
        raise DataError(
            f"{path} has no column {text_field!r} (columns: {', '.join(schema.names)}); pass the one that holds "
            "the text (data.text_field=...)"
        )
    kind = schema.field(index).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)):
        raise DataError(
            f"{path}: column {text_field!r} is {kind}, not text; pass the column that holds the text "
            "(data.text_field=...)"
        )
    return index


def read_parquet(
    path: Path, text_field: str, size: int, records: bool, dropped: collections.Counter[str]
) -> Iterator[tuple[str, int, bool]]:
    pa = _pyarrow()
    try:
        pf = pa.parquet.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{path} is not a readable Parquet file ({e})") from e
    _text_column(pf.schema_arrow, path, text_field)
    if not records:
        return
    rows, done, reported = max(1, pf.metadata.num_rows), 0, 0
    for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=[text_field]):
        texts = batch.column(0).to_pylist()
        done += len(texts)
        share = size * done // rows - reported  # progress: the file's bytes in proportion to its rows
        reported += share
        yield from _texts(texts, share, dropped)


def read_arrow(
    path: Path, text_field: str, size: int, records: bool, dropped: collections.Counter[str]
) -> Iterator[tuple[str, int, bool]]:
    """Arrow IPC files: the stream format that ``datasets`` writes, or the random-access file format."""
    pa = _pyarrow()
    with pa.memory_map(str(path)) as source:
        try:
            reader = pa.ipc.open_stream(source)
            batches = iter(reader)
            count = None
        except pa.ArrowInvalid:
            source.seek(0)
            try:
                reader = pa.ipc.open_file(source)
            except pa.ArrowInvalid as e:
                raise DataError(f"{path} is not an Arrow IPC file ({e})") from e
            count = reader.num_record_batches
            batches = (reader.get_batch(i) for i in range(count))
        index = _text_column(reader.schema, path, text_field)
        if not records:
            return
        reported = 0
        for i, batch in enumerate(batches):
            # progress: how far into the file the reader is (the stream format is read front to back)
            share = (source.tell() if count is None else size * (i + 1) // count) - reported
            reported += share
            column = batch.column(index)
            for start in range(0, len(column), BATCH_ROWS):
                share = yield from _texts(column.slice(start, BATCH_ROWS).to_pylist(), share, dropped)
