"""The attention summaries of the ATTENTION tab, and the one contract between them, the backend and the tab's page:
one TensorBoard tensor summary per logged step holding every layer and head's attention on a probe text,
quantised to uint8 over the causal lower triangle, the tokens as strings and each head's type.

Format (a DT_STRING tensor of two elements, under the plugin's name, data class TENSOR):
  [0] a UTF-8 JSON header holding ``HEADER_KEYS``: "version", "n_layer", "n_head", "tokens", "head_types"
      (n_layer x n_head or null), "scores" (name -> n_layer x n_head, or {}), and "sink", "lens", "vectors",
      "circuits" (each null when not logged; their fields and shapes: ``sink_header``, ``lens_header``,
      ``vectors_header``, ``circuits_header``).
  [1] the probabilities: uint8, round(p * LEVELS), in the order of ``LAYOUT``, T * (T + 1) / 2 bytes per head.
:func:`contract` is what the page receives (the ``contract`` route), so that the page repeats none of it.
Only NumPy and TensorBoard's protos: TensorBoard imports this module, and must not wait for torch."""

from __future__ import annotations

import base64
import binascii
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
HEADER_KEYS = (
    "version",
    "n_layer",
    "n_head",
    "tokens",
    "head_types",
    "scores",
    "sink",
    "lens",
    "vectors",
    "circuits",
)
CIRCUIT_KEYS = ("attribution", "composition", "circuit_tokens", "qk", "ov")
COMPOSITION_MODES = ("Q", "K", "V")
# The QK and OV circuits a summary keeps: over the probe's first distinct tokens, at most this many of them and
# at most MAX_CIRCUIT_VALUES values (qk and ov together, 2 bytes each) over every head
MAX_CIRCUIT_TOKENS = 32
MAX_CIRCUIT_VALUES = 2**16
VECTOR_KEYS = ("layers", "head_size", "scale", "q", "k", "slopes", "window", "sink")
# The queries and keys a summary keeps: at most this many values (q and k together, 2 bytes each); the layers
# from the first that fit, none when one does not (the neuron view then runs on your own text only)
MAX_VECTOR_VALUES = 2**17
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
    sink: Mapping[str, Any] | None = None  # {"first": grid, "learned": grid or None}
    lens: Mapping[str, Any] | None = None  # see lens_header
    vectors: Mapping[str, Any] | None = None  # see vectors_header
    circuits: Mapping[str, Any] | None = None  # see circuits_header


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
    n_layer, n_head, t, _ = summary.probs.shape
    if len(summary.tokens) != t:
        raise ValueError(f"{len(summary.tokens)} tokens for attention maps over {t} positions")
    _entry({"head_types": summary.head_types}, "", {"head_types?": ((n_layer, n_head), _HEAD_TYPE)})
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
        "sink": None if summary.sink is None else dict(summary.sink),
        "lens": None if summary.lens is None else dict(summary.lens),
        "vectors": None if summary.vectors is None else dict(summary.vectors),
        "circuits": None if summary.circuits is None else dict(summary.circuits),
    }
    return header, quantise(summary.probs)


def _rounded(values: np.ndarray, digits: int = 4) -> list[Any]:
    # nested lists of numbers, None where one is not finite (JSON has no NaN)
    if values.ndim > 1:
        return [_rounded(row, digits) for row in values]
    return [round(x, digits) if math.isfinite(x) else None for x in values.tolist()]


def sink_header(first: np.ndarray, learned: np.ndarray | None) -> dict[str, Any]:
    """The ``sink`` entry: each head's share on the first token and on the learned sink, (n_layer, n_head) each."""
    return {
        "first": _rounded(np.asarray(first)),
        "learned": None if learned is None else _rounded(np.asarray(learned)),
    }


def lens_header(
    rows: list[str], top: list[list[str]], prob: np.ndarray, target: np.ndarray
) -> dict[str, Any]:
    """The ``lens`` entry: for each row (the embeddings, then each block), the top token at each position, its
    probability (rows, T) and the probability of the token that comes next (rows, T - 1); optionally each row's
    "loss" and "top1" (``gptmini.board.detail``)."""
    return {
        "rows": list(rows),
        "top": [list(r) for r in top],
        "prob": _rounded(prob),
        "target": _rounded(target),
    }


