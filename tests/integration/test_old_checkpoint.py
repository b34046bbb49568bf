"""Runs written by earlier versions still sample, evaluate, export and resume through the commands:
tests/fixtures/run_v0 (its checkpoint records the composed config, not the run record) and tests/fixtures/run_v1
(the first versioned record, the model's and the data's settings also kept apart, no lineage)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
VERSIONS = ("run_v0", "run_v1")
# the settings the fixtures were trained with (their README's command), which a resume must repeat
TRAINED_WITH = [
    "debug=smoke",
    "tokenizer=char",
    "data=text",
    "model.n_layer=1",
    "model.n_embd=16",
    "model.block_size=16",
]


@pytest.fixture(params=VERSIONS)
def old_run(request, tmp_path: Path) -> Path:
    """A copy of a fixture (the commands never touch the original), with its corpus beside the run folder."""
    shutil.copytree(FIXTURES / request.param, tmp_path, dirs_exist_ok=True)
    return tmp_path


def _fixture_model(old_run: Path) -> torch.nn.Module:
    """The fixture's model, built from its checkpoint's own tensors with torch alone."""
    from gptmini.model import GPT, GPTConfig

    ckpt = torch.load(old_run / "run/checkpoints/last.ckpt", map_location="cpu", weights_only=True)
    model = GPT(GPTConfig.from_dict(ckpt["hyper_parameters"]["model_config"]))
    model.load_state_dict({k.removeprefix("model."): v for k, v in ckpt["state_dict"].items()})
    return model.eval()


def test_an_old_checkpoint_samples(gptmini_cli, old_run) -> None:
    proc = gptmini_cli(
        ["sample", "--ckpt", "run/checkpoints/last.ckpt", "--prompt", "the ", "--max-new-tokens", "12"],
        cwd=old_run,
    )
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout.strip().splitlines()[-1]
    assert text.startswith("the ") and len(text) > len("the "), proc.stdout


def test_an_old_checkpoint_evaluates_as_its_own_weights_score(gptmini_cli, old_run) -> None:
    from gptmini.data.prepare import prepare
    from gptmini.data.reader import load_split

    prepare(str(old_run / "corpus.txt"), "char", old_run / "prepared")
    proc = gptmini_cli(["eval", "--ckpt", "run", "--data-dir", "prepared", "--out", "eval.json"], cwd=old_run)
    assert proc.returncode == 0, proc.stderr
    result = json.loads((old_run / "eval.json").read_text())
    # the oracle: the checkpoint's tensors on the same split, in windows at 0, 16, ... and one ending at the
    # last token
    tokens = torch.as_tensor(load_split(old_run / "prepared", "val").astype("int64"))
    block = 16
    starts = list(range(0, len(tokens) - block, block))
    if starts[-1] != len(tokens) - block - 1:
        starts.append(len(tokens) - block - 1)
    x = torch.stack([tokens[s : s + block] for s in starts])  # (W, T)
    y = torch.stack([tokens[s + 1 : s + block + 1] for s in starts])  # (W, T)
    with torch.no_grad():
        logits, _ = _fixture_model(old_run)(x, y)  # (W, T, V)
    expected = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
    assert result["tokens"] == y.numel()
    torch.testing.assert_close(torch.tensor(result["loss"]), expected, rtol=1e-4, atol=1e-5)


def test_an_old_checkpoint_exports_to_transformers(gptmini_cli, old_run) -> None:
    transformers = pytest.importorskip("transformers")
    proc = gptmini_cli(["export", "--ckpt", "run", "--out", "hf"], cwd=old_run)
    assert proc.returncode == 0, proc.stderr
    hf = transformers.GPT2LMHeadModel.from_pretrained(old_run / "hf").eval()
    idx = torch.tensor([[1, 5, 2, 7, 3, 3, 9, 4]])  # (1, T)
    with torch.no_grad():
        ours, _ = _fixture_model(old_run)(idx)  # (1, T, V)
        theirs = hf(idx).logits[..., : ours.shape[-1]]  # (1, T, V)
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-4)


def test_an_old_checkpoint_resumes(gptmini_train, old_run) -> None:
    ckpt = old_run / "run/checkpoints/last.ckpt"
    proc = gptmini_train(
        [
            *TRAINED_WITH,
            f"data.source={old_run / 'corpus.txt'}",
            f"paths.output_root={old_run / 'out'}",
            f"paths.data_root={old_run / 'data'}",
            f"ckpt_path={ckpt}",
            "trainer.max_steps=8",
        ]
    )
    assert proc.returncode == 0, proc.stderr
    (resumed,) = (old_run / "out").glob("*/*/checkpoints/last.ckpt")
    saved = torch.load(resumed, map_location="cpu", weights_only=True)
    assert saved["global_step"] == 8  # the old run's 6 steps and 2 more: it resumed, not restarted
    from gptmini.runs.record import Lineage, read_record

    assert read_record(saved).continued_from == Lineage(str(ckpt), 6)
