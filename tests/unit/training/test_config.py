"""The training config without training: every config option and experiment composes and instantiates,
experiments carry their settings, and typos, missing settings and unsupported precisions are refused before
any work. (What runs the real entry point is in tests/integration/test_train.py.)"""

from __future__ import annotations

import re

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from benchmarks.common import preset_config
from gptmini.conf_dir import conf_dir
from gptmini.model import GPTConfig
from gptmini.training.errors import RunError
from gptmini.training.hardware import resolve_precision
from gptmini.training.run.plan import plan_run


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))


def instantiate_all(cfg) -> None:
    """Build every object a run builds, from its plan, short of preparing data: catches typos in _target_ and
    arguments."""
    import dataclasses

    from gptmini.model import GPT
    from gptmini.training.loop.module import build_optimizer
    from gptmini.training.run.app import build_trainer
    from gptmini.training.run.plan import plan_run

    if cfg.trainer.accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        with pytest.raises(RunError, match="no CUDA GPU is available"):
            plan_run(cfg)
        OmegaConf.update(cfg, "trainer.accelerator", "cpu")
        if not isinstance(cfg.trainer.strategy, str):
            OmegaConf.update(cfg, "trainer.strategy", "auto", merge=False)
    if cfg.trainer.get("devices") == "auto" and not torch.cuda.is_available():
        OmegaConf.update(cfg, "trainer.devices", 1)
    plan = plan_run(cfg)
    assert plan.model.n_embd % plan.model.n_head == 0
    tiny = GPT(GPTConfig(vocab_size=10, block_size=4, n_layer=1, n_head=1, n_embd=4))
    optimizer = build_optimizer(instantiate(dataclasses.asdict(plan.optimizer), _convert_="all"), tiny, "cpu")
    assert optimizer.param_groups[0]["lr"] > 0
    if plan.scheduler is not None:
        instantiate(dataclasses.asdict(plan.scheduler), _convert_="all")(optimizer)
    trainer, _ = build_trainer(plan)
    assert trainer.max_steps == cfg.trainer.max_steps
    dm = instantiate(dataclasses.asdict(plan.data), train_samples=10, _convert_="all")
    assert dm.block_size == cfg.model.block_size and dm.preparation["tokenizer"] == cfg.tokenizer.name


GROUPS = [
    "model",
    "tokenizer",
    "data",
    "optimizer",
    "scheduler",
    "trainer",
    "callbacks",
    "logger",
    "hardware",
    "debug",
]


@pytest.mark.parametrize("group, option", [(g, o) for g in GROUPS for o in _options(g)], ids=lambda v: str(v))
def test_every_config_option_composes_and_instantiates(group, option, compose_cfg, tmp_path):
    overrides = [f"{group}={option}"]
    if group == "data" and option == "text":
        overrides.append(f"data.source={tmp_path}/corpus.txt")
    if (
        group == "trainer" and option == "fsdp"
    ):  # Muon, the CPU default, is refused under FSDP (test_optimizers.py)
        overrides.append("optimizer=adamw")
    instantiate_all(compose_cfg(overrides))


@pytest.mark.parametrize("experiment", _options("experiment"))
def test_every_experiment_composes_and_instantiates(experiment, compose_cfg, write_checkpoint, tmp_path):
    overrides = [f"experiment={experiment}"]
    if experiment == "finetune_shakespeare":  # the plan resolves the weights it starts from
        overrides.append(f"model.init_from={write_checkpoint(tmp_path / 'gpt2.ckpt')}")
    if experiment in (
        "speedrun_char_cpu",
        "speedrun_char_gpu",
        "frontier_char_cpu",
    ):  # the user's tinyshakespeare file
        overrides.append("data.source=/path/to/tinyshakespeare.txt")
    cfg = compose_cfg(overrides)
    assert cfg.run_name == experiment
    instantiate_all(cfg)


