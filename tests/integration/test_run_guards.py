"""What a training command never does, through the real command line: write into a folder that already holds a
run (unless asked to resume it), write outside the output root, delete a folder it did not make, start work whose
stop a sweep at its first failing job, or resume a run it cannot continue."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

# A tiny char model, 2 steps, validation at the end, the slow loggers off.
TINY = [
    "model=tiny",
    "tokenizer=char",
    "trainer=cpu",
    "data.batch_size=4",
    "trainer.max_steps=2",
    "trainer.val_check_interval=2",
    "trainer.limit_val_batches=1",
    "checkpoint_every_n_steps=1",
    "trainer.enable_model_summary=false",
    "~callbacks.attention_maps",
    "~callbacks.text_samples",
    "~callbacks.progress_bar",
    "trainer.enable_progress_bar=false",
]


def output(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout + proc.stderr


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def train(gptmini_train: Any, char_data_root: Path, tmp_path: Path) -> Any:
    """``train(*overrides)``: ``gptmini train`` TINY under ``tmp_path/out`` (in this process); ``overrides``
    replace TINY's keys."""

    def _train(*overrides: str) -> subprocess.CompletedProcess:
        keys = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
        base = [a for a in TINY if a.split("=", 1)[0].lstrip("+~") not in keys]
        return gptmini_train(
            [*base, f"paths.output_root={tmp_path / 'out'}", f"paths.data_root={char_data_root}", *overrides]
        )

    return _train


def check_refused(proc: subprocess.CompletedProcess, pattern: str) -> str:
    text = output(proc)
    assert proc.returncode == 2, text[-3000:]
    assert re.search(pattern, text), text[-3000:]
    assert "Traceback" not in text and len(re.findall(r"\berror: ", text)) == 1, text[-3000:]
    assert "run finished" not in text
    return text


@pytest.fixture(scope="module")
def finished_run(
    run_cli: Any, char_data_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, subprocess.CompletedProcess]:
    """One finished TINY run in a folder named with hydra.run.dir (a space in its path), and its command's output;
    the tests that only try to start runs against it share it and check that it stays byte-identical."""
    run_dir = tmp_path_factory.mktemp("finished") / "my runs" / "first"
    proc = run_cli.train(
        [
            *TINY,
            f"paths.output_root={run_dir.parent}",
            f"paths.data_root={char_data_root}",
            f"hydra.run.dir={run_dir}",
        ]
    )
    assert proc.returncode == 0, output(proc)[-3000:]
    return run_dir, proc


def test_a_new_run_into_a_folder_holding_a_run_is_refused_and_changes_nothing(train, finished_run) -> None:
    """hydra.run.dir naming a finished run's folder: refused before Hydra writes anything (no silent resume of its
    last.ckpt, no Lightning traceback with another model), naming both ways out; the old run is byte-identical.
    The summary's next commands quote the run folder (a space in it)."""
    run_dir, first = finished_run
    assert f"gptmini sample --ckpt '{run_dir}' --prompt" in output(first)
    before = files(run_dir)
    assert "checkpoints/last.ckpt" in before and ".hydra/config.yaml" in before
    # the same command again, with another model (which used to end in a Lightning traceback)
    again = train(f"hydra.run.dir={run_dir}", "model.n_embd=64")
    check_refused(
        again,
        rf"error: the run folder {re.escape(str(run_dir))} already holds a run \(\.hydra, checkpoints, tb, "
        rf"train\.log\): a new run never writes into it\. Resume that run with ckpt_path=last "
        rf"hydra\.run\.dir=.*, or start a new run in a folder of its own",
    )
    assert files(run_dir) == before


def test_paths_output_dir_naming_a_finished_run_is_refused_and_changes_nothing(train, finished_run) -> None:
    """paths.output_dir (a documented key) bypassed the check of hydra.run.dir: the finished run's last.ckpt was
    replaced by a 1-layer model and its summary, scalars and curve overwritten, exit 0."""
    run_dir, _ = finished_run
    before = files(run_dir)
    proc = train(f"paths.output_dir={run_dir}", "model.n_layer=1")
    check_refused(
        proc,
        rf"error: the run folder {re.escape(str(run_dir))} already holds a run \(\.hydra, checkpoints, tb, "
        rf"train\.log\): a new run never writes into it\. Resume that run with ckpt_path=last "
        rf"paths\.output_dir=",
    )
    assert files(run_dir) == before


