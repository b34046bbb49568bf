"""Where a run's TensorBoard events go: a folder named after the run (its run_name and overrides, one safe folder
name however long), and for a resumed run the folder of the run it resumes, followed along a chain of resumes."""

from __future__ import annotations

import re
from pathlib import Path

from omegaconf import OmegaConf
from torch.utils.tensorboard import SummaryWriter

from gptmini.runs.discovery import (
    LABEL_MAX,
    event_folders,
    run_event_folder,
    task_overrides,
    tensorboard_label,
)
from gptmini.training.run.resume import continued_event_folder
from gptmini.training.run.run_folder import RUN_NAME, tensorboard_place


def test_the_label_is_the_run_name_and_its_sorted_overrides():
    assert tensorboard_label("default", []) == "default"
    label = tensorboard_label("default", ["trainer.max_steps=300", "model.n_layer=6"])
    assert label == "default,model.n_layer=6,trainer.max_steps=300"
    # the order on the command line does not matter
    assert label == tensorboard_label("default", ["model.n_layer=6", "trainer.max_steps=300"])


def test_overrides_that_only_place_the_run_are_left_out():
    given = ["ckpt_path=last", "run_name=x", "paths.output_root=/tmp/o", "+hydra.job.chdir=false", "seed=3"]
    assert task_overrides(given) == ("seed=3",)


def test_a_label_is_one_safe_folder_name():
    label = tensorboard_label("default", ["data.source=/home/me/my corpus.txt", "model.attention=[a,b]"])
    assert "/" not in label and " " not in label
    assert RUN_NAME.fullmatch(label), label
    assert label == "default,data.source=_home_me_my_corpus.txt,model.attention=_a,b_"


def test_a_long_label_is_cut_and_keeps_apart_by_its_hash():
    many = [f"callbacks.head_insight.option_{i}={i}" for i in range(20)]
    a = tensorboard_label("default", [*many, "seed=1"])
    b = tensorboard_label("default", [*many, "seed=2"])
    assert len(a) <= LABEL_MAX and len(b) <= LABEL_MAX
    assert a != b and a[:-9] == b[:-9]  # the same cut text, another hash
    assert re.fullmatch(r".*-[0-9a-f]{8}", a) and a == tensorboard_label("default", [*many, "seed=1"])


def test_a_fresh_run_is_named_after_itself_unless_the_config_names_a_version(monkeypatch):
    from hydra.core.hydra_config import HydraConfig

    # outside a Hydra run, whatever config an earlier test in this process left as Hydra's current one
    monkeypatch.setattr(HydraConfig.instance(), "cfg", None)
    node = OmegaConf.create({"save_dir": "/runs/x", "name": "tb", "version": None})
    # outside a Hydra run there are no overrides: the label is the run name
    assert tensorboard_place(node, "default", None) == {"version": "default"}
    assert tensorboard_place(OmegaConf.create({"version": "mine"}), "default", None) == {}


def test_a_resumed_run_writes_into_the_folder_it_continues():
    place = tensorboard_place(OmegaConf.create({"version": "mine"}), "default", "/runs/a/tb/default,seed=3")
    assert place == {"save_dir": "/runs/a", "name": "tb", "version": "default,seed=3"}
    # a run written before labels: its events in tb/ itself
    assert tensorboard_place(OmegaConf.create({}), "default", "/runs/a/tb") == {
        "save_dir": "/runs",
        "name": "a",
        "version": "tb",
    }


def _events(folder: Path) -> Path:
    with SummaryWriter(str(folder)) as writer:
        writer.add_scalar("train/loss", 1.0, 0)
    return folder


def _ckpt(tensorboard_dir: str | None) -> dict:
    config = {} if tensorboard_dir is None else {"tensorboard_dir": tensorboard_dir}
    return {"hyper_parameters": {"run_config": config}}


def test_a_resume_continues_the_recorded_folder_along_a_chain(tmp_path):
    first = tmp_path / "default" / "first"
    events = _events(first / "tb" / "default,seed=3")
    # the first run's checkpoint records its own folder; the resumed run's records the first run's
    assert continued_event_folder(
        str(first / "checkpoints" / "last.ckpt"), _ckpt("tb/default,seed=3"), tmp_path
    ) == str(events.resolve())
    second = tmp_path / "default" / "second"
    got = continued_event_folder(
        str(second / "checkpoints" / "last.ckpt"), _ckpt("../first/tb/default,seed=3"), tmp_path
    )
    assert got == str(events.resolve())