def test_experiments_carry_the_promised_settings(compose_cfg):
    cpu = compose_cfg(["experiment=shakespeare_char_cpu"])
    assert (cpu.model.n_layer, cpu.model.n_head, cpu.model.n_embd, cpu.model.block_size) == (4, 4, 128, 64)
    assert (cpu.data.batch_size, cpu.trainer.max_steps, cpu.model.dropout) == (12, 2000, 0.0)
    assert cpu.tokenizer.name == "char"
    baby = compose_cfg(["experiment=shakespeare_char"])
    assert (baby.model.n_layer, baby.model.n_head, baby.model.n_embd, baby.model.block_size) == (
        6,
        6,
        384,
        256,
    )
    gpt2 = compose_cfg(["experiment=gpt2_124m"])
    assert (gpt2.model.n_layer, gpt2.model.n_embd, gpt2.model.vocab_size, gpt2.model.block_size) == (
        12,
        768,
        50257,
        1024,
    )
    sweep = compose_cfg(["experiment=attention_sweep"], keep_hydra=True)
    swept = sweep.hydra.sweeper.params["model.attention"].split(",")
    from gptmini.attention import available_attention

    assert sorted(swept) == available_attention()


@pytest.mark.parametrize("hardware", ["cpu", "gpu"])
def test_data_text_changes_the_corpus_and_nothing_else(compose_cfg, hardware):
    """`data=text data.source=FILE` trains as the default does on another corpus: every setting the embedded
    corpus has (the batch, the split, the shards) is the same, only where the text comes from and goes differs."""
    default = compose_cfg([f"hardware={hardware}"])
    text = compose_cfg([f"hardware={hardware}", "data=text", "data.source=/tmp/corpus.txt"])
    shared = set(default.data) - {"source", "data_dir"}
    assert shared <= set(text.data)
    assert {k: text.data[k] for k in shared} == {k: default.data[k] for k in shared}
    assert text.data.source != default.data.source and text.data.data_dir != default.data.data_dir


def test_a_typo_in_a_model_key_fails_before_any_work(compose_cfg):
    from hydra.errors import ConfigCompositionException

    from gptmini.model import ConfigError

    with pytest.raises(ConfigCompositionException, match="n_embdd"):
        compose_cfg(["model.n_embdd=3"])
    with pytest.raises(ConfigCompositionException, match="n_layer"):
        compose_cfg(["model.n_layer=four"])
    # Forced in with "+", it is still refused by the model's own config check.
    with pytest.raises(ConfigError, match=r"unknown model config key\(s\) \['n_embdd'\]"):
        plan_run(compose_cfg(["+model.n_embdd=3"]))


def test_finetune_experiment_requires_init_from(compose_cfg):
    with pytest.raises(RunError, match=r"model.init_from must be set for this run"):
        plan_run(compose_cfg(["experiment=finetune_shakespeare"]))


def test_a_fused_optimizer_with_float16_amp_and_clipping_is_refused(compose_cfg):
    base = ["trainer=gpu", "trainer.precision=16-mixed", "optimizer.fused=true"]
    with pytest.raises(
        RunError, match=r"optimizer\.fused=true cannot be combined with trainer\.precision=16-mixed"
    ):
        plan_run(compose_cfg(base))
    # without clipping, or under bf16 (no GradScaler), the fused kernel is fine
    for extra in (["trainer.gradient_clip_val=0"], ["trainer.precision=bf16-mixed"]):
        try:
            plan_run(compose_cfg(base + extra))
        except RunError as e:
            assert "optimizer.fused" not in str(e)


def test_bf16_on_a_gpu_without_bf16_is_refused(monkeypatch, compose_cfg) -> None:
    import gptmini.training.run.compose as config
    from gptmini.training import hardware
    from gptmini.training.hardware import DeviceFacts

    v100 = DeviceFacts(type="cuda", name="Tesla V100-SXM2-16GB", capability=(7, 0), bf16=False, count=1)
    with pytest.raises(
        RunError, match=r"trainer\.precision=bf16-mixed is not supported by this GPU \(Tesla V100.*16-mixed"
    ):
        resolve_precision({"accelerator": "gpu", "precision": "bf16-mixed"}, v100)
    assert resolve_precision({"accelerator": "gpu", "precision": "auto"}, v100) == "32-true"
    assert resolve_precision({"accelerator": "gpu", "precision": "16-mixed"}, v100) == "16-mixed"
    # plan_run checks the machine it runs on: this one, made to look like a V100 box (composed with the CPU
    # defaults: the ConfigStore's hardware=auto outlives the test)
    from gptmini.training.hardware import register_hardware_configs

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(hardware, "detect_device", lambda: v100)
    monkeypatch.setattr(config, "register_hardware_configs", lambda: register_hardware_configs(DeviceFacts()))
    cfg = compose_cfg(["trainer=gpu", "trainer.precision=bf16-true"])
    with pytest.raises(RunError, match=r"trainer\.precision=bf16-true is not supported by this GPU"):
        plan_run(cfg)


