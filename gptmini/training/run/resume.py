"""Resuming and starting from weights: which checkpoint ``ckpt_path`` and ``model.init_from`` name, and whether a
run can continue from it. The resume checkpoint is read once, here (``read_resume``), and compared with the plan
through one table (``RESUME_POLICY``); once the data is prepared, with the data (``check_resumed_data``)."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import torch

from gptmini.fileio import name_too_long
from gptmini.model import GPT, GPTConfig
from gptmini.runs.checkpoint import CheckpointError
from gptmini.runs.discovery import newest_checkpoint, resolve_checkpoint
from gptmini.runs.record import read_record
from gptmini.training.errors import RunError
from gptmini.training.hardware import trainer_processes

log = logging.getLogger(__name__)


def resolve_ckpt_path(
    ckpt_path: Any, run_dir: str | Path, output_root: str | Path, run_name: str
) -> str | None:
    """The checkpoint a run resumes from: None (a fresh run); ``last``: the newest of its run folder ``run_dir``
    when that holds one, else of any run of ``run_name`` under ``output_root``; else what every command makes of
    it (``resolve_checkpoint``)."""
    if ckpt_path is None:
        return None
    if ckpt_path == "last":
        found = newest_checkpoint(run_dir) or newest_checkpoint(output_root, run_name)
        if found is None:
            raise RunError(
                f"ckpt_path=last but no checkpoint of run_name={run_name!r} was found under "
                f"{Path(output_root) / run_name}: train first, or pass ckpt_path=/path/to/file.ckpt (and the run's "
                "run_name and paths.output_root)"
            )
        return str(found)
    try:  # a file, a run folder or a run name, as every command opens one
        return str(resolve_checkpoint(ckpt_path, output_root, option="ckpt_path"))
    except CheckpointError as err:
        raise RunError(str(err)) from None


def continued_run_folder(ckpt_path: str | Path) -> Path | None:
    """The run folder of a resume checkpoint (``<run folder>/checkpoints/<file>``); None for a file elsewhere."""
    path = Path(ckpt_path).absolute()
    return path.parent.parent if path.parent.name == "checkpoints" else None


def resolve_init_from(init_from: str, output_root: str | Path) -> tuple[Literal["checkpoint", "hf"], str]:
    """``model.init_from``: a Hugging Face GPT-2, Llama or Qwen3 folder (it holds config.json), else a gptmini
    checkpoint as every command opens one (a file, a run folder, a run name under ``output_root``)."""
    if name_too_long(init_from) is None and (Path(init_from) / "config.json").is_file():
        return "hf", str(init_from)
    try:
        return "checkpoint", str(resolve_checkpoint(init_from, output_root, option="model.init_from"))
    except CheckpointError as err:
        raise RunError(
            f"{err} (or a local Hugging Face GPT-2, Llama or Qwen3 folder holding config.json and model.safetensors)"
        ) from None


# --- the resume's one table: what a resume does with each setting it changes ------------------------------------

# A refusal's kind: what the checkpoint was trained with, why it cannot continue under another, and whether its
# weights can start a new run of these settings (model.init_from).
REFUSALS = {
    "model": ("model shape", "its weights are another model's", False),
    "tokenizer": ("tokenizer", "its token ids would mean other text", False),
    "optimizer": (
        "optimizer",
        "its saved optimizer state (moments, Muon's groups) fits no other optimizer",
        True,
    ),
    "batch": ("batch", "its data stream and step count are positions in batches of its size", True),
}
OBEY, SAY = "obey", "say"  # obey: from the first resumed step, silently; say: the same, named in one line
# Every setting of the run record (gptmini.runs.record.RunRecord), dotted: obey, say, or a refusal's kind. "group.*"
# covers the settings of a group not named apart (an optimizer's, the trainer's, the callbacks'); the model's are
# each named (tests/unit/training/test_resume_policy.py). docs/resume.md is this table (scripts/resume_page.py).
RESUME_POLICY = {
    **{f"model.{f.name}": "model" for f in dataclasses.fields(GPTConfig) if f.init},
    "model.dropout": SAY,  # it acts in training only
    "model.loss": OBEY,  # the kernels: the same weights, computed another way (a CPU run resumed on a GPU)
    "model.fused_ops": OBEY,
    "tokenizer.*": "tokenizer",
    "data.batch_size": "batch",
    "data.*": SAY,  # another corpus is said once the data is prepared (check_resumed_data)
    "data_identity.*": SAY,  # the same, and another tokenization refused (check_resumed_data)
    "trainer.accumulate_grad_batches": "batch",
    "world_size": "batch",
    "trainer.*": SAY,  # the schedule follows this run's max_steps and max_time
    "optimizer._target_": "optimizer",
    "optimizer.*": SAY,  # this run's group settings (lr, weight decay) over the saved state
    "scheduler.*": SAY,  # laid over this run's plan from the checkpoint's step
    "callbacks.*": SAY,  # this run's (callbacks.ema: say_average_change says what becomes of the average)
    "seed": SAY,  # the data order is the checkpoint's stream; dropout draws from the restored generator
    **dict.fromkeys(("version", "run_name", "hardware", "precision", "overrides", "init_from"), OBEY),
    **dict.fromkeys(("tokens_per_step", "tensorboard_dir", "output_dir", "continued_from"), OBEY),
}
SHOWN_AS = {"world_size": "training processes (trainer.devices x trainer.num_nodes)"}
# Optimizer classes a checkpoint may name by an earlier module path: the same class, so its state resumes.
MOVED_OPTIMIZERS = {"gptmini.training.optimizers.MuonAdamW": "gptmini.training.loop.optimizers.MuonAdamW"}


def resume_policy(key: str) -> str:
    """What a resume does with a change of the record's setting ``key`` (``RESUME_POLICY``); KeyError: none."""
    return RESUME_POLICY.get(key) or RESUME_POLICY[key.split(".", 1)[0] + ".*"]


