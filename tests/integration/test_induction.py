"""The known result, reproduced through the real training command: on text made of segments each written twice,
a 2-layer attention-only transformer forms an induction head (induction score > 0.5) in a phase change that the
run reports, while the in-context-learning score falls; a 1-layer one cannot (score < 0.2). Olsson et al.,
"In-context Learning and Induction Heads" (2022). Then the head report finds that head among the final induction
heads and shows that the top one matters.

About 25 s of CPU for the 2-layer run and 15 s for the 1-layer one (OMP_NUM_THREADS=1)."""

from __future__ import annotations

import json
import re

import pytest

from gptmini.insight.probes import repeated_segments_text

pytestmark = pytest.mark.slow

# the recipe (README, "Head insight"): rotary positions, no MLP, 4 heads of 16, 32-token context, constant lr
RECIPE = [
    "data=text",
    "tokenizer=char",
    "hardware=cpu",
    "trainer=cpu",
    "model=tiny",
    "model.block_size=32",
    "model.n_head=4",
    "model.n_embd=64",
    "model.mlp=none",
    "model.position=rope",
    "data.batch_size=32",
    "optimizer=adamw",
    "optimizer.lr=3e-3",
    "optimizer.weight_decay=0",
    "scheduler=constant",
    "trainer.max_steps=1000",
    "trainer.val_check_interval=100",
    "trainer.limit_val_batches=4",
    "callbacks.head_insight.probe_batch=8",
    "~callbacks.attention_maps",
    "~callbacks.text_samples",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("induction")
    path = root / "segments.txt"
    path.write_text(repeated_segments_text(200_000, min_len=10, max_len=16, seed=0))
    return root, path


def _train(run_cli, corpus, n_layer: int):
    root, path = corpus
    name = f"induction_{n_layer}l"
    args = [*RECIPE, f"data.source={path}", f"model.n_layer={n_layer}", f"run_name={name}"]
    args += [f"paths.output_root={root}/outputs", f"paths.data_root={root}/data"]
    proc = run_cli.train(args, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = (root / "outputs" / name).iterdir()
    return run_dir, proc.stdout + proc.stderr


def test_two_layers_form_an_induction_head_in_a_reported_phase_change(run_cli, corpus, tb_events, tmp_path):
    run_dir, out = _train(run_cli, corpus, n_layer=2)
    ea = tb_events(run_dir)
    induction = [(e.step, e.value) for e in ea.Scalars("insight/induction_max")]
    icl = [e.value for e in ea.Scalars("insight/icl_score")]
    assert induction[0][0] == 0 and induction[0][1] < 0.1  # untrained: no induction head
    assert induction[-1][1] > 0.5, induction
    assert icl[-1] < icl[0] - 0.5, icl  # later tokens predicted much better: in-context learning switched on
    (message,) = re.findall(r"induction phase change between step \d+ and step \d+: .*", out)
    step = int(re.search(r"and step (\d+)", message).group(1))
    assert 0 < step <= 1000
    texts = [e for t in ea.Tags()["tensors"] if t.startswith("insight/phase_change") for e in ea.Tensors(t)]
    assert len(texts) == 1 and texts[0].step == step  # said once, in TensorBoard too
    heads = set(
        re.findall(r"layer (\d+) head (\d+) \(", message)
    )  # the heads that crossed, in that validation
    _k_composition_rises_at_the_phase_change(ea, step)

    # the report of the final checkpoint: induction heads, the top one matters
    report_dir = tmp_path / "report"
    proc = run_cli(
        "gptmini.cli", ["analyze", "--ckpt", run_dir / "checkpoints" / "last.ckpt", "--out", report_dir]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((report_dir / "report.json").read_text())
    top = report["top_heads"]["induction"][0]
    assert top["value"] > 0.5
    # the heads the phase change named are still induction heads at the end (others may join and overtake them)
    final = {(str(h["layer"]), str(h["head"])): h["induction"] for h in report["heads"]}
    assert heads and all(final[h] > 0.5 for h in heads), (heads, final)
    record = next(h for h in report["heads"] if (h["layer"], h["head"]) == (top["layer"], top["head"]))
    assert record["ablation_loss_delta"] > 0.1  # replacing it by its mean costs loss


def _k_composition_rises_at_the_phase_change(ea, step: int) -> None:
    """The circuit in the weights: the K-composition of layer 0's previous-token head on layer 1's strongest
    induction head rises from the validation before the phase change to the end, where no other layer-0 head
    feeds that head's keys as much; and that head's direct logit attribution rises with it."""

    def last(tag: str) -> float:
        return ea.Scalars(tag)[-1].value

    prev = max(range(4), key=lambda h: last(f"insight/previous_token/layer0_head{h}"))
    induction = max(range(4), key=lambda h: last(f"insight/induction/layer1_head{h}"))
    k = {e.step: e.value for e in ea.Scalars(f"composition/K/l0h{prev}_to_l1h{induction}")}
    before = k[step - 100]
    assert k[1000] > before + 0.05, (prev, induction, k)
    others = [last(f"composition/K/l0h{h}_to_l1h{induction}") for h in range(4) if h != prev]
    assert k[1000] > max(others), (prev, induction, k[1000], others)
    attribution = {e.step: e.value for e in ea.Scalars(f"attribution/layer1_head{induction}")}
    assert attribution[1000] > attribution[step - 100] + 0.05, attribution


def test_one_layer_cannot_form_an_induction_head(run_cli, corpus, tb_events):
    run_dir, out = _train(run_cli, corpus, n_layer=1)
    ea = tb_events(run_dir)
    induction = [e.value for e in ea.Scalars("insight/induction_max")]
    assert len(induction) == 11 and max(induction) < 0.2, induction
    assert "induction phase change" not in out
