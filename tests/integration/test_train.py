"""The training pipeline as a user meets it: a tiny run through the real Hydra entry point
(``python -m gptmini.training``) leaves checkpoints, TensorBoard events (losses, attention images, text
samples), resumes, and feeds the sample, eval and attention-export commands. (Composing and checking configs
without training is in tests/unit/training/test_config.py.)"""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import torch
from omegaconf import OmegaConf

from gptmini.runs.record import read_record


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory, run_cli):
    """One tiny run through the real entry point, with the default (GPT-2 BPE) tokenizer."""
    root = tmp_path_factory.mktemp("smoke")
    proc = run_cli.train(["debug=smoke", f"paths.output_root={root}/outputs", f"paths.data_root={root}/data"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = (root / "outputs" / "smoke").iterdir()
    return root, run_dir, proc


def test_smoke_run_writes_checkpoints_config_and_a_final_message(smoke_run):
    root, run_dir, proc = smoke_run
    # debug=smoke writes the least: the final last.ckpt alone (callbacks=final)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["last.ckpt"]
    saved = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    assert saved.run_name == "smoke" and saved.model.n_layer == 2
    out = proc.stdout + proc.stderr
    assert "gptmini board" in out and str(run_dir / "checkpoints") in out
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 6
    assert set(ckpt["hyper_parameters"]) == {"run_record"}  # the one record: the model, the data, ...
    assert read_record(ckpt).model["vocab_size"] == 50257


def test_the_run_keeps_its_plan_as_a_versioned_json_record(smoke_run):
    """The run folder's run_record.json and the checkpoint's record are the same JSON, of this version, holding
    what the run was: the hardware chosen, the overrides, the tokenizer, the tokens of one step; the composed
    config is kept nowhere by gptmini (Hydra's own .hydra/ aside)."""
    from gptmini.runs.record import RECORD_KEY, RECORD_VERSION, read_record, read_record_file

    root, run_dir, _ = smoke_run
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    hp = ckpt["hyper_parameters"]
    assert "run_config" not in hp and isinstance(hp[RECORD_KEY], str)
    assert json.loads(hp[RECORD_KEY]) == json.loads((run_dir / "run_record.json").read_text())
    record = read_record(ckpt)
    assert record == read_record_file(run_dir) and record.version == RECORD_VERSION
    assert record.hardware == "cpu" and record.precision == "32-true" and record.run_name == "smoke"
    assert record.overrides == (
        "debug=smoke",
        f"paths.output_root={root}/outputs",
        f"paths.data_root={root}/data",
    )
    assert record.tokenizer_name == "gpt2" and record.init_from is None and record.world_size == 1
    # debug=smoke: 4 sequences of model=tiny's 32 tokens, one process, no accumulation
    assert record.tokens_per_step == 4 * 32
    assert record.model == read_record(ckpt).model and record.trainer["val_check_interval"] == 3


def test_smoke_run_logs_losses_attention_maps_and_text_to_tensorboard(smoke_run, tb_events):
    _, run_dir, _ = smoke_run
    ea = tb_events(run_dir)
    tags = ea.Tags()
    for tag in ("train/loss", "val/loss", "val/ppl", "val/bpb", "train/grad_norm", "perf/tokens_per_sec"):
        assert tag in tags["scalars"], (tag, tags["scalars"])
    # the default recipe: one learning-rate curve per parameter role (Muon for the hidden matrices)
    assert {"lr-MuonAdamW/hidden", "lr-MuonAdamW/embedding"} <= set(tags["scalars"]), tags["scalars"]
    val = ea.Scalars("val/loss")
    assert len(val) == 2 and val[0].step < val[1].step  # validations after steps 3 and 6
    ppl = ea.Scalars("val/ppl")
    assert ppl[-1].value == pytest.approx(torch.exp(torch.tensor(val[-1].value)).item(), rel=1e-4)
    for layer in (0, 1):
        assert f"attention/layer{layer}_heads" in tags["images"]
        assert f"attention/layer{layer}_mean" in tags["images"]
        img = ea.Images(f"attention/layer{layer}_heads")[-1]
        assert img.encoded_image_string[:8] == b"\x89PNG\r\n\x1a\n" and img.width > 100
        # drawn on a background thread: the images of the last validation too were written before the run ended
        assert [e.step for e in ea.Images(f"attention/layer{layer}_mean")] == [3, 6]
    assert "attention/entropy/layer0_head1" in tags["scalars"]
    # the global batch (4 sequences x 32 tokens here) is logged, and the token count follows the optimizer step
    assert (
        "global batch: 4 sequences x 32 tokens = 128 tokens per optimizer step"
        in (run_dir / "train.log").read_text()
    )
    seen = ea.Scalars("perf/tokens_seen")
    assert [e.value for e in seen] == [128.0 * (i + 1) for i in range(len(seen))] and seen[
        -1
    ].value == 6 * 128
    text_tags = [t for t in tags["tensors"] if t.startswith("samples/text")]
    assert text_tags
    sample = ea.Tensors(text_tags[0])[-1].tensor_proto.string_val[0].decode()
    assert "ROMEO" in sample


def test_output_that_is_not_a_terminal_gets_a_progress_line_every_n_steps(smoke_run):
    """The run's output went to a pipe (no progress bar can be drawn there): debug=smoke's every 2 steps, in the
    console and in train.log."""
    _, run_dir, proc = smoke_run
    pattern = r"step (\d+)/6 \| loss \d+\.\d{4} \| [\d,]+ tok/s \| elapsed \d+s(?: \| ETA \d+s)?$"
    for text in (proc.stdout + proc.stderr, (run_dir / "train.log").read_text()):
        steps = [int(m) for m in re.findall(pattern, text, re.M)]
        assert steps == [2, 4, 6], text[-3000:]
    assert "Epoch 0/-2" not in proc.stdout + proc.stderr


VALIDATION_LINE = re.compile(
    r"(?:^|\] - )step (\d+): train loss (\d+\.\d{4}), val loss (\d+\.\d{4}), val bpb (\d+\.\d{4}), val ppl (\d+\.\d{2})$",
    re.M,
)


def test_output_that_is_not_a_terminal_shows_every_validation(smoke_run, tb_events):
    """nanoGPT's "step N: train loss X, val loss Y", with bpb and perplexity, at each validation (steps 3 and 6),
    in the console and in train.log; the values are those of the TensorBoard run."""
    _, run_dir, proc = smoke_run
    events = tb_events(run_dir)
    logged = {
        tag: {e.step: e.value for e in events.Scalars(tag)} for tag in ("val/loss", "val/bpb", "val/ppl")
    }
    for text in (proc.stdout + proc.stderr, (run_dir / "train.log").read_text()):
        lines = VALIDATION_LINE.findall(text)
        assert [int(line[0]) for line in lines] == [3, 6], text[-3000:]
        for step, _, loss, bpb, ppl in lines:
            assert float(loss) == pytest.approx(logged["val/loss"][int(step)], abs=5e-5)
            assert float(bpb) == pytest.approx(logged["val/bpb"][int(step)], abs=5e-5)
            assert float(ppl) == pytest.approx(logged["val/ppl"][int(step)], abs=5e-3)


def test_the_run_ends_with_a_summary_a_loss_curve_and_its_scalars(smoke_run, tb_events):
    """The run explains itself: a summary (wall time, tokens, the final validation, the best step, where things
    are, the next commands), loss_curve.png and scalars.csv in its folder, the CSV holding the TensorBoard run's
    scalars."""
    import csv

    from PIL import Image

    _, run_dir, proc = smoke_run
    out = proc.stdout + proc.stderr
    events = tb_events(run_dir)
    val = {e.step: e.value for e in events.Scalars("val/loss")}
    best_step = min(val, key=val.get)
    # 6 steps of 4 sequences x 32 tokens
    assert re.search(r"run finished: 6 steps in \d+(m\d\ds)?s? \(wall time\), 768 tokens seen", out), out[
        -3000:
    ]
    assert (
        f"val/loss {val[6]:.4f}" in out and f"best val/loss {val[best_step]:.4f} at step {best_step}" in out
    )
    assert f"checkpoints: {run_dir / 'checkpoints'} (last.ckpt)" in out
    assert f"TensorBoard run: {run_dir / 'tb'}" in out
    assert f"loss curve: {run_dir / 'loss_curve.png'}; every scalar: {run_dir / 'scalars.csv'}" in out
    root = run_dir.parent.parent  # paths.output_root, not the commands' default: named in the commands
    for command in (
        f"gptmini runs --runs-dir {root}",
        f"gptmini sample --ckpt {run_dir}",
        f"gptmini eval --ckpt {run_dir}",
        f"gptmini board --logdir {root}",
    ):
        assert command in out, command

    with open(run_dir / "scalars.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {"step", "train/loss", "val/loss", "val/bpb", "val/ppl", "perf/tokens_per_sec"} <= set(rows[0])
    assert list(rows[0])[:4] == ["step", "train/loss", "val/loss", "val/bpb"]
    assert list(rows[0])[4].startswith("lr-")
    in_csv = {int(r["step"]): float(r["val/loss"]) for r in rows if r["val/loss"]}
    assert in_csv == pytest.approx(val, abs=0)
    train = {int(r["step"]): float(r["train/loss"]) for r in rows if r["train/loss"]}
    assert train == pytest.approx({e.step: e.value for e in events.Scalars("train/loss")}, abs=0)

    image = Image.open(run_dir / "loss_curve.png")
    assert image.format == "PNG" and image.width > 300 and image.height > 200
    assert len(image.convert("RGB").getcolors(1 << 20)) > 10  # lines and text drawn, not a blank image


def test_gptmini_runs_lists_the_run_and_its_name_opens_it(smoke_run, gptmini_cli):
    root, run_dir, _ = smoke_run
    listed = gptmini_cli(["runs", "--runs-dir", root / "outputs", "smoke"])
    assert listed.returncode == 0, listed.stderr
    (row,) = [line for line in listed.stdout.splitlines() if str(run_dir) in line.split()]
    assert "6/6" in row.split() and "finished" in row.split()
    sample = gptmini_cli(["sample", "--ckpt", "smoke", "--max-new-tokens", "2", "--prompt", "A"], cwd=root)
    assert sample.returncode == 0, sample.stderr
    assert "loaded outputs/smoke/" in sample.stderr and "/checkpoints/last.ckpt" in sample.stderr


def _csv_steps(run_dir, tag):
    import csv

    with (run_dir / "scalars.csv").open() as f:
        return [int(row["step"]) for row in csv.DictReader(f) if row[tag]]


def test_each_continuation_is_a_tensorboard_run_of_its_own_with_the_history_it_continued(
    smoke_run, run_cli, tmp_path
):
    """Two continuations of one checkpoint (ckpt_path=last, then the first run's folder with another lr): each logs
    to a TensorBoard run of its own, the first run's untouched, and each one's scalars.csv holds the first run's
    steps up to the step it continued from, then its own, never the other's (both logged into the first run's
    TensorBoard run, so each one's CSV held the other's steps). Each records its lineage. Its output goes to a
    file, as `make train > log` does: the plain progress lines are there, and no frame of the progress bar."""
    import shutil

    from gptmini.runs.discovery import event_folders, read_events
    from gptmini.runs.record import Lineage, read_record, read_record_file

    source_root, source_run, _ = smoke_run
    root = tmp_path / "root"
    shutil.copytree(source_root, root)
    first_run = root / "outputs" / "smoke" / source_run.name
    (first_events,) = event_folders(first_run)
    first_steps = [e.step for e in read_events(first_events).Scalars("train/loss")]
    first_files = {p: p.read_bytes() for p in first_run.rglob("*") if p.is_file()}
    base = ["debug=smoke", f"paths.output_root={root}/outputs", f"paths.data_root={root}/data"]
    out = tmp_path / "resume.out"
    with out.open("w") as console:
        proc = run_cli.popen(
            run_cli.train_module,
            [*base, "ckpt_path=last", "trainer.max_steps=9"],
            stdout=console,
            stderr=subprocess.STDOUT,
        )
        assert proc.wait(timeout=300) == 0, out.read_text()[-3000:]
    text = out.read_text()
    assert f"resuming from {first_run / 'checkpoints' / 'last.ckpt'}" in text
    (resumed,) = [d for d in (root / "outputs" / "smoke").iterdir() if d != first_run]
    other = run_cli.train(
        [*base, f"ckpt_path={first_run}", "trainer.max_steps=8", "optimizer.hidden.lr=0.01"]
    )
    assert other.returncode == 0, other.stderr[-3000:]
    (second,) = [d for d in (root / "outputs" / "smoke").iterdir() if d not in (first_run, resumed)]
    assert torch.load(resumed / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 9
    # the first run is as it was: no continuation wrote into its folder or its TensorBoard run
    assert {p: p.read_bytes() for p in first_run.rglob("*") if p.is_file()} == first_files
    lineage = Lineage(str(first_run / "checkpoints" / "last.ckpt"), 6)
    for run, steps, validated in ((resumed, [6, 7, 8], [3, 6, 9]), (second, [6, 7], [3, 6])):
        # a TensorBoard run of its own, named after it and the step it continued from
        (events,) = event_folders(run)
        assert events.parent == run / "tb" and "resumed_at=6" in events.name.split(","), events
        assert [e.step for e in read_events(events, tensors=0).Scalars("train/loss")] == steps
        # its CSV: the first run's history up to step 6, then its own steps only
        assert _csv_steps(run, "train/loss") == [*first_steps, *steps], run
        assert _csv_steps(run, "val/loss") == validated
        record = read_record_file(run)
        assert (
            record.continued_from == lineage
            and read_record(torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)) == record
        )
        assert (run / record.tensorboard_dir).resolve() == events.resolve()
    # the overrides as text at the step it resumed from
    events = read_events(event_folders(resumed)[0], tensors=0)
    texts = {
        e.step: e.tensor_proto.string_val[0].decode() for e in events.Tensors("run/overrides/text_summary")
    }
    assert sorted(texts) == [6] and "resumed from" in texts[6] and "- `trainer.max_steps=9`" in texts[6]
    # not a terminal: ProgressLog's lines, no progress bar
    assert re.findall(r"step (\d+)/9 \| loss", text) == ["8", "9"]
    assert "━" not in text and "it/s" not in text, text[-2000:]
    listed = run_cli("gptmini.cli", ["runs", "--runs-dir", root / "outputs", "--json", "smoke"])
    rows = {row["folder"]: row for row in json.loads(listed.stdout)}
    assert rows[str(resumed)]["val_step"] == 9 and rows[str(first_run)]["val_step"] == 6
    assert rows[str(resumed)]["tensorboard"] == str(event_folders(resumed)[0])


def test_sample_command_generates_text_from_a_checkpoint(smoke_run, capsys):
    # the command line parsed as a user's, in this process (test_gptmini_runs_... runs `gptmini sample` as a process)
    from gptmini.cli import main as gptmini

    _, run_dir, _ = smoke_run
    code = gptmini(
        [
            "sample",
            "--ckpt",
            str(run_dir / "checkpoints" / "last.ckpt"),
            "--prompt",
            "ROMEO:",
            "--max-new-tokens",
            "12",
            "--num-samples",
            "2",
            "--temperature",
            "0.9",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.count("ROMEO:") == 2
    assert len(out) > 2 * len("ROMEO:") + 10


def test_export_attention_writes_png_files(smoke_run, tmp_path):
    # in this process (the command as a process: test_reliability's pickled-checkpoint refusal)
    from gptmini.cli import main as gptmini

    _, run_dir, _ = smoke_run
    out = tmp_path / "png"
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    assert (
        gptmini(["attention", "--ckpt", str(ckpt), "--text", "To be, or not to be", "--out", str(out)]) == 0
    )
    files = sorted(p.name for p in out.glob("*.png"))
    assert files == ["layer0_heads.png", "layer0_mean.png", "layer1_heads.png", "layer1_mean.png"]
    assert (out / "layer0_heads.png").read_bytes()[:4] == b"\x89PNG"


def test_eval_command_reproduces_the_logged_validation_loss(smoke_run, gptmini_cli, tb_events, tmp_path):
    _, run_dir, _ = smoke_run
    out = tmp_path / "eval.json"
    # The smoke run validated 2 batches of 4 strided windows with the weights saved in last.ckpt.
    proc = gptmini_cli(
        [
            "eval",
            "--ckpt",
            run_dir / "checkpoints" / "last.ckpt",
            "--batch-size",
            "4",
            "--max-batches",
            "2",
            "--out",
            out,
        ],
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    # the checkpoint's own step, in the run's own TensorBoard run
    step = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    logged = next(e.value for e in tb_events(run_dir).Scalars("val/loss") if e.step == step)
    assert result["loss"] == pytest.approx(logged, abs=1e-4)
    assert result["ppl"] == pytest.approx(torch.exp(torch.tensor(result["loss"])).item(), rel=1e-6)
    assert result["tokens"] == 2 * 4 * 32


@pytest.mark.slow
def test_multirun_gives_each_job_its_own_folder_and_tensorboard_run(tmp_path, run_cli, tb_events):
    proc = run_cli.train(
        [
            "-m",
            "debug=smoke",
            "tokenizer=char",
            "model.attention=sdpa,mha",
            "trainer.max_steps=3",
            f"paths.output_root={tmp_path}/outputs",
            f"paths.data_root={tmp_path}/data",
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (sweep,) = (tmp_path / "outputs" / "smoke").glob("multirun_*")
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert jobs == [
        f"debug=smoke,model.attention={a},tokenizer=char,trainer.max_steps=3" for a in ("mha", "sdpa")
    ]
    for job in jobs:
        assert (sweep / job / "checkpoints" / "last.ckpt").is_file()
        # the job's TensorBoard run is named after the run and every override of the job
        (events,) = {p.parent for p in (sweep / job).rglob("events.out.tfevents.*")}
        assert events == sweep / job / "tb" / f"smoke,{job}"
        assert "val/loss" in tb_events(sweep / job).Tags()["scalars"]
        ckpt = torch.load(sweep / job / "checkpoints" / "last.ckpt", weights_only=True)
        assert read_record(ckpt).model["attention"] == job.split("model.attention=")[1].split(",")[0]


@pytest.mark.slow
def test_training_starts_from_hugging_face_gpt2_weights(tmp_path, run_cli):
    import transformers

    from gptmini.hf import load_hf_model
    from gptmini.runs.loading import open_run

    hf = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, n_positions=32, vocab_size=50257)
    )
    hf.save_pretrained(tmp_path / "gpt2-tiny")
    proc = run_cli.train(
        [
            "debug=smoke",
            f"model.init_from={tmp_path / 'gpt2-tiny'}",
            "trainer.max_steps=1",
            "trainer.val_check_interval=1",
            "optimizer=adamw",
            "optimizer.lr=1e-9",
            "scheduler=constant",
            f"paths.output_root={tmp_path}/outputs",
            f"paths.data_root={tmp_path}/data",
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "initialised weights from" in proc.stdout + proc.stderr
    (run_dir,) = (tmp_path / "outputs" / "smoke").iterdir()
    trained = open_run(run_dir / "checkpoints" / "last.ckpt", "cpu", tokenizer=False).model
    start = load_hf_model(tmp_path / "gpt2-tiny")
    idx = torch.randint(0, 50257, (1, 16))
    # One step at lr 1e-9 barely moves the weights: the run started from the Hugging Face ones.
    torch.testing.assert_close(trained(idx)[0], start(idx)[0], atol=1e-4, rtol=1e-4)


def test_an_init_from_folder_gptmini_cannot_load_is_refused_before_any_data(tmp_path, run_cli):
    """A Hugging Face folder whose config.json names a model gptmini cannot load (here GPT-2 with a ReLU MLP) is
    refused at planning, in one line naming the field, before any data is prepared or a run folder is kept."""
    folder = tmp_path / "gpt2-relu"
    folder.mkdir()
    config = {
        "model_type": "gpt2",
        "n_embd": 32,
        "n_layer": 2,
        "n_head": 2,
        "n_positions": 32,
        "vocab_size": 50257,
    }
    (folder / "config.json").write_text(json.dumps(config | {"activation_function": "relu"}))
    proc = run_cli.train(
        [
            "debug=smoke",
            f"model.init_from={folder}",
            f"paths.output_root={tmp_path}/outputs",
            f"paths.data_root={tmp_path}/data",
        ]
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "activation_function='relu' is unsupported" in errors[0], proc.stderr[-3000:]
    assert not (tmp_path / "data").exists()
    assert not list((tmp_path / "outputs").glob("*/*/checkpoints"))
