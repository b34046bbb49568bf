"""``gptmini eval --tasks``: lm-evaluation-harness tasks on a checkpoint, offline, on the three small tasks of
tests/lm_eval_tasks (multiple choice, rolling perplexity, generation). The wrapper agrees with the harness's own
``hf`` model on the Hugging Face export of the same checkpoint (GPT-2's BPE); a char run and a trained-BPE run
agree with the model's own losses."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval")

REPO = Path(__file__).resolve().parents[3]
TASKS = REPO / "tests" / "lm_eval_tasks"
CHOICE, ROLLING, GEN = "gptmini_tiny_choice", "gptmini_tiny_rolling", "gptmini_tiny_gen"


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    """Nothing tries the network; the datasets cache of the task files in the test's folder (these settings are
    read when `datasets` and `huggingface_hub` are first imported)."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    # the harness's report of the machine in its results (torch's collect_env: subprocesses, seconds per call),
    # which gptmini's results leave out
    monkeypatch.setattr("lm_eval.evaluator.add_env_info", lambda results: None)


def _gpt2_run(run_dir: Path, block_size: int) -> Path:
    """A run folder as training leaves it: a GPT-2-tokenizer checkpoint at step 7 and a TensorBoard run."""
    from torch.utils.tensorboard import SummaryWriter

    from gptmini.model import GPT, GPTConfig
    from gptmini.runs.checkpoint import atomic_save

    config = GPTConfig(vocab_size=50257, block_size=block_size, n_layer=2, n_head=2, n_embd=16, dropout=0.0)
    torch.manual_seed(0)
    state = {f"model.{k}": v for k, v in GPT(config).state_dict().items()}
    hyper = {"model_config": config.to_dict(), "run_config": {"tokenizer": {"name": "gpt2"}}}
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    atomic_save({"state_dict": state, "hyper_parameters": hyper, "global_step": 7}, ckpt)
    with SummaryWriter(str(run_dir / "tb" / "version_0")) as writer:
        writer.add_scalar("train/loss", 10.0, 7)
    return ckpt


def _samples(evaluated: dict, task: str) -> list:
    """Each document's responses, in document order."""
    return [s["resps"] for s in sorted(evaluated["samples"][task], key=lambda s: s["doc_id"])]


