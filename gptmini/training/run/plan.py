"""The run plan: every check a run needs before any expensive work, and what they derive, in one frozen
``RunPlan`` that the rest of training reads (docs/architecture.md, "Plan"; the composed config is never changed).
Nothing here prepares data or builds the model: a bad run fails within the time it takes to import torch and
Lightning (whose Trainer's signature is the ``trainer`` group's schema).
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from gptmini import liger
from gptmini.data.corpora import EMBEDDED_SOURCES, is_url, path_problem
from gptmini.data.schema import check_data_settings
from gptmini.fileio import name_too_long, unwritable_reason
from gptmini.model import GPTConfig
from gptmini.runs.record import RECORD_VERSION, Lineage, RunRecord
from gptmini.training import hardware
from gptmini.training.errors import RunError
from gptmini.training.hardware import FLOAT16_AMP, DeviceFacts, resolve_precision
from gptmini.training.run.override_errors import REQUIRED_GROUPS, check_resolves, dropped_group
from gptmini.training.run.resume import read_resume, resolve_init_from
from gptmini.training.run.run_folder import command_overrides, hydra_config
from gptmini.training.run.schema import (
    DERIVED,
    PathsSchema,
    PerfSchema,
    Range,
    TokenizerSchema,
    TrainSchema,
    derived_of,
    out_of_range,
    schema_of,
    settings,
    target_spec,
    typed_node,
    unknown_keys,
)

log = logging.getLogger(__name__)

# the placeholder vocabulary of a model whose tokenizer's is known only once the data is prepared
VOCAB_PLACEHOLDER = 50257
# the char tokenizer's stand-in where the vocabulary's size matters before the corpus is read (an exact bigram table)
CHAR_VOCAB_PLACEHOLDER = 256


@dataclass(frozen=True)
class RunPlan:
    """What a run was checked to be, and the values derived from its config for the trainer, data and model."""

    model: GPTConfig  # vocab_size is a placeholder until the data is prepared when vocab_known is False
    vocab_known: bool
    # each instantiated group's settings, typed by its constructor's schema (gptmini.training.run.schema.schema_of),
    # the derived values (schema.DERIVED) filled in: what the run builds, with _target_ (and _partial_). The
    # trainer's precision is made concrete for this machine, its val_check_interval at most the run's batches.
    trainer: Any
    data: Any
    optimizer: Any
    scheduler: Any  # None: no schedule (a constant learning rate)
    callbacks: dict[str, Any]  # by their config name; null ones left out
    loggers: dict[str, Any]
    device: DeviceFacts
    # the top-level settings the build reads (their defaults: TrainSchema's)
    seed: int
    compile: bool
    retain_freed_memory: bool
    run_name: str
    output_dir: str
    output_root: str
    ckpt_path: str | None  # the checkpoint a resumed run starts from
    tokenizer: TokenizerSchema = dataclasses.field(default_factory=TokenizerSchema)
    resume: dict[str, Any] | None = None  # that checkpoint's global_step and record (as compared), read once
    # model.init_from resolved: the weights a fresh run starts from (a checkpoint file or a Hugging Face folder)
    init_from: str | None = None
    init_kind: str | None = None  # "checkpoint" or "hf": what init_from is
    hardware: str | None = None  # the hardware option chosen (None: composed without Hydra's choices)
    overrides: tuple[str, ...] = ()  # the command line's overrides

    @property
    def training_batches(self) -> int:  # micro-batches of one training process
        return self.trainer.max_steps * self.trainer.accumulate_grad_batches

    def record(self, model: GPTConfig, world_size: int, tensorboard_dir: str | None) -> RunRecord:
        """The run record of this plan, with what only the build knows: the model with the tokenizer's
        vocabulary, the training processes and the TensorBoard folder (relative to the run folder)."""
        return RunRecord(
            version=RECORD_VERSION,
            model=model.to_dict(),
            **self.settings(),
            run_name=self.run_name,
            hardware=self.hardware,
            precision=self.trainer.precision,
            overrides=self.overrides,
            init_from=self.init_from,
            world_size=world_size,
            tokens_per_step=self.tokens_per_step(model.block_size, world_size),
            tensorboard_dir=tensorboard_dir,
            output_dir=self.output_dir,
            continued_from=Lineage(os.path.abspath(self.ckpt_path), self.resumed_at)
            if self.ckpt_path is not None and self.resumed_at is not None
            else None,
        )

    def tokens_per_step(self, block_size: int, world_size: int) -> int:
        """Tokens of one optimizer step, over every process."""
        return self.data.batch_size * block_size * self.trainer.accumulate_grad_batches * world_size

    @property
    def resumed_at(self) -> int | None:
        """The step of the checkpoint a resumed run continues; None: a fresh run."""
        return int(self.resume.get("global_step") or 0) if self.resume is not None else None

    def settings(self) -> dict[str, Any]:
        """The typed groups as the run record keeps them, and as a resume compares them with a checkpoint's
        record (in this order: the line of changes follows it)."""
        return {
            "optimizer": dataclasses.asdict(self.optimizer) if self.optimizer is not None else {},
            "scheduler": dataclasses.asdict(self.scheduler) if self.scheduler is not None else None,
            "trainer": dataclasses.asdict(self.trainer),
            "callbacks": {k: node_values(v) for k, v in self.callbacks.items()},
            "tokenizer": dataclasses.asdict(self.tokenizer),
            "data": dataclasses.asdict(self.data),
            "seed": self.seed,
        }


def node_values(node: Any) -> dict[str, Any]:
    """A named node's typed settings (a callback's, a logger's) as plain data, what ``instantiate`` takes."""
    return dataclasses.asdict(node) if dataclasses.is_dataclass(node) else dict(node)


