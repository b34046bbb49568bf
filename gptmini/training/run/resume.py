"""Resuming and starting from weights: which checkpoint ``ckpt_path`` and ``model.init_from`` name, and whether a
run can continue from it. The resume checkpoint is read once, here (``read_resume``), and checked against the
config; once the data is prepared, against the data (``check_resumed_data``)."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from omegaconf import DictConfig, OmegaConf

from gptmini.fileio import name_too_long
from gptmini.model import GPTConfig
from gptmini.runs.checkpoint import CheckpointError
from gptmini.runs.discovery import newest_checkpoint, resolve_checkpoint
from gptmini.runs.record import read_record
from gptmini.training.errors import RunError

log = logging.getLogger(__name__)


def ckpt_path_last(output_root: str | Path, run_name: str) -> Path:
    """What ``ckpt_path=last`` resumes: :func:`gptmini.runs.discovery.newest_checkpoint`, the one rule every command uses (the
    most recently written last.ckpt or on_exception.ckpt of any run of ``run_name``, multirun jobs included);
    refused in one line when there is none."""
    found = newest_checkpoint(output_root, run_name)
    if found is None:
        raise RunError(
            f"ckpt_path=last but no checkpoint of run_name={run_name!r} was found under "
            f"{Path(output_root) / run_name}: train first, or pass ckpt_path=/path/to/file.ckpt (and the run's "
            "run_name and paths.output_root)"
        )
    return found


def resolve_ckpt_path(
    ckpt_path: Any, run_dir: str | Path, output_root: str | Path, run_name: str
) -> str | None:
    """The checkpoint a run resumes from: None (a fresh run); ``last``: the newest checkpoint of its run folder
    ``run_dir`` itself when that already holds one, else of any run of ``run_name``; else what
    :func:`gptmini.runs.discovery.resolve_checkpoint` makes of it, the rule of every command (a file; a run folder or
    a run name under ``output_root``: its newest checkpoint)."""
    if ckpt_path is None:
        return None
    if ckpt_path == "last":
        own = newest_checkpoint(run_dir)
        if own is not None:
            return str(own)
        return str(ckpt_path_last(output_root, run_name))
    try:  # a file, a run folder or a run name, as every command opens one
        return str(resolve_checkpoint(ckpt_path, output_root, option="ckpt_path"))
    except CheckpointError as err:
        raise RunError(str(err)) from None


def continued_run_folder(ckpt_path: str | Path) -> Path | None:
    """The run folder a resume checkpoint belongs to (``<run folder>/checkpoints/<file>``); None for a file
    elsewhere."""
    path = Path(ckpt_path).absolute()
    return path.parent.parent if path.parent.name == "checkpoints" else None


def resolve_init_from(init_from: str, output_root: str | Path) -> tuple[Literal["checkpoint", "hf"], str]:
    """``model.init_from``: a Hugging Face GPT-2 or Llama folder (it holds config.json), else a gptmini
    checkpoint as every command opens one (a file, a run folder, a run name under ``output_root``)."""
    if name_too_long(init_from) is None and (Path(init_from) / "config.json").is_file():
        return "hf", str(init_from)
    try:
        return "checkpoint", str(resolve_checkpoint(init_from, output_root, option="model.init_from"))
    except CheckpointError as err:
        raise RunError(
            f"{err} (or a local Hugging Face GPT-2 or Llama folder holding config.json and model.safetensors)"
        ) from None


def _world_size(trainer: Any) -> int | None:
    devices, nodes = trainer.get("devices", 1), trainer.get("num_nodes", 1)
    if isinstance(devices, int) and not isinstance(devices, bool) and isinstance(nodes, int):
        return max(devices, 1) * max(nodes, 1)
    return None  # "auto" or a list: known once the trainer exists


# What a checkpoint cannot be resumed under: the tokenizer (its token ids would mean other text). The model's shape
# is compared apart, with its tensors (gptmini.runs.checkpoint.check_resume_compatible).
FIXED_SETTINGS = ("tokenizer",)


def resume_changes(path: str | Path, saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """The resume's comparison of the settings a checkpoint's run recorded (``saved``) with this run's (``now``:
    the record's typed groups, ``plan.recorded_settings``; what places a run, its folders and processes, is not
    among them): a changed setting the checkpoint cannot continue under (``FIXED_SETTINGS``) is
    refused in one line; every other change is returned as ``key old -> new``, and takes effect from the first
    resumed step (the optimizer keeps this run's group settings, the schedule its own plan, the callbacks are
    this run's). A setting one of the two does not hold (another version's) is no change."""
    changes = [
        (key, was, new)
        for key in now  # in this run's order
        if key in saved
        for key, was, new in _differences(saved[key], now[key], key)
    ]
    fixed = [(k, was, new) for k, was, new in changes if k.split(".", 1)[0] in FIXED_SETTINGS]
    if fixed:
        desc = ", ".join(f"{k}: checkpoint {_shown(was)} vs now {_shown(new)}" for k, was, new in fixed)
        raise RunError(
            f"checkpoint {path} was trained with another tokenizer ({desc}): its token ids would mean other text. "
            "Resume with the tokenizer it was trained with, or start a new run without ckpt_path"
        )
    return [f"{k} {_shown(was)} -> {_shown(new)}" for k, was, new in changes]


def _in_folder(value: Any, saved_dir: str | None, output_dir: str) -> Any:
    """``value`` with the paths inside the checkpoint's run folder moved to this run's (every run has its own
    folder, which is no change of setting)."""
    if isinstance(value, Mapping):
        return {k: _in_folder(v, saved_dir, output_dir) for k, v in value.items()}
    if saved_dir and isinstance(value, str) and (value == saved_dir or value.startswith(saved_dir + os.sep)):
        return output_dir + value[len(saved_dir) :]
    return value


def _differences(saved: Any, now: Any, key: str) -> list[tuple[str, Any, Any]]:
    if isinstance(saved, Mapping) and isinstance(now, Mapping):
        return [d for k in now if k in saved for d in _differences(saved[k], now[k], f"{key}.{k}")]
    return [] if saved == now else [(key, saved, now)]


def _shown(value: Any) -> str:
    """A setting's value in the resume's line: a whole callback or node by its class."""
    if isinstance(value, Mapping):
        return str(value.get("_target_", "{...}")).rsplit(".", 1)[-1]
    return "null" if value is None else str(value)


def read_resume(
    cfg: DictConfig, model: GPTConfig, vocab_known: bool, now: Mapping[str, Any], output_dir: str
) -> tuple[str, dict[str, Any]] | None:
    """The checkpoint ``ckpt_path`` resumes, read once (memory-mapped, its checksum verified) and checked against
    the config: a training run's checkpoint (not weights alone), of this tokenizer (``resume_changes``, whose
    other changes are said in one line) and this model's shape (its vocabulary aside when the tokenizer's is not
    known yet), and one the run can continue (``check_resume_plan``). ``now``: this run's settings, laid out as
    its record's (``RunPlan.record``); ``output_dir``: its run folder. None: a fresh run."""
    path = resolve_ckpt_path(cfg.ckpt_path, output_dir, cfg.paths.output_root, cfg.run_name)
    if path is None:
        return None
    from gptmini.runs.checkpoint import check_resume_compatible, check_resume_optimizer, load_checkpoint

    ckpt = load_checkpoint(path, mmap=True)
    if "pytorch-lightning_version" not in ckpt or "optimizer_states" not in ckpt:
        raise RunError(
            f"ckpt_path={path} holds model weights only (a best.ckpt, imported from Hugging Face, or not written "
            "by a training run: no optimizer state, no progress), so there is no run to resume: resume from the "
            "run's last.ckpt (ckpt_path=last), or, to train from these weights with a fresh optimizer, start a new "
            f"run with model.init_from={path} and no ckpt_path"
        )
    record = read_record(ckpt)
    saved = _in_folder(dataclasses.asdict(record), record.output_dir, output_dir)
    changes = resume_changes(path, saved, now)
    check_resume_compatible(path, model.to_dict(), ignore=() if vocab_known else ("vocab_size",), ckpt=ckpt)
    check_resume_optimizer(path, ckpt, OmegaConf.to_container(cfg.optimizer, resolve=False) or {})
    check_resume_plan(path, ckpt, cfg)
    say_average_change(path, ckpt, cfg)
    if changes:
        log.info("resuming %s with this run's settings from its first step: %s", path, ", ".join(changes))
    return path, ckpt


