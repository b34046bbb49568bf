"""Where a run's TensorBoard events go: a folder named after the run (its run_name and overrides, one safe folder
name however long), a continuation's with the step it continued from."""

from __future__ import annotations

import json
import re
from pathlib import Path

from omegaconf import OmegaConf
from torch.utils.tensorboard import SummaryWriter

from gptmini.runs.discovery import (
    LABEL_MAX,
    run_event_folder,
    task_overrides,
    tensorboard_label,
)
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


def test_a_continuation_is_a_tensorboard_run_of_its_own_named_with_its_step(monkeypatch):
    from hydra.core.hydra_config import HydraConfig

    monkeypatch.setattr(HydraConfig.instance(), "cfg", None)
    node = OmegaConf.create({"save_dir": "/runs/x", "name": "tb", "version": None})
    assert tensorboard_place(node, "default", 6) == {"version": "default,resumed_at=6"}
    assert tensorboard_place(node, "default", 9) != tensorboard_place(node, "default", 6)
    assert tensorboard_place(OmegaConf.create({"version": "mine"}), "default", 6) == {}


def _events(folder: Path) -> Path:
    with SummaryWriter(str(folder)) as writer:
        writer.add_scalar("train/loss", 1.0, 0)
    return folder


def test_a_run_folder_reads_the_tensorboard_run_its_checkpoint_records(tmp_path, write_checkpoint):
    import torch

    first = tmp_path / "first"
    events = _events(first / "tb" / "default")
    resumed = tmp_path / "resumed"
    path = write_checkpoint(resumed / "checkpoints" / "last.ckpt")
    assert run_event_folder(resumed) is None  # no record, no events of its own
    ckpt = torch.load(path, weights_only=True)
    record = json.loads(ckpt["hyper_parameters"]["run_record"])
    ckpt["hyper_parameters"]["run_record"] = json.dumps(record | {"tensorboard_dir": "../first/tb/default"})
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