# what a model setting that names liger takes instead where liger cannot run
LIGER_FALLBACKS = {"loss": "model.loss=auto (chunked on a CPU)", "fused_ops": "model.fused_ops=none"}


def plan_run(cfg: DictConfig, device: DeviceFacts | None = None) -> RunPlan:
    """Cheap checks of everything a run needs, ``model.init_from``'s files included (the corpus's are
    ``check_data_files``'s, so that configs can be checked without it); raises ConfigError/RunError (or
    CheckpointError for an unsafe resume checkpoint or one of another model shape) naming the key."""
    hardware_choice = _check_required_groups()
    tokenizer, data = _checked_data(cfg)
    model, vocab_known = _model_config(cfg, tokenizer)
    # torch's own first: a bad optimizer setting fails before Lightning is imported (the trainer's schema)
    optimizer = typed_group(cfg, "optimizer")
    _check_optimizer(optimizer)
    trainer = typed_group(cfg, "trainer")
    _check_trainer(trainer)
    # the schedule's length from the typed trainer: trainer.max_steps='${oc.env:STEPS}' is text in the config
    typed = {f"trainer.{k}": getattr(trainer, k) for k in ("max_steps", "max_time")}
    scheduler = typed_group(cfg, "scheduler", typed)
    _check_scheduler(scheduler)
    callbacks = _named_nodes(cfg, "callbacks")
    loggers = _named_nodes(cfg, "logger")
    _check_top_level(cfg, callbacks, command_overrides())
    _check_optimizer_under_trainer(optimizer, trainer)
    device = hardware.detect_device() if device is None else device
    _check_cpu_processes(trainer, device)
    _check_liger(model, trainer, device)
    init_from = cfg.model.get("init_from")
    if init_from and cfg.get("ckpt_path") is not None:
        # a resumed run continues its own weights: init_from would be silently ignored
        raise RunError(
            f"model.init_from={init_from} and ckpt_path={cfg.ckpt_path} both say where the weights come from: "
            "drop model.init_from to resume that run, or drop ckpt_path to start a new run from those weights"
        )
    plan = RunPlan(
        model=model,
        vocab_known=vocab_known,
        trainer=trainer,
        data=data,
        optimizer=optimizer,
        scheduler=scheduler,
        callbacks=callbacks,
        loggers=loggers,
        device=device,
        ckpt_path=None,
        **{key: cfg[key] for key in ("seed", "compile", "retain_freed_memory", "run_name")},
        output_dir=str(cfg.paths.output_dir),
        output_root=str(cfg.paths.output_root),
        tokenizer=tokenizer,
        hardware=hardware_choice,
        overrides=tuple(command_overrides()),
    )
    trainer = dataclasses.replace(
        trainer, precision=_precision(plan, hardware_choice), val_check_interval=_val_check_interval(trainer)
    )
    plan = dataclasses.replace(plan, trainer=trainer)
    resume = read_resume(cfg.get("ckpt_path"), plan, cfg.get("target_val_loss"))
    if resume:
        return dataclasses.replace(plan, ckpt_path=resume[0], resume=resume[1])
    if not init_from:
        return plan
    init_kind, init_source = resolve_init_from(str(init_from), plan.output_root)
    if init_kind == "checkpoint":
        from gptmini.runs.checkpoint import load_checkpoint

        # a gptmini checkpoint (trained or imported): refused if not one
        load_checkpoint(init_source, mmap=True)
    else:
        from gptmini.hf.formats import hf_model_type

        hf_model_type(init_source)  # a folder of a format gptmini cannot read (its model_type) is refused
    return dataclasses.replace(plan, init_from=init_source, init_kind=init_kind)