def say_average_change(path: str, ckpt: dict[str, Any], cfg: DictConfig) -> None:
    """One log line when ``callbacks.ema`` differs from the checkpoint's run: the resume continues from the
    trained weights either way (``GPTLightningModule.on_load_checkpoint``), and what becomes of the average."""
    from gptmini.runs.checkpoint import TRAINED_WEIGHTS_KEY

    callbacks = cfg.get("callbacks") or {}
    node = callbacks.get("ema")
    now = OmegaConf.to_container(node, resolve=True) if node is not None else None
    saved_callbacks = read_record(ckpt).callbacks
    had = TRAINED_WEIGHTS_KEY in ckpt
    was = saved_callbacks.get("ema") if had else None
    if had and now is None:
        log.warning(
            "%s was trained with callbacks.ema and this run has none: it continues from the trained weights, and "
            "its checkpoints hold them without an average",
            path,
        )
    elif now is not None and not had:
        log.warning(
            "%s was trained without callbacks.ema: the average starts from its trained weights at step %s",
            path,
            ckpt.get("global_step"),
        )
    elif had and was is not None and was != now:
        log.warning(
            "callbacks.ema differs from the one %s was trained with (%s, now %s): the average continues under "
            "the new settings",
            path,
            was,
            now,
        )


def check_resumed_data(path: str, ckpt: dict[str, Any], data_dir: Path, meta: Any, model: GPTConfig) -> None:
    """Once the data is prepared: the checkpoint against it (another corpus or tokenizer is said, and another
    vocabulary refused before the shape check would name only its symptom), and against the model's full shape.
    The temp file a save of this host killed midway left in the resumed run's checkpoints folder (its writer is
    gone) is removed."""
    from gptmini.runs.checkpoint import check_resume_compatible, check_trained_data, remove_stale_temp_files

    other_data = check_trained_data(
        path,
        ckpt,
        data_dir,
        meta,
        other_data="warn",
        fix="resume with the data settings it was trained on, or start a new run without ckpt_path",
    )
    if other_data:
        log.warning("resuming on other data: %s; the run will differ from one never interrupted", other_data)
    check_resume_compatible(path, model.to_dict(), ckpt=ckpt)
    folder = Path(path).parent
    # only the checkpoints folder of a run (the one this run resumes), never a folder of the user's own
    if folder.name == "checkpoints" and (folder.parent / ".hydra").is_dir():
        for stale in remove_stale_temp_files(folder):
            log.info("removed %s, left by a save that was interrupted", stale)