def resume_changes(path: str | Path, saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """The resume's one comparison of the settings a checkpoint's run recorded (``saved``) with this run's
    (``now``, laid out as its record), through ``RESUME_POLICY``: the changes it refuses in one line (the first
    kind's); those it says, returned as ``key old -> new``. A setting one of the two does not hold (another
    version's) is no change."""
    changes = [
        (key, was, new, resume_policy(key))
        for group in now  # in this run's order
        if group in saved
        for key, was, new in _differences(saved[group], now[group], group)
    ]
    refused = [c for c in changes if c[3] in REFUSALS]
    if refused:
        kind = refused[0][3]
        desc = ", ".join(
            f"{SHOWN_AS.get(k, k)}: checkpoint {_shown(a)} vs now {_shown(b)}"
            for k, a, b, p in refused
            if p == kind
        )
        what, why, weights_fit = REFUSALS[kind]
        raise RunError(
            f"checkpoint {path} was trained with another {what} ({desc}): {why}. Resume with the settings it was "
            "trained with, or start a new run "
            + (f"from its weights with model.init_from={path}" if weights_fit else "without ckpt_path")
        )
    return [f"{k} {_shown(was)} -> {_shown(new)}" for k, was, new, policy in changes if policy == SAY]


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
    ckpt_path: str | None,
    plan: Any,  # the run's plan (plan.RunPlan, which imports this module), its resume not read yet
    target_val_loss: float | None,
) -> tuple[str, dict[str, Any]] | None:
    """The checkpoint ``ckpt_path`` resumes, read once (memory-mapped, its checksum verified) and checked against
    this run's ``plan``: a training run's checkpoint (not weights alone) whose tensors fit its own model settings,
    every change of setting through the one table (``resume_changes``: the model's vocabulary aside when the
    tokenizer's is not known yet), and one the run can continue (``check_resume_plan``). None: a fresh run."""
    path = resolve_ckpt_path(ckpt_path, plan.output_dir, plan.output_root, plan.run_name)
    if path is None:
        return None
    from gptmini.runs.checkpoint import check_tensors_match, load_checkpoint

    ckpt = load_checkpoint(path, mmap=True)
    if "pytorch-lightning_version" not in ckpt or "optimizer_states" not in ckpt:
        raise RunError(
            f"ckpt_path={path} holds model weights only (a best.ckpt, imported from Hugging Face, or not written "
            "by a training run: no optimizer state, no progress), so there is no run to resume: resume from the "
            "run's last.ckpt (ckpt_path=last), or, to train from these weights with a fresh optimizer, start a new "
            f"run with model.init_from={path} and no ckpt_path"
        )
    saved = _saved(path, ckpt, plan.output_dir)
    with torch.device("meta"):  # no memory, no initialisation
        check_tensors_match(ckpt["state_dict"], GPT(GPTConfig.from_dict(saved["model"])), path)
    now = plan.settings()  # laid out as the record's
    # the vocabulary only once it is not a placeholder; the processes only where the checkpoint recorded them
    model_now = {k: v for k, v in plan.model.to_dict().items() if plan.vocab_known or k != "vocab_size"}
    processes = saved["world_size"] and trainer_processes(now["trainer"])
    changes = resume_changes(path, saved, {"model": model_now, "world_size": processes, **now})
    check_resume_plan(path, ckpt, plan.trainer.max_steps, plan.trainer.max_time, target_val_loss)
    say_average_change(path, ckpt, plan.callbacks.get("ema"))
    if changes:
        log.info("resuming %s with this run's settings from its first step: %s", path, ", ".join(changes))
    return path, {"global_step": ckpt.get("global_step"), "record": saved}


