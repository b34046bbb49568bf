"""The validation's one attention pass (``gptmini.training.loop.probe``): every probe sequence of a validation runs through
the model's explicit attention path once, in one batch, whatever the loggers that read it; each reader gets the
attention of its own sequence as if computed alone; and every log of a validation is at the same step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gptmini.insight.probes import make_probes, repeated_segments_text
from gptmini.insight.scores import head_scores
from gptmini.model import GPT, GPTConfig
from gptmini.training.loop.probe import ValidationProbe, eval_mode

TEXT = "ROMEO:\nBut soft, what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n"


def _model() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=40, block_size=32, n_layer=2, n_head=2, n_embd=16)).train()


def _count_calls(monkeypatch) -> list[tuple[GPT, torch.Tensor]]:
    """Every call of ``GPT.attention_maps`` from here on: (the model, its input ids)."""
    calls: list[tuple[GPT, torch.Tensor]] = []
    original = GPT.attention_maps

    def counted(self: GPT, idx: torch.Tensor) -> torch.Tensor:
        calls.append((self, idx.detach().cpu().clone()))
        return original(self, idx)

    monkeypatch.setattr(GPT, "attention_maps", counted)
    return calls


def test_every_request_of_a_step_is_answered_by_one_pass_as_if_each_ran_alone(monkeypatch):
    model = _model()
    tokens = np.random.default_rng(0).integers(0, 40, 2000)
    probes = make_probes(tokens, 40, 32, probe_tokens=16, probe_batch=3, loss_windows=2)
    short, long = [5, 1, 7, 7, 2], list(range(3, 23))  # shorter and longer than the probes' 16 tokens
    with (
        torch.no_grad(),
        eval_mode(model),
    ):  # the oracles: each sequence alone, the probes as head insight scores them
        want_short = model.attention_maps(torch.tensor([short]))[:, 0]
        want_long = model.attention_maps(torch.tensor([long]))[:, 0]
        want_scores = head_scores(model, probes)
    calls = _count_calls(monkeypatch)
    probe = ValidationProbe()
    # the tab's summary asks (and reads) before head insight has asked: the order of the loggers does not matter
    probe.text(7, short)
    probe.text(7, long)
    probe.scores(7, probes)
    probe.text(7, short)  # the same text asked twice is computed once
    got_short = probe.text_maps(model, 7, short)
    got_long = probe.text_maps(model, 7, long)
    got_scores = probe.head_scores(model, 7)
    assert len(calls) == 1 and probe.passes == 1
    assert calls[0][1].shape == (2 + 2 * 3, 20)  # two texts and both probes, padded to the longest
    torch.testing.assert_close(got_short, want_short)
    torch.testing.assert_close(got_long, want_long)
    assert got_scores is not None and set(got_scores) == set(want_scores)
    for name, value in want_scores.items():
        torch.testing.assert_close(got_scores[name], value)
    assert model.training  # put back as it was


def test_a_new_step_starts_afresh_and_a_late_request_costs_only_itself(monkeypatch):
    model = _model()
    calls = _count_calls(monkeypatch)
    probe = ValidationProbe()
    first = probe.text_maps(model, 3, [1, 2, 3])
    assert probe.head_scores(model, 3) is None  # no one asked for head scores
    late = probe.text_maps(model, 3, [4, 5])  # asked after the pass of its step: one more pass, for it alone
    assert [c[1].tolist() for _, c in zip(range(2), calls, strict=True)] == [[[1, 2, 3]], [[4, 5]]]
    with torch.no_grad():  # the weights change: the next validation's pass sees them
        for p in model.parameters():
            p.add_(1.0)
    again = probe.text_maps(model, 6, [1, 2, 3])
    assert len(calls) == 3 and late.shape == (2, 2, 2, 2)
    assert not torch.allclose(first, again)


def test_eval_mode_restores_the_mode_even_when_the_block_fails():
    model = _model()
    with pytest.raises(RuntimeError), eval_mode(model):
        assert not model.training
        raise RuntimeError("boom")
    assert model.training
    with eval_mode(model.eval()):
        pass
    assert not model.training


def test_one_validation_with_every_default_callback_computes_each_probe_once(
    compose_cfg, tmp_path, monkeypatch, tb_events
):
    """A real training run with conf/callbacks/default.yaml (validations after steps 3 and 6): the trained model's
    attention is computed once per validation, every probe sequence of the validation (the attention maps' text,
    the tab's text, head insight's text and repeated probes) in that one pass exactly once; and val/loss, the
    text samples, the insight scalars, the maps and the tab's summary are all logged at steps 3 and 6 (the summary
    also at 0, as training starts, from a pass of its own)."""
    from gptmini.board.summary import TAG
    from gptmini.training.run.app import train

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT + repeated_segments_text(6000, seed=1))  # not periodic: every probe window differs
    cfg = compose_cfg(
        [
            "debug=smoke",
            "data=text",
            f"data.source={corpus}",
            "tokenizer=char",
            "callbacks.head_insight.probe_batch=2",
            "callbacks.head_insight.loss_windows=4",
            "callbacks.text_samples.max_new_tokens=4",
        ]
    )
    assert {"attention_maps", "head_insight", "attention_summary"} <= set(cfg.callbacks)
    calls = _count_calls(monkeypatch)
    train(cfg)

    # the untrained baseline of head insight is a frozen copy, scored once on its own: not a validation's pass
    trained = [idx for model, idx in calls if next(model.parameters()).requires_grad]
    ea = tb_events(tmp_path / "run")
    validations = [e.step for e in ea.Scalars("val/loss")]
    assert validations == [3, 6]
    assert len(trained) == len(validations)  # one attention pass per validation
    for idx in trained:
        # 2 texts + 2 text probes + 2 repeated probes, each once
        assert idx.size(0) == 2 + 2 * 2
        assert len({tuple(row.tolist()) for row in idx}) == idx.size(0)
    tensors = ea.Tags()["tensors"]
    assert [e.step for e in ea.Tensors(TAG)] == [
        0,
        *validations,
    ]  # 0: the untrained model, as training starts
    (samples,) = [t for t in tensors if t.startswith("samples/text")]
    assert [e.step for e in ea.Tensors(samples)] == validations
    for tag in ("val/ppl", "val/best_loss", "insight/icl_score", "attention/entropy/layer0_head0"):
        steps = [e.step for e in ea.Scalars(tag)]
        assert steps[-len(validations) :] == validations, tag  # insight also logs the untrained model at 0
    assert [e.step for e in ea.Images("attention/layer0_mean")] == validations
