"""The run config's schema: one dataclass per conf group, or per option where a group's options have different
shapes (the optimizer's and the scheduler's), each with the checks of its own values beside it.

Two kinds of schema, for two kinds of group:

- Groups gptmini reads itself (``model``, ``tokenizer``, ``paths``, ``perf`` and the top-level keys) are typed
  at composition: ``TrainSchema`` is the first entry of conf/train.yaml's defaults, so a misspelt key or a value
  of the wrong type fails while Hydra composes the config.
- Groups that are instantiated (``data``, ``optimizer``, ``scheduler``, ``trainer``) are read through the
  schema of their option, chosen by ``_target_`` (``typed_group``), before any work: a key the option does not
  have (often one left by an experiment written for another option of the group, e.g. the speedrun's
  ``optimizer.hidden`` under ``optimizer=adamw``) is refused with one line naming it and how to drop it. They are
  not typed at composition because a config that swaps an option would then fail inside Hydra with a traceback
  of the merge, and ``+group.key=...`` could not add a setting the option takes.

A new option of such a group is one dataclass here with its ``_target_`` and ``@option_schema(group)`` (see
docs/configuration.md, "Adding an option"). ``callbacks`` and ``logger`` are open sets of named objects, each
checked by its own constructor when it is built.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field, fields, make_dataclass
from typing import Any, ClassVar, Optional, TypeVar

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from gptmini.model import GPTConfig
from gptmini.training.errors import RunError

T = TypeVar("T")


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


# --- typed at composition --------------------------------------------------------------------------------------


def _model_schema() -> type:
    """The ``model`` node's schema, derived from ``GPTConfig`` (its fields, types and defaults: one source), plus
    ``init_from``. ``vocab_size`` may be null: the tokenizer's vocabulary size, known once the data is prepared."""
    hints = typing.get_type_hints(GPTConfig)
    specs: list[tuple[str, Any, Any]] = []
    for f in fields(GPTConfig):
        if not f.init:
            continue  # derived fields (head_size, padded_vocab_size) are recomputed, never configured
        if f.name == "vocab_size":
            specs.append((f.name, Optional[int], field(default=None)))
        else:
            hint = hints[f.name]
            if isinstance(hint, types.UnionType):  # OmegaConf reads typing.Optional, not `int | None`
                hint = typing.Union[typing.get_args(hint)]  # noqa: UP007
            specs.append((f.name, hint, field(default=f.default)))
    # Load weights before training: a Hugging Face GPT-2 or Llama directory (config.json + model.safetensors).
    specs.append(("init_from", Optional[str], field(default=None)))
    return make_dataclass("ModelSchema", specs)


ModelSchema = _model_schema()


@dataclass
class TokenizerSchema:
    name: str = "gpt2"
    # tokenizer=bpe only (null for the others): the vocabulary to train and the bound on its training text
    vocab_size: Optional[int] = None
    train_bytes: Optional[int] = None

    def check(self) -> None:
        from gptmini.data.tokenizers import TokenizerError, available_tokenizers

        if self.name not in available_tokenizers():
            raise RunError(
                f"tokenizer.name={self.name!r} is unknown: valid names are {', '.join(available_tokenizers())}"
            )
        if self.name == "bpe":
            from gptmini.data.bpe import check_settings

            try:
                check_settings(self.vocab_size, self.train_bytes)
            except TokenizerError as e:
                raise RunError(str(e)) from None
            return
        for key in ("vocab_size", "train_bytes"):
            if getattr(self, key) is not None:
                raise RunError(
                    f"tokenizer.{key}={getattr(self, key)} applies to tokenizer=bpe only, not "
                    f"tokenizer={self.name}: drop it, or train a BPE with tokenizer=bpe tokenizer.{key}=..."
                )


@dataclass
class PathsSchema:
    data_root: str = "data"
    output_root: str = "outputs"
    output_dir: str = "${hydra:runtime.output_dir}"