@pytest.mark.parametrize("key", ["hydra.run.dir", "paths.output_dir"])
def test_a_resume_into_another_run_s_folder_is_refused_and_changes_nothing(
    train, finished_run, tmp_path, key
) -> None:
    """ckpt_path=<run A> with the run folder naming run B's: the folder guard was skipped for every resume, so B's
    last.ckpt, record, summary, scalars and curve were replaced by A's continuation, exit 0."""
    run_dir, _ = finished_run
    other = tmp_path / "a"
    assert train(f"hydra.run.dir={other}").returncode == 0
    before = files(run_dir)
    proc = train(f"ckpt_path={other}", f"{key}={run_dir}", "trainer.max_steps=4")
    check_refused(
        proc,
        rf"error: the run folder {re.escape(str(run_dir))} already holds a run \(.*\), and this run resumes "
        rf"{re.escape(str(other))}/checkpoints/last\.ckpt, another run's: a resume writes only into a new folder "
        rf"or the folder of the run it continues\. Leave {re.escape(key)} unset",
    )
    assert files(run_dir) == before


def test_a_sweep_with_one_output_dir_for_every_job_is_refused_before_the_first(
    gptmini_train, tmp_path
) -> None:
    """`-m ... paths.output_dir=<folder>` wrote every job into the same checkpoints/; a sweep over
    paths.output_dir itself (a folder per job) is not refused (its values reach each job's own check)."""
    shared = tmp_path / "shared"
    proc = gptmini_train(
        [
            "-m",
            "model=tiny",
            "tokenizer=char",
            "trainer.max_steps=2,3",
            f"paths.output_dir={shared}",
            f"paths.output_root={tmp_path / 'out'}",
        ]
    )
    check_refused(
        proc,
        rf"error: paths\.output_dir={re.escape(str(shared))} in a sweep \(-m\) would put every job's checkpoints and "
        r"events into one folder: leave paths\.output_dir unset",
    )
    assert list(tmp_path.rglob("*")) == []


@pytest.mark.parametrize(
    "variable", ["LOCAL_RANK=1", "RANK=1", "SLURM_PROCID=1", "WORLD_SIZE=2", "SLURM_NTASKS=4"]
)
def test_a_stray_launcher_variable_leaves_a_one_process_run_s_guard_on(
    train, finished_run, monkeypatch, variable
) -> None:
    """A launcher's variable left in the environment (a SLURM allocation, a shell torchrun ran in) of a run of
    one process (trainer.devices=1) turned the free-folder check and the lock off: hydra.run.dir=<a finished
    run> then overwrote its config, log and checkpoint, exit 0."""
    name, value = variable.split("=")
    monkeypatch.setenv(name, value)
    run_dir, _ = finished_run
    before = files(run_dir)
    check_refused(
        train(f"hydra.run.dir={run_dir}", "trainer.devices=1"),
        rf"error: the run folder {re.escape(str(run_dir))} already holds a run",
    )
    assert files(run_dir) == before


@pytest.mark.slow  # (the unit test of _remove_failed_run_folder runs in the fast suite)
def test_a_failed_start_keeps_a_folder_that_existed_before(train, tmp_path) -> None:
    empty = tmp_path / "mine"
    empty.mkdir()
    check_refused(
        train(f"hydra.run.dir={empty}", "model.n_head=3"), r"error: model\.n_embd=32 is not divisible"
    )
    assert empty.is_dir() and not any(
        empty.iterdir()
    )  # what the run wrote (.hydra, train.log) went, not the folder


def test_a_run_name_that_is_not_one_folder_name_is_refused_before_anything_is_written(
    gptmini_train, char_data_root, tmp_path
) -> None:
    """run_name=../../escape wrote outside the output root (and `last` could not find it); other names: unit tests
    (tests/unit/training/test_config.py)."""
    name, out = "../../escape", tmp_path / "root" / "out"
    proc = gptmini_train(["model=tiny", "tokenizer=char", f"run_name={name}", f"paths.output_root={out}"])
    check_refused(
        proc, rf"error: run_name='{re.escape(name)}' is invalid: it names one folder under paths\.output_root"
    )
    assert list(tmp_path.rglob("*")) == []  # nothing under the output root, nor beside it


