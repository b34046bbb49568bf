"""The attention summaries of the ATTENTION tab, and the one contract between them, the backend and the tab's page:
one TensorBoard tensor summary per logged step holding every layer and head's attention on a probe text,
quantised to uint8 over the causal lower triangle, the tokens as strings and each head's type.

Format (a DT_STRING tensor of two elements, under the plugin's name, data class TENSOR):
  [0] a UTF-8 JSON header: {"version", "n_layer", "n_head", "tokens", "head_types" (n_layer x n_head or null),
      "scores" (name -> n_layer x n_head, or {})}
  [1] the probabilities: uint8, round(p * LEVELS), layer-major, then head, then the rows of the lower triangle
      (row i holds keys 0..i), T * (T + 1) / 2 bytes per head (``LAYOUT``).
:func:`contract` is what the page receives (the ``contract`` route): the tag, the levels, the layout, the header's
keys and the head types with their titles and colours, so that the page repeats none of them. Training and the
own-text route both encode with :func:`encode`; :func:`decode` validates every field of a header it reads.
Only NumPy and TensorBoard's protos: TensorBoard imports this module, and must not wait for torch."""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from tensorboard.compat.proto import summary_pb2
from tensorboard.util import tensor_util

from gptmini.board import PLUGIN_NAME

VERSION = 1
TAG = "attention/probe"  # the one tag a training run writes; the tab also reads any other tag of this plugin
LEVELS = 255  # uint8 quantisation: p is stored as round(p * LEVELS)
LAYOUT = (
    "layer-head-tril-rows"  # byte (l * n_head + h) * T(T+1)/2 + i(i+1)/2 + j: layer l, head h, query i, key j
)
HEADER_KEYS = ("version", "n_layer", "n_head", "tokens", "head_types", "scores")
# Each head type gptmini.insight.scores.head_types gives (in its order of precedence), as the tab shows it:
# (name, title, colour). The last is the type of a head of none of the others (the tab names it less loudly). A
# test holds the names against the insight module.
HEAD_TYPES: tuple[tuple[str, str, str], ...] = (
    ("induction", "induction", "#c2185b"),
    ("previous-token", "previous token", "#1565c0"),
    ("first-token", "first token (sink)", "#6d4c41"),
    ("local", "local", "#2e7d32"),
    ("other", "other", "#9e9e9e"),
)
# What a header read back may declare: a summary beyond these is damaged, not a model (the bytes must match too).
MAX_LAYERS = 1024
MAX_HEADS = 1024
MAX_TOKENS = 4096


class SummaryFormatError(ValueError):
    """A summary of this plugin that cannot be decoded (another version, or damaged)."""


@dataclass(frozen=True)
class AttentionSummary:
    tokens: list[str]
    probs: np.ndarray  # (n_layer, n_head, T, T) float32, causal: zero above the diagonal
    head_types: list[list[str]] | None = None
    scores: Mapping[str, list[list[float]]] | None = None

    @property
    def shape(self) -> tuple[int, int, int]:
        n_layer, n_head, t, _ = self.probs.shape
        return n_layer, n_head, t


def contract() -> dict[str, Any]:
    """What the tab's page needs to read this module's summaries (served as JSON by the ``contract`` route)."""
    return {
        "plugin": PLUGIN_NAME,
        "version": VERSION,
        "tag": TAG,
        "levels": LEVELS,
        "layout": LAYOUT,
        "header_keys": list(HEADER_KEYS),
        "head_types": [{"name": n, "title": t, "colour": c} for n, t, c in HEAD_TYPES],
        "default_type": HEAD_TYPES[-1][0],
    }


def quantise(probs: np.ndarray) -> np.ndarray:
    """(n_layer, n_head, T, T) probabilities -> (n_layer, n_head, T(T+1)/2) uint8 of the lower triangle."""
    t = probs.shape[-1]
    rows, cols = np.tril_indices(t)
    tri = np.asarray(probs, dtype=np.float32)[..., rows, cols]
    return np.clip(np.rint(tri * LEVELS), 0, LEVELS).astype(np.uint8)


def dequantise(tri: np.ndarray, t: int) -> np.ndarray:
    """The inverse of :func:`quantise` (within 1 / (2 * LEVELS)): (..., T(T+1)/2) uint8 -> (..., T, T) float32."""
    out = np.zeros((*tri.shape[:-1], t, t), dtype=np.float32)
    rows, cols = np.tril_indices(t)
    out[..., rows, cols] = tri.astype(np.float32) / LEVELS
    return out


def encode(summary: AttentionSummary) -> tuple[dict[str, Any], np.ndarray]:
    """``summary`` as what is stored and served: (JSON header, uint8 triangles of shape (n_layer, n_head,
    T(T+1)/2)). ValueError naming the field when the summary is inconsistent."""
    n_layer, n_head, t = summary.shape
    if len(summary.tokens) != t:
        raise ValueError(f"{len(summary.tokens)} tokens for attention maps over {t} positions")
    if summary.head_types is not None:
        if len(summary.head_types) != n_layer or any(len(row) != n_head for row in summary.head_types):
            raise ValueError(f"head_types must be {n_layer} rows of {n_head} labels")
        known = [name for name, _, _ in HEAD_TYPES]
        unknown = sorted({x for row in summary.head_types for x in row} - set(known))
        if unknown:
            raise ValueError(f"head_types holds {unknown}, which is no head type; one of {known}")
    header = {
        "version": VERSION,
        "n_layer": n_layer,
        "n_head": n_head,
        "tokens": list(summary.tokens),
        "head_types": summary.head_types,
        # a score that is not a number (a diverged model) is stored as null: JSON has no NaN
        "scores": {
            name: [[float(x) if _finite(x) else None for x in row] for row in grid]
            for name, grid in (summary.scores or {}).items()
        },
    }
    return header, quantise(summary.probs)


