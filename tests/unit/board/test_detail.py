"""The summary's sink, lens and vectors entries: written, read back and checked field by field; the queries and
keys kept within their cap."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from gptmini.board.summary import (
    MAX_VECTOR_VALUES,
    AttentionSummary,
    SummaryFormatError,
    circuits_header,
    decode,
    lens_header,
    sink_header,
    summary_proto,
    vectors_header,
)

L, H, T, HS = 2, 3, 5, 4


def _summary(**detail) -> AttentionSummary:
    probs = np.tril(np.ones((T, T), dtype=np.float32))
    probs = np.broadcast_to(probs / probs.sum(-1, keepdims=True), (L, H, T, T)).copy()
    return AttentionSummary([f"t{i}" for i in range(T)], probs, **detail)


def _stored(summary: AttentionSummary) -> np.ndarray:
    from tensorboard.util import tensor_util

    return tensor_util.make_ndarray(summary_proto(summary).value[0].tensor)


def _detail(rng: np.random.Generator) -> dict:
    q, k = rng.normal(size=(2, L, H, T, HS)).astype(np.float32)
    return (
        {
            "sink": sink_header(rng.random((L, H)), rng.random((L, H))),
            "lens": {
                **lens_header(
                    ["embed", "layer0", "layer1"], [["a"] * T] * 3, rng.random((3, T)), rng.random((3, T - 1))
                ),
                "loss": [3.0, 2.0, 1.0],
                "top1": [0.0, 0.25, 0.5],
            },
            "vectors": vectors_header(
                q, k, HS**-0.5, np.array([0.5, 0.25, 0.125]), 3, rng.normal(size=(L, H))
            ),
            "circuits": circuits_header(
                rng.normal(size=(L, H, T - 1)),
                {m: rng.random((L - 1, H, H)) for m in "QKV"},
                ["t0", "t1"],
                rng.normal(size=(L, H, 2, 2)),
                rng.normal(size=(L, H, 2, 2)),
            ),
        },
        q,
        k,
    )


def test_the_entries_round_trip_and_the_vectors_are_float16() -> None:
    detail, q, k = _detail(np.random.default_rng(0))
    header, _ = decode(_stored(_summary(**detail)))
    assert header["sink"] == detail["sink"] and header["lens"] == detail["lens"]
    assert header["circuits"] == detail["circuits"]
    v = header["vectors"]
    assert (v["layers"], v["head_size"], v["window"], v["slopes"]) == (L, HS, 3, [0.5, 0.25, 0.125])
    got = np.frombuffer(base64.b64decode(v["q"]), dtype="<f2").reshape(L, H, T, HS)
    np.testing.assert_array_equal(got, q.astype(np.float16))
    np.testing.assert_allclose(
        np.frombuffer(base64.b64decode(v["k"]), dtype="<f2").reshape(q.shape), k, rtol=1e-3, atol=1e-3
    )
    # a summary without them (one written before them) reads as None
    header, _ = decode(_stored(_summary()))
    assert header["sink"] is header["lens"] is header["vectors"] is header["circuits"] is None


def test_the_vectors_keep_the_first_layers_within_the_cap() -> None:
    per_layer = H * T * HS * 2  # q and k of one layer
    layers = 5
    q = np.zeros((layers, H, T, HS), dtype=np.float32)
    assert vectors_header(q, q, 0.5)["layers"] == min(layers, MAX_VECTOR_VALUES // per_layer)
    wide = np.zeros((3, 64, 64, 64), dtype=np.float32)  # 2 x 64^3 values a layer: over the cap
    assert 2 * wide[0].size > MAX_VECTOR_VALUES and vectors_header(wide, wide, 0.1) is None
    fits = np.zeros((3, 16, 64, 32), dtype=np.float32)  # 2^16 values a layer: two layers fit
    assert vectors_header(fits, fits, 0.1)["layers"] == 2


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: d["sink"].update(first=[[0.1] * H]), "sink.first must be 2 x 3 numbers"),
        (lambda d: d["sink"].update(learned="x"), "sink.learned must be null or 2 x 3 numbers"),
        (lambda d: d["lens"].update(rows=["embed"]), "lens.rows must be 3 strings"),
        (lambda d: d["lens"].update(top=[["a"] * (T - 1)] * 3), "lens.top must be 3 x 5 strings"),
        (lambda d: d["lens"].update(target=[[0.1] * T] * 3), "lens.target must be 3 x 4 numbers"),
        (lambda d: d["lens"].update(loss=[1.0]), "lens.loss must be null or 3 numbers"),
        (lambda d: d["vectors"].update(q=d["vectors"]["q"][:-8]), "vectors.q: "),
        (lambda d: d["vectors"].update(k="not base64!"), "vectors.k is not base64"),
        (lambda d: d["vectors"].update(layers=3), "vectors.layers must be an integer from 1 to 2"),
        (lambda d: d["vectors"].update(slopes=[1.0]), "vectors.slopes must be null or 3 numbers"),
        (lambda d: d["vectors"].update(window=0), "vectors.window must be null or a positive integer"),
        (lambda d: d["vectors"].update(sink=[[1.0] * H]), "vectors.sink must be null or 2 x 3 numbers"),
        (
            lambda d: d["circuits"].update(attribution=[[[0.1] * T] * H] * L),
            "circuits.attribution must be 2 x 3 x 4 numbers",
        ),
        (
            lambda d: d["circuits"]["composition"].pop("K"),
            "circuits.composition.K must be 1 x 3 x 3 numbers",
        ),
        (
            lambda d: d["circuits"].update(circuit_tokens=[]),
            "circuits.circuit_tokens must be 1 to 32 strings",
        ),
        (lambda d: d["circuits"].update(qk=d["circuits"]["qk"][:-8]), "circuits.qk: "),
        (lambda d: d["circuits"].update(ov="not base64!"), "circuits.ov is not base64"),
    ],
)
def test_a_damaged_entry_is_refused_naming_it(damage, message: str) -> None:
    detail, _, _ = _detail(np.random.default_rng(1))
    damage(detail)
    with pytest.raises(SummaryFormatError, match=message.replace(".", r"\.").replace("(", r"\(")):
        decode(_stored(_summary(**detail)))


def test_a_models_circuits_entry_holds_its_attribution_composition_and_token_circuits() -> None:
    import torch

    from gptmini.board.detail import circuits, successive_layers
    from gptmini.insight.circuits import composition_scores, direct_logit_attribution, token_circuits
    from gptmini.model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=40, block_size=16, n_layer=3, n_head=2, n_embd=16)).eval()

    class Chars:
        def token_text(self, i: int) -> str:
            return chr(97 + i % 26)

    ids = [5, 3, 5, 9, 3, 1]
    got = circuits(model, ids, Chars())
    assert got["circuit_tokens"] == ["f", "d", "j", "b"]  # the distinct tokens, in order of first appearance
    expected = direct_logit_attribution(model, torch.tensor([ids])).heads[:, :, 0]
    np.testing.assert_allclose(np.array(got["attribution"]), expected.numpy(), atol=6e-4)
    k = composition_scores(model)["K"]  # (L, H, L, H)
    assert np.array(got["composition"]["K"]).shape == (2, 2, 2)
    np.testing.assert_allclose(got["composition"]["K"][1][0][1], k[1, 0, 2, 1].item(), atol=6e-4)
    np.testing.assert_allclose(
        np.array(got["composition"]["V"]),
        successive_layers(composition_scores(model)["V"]).numpy(),
        atol=6e-4,
    )
    qk, ov = token_circuits(model, torch.tensor([5, 3, 9, 1]))
    stored = np.frombuffer(base64.b64decode(got["ov"]), dtype="<f2").reshape(3, 2, 4, 4)
    np.testing.assert_allclose(stored, ov.numpy(), rtol=2e-3, atol=1e-4)
    # and it is what a summary keeps: decoded as written
    header, _ = decode(
        _stored(
            AttentionSummary([f"t{i}" for i in range(6)], np.zeros((3, 2, 6, 6), np.float32), circuits=got)
        )
    )
    assert header["circuits"] == got
