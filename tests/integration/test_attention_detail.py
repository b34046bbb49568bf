"""What a run logs for the ATTENTION tab's sink, lens and neuron views and for TensorBoard's PROJECTOR, through
``gptmini train`` (in this process): the sink shares and the lens's last row checked against the final
checkpoint's own attention and loss on the probe; ``lens`` and ``projector_every`` turned off; a bad
``projector_every`` refused in one line before anything is written."""

from __future__ import annotations

import numpy as np
import pytest
import torch


@pytest.fixture(scope="module")
def detail_run(tmp_path_factory, train_in_process):
    root = tmp_path_factory.mktemp("detail")
    run_dir = root / "outputs" / "smoke" / "run"
    train_in_process(
        ["debug=smoke", f"paths.output_root={root}/outputs", f"paths.data_root={root}/data"], run_dir
    )
    return root, run_dir


def _last_summary(events):
    from tensorboard.util import tensor_util

    from gptmini.board.summary import TAG, decode

    event = events.Tensors(TAG)[-1]
    return event.step, decode(tensor_util.make_ndarray(event.tensor_proto))[0]


def test_the_sink_and_lens_scalars_are_the_checkpoints_own(detail_run, tb_events) -> None:
    from gptmini.data.tokenizers import build_tokenizer
    from gptmini.runs.loading import open_run

    _, run_dir = detail_run
    events = tb_events(run_dir)
    tags = events.Tags()
    step, header = _last_summary(events)
    model = open_run(run_dir / "checkpoints" / "last.ckpt", "cpu", tokenizer=False).model
    assert step == 6 and (model.config.n_layer, model.config.n_head) == (2, 2)
    ids = build_tokenizer("gpt2").encode("".join(header["tokens"]))
    assert len(ids) == len(header["tokens"])
    idx = torch.tensor([ids])
    with torch.no_grad():
        maps = model.attention_maps(idx)[:, 0].numpy()  # (L, nh, T, T)
        _, loss = model(idx[:, :-1], idx[:, 1:])
    for layer in range(2):
        for head in range(2):
            (last,) = [e for e in events.Scalars(f"attention/sink/layer{layer}_head{head}") if e.step == 6]
            assert last.value == pytest.approx(maps[layer, head, 1:, 0].mean(), abs=1e-4)
    rows = ["embed", "layer0", "layer1"]
    for row in rows:  # step 0: the untrained model, written as training starts
        assert [e.step for e in events.Scalars(f"lens/loss/{row}")] == [0, 3, 6]
        assert [e.step for e in events.Scalars(f"lens/top1/{row}")] == [0, 3, 6]
    # the last row reads the model's own output: its loss on the probe
    assert events.Scalars("lens/loss/layer1")[-1].value == pytest.approx(loss.item(), rel=1e-4)
    assert "lens/grid" in tags["images"]
    # the summary the tab reads: the same sinks, the lens table, the queries and keys of every layer
    np.testing.assert_allclose(header["sink"]["first"], maps[:, :, 1:, 0].mean(-1), atol=1e-4)
    assert header["lens"]["rows"] == rows and header["vectors"]["layers"] == 2


def test_the_projector_holds_each_heads_queries_and_keys_labelled(detail_run) -> None:
    _, run_dir = detail_run
    (events_dir,) = (run_dir / "tb").iterdir()
    config = (events_dir / "projector_config.pbtxt").read_text()
    for layer in range(2):
        for head in range(2):
            assert f'tensor_name: "qk/layer{layer}_head{head}:00006"' in config
    folder = events_dir / "00006" / "qk%2flayer1_head0"
    metadata = (folder / "metadata.tsv").read_text().splitlines()
    vectors = (folder / "tensors.tsv").read_text().splitlines()
    assert metadata[0] == "token\tposition\tkind\tlayer\thead"
    t = (len(metadata) - 1) // 2
    assert len(vectors) == 2 * t and metadata[1].split("\t")[1:] == ["0", "q", "1", "0"]
    assert metadata[t + 1].split("\t")[1:] == ["0", "k", "1", "0"]
    assert len(vectors[0].split("\t")) == 16  # the tiny model's head size


def test_lens_and_projector_turned_off(tmp_path, gptmini_train, tb_events) -> None:
    proc = gptmini_train(
        [
            "debug=smoke",
            "trainer.max_steps=3",
            "callbacks.attention_summary.lens=false",
            "callbacks.attention_summary.projector_every=null",
            f"paths.output_root={tmp_path}/outputs",
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = (tmp_path / "outputs" / "smoke").iterdir()
    tags = tb_events(run_dir).Tags()
    assert not [t for t in tags["scalars"] if t.startswith("lens/")] and "lens/grid" not in tags["images"]
    assert "attention/sink/layer1_head1" in tags["scalars"]
    assert not list(run_dir.rglob("projector_config.pbtxt"))
    _, header = _last_summary(tb_events(run_dir))
    assert header["lens"] is None and header["vectors"] is not None


def test_a_bad_projector_every_is_refused_in_one_line(tmp_path, gptmini_train) -> None:
    proc = gptmini_train(
        [
            "debug=smoke",
            "callbacks.attention_summary.projector_every=-1",
            f"paths.output_root={tmp_path}/outputs",
        ]
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text[-3000:]
    assert "callbacks.attention_summary.projector_every=-1 is invalid: a number of validations >= 1" in text
    assert "Traceback" not in text and len(text.strip().splitlines()[-1]) > 0
    # refused before training: no checkpoint, no events
    written = [p.name for p in (tmp_path / "outputs").rglob("*") if p.is_file()]
    assert not [n for n in written if n.endswith(".ckpt") or n.startswith("events.out")], written


def test_the_projector_lists_each_step_once(tmp_path, gptmini_train) -> None:
    # a validation at the last step writes the PROJECTOR's embeddings; the end of training must not add them again
    proc = gptmini_train(
        [
            "debug=smoke",
            "callbacks.attention_summary.projector_every=1",
            f"paths.output_root={tmp_path}/outputs",
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (config,) = (tmp_path / "outputs").rglob("projector_config.pbtxt")
    names = [line.split('"')[1] for line in config.read_text().splitlines() if "tensor_name" in line]
    steps = {name.rsplit(":", 1)[1] for name in names}
    assert len(steps) >= 2 and len(names) == len(set(names)), names
