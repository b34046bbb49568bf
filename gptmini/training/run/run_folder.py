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

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback as HydraCallback
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from gptmini.fileio import RUN_LOCK, hold_folder, name_too_long, unwritable_reason
from gptmini.runs.discovery import task_overrides, tensorboard_label
from gptmini.training.errors import RunError
from gptmini.training.hardware import trainer_processes
from gptmini.training.run.override_errors import EXIT_USER_ERROR, raw_value, unresolvable
from gptmini.training.run.resume import continued_run_folder, resolve_ckpt_path
from gptmini.training.run.schema import PathsSchema, PerfSchema, settings

# A run name is one folder name under paths.output_root: no separators, no "..", nothing hidden.
RUN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.,=+@-]*")
# what RUN_NAME allows, for the refusals
NAME_RULE = "letters, digits and _ . , = + @ - (not starting with '.' or '-', no '/' and no '..')"


def check_one_folder(
    key: str, value: Any, meaning: str = "one folder under paths.output_root", end: str = ""
) -> None:
    """Refuses a ``value`` of ``key`` (``run_name``, a logger's folder) that is not one plain folder name: ``../x``
    would write outside the folder it belongs in, and ``ckpt_path=last`` could not find a run named so again."""
    text = str(value)
    if not RUN_NAME.fullmatch(text) or ".." in text or len(text) > 200:
        raise RunError(
            f"{key}={text!r} is invalid: it names {meaning}, so it may hold {NAME_RULE}, e.g. {key}=my_run{end}"
        )


def check_tensorboard_version(config: DictConfig) -> None:
    """Refuses a logger's ``name`` or ``version`` that is not one plain folder name, as ``run_name``
    (``../../x`` would write events outside the run folder); null (no folder, or the run's own label), an empty
    name and a version number are fine."""
    for key, node in (config.get("logger") or {}).items():
        if not isinstance(node, DictConfig):
            continue
        for field, meaning in (
            ("name", "the folder of the run's TensorBoard runs"),
            ("version", "one folder of the run's TensorBoard runs"),
        ):
            value = node.get(field)
            if (
                value is None
                or value == ""
                or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)
            ):
                continue
            end = ", or null" + (" for the run's own name" if field == "version" else "")
            check_one_folder(f"logger.{key}.{field}", value, meaning, end)


def command_overrides() -> list[str]:
    """The run's command-line overrides as Hydra recorded them (a sweep job's own included); [] outside Hydra."""
    hydra = hydra_config()
    return [str(o) for o in hydra.overrides.task] if hydra else []


def hydra_config() -> Any:
    """Hydra's config of the run in progress; None outside one (a config composed without Hydra's run)."""
    return HydraConfig.get() if HydraConfig.initialized() else None


def resume_command(output_dir: str | Path) -> str | None:
    """What to type to resume the run in ``output_dir``, quoted for a shell: ``gptmini train`` with the run's own
    overrides and a ``ckpt_path`` naming its folder (its newest checkpoint, never another run's of the same name).
    None when the folder holds no checkpoint."""
    from gptmini.runs.discovery import newest_checkpoint

    if newest_checkpoint(output_dir) is None:
        return None
    own = [o for o in command_overrides() if o.split("=", 1)[0].lstrip("+~") != "ckpt_path"]
    return shlex.join(["gptmini", "train", *own, f"ckpt_path={Path(output_dir).resolve()}"])


def tensorboard_place(node: Mapping[str, Any], run_name: str, resumed_at: int | None) -> dict[str, str]:
    """The ``version`` of the TensorBoard logger of config ``node``, unless the node names one itself: the run's
    label under the node's ``save_dir``/``name`` (``<run folder>/tb/<run_name>,<overrides>``), a continuation's
    with ``resumed_at=<step>`` among its overrides: a TensorBoard run of its own, in any folder."""
    if node.get("version") is not None:
        return {}
    overrides = task_overrides(command_overrides())
    if resumed_at is not None:
        overrides = (*overrides, f"resumed_at={resumed_at}")
    return {"version": tensorboard_label(str(run_name), overrides)}


# What a run writes into its folder: one of these there means the folder already holds a run.
RUN_FILES = (".hydra", "checkpoints", "tb", "train.log")


