"""The run record's one reader: this version's JSON, and the composed config a checkpoint of an earlier version
kept (tests/fixtures/run_v0), and the first version's record, written before a run kept its lineage
(tests/fixtures/run_v1)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from gptmini.runs.checkpoint import atomic_save, load_checkpoint
from gptmini.runs.record import (
    RECORD_KEY,
    RECORD_VERSION,
    Lineage,
    RunRecord,
    parse_record,
    read_record,
    read_record_file,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
OLD_CHECKPOINT = FIXTURES / "run_v0" / "run" / "checkpoints" / "last.ckpt"


def test_a_checkpoint_of_the_earlier_version_reads_as_a_record_of_version_0() -> None:
    ckpt = load_checkpoint(OLD_CHECKPOINT)
    record = read_record(ckpt)
    assert record.version == 0
    assert record.model == ckpt["hyper_parameters"]["model_config"] and record.model["n_embd"] == 16
    assert record.tokenizer_name == "char" and record.data["source"] == "corpus.txt"
    assert record.run_name == "smoke" and record.max_steps == 6 and record.world_size == 1
    assert record.optimizer["_target_"] == "gptmini.training.loop.optimizers.MuonAdamW"
    assert (
        record.scheduler["warmup_steps"] == 2 and "checkpoint_last" not in record.callbacks
    )  # null: left out
    assert record.tensorboard_dir.startswith("tb/smoke,") and record.overrides is None


def test_a_record_written_before_lineage_reads_as_a_fresh_run() -> None:
    ckpt = load_checkpoint(FIXTURES / "run_v1" / "run" / "checkpoints" / "last.ckpt")
    record = read_record(ckpt)
    assert "continued_from" not in json.loads(ckpt["hyper_parameters"][RECORD_KEY])
    assert record.version == 1 and record.continued_from is None
    assert record.model == ckpt["hyper_parameters"]["model_config"] and record.tokenizer_name == "char"
    # the data's identity and its tokenizer, kept beside the record in that version, read into it
    assert record.data_identity == ckpt["hyper_parameters"]["data_identity"]
    assert record.saved_tokenizer["kind"] == "char"
    run_folder_record = read_record_file(FIXTURES / "run_v1" / "run")
    assert run_folder_record == dataclasses.replace(record, data_identity={})


def test_a_record_reads_back_as_it_was_written() -> None:
    record = RunRecord(
        model={"n_layer": 1},
        tokenizer={"name": "char"},
        overrides=("a=1", "b=2"),
        tokens_per_step=64,
        continued_from=Lineage("/runs/a/checkpoints/last.ckpt", 6),
    )
    text = record.to_json()
    assert json.loads(text)["continued_from"] == {"path": "/runs/a/checkpoints/last.ckpt", "step": 6}
    again = parse_record(text)
    assert again == record and again.version == RECORD_VERSION and again.overrides == ("a=1", "b=2")
    assert again.continued_from == Lineage("/runs/a/checkpoints/last.ckpt", 6)
    assert json.loads(RunRecord().to_json())["continued_from"] is None


def test_a_record_of_another_version_is_refused_in_one_line(gptmini_cli, tmp_path) -> None:
    ckpt = load_checkpoint(OLD_CHECKPOINT)
    hp = ckpt["hyper_parameters"]
    hp[RECORD_KEY] = json.dumps({**json.loads(RunRecord().to_json()), "version": RECORD_VERSION + 1})
    path = tmp_path / "future.ckpt"
    atomic_save({"state_dict": ckpt["state_dict"], "hyper_parameters": hp, "global_step": 1}, path)
    proc = gptmini_cli(["sample", "--ckpt", str(path), "--max-new-tokens", "2"])
    assert proc.returncode == 2
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert (
        f"run record's version {RECORD_VERSION + 1} is not one this gptmini reads (1, {RECORD_VERSION})"
        in line
    )
    assert torch.load(path, weights_only=True)["global_step"] == 1  # left as it was