# --- checks of the machine a run is on ------------------------------------------------------------------------


def test_more_cpu_devices_than_cores_are_refused(compose_cfg, caplog) -> None:
    from gptmini.training.hardware import cpu_cores

    cores = cpu_cores()
    with pytest.raises(
        RunError,
        match=rf"trainer\.devices={cores + 1} on the CPU would start {cores + 1} training processes \(DDP over "
        rf"gloo\) on this machine's {cores} CPU cores, each slower than one process alone: use "
        rf"trainer\.devices={cores} or fewer",
    ):
        plan_run(compose_cfg(["trainer=cpu", f"trainer.devices={cores + 1}"]))
    if cores >= 2:  # as many processes as cores: allowed, and said out loud
        plan_run(compose_cfg(["trainer=cpu", "trainer.devices=2"]))
        assert "trainer.devices=2 on the CPU: 2 training processes (DDP over gloo)" in caplog.text


def test_a_training_step_that_cannot_fit_in_memory_is_refused() -> None:
    from gptmini.limits import SizeError, check_training_step

    big = preset_config("small", vocab_size=50257, block_size=100000)
    sixteen_gib = (16 * 2**30, "this machine's memory")
    with pytest.raises(
        SizeError,
        match=r"model\.block_size=100000 with data\.batch_size=8 needs about [\d,.]+ GiB of memory for one "
        r"training step \(activations: [\d,.]+ GiB\) but this machine's memory has 16\.0 GiB: "
        r"lower model\.block_size or data\.batch_size",
    ):
        check_training_step(big, 8, "32-true", torch.device("cpu"), available=sixteen_gib)
    # the default run fits (the estimate itself: tests/unit/test_limits.py)
    small = preset_config("small", vocab_size=50257)
    check_training_step(small, 8, "32-true", torch.device("cpu"), available=sixteen_gib)
    # several CPU processes share one machine's memory
    with pytest.raises(SizeError, match=r"needs about"):
        check_training_step(small, 8, "32-true", torch.device("cpu"), processes=10**4, available=sixteen_gib)


def test_unwritable_data_and_output_folders_are_refused_before_any_work(
    compose_cfg, tmp_path, capsys
) -> None:
    from gptmini.training.run.run_folder import OutputFolderCheck

    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(
        RunError,
        match=rf"the prepared-data folder {blocker}/data/shakespeare_char cannot be created: {blocker} is a file, "
        r"not a folder; pass paths\.data_root=",
    ):
        plan_run(compose_cfg(["tokenizer=char", f"paths.data_root={blocker}/data"]))

    cfg = compose_cfg([f"paths.output_root={blocker}/outputs"], keep_hydra=True)
    with pytest.raises(SystemExit) as exit_info:
        OutputFolderCheck().on_run_start(cfg)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert (
        err.startswith(f"error: cannot create the run folder {blocker}/outputs/default/")
        and err.count("\n") == 1
    )
    assert "is a file, not a folder; pass paths.output_root=<a writable folder>" in err
    OutputFolderCheck().on_run_start(compose_cfg([f"paths.output_root={tmp_path}/out"], keep_hydra=True))


def test_a_folder_without_write_permission_is_unwritable(tmp_path, monkeypatch) -> None:
    import os

    from gptmini.fileio import unwritable_reason

    assert unwritable_reason(tmp_path / "new" / "deeper") is None
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # as root, chmod alone would not do
    assert unwritable_reason(tmp_path / "new") == f"{tmp_path} is not writable (permission denied)"


