"""The config probe's rows through the training command's own entry point (``gptmini.training.run.app.main``, what
``gptmini train`` runs): each bad override ends with one ``error:`` line naming the key and the fix, the exit
status docs/reliability.md states (2, whether Hydra could not apply the override or the plan refused the
config), no traceback, before anything is built (no prepared data, no run folder left); the documented overrides train.

Most rows run in this process (the ``gptmini_train`` fixture: Hydra composing from scratch each time, the same code
path as the command, a second each); one runs as a real ``gptmini train`` process to hold the in-process route
to it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

# (overrides, the start of the error line after "error: ", exit status)
REFUSED = [
    # derived values: the plan passes them on from the setting they follow
    (
        ["data.tokenizer=gpt2"],
        r"data\.tokenizer=gpt2 is not a setting: the run derives it from tokenizer\.name; "
        r"set tokenizer=<name>",
        2,
    ),
    (
        ["+data.tokenizer=gpt2"],
        r"data\.tokenizer is not a setting: the run derives it from tokenizer\.name",
        2,
    ),
    (
        ["scheduler.max_steps=3"],
        r"scheduler\.max_steps=3 is not a setting: the run derives it from "
        r"trainer\.max_steps; set trainer\.max_steps=<steps> instead",
        2,
    ),
    (["+scheduler.max_steps=3"], r"scheduler\.max_steps is not a setting: .* set trainer\.max_steps=", 2),
    (["data.block_size=16"], r"data\.block_size=16 is not a setting: .* set model\.block_size=<tokens>", 2),
    (
        ["+data.block_size=16"],
        r"data\.block_size is not a setting: the run derives it from model\.block_size",
        2,
    ),
    (["+scheduler.max_time=00:00:01:00"], r"scheduler\.max_time is not a setting: .* trainer\.max_time=", 2),
    (
        ["+data.tokenizer_vocab_size=300"],
        r"data\.tokenizer_vocab_size is not a setting: .* tokenizer\.vocab_size=",
        2,
    ),
    # required groups and settings cannot be dropped
    (
        ["~model"],
        r"~model drops the model group, which every run needs: choose one of its options instead "
        r"\(model=<option>: baby, ",
        2,
    ),
    (["~tokenizer"], r"~tokenizer drops the tokenizer group, .* \(tokenizer=<option>: bpe, char, gpt2\)", 2),
    (["~optimizer"], r"~optimizer drops the optimizer group, .* \(optimizer=<option>: adamw, muon", 2),
    (["~scheduler"], r"~scheduler drops the scheduler group, .* \(scheduler=<option>: constant, ", 2),
    (["~trainer"], r"~trainer drops the trainer group, .* \(trainer=<option>: cpu, ", 2),
    (
        ["~optimizer.hidden"],
        r"optimizer\.hidden must be set: gptmini\.training\.loop\.optimizers\.MuonAdamW takes no "
        r"default for it \(dropped with ~optimizer\.hidden\?\)",
        2,
    ),
    # keys nothing reads
    (
        ["++tokenizer.foo=1"],
        r"tokenizer\.foo is not a setting of tokenizer: its settings are name, train_bytes, "
        r"vocab_size; drop it \(~tokenizer\.foo\)",
        2,
    ),
    (
        ["++logger.tensorboard.foo=1"],
        r"logger\.tensorboard\.foo is not a setting of "
        r"lightning\.pytorch\.loggers\.TensorBoardLogger: its settings are .*; drop it \(~logger\.tensorboard\.foo\)",
        2,
    ),
    (
        ["+callbacks.progress_log.every_n_stepz=3"],
        r"callbacks\.progress_log\.every_n_stepz is not a setting of "
        r"gptmini\.training\.callbacks\.console\.ProgressLog: its settings are .*every_n_steps",
        2,
    ),
    (["++foo=1"], r"foo is not a setting of the run", 2),
    # out of range: each refused by the constructor that uses it, built on a stand-in before any work
    (
        ["optimizer.hidden.momentum=5"],
        r"optimizer\.hidden\.momentum=5\.0 is invalid: it must be in \[0, 1\)",
        2,
    ),
    (
        ["optimizer.hidden.momentum=-1"],
        r"optimizer\.hidden\.momentum=-1\.0 is invalid: it must be >= 0",
        2,
    ),
    (
        ["optimizer.hidden.ns_steps=0"],
        r"optimizer\.hidden\.ns_steps=0 is invalid: Newton-Schulz iterations, an "
        r"integer >= 1",
        2,
    ),
    (["optimizer.hidden.ns_steps=-1"], r"optimizer\.hidden\.ns_steps=-1 is invalid", 2),
    (
        ["optimizer.hidden.adjust_lr_fn=bogus"],
        r"optimizer\.hidden\.adjust_lr_fn='bogus' is invalid: it takes null, 'original' or "
        r"'match_rms_adamw'",
        2,
    ),
    (["optimizer.hidden.normuon=3"], r"optimizer\.hidden\.normuon=3 is invalid: true or false", 2),
    (
        ["optimizer.adamw.betas=[0.9]"],
        r"optimizer\.adamw\.betas=\[0\.9\] is invalid: two decay rates, each in \[0, 1\)",
        2,
    ),
    # torch's own refusal does not name the setting: its documented range does (schema.THIRD_PARTY_RANGES)
    (
        ["optimizer.hidden.weight_decay=-1"],
        r"optimizer\.hidden\.weight_decay=-1\.0 is invalid: it must be >= 0$",
        2,
    ),
    (
        ["optimizer.adamw.betas=[0.9,1.5]"],
        r"optimizer\.adamw\.betas=\[0\.9, 1\.5\] is invalid: two decay rates",
        2,
    ),
    # a refusal across settings names the group and its constructor
    (
        ["optimizer=adamw", "optimizer.fused=true", "optimizer.foreach=true"],
        r"optimizer \(torch\.optim\.AdamW\) is invalid: `fused` and `foreach` cannot be `True` together",
        2,
    ),
    (["optimizer.adamw.eps=-1"], r"optimizer\.adamw\.eps=-1\.0 is invalid: Adam divides by sqrt", 2),
    (
        ["optimizer=adamw", "optimizer.betas=[0.9]"],
        r"optimizer\.betas=\[0\.9\] is invalid: two decay rates, each in \[0, 1\)$",
        2,
    ),
    (
        ["optimizer=adamw", "optimizer.eps=-1"],
        r"optimizer\.eps=-1\.0 is invalid: Adam divides by sqrt\(v\) \+ eps, .*positive value "
        r"\(torch's default is 1e-08\)$",
        2,
    ),
    (
        ["trainer.check_val_every_n_epoch=0"],
        r"trainer\.check_val_every_n_epoch=0 is invalid: it must be an "
        r"integer >= 1, or null",
        2,
    ),
    (["trainer.max_epochs=0"], r"trainer\.max_epochs=0 is invalid: it must be an integer >= 1, or null", 2),
    (["data.batch_size=0"], r"data\.batch_size=0 is invalid: it must be an integer >= 1", 2),
    (["scheduler.warmup_steps=-1"], r"scheduler\.warmup_steps=-1 is invalid: it must be >= 0", 2),
    # values that do not resolve: each named with its value as written, not a traceback (exit 1) leaving a folder
    (
        ["optimizer.hidden.lr=${nope}"],
        r"optimizer\.hidden\.lr=\$\{nope\} cannot be resolved: Interpolation key 'nope' not found\. Fix the value",
        2,
    ),
    (
        ["optimizer.hidden.lr=${optimizer.embedding.lr}", "optimizer.embedding.lr=${optimizer.hidden.lr}"],
        r"optimizer\.(hidden|embedding)\.lr=\$\{optimizer\.\w+\.lr\} cannot be resolved: Recursive interpolation",
        2,
    ),
    (
        ["trainer.max_steps=${oc.env:GPTMINI_TEST_UNSET}"],
        r"trainer\.max_steps=\$\{oc\.env:GPTMINI_TEST_UNSET\} cannot be resolved: .*"
        r"Environment variable 'GPTMINI_TEST_UNSET' not found",
        2,
    ),
    (
        ["optimizer.hidden.lr=${oc.decode:nan}"],
        r"optimizer\.hidden\.lr=\$\{oc\.decode:nan\} cannot be resolved: .*`oc\.decode` can only take strings",
        2,
    ),
    # an environment variable's value is text: refused where a number is expected, not a TypeError in the plan
    (
        ["trainer.gradient_clip_val=${oc.env:GPTMINI_TEST_CLIP}"],
        r"trainer\.gradient_clip_val='1\.0' is text where a number is expected .*\$\{oc\.decode:\$\{oc\.env:VAR\}\}",
        2,
    ),
    # integers are no switches (as optimizer.hidden.normuon=3 above), Lightning's own included
    (["trainer.deterministic=3"], r"trainer\.deterministic=3 is invalid: it takes true, false, 'warn'", 2),
    # Adam's eps=0, which torch takes, trained into NaN weights blamed on the learning rate
    (
        ["optimizer=adamw", "optimizer.eps=0"],
        r"optimizer\.eps=0\.0 is invalid: Adam divides by sqrt\(v\) \+ eps, .*give it a small positive",
        2,
    ),
    (["optimizer.adamw.eps=0"], r"optimizer\.adamw\.eps=0\.0 is invalid: Adam divides by sqrt", 2),
    # the key the user set, not the schedule's copy of it (scheduler.max_time was named first)
    (
        ["trainer.max_time={minutes: -1}"],
        r"trainer\.max_time=\{'minutes': -1\} is invalid: give trainer\.max_time as \"DD:HH:MM:SS\"",
        2,
    ),
    # the prepared data went to the working folder's data/, paths.data_root ignored
    (
        ["data.data_dir=null"],
        r"data\.data_dir=null would put the prepared data in the working folder's data/",
        2,
    ),
    # it re-split the prepared folder that every run of the corpus shares, in place
    (
        ["data.val_fraction=0"],
        r"data\.val_fraction=0 leaves no held-out text to validate on and would re-split",
        2,
    ),
    (["model.bias=3"], r"model\.bias=3 is invalid: true or false", 2),
    (["model.qk_norm=7"], r"model\.qk_norm=7 is invalid: true or false", 2),
    # settings every run reads cannot be dropped; entries that are not a callback's or logger's settings
    (["~perf"], r"~perf drops the perf settings, which every run needs: .*perf\.peak_flops=\.\.\.", 2),
    (["~paths"], r"~paths drops the paths settings, which every run needs: .*paths\.output_root=\.\.\.", 2),
    (
        ["++callbacks.foo=1"],
        r"callbacks\.foo=1 is invalid: each entry of callbacks is .*drop it \(~callbacks\.foo\)",
        2,
    ),
    (["++logger.foo=1"], r"logger\.foo=1 is invalid: each entry of logger is .*drop it \(~logger\.foo\)", 2),
    # a root no folder can be made in, though its permission bits allow it
    (
        ["paths.output_root=/proc/gptmini"],
        r"cannot create the run folder /proc/gptmini/smoke/\S+: .*paths\.output_root",
        2,
    ),
    # it was accepted and logged nothing
    (
        ["trainer.log_every_n_steps=0"],
        r"trainer\.log_every_n_steps=0 is invalid: it must be an integer >= 1",
        2,
    ),
    # a key given twice: the override Hydra could not merge is quoted (the first of the key was)
    (
        ["model.n_layer=2", "model.n_layer=abc"],
        r"model\.n_layer=abc: Value 'abc' of type 'str' could not be converted to Integer",
        2,
    ),
    # argparse printed Hydra's whole usage, naming __main__.py
    (
        ["--cfg", "trainer.max_steps=3"],
        r"--cfg takes what to print, job, hydra or all, not 'trainer\.max_steps=3': e\.g\. gptmini train --cfg job",
        2,
    ),
    (
        ["--config-dir", "/nonexistent/gptmini"],
        r"Additional config directory '/nonexistent/gptmini' not found: --config-dir",
        2,
    ),
]

# run as a real `gptmini train` process too: one of the plan's refusals (a Hydra composition error runs as a process
# in test_reliability.py, HYDRA_FULL_ERROR's report in test_override_errors.py)
THROUGH_THE_PROCESS = ["optimizer.hidden.momentum=5"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "input.txt"
    path.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 40)
    return path


def _base(corpus: Path, root: Path) -> list[str]:
    return [
        "debug=smoke",
        "data=text",
        f"data.source={corpus}",
        "tokenizer=char",
        f"paths.data_root={root}/data",
        f"paths.output_root={root}/outputs",
    ]


def _error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "error:" in line]


@pytest.mark.parametrize("case", REFUSED, ids=[" ".join(c[0]) for c in REFUSED])
def test_each_probe_row_is_refused_in_one_line_before_anything_is_built(
    case: tuple[list[str], str, int], corpus: Path, tmp_path: Path, gptmini_train: Any, monkeypatch
) -> None:
    overrides, message, status = case
    monkeypatch.setenv("GPTMINI_TEST_CLIP", "1.0")
    monkeypatch.delenv("GPTMINI_TEST_UNSET", raising=False)
    proc = gptmini_train([*_base(corpus, tmp_path), *overrides])
    text = proc.stdout + proc.stderr
    assert proc.returncode == status, text
    lines = _error_lines(text)
    assert len(lines) == 1, text
    assert re.search(r"error: " + message, lines[0]), lines[0]
    assert "Traceback" not in text
    # nothing built: no data prepared, no run folder left behind
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").iterdir())
    assert not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").rglob("*.*"))


@pytest.mark.parametrize("override", THROUGH_THE_PROCESS)
def test_probe_rows_through_the_gptmini_train_process(
    override: str, corpus: Path, tmp_path: Path, run_cli
) -> None:
    (_, message, status) = next(c for c in REFUSED if c[0] == [override])
    proc = run_cli.train([*_base(corpus, tmp_path), override])
    assert proc.returncode == status, proc.stderr
    lines = _error_lines(proc.stdout + proc.stderr)
    assert len(lines) == 1 and re.search(r"error: " + message, lines[0]), proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").iterdir())


def test_the_documented_overrides_train(corpus: Path, tmp_path: Path, gptmini_train: Any) -> None:
    """docs/configuration.md's `optimizer.embedding.cautious_weight_decay=true` (no `+`) and
    `trainer.enable_progress_bar=false` (the config's progress bar is then left out) train to the end."""
    import torch

    overrides = ["optimizer.embedding.cautious_weight_decay=true", "trainer.enable_progress_bar=false"]
    proc = gptmini_train([*_base(corpus, tmp_path), *overrides])
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    (last,) = (tmp_path / "outputs").rglob("last.ckpt")
    ckpt = torch.load(last, map_location="cpu", weights_only=True)
    assert ckpt["global_step"] == 6
    groups = {g["name"]: g for g in ckpt["optimizer_states"][0]["adamw"]["param_groups"]}
    assert groups["embedding"]["cautious_weight_decay"] is True
    assert all(g["cautious_weight_decay"] is False for name, g in groups.items() if name != "embedding")


def test_data_text_without_a_source_names_the_key_and_leaves_nothing(
    corpus: Path, tmp_path: Path, gptmini_train: Any
) -> None:
    """`gptmini train data=text` without data.source ended in an InterpolationToMissingValueError traceback (exit
    1; data.data_dir names data.source) and left a run folder that `gptmini runs` listed."""
    base = [a for a in _base(corpus, tmp_path) if not a.startswith("data.source=")]
    proc = gptmini_train(base)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text
    (line,) = _error_lines(text)
    assert line.startswith(
        "error: data.source must be set for this run: pass data.source=... (a text file, a folder or glob"
    ), line
    assert "Traceback" not in text
    assert not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").rglob("*"))


def test_a_cycle_in_a_user_experiment_and_a_foreign_primary_config_are_one_line(
    corpus: Path, tmp_path: Path, gptmini_train: Any, monkeypatch
) -> None:
    """A cyclic interpolation inside the user's own experiment file (--config-dir), and a primary config of the
    user's own (--config-name) that does not start from gptmini's: one line each, nothing left behind (the
    second wrote Hydra's outputs/<date>/<time>/ in the working folder and failed with a traceback)."""
    confs = tmp_path / "confs"
    (confs / "experiment").mkdir(parents=True)
    (confs / "experiment" / "loop.yaml").write_text(
        "# @package _global_\noptimizer:\n  hidden:\n    lr: ${optimizer.hidden.momentum}\n    momentum: "
        "${optimizer.hidden.lr}\n"
    )
    (confs / "own.yaml").write_text("model:\n  n_layer: 1\n")
    proc = gptmini_train(["--config-dir", confs, "experiment=loop", *_base(corpus, tmp_path)])
    (line,) = _error_lines(proc.stdout + proc.stderr)
    assert proc.returncode == 2 and "Traceback" not in proc.stdout + proc.stderr
    assert re.match(
        r"error: optimizer\.hidden\.(lr|momentum)=\$\{optimizer\.hidden\.\w+\} cannot be resolved", line
    )
    assert not any((tmp_path / "outputs").rglob("*"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    proc = gptmini_train(["--config-dir", confs, "--config-name", "own"])
    (line,) = _error_lines(proc.stdout + proc.stderr)
    assert proc.returncode == 2 and "Traceback" not in proc.stdout + proc.stderr
    assert line.startswith(
        "error: --config-name own: a config of your own starts from gptmini's: put `defaults:"
    )
    assert [p for p in work.rglob("*") if p.is_file()] == []


def test_a_yaml_syntax_error_in_a_user_experiment_is_one_line_naming_the_file(
    corpus: Path, tmp_path: Path, gptmini_train: Any
) -> None:
    """A user's experiment file that is not YAML ended in PyYAML's traceback, exit 1."""
    confs = tmp_path / "confs"
    (confs / "experiment").mkdir(parents=True)
    broken = confs / "experiment" / "broken.yaml"
    broken.write_text("# @package _global_\ntrainer:\n  max_steps: [1, 2\n")
    proc = gptmini_train(["--config-dir", confs, "experiment=broken", *_base(corpus, tmp_path)])
    text = proc.stdout + proc.stderr
    (line,) = _error_lines(text)
    assert proc.returncode == 2 and "Traceback" not in text, text
    assert line.startswith(f"error: {broken}, line 4, is not valid YAML (while parsing a flow sequence"), line
    assert line.endswith("): fix the file")
    assert not (tmp_path / "outputs").exists()


def test_max_steps_from_an_environment_variable_trains_that_many_steps(
    corpus: Path, tmp_path: Path, gptmini_train: Any, monkeypatch
) -> None:
    """trainer.max_steps='${oc.env:STEPS}' (text in the config, an integer once typed) was refused by the
    scheduler's constructor ("'<' not supported between instances of 'str' and 'int'"), naming neither the key
    nor a fix: the schedule takes its length from the typed trainer setting."""
    import torch

    monkeypatch.setenv("GPTMINI_TEST_STEPS", "2")
    proc = gptmini_train([*_base(corpus, tmp_path), "trainer.max_steps=${oc.env:GPTMINI_TEST_STEPS}"])
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    (last,) = (tmp_path / "outputs").rglob("last.ckpt")
    assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == 2