def _check_required_groups() -> str | None:
    """Refuses a run without one of ``REQUIRED_GROUPS``; the hardware option chosen (None outside Hydra)."""
    hydra = hydra_config()
    if hydra is None:
        return None
    choices = hydra.runtime.choices
    for group in REQUIRED_GROUPS:
        if choices.get(group) is None:
            raise RunError(dropped_group(group))
    return choices.get("hardware")


def _check_composed_keys(cfg: DictConfig) -> None:
    """The groups typed at composition hold their schema's keys only: ``++tokenizer.foo=1`` forces a key in
    that the run would ignore (``model``'s are checked by ``GPTConfig`` itself)."""
    for group, schema in (("tokenizer", TokenizerSchema), ("paths", PathsSchema), ("perf", PerfSchema)):
        extra = sorted(str(k) for k in (cfg.get(group) or {}) if k not in set(settings(schema)))
        if extra:
            raise unknown_keys(group, group, schema, extra)
    extra = sorted(str(k) for k in cfg if k not in {f.name for f in dataclasses.fields(TrainSchema)})
    if extra:
        raise RunError(
            f"{extra[0]} is not a setting of the run: `gptmini train --cfg job` prints every setting; drop it "
            f"(~{extra[0]})"
        )


def plan_preparation(cfg: DictConfig) -> Any:
    """The ``data`` group's settings as the run builds the DataModule, after the run's checks of the data (its
    corpus, keys, tokenizer and folder): what ``gptmini data`` prepares. The model and the machine are the run's to
    check: a GPU run's data is prepared anywhere."""
    _check_required_groups()
    check_data_files(cfg)  # first, as the run: the resolvers of folder names read the corpus's path
    check_resolves(cfg)
    return _checked_data(cfg, build=False)[1]


def _checked_data(cfg: DictConfig, build: bool = True) -> tuple[TokenizerSchema, Any]:
    """The groups' keys, the tokenizer's settings and the data's, checked: the tokenizer and the data."""
    _check_composed_keys(cfg)
    _check_missing(cfg)
    _check_finite(cfg)
    tokenizer = TokenizerSchema(**OmegaConf.to_container(cfg.tokenizer, resolve=True))
    tokenizer.check()
    data = typed_group(cfg, "data")  # the derived values (the tokenizer, the context) filled in
    _check_data(data, build)
    _check_val_split(data)
    _check_data_dir(data)
    return tokenizer, data


def _typed(
    cfg: DictConfig,
    values: dict[str, Any],
    key: str,
    group: str,
    typed_values: Mapping[str, Any] | None = None,
) -> Any:
    """A node's resolved ``values`` (``group``'s at ``key``) read through its constructor's schema (``typed_node``),
    with the derived parameters the constructor takes (``DERIVED``): the value of ``typed_values`` (by full key)
    where given, else the config's. None for a ``_target_`` that does not import (its build reports it)."""
    typed = typed_node(values, key, group)
    if typed is None:
        return None
    full = schema_of(group, typed._target_, user=False)
    names = {f.name for f in dataclasses.fields(full)}
    sources = {name: DERIVED[f"{key}.{name}"][0] for name in derived_of(key) if name in names}
    derived = {
        name: (typed_values or {}).get(src, OmegaConf.select(cfg, src)) for name, src in sources.items()
    }
    return full(**dataclasses.asdict(typed), **derived)