# --- run names, run folders, resume plans -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["../../escape", "a/b", "/abs", ".hidden", "", "-x", "a\\b", "x" * 201])
def test_a_run_name_must_be_one_plain_folder_name(name) -> None:
    from gptmini.training.run.run_folder import check_one_folder

    with pytest.raises(
        RunError, match=r"run_name=.* is invalid: it names one folder under paths\.output_root"
    ):
        check_one_folder("run_name", name)


@pytest.mark.parametrize("name", ["default", "my_run", "lr=1e-3,bs=8", "v1.2", "a+b@c"])
def test_plain_run_names_are_accepted(name) -> None:
    from gptmini.training.run.run_folder import check_one_folder

    check_one_folder("run_name", name)


def test_a_run_folder_is_free_when_missing_or_empty_or_when_resuming_its_own_run(tmp_path) -> None:
    from gptmini.training.run.run_folder import check_run_folder_free

    check_run_folder_free(tmp_path / "missing", None, "hydra.run.dir")
    check_run_folder_free(tmp_path, None, "hydra.run.dir")  # empty
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(RunError, match=r"is not empty \(notes\.txt\.\.\.\): a new run never writes into it"):
        check_run_folder_free(tmp_path, None, "hydra.run.dir")
    check_run_folder_free(tmp_path, str(tmp_path / "checkpoints" / "last.ckpt"), "hydra.run.dir")
    other = str(tmp_path / "other" / "checkpoints" / "last.ckpt")
    with pytest.raises(
        RunError, match=r"resumes .*another run's: a resume writes only into a new folder or the"
    ):
        check_run_folder_free(tmp_path, other, "hydra.run.dir")


@pytest.mark.parametrize(
    "override, key",
    [
        ("optimizer.hidden.lr=inf", "optimizer.hidden.lr=inf"),
        ("optimizer.embedding.weight_decay=nan", "optimizer.embedding.weight_decay=nan"),
        ("optimizer=adamw optimizer.lr=inf", "optimizer.lr=inf"),
        ("optimizer=adamw optimizer.weight_decay=nan", "optimizer.weight_decay=nan"),
        ("trainer.gradient_clip_val=inf", "trainer.gradient_clip_val=inf"),
        ("model.rope_base=inf", "model.rope_base=inf"),
        ("target_val_loss=nan", "target_val_loss=nan"),
    ],
)
def test_non_finite_numbers_are_refused_naming_the_key(compose_cfg, override, key) -> None:
    with pytest.raises(RunError, match=rf"^{re.escape(key)} is invalid: .*finite"):
        plan_run(compose_cfg(["model=tiny", "tokenizer=char", *override.split()]))


@pytest.mark.parametrize(
    "override", ["data.val_stride=0", "data.shard_tokens=0", "data.buffer_mb=-1", "data.prepare_threads=0"]
)
def test_data_sizes_below_one_are_refused_naming_the_key(compose_cfg, override) -> None:
    key, value = override.split("=")
    with pytest.raises(
        RunError, match=rf"^{re.escape(key)}={re.escape(value)} is invalid: it must be an integer >= 1"
    ):
        plan_run(compose_cfg(["model=tiny", "tokenizer=char", *override.split()]))


def test_data_loader_workers_are_bounded_by_the_machine(compose_cfg, monkeypatch) -> None:
    """data.num_workers is refused beyond four loader processes per usable core (at least 8), before any work;
    negative counts too."""
    from gptmini.training import hardware

    monkeypatch.setattr(hardware, "cpu_cores", lambda: 3)
    base = ["model=tiny", "tokenizer=char"]
    plan_run(compose_cfg([*base, "data.num_workers=12"]))  # 4 x 3 cores: allowed
    with pytest.raises(
        RunError,
        match=r"^data\.num_workers=13 is more than this machine can use: at most 12 loader processes here "
        r"\(3 usable CPU cores x 4\); lower it \(0 loads in the main process\)",
    ):
        plan_run(compose_cfg([*base, "data.num_workers=13"]))
    monkeypatch.setattr(hardware, "cpu_cores", lambda: 1)
    plan_run(compose_cfg([*base, "data.num_workers=8"]))  # never fewer than 8
    with pytest.raises(RunError, match=r"^data\.num_workers=1000000 is more than this machine can use"):
        plan_run(compose_cfg([*base, "data.num_workers=1000000"]))
    with pytest.raises(RunError, match=r"^data\.num_workers=-1 is invalid: it must be an integer >= 0"):
        plan_run(compose_cfg([*base, "data.num_workers=-1"]))


