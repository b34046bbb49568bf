"""Hydra's errors about the command line, restated as one ``error:`` line naming the override and the fix.

Hydra prints a bad override as several lines, and for a key the config lacks suggests ``+key=value`` (adding a
key), which is the wrong fix for a misspelt or misplaced setting: ``optimizer.lr=inf`` under the default
``optimizer=muon``, whose learning rates are ``optimizer.hidden.lr``, ``optimizer.embedding.lr``, ... To restate
them, Hydra is asked to raise its composition errors (until :class:`ComposedCallback`) and :func:`run_hydra` turns
them into one line."""

from __future__ import annotations

import difflib
import functools
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

import yaml
from hydra.errors import (
    ConfigCompositionException,
    MissingConfigException,
    OverrideParseException,
    SearchPathException,
)
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationToMissingValueError, OmegaConfBaseException

from gptmini.training.errors import RunError

# the exit status of every refused input (docs/reliability.md): invalid config or input, nothing was trained;
# Hydra's command-line errors included
EXIT_USER_ERROR = 2
_FULL_ERROR = "HYDRA_FULL_ERROR"
# set beside HYDRA_FULL_ERROR when run_hydra set it (not the user), so that it is removed again
_SET_BY_GPTMINI = "GPTMINI_RESTATES_HYDRA_ERRORS"


def _override(argv: Sequence[str], key: str) -> str:
    """The command-line override of ``key`` or of a key below it, as typed (``optimizer.lr=inf``), else ``key``."""
    for arg in argv:
        name = arg.lstrip("+~").split("=", 1)[0]
        if name == key or name.startswith(key + "."):
            return arg
    return key


def _settings_named(node: Any, leaf: str, prefix: str) -> list[str]:
    """The full keys under ``node`` whose last part is ``leaf`` (``optimizer.hidden.lr``, ... for ``lr``)."""
    if not isinstance(node, DictConfig):
        return []
    found = []
    for key in node.keys():
        child = node._get_node(key)
        full = f"{prefix}.{key}"
        if key == leaf and not isinstance(child, DictConfig):
            found.append(full)
        elif isinstance(child, DictConfig):
            found += _settings_named(child, leaf, full)
    return found


def _unknown_key(err: ConfigCompositionException, argv: Sequence[str]) -> str | None:
    cause = err.__cause__
    key = getattr(cause, "full_key", None)
    parent = getattr(cause, "parent_node", None)
    if not key or not isinstance(parent, DictConfig) or not str(err).startswith("Could not override"):
        return None
    override = _override(argv, key)
    from gptmini.training.run.schema import DERIVED, derived_refusal

    if key in DERIVED:  # a value the run derives from another group's setting
        return derived_refusal(key, override.split("=", 1)[1] if "=" in override else None)
    group, _, leaf = key.rpartition(".")
    named = _settings_named(parent, leaf, group) if group else []
    where = f"{group} has no setting {leaf!r}" if group else f"the config has no setting {leaf!r}"
    if named:
        return (
            f"{override}: {where}; the settings named {leaf!r} there are {', '.join(named)}: set one of those "
            "(`gptmini train --cfg job` prints every setting)"
        )
    keys = [str(k) for k in parent.keys() if not str(k).startswith("_")]
    close = difflib.get_close_matches(leaf, keys, n=3, cutoff=0.8)
    if close:  # a misspelling: the likely keys, not every key of the group
        meant = " or ".join(f"{group}.{k}" if group else k for k in close)
        fix = f"{override}: {where}; did you mean {meant}? (`gptmini train --cfg job` prints every setting)"
    else:
        fix = (
            f"{override}: {where} (its settings: {', '.join(keys)}): fix the key (`gptmini train --cfg job` prints "
            "every setting)"
        )
    if OmegaConf.get_type(parent) is dict:  # an open group (no schema) takes new keys, on purpose
        fix += f"; only a key the config lacks on purpose is added, with +{override.lstrip('+')}"
    return fix


def _bad_value(err: ConfigCompositionException, argv: Sequence[str]) -> str | None:
    cause = err.__cause__
    key = getattr(cause, "full_key", None)
    if not key or not str(err).startswith("Error merging override"):
        return None
    reason = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
    # the override Hydra failed to merge (a key given twice: the later one, not the first of the key)
    return f"{str(err).splitlines()[0].removeprefix('Error merging override ')}: {reason}"


def one_line(err: Exception, argv: Sequence[str]) -> str:
    """``err`` (a Hydra composition or override error) as one line naming the override and the fix."""
    if isinstance(err, ConfigCompositionException):
        restated = _unknown_key(err, argv) or _bad_value(err, argv)
        if restated:
            return restated
        # ~optimizer: conf/train.yaml's settings of the chosen option (${optimizer}) have no option to follow
        dropped = re.match(r"Error resolving interpolation '\$\{(\w+)\}'", str(err))
        if dropped and f"~{dropped.group(1)}" in argv:
            return dropped_group(dropped.group(1))
    # a config file of the user's (--config-dir, an experiment) that does not parse
    if isinstance(err, yaml.YAMLError):
        mark = getattr(err, "problem_mark", None)
        where = f"{mark.name}, line {mark.line + 1}," if mark is not None else "a config file"
        why = ", ".join(str(w) for w in (getattr(err, "context", None), getattr(err, "problem", None)) if w)
        return f"{where} is not valid YAML ({why or err}): fix the file"
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if isinstance(err, MissingConfigException):
        # "Could not find 'model/foo'", "Available options in 'model':", "baby", ..., "Config search path:", ...
        cut = next((i for i, line in enumerate(lines) if line.startswith("Config search path")), len(lines))
        head, *options = lines[:cut]
        head = head.removeprefix("In 'train': ")
        if options and options[0].startswith("Available options"):
            return f"{head}; {options[0].rstrip(':').lower()}: {', '.join(options[1:])}"
        return head
    if isinstance(err, SearchPathException):  # --config-dir naming no folder
        return "; ".join(lines) + ": --config-dir (-cd) names an existing folder of YAML configs"
    if isinstance(err, OverrideParseException):
        # "Error parsing override 'x==1'", the parser's complaint, a link to the grammar
        return "; ".join(line for line in lines if not line.startswith("See https://")) + (
            " (an override is key=value, +key=value to add a key, ~key to drop one; quote a value with spaces)"
        )
    return "; ".join(lines)


