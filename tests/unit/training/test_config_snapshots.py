"""Every shipped run config, fully resolved, against a JSON snapshot: a change to conf/ or to the schema that
changes what any experiment or debug config (or the plain default) resolves to fails here, naming the config and
the keys. A deliberate change is made by regenerating the snapshots and reviewing the diff:

    UPDATE_SNAPSHOTS=1 .venv/bin/python -m pytest tests/unit/training/test_config_snapshots.py -q
    git diff tests/snapshots/resolved/

Machine-dependent values are normalised: the working directory, the run folder Hydra would make (a timestamp)
and the home folder become placeholders, and the corpus of ``data=text`` configs is a fixed URL.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from gptmini.conf_dir import conf_dir

SNAPSHOTS = Path(__file__).resolve().parents[2] / "snapshots" / "resolved"
CONF = conf_dir()
HOME = "/home/user"
# the parts of the hydra node that a run's behaviour depends on (the rest is Hydra's own machinery)
HYDRA_KEYS = ("mode", "callbacks", "run", "sweep", "sweeper", "job")
JOB_KEYS = ("name", "config")


def _cases() -> list[tuple[str, list[str]]]:
    cases: list[tuple[str, list[str]]] = []
    for hardware in ("cpu", "gpu"):
        cases.append((f"default__hardware={hardware}", [f"hardware={hardware}"]))
    for group in ("experiment", "debug"):
        for path in sorted((CONF / group).glob("*.yaml")):
            for hardware in (None, "gpu"):
                overrides = [f"{group}={path.stem}"]
                if hardware is not None:
                    overrides.append(f"hardware={hardware}")
                name = "__".join(o.replace("/", "_") for o in overrides)
                cases.append((name, overrides))
    return cases


def _resolve(overrides: list[str]) -> dict[str, Any]:
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf, open_dict

    from gptmini.training.hardware import DeviceFacts, register_hardware_configs
    from gptmini.training.run.compose import register_configs

    register_configs()
    register_hardware_configs(
        DeviceFacts()
    )  # hardware=auto as on a machine without a GPU, wherever this runs
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=overrides, return_hydra_config=True)
    if OmegaConf.is_missing(cfg.data, "source"):
        cfg.data.source = "https://example.com/corpus.txt"
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = "<output_dir>"
        cfg.hydra.runtime.cwd = "<cwd>"
    HydraConfig.instance().set_config(cfg)
    hydra_node = cfg.hydra
    with open_dict(cfg):
        del cfg["hydra"]
    resolved = OmegaConf.to_container(cfg, resolve=True)
    # The hydra node: only what a run depends on, timestamps (${now:...}) left unresolved.
    kept: dict[str, Any] = {}
    for key in HYDRA_KEYS:
        node = hydra_node[key]
        if OmegaConf.is_config(node):
            node = OmegaConf.to_container(node, resolve=False)
        elif node is not None:
            node = str(node)
        if key == "job":
            node = {k: node[k] for k in JOB_KEYS}
        if key == "sweeper":
            params = hydra_node.sweeper.get("params") or {}
            node = {"params": {k: str(OmegaConf.select(hydra_node.sweeper.params, k)) for k in params}}
        kept[key] = node
    resolved["hydra"] = kept
    return resolved


@pytest.mark.parametrize(("name", "overrides"), _cases(), ids=[c[0] for c in _cases()])
def test_resolved_config_matches_snapshot(name: str, overrides: list[str], monkeypatch: Any) -> None:
    monkeypatch.setenv("HOME", HOME)
    monkeypatch.chdir(Path(__file__).resolve().parents[3])
    resolved = _resolve(overrides)
    text = json.dumps(resolved, indent=1, sort_keys=True) + "\n"
    path = SNAPSHOTS / f"{name}.json"
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.is_file(), (
        f"no snapshot {path}: generate it with UPDATE_SNAPSHOTS=1 (see this module's docstring)"
    )
    expected = json.loads(path.read_text())
    assert resolved == expected, f"{name}: the resolved config differs from {path.name}"


def test_every_snapshot_has_its_config() -> None:
    """A snapshot of a config that no longer exists is stale: regenerate, and delete it."""
    names = {c[0] for c in _cases()}
    stale = sorted(p.stem for p in SNAPSHOTS.glob("*.json") if p.stem not in names)
    assert not stale, f"snapshots without a config: {stale}"


@pytest.mark.parametrize("experiment", sorted(p.stem for p in (conf_dir() / "experiment").glob("*.yaml")))
def test_no_experiment_sets_a_batch_limit_lightning_explains(experiment: str, compose_cfg, caplog) -> None:
    """Lightning notes on the console what a limit of 1 or 1.0 means (an int or a float read differently): no
    shipped experiment sets one, so its run starts without that note."""
    import logging

    import lightning as L

    trainer = compose_cfg([f"experiment={experiment}"]).trainer
    limits = ("limit_train_batches", "limit_val_batches", "val_check_interval")
    caplog.set_level(logging.INFO)
    L.Trainer(
        **{k: trainer.get(k) for k in limits},
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    assert "was configured so" not in caplog.text