@pytest.mark.parametrize("field", ["version", "name"])
@pytest.mark.parametrize("version", ["../../../../x", "a/b", ".hidden"])
def test_a_tensorboard_version_that_is_not_one_folder_name_is_refused_before_anything_is_written(
    gptmini_train, tmp_path, version, field
) -> None:
    """logger.tensorboard.version=../../../../x wrote events outside the output root, and so did the same path as
    logger.tensorboard.name: one plain name each, as run_name."""
    out = tmp_path / "root" / "out"
    proc = gptmini_train(
        ["model=tiny", "tokenizer=char", f"logger.tensorboard.{field}={version}", f"paths.output_root={out}"]
    )
    check_refused(
        proc,
        rf"error: logger\.tensorboard\.{field}='{re.escape(version)}' is invalid: it names (one folder|the folder) "
        r"of the run's TensorBoard runs",
    )
    assert list(tmp_path.rglob("*")) == []


def test_a_sweep_runs_every_job_and_ends_with_the_failures(gptmini_train, char_data_root, tmp_path) -> None:
    """`-m model.attention=bogus,sdpa`: the bogus job fails with its one line, the next job still runs (and its
    validation interval, longer than the 1-step run, is scaled down instead of refused); the sweep ends with a
    summary of the failed jobs and exit status 2."""
    out = tmp_path / "out"
    proc = gptmini_train(
        [
            "-m",
            "debug=smoke",
            "tokenizer=char",
            "model.attention=bogus,sdpa",
            "trainer.max_steps=1",
            "~callbacks.text_samples",
            "~callbacks.attention_maps",
            f"paths.output_root={out}",
            f"paths.data_root={char_data_root}",
        ]
    )
    text = output(proc)
    assert proc.returncode == 2, text[-3000:]
    assert "Traceback" not in text
    assert re.search(
        r"error: 1 of 2 sweep jobs failed:\n  \[debug=smoke tokenizer=char model\.attention=bogus [^\]]*\] "
        r"model\.attention='bogus' is not a causal attention implementation",
        text,
    ), text[-3000:]
    assert "trainer.val_check_interval=3 is more than the run's 1 training batches" in text
    (sweep,) = (out / "smoke").glob("multirun_*")
    (job,) = [p for p in sweep.iterdir() if p.is_dir() and "sdpa" in p.name]
    assert (job / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.slow
def test_resuming_a_finished_run_or_with_another_batch_is_refused_and_in_place_resume_works(
    train, tmp_path
) -> None:
    run_dir = tmp_path / "run"
    assert train(f"hydra.run.dir={run_dir}").returncode == 0
    before = files(run_dir)
    # a run folder as ckpt_path: its last checkpoint; the run is finished
    check_refused(
        train("run_name=again", f"ckpt_path={run_dir}"),
        rf"error: checkpoint {re.escape(str(run_dir))}/checkpoints/last\.ckpt is already at step 2 and "
        r"trainer\.max_steps=2: the run is finished and resuming would train nothing\. To train on, resume with a "
        r"larger trainer\.max_steps \(e\.g\. trainer\.max_steps=4\)",
    )
    check_refused(
        train("run_name=again", f"ckpt_path={run_dir}", "trainer.max_steps=4", "data.batch_size=8"),
        r"was trained with another batch \(data\.batch_size: checkpoint 4 vs now 8\)",
    )
    assert files(run_dir) == before
    assert not (tmp_path / "out" / "again").exists()
    # resuming in place: ckpt_path=last finds the folder's own checkpoint
    resumed = train(f"hydra.run.dir={run_dir}", "ckpt_path=last", "trainer.max_steps=4")
    assert resumed.returncode == 0, output(resumed)[-3000:]
    assert f"resuming from {run_dir}/checkpoints/last.ckpt" in output(resumed)
    assert "run finished: 4 steps" in output(resumed)
    # its lineage, in its record from the start: the checkpoint it continued and the step that held
    from gptmini.runs.record import Lineage, read_record_file

    lineage = Lineage(str((run_dir / "checkpoints" / "last.ckpt").resolve()), 2)
    assert read_record_file(run_dir).continued_from == lineage


@pytest.mark.slow
def test_the_attention_zoo_runs_with_a_short_max_steps(run_cli, char_data_root, tmp_path) -> None:
    """experiment=attention_zoo's validation interval (250) is scaled to a 2-step run instead of refused."""
    proc = run_cli.train(
        [
            "experiment=attention_zoo",
            "hydra.sweeper.params.attention_variant=rope",
            "trainer.max_steps=2",
            "trainer.limit_val_batches=1",
            f"paths.output_root={tmp_path / 'out'}",
            f"paths.data_root={char_data_root}",
        ]
    )
    assert proc.returncode == 0, output(proc)[-3000:]
    (ckpt,) = (tmp_path / "out" / "attention_zoo").glob("multirun_*/*/checkpoints/last.ckpt")
    assert "trainer.val_check_interval=250 is more than the run's 2 training batches" in output(proc)


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="a machine with a CUDA GPU trains hardware=gpu"
)
def test_hardware_gpu_without_a_gpu_names_hardware_and_the_fix(gptmini_train, tmp_path) -> None:
    proc = gptmini_train(["hardware=gpu", f"paths.output_root={tmp_path}/outputs"])
    assert proc.returncode == 2
    (line,) = [ln for ln in output(proc).splitlines() if "error:" in ln]
    assert line.endswith(
        "error: hardware=gpu asks for a CUDA GPU and no CUDA GPU is available on this machine "
        "(conf/hardware/gpu.yaml): use hardware=cpu, or run on a machine with a CUDA GPU"
    )
    assert "Traceback" not in output(proc)
    assert not list((tmp_path / "outputs").rglob("*.*"))  # no run left behind