def test_tasks_agree_with_the_harness_hf_model_on_the_export(tmp_path, gptmini_cli, tb_events, monkeypatch):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from gptmini.inference.benchmark_tasks import GptminiLM
    from gptmini.runs.loading import open_run

    # a context of 8 tokens: the choices' contexts lose their oldest tokens, the texts take several windows, and a
    # generation keeps 2 tokens of its question
    ckpt = _gpt2_run(tmp_path / "run", block_size=8)
    hf = tmp_path / "hf"
    assert gptmini_cli(["export", "--ckpt", ckpt, "--out", hf, "--tokenizer", "gpt2"]).returncode == 0

    first = gptmini_cli(
        ["eval", "--ckpt", tmp_path / "run", "--tasks", f"{CHOICE},{ROLLING}", "--include-path", TASKS,
         "--batch-size", "3"],
        cwd=REPO,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr
    assert "|gptmini_tiny_choice |" in first.stdout and "acc_norm" in first.stdout  # the harness's table
    # a second call with another task: the file keeps the first call's results
    second = gptmini_cli(
        ["eval", "--ckpt", ckpt, "--tasks", GEN, "--include-path", TASKS, "--batch-size", "3"], cwd=REPO
    )
    assert second.returncode == 0, second.stderr
    record = json.loads((tmp_path / "run" / "eval_tasks_step7.json").read_text())
    assert record["step"] == 7 and set(record["results"]) == {CHOICE, ROLLING, GEN}

    monkeypatch.chdir(REPO)  # the tasks' data_files are relative to the working directory
    manager = TaskManager(include_path=str(TASKS), include_defaults=False)
    tasks = [CHOICE, ROLLING, GEN]
    reference = simple_evaluate(
        model="hf",
        model_args={"pretrained": str(hf), "device": "cpu", "dtype": "float32"},
        tasks=tasks,
        task_manager=manager,
        batch_size=3,
    )
    mine = simple_evaluate(
        model=GptminiLM(open_run(ckpt, "cpu"), batch_size=3), tasks=tasks, task_manager=manager, batch_size=3
    )
    for task in tasks:
        want = {k: v for k, v in reference["results"][task].items() if isinstance(v, float)}
        assert want, task
        for results in (mine["results"][task], record["results"][task]):
            torch.testing.assert_close({k: results[k] for k in want}, want, rtol=1e-5, atol=1e-6)
    # document by document: each choice's log-likelihood and greedy flag, each text's, each generated answer
    for task in (CHOICE, ROLLING):
        for got, want in zip(_samples(mine, task), _samples(reference, task), strict=True):
            torch.testing.assert_close(
                [float(r[0][0] if task == CHOICE else r[0]) for r in got],
                [float(r[0][0] if task == CHOICE else r[0]) for r in want],
                rtol=1e-5,
                atol=1e-4,
            )
            if task == CHOICE:
                assert [r[0][1] for r in got] == [r[0][1] for r in want]
    assert _samples(mine, GEN) == _samples(reference, GEN)
    assert any(r[0][0] for r in _samples(mine, GEN))  # something was generated

    events = tb_events(tmp_path / "run")
    acc = events.Scalars(f"eval/{CHOICE}/acc")
    assert [(e.step, e.value) for e in acc] == [(7, pytest.approx(record["results"][CHOICE]["acc,none"]))]
    assert events.Scalars(f"eval/{GEN}/exact_match")[0].step == 7
    assert f"eval/{CHOICE}/acc_stderr" not in events.Tags()["scalars"]


def _oracle(model, tokenizer, block: int) -> tuple[float, float]:
    """bits per byte of the rolling task and accuracy of the choice task, from the model's own losses: each text
    after the end-of-text token (a newline for a char vocabulary), ``block`` tokens at a time, each after as many
    tokens as the context holds; each choice (the ids of context + choice past the context's own) after its
    context's last tokens."""
    start = tokenizer.eot_id if tokenizer.eot_id is not None else tokenizer.encode("\n")[0]
    nats, nbytes = 0.0, 0
    for line in (TASKS / "rolling.jsonl").read_text().splitlines():
        text = json.loads(line)["text"]
        seq = torch.tensor([start, *tokenizer.encode(text)])  # seq[i + 1] is the text's token i
        for first in range(0, len(seq) - 1, block):  # the text's tokens [first, end) scored together
            end = min(first + block, len(seq) - 1)
            x, y = seq[max(0, end - block) : end], seq[max(0, end - block) + 1 : end + 1]  # a full context
            nats += float(model.token_losses(x[None], y[None])[0, first - end :].sum())
        nbytes += len(text.encode())
    right = []
    for line in (TASKS / "choice.jsonl").read_text().splitlines():
        doc = json.loads(line)
        scores = []
        for choice in doc["choices"]:
            whole = tokenizer.encode(doc["context"] + " " + choice)
            cont = whole[len(tokenizer.encode(doc["context"])) :]
            seq = torch.tensor(whole[-(block + 1) :])
            losses = model.token_losses(seq[None, :-1], seq[None, 1:])[0]
            scores.append(-float(losses[-len(cont) :].sum()))
        right.append(max(range(len(scores)), key=scores.__getitem__) == doc["label"])
    return nats / math.log(2) / nbytes, sum(right) / len(right)


def _own_vocabulary_checkpoint(tmp_path: Path, write_checkpoint, tokenizer: str, block_size: int) -> Path:
    """A checkpoint at step 3 whose vocabulary (``char``, or a ``bpe`` of 300 tokens) was made from the tasks'
    own texts, so that nothing is left out of the texts scored."""
    from gptmini.data.prepare import prepare

    corpus = tmp_path / "corpus.txt"
    texts = [
        json.dumps(json.loads(line)) for f in TASKS.glob("*.jsonl") for line in f.read_text().splitlines()
    ]
    corpus.write_text(("\n".join([*texts, "Question: Answer:"]) + "\n") * 20)  # and the generation's prompt
    options = {"vocab_size": 300} if tokenizer == "bpe" else None
    data = prepare(str(corpus), tokenizer, tmp_path / "data", tokenizer_options=options).out_dir
    return write_checkpoint(
        tmp_path / f"{tokenizer}.ckpt", data_dir=data, block_size=block_size, n_embd=16, global_step=3
    )


@pytest.mark.parametrize("tokenizer", ["char", "bpe"])
def test_a_run_is_scored_with_its_own_vocabulary(tmp_path, gptmini_cli, write_checkpoint, tokenizer):
    from gptmini.runs.loading import open_run

    ckpt = _own_vocabulary_checkpoint(tmp_path, write_checkpoint, tokenizer, block_size=16)
    result = gptmini_cli(
        ["eval", "--ckpt", ckpt, "--tasks", f"{ROLLING},{CHOICE},{GEN}", "--include-path", TASKS], cwd=REPO
    )
    assert result.returncode == 0, result.stderr
    assert "left out" not in result.stderr
    results = json.loads((tmp_path / "eval_tasks_step3.json").read_text())["results"]
    run = open_run(ckpt, "cpu")
    assert run.tokenizer.name == tokenizer
    bpb, acc = _oracle(run.model, run.tokenizer, block=16)
    torch.testing.assert_close(results[ROLLING]["bits_per_byte,none"], bpb, rtol=1e-5, atol=0)
    assert results[CHOICE]["acc,none"] == pytest.approx(acc)
    assert results[GEN]["exact_match,none"] == 0.0
    assert "no TensorBoard run beside" in result.stderr  # a loose checkpoint: the JSON file alone


def test_an_answer_longer_than_the_context_is_one_error_line(tmp_path, gptmini_cli, write_checkpoint):
    ckpt = _own_vocabulary_checkpoint(
        tmp_path, write_checkpoint, "char", block_size=8
    )  # " made of glass": 14
    result = gptmini_cli(["eval", "--ckpt", ckpt, "--tasks", CHOICE, "--include-path", TASKS], cwd=REPO)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: a task's answer of 14 tokens is longer than the model's context (8 tokens): it cannot be scored"
    ]
    assert not (tmp_path / "eval_tasks_step3.json").exists()