def check_run_folder_free(folder: str | Path, continued: str | None, key: str) -> None:
    """A run never writes into a folder that already holds something (another run's checkpoints, logs and
    TensorBoard events would be mixed with its own, and Lightning would silently resume the old ``last.ckpt``),
    unless it resumes the run of that folder (``continued``: the checkpoint it resumes, resolved; None: a fresh
    run). An empty folder is used."""
    path = Path(folder)
    if not path.is_dir():
        return
    if continued is not None and continued_run_folder(continued) == path.absolute():
        return
    contents = sorted(p.name for p in path.iterdir() if p.name != RUN_LOCK)
    if not contents:
        return
    held = [name for name in RUN_FILES if name in contents]
    what = (
        f"already holds a run ({', '.join(held)})" if held else f"is not empty ({', '.join(contents[:3])}...)"
    )
    raise RunError(
        f"the run folder {folder} {what}, and this run resumes {continued}, another run's: a resume writes only "
        f"into a new folder or the folder of the run it continues. Leave {key} unset (a new folder), or name a new one"
        if continued is not None
        else f"the run folder {folder} {what}: a new run never writes into it. Resume that run with ckpt_path=last "
        f"{key}={folder} (or ckpt_path={folder}), or start a new run in a folder of its own (another run_name, "
        f"or leave {key} unset)"
    )


def _continued(config: DictConfig, folder: str) -> str | None:
    """The checkpoint ``ckpt_path`` resumes, resolved as the plan does (a RunError where there is none); None for a
    fresh run, and where ``paths.output_root`` does not resolve (the plan says why)."""
    ckpt_path = config.get("ckpt_path")
    if ckpt_path is None:
        return None
    try:
        return resolve_ckpt_path(
            ckpt_path,
            folder,
            str(OmegaConf.select(config, "paths.output_root", throw_on_resolution_failure=True)),
            str(config.get("run_name")),
        )
    except OmegaConfBaseException:
        return None


def _refuse(err: RunError) -> None:
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        raise err
    # Hydra has not set up logging yet: the one line goes to stderr as the app's own errors do.
    sys.stderr.write(f"error: {err}\n")
    sys.exit(EXIT_USER_ERROR)


# Set by the first process of a run of several (trainer.devices x trainer.num_nodes) before Lightning starts the
# others from it, inherited by them: "<its process id>:<the run folder>". A process whose parent wrote it for its
# own run folder is one of those, and shares the folder its parent checked and holds.
LAUNCHED_BY = "GPTMINI_LAUNCHED_BY"


def _launcher_says_several() -> bool:
    """The environment of a process that torchrun, srun or Lightning started as one of several."""

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


def shares_its_folder(trainer: Any, run_dir: str | Path) -> bool:
    """This process is one of a run of several processes that share one run folder (``run_dir``, Hydra's), which
    the launch names (torchrun, srun: ``hydra.run.dir``) or the first process checked and holds (the others
    Lightning starts from it): only a lone process, or that first one, checks that its folder is free. Told by
    what the trainer launches (``trainer_processes``), not by a launcher's variables alone, which a shell or a
    batch allocation may hold for a run of one process."""
    if trainer_processes(trainer) <= 1:
        return False
    mark = os.environ.get(LAUNCHED_BY, "")
    parent, _, where = mark.partition(":")
    if parent == str(os.getppid()) and where == os.path.abspath(run_dir):
        return True  # started by the first process of this run
    return _launcher_says_several()


def _check_folder(config: DictConfig, folder: str, key: str, fix: str, shared: bool) -> None:
    """The run folder ``folder`` (named by ``key``; ``fix``: the setting that moves it) has a name the filesystem
    takes and can be created; unless ``shared`` (``shares_its_folder``), it holds no other run and is held for
    this one: of two runs started together (both found it free), the second is refused."""
    if name_too_long(folder):
        also = f" (or {key})" if key != fix else ""
        raise RunError(
            f"the run folder {folder[:80]}...: {name_too_long(folder)}; pass a shorter {fix}{also}"
        )
    reason = unwritable_reason(folder)
    if reason is not None:
        raise RunError(f"cannot create the run folder {folder}: {reason}; pass {fix}=<a writable folder>")
    if shared:
        return
    check_run_folder_free(folder, _continued(config, folder), key)
    try:
        holder = hold_folder(folder)
    except OSError as err:  # what the permission bits do not tell (a read-only mount, /proc, a full disk)
        raise RunError(
            f"cannot create the run folder {folder}: {err.strerror or err}; pass a writable paths.output_root (or {key})"
        ) from None
    if holder is not None:
        raise RunError(
            f"another gptmini run (process {holder}) is training in the run folder {folder}: wait for it to "
            f"end, or start this run in a folder of its own (another run_name, or leave {key} unset)"
        )


