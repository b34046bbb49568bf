"""A resumed run follows the plan of its own command, through the real ``gptmini train``: a finished or interrupted
run extended with a larger ``trainer.max_steps`` or ``trainer.max_time`` trains the new steps on the new schedule
(learning rate above 0, val/loss moving) and a spent time budget is refused in one line; an EMA run resumes from
its trained weights with or without ``callbacks.ema``; ``trainer.deterministic=true`` makes same-seed runs
bit-identical whatever the machine's load."""

from __future__ import annotations

import logging
import re
import subprocess
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch


class OptimizerProbe(L.Callback):
    """Test-only callback: the optimizer's state dict as the first resumed step will use it (``on_train_start``:
    after Lightning restored the checkpoint's optimizer and schedule), saved to ``out``."""

    def __init__(self, out: str) -> None:
        self.out = out

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        torch.save(trainer.optimizers[0].state_dict(), self.out)


EMA = "callbacks.ema={_target_:gptmini.training.loop.ema.EMAWeightAveraging,decay:0.8}"
LR = "lr-MuonAdamW/hidden"


def output(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout + proc.stderr


def finished(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, output(proc)[-3000:]
    return proc


def sigterm(step: int) -> str:
    """test_reliability's fault injector (on the subprocess's PYTHONPATH): SIGTERM at the start of ``step``."""
    return f"+callbacks.fault={{_target_:test_reliability.FaultInjector,action:sigterm,step:{step},where:batch_start}}"


@pytest.fixture
def train(run_cli: Any, gptmini_train: Any, char_data_root: Path, tmp_path: Path) -> Any:
    """``train(run_name, *overrides, process=False, env=None)``: ``gptmini train debug=smoke`` on characters under
    ``tmp_path/out``, in this process (``gptmini_train``) or, with ``process=True``, as a process of its own."""

    def _train(
        name: str, *overrides: str, process: bool = False, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess:
        base = ["debug=smoke", "tokenizer=char", f"run_name={name}"]
        paths = [f"paths.output_root={tmp_path / 'out'}", f"paths.data_root={char_data_root}"]
        args = [*base, *paths, *overrides]
        return run_cli.train(args, env=env) if process else gptmini_train(args)

    return _train


def run_folders(root: Path, name: str) -> list[Path]:
    return sorted(p for p in (root / name).iterdir() if p.is_dir())


def ckpt_of(folder: Path, name: str = "last.ckpt") -> dict[str, Any]:
    return torch.load(folder / "checkpoints" / name, weights_only=True, map_location="cpu")


def scalars(events: Any, tag: str) -> dict[int, float]:
    return {e.step: e.value for e in events.Scalars(tag)}


def history(run_dir: Path, tag: str) -> dict[int, float]:
    """A run's ``tag`` as its scalars.csv holds it: a continuation's, the run it continued up to its step, then its
    own."""
    import csv

    with (run_dir / "scalars.csv").open() as f:
        return {int(row["step"]): float(row[tag]) for row in csv.DictReader(f) if row[tag]}


def test_a_finished_run_extended_trains_its_new_steps(train, tmp_path) -> None:
    """6 steps of WSD decayed to 0; resumed with trainer.max_steps=12, the stable phase runs on and the decay
    moves to step 12: every new step has a learning rate above 0, and val/loss moves. The continuation logs each
    step where an uninterrupted run would (train/loss from its first step on), in the epoch after the first run's."""
    finished(train("ext"))
    (first,) = run_folders(tmp_path / "out", "ext")
    assert ckpt_of(first)["global_step"] == 6
    resumed = finished(train("ext", f"ckpt_path={first}", "trainer.max_steps=12"))
    assert (
        "the learning-rate schedule follows this run's settings from step 6 on (decay_start 4 -> 8, "
        "max_steps 6 -> 12)" in output(resumed)
    )
    second = run_folders(tmp_path / "out", "ext")[-1]
    assert ckpt_of(second)["global_step"] == 12
    lr = history(second, LR)
    new = [v for k, v in sorted(lr.items()) if k >= 6]  # Lightning logs step k's rate at k - 1
    assert len(new) == 6 and all(v > 0.0 for v in new), lr
    assert new[0] == new[1] == max(lr.values())  # the stable phase, at the base rate
    val = history(second, "val/loss")
    assert val[12] < val[6], val
    loss, epoch = history(second, "train/loss"), history(second, "epoch")
    assert sorted(loss) == list(range(12)), loss  # Lightning logs step k's loss at k - 1
    assert [epoch[k] for k in range(12)] == [0.0] * 6 + [1.0] * 6, epoch


def test_an_interrupted_run_extended_trains_past_its_old_end(train, tmp_path) -> None:
    """A run of 8 steps stopped by SIGTERM after step 4, resumed with trainer.max_steps=16: the steps past 8,
    where the old schedule had reached 0, train at a rate above 0, and val/loss moves."""
    first_run = train("cut", "trainer.max_steps=8", sigterm(3), process=True)
    assert first_run.returncode == 143, output(first_run)[-3000:]
    (first,) = run_folders(tmp_path / "out", "cut")
    assert ckpt_of(first, "on_exception.ckpt")["global_step"] == 4
    finished(train("cut", "ckpt_path=last", "trainer.max_steps=16", "trainer.val_check_interval=4"))
    second = run_folders(tmp_path / "out", "cut")[-1]
    lr = history(second, LR)
    new = [v for k, v in sorted(lr.items()) if k >= 4]
    assert len(new) == 12 and all(v > 0.0 for v in new), lr
    val = history(second, "val/loss")
    assert val[16] < val[8], val


def test_a_spent_time_budget_is_refused_and_a_larger_one_trains_on(train, tmp_path, tb_events) -> None:
    finished(train("timed", "trainer.max_steps=100000", "trainer.max_time=00:00:00:01"))
    (first,) = run_folders(tmp_path / "out", "timed")
    step = ckpt_of(first)["global_step"]
    assert 0 < step < 100000
    again = train("timed", f"ckpt_path={first}", "trainer.max_steps=100000", "trainer.max_time=00:00:00:01")
    text = output(again)
    assert again.returncode == 2, text[-3000:]
    assert re.search(
        r"error: checkpoint \S+last\.ckpt has already trained for \d+ s and trainer\.max_time=00:00:00:01 "
        r"allows 1 s: the run is finished and resuming would train nothing\. To train on, resume with a larger "
        r"trainer\.max_time",
        text,
    ), text[-3000:]
    assert "Traceback" not in text and len(re.findall(r"\berror: ", text)) == 1
    assert len(run_folders(tmp_path / "out", "timed")) == 1  # nothing left of the refused run
    finished(
        train("timed", f"ckpt_path={first}", f"trainer.max_steps={step + 3}", "trainer.max_time=00:00:30:00")
    )
    second = run_folders(tmp_path / "out", "timed")[-1]
    assert ckpt_of(second)["global_step"] == step + 3
    lr = scalars(tb_events(second), LR)
    new = [v for k, v in sorted(lr.items()) if k >= step]
    assert len(new) == 3 and all(v > 0.0 for v in new), lr


def test_an_ema_run_resumes_from_its_trained_weights_with_or_without_ema(train, tmp_path, caplog) -> None:
    """An EMA run's final checkpoint keeps the trained weights apart from the average. Resumed without
    callbacks.ema (said in one line) or with it, training continues from the trained weights: both end with the
    weights of a run never averaged nor interrupted (a constant rate: the schedule's length changes nothing);
    sampling uses the average and says so."""
    from gptmini.cli import main as gptmini

    constant = ["scheduler=constant", "trainer.val_check_interval=2"]
    finished(train("ema", *constant, "trainer.max_steps=4", EMA))
    (first,) = run_folders(tmp_path / "out", "ema")
    saved = ckpt_of(first)
    assert saved["global_step"] == 4
    key = "model.wte.weight"
    assert not torch.equal(saved["state_dict"][key], saved["current_model_state"][key])
    without = finished(train("ema", *constant, f"ckpt_path={first}", "trainer.max_steps=6"))
    assert "was trained with callbacks.ema and this run has none: it continues from the trained weights" in (
        output(without)
    )
    without_dir = run_folders(tmp_path / "out", "ema")[-1]
    finished(train("ema", *constant, f"ckpt_path={first}", "trainer.max_steps=6", EMA))
    with_dir = run_folders(tmp_path / "out", "ema")[-1]
    finished(train("plain", *constant, "trainer.max_steps=6"))
    (plain_dir,) = run_folders(tmp_path / "out", "plain")
    plain = ckpt_of(plain_dir)["state_dict"]
    for name, want in plain.items():
        torch.testing.assert_close(ckpt_of(without_dir)["state_dict"][name], want, rtol=0, atol=0, msg=name)
        torch.testing.assert_close(
            ckpt_of(with_dir)["current_model_state"][name], want, rtol=0, atol=0, msg=name
        )
    assert not torch.equal(ckpt_of(with_dir)["state_dict"][key], plain[key])  # the average, apart
    assert "current_model_state" not in ckpt_of(without_dir)
    with caplog.at_level(logging.INFO):
        assert gptmini(["sample", "--ckpt", str(first), "--max-new-tokens", "2"]) == 0
    assert "holds an average of the weights (callbacks.ema) beside the trained ones: using the average" in (
        caplog.text
    )


def test_a_deterministic_run_is_bit_identical_whatever_the_load(train, tmp_path) -> None:
    """docs/training.md's promise: with trainer.deterministic=true, two runs of the same seed on one machine end
    with the same weights to the last bit, on two threads each, whatever other programs run meanwhile."""
    runs, threads = [], torch.get_num_threads()
    torch.set_num_threads(2)  # a test worker keeps one thread; the runs start as a command on two would
    try:
        for name in ("det_a", "det_b"):
            proc = finished(train(name, "trainer.deterministic=true"))
            assert "trainer.deterministic: torch keeps 2 threads whatever other programs use" in output(proc)
            (folder,) = run_folders(tmp_path / "out", name)
            runs.append(ckpt_of(folder)["state_dict"])
    finally:
        torch.set_num_threads(threads)
    for name, want in runs[0].items():
        torch.testing.assert_close(runs[1][name], want, rtol=0, atol=0, msg=name)


def probe(out: Path) -> str:
    return f"+callbacks.probe={{_target_:test_resume_plan.OptimizerProbe,out:{out}}}"


def test_a_resume_trains_under_its_new_optimizer_settings_with_the_checkpoint_s_buffers(
    train, tmp_path, tb_events
) -> None:
    """Resumed with another lr, weight decay and momentum (Muon's hidden matrices), embedding lr and AdamW betas:
    the optimizer holds the new settings from the first resumed step, with the momentum and Adam moments of the
    checkpoint, bit for bit; the log names each change, and the learning rates logged are the new ones."""
    constant = ["scheduler=constant"]
    finished(train("opt", *constant))
    (first,) = run_folders(tmp_path / "out", "opt")
    saved = ckpt_of(first)["optimizer_states"][0]
    changed = [
        "optimizer.hidden.lr=0.002",
        "optimizer.hidden.weight_decay=0.01",
        "optimizer.hidden.momentum=0.9",
        "optimizer.embedding.lr=0.001",
        "optimizer.adamw.betas=[0.8,0.9]",
    ]
    out = tmp_path / "optimizer_at_first_resumed_step.pt"
    resumed = finished(
        train("opt", *constant, f"ckpt_path={first}", "trainer.max_steps=8", *changed, probe(out))
    )
    assert (
        "with this run's settings from its first step: optimizer.hidden.lr 0.02 -> 0.002, "
        "optimizer.hidden.weight_decay 0.0 -> 0.01, optimizer.hidden.momentum 0.95 -> 0.9, "
        "optimizer.adamw.betas [0.9, 0.99] -> [0.8, 0.9], optimizer.embedding.lr 0.003 -> 0.001, "
        "trainer.max_steps 6 -> 8" in output(resumed)
    ), output(resumed)[-3000:]
    state = torch.load(out, weights_only=True)
    groups = {g["name"]: g for inner in state.values() for g in inner["param_groups"]}
    assert (groups["hidden"]["lr"], groups["hidden"]["weight_decay"], groups["hidden"]["momentum"]) == (
        0.002,
        0.01,
        0.9,
    )
    assert groups["embedding"]["lr"] == 0.001 and groups["embedding"]["betas"] == (0.8, 0.9)
    assert groups["vector"]["lr"] == 0.003 and groups["vector"]["betas"] == (0.8, 0.9)  # the shared betas
    for inner in ("muon", "adamw"):  # the buffers: the checkpoint's own
        assert state[inner]["state"].keys() == saved[inner]["state"].keys()
        for index, buffers in saved[inner]["state"].items():
            assert buffers.keys() == state[inner]["state"][index].keys()
            for name, want in buffers.items():
                torch.testing.assert_close(state[inner]["state"][index][name], want, rtol=0, atol=0)
    lr = scalars(tb_events(run_folders(tmp_path / "out", "opt")[-1]), LR)
    assert [v for k, v in sorted(lr.items()) if k >= 6] == pytest.approx([0.002, 0.002]), lr


@pytest.fixture(scope="module")
def fixed_run(tmp_path_factory: pytest.TempPathFactory, train_in_process: Any, char_data_root: Path) -> Path:
    """A finished run of 2 steps (debug=smoke on characters) in ``<root>/out/fixed/``, trained once for the
    refused resumes below (each must leave it alone)."""
    out = tmp_path_factory.mktemp("fixed") / "out"
    first = out / "fixed" / "first"
    overrides = ["debug=smoke", "tokenizer=char", "run_name=fixed", "trainer.max_steps=2"]
    train_in_process([*overrides, f"paths.output_root={out}", f"paths.data_root={char_data_root}"], first)
    assert ckpt_of(first)["global_step"] == 2
    return first


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (
            "model.n_layer=3",
            "was trained with another model shape (model.n_layer: checkpoint 2 vs now 3): its weights are another model's",
        ),
        (
            "tokenizer=gpt2",
            "was trained with another tokenizer (tokenizer.name: checkpoint char vs now gpt2): its token ids would "
            "mean other text",
        ),
    ],
    ids=["shape", "tokenizer"],
)
def test_a_change_the_checkpoint_cannot_honour_is_refused_before_any_work(
    fixed_run, gptmini_train, char_data_root, change, says
) -> None:
    """Another model shape or tokenizer: one error line, exit 2, before the data is prepared (no data folder of
    the other tokenizer) and with no run folder left."""
    first, out = fixed_run, fixed_run.parent.parent
    data_before = sorted(p.name for p in char_data_root.iterdir())
    refused = gptmini_train(
        [
            "debug=smoke",
            "tokenizer=char",
            "run_name=fixed",
            f"paths.output_root={out}",
            f"paths.data_root={char_data_root}",
            f"ckpt_path={first}",
            "trainer.max_steps=4",
            change,
        ]
    )
    text = output(refused)
    assert refused.returncode == 2, text[-3000:]
    assert f"error: checkpoint {first / 'checkpoints' / 'last.ckpt'} {says}" in text, text[-3000:]
    assert "Traceback" not in text and len(re.findall(r"\berror: ", text)) == 1
    assert "data prepared" not in text
    assert sorted(p.name for p in char_data_root.iterdir()) == data_before
    assert run_folders(out, "fixed") == [first]


def test_the_hint_of_an_interrupted_run_typed_as_printed_resumes_that_run(
    train, tmp_path, cli_env, repo_root, gptmini_cli, gptmini_train
) -> None:
    """A run of trainer.max_steps=8 stopped by SIGTERM after step 4 prints the command that resumes it. Typed as
    printed (the arguments a shell makes of it), after a newer run of the same name finished, it resumes the
    interrupted run, with its own settings: to step 8, not the 6 of debug=smoke, and not from the newer run.
    `gptmini runs` then shows the interrupted run as resumed, not resumable."""
    cut = train("hint", "trainer.max_steps=8", sigterm(3), process=True)
    assert cut.returncode == 143, output(cut)[-3000:]
    (first,) = run_folders(tmp_path / "out", "hint")
    found = re.search(r"resume with: (gptmini train .*)$", output(cut), re.MULTILINE)
    assert found, output(cut)[-3000:]
    finished(train("hint", "trainer.max_steps=2"))  # newer, of the same run_name
    # the shell parses the line (quotes, escapes, expansions) and hands `gptmini` its arguments: a shell
    # function in its place prints them, and the command runs on them in this process (test_cli.py runs
    # `gptmini train` as a process)
    typed = subprocess.run(
        ["sh", "-c", 'gptmini() { printf "%s\\0" "$@"; }; ' + found.group(1)],
        cwd=repo_root,
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    argv = typed.stdout.split("\0")[:-1]
    assert argv[0] == "train", argv
    resumed = finished(gptmini_train(argv[1:]))
    assert f"resuming from {first / 'checkpoints' / 'on_exception.ckpt'}" in output(resumed)
    third = run_folders(tmp_path / "out", "hint")[-1]
    assert ckpt_of(third)["global_step"] == 8
    listed = gptmini_cli(["runs", "--runs-dir", tmp_path / "out"])
    assert listed.returncode == 0, output(listed)
    rows = {
        folder.name: line
        for folder in run_folders(tmp_path / "out", "hint")
        for line in listed.stdout.splitlines()
        if str(folder) in line
    }
    assert " resumed " in rows[first.name] and " resumable " not in rows[first.name], listed.stdout
    # the continuation says what it continued: the interrupted run's checkpoint, at its step
    assert f" finished, continues hint/{first.name}@4 " in rows[third.name], listed.stdout