def test_without_a_record_the_checkpoints_run_folder_has_the_events(tmp_path):
    old = tmp_path / "old"
    legacy = _events(old / "tb")  # written before labels
    assert continued_event_folder(str(old / "checkpoints" / "last.ckpt"), _ckpt(None), tmp_path) == str(
        legacy.resolve()
    )
    assert event_folders(old) == [legacy]
    # a record that no longer leads anywhere (the folder was deleted): the events beside the checkpoint
    assert continued_event_folder(
        str(old / "checkpoints" / "last.ckpt"), _ckpt("../gone/tb/x"), tmp_path
    ) == str(legacy.resolve())


def test_a_checkpoint_outside_a_run_folder_starts_a_tensorboard_run_of_its_own(tmp_path):
    _events(tmp_path / "tb")
    assert continued_event_folder(str(tmp_path / "copied.ckpt"), _ckpt("tb"), tmp_path) is None
    assert (
        continued_event_folder(str(tmp_path / "empty" / "checkpoints" / "last.ckpt"), _ckpt(None), tmp_path)
        is None
    )


def test_a_recorded_folder_outside_the_output_root_and_the_run_folder_is_not_followed(tmp_path, caplog):
    """A checkpoint is a file anyone can write: its recorded TensorBoard folder is followed only inside the
    output root or the checkpoint's run folder; elsewhere the run logs to a TensorBoard run of its own, saying so."""
    import logging

    victim = _events(tmp_path / "victim")
    root = tmp_path / "outputs"
    run = root / "default" / "copied"
    ckpt = str(run / "checkpoints" / "last.ckpt")
    _events(run / "tb" / "default")  # its own events are not taken for the recorded ones either
    with caplog.at_level(logging.WARNING):
        assert continued_event_folder(ckpt, _ckpt("../../../victim"), root) is None
    assert [r.getMessage() for r in caplog.records] == [
        f"the TensorBoard folder {victim} recorded in {ckpt} is outside paths.output_root and the checkpoint's "
        "run folder: not followed, this run logs to a TensorBoard run of its own"
    ]
    # a symlink inside the run folder that leads out is not followed either
    (run / "tb" / "link").symlink_to(victim, target_is_directory=True)
    assert continued_event_folder(ckpt, _ckpt("tb/link"), root) is None
    # the same record inside the output root is followed (a run resumed from another one)
    inside = _events(root / "default" / "first" / "tb" / "default")
    assert continued_event_folder(ckpt, _ckpt("../first/tb/default"), root) == str(inside.resolve())
    # a checkpoint's run folder outside the output root keeps its own events
    assert continued_event_folder(ckpt, _ckpt("tb/default"), tmp_path / "elsewhere") == str(
        (run / "tb" / "default").resolve()
    )


def test_a_run_folder_reads_the_tensorboard_run_its_checkpoint_records(tmp_path, write_checkpoint):
    import torch

    first = tmp_path / "first"
    events = _events(first / "tb" / "default")
    resumed = tmp_path / "resumed"
    path = write_checkpoint(resumed / "checkpoints" / "last.ckpt")
    assert run_event_folder(resumed) is None  # no record, no events of its own
    ckpt = torch.load(path, weights_only=True)
    ckpt["hyper_parameters"]["run_config"]["tensorboard_dir"] = "../first/tb/default"
    torch.save(ckpt, path)
    assert run_event_folder(resumed) == events
    assert run_event_folder(first) == events


def test_reading_events_logs_no_routine_tensorboard_lines(tmp_path, caplog):
    """TensorBoard's directory watcher says "No path found after <event file>" at INFO after each read: silenced
    around the read, and the level left as it was."""
    import logging

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from gptmini.runs.discovery import read_events

    folder = _events(tmp_path / "tb")
    caplog.set_level(logging.INFO)
    EventAccumulator(str(folder)).Reload()
    assert any("No path found" in r.getMessage() for r in caplog.records)  # what TensorBoard logs itself
    caplog.clear()
    events = read_events(folder)
    assert [e.value for e in events.Scalars("train/loss")] == [1.0]
    assert not [r for r in caplog.records if r.name.startswith("tensorboard")]
    assert logging.getLogger("tensorboard").level == logging.NOTSET
