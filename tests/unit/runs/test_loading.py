"""``gptmini.runs.loading.open_run``: the one way to open a run. Each kind of spec (checkpoint file, run folder, run name,
``last``), the device, the refusals (each naming the bad value and the fix), the tokenizer guarantees, and that
sample, eval and the ATTENTION tab give what the model rebuilt by hand from the checkpoint's tensors gives."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gptmini.data.errors import DataError
from gptmini.data.prepare import prepare
from gptmini.data.reader import load_meta, load_split
from gptmini.model import GPT, GPTConfig
from gptmini.runs.checkpoint import CheckpointError, load_checkpoint
from gptmini.runs.loading import LoadedRun, open_run, tokenizer_for_run
from gptmini.runs.record import RunRecord

STAMP = "2026-01-01_00-00-00_000000"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, write_checkpoint: Any) -> dict[str, Path]:
    """A prepared char corpus and a runs folder as training lays it out: run ``alpha`` with an older and a newer
    job (the newer one interrupted: on_exception.ckpt), and run ``beta``."""
    root = tmp_path_factory.mktemp("runs")
    corpus = root / "small.txt"
    corpus.write_text("".join(f"but soft, what light {i} through yonder window breaks?\n" for i in range(60)))
    data = prepare(str(corpus), "char", root / "data").out_dir
    outputs = root / "outputs"
    old = write_checkpoint(outputs / "alpha" / STAMP / "checkpoints" / "last.ckpt", data_dir=data, seed=1)
    new = write_checkpoint(
        outputs / "alpha" / "2026-01-02_00-00-00_000000" / "checkpoints" / "on_exception.ckpt",
        data_dir=data,
        global_step=9,
        seed=2,
    )
    os.utime(old, (1000, 1000))
    os.utime(new, (2000, 2000))
    beta = write_checkpoint(outputs / "beta" / STAMP / "checkpoints" / "last.ckpt", data_dir=data, seed=3)
    os.utime(beta, (3000, 3000))
    return {"root": root, "data": data, "outputs": outputs, "alpha": new, "alpha_old": old, "beta": beta}


def by_hand(path: Path) -> GPT:
    """The oracle: a GPT built from the checkpoint's saved settings and loaded with its tensors, without the
    loader."""
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    model = GPT(GPTConfig(**json.loads(ckpt["hyper_parameters"]["run_record"])["model"]))
    state = {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items()}
    model.load_state_dict(state)
    return model.eval()


# --- what a spec names ---------------------------------------------------------------------------------------


def test_every_kind_of_spec_opens_the_same_checkpoint(world):
    alpha = world["alpha"]
    specs = {
        "file": alpha,
        "job folder": alpha.parent.parent,
        "run folder": world["outputs"] / "alpha",
        "run name": "alpha",
    }
    idx = torch.tensor([[1, 2, 3, 4]])
    want = by_hand(alpha)(idx)[0]
    for kind, spec in specs.items():
        run = open_run(spec, device="cpu", output_root=world["outputs"])
        assert isinstance(run, LoadedRun)
        assert run.path == alpha, kind
        assert run.step == 9 and run.name == "2026-01-02_00-00-00_000000" and run.device == "cpu"
        assert run.record.data_dir == str(world["data"])
        assert run.record.data_identity["tokenizer"] == "char"
        assert not run.model.training
        torch.testing.assert_close(run.model(idx)[0], want)
    # "last": the newest checkpoint of any run
    assert open_run("last", device="cpu", output_root=world["outputs"]).path == world["beta"]


def test_the_tokenizer_is_the_runs_own(world):
    run = open_run(world["alpha"], device="cpu")
    corpus = (world["root"] / "small.txt").read_text()
    assert run.tokenizer.name == "char" and run.tokenizer.vocab_size == len(set(corpus))
    assert run.tokenizer.decode(run.tokenizer.encode("but soft")) == "but soft"
    assert open_run(world["alpha"], device="cpu", tokenizer=False).tokenizer is None


def test_device_auto_is_a_gpu_when_there_is_one(world):
    run = open_run(world["alpha"])
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert run.device == expected
    assert {p.device.type for p in run.model.parameters()} == {expected}


# --- refusals: one message naming the bad value and the fix ---------------------------------------------------


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("tpu9", r"--device 'tpu9' is not a device: use auto, cpu, cuda or cuda:N"),
        ("cuda", r"--device cuda: PyTorch sees no CUDA GPU on this machine .*: use --device cpu \(or auto\)"),
    ],
)
def test_a_bad_device_is_refused_before_any_file_is_read(world, device, message):
    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    with pytest.raises(ValueError, match=message):
        open_run(world["root"] / "no such.ckpt", device=device)  # the device is the error, not the file


def test_a_missing_run_names_the_runs_there(world):
    with pytest.raises(CheckpointError) as err:
        open_run("gamma", device="cpu", output_root=world["outputs"])
    text = str(err.value)
    assert text == (
        "--ckpt gamma does not exist: pass a .ckpt file written by training, a run folder, a run name under "
        f"{world['outputs']}/ (its runs: alpha, beta), or 'last'"
    )
    with pytest.raises(
        CheckpointError,
        match=r"--ckpt \S+nothing/x\.ckpt does not exist: .* a run name under \S+nothing/ \(no such folder\)",
    ):
        open_run(world["root"] / "nothing" / "x.ckpt", device="cpu", output_root=world["root"] / "nothing")


def test_a_file_that_is_not_a_checkpoint_is_named(world, tmp_path):
    text = tmp_path / "notes.ckpt"
    text.write_text("not a checkpoint\n" * 20)
    with pytest.raises(CheckpointError) as err:
        open_run(text, device="cpu")
    assert str(err.value) == (
        f"{text} is not a gptmini checkpoint (not a PyTorch archive: another kind of file, or truncated): pass a "
        ".ckpt file written by gptmini training (outputs/<run_name>/<time>/checkpoints/last.ckpt)"
    )


def test_a_folder_without_a_checkpoint_is_named(world, tmp_path):
    (tmp_path / "outputs" / "empty").mkdir(parents=True)
    for spec in ("empty", tmp_path / "outputs" / "empty"):
        with pytest.raises(
            CheckpointError, match=r"empty is a folder without a checkpoint .*: pass a run folder"
        ):
            open_run(spec, device="cpu", output_root=tmp_path / "outputs")
    with pytest.raises(
        CheckpointError, match=r"no last\.ckpt or on_exception\.ckpt found under \S+/: train first"
    ):
        open_run("last", device="cpu", output_root=tmp_path / "outputs")


# --- the tokenizer's guarantees ---------------------------------------------------------------------------------


def test_a_checkpoint_recording_no_tokenizer_needs_a_vocabulary_that_fits(world, tmp_path, write_checkpoint):
    imported = write_checkpoint(tmp_path / "imported.ckpt", vocab_size=40)  # records no tokenizer
    with pytest.raises(
        CheckpointError,
        match=rf"checkpoint {imported} records no tokenizer \(imported, not trained by gptmini\) and its "
        r"vocabulary \(40 tokens\) is smaller than GPT-2's \(50257\): pass --data-dir",
    ):
        open_run(imported, device="cpu")
    assert open_run(imported, device="cpu", data_dir=world["data"]).tokenizer.name == "char"
    small = write_checkpoint(tmp_path / "small.ckpt", vocab_size=5)
    with pytest.raises(
        CheckpointError, match=r"the tokenizer \(char, \d+ tokens\) has more tokens than the model"
    ):
        open_run(small, device="cpu", data_dir=world["data"])
    with pytest.raises(CheckpointError, match="has more tokens than the model's vocabulary"):
        tokenizer_for_run(RunRecord(tokenizer={"name": "gpt2"}), None, tmp_path / "x.ckpt", model_vocab=100)


def test_the_data_folder_is_the_recorded_one_or_the_one_given(world, tmp_path, write_checkpoint):
    run = open_run(world["alpha"], device="cpu")
    assert run.data_folder(None, "evaluate") == (str(world["data"]), load_meta(world["data"]))
    bare = open_run(write_checkpoint(tmp_path / "bare.ckpt", vocab_size=64), device="cpu", tokenizer=False)
    with pytest.raises(
        DataError, match=rf"checkpoint {bare.path} does not name its data folder: pass --data-dir"
    ):
        bare.data_folder(None, "evaluate")


# --- the commands give what the checkpoint's own tensors give ---------------------------------------------------


def test_sample_generates_what_the_checkpoint_generates(world, capsys, caplog):
    from gptmini.data.reader import load_tokenizer
    from gptmini.inference.sample import main

    with caplog.at_level(logging.INFO):
        argv = ["--ckpt", str(world["alpha"]), "--prompt", "but", "--max-new-tokens", "12", "--device", "cpu"]
        assert main([*argv, "--seed", "7"]) == 0
    assert f"loaded {world['alpha']}" in caplog.text
    tokenizer = load_tokenizer(world["data"])
    model = by_hand(world["alpha"])
    gen = torch.Generator().manual_seed(7)
    ids = model.generate(torch.tensor([tokenizer.encode("but")]), 12, 0.8, 200, None, generator=gen)
    assert capsys.readouterr().out == tokenizer.decode(ids[0].tolist()) + "\n"


def test_eval_gives_the_loss_of_the_checkpoints_tensors(world, tmp_path):
    from gptmini.inference.evaluate import main

    out = tmp_path / "eval.json"
    assert (
        main(["--ckpt", "alpha", "--out", str(out), "--device", "cpu"]) == 2
    )  # run names live under outputs/
    cwd = Path.cwd()
    os.chdir(world["root"])
    try:
        assert main(["--ckpt", "alpha", "--out", str(out), "--device", "cpu"]) == 0
    finally:
        os.chdir(cwd)
    result = json.loads(out.read_text())
    assert result["checkpoint"] == str(Path("outputs") / world["alpha"].relative_to(world["outputs"]))
    tokens = load_split(world["data"], "val")
    context = 8
    last = len(tokens) - context - 1
    starts = sorted(set(range(0, last + 1, context)) | {last})
    x = torch.from_numpy(np.stack([tokens[s : s + context] for s in starts]).astype(np.int64))
    y = torch.from_numpy(np.stack([tokens[s + 1 : s + context + 1] for s in starts]).astype(np.int64))
    with torch.no_grad():
        logits, _ = by_hand(world["alpha"])(x)
    want = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1)).item()
    assert result["tokens"] == y.numel()
    assert abs(result["loss"] - want) < 1e-5


def test_the_attention_tab_opens_the_checkpoint_as_the_commands_do(world):
    pytest.importorskip("tensorboard")
    from gptmini.board.plugin import open_checkpoint

    model, tokenizer, step = open_checkpoint(world["beta"])
    assert step == 5 and tokenizer.name == "char"
    ids = torch.tensor([tokenizer.encode("what li")])
    with torch.no_grad():
        torch.testing.assert_close(model.attention_maps(ids), by_hand(world["beta"]).attention_maps(ids))


# --- resuming and init_from find checkpoints by the same rule ------------------------------------------------


def test_training_resolves_ckpt_path_and_init_from_by_the_same_rule(world, tmp_path):
    from gptmini.training.errors import RunError
    from gptmini.training.run.resume import resolve_ckpt_path, resolve_init_from

    def cfg(ckpt_path: str) -> Any:
        return ckpt_path, tmp_path / "fresh", world["outputs"], "alpha"

    assert resolve_ckpt_path(*cfg("last")) == str(world["alpha"])  # the run_name's newest
    assert resolve_ckpt_path(*cfg("beta")) == str(world["beta"])  # a run name
    assert resolve_ckpt_path(*cfg(str(world["alpha_old"].parent.parent))) == str(world["alpha_old"])
    with pytest.raises(RunError, match=r"^ckpt_path=gamma does not exist: .*\(its runs: alpha, beta\)"):
        resolve_ckpt_path(*cfg("gamma"))
    assert resolve_init_from("beta", world["outputs"]) == ("checkpoint", str(world["beta"]))
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    assert resolve_init_from(str(tmp_path / "hf"), world["outputs"]) == ("hf", str(tmp_path / "hf"))
    with pytest.raises(
        RunError, match=r"^model\.init_from=gamma does not exist: .*Hugging Face GPT-2, Llama or Qwen3"
    ):
        resolve_init_from("gamma", world["outputs"])
    assert load_checkpoint(resolve_init_from("alpha", world["outputs"])[1])["global_step"] == 9