def _named_nodes(cfg: DictConfig, group: str) -> dict[str, Any]:
    """``callbacks`` or ``logger``: each named node read through its constructor's schema, before any work (a
    misspelt key is refused here, not by the constructor after the seed is set)."""
    out = {}
    for name, node in (cfg.get(group) or {}).items():
        if node is not None and not isinstance(node, DictConfig):
            raise RunError(
                f"{group}.{name}={node} is invalid: each entry of {group} is the settings of one (a node with "
                f"_target_), or null to leave it out; drop it (~{group}.{name})"
            )
        if node is None or "_target_" not in node:
            continue  # off (null), or settings left for a callback the chosen option lacks (callbacks=none)
        values = OmegaConf.to_container(node, resolve=True)
        out[str(name)] = _typed(cfg, values, f"{group}.{name}", group) or values
    return out


def typed_group(cfg: DictConfig, group: str, typed_values: Mapping[str, Any] | None = None) -> Any:
    """``cfg[group]`` read through its option's schema (``_typed``); None for a null group."""
    node = cfg.get(group)
    if node is None:
        return None
    if "_target_" not in node:
        raise RunError(
            f"{group} has no _target_ (the class it builds): it was dropped or emptied; choose an option of "
            f"{group} (e.g. {group}=<option>, listed by `gptmini train --help`)"
        )
    return _typed(cfg, OmegaConf.to_container(node, resolve=True), group, group, typed_values)


def check_by_building(key: str, typed: Any, stand_in: Callable[[Any], Any] = lambda built: built) -> None:
    """Builds ``typed``'s object (a partial's called by ``stand_in`` on stand-in arguments), so that the
    constructor's own checks, written once where the setting is used, run before any work. gptmini's constructors
    name the setting's key in their refusal; a third-party constructor's documented ranges
    (``schema.THIRD_PARTY_RANGES``) are checked first, since its own refusal does not name the setting."""
    from hydra.errors import InstantiationException
    from hydra.utils import get_object, instantiate

    values = dataclasses.asdict(typed)
    refusal = out_of_range(key, get_object(values["_target_"]), values)
    if refusal is not None:
        raise RunError(refusal)
    try:
        stand_in(instantiate(values, _convert_="all"))
    # what a constructor raises for bad settings (torch.optim.AdamW: RuntimeError for fused and foreach both on)
    except (ValueError, TypeError, IndexError, KeyError, RuntimeError, InstantiationException) as err:
        cause = err.__cause__ if isinstance(err, InstantiationException) and err.__cause__ else err
        reason = (str(cause).splitlines() or [type(cause).__name__])[0]
        raise RunError(
            reason if reason.startswith(f"{key}.") else f"{key} ({values['_target_']}) is invalid: {reason}"
        ) from None


def _check_data(data: Any, build: bool = True) -> None:
    """The DataModule built (nothing is read or prepared until ``prepare_data``): its constructor's checks (not
    ``build``: those of its settings alone, for ``gptmini data``, which prepares without it); and its loader
    processes against this machine."""
    if build:
        check_by_building("data", data)
    else:
        check_data_settings(**dataclasses.asdict(data))
    workers = getattr(data, "num_workers", 0)
    if isinstance(workers, int) and workers > hardware.max_loader_workers():
        # each worker is a process holding its own copy of the loader's state: far more of them than cores
        # only costs memory and start-up (and enough of them exhaust the machine's processes)
        raise RunError(
            f"data.num_workers={workers} is more than this machine can use: at most "
            f"{hardware.max_loader_workers()} loader processes here ({hardware.cpu_cores()} usable CPU cores x 4); "
            "lower it (0 loads in the main process)"
        )


def _check_optimizer(optimizer: Any) -> None:
    """The optimizer built on stand-in parameters: its constructor's checks (torch's and gptmini's)."""
    from gptmini.training.loop.optimizers import ROLES

    def build(factory: Any) -> Any:
        if getattr(getattr(factory, "func", factory), "takes_parameter_roles", False):
            roles = {r: [torch.nn.Parameter(torch.zeros(4, 4))] for r in ROLES}
            return factory(roles)
        return factory([torch.nn.Parameter(torch.zeros(4, 4))])

    if optimizer is not None:
        check_by_building("optimizer", optimizer, build)