def target_reached(ckpt: dict[str, Any]) -> tuple[int, float] | None:
    """The step and val/loss at which the run of ``ckpt`` reached its ``target_val_loss`` (None: it did not)."""
    from gptmini.training.callbacks.guards import TARGET_STATE_KEY

    state = (ckpt.get("callbacks") or {}).get(TARGET_STATE_KEY) or {}
    if state.get("reached_at") is None or state.get("val_loss") is None:
        return None
    return int(state["reached_at"]), float(state["val_loss"])


# the key of Lightning's Timer callback (trainer.max_time) in a checkpoint's callback states
TIMER_STATE_KEY = "Timer"


def check_time_left(path: str | Path, ckpt: dict[str, Any], max_time: str | None) -> None:
    """Refuses a resume whose ``trainer.max_time`` the checkpoint's run has already spent training (Lightning's
    Timer carries the seconds over and would stop at once, training nothing)."""
    from gptmini.training.loop.schedulers import max_time_seconds

    budget = max_time_seconds(max_time)
    timer = (ckpt.get("callbacks") or {}).get(TIMER_STATE_KEY) or {}
    spent = (timer.get("time_elapsed") or {}).get("train")
    if budget is None or not isinstance(spent, (int, float)) or spent < budget:
        return
    raise RunError(
        f"checkpoint {path} has already trained for {spent:.0f} s and trainer.max_time={max_time} allows "
        f"{budget:.0f} s: the run is finished and resuming would train nothing. To train on, resume with a larger "
        "trainer.max_time (the schedule is re-laid over it) or trainer.max_time=null; to evaluate it, use the "
        "eval command"
    )


def check_resume_plan(path: str | Path, ckpt: dict[str, Any], cfg: DictConfig) -> None:
    """Refuses a resume that would not continue the run: a checkpoint already at ``trainer.max_steps`` (nothing
    would train, and the run would report no validation), or another global batch (``data.batch_size``,
    ``trainer.accumulate_grad_batches`` or the number of training processes): the resumed data stream and the
    progress count are positions in batches of the checkpoint's size."""
    step = int(ckpt.get("global_step") or 0)
    target = cfg.get("target_val_loss")
    reached = target_reached(ckpt)
    if target is not None and reached is not None and reached[1] <= float(target):
        raise RunError(
            f"checkpoint {path} already reached target_val_loss={target} (val/loss {reached[1]:.4f} at step "
            f"{reached[0]}): the run is finished and resuming would stop at once. To train on, resume with "
            "target_val_loss=null (or a lower target); to evaluate it, use the eval command"
        )
    max_steps = int(cfg.trainer.max_steps)
    if step >= max_steps:
        raise RunError(
            f"checkpoint {path} is already at step {step} and trainer.max_steps={max_steps}: the run is finished "
            f"and resuming would train nothing. To train on, resume with a larger trainer.max_steps (e.g. "
            f"trainer.max_steps={max_steps + step}); to evaluate it, use the eval command"
        )
    check_time_left(path, ckpt, cfg.trainer.get("max_time"))
    saved = read_record(ckpt)
    saved_data, saved_trainer = saved.data, saved.trainer
    changes = []
    for key, was, now in (
        ("data.batch_size", saved_data.get("batch_size"), cfg.data.get("batch_size")),
        (
            "trainer.accumulate_grad_batches",
            saved_trainer.get("accumulate_grad_batches", 1 if saved_trainer else None),
            cfg.trainer.get("accumulate_grad_batches", 1),
        ),
        (
            "training processes (trainer.devices x trainer.num_nodes)",
            saved.world_size,
            _world_size(cfg.trainer),
        ),
    ):
        if was is not None and now is not None and was != now:
            changes.append(f"{key}: checkpoint {was} vs now {now}")
    if changes:
        raise RunError(
            f"checkpoint {path} was trained with another batch ({'; '.join(changes)}): resuming would continue its "
            "data stream at the wrong place and count steps against the wrong epoch. Resume with the checkpoint's "
            f"settings, or start a new run from its weights (a fresh optimizer and schedule) with model.init_from={path}"
        )
