"""Each setting is one setting: the run passes the top-level value to the parts that use it (``DERIVED`` in
gptmini/training/run/schema.py), a copy set alone is refused in one line naming the key to set, and a setting
that cannot act under the chosen options is refused."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

# Each copy, the value the user tries to give it, and the setting the refusal must name.
COPIES = [
    ("data.seed", "7", "seed=<n>"),
    ("callbacks.rng_state.seed", "7", "seed=<n>"),
    ("callbacks.checkpoint_last.every_n_train_steps", "3", "checkpoint_every_n_steps=<steps>"),
    ("callbacks.stop_at_target.target", "1.5", "target_val_loss=<loss>"),
    ("callbacks.throughput.peak_flops", "1e15", "perf.peak_flops=<FLOP/s>"),
]


@pytest.mark.parametrize("prefix", ["", "+"])
@pytest.mark.parametrize(("key", "value", "fix"), COPIES, ids=[c[0] for c in COPIES])
def test_a_copy_set_alone_is_refused_naming_the_setting(
    gptmini_train: Any, tmp_path: Path, prefix: str, key: str, value: str, fix: str
) -> None:
    args = ["debug=smoke", "callbacks=default", f"paths.output_root={tmp_path}"]
    proc = gptmini_train([*args, f"{prefix}{key}={value}"])
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert lines[-1].startswith(f"error: {key}") and f"set {fix} instead" in lines[-1], lines
    assert "Traceback" not in proc.stderr and not any(tmp_path.iterdir())


def test_the_plan_passes_each_setting_where_it_is_used(compose_cfg: Any) -> None:
    from gptmini.training.run.plan import plan_run

    cfg = compose_cfg(
        ["seed=77", "checkpoint_every_n_steps=9", "target_val_loss=1.25", "perf.peak_flops=1.5e15"]
    )
    plan = plan_run(cfg)
    assert plan.data.seed == 77 and plan.callbacks["rng_state"].seed == 77
    assert plan.callbacks["checkpoint_last"].every_n_train_steps == 9
    assert plan.callbacks["stop_at_target"].target == 1.25
    assert plan.callbacks["throughput"].peak_flops == 1.5e15
    # the best-by-loss checkpoint is a ModelCheckpoint too, and keeps its own interval (none)
    assert plan.callbacks["checkpoint_best"].every_n_train_steps is None


@pytest.mark.parametrize("debug", ["smoke", "overfit"])
def test_a_checkpoint_interval_without_a_periodic_checkpoint_is_refused(
    gptmini_train: Any, tmp_path: Path, debug: str
) -> None:
    """callbacks=final (debug=smoke, debug=overfit) saves at the end only: the interval would do nothing."""
    proc = gptmini_train([f"debug={debug}", f"paths.output_root={tmp_path}", "checkpoint_every_n_steps=1"])
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: checkpoint_every_n_steps=1 cannot act: no callback saves periodically (callbacks.checkpoint_last, "
        "in callbacks=default and callbacks=last; callbacks=final saves at the end only): drop "
        "checkpoint_every_n_steps or use callbacks=last"
    )
    assert not any(tmp_path.iterdir())


def test_a_checkpoint_interval_with_a_periodic_checkpoint_is_taken(compose_cfg: Any) -> None:
    from gptmini.training.run.plan import plan_run

    plan = plan_run(compose_cfg(["debug=smoke", "callbacks=last", "checkpoint_every_n_steps=1"]))
    assert plan.callbacks["checkpoint_last"].every_n_train_steps == 1


# --- every default written once --------------------------------------------------------------------------------


def _same(a: Any, b: Any) -> bool:
    """Equal as config values: a list and a tuple alike, a bool never equal to a number."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def _restated(values: dict[str, Any], otherwise: dict[str, Any], path: str) -> list[str]:
    found = []
    for key, value in values.items():
        if str(key).startswith("_") or key not in otherwise:
            continue
        if isinstance(value, dict) and isinstance(otherwise[key], dict):
            found += _restated(value, otherwise[key], f"{path}{key}.")
        elif _same(value, otherwise[key]):
            found.append(f"{path}{key}={value!r}")
    return found