def test_resuming_a_run_that_reached_its_target_is_refused(train, tmp_path) -> None:
    run_dir = tmp_path / "run"
    # any validation reaches a target this high: the run stops at its first one (step 2 of 4)
    first = train(f"hydra.run.dir={run_dir}", "trainer.max_steps=4", "target_val_loss=100")
    assert first.returncode == 0, output(first)[-3000:]
    assert "reached val/loss" in output(first)
    before = files(run_dir)
    check_refused(
        train("run_name=again", "trainer.max_steps=4", "target_val_loss=100", f"ckpt_path={run_dir}"),
        r"error: checkpoint .*last\.ckpt already reached target_val_loss=100\.0 \(val/loss \d+\.\d+ at step 2\): the run "
        r"is finished and resuming would stop at once\. To train on, resume with target_val_loss=null",
    )
    assert files(run_dir) == before and not (tmp_path / "out" / "again").exists()
    # without the target it trains on
    resumed = train(f"hydra.run.dir={run_dir}", "trainer.max_steps=4", "ckpt_path=last")
    assert resumed.returncode == 0 and "run finished: 4 steps" in output(resumed), output(resumed)[-3000:]


def test_init_from_with_ckpt_path_is_refused(train, finished_run, tmp_path) -> None:
    run_dir, _ = finished_run
    before = files(run_dir)
    check_refused(
        train("run_name=again", f"ckpt_path={run_dir}", "trainer.max_steps=4", f"model.init_from={run_dir}"),
        r"error: model\.init_from=.* and ckpt_path=.* both say where the weights come from: drop model\.init_from to "
        r"resume that run, or drop ckpt_path to start a new run from those weights",
    )
    assert files(run_dir) == before and not (tmp_path / "out" / "again").exists()


def test_a_corpus_path_that_is_not_utf8_trains_and_is_shown_by_its_bytes(train, tmp_path, tb_events) -> None:
    """A corpus path whose bytes are not UTF-8 (as the shell passes them: os.fsdecode's escapes) crashed after
    the data was prepared and the model built (UnicodeEncodeError writing the run's overrides to TensorBoard),
    leaving a run folder; the hyperparameters were lost with it."""
    import os
    import shutil

    folder = os.fsencode(tmp_path) + b"/corpus\xff"
    os.mkdir(folder)
    shutil.copyfile(os.fsencode(Path(__file__)), folder + b"/t\xe9xt.txt")
    source = os.fsdecode(folder + b"/t\xe9xt.txt")
    proc = train("data=text", f"data.source='{source}'", "data.batch_size=2")
    assert proc.returncode == 0, output(proc)[-3000:]
    (run_dir,) = (tmp_path / "out").glob("*/*")
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    (text,) = tb_events(run_dir).Tensors("run/overrides/text_summary")
    assert "corpus\\xff/t\\xe9xt.txt" in text.tensor_proto.string_val[0].decode()


def test_a_run_without_callbacks_writes_no_checkpoint_of_lightning_s_own(
    gptmini_train, char_data_root, tmp_path
) -> None:
    """A run without a checkpoint callback (callbacks=none; ~callbacks is refused, naming the options) made
    Lightning add its own ModelCheckpoint (epoch=0-step=2.ckpt in the TensorBoard folder) beside the run's final
    last.ckpt."""
    # no periodic checkpoint to pace without callbacks (checkpoint_every_n_steps would be refused)
    base = [a for a in TINY if not a.startswith(("~callbacks.", "checkpoint_every_n_steps="))]
    proc = gptmini_train(
        [
            *base,
            "callbacks=none",
            f"paths.output_root={tmp_path / 'out'}",
            f"paths.data_root={char_data_root}",
        ]
    )
    assert proc.returncode == 0, output(proc)[-3000:]
    (run_dir,) = (tmp_path / "out").glob("*/*")
    assert [str(p.relative_to(run_dir)) for p in run_dir.rglob("*.ckpt")] == ["checkpoints/last.ckpt"]