@dataclass
class PerfSchema:
    # Peak dense FLOP/s of one device, for perf/mfu; null: looked up by the GPU's name (gptmini.training.hardware)
    peak_flops: Optional[float] = None


@dataclass
class TrainSchema:
    model: ModelSchema = field(default_factory=ModelSchema)
    tokenizer: TokenizerSchema = field(default_factory=TokenizerSchema)
    paths: PathsSchema = field(default_factory=PathsSchema)
    perf: PerfSchema = field(default_factory=PerfSchema)
    # Instantiated groups: read through their option's schema before any work (typed_group).
    data: Any = field(default_factory=dict)
    optimizer: Any = field(default_factory=dict)
    scheduler: Any = None
    trainer: Any = field(default_factory=dict)
    callbacks: Any = field(default_factory=dict)
    logger: Any = field(default_factory=dict)
    run_name: str = "default"
    seed: int = 1337
    # null: start fresh; "last": the most recently written last/on_exception checkpoint of this run_name; or a path.
    ckpt_path: Optional[str] = None
    compile: bool = False
    # CPU speed: keep freed memory in the process instead of re-faulting it every step (gptmini.training.run.allocator).
    retain_freed_memory: bool = True
    # Steps between periodic "last.ckpt" saves (a hard kill loses at most this many steps).
    checkpoint_every_n_steps: int = 100
    # End training at the first validation with val/loss at or below this (callbacks.stop_at_target); null: never.
    target_val_loss: Optional[float] = None
    # Keys an experiment needs the user to set (a "???" cannot override a schema default when configs merge).
    required: list[str] = field(default_factory=list)


def check_top_level(cfg: DictConfig) -> None:
    """The top-level keys of ``TrainSchema``: the seed's range, the checkpoint interval, and a target loss only
    with the callback that stops there."""
    seed = cfg.get("seed")
    if not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise RunError(f"seed={seed} is invalid: it must be an integer in [0, 2**32)")
    if not _positive_int(cfg.checkpoint_every_n_steps):
        raise RunError(
            f"checkpoint_every_n_steps={cfg.checkpoint_every_n_steps} is invalid: it must be an integer >= 1"
        )
    target = cfg.get("target_val_loss")
    if target is None:
        return
    stoppers = [
        c
        for c in (cfg.get("callbacks") or {}).values()
        if c is not None and c.get("_target_") == "gptmini.training.callbacks.guards.StopAtTargetLoss"
    ]
    if not stoppers:
        raise RunError(
            f"target_val_loss={target} needs the callback that stops there (callbacks.stop_at_target, in "
            "callbacks=default): drop target_val_loss or use callbacks=default"
        )


# The config groups whose numbers must be finite (a NaN or inf learning rate, weight decay, clipping value, RoPE
# base or target loss trained into NaNs, or never stopped, without a word).
NUMERIC_GROUPS = ("model", "optimizer", "scheduler", "trainer", "data", "callbacks", "perf")


def check_finite(cfg: DictConfig) -> None:
    def walk(node: Any, key: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{key}.{k}" if key else str(k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{key}[{i}]")
        elif isinstance(node, float) and not math.isfinite(node):
            raise RunError(f"{key}={node} is invalid: it must be a finite number")

    for group in NUMERIC_GROUPS:
        if group in cfg and cfg[group] is not None:
            walk(OmegaConf.to_container(cfg[group], resolve=False), group)
    target = cfg.get("target_val_loss")
    if isinstance(target, float) and not math.isfinite(target):
        raise RunError(f"target_val_loss={target} is invalid: a finite loss, or null (train to the end)")


# --- read through their option's schema --------------------------------------------------------------------------

# (group, _target_) -> the option's schema
OPTION_SCHEMAS: dict[tuple[str, str], type] = {}


def option_schema(group: str) -> Any:
    """Registers a dataclass as the schema of the ``group`` option whose ``_target_`` is its ``_target_`` default."""

    def register(cls: type[T]) -> type[T]:
        target = next(f.default for f in fields(cls) if f.name == "_target_")
        OPTION_SCHEMAS[(group, str(target))] = cls
        return cls

    return register