# --- the run plan: what the checks derive, the config unchanged ------------------------------------------------


def test_planning_derives_values_without_changing_the_config(compose_cfg, caplog) -> None:
    """A validation interval longer than the run is scaled down in the plan (and said); the composed config keeps
    what the user wrote, and the plan cannot be changed afterwards."""
    import dataclasses

    from gptmini.training.run.plan import plan_run

    cfg = compose_cfg(
        ["debug=smoke", "tokenizer=char", "trainer.max_steps=2", "trainer.accumulate_grad_batches=2"]
    )
    before = OmegaConf.to_container(cfg)
    plan = plan_run(cfg)
    assert OmegaConf.to_container(cfg) == before
    assert (cfg.trainer.val_check_interval, plan.trainer.val_check_interval, plan.training_batches) == (
        3,
        3,
        4,
    )
    plan = plan_run(compose_cfg(["debug=smoke", "tokenizer=char", "trainer.max_steps=2"]))
    assert plan.trainer.val_check_interval == 2 and plan.settings()["trainer"]["val_check_interval"] == 2
    assert "trainer.val_check_interval=3 is more than the run's 2 training batches" in caplog.text
    assert plan.trainer.precision == "32-true" and plan.trainer.max_steps == 2 and plan.resume is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.precision = "bf16-mixed"  # type: ignore[misc]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["data.batch_size=four"],
            r"^data\.batch_size='four' is invalid: Value 'four' of type 'str' could not be",
        ),
        (["trainer.log_every_n_steps=1.5"], r"^trainer\.log_every_n_steps=1\.5 is invalid: .*Integer"),
        (
            ["+trainer.max_stepz=3"],
            r"^trainer\.max_stepz is not a setting of lightning\.pytorch\.Trainer: its settings are .*max_steps.*; "
            r"drop it \(~trainer\.max_stepz\)",
        ),
        (
            ["+optimizer.hidden.momentun=0.9"],
            r"^optimizer\.hidden\.momentun is not a setting of optimizer\.hidden: its settings are adjust_lr_fn, "
            r"beta2, cautious_weight_decay, eps, lr, momentum, momentum_warmup_start, momentum_warmup_steps, "
            r"nesterov, normuon, ns_coefficients, ns_steps, weight_decay; drop it \(~optimizer\.hidden\.momentun\)",
        ),
        (
            ["+data.shuffle=true"],
            r"^data\.shuffle is not a setting of gptmini\.data\.datamodule\.TokenDataModule",
        ),
        (
            ["scheduler=constant", "scheduler.warmup_steps=-1"],
            r"^scheduler\.warmup_steps=-1 is invalid: it must be >= 0",
        ),
    ],
)
def test_each_group_s_schema_refuses_a_bad_key_or_type_in_one_line(compose_cfg, overrides, message) -> None:
    with pytest.raises(RunError, match=message) as err:
        plan_run(compose_cfg(["model=tiny", "tokenizer=char", *overrides]))
    assert "\n" not in str(err.value)


def _signature_defaults(cls) -> dict:
    """Every keyword parameter of ``cls``'s constructor with its default, a ``**kwargs`` followed into the base
    class's constructor (the oracle: ``inspect`` read directly)."""
    import inspect

    found: dict = {}
    for base in cls.__mro__ if inspect.isclass(cls) else [cls]:
        init = base.__dict__.get("__init__") if inspect.isclass(cls) else base
        if init is None or base is object:
            continue
        params = inspect.signature(init).parameters.values()
        for p in params:
            if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) or p.name == "self" or p.name in found:
                continue
            if base is not cls and p.default is p.empty:
                continue
            found[p.name] = list(p.default) if isinstance(p.default, tuple) else p.default
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return found


