"""The ATTENTION tab's summaries: quantisation within half a level of the probabilities, the header round trip,
the size budget of a GPT-2-small step, and the training callback's summary read back through TensorBoard's own
data provider against the model's attention."""

from __future__ import annotations

import contextlib
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from gptmini.board import PLUGIN_NAME
from gptmini.board.summary import (
    LEVELS,
    TAG,
    AttentionSummary,
    SummaryFormatError,
    decode,
    dequantise,
    quantise,
    summary_proto,
)


def to_summary(header, tri: np.ndarray) -> AttentionSummary:
    """A decoded summary (``decode``'s header and triangles) as the summary it was encoded from."""
    return AttentionSummary(
        tokens=list(header["tokens"]),
        probs=dequantise(tri, len(header["tokens"])),
        **{k: header.get(k) for k in ("head_types", "sink", "lens", "vectors", "circuits")},
        scores=header.get("scores") or {},
    )


def random_maps(n_layer: int, n_head: int, t: int, seed: int = 0) -> np.ndarray:
    """Causal softmax rows: (n_layer, n_head, T, T)."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(n_layer, n_head, t, t, generator=g)
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1).numpy()


def test_quantise_keeps_each_probability_within_half_a_level() -> None:
    probs = random_maps(2, 3, 9)
    tri = quantise(probs)
    assert tri.dtype == np.uint8 and tri.shape == (2, 3, 9 * 10 // 2)
    back = dequantise(tri, 9)
    np.testing.assert_allclose(back, probs, atol=0.5 / LEVELS + 1e-7, rtol=0)
    assert not back[
        ..., np.triu_indices(9, 1)[0], np.triu_indices(9, 1)[1]
    ].any()  # nothing above the diagonal
    # a worked example: row 1 of a 2-token map is [0.25, 0.75] -> levels 64 (63.75) and 191 (191.25)
    assert quantise(np.array([[[[1.0, 0.0], [0.25, 0.75]]]])).tolist() == [[[255, 64, 191]]]


def test_proto_round_trips_tokens_types_and_maps() -> None:
    from tensorboard.util import tensor_util

    probs = random_maps(2, 2, 5)
    summary = AttentionSummary(
        tokens=["R", "O", " ", "\n", "é"],
        probs=probs,
        head_types=[["induction", "other"], ["local", "first-token"]],
        scores={"induction": [[0.9, 0.1], [0.0, 0.2]]},
    )
    (value,) = summary_proto(summary).value
    assert value.tag == TAG and value.metadata.plugin_data.plugin_name == PLUGIN_NAME
    header, tri = decode(tensor_util.make_ndarray(value.tensor))
    back = to_summary(header, tri)
    assert back.tokens == summary.tokens and back.head_types == summary.head_types
    assert back.scores == {"induction": [[0.9, 0.1], [0.0, 0.2]]}
    np.testing.assert_allclose(back.probs, probs, atol=0.5 / LEVELS + 1e-7, rtol=0)


def test_bad_summaries_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="3 tokens for attention maps over 4 positions"):
        summary_proto(AttentionSummary(tokens=["a", "b", "c"], probs=random_maps(1, 1, 4)))
    with pytest.raises(ValueError, match="head_types must be null or 1 x 2 of "):
        summary_proto(AttentionSummary(tokens=list("ab"), probs=random_maps(1, 2, 2), head_types=[["x"]]))
    with pytest.raises(SummaryFormatError, match="version 99"):
        decode(np.array([b'{"version": 99}', b""], dtype=object))
    with pytest.raises(SummaryFormatError, match="3 bytes for 1x1 heads over 3 tokens"):
        decode(
            np.array([b'{"version":1,"n_layer":1,"n_head":1,"tokens":["a","b","c"]}', b"abc"], dtype=object)
        )


def test_a_gpt2_small_step_fits_the_two_megabyte_budget() -> None:
    """12 layers x 12 heads on a 64-token probe: the bytes one logged step adds to the event file."""
    from tensorboard.compat.proto import event_pb2

    tokens = [f" tok{i}" for i in range(64)]
    types = [["previous-token"] * 12 for _ in range(12)]
    scores = {k: [[0.123] * 12 for _ in range(12)] for k in ("previous_token", "induction", "first_token")}
    proto = summary_proto(AttentionSummary(tokens, random_maps(12, 12, 64), types, scores))
    event = event_pb2.Event(wall_time=1.0, step=1000, summary=proto)
    size = len(event.SerializeToString()) + 16  # TFRecord framing: length, two CRCs
    assert 12 * 12 * 64 * 65 // 2 < size <= 2 * 1024 * 1024
    # with the circuits view's entry as gptmini.board.detail.circuits sizes it for 144 heads (15 tokens)
    import math

    from gptmini.board.summary import MAX_CIRCUIT_VALUES, circuits_header

    n = math.isqrt(MAX_CIRCUIT_VALUES // (2 * 144))
    rng = np.random.default_rng(0)
    entry = circuits_header(
        rng.normal(size=(12, 12, 63)),
        {m: rng.random((11, 12, 12)) for m in "QKV"},
        tokens[:n],
        rng.normal(size=(12, 12, n, n)),
        rng.normal(size=(12, 12, n, n)),
    )
    proto = summary_proto(AttentionSummary(tokens, random_maps(12, 12, 64), types, scores, circuits=entry))
    event = event_pb2.Event(wall_time=1.0, step=1000, summary=proto)
    with_circuits = len(event.SerializeToString()) + 16
    assert (
        size + 2 * 144 * n * n * 2 < with_circuits <= 2 * 1024 * 1024 - 400_000
    )  # room left for the vectors


def test_callback_writes_the_models_attention_with_the_same_steps_head_types(tmp_path) -> None:
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.context import RequestContext

    from gptmini.data.tokenizers import CharTokenizer
    from gptmini.insight.scores import head_types
    from gptmini.model import GPT, GPTConfig
    from gptmini.training.callbacks.summary_logging import AttentionSummaryLogger
    from gptmini.training.loop.probe import ValidationProbe

    text = "ROMEO: but soft, what light"
    tokenizer = CharTokenizer(set(text))

    class ScoredProbe(ValidationProbe):  # the validation's attention pass, with head scores at step 6 alone
        def head_scores(self, model, step):
            return scores if step == 6 else None

    trainer = SimpleNamespace(
        sanity_checking=False,
        loggers=[TensorBoardLogger(str(tmp_path), name="tb", version="")],
        datamodule=SimpleNamespace(tokenizer=lambda: tokenizer),
        global_step=3,
        precision_plugin=SimpleNamespace(forward_context=contextlib.nullcontext),
    )
    config = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=16, n_layer=2, n_head=2, n_embd=8)
    torch.manual_seed(0)
    module = SimpleNamespace(model=GPT(config).train(), device=torch.device("cpu"))
    scores = {
        "previous_token": torch.tensor([[0.9, 0.0], [0.0, 0.0]]),
        "induction": torch.tensor([[0.0, 0.0], [0.8, 0.0]]),
        "first_token": torch.tensor([[0.0, 0.7], [0.0, 0.0]]),
        "mean_distance": torch.tensor([[1.0, 5.0], [2.0, 9.0]]),
    }
    logger = AttentionSummaryLogger(probe_text=text, max_tokens=12)
    logger.probe = ScoredProbe()  # what the app hands over: the LightningModule's probe
    logger.on_validation_end(trainer, module)
    trainer.global_step = 6
    logger.on_validation_end(trainer, module)
    trainer.loggers[0].experiment.flush()
    assert module.model.training  # put back as it was
    assert logger.last_bytes > 2 * 2 * 12 * 13 // 2 and logger.last_seconds > 0

    multiplexer = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance={PLUGIN_NAME: 0})
    multiplexer.AddRunsFromDirectory(str(tmp_path))
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, str(tmp_path))
    found = provider.read_tensors(RequestContext(), experiment_id="", plugin_name=PLUGIN_NAME, downsample=10)
    (series,) = found.values()
    first, second = series[TAG]
    assert (first.step, second.step) == (3, 6)
    ids = tokenizer.encode(text[:12])
    with torch.no_grad():
        want = module.model.eval().attention_maps(torch.tensor([ids]))[:, 0].numpy()
    for datum, types in ((first, None), (second, head_types(scores))):
        header, tri = decode(datum.numpy)
        got = to_summary(header, tri)
        assert got.tokens == list(text[:12])
        assert got.head_types == types
        np.testing.assert_allclose(got.probs, want, atol=0.5 / LEVELS + 1e-6, rtol=0)
    assert header["head_types"] == [["previous-token", "first-token"], ["induction", "other"]]
    assert header["scores"]["induction"] == [[0.0, 0.0], [0.8, 0.0]]


def test_the_callback_writes_the_untrained_model_at_step_0(tmp_path) -> None:
    """The tab's slider starts at step 0, as head insight's attribution over training does: training that starts
    at step 0 writes the untrained model's attention (heads unlabelled: no validation scored them yet); a run
    resumed later writes none at its start."""
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.context import RequestContext

    from gptmini.data.tokenizers import CharTokenizer
    from gptmini.model import GPT, GPTConfig
    from gptmini.training.callbacks.summary_logging import AttentionSummaryLogger

    text = "ROMEO: but soft"
    tokenizer = CharTokenizer(set(text))
    config = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=16, n_layer=2, n_head=2, n_embd=8)
    torch.manual_seed(0)
    module = SimpleNamespace(model=GPT(config), device=torch.device("cpu"))
    for run, step in (("fresh", 0), ("resumed", 40)):
        trainer = SimpleNamespace(
            sanity_checking=False,
            loggers=[TensorBoardLogger(str(tmp_path / run), name="tb", version="")],
            datamodule=SimpleNamespace(tokenizer=lambda: tokenizer),
            global_step=step,
            precision_plugin=SimpleNamespace(forward_context=contextlib.nullcontext),
        )
        AttentionSummaryLogger(probe_text=text, max_tokens=12).on_train_start(trainer, module)
        trainer.loggers[0].experiment.flush()
    multiplexer = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance={PLUGIN_NAME: 0})
    multiplexer.AddRunsFromDirectory(str(tmp_path))
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, str(tmp_path))
    found = provider.read_tensors(RequestContext(), experiment_id="", plugin_name=PLUGIN_NAME, downsample=10)
    assert list(found) == ["fresh/tb"]
    (datum,) = found["fresh/tb"][TAG]
    got = to_summary(*decode(datum.numpy))
    with torch.no_grad():
        want = module.model.eval().attention_maps(torch.tensor([tokenizer.encode(text[:12])]))[:, 0].numpy()
    assert datum.step == 0 and got.tokens == list(text[:12]) and got.head_types is None
    np.testing.assert_allclose(got.probs, want, atol=0.5 / LEVELS + 1e-6, rtol=0)


def test_the_head_types_are_the_ones_insight_gives_in_its_order() -> None:
    from gptmini.board.summary import HEAD_TYPES, contract
    from gptmini.insight import scores

    names = [name for name, _, _ in HEAD_TYPES]
    assert names == [name for name, _, _ in scores.HEAD_TYPES] + ["local", scores.OTHER]
    assert contract()["default_type"] == scores.OTHER
    # every label head_types can give is one of them: a head of each kind, from scores that make it so
    made = scores.head_types(
        {
            "induction": torch.tensor([[0.9, 0.0, 0.0, 0.0, 0.0]]),
            "previous_token": torch.tensor([[0.0, 0.9, 0.0, 0.0, 0.0]]),
            "first_token": torch.tensor([[0.0, 0.0, 0.9, 0.0, 0.0]]),
            "mean_distance": torch.tensor([[9.0, 9.0, 9.0, 1.0, 9.0]]),
        }
    )
    assert made == [names]


def test_the_page_repeats_none_of_the_contract() -> None:
    """The tab's page reads the tag, levels, version and head types from the contract route: none of them is
    written in it (colours in hex, type names in quotes, the tag, a division by the level count)."""
    import re
    from importlib import resources

    from gptmini.board.summary import HEAD_TYPES, contract

    page = resources.files("gptmini.board").joinpath("static", "index.js").read_text()
    for name, _, colour in HEAD_TYPES:
        assert f"'{name}'" not in page and f'"{name}"' not in page and colour not in page.lower()
    assert TAG not in page
    assert not re.search(rf"/\s*{LEVELS}\b", page)
    assert contract()["layout"] in page  # the one layout the page reads, checked against the contract's
    plugin = resources.files("gptmini.board").joinpath("plugin.py").read_text()
    assert '"version"' not in plugin  # own text's header comes from summary.encode


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ([1, 2], "the header is a JSON list"),
        ({"version": 1, "n_layer": 0, "n_head": 1, "tokens": ["a"]}, "n_layer must be an integer from 1"),
        ({"version": 1, "n_layer": 1, "n_head": 1, "tokens": []}, "tokens must be a list of 1 to"),
        ({"version": 1, "n_layer": 1, "n_head": 1, "tokens": "ab"}, "tokens must be a list"),
        (
            {"version": 1, "n_layer": 1, "n_head": 2, "tokens": ["a"], "head_types": [["local"]]},
            "head_types must be null or 1 x 2 of ",
        ),
        (
            {"version": 1, "n_layer": 1, "n_head": 1, "tokens": ["a"], "scores": [1]},
            "scores must be an object",
        ),
        (
            {"version": 1, "n_layer": 1, "n_head": 1, "tokens": ["a"], "scores": {"x": [[True]]}},
            "scores.x must be 1 x 1 numbers (or null)",
        ),
    ],
)
def test_every_header_field_is_checked(header, message) -> None:
    import json

    with pytest.raises(SummaryFormatError, match=re.escape(message)):
        decode(np.array([json.dumps(header).encode(), b"\0"], dtype=object))


def test_a_decoded_header_holds_the_contracts_keys_only() -> None:
    import json

    from gptmini.board.summary import HEADER_KEYS

    header = {"version": 1, "n_layer": 1, "n_head": 1, "tokens": ["a"], "extra": "<script>"}
    got, tri = decode(np.array([json.dumps(header).encode(), b"\7"], dtype=object))
    assert tuple(got) == HEADER_KEYS and got["head_types"] is None and got["scores"] == {}
    assert tri.tolist() == [[[7]]]


def test_encode_refuses_a_head_type_the_page_cannot_name() -> None:
    with pytest.raises(ValueError, match=r"head_types must be null or 1 x 1 of \['first-token', 'induction'"):
        summary_proto(AttentionSummary(list("ab"), random_maps(1, 1, 2), head_types=[["sideways"]]))


def test_the_default_probe_holds_both_copies_of_its_line_at_character_level_too(repo_root) -> None:
    """Induction shows in the second copy of the probe's repeated line: the probe cut to max_tokens holds both
    copies with a character vocabulary (one token per character) as with GPT-2's BPE."""
    from omegaconf import OmegaConf

    from gptmini.data.tokenizers import CharTokenizer, build_tokenizer
    from gptmini.training.callbacks.summary_logging import AttentionSummaryLogger

    conf = AttentionSummaryLogger()  # callbacks=default's: its file sets neither
    assert (
        "probe_text"
        not in OmegaConf.load(repo_root / "conf" / "callbacks" / "default.yaml").attention_summary
    )
    line = conf.probe_text.split("\n")[0]
    for tokenizer in (CharTokenizer(sorted(set(conf.probe_text))), build_tokenizer("gpt2")):
        shown = tokenizer.decode(tokenizer.encode(conf.probe_text)[: conf.max_tokens])
        assert shown.count(line) == 2, (tokenizer, shown)


def test_a_score_that_is_not_a_number_is_stored_as_null_and_read_back() -> None:
    from tensorboard.util import tensor_util

    summary = AttentionSummary(list("ab"), random_maps(1, 2, 2), scores={"induction": [[float("nan"), 0.5]]})
    (value,) = summary_proto(summary).value
    header, _ = decode(tensor_util.make_ndarray(value.tensor))
    assert header["scores"] == {"induction": [[None, 0.5]]}