def summary_proto(summary: AttentionSummary, tag: str = TAG) -> summary_pb2.Summary:
    """``summary`` as a TensorBoard Summary protobuf (write it with a SummaryWriter's ``file_writer.add_summary``)."""
    header, tri = encode(summary)
    payload = np.array([json.dumps(header, separators=(",", ":")).encode(), tri.tobytes()], dtype=object)
    metadata = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(
            plugin_name=PLUGIN_NAME, content=json.dumps({"version": VERSION}).encode()
        ),
        data_class=summary_pb2.DATA_CLASS_TENSOR,
        summary_description="gptmini attention maps (see the ATTENTION tab)",
    )
    value = summary_pb2.Summary.Value(
        tag=tag, metadata=metadata, tensor=tensor_util.make_tensor_proto(payload)
    )
    return summary_pb2.Summary(value=[value])


def decode(value: Any) -> tuple[dict[str, Any], np.ndarray]:
    """A stored summary (the ndarray TensorBoard's data provider returns) -> (header, uint8 triangles of shape
    (n_layer, n_head, T(T+1)/2)). The header returned holds exactly ``HEADER_KEYS``, each of the type and range
    the page reads. SummaryFormatError naming the field when it is not one this version wrote."""
    arr = np.asarray(value)
    if arr.shape != (2,) or not all(isinstance(x, bytes) for x in arr):
        raise SummaryFormatError(f"expected two byte strings, found an array of shape {arr.shape}")
    try:
        header = json.loads(arr[0].decode())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise SummaryFormatError(f"unreadable header: {type(err).__name__}") from None
    header = _check_header(header)
    n_layer, n_head, t = header["n_layer"], header["n_head"], len(header["tokens"])
    tri = np.frombuffer(arr[1], dtype=np.uint8)
    if tri.size != n_layer * n_head * t * (t + 1) // 2:
        raise SummaryFormatError(f"{tri.size} bytes for {n_layer}x{n_head} heads over {t} tokens")
    return header, tri.reshape(n_layer, n_head, t * (t + 1) // 2)


def _check_header(header: Any) -> dict[str, Any]:
    """The header of a stored summary, every field checked (type and range): a clean copy holding ``HEADER_KEYS``
    (head_types None and scores {} when absent). SummaryFormatError naming the first bad field."""
    if not isinstance(header, dict):
        raise SummaryFormatError(f"the header is a JSON {type(header).__name__}, not an object")
    if header.get("version") != VERSION:
        raise SummaryFormatError(
            f"version {_short(header.get('version'))}; this gptmini reads version {VERSION}"
        )
    n_layer = _count(header, "n_layer", MAX_LAYERS)
    n_head = _count(header, "n_head", MAX_HEADS)
    tokens = header.get("tokens")
    if not isinstance(tokens, list) or not 1 <= len(tokens) <= MAX_TOKENS:
        raise SummaryFormatError(f"tokens must be a list of 1 to {MAX_TOKENS} strings, not {_short(tokens)}")
    if not all(isinstance(x, str) for x in tokens):
        raise SummaryFormatError("tokens must all be strings")
    head_types = header.get("head_types")
    if head_types is not None:
        known = {name for name, _, _ in HEAD_TYPES}
        if not _grid(head_types, n_layer, n_head, lambda x: isinstance(x, str) and x in known):
            raise SummaryFormatError(
                f"head_types must be null or {n_layer} rows of {n_head} of {sorted(known)}, not {_short(head_types)}"
            )
    scores = header.get("scores") or {}
    if not isinstance(scores, dict):
        raise SummaryFormatError(f"scores must be an object, not {_short(scores)}")
    for name, grid in scores.items():
        if not _grid(grid, n_layer, n_head, lambda x: x is None or _finite(x)):
            raise SummaryFormatError(
                f"scores[{_short(name)}] must be {n_layer} rows of {n_head} finite numbers (or null)"
            )
    return {
        "version": VERSION,
        "n_layer": n_layer,
        "n_head": n_head,
        "tokens": tokens,
        "head_types": head_types,
        "scores": scores,
    }


def _count(header: dict[str, Any], key: str, most: int) -> int:
    value = header.get(key)
    # bool is an int in Python, but true is no count
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise SummaryFormatError(f"{key} must be an integer from 1 to {most}, not {_short(value)}")
    return value


def _finite(x: Any) -> bool:
    # NumPy's scalars are numbers.Real too; true and false are no scores
    return isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_)) and math.isfinite(x)


def _grid(grid: Any, rows: int, cols: int, ok: Any) -> bool:
    return (
        isinstance(grid, list)
        and len(grid) == rows
        and all(isinstance(row, list) and len(row) == cols and all(ok(x) for x in row) for row in grid)
    )


def _short(value: Any) -> str:
    if isinstance(value, (list, dict)):  # named by kind and size: it may be large or deeply nested
        return f"a JSON {'array' if isinstance(value, list) else 'object'} of {len(value)} elements"
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def to_summary(header: Mapping[str, Any], tri: np.ndarray) -> AttentionSummary:
    return AttentionSummary(
        tokens=list(header["tokens"]),
        probs=dequantise(tri, len(header["tokens"])),
        head_types=header.get("head_types"),
        scores=header.get("scores") or {},
    )