def restated_defaults(conf: Path) -> list[str]:
    """Each value an option file of an instantiated group writes that it would have without writing it: its
    constructor's default, or the value of the option it extends (``defaults: [default, _self_]``); and each value
    a model preset writes that is the model schema's default."""
    from omegaconf import OmegaConf

    from gptmini.training.run.schema import INSTANTIATED, NAMED, ModelSchema, option_settings

    settings = option_settings(conf)
    found = []
    for group in (*INSTANTIATED, *NAMED):
        for path in sorted((conf / group).glob("*.yaml")):
            own = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
            parents = [d for d in own.pop("defaults", []) if isinstance(d, str) and d != "_self_"]
            base = [OmegaConf.to_container(OmegaConf.load(conf / group / f"{p}.yaml")) for p in parents]
            for b in base:
                b.pop("defaults", None)
            otherwise = OmegaConf.to_container(OmegaConf.merge(settings[group, path.stem], *base))
            found += [f"{group}={path.stem}: {r}" for r in _restated(own, otherwise, "")]
    model = OmegaConf.to_container(OmegaConf.structured(ModelSchema))
    for path in sorted((conf / "model").glob("*.yaml")):
        own = OmegaConf.to_container(OmegaConf.load(path))
        found += [f"model={path.stem}: {r}" for r in _restated(own, model, "")]
    return found


def test_no_option_file_restates_a_default() -> None:
    """An option file writes only what it chooses differently from its constructor's defaults (or from the
    option it extends): a default is written once, in the signature."""
    from gptmini.conf_dir import conf_dir

    assert restated_defaults(conf_dir()) == []


def test_a_restated_default_is_found(tmp_path: Path) -> None:
    import shutil

    from gptmini.conf_dir import conf_dir

    conf = tmp_path / "conf"
    shutil.copytree(conf_dir(), conf)
    muon = conf / "optimizer" / "muon.yaml"
    muon.write_text(muon.read_text().replace("hidden:\n", "hidden:\n  momentum: 0.95\n", 1))
    last = conf / "callbacks" / "last.yaml"
    last.write_text(last.read_text() + "progress_log:\n  every_n_steps: 50\n")  # callbacks=default's value
    tiny = conf / "model" / "tiny.yaml"
    tiny.write_text(tiny.read_text() + "dropout: 0.0\nvocab_size: null\n")  # the model schema's defaults
    assert sorted(restated_defaults(conf)) == [
        "callbacks=last: progress_log.every_n_steps=50",
        "model=tiny: dropout=0.0",
        "model=tiny: vocab_size=None",
        "optimizer=muon: hidden.momentum=0.95",
    ]


def test_dropping_the_callbacks_group_is_refused_naming_its_options(
    gptmini_train: Any, tmp_path: Path
) -> None:
    """``~callbacks`` leaves conf/train.yaml's settings of the chosen option nothing to follow: one line naming
    the options (``callbacks=none``: no callbacks), nothing written."""
    proc = gptmini_train(["debug=smoke", f"paths.output_root={tmp_path}", "~callbacks"])
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        "error: ~callbacks drops the callbacks group: choose one of its options instead (callbacks=<option>: "
        "default, final, last, none)"
    )
    assert not any(tmp_path.iterdir())


def test_a_setting_an_option_leaves_to_the_user_stays_unset(compose_cfg: Any) -> None:
    """data=text's ``source: ???`` is not filled with the constructor's default (the embedded corpus)."""
    from omegaconf import OmegaConf

    assert OmegaConf.is_missing(compose_cfg(["data=text"]).data, "source")


def test_cfg_job_shows_every_setting_from_the_signatures(gptmini_train: Any) -> None:
    """``gptmini train --cfg job``: the settings an option file leaves out, with their constructors' defaults."""
    import inspect

    import yaml
    from lightning.pytorch import Trainer

    from gptmini.training.loop.optimizers import BatchedMuon

    proc = gptmini_train(["--cfg", "job", "hardware=cpu", "trainer.enable_progress_bar=false"])
    assert proc.returncode == 0, proc.stderr
    cfg = yaml.safe_load(proc.stdout)
    muon = inspect.signature(BatchedMuon).parameters
    assert cfg["optimizer"]["hidden"]["beta2"] == muon["beta2"].default
    assert cfg["optimizer"]["hidden"]["momentum_warmup_start"] == muon["momentum_warmup_start"].default
    trainer = inspect.signature(Trainer).parameters
    assert cfg["trainer"]["detect_anomaly"] == trainer["detect_anomaly"].default
    # a setting the option file leaves out is set without "+", as any other
    assert cfg["trainer"]["enable_progress_bar"] is False


@pytest.fixture(scope="module")
def settings_page() -> str:
    """The settings page of the repository's configs, as ``scripts/settings_page.py`` writes it (built once: the
    two tests reading it build the same page from the same configs)."""
    from gptmini.conf_dir import conf_dir
    from scripts.settings_page import settings_reference

    return settings_reference(conf_dir())


def test_the_settings_page_is_generated_from_the_signatures(settings_page: str) -> None:
    """docs/settings.md is what the signatures say: regenerate it with
    ``python scripts/settings_page.py > docs/settings.md``."""
    import inspect

    from gptmini.data.datamodule import TokenDataModule

    page = settings_page
    assert (Path(__file__).resolve().parents[3] / "docs" / "settings.md").read_text() == page
    # a setting's default and its help line, as its constructor writes them
    default = inspect.signature(TokenDataModule).parameters["prepare_threads"].default
    assert (
        f"| `data.prepare_threads` | `{'null' if default is None else default}` | tokenizer threads;" in page
    )


