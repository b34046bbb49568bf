"""The attention summaries of the ATTENTION tab: one TensorBoard tensor summary per logged step holding every
layer and head's attention on a probe text, quantised to uint8 over the causal lower triangle, the tokens as
strings and each head's type.

Format (a DT_STRING tensor of two elements, under the plugin's name, data class TENSOR):
  [0] a UTF-8 JSON header: {"version", "n_layer", "n_head", "tokens", "head_types" (n_layer x n_head or null),
      "scores" (name -> n_layer x n_head, or {})}
  [1] the probabilities: uint8, round(p * 255), layer-major, then head, then the rows of the lower triangle
      (row i holds keys 0..i), T * (T + 1) / 2 bytes per head.
Only NumPy and TensorBoard's protos: TensorBoard imports this module, and must not wait for torch."""

from __future__ import annotations

import json
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


def header_bytes(summary: AttentionSummary) -> bytes:
    """Element [0] of the stored value: the JSON header of ``summary`` (:func:`summary_proto` writes both)."""
    n_layer, n_head, _ = summary.shape
    header = {
        "version": VERSION,
        "n_layer": n_layer,
        "n_head": n_head,
        "tokens": list(summary.tokens),
        "head_types": summary.head_types,
        "scores": dict(summary.scores or {}),
    }
    return json.dumps(header, separators=(",", ":")).encode()


def summary_proto(summary: AttentionSummary, tag: str = TAG) -> summary_pb2.Summary:
    """``summary`` as a TensorBoard Summary protobuf (write it with a SummaryWriter's ``file_writer.add_summary``)."""
    n_layer, n_head, t = summary.shape
    if len(summary.tokens) != t:
        raise ValueError(f"{len(summary.tokens)} tokens for attention maps over {t} positions")
    if summary.head_types is not None and (
        len(summary.head_types) != n_layer or any(len(row) != n_head for row in summary.head_types)
    ):
        raise ValueError(f"head_types must be {n_layer} rows of {n_head} labels")
    payload = np.array([header_bytes(summary), quantise(summary.probs).tobytes()], dtype=object)
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
    (n_layer, n_head, T(T+1)/2)). SummaryFormatError when it is not one this version wrote."""
    arr = np.asarray(value)
    if arr.shape != (2,) or not all(isinstance(x, bytes) for x in arr):
        raise SummaryFormatError(f"expected two byte strings, found an array of shape {arr.shape}")
    try:
        header = json.loads(arr[0].decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SummaryFormatError(f"unreadable header: {err}") from None
    if not isinstance(header, dict) or header.get("version") != VERSION:
        raise SummaryFormatError(f"version {header.get('version') if isinstance(header, dict) else '?'}")
    n_layer, n_head, t = header["n_layer"], header["n_head"], len(header["tokens"])
    tri = np.frombuffer(arr[1], dtype=np.uint8)
    if tri.size != n_layer * n_head * t * (t + 1) // 2:
        raise SummaryFormatError(f"{tri.size} bytes for {n_layer}x{n_head} heads over {t} tokens")
    return header, tri.reshape(n_layer, n_head, t * (t + 1) // 2)


def to_summary(header: Mapping[str, Any], tri: np.ndarray) -> AttentionSummary:
    return AttentionSummary(
        tokens=list(header["tokens"]),
        probs=dequantise(tri, len(header["tokens"])),
        head_types=header.get("head_types"),
        scores=header.get("scores") or {},
    )
