"""The run folder: a ``run_name`` that is one folder name, a folder that holds no other run, and one that can be
created, each checked by a Hydra callback (``OutputFolderCheck``) before Hydra creates or writes anything; and
where in it the TensorBoard run goes, named after what the run is (``tensorboard_place``)."""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback as HydraCallback
from omegaconf import DictConfig

from gptmini.fileio import RUN_LOCK, hold_folder, name_too_long, unwritable_reason
from gptmini.runs.discovery import task_overrides, tensorboard_label
from gptmini.training.errors import RunError

# A run name is one folder name under paths.output_root: no separators, no "..", nothing hidden.
RUN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.,=+@-]*")


def check_run_name(name: Any) -> None:
    """Refuses a ``run_name`` that is not one plain folder name (``../x`` would write outside the output root,
    and ``last`` could not find it again)."""
    text = str(name)
    if not RUN_NAME.fullmatch(text) or ".." in text or len(text) > 200:
        raise RunError(
            f"run_name={text!r} is invalid: it names one folder under paths.output_root, so it may hold letters, "
            "digits and _ . , = + @ - (not starting with '.' or '-', no '/' and no '..'), e.g. run_name=my_run"
        )


def check_tensorboard_version(config: DictConfig) -> None:
    """Refuses a logger's ``version`` that is not one plain folder name, as ``run_name`` (``../../x`` would write
    events outside the run folder); null (the run's own label) and a version number are fine."""
    for key, node in (config.get("logger") or {}).items():
        version = node.get("version") if isinstance(node, DictConfig) else None
        if version is None or (isinstance(version, int) and not isinstance(version, bool) and version >= 0):
            continue
        text = str(version)
        if not RUN_NAME.fullmatch(text) or ".." in text or len(text) > 200:
            raise RunError(
                f"logger.{key}.version={text!r} is invalid: it names one folder of the run's TensorBoard runs, so "
                "it may hold letters, digits and _ . , = + @ - (not starting with '.' or '-', no '/' and no '..'), "
                f"e.g. logger.{key}.version=my_run, or null for the run's own name"
            )


def command_overrides() -> list[str]:
    """The run's command-line overrides as Hydra recorded them (``hydra.overrides.task``; a sweep job's own
    values included), [] outside a Hydra run."""
    from hydra.core.hydra_config import HydraConfig

    return [str(o) for o in HydraConfig.get().overrides.task] if HydraConfig.initialized() else []


def resume_command(output_dir: str | Path) -> str | None:
    """What to type to resume the run in ``output_dir``, quoted for a shell: ``gptmini train`` with the run's own
    overrides and a ``ckpt_path`` naming its folder (its newest checkpoint, never another run's of the same name).
    None when the folder holds no checkpoint."""
    from gptmini.runs.discovery import newest_checkpoint

    if newest_checkpoint(output_dir) is None:
        return None
    own = [o for o in command_overrides() if o.split("=", 1)[0].lstrip("+~") != "ckpt_path"]
    return shlex.join(["gptmini", "train", *own, f"ckpt_path={Path(output_dir).resolve()}"])


def tensorboard_place(node: Mapping[str, Any], run_name: str, continued: str | None) -> dict[str, str]:
    """Where the TensorBoard logger of config ``node`` writes, as its ``save_dir``, ``name`` and ``version``:
    a resumed run's ``continued`` folder (the run it resumes: one run, one curve); else the run's label under
    the node's ``save_dir``/``name`` (``<run folder>/tb/<run_name>,<overrides>``) unless the node names a
    ``version`` itself."""
    if continued is not None:
        folder = Path(continued)
        return {"save_dir": str(folder.parent.parent), "name": folder.parent.name, "version": folder.name}
    if node.get("version") is not None:
        return {}
    return {"version": tensorboard_label(str(run_name), task_overrides(command_overrides()))}


# What a run writes into its folder: one of these there means the folder already holds a run.
RUN_FILES = (".hydra", "checkpoints", "tb", "train.log")


def check_run_folder_free(folder: str | Path, ckpt_path: Any, key: str) -> None:
    """A new run never writes into a folder that already holds something (another run's checkpoints, logs and
    TensorBoard events would be mixed with its own, and Lightning would silently resume the old ``last.ckpt``):
    refused unless the run resumes (``ckpt_path`` set), naming both ways out. An empty folder is used."""
    path = Path(folder)
    if ckpt_path is not None or not path.is_dir():
        return
    contents = sorted(p.name for p in path.iterdir() if p.name != RUN_LOCK)
    if not contents:
        return
    held = [name for name in RUN_FILES if name in contents]
    what = (
        f"already holds a run ({', '.join(held)})" if held else f"is not empty ({', '.join(contents[:3])}...)"
    )
    raise RunError(
        f"the run folder {folder} {what}: a new run never writes into it. Resume that run with ckpt_path=last "
        f"{key}={folder} (or ckpt_path={folder}), or start a new run in a folder of its own (another run_name, "
        f"or leave {key} unset)"
    )


def _refuse(err: RunError) -> None:
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        raise err
    # Hydra has not set up logging yet: the one line goes to stderr as the app's own errors do.
    sys.stderr.write(f"error: {err}\n")
    sys.exit(2)  # EXIT_USER_ERROR


def _refuse_unwritable(folder: str, key: str) -> None:
    reason = unwritable_reason(folder)
    if reason is not None:
        _refuse(RunError(f"cannot create the run folder {folder}: {reason}; pass {key}=<a writable folder>"))


def _one_of_several_processes() -> bool:
    """This process is one of a distributed launch (torchrun, srun, or a DDP process Lightning started in the
    first one's run folder): they share one run folder, which the launch names (hydra.run.dir) or the first
    process checked, so only a lone process checks that its folder is free."""

    def number(var: str, default: int) -> int:
        try:
            return int(os.environ.get(var, default))
        except ValueError:
            return default

    return (
        number("WORLD_SIZE", 1) > 1
        or number("SLURM_NTASKS", 1) > 1
        or any(number(v, 0) != 0 for v in ("RANK", "LOCAL_RANK", "SLURM_PROCID"))
    )


def _check_run_start(config: DictConfig, folder: str, key: str) -> None:
    try:
        check_run_name(config.get("run_name"))
        check_tensorboard_version(config)
        if name_too_long(folder):
            raise RunError(
                f"the run folder {folder[:80]}...: {name_too_long(folder)}; pass a shorter paths.output_root (or {key})"
            )
    except RunError as err:
        _refuse(err)
    _refuse_unwritable(folder, "paths.output_root")
    if _one_of_several_processes():
        return
    try:
        check_run_folder_free(folder, config.get("ckpt_path"), key)
        # one run at a time in a folder: of two started together (both found it free), the second is refused here
        holder = hold_folder(folder)
        if holder is not None:
            raise RunError(
                f"another gptmini run (process {holder}) is training in the run folder {folder}: wait for it to "
                f"end, or start this run in a folder of its own (another run_name, or leave {key} unset)"
            )
    except RunError as err:
        _refuse(err)


class OutputFolderCheck(HydraCallback):
    """A Hydra callback (``hydra.callbacks`` in conf/train.yaml), run before Hydra creates or writes anything:
    a ``run_name`` that is not one folder name, a run folder that already holds a run (unless resuming), and a
    run folder that cannot be created (an unwritable ``paths.output_root``, or a file in its place) each fail with
    one ``error:`` line and exit status 2, the existing folder untouched."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check_run_start(config, str(config.hydra.run.dir), "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check_run_start(config, str(config.hydra.sweep.dir), "hydra.sweep.dir")