def settings(schema: type) -> list[str]:
    """A schema's settings, as a user writes them (Hydra's ``_target_``/``_partial_`` apart)."""
    return sorted(f.name for f in fields(schema) if not f.name.startswith("_"))


def _unknown_keys(schema: type, group: str, target: str, extra: list[str]) -> RunError:
    one = len(extra) == 1
    drop = " ".join(f"~{group}.{k}" for k in extra)
    hint = getattr(schema, "unknown_hint", None)
    text = hint(extra, drop) if hint is not None else None
    if text is None:
        text = f"its settings are {', '.join(settings(schema))}; drop {'it' if one else 'them'} ({drop})"
    return RunError(
        f"{', '.join(f'{group}.{k}' for k in extra)} {'is not a setting' if one else 'are not settings'} of "
        f"{target}: {text}"
    )


def typed_group(cfg: DictConfig, group: str) -> Any:
    """``cfg[group]`` read through its option's schema (None for a null group, or a ``_target_`` gptmini has no
    schema for: a class of the user's own, checked by its constructor when it is built), its checks run."""
    node = cfg.get(group)
    if node is None:
        return None
    target = str(node.get("_target_") or "")
    schema = OPTION_SCHEMAS.get((group, target))
    if schema is None:
        return None
    values = OmegaConf.to_container(node, resolve=True)
    extra = sorted(str(k) for k in values if k not in {f.name for f in fields(schema)})
    if extra:
        raise _unknown_keys(schema, group, target, extra)
    try:
        typed = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), values))
    except ConfigKeyError as err:  # a key a nested settings node (optimizer.hidden, ...) does not have
        key = f"{group}.{err.full_key}"
        owner = key.rsplit(".", 1)[0]
        known = settings(err.object_type) if dataclasses.is_dataclass(err.object_type) else []
        raise RunError(
            f"{key} is not a setting of {owner}: its settings are {', '.join(known)}; drop it (~{key})"
        ) from None
    except OmegaConfBaseException as err:  # a value of the wrong type
        key = f"{group}.{err.full_key}" if err.full_key else group
        value = getattr(err, "value", None)
        shown = f"={value!r}" if value is not None else ""
        raise RunError(f"{key}{shown} is invalid: {str(err.msg).splitlines()[0]}") from None
    typed.check(group)
    return typed


def _check_lr_and_decay(key: str, lr: float | None, weight_decay: float | None) -> None:
    if lr is not None and not lr > 0:
        raise RunError(f"{key}.lr={lr:g} is invalid: the learning rate must be > 0 (e.g. {key}.lr=1e-3)")
    if weight_decay is not None and weight_decay < 0:
        raise RunError(f"{key}.weight_decay={weight_decay:g} is invalid: it must be >= 0")


# the parameter roles of a role-built optimizer's settings (optimizer.hidden.lr, ...)
ROLE_KEYS = ("hidden", "embedding", "head", "matrix", "vector")


@option_schema("optimizer")
@dataclass
class AdamWSchema:
    """``optimizer=adamw``: ``torch.optim.AdamW`` as a partial; the module adds the parameter groups."""

    _target_: str = "torch.optim.AdamW"
    _partial_: bool = True
    lr: float = 1e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    weight_decay: float = 0.01
    amsgrad: bool = False
    maximize: bool = False
    foreach: Optional[bool] = None
    capturable: bool = False
    differentiable: bool = False
    fused: Optional[bool] = None

    @staticmethod
    def unknown_hint(extra: list[str], drop: str) -> str | None:
        if not all(k in ROLE_KEYS for k in extra):
            return None
        one = len(extra) == 1
        return (
            f"{'it is a per-role setting' if one else 'they are per-role settings'} of optimizer=muon: use "
            f"optimizer=muon, or drop {'it' if one else 'them'} ({drop})"
        )

    def check(self, key: str) -> None:
        _check_lr_and_decay(key, self.lr, self.weight_decay)


