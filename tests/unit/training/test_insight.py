"""The head-insight callback in a real (tiny) training run: score grids, per-head scalars charted per layer,
the loss-by-position image, the ICL score, the best validation loss and the HPARAMS session, all in the run's
TensorBoard events; and its state across a resume."""

from __future__ import annotations

import re

import pytest
import torch

from gptmini.insight.icl import PhaseChangeDetector
from gptmini.insight.probes import repeated_segments_text
from gptmini.insight.scores import SCORES
from gptmini.training.callbacks.insight_logging import (
    HPARAM_METRICS,
    HeadInsightLogger,
    custom_scalars_layout,
    flat_hparams,
)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """6 steps of a 2-layer, 2-head model on a small synthetic char corpus, validating at steps 3 and 6, through
    the app's own ``train`` (in this process: no second interpreter start)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from gptmini.conf_dir import conf_dir
    from gptmini.training.run.app import train
    from gptmini.training.run.compose import register_configs

    tmp = tmp_path_factory.mktemp("insight")
    corpus = tmp / "corpus.txt"
    corpus.write_text(repeated_segments_text(20_000, seed=1))
    register_configs()
    overrides = [
        "debug=smoke",
        "data=text",
        f"data.source={corpus}",
        "tokenizer=char",
        f"paths.output_dir={tmp}/run",
        f"paths.data_root={tmp}/data",
        "callbacks.head_insight.probe_batch=2",
        "callbacks.head_insight.loss_windows=4",
        # not under test here: leaves more of the fast suite's time to the rest
        "~callbacks.attention_maps",
        "~callbacks.text_samples",
        "~callbacks.progress_bar",
    ]
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose("train", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]  # as the app's task function receives it
    result = train(cfg)
    return tmp / "run", result


def test_every_score_is_a_grid_image_and_a_scalar_per_head(run, tb_events):
    run_dir, _ = run
    ea = tb_events(run_dir)
    tags = ea.Tags()
    for score in SCORES:
        images = ea.Images(f"insight/grid/{score.name}")
        assert [e.step for e in images] == [0, 3, 6]  # the untrained baseline, then each validation
        assert images[-1].encoded_image_string[:8] == b"\x89PNG\r\n\x1a\n"
        assert 0.7 < images[-1].width / images[-1].height < 1.4  # near-square (2 layers x 2 heads)
        for layer in (0, 1):
            for head in (0, 1):
                assert f"insight/{score.name}/layer{layer}_head{head}" in tags["scalars"]
    assert [e.step for e in ea.Images("insight/loss_by_position")] == [0, 3, 6]
    icl = ea.Scalars("insight/icl_score")
    assert len(icl) == 3 and all(abs(e.value) < 5 for e in icl)
    val = [e.value for e in ea.Scalars("val/loss")]
    assert [e.value for e in ea.Scalars("val/best_loss")] == pytest.approx([val[0], min(val)])


def test_each_validation_logs_every_heads_attribution_and_the_composition_of_successive_layers(
    run, tb_events
):
    run_dir, _ = run
    ea = tb_events(run_dir)
    scalars = ea.Tags()["scalars"]
    attribution = sorted(t for t in scalars if t.startswith("attribution/"))
    assert attribution == [f"attribution/layer{layer}_head{h}" for layer in (0, 1) for h in (0, 1)]
    composition = sorted(t for t in scalars if t.startswith("composition/"))
    # 2 layers of 2 heads: each head of layer 0 on each of layer 1, three kinds
    assert len(composition) == 12 and "composition/K/l0h1_to_l1h0" in composition
    for tag in (*attribution, *composition):
        assert [e.step for e in ea.Scalars(tag)] == [0, 3, 6], tag
    k = [e.value for e in ea.Scalars("composition/K/l0h1_to_l1h0")]
    assert all(0.0 < v <= 1.0 for v in k) and k[0] != k[-1]  # a cosine-like score that training moves


def test_custom_scalars_chart_each_layers_heads_together(run, tb_events):
    from tensorboard.plugins.custom_scalar import layout_pb2

    run_dir, _ = run
    ea = tb_events(run_dir)
    layout = layout_pb2.Layout.FromString(
        ea.Tensors("custom_scalars__config__")[0].tensor_proto.string_val[0]
    )
    categories = {c.title: c for c in layout.category}
    induction = categories["insight: induction score"]
    assert [chart.title for chart in induction.chart] == ["layer 0", "layer 1"]
    (regex,) = induction.chart[1].multiline.tag
    scalars = ea.Tags()["scalars"]
    assert sorted(t for t in scalars if re.fullmatch(regex, t)) == [
        "insight/induction/layer1_head0",
        "insight/induction/layer1_head1",
    ]
    (regex,) = categories["circuits: direct logit attribution"].chart[0].multiline.tag
    assert sorted(t for t in scalars if re.fullmatch(regex, t)) == [
        "attribution/layer0_head0",
        "attribution/layer0_head1",
    ]
    (chart,) = categories["circuits: K-composition"].chart
    assert chart.title == "layer 0 -> 1"
    assert len([t for t in scalars if re.fullmatch(chart.multiline.tag[0], t)]) == 4


def test_the_hparams_tab_gets_the_config_and_the_loss_and_speed_metrics(run, tb_events):
    from tensorboard.plugins.hparams import plugin_data_pb2

    run_dir, _ = run
    ea = tb_events(run_dir)
    content = ea.PluginTagToContent("hparams")
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    metrics = [m.name.tag for m in experiment.metric_infos]
    assert metrics == list(HPARAM_METRICS) and {"val/loss", "perf/tokens_per_sec"} <= set(metrics)
    for tag in metrics:  # every metric the tab shows is a scalar the run logged
        assert ea.Scalars(tag), tag
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    hparams = start.session_start_info.hparams
    assert hparams["model.attention"].string_value == "sdpa"
    assert hparams["model.n_layer"].number_value == 2
    assert hparams["optimizer.hidden.lr"].number_value == pytest.approx(0.02)  # the default, Muon's
    assert not [k for k in hparams if k.startswith(("paths.", "callbacks.", "logger."))]
    end = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_end_info"])
    assert end.session_end_info.status == 1  # STATUS_SUCCESS, written when training finished


def test_flat_hparams_and_layout_by_hand():
    config = {
        "model": {"n_layer": 2, "sliding_window": None, "attention": "sdpa"},
        "optimizer": {"_target_": "torch.optim.AdamW", "betas": [0.9, 0.99]},
        "paths": {"output_dir": "/x"},
        "seed": 1,
    }
    assert flat_hparams(config) == {
        "model.n_layer": 2,
        "model.sliding_window": "null",
        "model.attention": "sdpa",
        "optimizer.betas": "[0.9, 0.99]",
        "seed": 1,
    }
    layout = custom_scalars_layout(3)
    assert layout["insight: previous-token score"]["layer 2"] == [
        "Multiline",
        [r"insight/previous_token/layer2_head\d+"],
    ]


def test_a_resumed_callback_keeps_its_best_loss_and_reports_the_phase_change_once():
    first = HeadInsightLogger()
    first.best_val_loss = 1.5
    first.detector.update(0, torch.zeros(1, 2), 0.0)
    assert first.detector.update(100, torch.tensor([[0.9, 0.0]]), -1.0) is not None
    resumed = HeadInsightLogger()
    resumed.load_state_dict(first.state_dict())
    assert resumed.best_val_loss == 1.5
    assert resumed.detector.update(200, torch.tensor([[0.95, 0.0]]), -1.2) is None
    saved = first.state_dict()
    torch.save(saved, buf := __import__("io").BytesIO())
    buf.seek(0)
    assert torch.load(buf, weights_only=True) == saved  # plain data: loads with weights_only=True


def test_bad_settings_are_refused_by_name():
    with pytest.raises(ValueError, match=r"callbacks\.head_insight\.probe_tokens=2 is invalid"):
        HeadInsightLogger(probe_tokens=2)
    assert PhaseChangeDetector().fired is None


def test_the_attention_tab_summary_is_labelled_by_the_same_validations_scores(run, tb_events):
    """The ATTENTION tab's summary (gptmini.training.callbacks.summary_logging) at each validation, its head types those of the
    insight scalars logged at the same step."""
    from tensorboard.util import tensor_util

    from gptmini.board.summary import TAG, decode
    from gptmini.insight.scores import head_types

    run_dir, _ = run
    ea = tb_events(run_dir)
    events = ea.Tensors(TAG)
    assert [e.step for e in events] == [0, 3, 6]  # 0: the untrained model, written as training starts
    header, tri = decode(tensor_util.make_ndarray(events[-1].tensor_proto))
    assert (header["n_layer"], header["n_head"]) == (2, 2) and tri.shape[:2] == (2, 2)
    logged = {
        name: torch.tensor(
            [[ea.Scalars(f"insight/{name}/layer{la}_head{h}")[-1].value for h in (0, 1)] for la in (0, 1)]
        )
        for name in ("previous_token", "induction", "first_token", "mean_distance")
    }
    assert header["head_types"] == head_types(logged)


def test_the_untrained_baseline_is_scored_later_on_the_weights_of_step_0(tmp_path, tb_events):
    """The first training step does not wait for the baseline pass: at the start of training the callback keeps a
    copy of the untrained model and scores it (as step 0) at the first validation, after the weights changed."""
    import copy
    import types

    import numpy as np
    from lightning.pytorch.loggers import TensorBoardLogger

    from gptmini.insight.scores import head_scores
    from gptmini.model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=20, block_size=16, n_layer=2, n_head=2, n_embd=16))
    untrained = copy.deepcopy(model)  # the oracle's copy, taken by the test
    tokens = np.random.default_rng(0).integers(0, 20, 4000).astype(np.uint16)
    logger = TensorBoardLogger(str(tmp_path), name="", version="tb")
    trainer = types.SimpleNamespace(
        global_step=0,
        loggers=[logger],
        sanity_checking=False,
        callback_metrics={},
        datamodule=types.SimpleNamespace(val_dataset=types.SimpleNamespace(tokens=tokens)),
        precision_plugin=types.SimpleNamespace(forward_context=__import__("contextlib").nullcontext),
    )
    pl_module = types.SimpleNamespace(model=model, device=torch.device("cpu"), hparams={})
    callback = HeadInsightLogger(probe_tokens=12, probe_batch=2, loss_windows=4, log_hparams=False)

    callback.on_train_start(trainer, pl_module)
    assert callback.last_scores is None  # nothing scored before the first step
    with torch.no_grad():  # "training": every weight moves
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    trainer.global_step, trainer.callback_metrics = 5, {"val/loss": torch.tensor(2.5)}
    callback.on_validation_end(trainer, pl_module)
    logger.experiment.flush()

    ea = tb_events(tmp_path)
    got = {e.step: e.value for e in ea.Scalars("insight/induction/layer1_head0")}
    probes = callback._probes
    want_0 = head_scores(untrained, probes)["induction"][1, 0].item()
    want_5 = head_scores(model, probes)["induction"][1, 0].item()
    assert want_0 != want_5  # the two weight sets score differently: the check below can tell them apart
    assert got == pytest.approx({0: want_0, 5: want_5}, rel=1e-6)
    assert callback.last_scores[0] == 5  # the ATTENTION tab labels heads by the validation's own scores


def test_a_model_without_per_head_outputs_logs_no_circuits_and_says_so_once(caplog):
    from types import SimpleNamespace

    from gptmini.model import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=20, block_size=8, n_layer=2, n_head=2, n_embd=8, attn_gate=True))
    written = []
    writer = SimpleNamespace(add_scalar=lambda tag, value, step: written.append(tag))
    logger = HeadInsightLogger()
    probes = SimpleNamespace(text=torch.zeros(1, 8, dtype=torch.long))
    with caplog.at_level("INFO"):
        for step in (1, 2):
            logger._write_circuits(model, probes, writer, step)
    assert written == []
    assert [r.getMessage() for r in caplog.records].count(
        "no attribution/ or composition/ scalars: model.attn_gate=true multiplies each head's output by a gate "
        "of the input"
    ) == 1