def test_an_existing_file_that_is_no_result_is_never_written_over(tmp_path, gptmini_cli):
    ckpt = _gpt2_run(tmp_path / "run", block_size=8)
    out = tmp_path / "notes.json"
    out.write_text('["mine"]\n')
    result = gptmini_cli(
        ["eval", "--ckpt", ckpt, "--tasks", CHOICE, "--include-path", TASKS, "--out", out], cwd=REPO
    )
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: --out {out} exists and is not a result of `gptmini eval --tasks`: name another file"
    ]
    assert out.read_text() == '["mine"]\n'
    assert "evaluating" not in result.stderr

    # nor the results of another checkpoint
    other = {"checkpoint": str(tmp_path / "other.ckpt"), "step": 7, "results": {CHOICE: {"acc,none": 1.0}}}
    out.write_text(json.dumps(other))
    result = gptmini_cli(
        ["eval", "--ckpt", ckpt, "--tasks", CHOICE, "--include-path", TASKS, "--out", out], cwd=REPO
    )
    assert result.returncode == 2
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == [
        f"error: --out {out} holds the results of another checkpoint ({tmp_path / 'other.ckpt'}, step 7): name "
        "another file with --out"
    ]
    assert json.loads(out.read_text()) == other


def test_without_the_harness_tasks_is_one_error_line(tmp_path, gptmini_cli, monkeypatch, write_checkpoint):
    ckpt = write_checkpoint(tmp_path / "last.ckpt")
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # not installed
    monkeypatch.delitem(sys.modules, "gptmini.inference.benchmark_tasks", raising=False)
    result = gptmini_cli(["eval", "--ckpt", ckpt, "--tasks", "hellaswag"])
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "error: --tasks needs EleutherAI's lm-evaluation-harness (lm_eval is not installed): "
        "pip install 'gptmini[eval]'"
    ]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--tasks", "hellaswag", "--context", "64"], "--tasks evaluates one --ckpt, without --context"),
        (["--limit", "5"], "--num-fewshot, --limit and --include-path apply with --tasks"),
        (["--tasks", ","], "--tasks ',' names no task"),
    ],
)
def test_task_options_out_of_place_are_usage_errors(gptmini_cli, args, message):
    result = gptmini_cli(["eval", *args])
    assert result.returncode == 2
    assert message in result.stderr