@dataclass
class MuonRoleSchema:
    """``optimizer.hidden``: torch.optim.Muon's settings for the blocks' 2-D hidden matrices."""

    lr: float = 0.02
    weight_decay: float = 0.0
    momentum: float = 0.95
    nesterov: bool = True
    ns_steps: int = 5
    eps: Optional[float] = None
    # "original": Keller Jordan's scale; "match_rms_adamw": Moonshot's, for reusing AdamW's lr and weight decay
    adjust_lr_fn: Optional[str] = None
    # BatchedMuon's options beyond torch.optim.Muon's (gptmini.training.loop.optimizers.MUON_OPTIONS), all off by
    # default. The switches are Any, not bool: OmegaConf would read 3 or "yes" as true, while the optimizer is
    # built from the config as written and takes only true or false (checked below).
    normuon: Any = False
    beta2: float = 0.95
    cautious_weight_decay: Any = False
    momentum_warmup_steps: int = 0
    momentum_warmup_start: float = 0.85

    def check(self, key: str) -> None:
        from gptmini.training.loop.optimizers import MUON_OPTIONS, check_muon_options

        _check_lr_and_decay(key, self.lr, self.weight_decay)
        try:
            check_muon_options({k: getattr(self, k) for k in MUON_OPTIONS}, key)
        except ValueError as err:
            raise RunError(str(err)) from None


@dataclass
class AdamWSharedSchema:
    """``optimizer.adamw``: what the AdamW roles share."""

    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8


@dataclass
class RoleSchema:
    """``optimizer.embedding|head|matrix|vector``: one AdamW parameter group."""

    lr: Optional[float] = None
    weight_decay: Optional[float] = None
    # decay only where the Adam step moves the weight towards zero (Any, not bool: see MuonRoleSchema)
    cautious_weight_decay: Any = False

    def check(self, key: str) -> None:
        _check_lr_and_decay(key, self.lr, self.weight_decay)
        if not isinstance(self.cautious_weight_decay, bool):
            raise RunError(
                f"{key}.cautious_weight_decay={self.cautious_weight_decay!r} is invalid: true or false"
            )


@option_schema("optimizer")
@dataclass
class MuonAdamWSchema:
    """``optimizer=muon``: Muon on the hidden matrices, AdamW on the rest, one parameter group per role."""

    _target_: str = "gptmini.training.loop.optimizers.MuonAdamW"
    _partial_: bool = True
    hidden: MuonRoleSchema = field(default_factory=MuonRoleSchema)
    adamw: AdamWSharedSchema = field(default_factory=AdamWSharedSchema)
    embedding: RoleSchema = field(default_factory=RoleSchema)
    head: RoleSchema = field(default_factory=RoleSchema)
    matrix: RoleSchema = field(default_factory=RoleSchema)
    vector: RoleSchema = field(default_factory=RoleSchema)
    fused: Optional[bool] = None
    foreach: Optional[bool] = None
    # Muon orthogonalises each whole matrix, which FSDP shards across devices
    runs_under_fsdp: ClassVar[bool] = False

    @staticmethod
    def unknown_hint(extra: list[str], drop: str) -> str:
        roles = settings(MuonAdamWSchema)
        return (
            f"its settings are per parameter role ({', '.join(r for r in roles if r not in ('fused', 'foreach'))}), "
            "e.g. optimizer.hidden.lr=0.02 (Muon) or optimizer.embedding.lr=3e-3 (AdamW); drop the flat key (an "
            "experiment written for optimizer=adamw sets optimizer.lr)"
        )

    def check(self, key: str) -> None:
        for role in ROLE_KEYS:
            getattr(self, role).check(f"{key}.{role}")


def _check_warmup(key: str, warmup_steps: int) -> None:
    if warmup_steps < 0:
        raise RunError(f"{key}.warmup_steps={warmup_steps} is invalid: it must be >= 0")