def test_a_run_stopped_by_a_nan_loss_writes_its_curves_and_says_where_they_end(train, tmp_path) -> None:
    """A run stopped by a NaN loss (or a signal) left no loss_curve.png nor scalars.csv; a NaN curve was an empty
    plot without a word."""
    proc = train(
        "optimizer=adamw",
        "optimizer.lr=1e6",
        "trainer.max_steps=40",
        "trainer.val_check_interval=40",
        "trainer.log_every_n_steps=1",
        # the guard reads the loss before the final save only: the NaN losses before it reach the curves
        "callbacks.nonfinite_guard.check_every_n_steps=1000",
        "checkpoint_every_n_steps=1000",
    )
    assert proc.returncode == 3, output(proc)[-3000:]
    (run_dir,) = (tmp_path / "out").glob("*/*")
    assert (run_dir / "loss_curve.png").stat().st_size > 0
    rows = (run_dir / "scalars.csv").read_text().splitlines()
    assert len(rows) >= 3 and rows[0].startswith("step,")
    assert re.search(
        r"train/loss is NaN/inf from step \d+ on: loss_curve\.png draws its finite points only", output(proc)
    )


@pytest.mark.parametrize("root", ["", "/", "//", "${oc.env:GPTMINI_TEST_EMPTY}"])
def test_an_empty_or_root_only_output_root_is_refused_in_one_line(train, monkeypatch, root) -> None:
    """paths.output_root= (or an ${oc.env:X} with X empty) put the run at the filesystem root, /<run_name>/...,
    exit 0. (A model setting refused later keeps the old code from training there: it named that setting.)"""
    monkeypatch.setenv("GPTMINI_TEST_EMPTY", "")
    name = f"gptmini_root_test_{os.getpid()}"
    check_refused(
        train(f"paths.output_root={root}", f"run_name={name}", "model.dropout=1.5"),
        r"error: paths\.output_root='/*' would put the runs at the filesystem root: pass a folder of its own",
    )
    assert not Path("/", name).exists()


@pytest.mark.parametrize(
    "variables",
    [{"LOCAL_RANK": "1", "RANK": "1", "WORLD_SIZE": "2"}, {"SLURM_NTASKS": "2", "SLURM_JOB_NAME": "batch"}],
    ids=["torchrun", "sbatch-n2"],
)
def test_a_one_process_run_under_stray_launcher_variables_trains_and_logs_as_rank_zero(
    run_cli, char_data_root, tmp_path, variables
) -> None:
    """LOCAL_RANK=1 RANK=1 WORLD_SIZE=2 made a run of one process act as rank 1 (exit 0, no tb/, no scalars.csv,
    no curve, "final validation: none logged"); SLURM_NTASKS=2 (sbatch -n 2 around one command) failed it with
    Lightning's --ntasks error. A process started with these, not by a launcher of this run, is its rank 0."""
    proc = run_cli.train(
        [*TINY, f"paths.output_root={tmp_path / 'out'}", f"paths.data_root={char_data_root}"],
        env=variables,
    )
    assert proc.returncode == 0, output(proc)[-3000:]
    assert "final validation: val/loss" in output(proc)
    (run_dir,) = (tmp_path / "out").glob("*/*")
    for made in ("tb", "scalars.csv", "loss_curve.png", "checkpoints/last.ckpt"):
        assert (run_dir / made).exists(), made


@pytest.mark.parametrize("refused", ["model.dropout=1.5", "seed=-1", "optimizer.hidden.lr=nan"])
def test_a_refusal_after_composition_leaves_no_output_root_it_made(train, tmp_path, refused) -> None:
    """The run folder and its run_name folder went, but the output root the start had made stayed, empty; an
    output root that existed before stays."""
    made = tmp_path / "new" / "root"
    check_refused(train(f"paths.output_root={made}", refused), rf"error: {re.escape(refused)} is invalid")
    assert not (tmp_path / "new").exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    check_refused(train(f"paths.output_root={kept}", refused), rf"error: {re.escape(refused)} is invalid")
    assert kept.is_dir() and not any(kept.iterdir())