def _check_scheduler(scheduler: Any) -> None:
    """The schedule built on a stand-in optimizer: its constructor's checks."""

    def build(factory: Any) -> Any:
        return factory(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0))

    if scheduler is not None:
        check_by_building("scheduler", scheduler, build)


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


# What gptmini asks of the Lightning Trainer's settings beyond what its constructor checks.
TRAINER_RANGES = {
    "max_steps": Range(_positive_int, "it must be a positive number of optimizer steps"),
    # max_epochs=0 trained nothing and check_val_every_n_epoch=0 divided by zero after the model was built
    "max_epochs": Range(
        lambda v: v in (None, -1) or _positive_int(v),
        "it must be an integer >= 1, or null (-1: no limit; trainer.max_steps ends the run)",
    ),
    "check_val_every_n_epoch": Range(
        lambda v: v in (None, -1) or _positive_int(v), "it must be an integer >= 1, or null"
    ),
    "accumulate_grad_batches": Range(_positive_int, "it must be an integer >= 1"),
    # log_every_n_steps=0 logged nothing at all
    "log_every_n_steps": Range(lambda v: v is None or _positive_int(v), "it must be an integer >= 1"),
    "val_check_interval": Range(
        lambda v: not isinstance(v, (int, float)) or (v >= 1 if isinstance(v, int) else 0 < v <= 1),
        "a number of training batches must be >= 1, a fraction in (0, 1]",
    ),
    "gradient_clip_val": Range(lambda v: v is None or v >= 0, "it must be >= 0 (0 or null: no clipping)"),
}


def _check_trainer(trainer: Any) -> None:
    for name, allowed in TRAINER_RANGES.items():
        if not allowed.accepts(getattr(trainer, name)):
            raise RunError(f"trainer.{name}={getattr(trainer, name)} is invalid: {allowed.rule}")
    if trainer.max_time is not None:  # the schedules pace themselves by it too (and would be named first)
        from gptmini.training.loop.schedulers import max_time_seconds

        try:
            max_time_seconds(trainer.max_time)
        except ValueError as err:
            raise RunError(str(err)) from None


# what a key a run must be given takes, for its refusal
MISSING_EXAMPLES = {
    "model.init_from": " (e.g. model.init_from=/path/to/hf/gpt2)",
    "data.source": " (a text file, a folder or glob of text/JSONL/Parquet/Arrow files, or an http(s) URL, e.g. "
    "data.source=/path/to/corpus.txt)",
}