def _agree(schema, cls, key: str, skip: tuple = ()) -> None:
    import dataclasses
    import inspect

    constructor = _signature_defaults(cls)
    nested = getattr(cls, "settings_of", {})
    for f in dataclasses.fields(schema):
        if f.name.startswith("_"):
            continue
        assert f.name in constructor, (
            f"{key}.{f.name}: the schema has it, {cls.__name__}'s constructor does not"
        )
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if f.name in nested:
            _agree(f.type, *nested[f.name][:1], f"{key}.{f.name}", nested[f.name][1])
        elif constructor[f.name] is inspect.Parameter.empty:
            assert default == "???", f"{key}.{f.name}: required by the constructor, not by the schema"
        else:
            assert default == constructor[f.name], (
                f"{key}.{f.name}: default {default!r} != {constructor[f.name]!r}"
            )


@pytest.mark.parametrize("group", ["data", "optimizer", "scheduler", "trainer", "callbacks", "logger"])
def test_each_option_s_yaml_schema_and_constructor_agree(group, compose_cfg, tmp_path) -> None:
    """One source per key: an option's schema is its constructor's signature (each name and default, nested
    settings nodes too), and its YAML file sets settings of that schema only (no derived value, no key the
    constructor lacks). A setting added to a constructor is a setting, with its default, with no other edit."""
    from hydra.utils import get_object

    from gptmini.training.run.schema import BUILT_BY_THE_RUN, DERIVED, derived_of, schema_of, settings

    for option in _options(group):
        extra = [f"data.source={tmp_path}/corpus.txt"] if (group, option) == ("data", "text") else []
        composed = OmegaConf.to_container(compose_cfg([f"{group}={option}", *extra])[group])
        named = composed.items() if group in ("callbacks", "logger") else [(None, composed)]
        for name, node in named:
            if node is None:
                continue
            key = f"{group}.{name}" if name else group
            schema = schema_of(group, node["_target_"], key=key)
            cls = get_object(node["_target_"])
            _agree(schema, cls, key)
            taken = set(_signature_defaults(cls)) - set(BUILT_BY_THE_RUN[group])
            derived = set(derived_of(key))
            assert set(settings(schema)) | derived >= {
                k for k in taken if _representable(_signature_defaults(cls)[k])
            }, key
            written = {k for k in node if not k.startswith("_")}
            assert written <= set(settings(schema)), f"{group}={option}: {written - set(settings(schema))}"
            assert not {f"{key}.{k}" for k in written} & set(DERIVED), f"{group}={option} sets a derived key"


def _representable(value) -> bool:
    import inspect

    return (
        value is inspect.Parameter.empty or value is None or isinstance(value, (int, float, str, list, dict))
    )


def test_a_settings_schema_follows_its_constructor() -> None:
    """The schema of a class of one's own is its signature: a new parameter is a new setting with its default,
    a parameter without a default a required one, a ``**kwargs`` its base class's parameters."""
    import dataclasses

    from gptmini.training.run.schema import settings, signature_spec, spec_schema

    class Base:
        def __init__(self, needed: int, shared: float = 0.5) -> None: ...

    class Mine(Base):
        def __init__(self, size: int, rate: float = 0.1, name: str | None = None, **rest) -> None: ...

    schema = spec_schema(signature_spec(Mine), "Mine")
    assert settings(schema) == [
        "name",
        "rate",
        "shared",
        "size",
    ]  # Base's required `needed` is Mine's to pass
    assert [f.name for f in dataclasses.fields(schema) if f.default == "???"] == ["size"]  # required
    defaults = {f.name: f.default for f in dataclasses.fields(schema)}
    assert (defaults["rate"], defaults["shared"], defaults["name"]) == (0.1, 0.5, None)


