"""The fixed probes, the loss by position, the ICL score and the phase-change detector."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from gptmini.insight.icl import PhaseChangeDetector, icl_bands, icl_score, loss_by_position
from gptmini.insight.probes import make_probes
from gptmini.model import GPT, GPTConfig

TOKENS = (np.arange(1000) * 7) % 50


def test_the_repeated_probe_is_two_copies_of_distinct_random_tokens_fixed_by_the_seed():
    probes = make_probes(TOKENS, vocab_size=50, block_size=64, probe_tokens=40, probe_batch=3, loss_windows=5)
    rep = probes.repeated
    assert rep.shape == (3, 40) and probes.period == 20
    assert torch.equal(rep[:, :20], rep[:, 20:])
    assert all(len(set(row[:20].tolist())) == 20 for row in rep)  # distinct within a copy
    assert int(rep.min()) >= 0 and int(rep.max()) < 50
    again = make_probes(TOKENS, 50, 64, 40, 3, 5)
    assert torch.equal(again.repeated, rep) and torch.equal(again.text, probes.text)
    assert not torch.equal(make_probes(TOKENS, 50, 64, 40, 3, 5, seed=7).repeated, rep)


def test_text_probes_and_loss_windows_are_slices_of_the_data():
    probes = make_probes(TOKENS, 50, block_size=32, probe_tokens=128, probe_batch=2, loss_windows=4)
    assert probes.text.shape == (2, 32)  # capped at the context
    assert probes.windows.shape == (4, 33)  # block_size + 1: inputs and shifted targets
    for row in [*probes.text, *probes.windows]:
        row = row.numpy()
        starts = [s for s in range(len(TOKENS) - len(row) + 1) if (TOKENS[s : s + len(row)] == row).all()]
        assert starts, "not a slice of the data"
    assert probes.windows[-1, -1] == TOKENS[-1]  # evenly spaced over the whole split, the last one at its end


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"probe_tokens": 2}, "probe_tokens=2 is invalid: it must be an integer >= 4"),
        ({"probe_batch": 0}, "probe_batch=0 is invalid"),
        ({"loss_windows": 1.5}, "loss_windows=1.5 is invalid"),
        ({"block_size": 2000}, "the data has 1000 tokens but the probes need at least block_size + 1 = 2001"),
    ],
)
def test_bad_probe_settings_are_named(kwargs, message):
    args = {"block_size": 32} | kwargs
    with pytest.raises(ValueError, match=message.replace("+", r"\+")):
        make_probes(TOKENS, 50, **args)


def test_loss_by_position_matches_the_models_own_loss():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=1, n_head=2, n_embd=16)).eval()
    windows = make_probes(TOKENS, 50, 16, loss_windows=5).windows
    losses = loss_by_position(model, windows, batch_size=2)  # chunked: 2 + 2 + 1 windows
    assert losses.shape == (16,)
    x, y = windows[:, :-1], windows[:, 1:]
    logits, mean = model(x, y)  # the model's forward and its own (mean) loss: a second path
    assert_close(losses.mean(), mean, rtol=1e-5, atol=1e-5)
    by_hand = -F.log_softmax(logits.float(), -1).gather(-1, y[..., None])[..., 0].mean(0)  # (T,)
    assert_close(losses, by_hand, rtol=1e-5, atol=1e-5)


def test_icl_bands_and_score_by_hand():
    assert icl_bands(128) == ((6, 25), (64, 128))
    assert icl_bands(64) == ((3, 12), (32, 64))
    assert icl_bands(1024) == ((51, 204), (512, 1024))
    assert icl_bands(8) == ((1, 2), (4, 8))
    assert icl_bands(4) == ((1, 2), (2, 4))
    losses = torch.full((64,), 3.0)
    losses[3:12] = torch.arange(1.0, 10.0)  # early band mean 5
    losses[32:] = 2.0  # late band mean 2
    assert icl_score(losses) == pytest.approx(2.0 - 5.0)


def _grid(**heads: float) -> torch.Tensor:
    """(2 layers, 2 heads) induction scores, 0.05 except the named heads, e.g. l1h0=0.6."""
    g = torch.full((2, 2), 0.05)
    for name, value in heads.items():
        g[int(name[1]), int(name[3])] = value
    return g


def test_the_phase_change_is_reported_once_with_the_step_and_the_heads():
    d = PhaseChangeDetector(induction_threshold=0.4, min_rise=0.2, icl_drop=0.05)
    assert d.update(0, _grid(), 0.0) is None  # the baseline
    assert d.update(100, _grid(l1h0=0.3), -0.02) is None  # neither threshold reached
    assert d.update(200, _grid(l1h0=0.7), 0.01) is None  # induction without the ICL drop
    change = d.update(300, _grid(l1h0=0.8, l0h1=0.45), -0.3)
    assert change is not None
    assert (change.step, change.previous_step) == (300, 200)
    assert [(h["layer"], h["head"]) for h in change.heads] == [(1, 0), (0, 1)]  # strongest first
    assert change.heads[0]["before"] == pytest.approx(0.05) and change.heads[0]["after"] == pytest.approx(0.8)
    assert change.icl_before == pytest.approx(0.01) and change.icl_after == pytest.approx(-0.3)
    assert change.describe() == (
        "induction phase change between step 200 and step 300: induction score of layer 1 head 0 (0.05 -> 0.80), "
        "layer 0 head 1 (0.05 -> 0.45); ICL score +0.010 -> -0.300 nats"
    )
    assert d.update(400, _grid(l1h0=0.9), -0.5) is None  # once

    resumed = PhaseChangeDetector()
    resumed.load_state_dict(d.state_dict())
    assert resumed.update(500, _grid(l1h0=0.9), -0.6) is None  # a resumed run does not report it again


def test_no_phase_change_from_an_icl_drop_alone():
    d = PhaseChangeDetector()
    d.update(0, _grid(), 0.0)
    assert d.update(100, _grid(l0h0=0.3), -1.0) is None
    assert d.update(200, _grid(l0h0=0.35), -1.5) is None