def _leaves(node: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    """Every value of a config's container as written (no interpolation resolved), by its full key."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, f"{key}.{k}" if key else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _leaves(v, f"{key}[{i}]")
    else:
        yield key, node


def _check_missing(cfg: DictConfig) -> None:
    # as written: data.data_dir names data.source's ???, which is the one to name
    missing = sorted(k for k, v in _leaves(OmegaConf.to_container(cfg, resolve=False)) if v == "???")
    missing += [k for k in cfg.get("required", []) if OmegaConf.select(cfg, k) is None and k not in missing]
    if missing:
        hint = MISSING_EXAMPLES.get(missing[0], "")
        raise RunError(f"{', '.join(missing)} must be set for this run: pass {missing[0]}=...{hint}")


def _check_top_level(cfg: DictConfig, callbacks: Mapping[str, Any], overrides: Sequence[str] = ()) -> None:
    """The top-level keys of ``TrainSchema``: the seed's range, the checkpoint interval, and a target loss or a
    checkpoint interval given on the command line (``overrides``) only with the callback that acts on it."""
    seed = cfg.get("seed")
    if not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise RunError(f"seed={seed} is invalid: it must be an integer in [0, 2**32)")
    if not _positive_int(cfg.checkpoint_every_n_steps):
        raise RunError(
            f"checkpoint_every_n_steps={cfg.checkpoint_every_n_steps} is invalid: it must be an integer >= 1"
        )
    target = cfg.get("target_val_loss")
    if target is not None and not _taken("target_val_loss", callbacks):
        raise RunError(
            f"target_val_loss={target} needs the callback that stops there (callbacks.stop_at_target, in "
            "callbacks=default): drop target_val_loss or use callbacks=default"
        )
    given = {o.lstrip("+").split("=", 1)[0] for o in overrides}
    if "checkpoint_every_n_steps" in given and not _taken("checkpoint_every_n_steps", callbacks):
        raise RunError(
            f"checkpoint_every_n_steps={cfg.checkpoint_every_n_steps} cannot act: no callback saves periodically "
            "(callbacks.checkpoint_last, in callbacks=default and callbacks=last; callbacks=final saves at the end "
            "only): drop checkpoint_every_n_steps or use callbacks=last"
        )


def _taken(setting: str, callbacks: Mapping[str, Any]) -> bool:
    """Whether a callback of the run's ``callbacks`` that ``setting`` is passed to (``DERIVED``) is on."""
    return any(
        source == setting and key.startswith("callbacks.") and key.split(".")[1] in callbacks
        for key, (source, _) in DERIVED.items()
    )


# The config groups whose numbers must be finite (a NaN or inf learning rate, weight decay, clipping value, RoPE
# base or target loss trained into NaNs, or never stopped, without a word).
NUMERIC_GROUPS = ("model", "optimizer", "scheduler", "trainer", "data", "callbacks", "perf")


def _check_finite(cfg: DictConfig) -> None:
    for key, value in _leaves(OmegaConf.to_container(cfg, resolve=False)):
        if key.split(".")[0] in NUMERIC_GROUPS and isinstance(value, float) and not math.isfinite(value):
            raise RunError(f"{key}={value} is invalid: it must be a finite number")
    target = cfg.get("target_val_loss")
    if isinstance(target, float) and not math.isfinite(target):
        raise RunError(f"target_val_loss={target} is invalid: a finite loss, or null (train to the end)")


def _model_config(cfg: DictConfig, tokenizer: TokenizerSchema) -> tuple[GPTConfig, bool]:
    """The model's config, checked by ``GPTConfig`` itself; a vocabulary not set yet is a placeholder (the
    tokenizer's, once the data is prepared, is checked again then): ``VOCAB_PLACEHOLDER``, or for an exact bigram
    table (``model.bigram_embed`` without buckets, sized by the vocabulary squared) a size nearer the tokenizer's."""
    values = OmegaConf.to_container(cfg.model, resolve=True)
    values.pop("init_from", None)
    vocab_known = values["vocab_size"] is not None
    if not vocab_known:
        exact_bigram = values.get("bigram_embed") and values.get("bigram_buckets") is None
        near = (
            CHAR_VOCAB_PLACEHOLDER if tokenizer.name == "char" else _tokenizer_vocab(tokenizer, build=False)
        )
        values["vocab_size"] = (near if exact_bigram else None) or VOCAB_PLACEHOLDER
    return GPTConfig.from_dict(values), vocab_known


def _tokenizer_vocab(tokenizer: TokenizerSchema, build: bool = True) -> int | None:
    """The tokenizer's vocabulary before the data is prepared: a BPE's the one it will be trained to, a fixed
    one's (not ``build``: None) from its encoding (cached for the run); None for the char tokenizer, whose
    vocabulary is the corpus's characters (a few hundred at most in practice)."""
    if tokenizer.name == "bpe":
        return tokenizer.vocab_size
    if tokenizer.name == "char" or not build:
        return None
    from gptmini.data.tokenizers import build_tokenizer

    return build_tokenizer(tokenizer.name).vocab_size


def _check_optimizer_under_trainer(optimizer: Any, trainer: Any) -> None:
    """An optimizer the trainer's strategy or precision cannot run: one that orthogonalises whole matrices under
    FSDP, and a fused AdamW step under float16 AMP with clipping."""
    from hydra.utils import get_object

    if optimizer is None:
        return
    strategy = (
        trainer.strategy.get("_target_", "") if isinstance(trainer.strategy, dict) else trainer.strategy
    )
    strategy = str(strategy).lower()
    if not getattr(get_object(optimizer._target_), "runs_under_fsdp", True) and "fsdp" in strategy:
        raise RunError(
            f"optimizer={optimizer._target_.rsplit('.', 1)[-1]} cannot run under FSDP (trainer.strategy={strategy}): "
            "Muon orthogonalises each whole matrix, which FSDP shards across devices. Use trainer=ddp, or "
            "optimizer=adamw with FSDP"
        )
    clip = trainer.gradient_clip_val
    if getattr(optimizer, "fused", None) and clip and trainer.precision in FLOAT16_AMP:
        raise RunError(
            f"optimizer.fused=true cannot be combined with trainer.precision={trainer.precision} and "
            f"trainer.gradient_clip_val={clip:g}: float16's GradScaler would have the fused step unscale the "
            "gradients after they are clipped. Drop optimizer.fused (gptmini then picks the multi-tensor kernel) "
            "or set trainer.gradient_clip_val=0"
        )


def _precision(plan: RunPlan, chosen: str | None) -> str:
    """The GPU a run asks for exists, and ``trainer.precision`` made concrete for the plan's device (the vocabulary
    matters only for "auto" on a CPU with bf16 tiles, so the tokenizer is built only there). ``chosen``: the
    hardware option (hardware=gpu, or an experiment naming it, sets trainer=gpu: the refusal names it)."""
    trainer, device = plan.trainer, plan.device
    if trainer.accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise RunError(
            "hardware=gpu asks for a CUDA GPU and no CUDA GPU is available on this machine (conf/hardware/gpu.yaml): "
            "use hardware=cpu, or run on a machine with a CUDA GPU"
            if chosen == "gpu"
            else "trainer.accelerator=gpu asks for a CUDA GPU and no CUDA GPU is available on this machine: use "
            "trainer=default or trainer=cpu, or run on a machine with a CUDA GPU"
        )
    # "auto" (resolve_precision), then the values the Trainer's signature declares (its stored spec)
    spec = {entry["name"]: entry for entry in target_spec("trainer", "lightning.pytorch.Trainer") or []}
    valid = ["auto", *dict.fromkeys(str(v) for v in spec["precision"]["literals"])]
    if str(trainer.precision) not in valid:
        raise RunError(
            f"trainer.precision={trainer.precision} is invalid: valid values are {', '.join(valid)}"
        )
    settings = {"precision": trainer.precision, "accelerator": trainer.accelerator}
    vocab = None
    if trainer.precision == "auto" and device.bf16 and not device.is_cuda:
        vocab = plan.model.vocab_size if plan.vocab_known else _tokenizer_vocab(plan.tokenizer)
    return resolve_precision(settings, device, vocab)


def _check_cpu_processes(trainer: Any, device: DeviceFacts) -> None:
    """Several CPU "devices" are several training processes (DDP over gloo): refused beyond the cores there
    are (each process would be slower than one alone), and said out loud when the config did not ask for DDP."""
    if not (
        trainer.accelerator == "cpu" or (trainer.accelerator == "auto" and not torch.cuda.is_available())
    ):
        return
    n = hardware.trainer_processes({"devices": trainer.devices, "accelerator": "cpu"})  # on this machine
    if n <= 1:
        return
    cores = hardware.cpu_cores()
    if n > cores:
        raise RunError(
            f"trainer.devices={n} on the CPU would start {n} training processes (DDP over gloo) on this machine's "
            f"{cores} CPU cores, each slower than one process alone: use trainer.devices={cores} or fewer "
            f"(e.g. trainer=ddp trainer.accelerator=cpu trainer.devices={cores}), or trainer.devices=1"
        )
    if trainer.strategy in (None, "auto"):
        log.warning(
            "trainer.devices=%d on the CPU: %d training processes (DDP over gloo) share this machine's %d cores, "
            "each with its own batch, so the global batch is %d x data.batch_size (trainer=ddp says so explicitly)",
            n,
            n,
            cores,
            n,
        )


def _check_liger(model: GPTConfig, trainer: Any, device: DeviceFacts) -> None:
    """``model.loss=liger`` and ``model.fused_ops=liger`` run liger-kernel's Triton kernels: refused before any work
    where the run will not be on a CUDA GPU with liger-kernel installed."""
    keys = [key for key in LIGER_FALLBACKS if getattr(model, key) == "liger"]
    if not keys:
        return
    on_cpu = not device.is_cuda or trainer.accelerator == "cpu"
    reason = "this run is on the CPU" if on_cpu else liger.unavailable()
    if reason is None:
        return
    raise RunError(
        f"liger-kernel's CUDA kernels ({', '.join(f'model.{key}=liger' for key in keys)}) cannot run: {reason}; "
        f"{liger.INSTALL} on a machine with a CUDA GPU, or use {' and '.join(LIGER_FALLBACKS[k] for k in keys)}"
    )


def _check_val_split(data: Any) -> None:
    """``data.val_fraction=0`` leaves no held-out split to validate on, and re-splits in place the prepared folder
    other runs of the corpus share (their validation then reads what this run trains on)."""
    fraction = getattr(data, "val_fraction", None)
    if isinstance(fraction, (int, float)) and not isinstance(fraction, bool) and fraction == 0:
        raise RunError(
            "data.val_fraction=0 leaves no held-out text to validate on and would re-split the prepared folder "
            "that other runs of this corpus share: keep a fraction in (0, 1) (e.g. 0.1), or skip validation with "
            "trainer.limit_val_batches=0"
        )


def _check_data_dir(data: Any) -> None:
    if not hasattr(data, "data_dir"):
        return  # a DataModule of the user's own
    data_dir = data.data_dir
    if data_dir is None:
        raise RunError(
            "data.data_dir=null would put the prepared data in the working folder's data/, not under "
            "paths.data_root: drop the override (its default is a folder under paths.data_root), or name a folder"
        )
    if name_too_long(data_dir):
        raise RunError(
            f"the prepared-data folder {str(data_dir)[:80]}...: {name_too_long(data_dir)}; pass a shorter path "
            "(paths.data_root or data.data_dir)"
        )
    if not (Path(data_dir) / "meta.json").is_file():
        reason = unwritable_reason(data_dir)
        if reason is not None:
            raise RunError(
                f"the prepared-data folder {data_dir} cannot be created: {reason}; pass paths.data_root=<a writable "
                "folder> (or data.data_dir=...)"
            )


def _val_check_interval(trainer: Any) -> int | float | None:
    """``trainer.val_check_interval``, at most the run's training batches: a short run of a long recipe (an
    experiment's interval, trainer.max_steps lowered) validates once, at the end, rather than being refused."""
    every = trainer.val_check_interval
    batches = trainer.max_steps * trainer.accumulate_grad_batches
    if isinstance(every, int) and not isinstance(every, bool) and every > batches:
        log.warning(
            "trainer.val_check_interval=%d is more than the run's %d training batches (trainer.max_steps x "
            "trainer.accumulate_grad_batches): validating once, at the end (trainer.val_check_interval=%d)",
            every,
            batches,
            batches,
        )
        return batches
    return every


# --- the files a run reads (the corpus, model.init_from), checked before anything else runs ---------------------


def check_data_files(cfg: DictConfig) -> None:
    """A local corpus path that does not exist fails here, before Lightning is even imported."""
    if "source" not in cfg.data or OmegaConf.is_missing(cfg.data, "source"):
        return
    source = cfg.data.get("source")
    if not isinstance(source, str) or not source:
        raise RunError(
            f"data.source={source!r} is invalid: expected 'shakespeare', a file, a folder, a glob or a URL"
        )
    if source in EMBEDDED_SOURCES or is_url(source):
        return
    if glob.has_magic(source):
        if not any(Path(p).is_file() for p in glob.iglob(source, recursive=True)):
            raise RunError(
                f"data.source={source!r} matches no files: check the pattern (quote it in the shell)"
            )
        return
    path = Path(source)
    problem = path_problem(path)
    if problem is not None:
        raise RunError(f"data.source={source} {problem}")
    if not path.exists():
        raise RunError(
            f"data.source={source} does not exist: expected 'shakespeare' (embedded), an existing text file, a "
            "folder or glob of text/JSONL/Parquet/Arrow files like 'texts/**/*.txt', or an http(s) URL"
        )
    if path.is_file() and path.stat().st_size == 0:
        raise RunError(f"data.source={source} is an empty file: point it at a UTF-8 text corpus")