def _check_kept_settings(config: DictConfig) -> None:
    """``~paths`` or ``~perf`` drops settings every run reads (the run folder is named from ``paths``)."""
    for name, kind in (("paths", PathsSchema), ("perf", PerfSchema)):
        if config.get(name) is None:
            raise RunError(
                f"~{name} drops the {name} settings, which every run needs: keep them and set the ones to change "
                f"instead ({', '.join(f'{name}.{k}=...' for k in settings(kind))})"
            )


def _run_folder(config: DictConfig, key: str) -> str:
    """The run folder ``key`` names, one ``error:`` line (exit status 2) where it does not resolve."""
    try:
        _check_kept_settings(config)
        root = str(OmegaConf.select(config, "paths.output_root", throw_on_resolution_failure=True))
        if not root.strip() or not os.path.normpath(os.path.abspath(root)).strip("/"):
            raise RunError(
                f"paths.output_root={root!r} would put the runs at the filesystem root: pass a folder of its own, "
                "e.g. paths.output_root=outputs (an ${oc.env:VAR} whose variable is empty or unset gives '')"
            )
        return str(OmegaConf.select(config, key, throw_on_resolution_failure=True))
    except OmegaConfBaseException as err:
        _refuse(unresolvable(err, config))
    except RunError as err:
        _refuse(err)
    raise AssertionError  # (_refuse exits)


# Set by a run's start for the clean-up of a failed one: the outermost folder of the run folder's path that did
# not exist before it ("": every one did), which the clean-up may remove when empty.
MADE_FOLDERS = "GPTMINI_MADE_FOLDERS"


def _check_run_start(config: DictConfig, key: str) -> None:
    folder = _run_folder(config, key)
    missing = Path(os.path.abspath(folder))
    while not missing.parent.exists() and missing.parent != missing:
        missing = missing.parent
    os.environ[MADE_FOLDERS] = "" if missing.exists() else str(missing)
    trainer = config.get("trainer")
    try:
        check_one_folder("run_name", config.get("run_name"))
        check_tensorboard_version(config)
        shared = shares_its_folder(trainer, folder)
        _check_folder(config, folder, key, "paths.output_root", shared)
    except RunError as err:
        _refuse(err)
    if shared:
        return
    if trainer_processes(trainer) > 1:
        # for the processes Lightning starts from this one
        os.environ[LAUNCHED_BY] = f"{os.getpid()}:{os.path.abspath(folder)}"


def hold_output_dir(cfg: DictConfig) -> None:
    """``paths.output_dir`` pointing elsewhere than Hydra's run folder (which ``OutputFolderCheck`` checked and
    holds) gets the same checks and lock: whatever key points a new run at a folder holding another, it is refused
    (in a sweep, every job after the first that shares it)."""
    hydra = hydra_config()
    if hydra is None:
        return
    hydra_dir = str(hydra.runtime.output_dir)
    folder = str(cfg.paths.output_dir)
    if os.path.abspath(folder) == os.path.abspath(hydra_dir):
        return
    shared = shares_its_folder(cfg.get("trainer"), str(hydra.run.dir))
    _check_folder(cfg, folder, "paths.output_dir", "paths.output_dir", shared)


def refuse_shared_sweep_folder(config: DictConfig) -> None:
    """A sweep (``-m``) with one ``paths.output_dir`` for all its jobs would put every job's checkpoints and
    events into one folder: refused before the first job."""
    raw = raw_value(config, "paths.output_dir")
    if raw is None or "${" in str(raw):
        return  # Hydra's folder of each job, or a value that depends on the job (checked per job)
    _refuse(
        RunError(
            f"paths.output_dir={raw} in a sweep (-m) would put every job's checkpoints and events into one folder: "
            "leave paths.output_dir unset (each job gets a folder of its own under hydra.sweep.dir), or set "
            f"hydra.sweep.dir={raw}"
        )
    )


class OutputFolderCheck(HydraCallback):
    """The checks of the module docstring, as a Hydra callback (``hydra.callbacks`` in conf/train.yaml): each
    refusal is one ``error:`` line and exit status 2, the existing folder untouched."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _check_run_start(config, "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        refuse_shared_sweep_folder(config)
        _check_run_start(config, "hydra.sweep.dir")
