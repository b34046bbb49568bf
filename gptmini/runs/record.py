"""The run record: what a training run was (its plan, as JSON, from ``RunPlan.record``), kept in every checkpoint
(as JSON text under ``hyper_parameters.run_record``, its only hyper-parameter) and in the run folder
(``run_record.json``), and the one reader every command uses to read it back (``read_record``: the settings a
checkpoint of an earlier version lacks are left empty).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gptmini import fileio

RECORD_VERSION = 2  # 1: the model and data identity kept beside the record
RECORD_KEY = "run_record"  # in a checkpoint's hyper_parameters: the record as JSON text
RECORD_FILE = "run_record.json"  # in the run folder


class RunRecordError(ValueError):
    """A record that is not JSON of a known version."""


@dataclass(frozen=True)
class Lineage:
    path: str  # the checkpoint file this run continued, absolute
    step: int  # the global step it held


@dataclass(frozen=True)
class RunRecord:
    version: int = RECORD_VERSION  # 0: read from a checkpoint written before the record
    model: dict[str, Any] = field(default_factory=dict)  # GPTConfig's fields, as trained
    # the prepared data trained on (gptmini.data.reader.data_identity), with the tokenizer itself under
    # "saved_tokenizer" when it is not known by name (gptmini.data.reader.saved_tokenizer)
    data_identity: dict[str, Any] = field(default_factory=dict)
    # name, and a trained BPE's vocab_size, train_bytes
    tokenizer: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)  # the DataModule's settings: source, data_dir, ...
    trainer: dict[str, Any] = field(default_factory=dict)  # with the precision and validation interval used
    optimizer: dict[str, Any] = field(default_factory=dict)  # with its _target_
    scheduler: dict[str, Any] | None = None  # None: a constant learning rate
    callbacks: dict[str, Any] = field(default_factory=dict)  # by name, null ones left out
    run_name: str | None = None
    seed: int | None = None
    hardware: str | None = None  # the hardware option chosen (cpu, gpu, auto)
    precision: str | None = None  # the precision the plan made concrete for the machine
    overrides: tuple[str, ...] | None = None  # the command line's overrides (None: not recorded)
    init_from: str | None = None  # the weights a fresh run started from, resolved
    world_size: int | None = None  # training processes
    tokens_per_step: int | None = None  # tokens of one optimizer step, over every process
    tensorboard_dir: str | None = None  # the run's TensorBoard folder, relative to its run folder
    output_dir: str | None = None
    continued_from: Lineage | None = None  # None: a fresh run

    @property
    def tokenizer_name(self) -> str | None:
        return self.tokenizer.get("name")

    @property
    def data_dir(self) -> str | None:
        return self.data.get("data_dir")

    @property
    def max_steps(self) -> int | None:
        return self.trainer.get("max_steps")

    @property
    def saved_tokenizer(self) -> Any:
        return self.data_identity.get("saved_tokenizer")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    def write(self, run_dir: str | Path) -> None:
        fileio.atomic_write_json(Path(run_dir) / RECORD_FILE, json.loads(self.to_json()))


def read_record(checkpoint: Mapping[str, Any]) -> RunRecord:
    """The run record of a loaded checkpoint: its ``run_record`` (with the model and data identity version 1 kept
    beside it), else the composed config version 0 kept; an empty record for a checkpoint that records neither.
    RunRecordError for a record that is not JSON of a known version."""
    hp = checkpoint.get("hyper_parameters") or {}
    beside = {"model": _dict(hp.get("model_config")), "data_identity": _dict(hp.get("data_identity"))}
    if hp.get(RECORD_KEY) is not None:
        return parse_record(hp[RECORD_KEY], beside)
    config = _dict(hp.get("run_config"))
    trainer, composed_model = _dict(config.get("trainer")), _dict(config.get("model"))
    return RunRecord(
        version=0,
        model=beside["model"] or {k: v for k, v in composed_model.items() if k != "init_from"},
        data_identity=beside["data_identity"],
        tokenizer=_dict(config.get("tokenizer")),
        data=_dict(config.get("data")),
        trainer=trainer,
        optimizer=_dict(config.get("optimizer")),
        scheduler=_dict(config.get("scheduler")) or None,
        callbacks={k: v for k, v in _dict(config.get("callbacks")).items() if v is not None},
        run_name=config.get("run_name"),
        seed=config.get("seed"),
        precision=trainer.get("precision"),
        init_from=composed_model.get("init_from"),
        world_size=config.get("world_size"),  # written by the build beside the composed config
        tensorboard_dir=config.get("tensorboard_dir"),
        output_dir=_dict(config.get("paths")).get("output_dir"),
    )


def read_record_file(run_dir: str | Path) -> RunRecord | None:
    try:
        return parse_record((Path(run_dir) / RECORD_FILE).read_text())
    except (OSError, RunRecordError):
        return None


def parse_record(text: str, beside: Mapping[str, dict[str, Any]] | None = None) -> RunRecord:
    """A record from its JSON text. ``beside``: the fields a version 1 checkpoint kept beside its record."""
    try:
        values = json.loads(text)
    except (TypeError, ValueError) as err:
        raise RunRecordError(f"the run record is not JSON: {err}") from None
    version = values.get("version") if isinstance(values, dict) else None
    if version not in (1, RECORD_VERSION):
        raise RunRecordError(
            f"the run record's version {version!r} is not one this gptmini reads (1, {RECORD_VERSION}): read it with "
            "the gptmini that wrote it"
        )
    values = {f.name: values[f.name] for f in dataclasses.fields(RunRecord) if f.name in values}
    for name, value in (beside or {}).items():
        values[name] = values.get(name) or value
    if values.get("overrides") is not None:
        values["overrides"] = tuple(values["overrides"])
    if values.get("continued_from") is not None:
        values["continued_from"] = Lineage(**values["continued_from"])
    return RunRecord(**values)


def _dict(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}