def test_every_row_of_the_settings_page_has_its_help(settings_page: str) -> None:
    """Each setting's help line comes from the code that uses it: no row of docs/settings.md is left without."""
    rows = [line for line in settings_page.splitlines() if line.startswith("| `")]
    assert len(rows) > 200
    assert [row for row in rows if row.endswith("|  |")] == []


class Documented:
    """A constructor documented the way Lightning's and torch's are.

    Args:
        every: how many steps between two reports,
            when the run is long. Set it to ``-1``
            to never report.
        size (int, optional):
            bytes per report (default: 10)
    """

    def __init__(self, every: int = 3, size: int = 10, code: int = 0) -> None:
        # not a help line: a comment above code that uses the parameter
        code = int(code)
        self.code = code


def test_a_docstring_entry_is_read_whole() -> None:
    """An ``Args:`` entry's text is all its lines, also where its first line ends with a comma or holds an ``=``
    (which a parameter's line of code does too)."""
    from scripts.settings_page import setting_help

    assert setting_help(Documented, "every") == (
        "how many steps between two reports, when the run is long. Set it to ``-1`` to never report."
    )
    assert setting_help(Documented, "size") == "bytes per report (default: 10)"
    assert setting_help(Documented, "code") == ""


# --- docs/development.md's "Adding a callback" and "Adding an optimizer setting", done ----------------------


class Mine:
    """A callback of one's own (docs/development.md, "Adding a callback"): its settings are its parameters."""

    def __init__(
        self,
        # steps between its reports
        every: int = 3,
    ) -> None:
        self.every = every


def test_adding_a_callback_is_one_module_and_one_yaml_line(tmp_path: Path) -> None:
    """The module is this test's ``Mine``; the YAML line names it in callbacks=default: it is then a node of the
    composed callbacks with every setting and its default, on the settings page with its help line, and its file
    restates nothing."""
    import shutil

    from gptmini.conf_dir import conf_dir
    from gptmini.training.run.schema import option_settings
    from scripts.settings_page import settings_reference

    conf = tmp_path / "conf"
    shutil.copytree(conf_dir(), conf)
    default = conf / "callbacks" / "default.yaml"
    default.write_text(default.read_text() + "mine: {_target_: test_settings_once.Mine}\n")
    assert option_settings(conf)["callbacks", "default"]["mine"] == {"every": 3}
    assert option_settings(conf)["callbacks", "last"]["mine"] == {"every": 3}  # the options extending it too
    assert "| `callbacks.mine.every` | `3` | steps between its reports |" in settings_reference(conf)
    assert restated_defaults(conf) == []


def test_adding_an_optimizer_setting_is_one_constructor_parameter(monkeypatch: pytest.MonkeyPatch) -> None:
    """A keyword parameter with its default and help line, on BatchedMuon (docs/development.md, "Adding an
    optimizer setting"): a setting of optimizer=muon with that default, on the settings page, with no YAML edit."""
    import gptmini.training.loop.optimizers as optimizers
    from gptmini.conf_dir import conf_dir
    from gptmini.training.run import schema
    from scripts.settings_page import settings_reference

    class WithCap(optimizers.BatchedMuon):
        def __init__(
            self,
            params: Any,
            *,
            # the largest step of one element (null: no cap)
            update_cap: float | None = None,
            **options: Any,
        ) -> None:
            super().__init__(params, **options)

    monkeypatch.setitem(optimizers.MuonAdamW.settings_of, "hidden", (WithCap, ("params",)))
    # an edited optimizers.py has another stamp: its settings are read from the signature, not the stored ones
    monkeypatch.setattr(schema, "code_stamp", lambda target: "edited")
    _clear_schema_caches()
    try:
        hidden = schema.option_settings(conf_dir())["optimizer", "muon"]["hidden"]
        page = settings_reference(conf_dir())
    finally:
        _clear_schema_caches()
    assert hidden["update_cap"] is None and hidden["beta2"] == 0.95
    assert (
        "| `optimizer.hidden.update_cap` | `null` | the largest step of one element (null: no cap) |" in page
    )


def _clear_schema_caches() -> None:
    from gptmini.training.run import schema

    schema.target_spec.cache_clear()
    schema.schema_of.cache_clear()


def test_the_stored_settings_are_the_signatures() -> None:
    """gptmini/training/run/settings_specs.json, which composing reads instead of importing every option's
    class, is what the signatures say: regenerate it with ``python scripts/settings_page.py --specs``."""
    from gptmini.conf_dir import conf_dir
    from gptmini.training.run.schema import SPECS_FILE
    from scripts.settings_page import settings_specs

    assert SPECS_FILE.read_text() == settings_specs(conf_dir())