def _check_max_time(max_time: Optional[str]) -> None:
    from gptmini.training.loop.schedulers import max_time_seconds

    try:
        max_time_seconds(max_time)
    except ValueError as err:
        raise RunError(str(err)) from None


def _check_min_lr_ratio(key: str, min_lr_ratio: float) -> None:
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise RunError(f"{key}.min_lr_ratio={min_lr_ratio:g} is invalid: it must be in [0, 1]")


@option_schema("scheduler")
@dataclass
class WarmupCosineSchema:
    """``scheduler=warmup_cosine``."""

    _target_: str = "gptmini.training.loop.schedulers.WarmupCosineLR"
    _partial_: bool = True
    max_steps: int = 1
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1
    max_time: Optional[str] = None

    def check(self, key: str) -> None:
        _check_warmup(key, self.warmup_steps)
        _check_min_lr_ratio(key, self.min_lr_ratio)
        _check_max_time(self.max_time)


@option_schema("scheduler")
@dataclass
class WarmupStableDecaySchema:
    """``scheduler=wsd``."""

    _target_: str = "gptmini.training.loop.schedulers.WarmupStableDecayLR"
    _partial_: bool = True
    max_steps: int = 1
    warmup_steps: int = 0
    decay_fraction: float = 0.3
    min_lr_ratio: float = 0.0
    decay_shape: str = "linear"
    max_time: Optional[str] = None

    def check(self, key: str) -> None:
        from gptmini.training.loop.schedulers import check_wsd

        try:
            check_wsd(self.decay_fraction, self.min_lr_ratio, self.decay_shape)
        except ValueError as err:
            raise RunError(str(err)) from None
        _check_warmup(key, self.warmup_steps)
        _check_min_lr_ratio(key, self.min_lr_ratio)
        _check_max_time(self.max_time)


@option_schema("scheduler")
@dataclass
class WarmupConstantSchema:
    """``scheduler=constant``."""

    _target_: str = "gptmini.training.loop.schedulers.WarmupConstantLR"
    _partial_: bool = True
    warmup_steps: int = 0

    def check(self, key: str) -> None:
        _check_warmup(key, self.warmup_steps)


def _check_at_least(key: str, value: Any, low: int, note: str = "") -> None:
    if value is not None and not (_positive_int(value) and value >= low):
        raise RunError(f"{key}={value} is invalid: it must be an integer >= {low}{note}")


@option_schema("data")
@dataclass
class DataSchema:
    """``data``: gptmini's token DataModule (every option of the group; ``train_samples`` comes from the plan)."""

    _target_: str = "gptmini.data.datamodule.TokenDataModule"
    source: str = "shakespeare"
    tokenizer: str = "gpt2"
    data_dir: Optional[str] = None
    block_size: int = 256
    batch_size: int = 32
    num_workers: int = 0
    val_fraction: float = 0.1
    val_stride: Optional[int] = None
    seed: int = 1337
    pin_memory: Optional[bool] = None
    force_prepare: bool = False
    text_field: str = "text"
    shard_tokens: int = 100_000_000
    buffer_mb: int = 64
    prepare_threads: Optional[int] = None
    # tokenizer=bpe's settings, as the tokenizer group gives them (checked there)
    tokenizer_vocab_size: Optional[int] = None
    tokenizer_train_bytes: Optional[int] = None

    def check(self, key: str) -> None:
        from gptmini.training import hardware

        _check_at_least(f"{key}.batch_size", self.batch_size, 1)
        if self.num_workers < 0:
            raise RunError(
                f"{key}.num_workers={self.num_workers} is invalid: it must be an integer >= 0 (0: load in the "
                "main process)"
            )
        if self.num_workers > hardware.max_loader_workers():
            # each worker is a process holding its own copy of the loader's state: far more of them than cores
            # only costs memory and start-up (and enough of them exhaust the machine's processes)
            raise RunError(
                f"{key}.num_workers={self.num_workers} is more than this machine can use: at most "
                f"{hardware.max_loader_workers()} loader processes here ({hardware.cpu_cores()} usable CPU cores x 4); lower it (0 "
                "loads in the main process)"
            )
        _check_at_least(f"{key}.shard_tokens", self.shard_tokens, 1)
        _check_at_least(f"{key}.buffer_mb", self.buffer_mb, 1)
        _check_at_least(
            f"{key}.prepare_threads", self.prepare_threads, 1, " (or null: one thread per core, at most 8)"
        )
        _check_at_least(
            f"{key}.val_stride",
            self.val_stride,
            1,
            " (or null: non-overlapping windows, stride = block_size)",
        )
        if not 0.0 <= self.val_fraction < 1.0:
            raise RunError(
                f"{key}.val_fraction={self.val_fraction:g} is invalid: it must be in [0, 1) (0.1 is a good default)"
            )