def raw_value(cfg: DictConfig, key: str) -> Any:
    """``key``'s value as written (an interpolation unresolved), None where it cannot be read."""
    parent, _, leaf = key.rpartition(".")
    try:
        node = OmegaConf.select(cfg, parent, throw_on_resolution_failure=False) if parent else cfg
        container = OmegaConf.to_container(node, resolve=False) if isinstance(node, DictConfig) else None
    except OmegaConfBaseException:
        return None
    return container.get(leaf) if isinstance(container, dict) else None


def unresolvable(err: OmegaConfBaseException, cfg: DictConfig) -> RunError:
    """An interpolation that cannot be resolved (a missing key, a cycle, an unset environment variable, a
    resolver's error) as one line naming the key, its value as written and the fix."""
    key = str(getattr(err, "full_key", "") or "")
    raw = raw_value(cfg, key) if key else None
    reason = str(err).splitlines()[0] if str(err) else type(err).__name__
    what = f"{key}={raw}" if raw is not None else (key or "the config")
    return RunError(
        f"{what} cannot be resolved: {reason}. Fix the value or the key it names (an interpolation names an "
        "existing key, ${oc.env:VAR} a set variable; `gptmini train --cfg job` prints the config as written)"
    )


def check_resolves(cfg: DictConfig) -> None:
    """Every value of the task's config resolves, checked before any of it is used: otherwise one line naming
    the key (``unresolvable``). A ``???`` is left to the run's check of the settings it must be given."""
    try:
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    except InterpolationToMissingValueError:
        return
    except OmegaConfBaseException as err:
        raise unresolvable(err, cfg) from None


def _restore_full_error() -> None:
    """Hydra's error reporting as the user set it, once the config is composed (run_hydra set HYDRA_FULL_ERROR)."""
    if os.environ.pop(_SET_BY_GPTMINI, None):
        os.environ.pop(_FULL_ERROR, None)


class ComposedCallback(Callback):
    """A Hydra callback (first in ``hydra.callbacks``, conf/train.yaml): the config is composed, so what follows
    (the other callbacks' refusals, the run) is reported as the user asked, not as :func:`run_hydra` asked."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _restore_full_error()

    on_multirun_start = on_run_start


def run_hydra(
    task: Callable[[DictConfig], Any],
    config_path: str,
    config_name: str = "train",
    argv: Sequence[str] | None = None,
) -> None:
    """``hydra.main(...)(task)()``, with Hydra's command-line errors restated as one line (exit status 2). With
    ``HYDRA_FULL_ERROR=1`` set by the user, Hydra's own report and traceback instead."""
    import hydra

    argv = list(sys.argv[1:] if argv is None else argv)
    # --cfg without what to print: argparse's refusal would be Hydra's whole usage, naming the interpreter's script
    for i, arg in enumerate(argv):
        if arg in ("--cfg", "-c") and argv[i + 1 : i + 2] not in (["job"], ["hydra"], ["all"]):
            given = f", not {argv[i + 1]!r}" if i + 1 < len(argv) else ""
            sys.stderr.write(
                f"error: {arg} takes what to print, job, hydra or all{given}: e.g. gptmini train --cfg job "
                "trainer.max_steps=300\n"
            )
            sys.exit(EXIT_USER_ERROR)
    full = os.environ.get(_FULL_ERROR) == "1"
    if not full:
        os.environ[_FULL_ERROR] = os.environ[_SET_BY_GPTMINI] = "1"

    @functools.wraps(task)
    def job(cfg: DictConfig) -> Any:
        _restore_full_error()  # (ComposedCallback did, unless the config lacks it)
        return task(cfg)

    try:
        hydra.main(version_base="1.3", config_path=config_path, config_name=config_name)(job)()
    except (
        ConfigCompositionException,
        MissingConfigException,
        OverrideParseException,
        SearchPathException,
        yaml.YAMLError,
    ) as err:
        if full:
            raise
        sys.stderr.write(f"error: {one_line(err, argv)}\n")
        sys.exit(EXIT_USER_ERROR)
    finally:
        _restore_full_error()


# The groups every run needs: deleting one (~model) would fall back to a schema default without a word.
REQUIRED_GROUPS = ("model", "tokenizer", "data", "optimizer", "scheduler", "trainer")


def dropped_group(group: str) -> str:
    """The refusal of ``~group``: every run needs one of its options (and ``conf/train.yaml`` merges the settings
    of the chosen one, so composing fails without it)."""
    from gptmini.conf_dir import conf_dir

    options = ", ".join(sorted(p.stem for p in (conf_dir() / group).glob("*.yaml")))
    needed = ", which every run needs" if group in REQUIRED_GROUPS else ""
    return f"~{group} drops the {group} group{needed}: choose one of its options instead ({group}=<option>: {options})"