@pytest.mark.slow  # indexes the harness's own tasks (about 14,000 YAML files): 10 to 30 seconds
def test_an_unknown_task_is_one_error_line_naming_close_matches(tmp_path, gptmini_cli, write_checkpoint):
    ckpt = write_checkpoint(tmp_path / "last.ckpt")
    result = gptmini_cli(
        ["eval", "--ckpt", ckpt, "--tasks", "helaswag,gptmini_tiny_choise", "--include-path", TASKS]
    )
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1
    assert errors[0].startswith("error: --tasks: unknown task 'helaswag' (close matches: hellaswag")
    assert "loaded" not in result.stderr  # before the checkpoint is read
    assert list(tmp_path.iterdir()) == [ckpt]


def test_each_metric_is_one_scalar_named_by_its_task_metric_and_filter():
    from gptmini.inference.benchmark_tasks import metric_scalars

    results = {
        "gsm8k": {
            "alias": "gsm8k",
            "exact_match,strict-match": 0.25,
            "exact_match_stderr,strict-match": 0.01,
            "exact_match,flexible-extract": 0.5,
        },
        "wikitext": {"word_perplexity,none": 40.5, "word_perplexity_stderr,none": "N/A", "sample_len": 62},
    }
    assert metric_scalars(results) == {
        "eval/gsm8k/exact_match_strict-match": 0.25,
        "eval/gsm8k/exact_match_flexible-extract": 0.5,
        "eval/wikitext/word_perplexity": 40.5,
    }


@pytest.mark.slow  # indexes the harness's own tasks (about 14,000 YAML files): 10 to 30 seconds
def test_a_task_whose_data_cannot_be_fetched_is_one_error_line(tmp_path, gptmini_cli):
    """Offline, a harness task whose data is not in the datasets cache: one line naming the task, the cache it
    looked in and the way to run offline; no traceback, nothing written."""
    ckpt = _gpt2_run(tmp_path / "run", block_size=8)
    result = gptmini_cli(["eval", "--ckpt", ckpt, "--tasks", "hellaswag"])
    import datasets

    assert result.returncode == 2
    assert result.stderr.splitlines() == [  # the cache set when `datasets` was first imported (the fixture's)
        f"error: --tasks hellaswag: its data is not in the datasets cache ({datasets.config.HF_DATASETS_CACHE}) "
        "and cannot be "
        "fetched (Couldn't reach 'Rowan/hellaswag' on the Hub (OfflineModeIsEnabled)): run it once with network "
        "access (HF_DATASETS_OFFLINE=1 then keeps later runs offline), or evaluate a task of your own offline "
        "with --include-path"
    ]
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["checkpoints", "tb"]


def test_the_offline_tasks_run_from_the_repository_root_as_documented(tmp_path, gptmini_cli):
    """docs/export-import.md's line for the three tasks of tests/lm_eval_tasks, as typed (`--ckpt last`), in a
    checkout with one run under outputs/."""
    import shlex
    import shutil

    docs = (REPO / "docs" / "export-import.md").read_text(encoding="utf-8")
    line = next(line for line in docs.splitlines() if "--include-path tests/lm_eval_tasks" in line)
    shutil.copytree(TASKS, tmp_path / "tests" / "lm_eval_tasks")
    run = tmp_path / "outputs" / "2026-01-01_10-00-00"
    _gpt2_run(run, block_size=8)
    argv = shlex.split(line, comments=True)
    assert argv[:4] == ["gptmini", "eval", "--ckpt", "last"]
    result = gptmini_cli(argv[1:], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    written = json.loads((run / "eval_tasks_step7.json").read_text())
    assert sorted(written["results"]) == [CHOICE, GEN, ROLLING]