@option_schema("trainer")
@dataclass
class TrainerSchema:
    """``trainer``: the Lightning Trainer settings gptmini's configs use (``+trainer.X`` adds one of these)."""

    _target_: str = "lightning.pytorch.Trainer"
    accelerator: str = "auto"
    devices: Any = 1  # an integer, "auto" or a list of device indices
    num_nodes: int = 1
    strategy: Any = "auto"  # a name, or a strategy node with its own _target_
    use_distributed_sampler: bool = False
    precision: str = "auto"
    max_steps: int = -1
    max_epochs: Optional[int] = -1
    min_steps: Optional[int] = None
    max_time: Optional[str] = None
    val_check_interval: Any = None  # training batches (an integer) or a fraction of an epoch (a float)
    check_val_every_n_epoch: Optional[int] = None
    limit_train_batches: Any = None
    limit_val_batches: Any = None
    overfit_batches: Any = 0.0
    num_sanity_val_steps: int = 0
    log_every_n_steps: int = 50
    gradient_clip_val: Optional[float] = None
    gradient_clip_algorithm: Optional[str] = None
    accumulate_grad_batches: int = 1
    enable_model_summary: bool = True
    enable_progress_bar: Optional[bool] = None
    enable_checkpointing: Optional[bool] = None
    deterministic: Any = False  # a bool or "warn"
    benchmark: Optional[bool] = None
    detect_anomaly: bool = False
    default_root_dir: Optional[str] = None

    def check(self, key: str) -> None:
        if not _positive_int(self.max_steps):
            raise RunError(
                f"{key}.max_steps={self.max_steps} is invalid: it must be a positive number of optimizer steps"
            )
        if not _positive_int(self.accumulate_grad_batches):
            raise RunError(
                f"{key}.accumulate_grad_batches={self.accumulate_grad_batches} is invalid: it must be an "
                "integer >= 1"
            )
        every = self.val_check_interval
        if isinstance(every, int) and not isinstance(every, bool) and every <= 0:
            raise RunError(
                f"{key}.val_check_interval={every} is invalid: it counts training batches and must be >= 1"
            )
        if isinstance(every, float) and not 0.0 < every <= 1.0:
            raise RunError(f"{key}.val_check_interval={every} is invalid: a fraction must be in (0, 1]")
        clip = self.gradient_clip_val
        if clip is not None and clip < 0:
            raise RunError(
                f"{key}.gradient_clip_val={clip:g} is invalid: it must be >= 0 (0 or null: no clipping)"
            )

    @property
    def strategy_name(self) -> str:
        strategy = self.strategy
        return str(strategy.get("_target_", "") if isinstance(strategy, dict) else strategy).lower()

    @property
    def world_size(self) -> int | None:
        """Training processes, when the config says (None: "auto" or a list, known once the trainer exists)."""
        devices, nodes = self.devices, self.num_nodes
        if isinstance(devices, int) and not isinstance(devices, bool):
            return max(devices, 1) * max(nodes, 1)
        return None