def _saved(path: str, ckpt: Mapping[str, Any], output_dir: str) -> dict[str, Any]:
    """The checkpoint's record as the resume compares it: its paths in its run folder moved to this run's, its
    model's settings that it lacks (an earlier version's) at their defaults, its optimizer by its class's path now."""
    record = read_record(ckpt)
    saved = _in_folder(dataclasses.asdict(record), record.output_dir, output_dir)
    saved["model"] = GPTConfig.from_dict(dict(saved["model"])).to_dict()
    target = saved["optimizer"].get("_target_")
    if target in MOVED_OPTIMIZERS:
        saved["optimizer"] = {**saved["optimizer"], "_target_": MOVED_OPTIMIZERS[target]}
    return saved


def say_average_change(path: str, ckpt: Mapping[str, Any], now: Any) -> None:
    """One log line when ``callbacks.ema`` (``now``: this run's) is added or dropped, saying what becomes of the
    average (a changed one is said with the other changes)."""
    from gptmini.runs.checkpoint import TRAINED_WEIGHTS_KEY

    had = TRAINED_WEIGHTS_KEY in ckpt
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


def check_resumed_data(
    path: str, saved: Mapping[str, Any], data_dir: Path, meta: Any, model: GPTConfig
) -> None:
    """Once the data is prepared: the checkpoint against it (another corpus or tokenizer is said, and another
    vocabulary refused before the shape check would name only its symptom), and against the model's full shape.
    The temp file a save of this host killed midway left in the resumed run's checkpoints folder (its writer is
    gone) is removed."""
    from gptmini.runs.checkpoint import check_trained_data, remove_stale_temp_files

    other_data = check_trained_data(
        path,
        saved["data_identity"],
        data_dir,
        meta,
        other_data="warn",
        fix="resume with the data settings it was trained on, or start a new run without ckpt_path",
    )
    if other_data:
        log.warning("resuming on other data: %s; the run will differ from one never interrupted", other_data)
    resume_changes(path, {"model": saved["model"]}, {"model": model.to_dict()})
    folder = Path(path).parent
    # only the checkpoints folder of a run (the one this run resumes), never a folder of the user's own
    if folder.name == "checkpoints" and (folder.parent / ".hydra").is_dir():
        for stale in remove_stale_temp_files(folder):
            log.info("removed %s, left by a save that was interrupted", stale)


def check_resume_plan(
    path: str | Path, ckpt: Mapping[str, Any], max_steps: int, max_time: Any, target: float | None
) -> None:
    """Refuses a resume that would train nothing: a checkpoint already at its ``target_val_loss``, at
    ``trainer.max_steps`` (and the run would report no validation), or past its time budget (Lightning's Timer
    carries the seconds over and would stop at once)."""
    from gptmini.training.callbacks.guards import TARGET_STATE_KEY
    from gptmini.training.loop.schedulers import max_time_seconds

    step = int(ckpt.get("global_step") or 0)
    states = ckpt.get("callbacks") or {}
    reached = states.get(TARGET_STATE_KEY) or {}
    loss = reached.get("val_loss")
    if (
        target is not None
        and reached.get("reached_at") is not None
        and loss is not None
        and loss <= float(target)
    ):
        raise RunError(
            f"checkpoint {path} already reached target_val_loss={target} (val/loss {float(loss):.4f} at step "
            f"{int(reached['reached_at'])}): the run is finished and resuming would stop at once. To train on, resume "
            "with target_val_loss=null (or a lower target); to evaluate it, use the eval command"
        )
    if step >= max_steps:
        raise RunError(
            f"checkpoint {path} is already at step {step} and trainer.max_steps={max_steps}: the run is finished "
            f"and resuming would train nothing. To train on, resume with a larger trainer.max_steps (e.g. "
            f"trainer.max_steps={max_steps + step}); to evaluate it, use the eval command"
        )
    budget = max_time_seconds(max_time)
    # Lightning's Timer (trainer.max_time) keeps its state under its class's name
    spent = ((states.get("Timer") or {}).get("time_elapsed") or {}).get("train")
    if budget is not None and isinstance(spent, (int, float)) and spent >= budget:
        raise RunError(
            f"checkpoint {path} has already trained for {spent:.0f} s and trainer.max_time={max_time} allows "
            f"{budget:.0f} s: the run is finished and resuming would train nothing. To train on, resume with a "
            "larger trainer.max_time (the schedule is re-laid over it) or trainer.max_time=null; to evaluate it, "
            "use the eval command"
        )