def vectors_header(
    q: np.ndarray,
    k: np.ndarray,
    scale: float,
    slopes: np.ndarray | None = None,
    window: int | None = None,
    sink: np.ndarray | None = None,
    max_values: int | None = MAX_VECTOR_VALUES,
) -> dict[str, Any] | None:
    """The ``vectors`` entry from queries and keys (n_layer, n_head, T, hs), ALiBi's slopes (n_head,), the window
    and the sink logits (n_layer, n_head): the first layers within ``max_values`` (None: every layer, as your own
    text gets them), or None when not one layer fits."""
    per_layer = 2 * q[0].size
    layers = q.shape[0] if max_values is None else min(q.shape[0], max_values // per_layer)
    if layers == 0:
        return None
    return {
        "layers": int(layers),
        "head_size": int(q.shape[-1]),
        "scale": float(scale),
        "q": _b64_f16(q[:layers]),
        "k": _b64_f16(k[:layers]),
        "slopes": None if slopes is None else _rounded(np.asarray(slopes, dtype=np.float64), 8),
        "window": window,
        "sink": None if sink is None else _rounded(np.asarray(sink)[:layers]),
    }


def _b64_f16(x: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(x, dtype="<f2").tobytes()).decode("ascii")


def circuits_header(
    attribution: np.ndarray,
    composition: Mapping[str, np.ndarray],
    circuit_tokens: list[str],
    qk: np.ndarray,
    ov: np.ndarray,
) -> dict[str, Any]:
    """The ``circuits`` entry: each head's direct logit attribution at each position, for the token that comes next
    (n_layer, n_head, T - 1); the Q-, K- and V-composition of each head on each head of the next layer (n_layer - 1,
    n_head, n_head; ``[l, a, b]``: head a of layer l on head b of layer l + 1); and every head's QK and OV circuits
    over ``circuit_tokens`` (n_layer, n_head, n, n), float16 little-endian in base64 (``gptmini.insight.circuits``)."""
    return {
        "attribution": _rounded(np.asarray(attribution), 3),
        "composition": {mode: _rounded(np.asarray(composition[mode]), 3) for mode in COMPOSITION_MODES},
        "circuit_tokens": list(circuit_tokens),
        "qk": _b64_f16(qk),
        "ov": _b64_f16(ov),
    }


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
    scores = header.get("scores") or {}
    if not isinstance(scores, dict):
        raise SummaryFormatError(f"scores must be an object, not {_short(scores)}")
    head_types = _entry(header, "", {"head_types?": ((n_layer, n_head), _HEAD_TYPE)})["head_types"]
    _entry(scores, "scores", {name: ((n_layer, n_head), _FINITE_OR_NULL) for name in scores})
    return {
        "version": VERSION,
        "n_layer": n_layer,
        "n_head": n_head,
        "tokens": tokens,
        "head_types": head_types,
        "scores": scores,
        "sink": _check_sink(header.get("sink"), n_layer, n_head),
        "lens": _check_lens(header.get("lens"), n_layer, len(tokens)),
        "vectors": _check_vectors(header.get("vectors"), n_layer, n_head, len(tokens)),
        "circuits": _check_circuits(header.get("circuits"), n_layer, n_head, len(tokens)),
    }


# What an entry's leaves must be: (their description in a refusal, the check)
_NUMBERS = ("numbers", lambda x: _finite(x))
_FINITE_OR_NULL = ("numbers (or null)", lambda x: x is None or _finite(x))
_STRINGS = ("strings", lambda x: isinstance(x, str))
_HEAD_TYPE = (
    f"of {sorted(name for name, _, _ in HEAD_TYPES)}",
    lambda x: isinstance(x, str) and x in {name for name, _, _ in HEAD_TYPES},
)


def _entry(entry: Any, where: str, fields: Mapping[str, tuple[tuple[int, ...], Any]]) -> dict[str, Any]:
    """``entry`` (an object of the header) with each of ``fields`` checked: ``name -> (shape, (what, ok))``, the
    value nested lists of that shape whose leaves pass ``ok``; a name ending in ``?`` may also be null. Returns
    the fields' values; SummaryFormatError naming the first bad one."""
    if not isinstance(entry, dict):
        raise SummaryFormatError(f"{where} must be an object, not {_short(entry)}")
    values = {}
    for name, (shape, (what, ok)) in fields.items():
        key = name.removesuffix("?")
        value = values[key] = entry.get(key)
        if not (name.endswith("?") and value is None) and not _shaped(value, shape, ok):
            null = "null or " if name.endswith("?") else ""
            size = "".join(f"{n} x " for n in shape).removesuffix("x ")
            raise SummaryFormatError(f"{where}{'.' if where else ''}{key} must be {null}{size}{what}")
    return values


def _shaped(value: Any, shape: tuple[int, ...], ok: Any) -> bool:
    """Whether ``value`` is nested lists of ``shape`` (a leaf itself for ``()``) whose leaves pass ``ok``."""
    if not shape:
        return ok(value)
    return (
        isinstance(value, list) and len(value) == shape[0] and all(_shaped(v, shape[1:], ok) for v in value)
    )


def _check_sink(sink: Any, n_layer: int, n_head: int) -> dict[str, Any] | None:
    if sink is None:
        return None
    grid = ((n_layer, n_head), _FINITE_OR_NULL)
    return _entry(sink, "sink", {"first": grid, "learned?": grid})


def _check_lens(lens: Any, n_layer: int, t: int) -> dict[str, Any] | None:
    if lens is None:
        return None
    rows = n_layer + 1  # the embeddings, then each layer
    return _entry(
        lens,
        "lens",
        {
            "rows": ((rows,), _STRINGS),
            "top": ((rows, t), _STRINGS),
            "prob": ((rows, t), _FINITE_OR_NULL),
            "target": ((rows, t - 1), _FINITE_OR_NULL),
            "loss?": ((rows,), _FINITE_OR_NULL),  # each row's mean over the text (optional)
            "top1?": ((rows,), _FINITE_OR_NULL),
        },
    )


def _check_vectors(vectors: Any, n_layer: int, n_head: int, t: int) -> dict[str, Any] | None:
    if vectors is None:
        return None
    if not isinstance(vectors, dict):
        raise SummaryFormatError(f"vectors must be an object, not {_short(vectors)}")
    layers = _count(vectors, "layers", n_layer, "vectors.")
    hs = _count(vectors, "head_size", MAX_VECTOR_VALUES, "vectors.")
    for name in ("q", "k"):
        size = _b64_size(vectors.get(name), f"vectors.{name}")
        if size != 2 * layers * n_head * t * hs:
            raise SummaryFormatError(
                f"vectors.{name}: {size} bytes for {layers}x{n_head} heads, {t} tokens of {hs}"
            )
    positive = ("a positive integer", lambda x: isinstance(x, int) and not isinstance(x, bool) and x >= 1)
    fields = {
        "scale": ((), ("a number", _finite)),
        "slopes?": ((n_head,), _NUMBERS),
        "window?": ((), positive),
    }
    _entry(vectors, "vectors", {**fields, "sink?": ((layers, n_head), _NUMBERS)})
    return {k: vectors.get(k) for k in VECTOR_KEYS}


def _check_circuits(circuits: Any, n_layer: int, n_head: int, t: int) -> dict[str, Any] | None:
    if circuits is None:
        return None
    _entry(circuits, "circuits", {"attribution": ((n_layer, n_head, t - 1), _FINITE_OR_NULL)})
    # head a of layer l on head b of layer l + 1
    successive = ((n_layer - 1, n_head, n_head), _FINITE_OR_NULL)
    _entry(circuits.get("composition"), "circuits.composition", dict.fromkeys(COMPOSITION_MODES, successive))
    names = circuits.get("circuit_tokens")
    heads = n_layer * n_head
    if (
        not isinstance(names, list)
        or not 1 <= len(names) <= MAX_CIRCUIT_TOKENS
        or 2 * heads * len(names) ** 2 > MAX_CIRCUIT_VALUES
        or not all(isinstance(x, str) for x in names)
    ):
        raise SummaryFormatError(
            f"circuits.circuit_tokens must be 1 to {MAX_CIRCUIT_TOKENS} strings, within {MAX_CIRCUIT_VALUES} values"
        )
    for name in ("qk", "ov"):
        size = _b64_size(circuits.get(name), f"circuits.{name}")
        if size != 2 * heads * len(names) ** 2:
            raise SummaryFormatError(
                f"circuits.{name}: {size} bytes for {heads} heads over {len(names)} tokens"
            )
    return {k: circuits.get(k) for k in CIRCUIT_KEYS}


def _b64_size(value: Any, where: str) -> int:
    try:
        return len(base64.b64decode(value or "", validate=True))
    except (binascii.Error, TypeError, ValueError):
        raise SummaryFormatError(f"{where} is not base64") from None


def _count(header: dict[str, Any], key: str, most: int, where: str = "") -> int:
    value = header.get(key)
    # bool is an int in Python, but true is no count
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise SummaryFormatError(f"{where}{key} must be an integer from 1 to {most}, not {_short(value)}")
    return value


def _finite(x: Any) -> bool:
    # NumPy's scalars are numbers.Real too; true and false are no scores
    return isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_)) and math.isfinite(x)


def _short(value: Any) -> str:
    if isinstance(value, (list, dict)):  # named by kind and size: it may be large or deeply nested
        return f"a JSON {'array' if isinstance(value, list) else 'object'} of {len(value)} elements"
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