def test_stored_settings_of_other_code_are_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stored spec whose stamp is not the code's (an edited module, another Lightning) is read again from the
    signature: here a stored Trainer spec made to lack ``max_steps``."""
    import json

    from gptmini.training.run import schema

    stored = json.loads(schema.SPECS_FILE.read_text())
    trainer = stored["trainer lightning.pytorch.Trainer"]
    trainer["settings"] = [s for s in trainer["settings"] if s["name"] != "max_steps"]
    monkeypatch.setattr(schema, "_stored_specs", lambda: stored)
    _clear_schema_caches()
    try:
        assert "max_steps" not in schema.settings(schema.schema_of("trainer", "lightning.pytorch.Trainer"))
        trainer["stamp"] = "another version"
        _clear_schema_caches()
        assert "max_steps" in schema.settings(schema.schema_of("trainer", "lightning.pytorch.Trainer"))
    finally:
        _clear_schema_caches()


def test_the_top_level_defaults_are_written_once_in_the_schema() -> None:
    """conf/train.yaml makes choices only: no value of its own equals the schema's default it would override;
    and the plan's dataclass takes the top-level settings without restating their defaults as literals."""
    import ast
    import dataclasses
    import inspect

    import yaml

    from gptmini.conf_dir import conf_dir
    from gptmini.training.run import plan
    from gptmini.training.run.schema import TrainSchema

    def defaults(schema: type) -> dict[str, Any]:
        out = {}
        for f in dataclasses.fields(schema):
            if dataclasses.is_dataclass(f.type) or f.default_factory is not dataclasses.MISSING:
                value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.type()
                out[f.name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
            else:
                out[f.name] = f.default
        return out

    own = yaml.safe_load((conf_dir() / "train.yaml").read_text())
    own.pop("defaults")
    own.pop("hydra")
    assert _restated(own, defaults(TrainSchema), "") == []
    restated = [
        node.target.id
        for node in ast.walk(ast.parse(inspect.getsource(plan.RunPlan)))
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and node.target.id in {f.name for f in dataclasses.fields(TrainSchema)}
        and isinstance(node.value, ast.Constant)  # a literal: a second copy of the schema's default
    ]
    assert restated == []
    # the constructors the plan gives a setting (schema.DERIVED) restate no default of it as a literal
    assert _derived_literals(conf_dir()) == []
    # the seed's literal once in the package and the configs (gptmini.options.DEFAULT_SEED)
    seed = str(next(f.default for f in dataclasses.fields(TrainSchema) if f.name == "seed"))
    files = [*Path(plan.__file__).parents[3].joinpath("gptmini").rglob("*.py"), *conf_dir().rglob("*.yaml")]
    assert sum(len(re.findall(rf"\b{seed}\b", f.read_text())) for f in files) == 1


def _derived_literals(conf: Path) -> list[str]:
    """``target.param=literal`` for each gptmini constructor named in ``conf`` whose parameter the plan derives
    from another setting (``schema.DERIVED``: the seed, the tokenizer, the context, the schedule's length...) with
    a default written as a literal other than None."""
    import ast
    import inspect
    import textwrap

    import yaml
    from hydra.utils import get_object

    from gptmini.training.run.schema import DERIVED

    def targets(node: Any, owner: tuple[str, ...]) -> Any:
        if isinstance(node, dict):
            if str(node.get("_target_", "")).startswith("gptmini."):
                yield owner, node["_target_"]
            for key, value in node.items():
                yield from targets(value, (*owner, str(key)))

    found = set()
    for file in conf.rglob("*.yaml"):
        group = file.relative_to(conf).parts[0]
        for owner, target in targets(yaml.safe_load(file.read_text()), (group,)):
            obj = get_object(target)
            init = obj.__init__ if isinstance(obj, type) else obj
            if not inspect.isfunction(init):  # no constructor of its own
                continue
            args = ast.parse(textwrap.dedent(inspect.getsource(init))).body[0].args
            params = [*args.args, *args.kwonlyargs]
            given = dict(
                zip(
                    [a.arg for a in args.args[len(args.args) - len(args.defaults) :]],
                    args.defaults,
                    strict=True,
                )
            )
            given.update(
                {a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None}
            )
            for param in params:
                default = given.get(param.arg)
                derived = [
                    k
                    for k in DERIVED
                    if k.split(".")[-1] == param.arg
                    and k.rsplit(".", 1)[0] in {group, ".".join(owner[:1] + owner[-1:])}
                ]
                if derived and isinstance(default, ast.Constant) and default.value is not None:
                    found.add(f"{target}.{param.arg}={default.value!r}")
    return sorted(found)