def test_the_plan_reads_the_resume_checkpoint_once(compose_cfg, tmp_path, monkeypatch, caplog) -> None:
    """The resume checkpoint is read (and its checksum verified) once, by the plan, which keeps it for the checks
    once the data is prepared; only Lightning's own load reads it again."""
    import gptmini.runs.checkpoint as checkpoint
    from gptmini.model import GPT
    from gptmini.training.run.plan import plan_run

    path = tmp_path / "c.ckpt"
    overrides = ["model=tiny", "tokenizer=char", "model.vocab_size=16", "trainer=cpu", "trainer.max_steps=20"]
    cfg = compose_cfg([*overrides, f"ckpt_path={path}"])
    model = OmegaConf.to_container(cfg.model)
    model.pop("init_from")
    config = GPTConfig.from_dict(model)
    state = {f"model.{k}": v for k, v in GPT(config).state_dict().items()}
    hyper = {"model_config": config.to_dict(), "run_config": {}}
    checkpoint.atomic_save(
        {
            "state_dict": state,
            "hyper_parameters": hyper,
            "global_step": 5,
            "pytorch-lightning_version": "2.6.0",
            "optimizer_states": [],
        },
        path,
    )
    reads = []
    real = checkpoint.load_checkpoint
    monkeypatch.setattr(checkpoint, "load_checkpoint", lambda *a, **k: reads.append(a[0]) or real(*a, **k))
    plan = plan_run(cfg)
    assert reads == [str(path)]
    assert plan.ckpt_path == str(path) and plan.resume["global_step"] == 5 and plan.init_from is None

    # a changed dropout is said in the resume's line of changes (it was left out), and obeyed
    import logging

    with caplog.at_level(logging.INFO, logger="gptmini.training.run.resume"):
        plan = plan_run(compose_cfg([*overrides, f"ckpt_path={path}", "model.dropout=0.25"]))
    assert f"model.dropout {config.dropout} -> 0.25" in caplog.text and plan.model.dropout == 0.25


@pytest.mark.parametrize(
    ("overrides", "name"),
    [
        ([], "default"),
        (["tokenizer=char"], "shakespeare_char"),
        (["data=text", "data.source=/corpora/tinyshakespeare.txt", "tokenizer=bpe"], "tinyshakespeare_bpe"),
        (["data=text", "data.source=/corpora/my notes.txt"], "my_notes_gpt2"),
        (["experiment=shakespeare_char_cpu"], "shakespeare_char_cpu"),
        (["tokenizer=bpe", "run_name=mine"], "mine"),
    ],
)
def test_a_run_on_other_data_or_another_tokenizer_is_not_named_default(overrides, name, compose_cfg):
    from gptmini.training.run.run_folder import check_one_folder

    cfg = compose_cfg(overrides)
    assert cfg.run_name == name
    check_one_folder("run_name", cfg.run_name)  # one plain folder name


@pytest.mark.parametrize(
    ("target", "name", "value"),
    [
        (torch.optim.AdamW, "lr", -1.0),
        (torch.optim.AdamW, "eps", -1.0),
        (torch.optim.AdamW, "betas", (0.9, 1.5)),
        (torch.optim.AdamW, "weight_decay", -1.0),
        (torch.optim.Muon, "lr", -1.0),
        (torch.optim.Muon, "momentum", -1.0),
        (torch.optim.Muon, "weight_decay", -1.0),
        (torch.optim.Muon, "adjust_lr_fn", "bogus"),
    ],
)
def test_a_value_torch_refuses_without_naming_it_is_named_by_its_documented_range(target, name, value):
    """schema.THIRD_PARTY_RANGES against torch itself: what torch's constructor refuses (its message names no
    setting) the table refuses naming the key, along the class's bases (BatchedMuon is a torch.optim.Muon); the
    constructor's defaults pass."""
    import inspect

    from gptmini.training.loop.optimizers import BatchedMuon
    from gptmini.training.run.schema import out_of_range

    with pytest.raises(ValueError) as refused:
        target([torch.nn.Parameter(torch.zeros(4, 4))], **{name: value})
    assert f"optimizer.{name}" not in str(refused.value)
    owner = BatchedMuon if target is torch.optim.Muon else target
    assert out_of_range("optimizer", owner, {name: value}).startswith(
        f"optimizer.{name}={value!r} is invalid: "
    )
    defaults = {
        p.name: p.default for p in inspect.signature(target).parameters.values() if p.default is not p.empty
    }
    assert out_of_range("optimizer", owner, defaults) is None


def test_the_speedrun_validates_at_its_last_step_however_many_steps_it_is_given(compose_cfg):
    for steps in (None, 200):
        overrides = ["experiment=speedrun_char_cpu", "data.source=x.txt"]
        if steps is not None:
            overrides.append(f"trainer.max_steps={steps}")
        cfg = compose_cfg(overrides)
        assert cfg.trainer.val_check_interval == cfg.trainer.max_steps == (steps or 165)
