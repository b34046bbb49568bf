"""The run config's schema, each setting declared once, where it is used (docs/configuration.md, "Schemas").

The groups that are instantiated are not typed at composition because a config that swaps an option would then
fail inside Hydra with a traceback of the merge, and ``+group.key=...`` could not add a setting the option takes.
Values that follow from another group (``DERIVED``) are no settings: the plan fills them in.

This module reads no config: the plan walks the composed config and hands each node's values here.
"""

from __future__ import annotations

import builtins
import copy
import dataclasses
import functools
import hashlib
import importlib.metadata
import inspect
import json
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, make_dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from gptmini.model import GPTConfig
from gptmini.options import DEFAULT_SEED
from gptmini.training.errors import RunError

# --- typed at composition --------------------------------------------------------------------------------------


_SIMPLE = (int, float, bool, str)


def _field_type(hint: Any) -> Any:
    """``hint`` as OmegaConf types a field: a plain type, an optional one, a settings dataclass, else Any."""
    if hint in _SIMPLE or dataclasses.is_dataclass(hint):
        return hint
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(hint)) == 2 and args[0] in _SIMPLE:
            return Optional[args[0]]
    return Any


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
            # OmegaConf would read model.bias=3 as true: GPTConfig checks its switches itself
            hint = Any if hints[f.name] is bool else _field_type(hints[f.name])
            specs.append((f.name, hint, field(default=f.default)))
    help_ = "Load weights before training: a Hugging Face GPT-2, Llama or Qwen3 directory (config.json + model.safetensors)."
    specs.append(("init_from", Optional[str], field(default=None, metadata={"help": help_})))
    return make_dataclass("ModelSchema", specs)


ModelSchema = _model_schema()


@dataclass
class TokenizerSchema:
    # "gpt2" (tiktoken's GPT-2 BPE, offline), "char" (one token per character), "bpe" (a byte-level BPE trained on
    # the corpus) or another tiktoken encoding's name
    name: str = "gpt2"
    # tokenizer=bpe only (null for the others): the vocabulary to train
    vocab_size: Optional[int] = None
    # tokenizer=bpe only (null for the others): the bound on the BPE's training text, in bytes
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
    # Where prepared data folders go (with data.data_dir null: one per corpus and tokenizer)
    data_root: str = "${hydra:runtime.cwd}/data"
    # Where run folders go: <output_root>/<run_name>/<time>/
    output_root: str = "outputs"
    # This run's folder, as Hydra makes it (not set by hand)
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
    # Instantiated groups: read through their constructor's schema before any work (typed_node, by the plan).
    data: Any = field(default_factory=dict)
    optimizer: Any = field(default_factory=dict)
    scheduler: Any = None
    trainer: Any = field(default_factory=dict)
    callbacks: Any = field(default_factory=dict)
    logger: Any = field(default_factory=dict)
    # The run's name: its folder under paths.output_root and the run ckpt_path=last resumes ("default" for the
    # embedded corpus in GPT-2's BPE, else <corpus name>_<tokenizer>).
    run_name: str = "${default_run_name:${oc.select:data.source,null},${tokenizer.name}}"
    # Seeds the weights, the data order and the dropout masks (an integer in [0, 2**32)).
    seed: int = DEFAULT_SEED
    # null: start fresh; "last": the most recently written last/on_exception checkpoint of this run_name; or a path.
    ckpt_path: Optional[str] = None
    # torch.compile the model before training.
    compile: bool = False
    # CPU speed: keep freed memory in the process instead of re-faulting it every step (gptmini.training.hardware.retain_freed_memory).
    retain_freed_memory: bool = True
    # Steps between periodic "last.ckpt" saves (a hard kill loses at most this many steps).
    checkpoint_every_n_steps: int = 100
    # End training at the first validation with val/loss at or below this (callbacks.stop_at_target); null: never.
    target_val_loss: Optional[float] = None
    # Keys an experiment needs the user to set (a "???" cannot override a schema default when configs merge).
    required: list[str] = field(default_factory=list)


# --- read through their constructor's signature ----------------------------------------------------------------

# The parameters of each instantiated group's constructors that the run passes itself: never a setting.
BUILT_BY_THE_RUN: dict[str, tuple[str, ...]] = {
    "data": ("train_samples",),
    "optimizer": ("params", "roles", "stacked"),
    "scheduler": ("optimizer", "last_epoch"),
    "trainer": ("callbacks", "logger", "plugins"),
    "callbacks": (),
    "logger": (),
}

# Values that follow from another group's setting: the plan derives them (RunPlan.data, RunPlan.scheduler), so
# they are no settings of their own group. Each: the setting it follows, and how the user sets that.
DERIVED: dict[str, tuple[str, str]] = {
    "data.tokenizer": ("tokenizer.name", "tokenizer=<name> (the tokenizer group: gpt2, char, bpe)"),
    "data.block_size": ("model.block_size", "model.block_size=<tokens>"),
    "data.tokenizer_vocab_size": ("tokenizer.vocab_size", "tokenizer.vocab_size=<n> (tokenizer=bpe)"),
    "data.tokenizer_train_bytes": ("tokenizer.train_bytes", "tokenizer.train_bytes=<n> (tokenizer=bpe)"),
    # the schedule's length is the run's
    "scheduler.max_steps": ("trainer.max_steps", "trainer.max_steps=<steps>"),
    "scheduler.max_time": ("trainer.max_time", 'trainer.max_time="DD:HH:MM:SS"'),
    # one setting of the run, passed to the parts that use it (a named callback's by its name)
    "data.seed": ("seed", "seed=<n>"),
    "callbacks.rng_state.seed": ("seed", "seed=<n>"),
    "callbacks.checkpoint_last.every_n_train_steps": (
        "checkpoint_every_n_steps",
        "checkpoint_every_n_steps=<steps>",
    ),
    "callbacks.stop_at_target.target": ("target_val_loss", "target_val_loss=<loss>"),
    "callbacks.throughput.peak_flops": ("perf.peak_flops", "perf.peak_flops=<FLOP/s>"),
}


def derived_of(key: str) -> tuple[str, ...]:
    """The derived parameters of the node at ``key`` (a group, or a named callback: ``callbacks.rng_state``)."""
    return tuple(k[len(key) + 1 :] for k in DERIVED if k.rsplit(".", 1)[0] == key)


def derived_refusal(key: str, value: Any = None) -> str:
    """The one line refusing a derived ``key`` set on its own."""
    source, how = DERIVED[key]
    shown = f"={value}" if value is not None else ""
    return f"{key}{shown} is not a setting: the run derives it from {source}; set {how} instead"


def _representable(value: Any) -> bool:
    if value is inspect.Parameter.empty or value is None or isinstance(value, _SIMPLE):
        return True
    if isinstance(value, (list, tuple)):
        return all(_representable(v) for v in value)
    return isinstance(value, dict) and all(_representable(v) for v in value.values())


def _parameters(target: Any) -> list[tuple[inspect.Parameter, Any]]:
    """``target``'s keyword parameters with their type hints. A class's ``**kwargs`` are its base class's
    parameters (``BatchedMuon``'s go to ``torch.optim.Muon``): followed along the MRO."""
    if not inspect.isclass(target):
        functions = [target]
    else:
        functions = []
        for cls in target.__mro__:
            init = cls.__dict__.get("__init__")
            if init is None or cls is object:
                continue
            functions.append(inspect.unwrap(init))
            if not any(p.kind is p.VAR_KEYWORD for p in inspect.signature(init).parameters.values()):
                break
    found: dict[str, tuple[inspect.Parameter, Any]] = {}
    for i, fn in enumerate(functions):
        try:
            hints = typing.get_type_hints(fn)
        except Exception:  # an annotation that does not resolve here: the settings are untyped, still named
            hints = {}
        for p in inspect.signature(fn).parameters.values():
            if p.name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.name in found:
                continue
            if i > 0 and p.default is p.empty:
                continue  # a base class's required parameter: the subclass passes it itself
            if not _representable(p.default):
                continue  # an object no config can write (a theme, a policy instance): not a setting
            found[p.name] = (p, hints.get(p.name, Any))
    return list(found.values())


def signature_spec(target: Any, skip: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """``target``'s settings as JSON: each parameter's name, its field ``type`` (``_field_type``: a name, a
    nested spec for a ``settings_of`` node, or "any" with the plain ``kinds`` and ``literals`` its hint takes),
    and its ``default`` (absent: required). ``skip``: what the run passes itself."""
    nested = getattr(target, "settings_of", {})
    spec = []
    for p, hint in _parameters(target):
        if p.name in skip:
            continue
        typ = _field_type(hint)
        entry: dict[str, Any] = {"name": p.name}
        if p.name in nested:
            entry["type"] = signature_spec(*nested[p.name])
        elif isinstance(p.default, (list, tuple, dict)) or typ is Any:
            kinds, literals = _kinds(hint)
            entry |= {"type": "any", "kinds": sorted(k.__name__ for k in kinds if k in (*_SIMPLE, object))}
            entry |= (
                {"literals": sorted(literals, key=lambda v: (str(v), type(v).__name__))} if literals else {}
            )
        else:
            entry["type"] = next((n for n, t in _TYPES.items() if t == typ), "any")
        if p.default is not p.empty:
            entry["default"] = list(p.default) if isinstance(p.default, tuple) else p.default
        spec.append(entry)
    return spec


_TYPES = {t.__name__: t for t in _SIMPLE} | {f"{t.__name__}?": Optional[t] for t in _SIMPLE}


def spec_schema(spec: list[dict[str, Any]], name: str, skip: tuple[str, ...] = (), node: bool = True) -> type:
    """The dataclass of a ``signature_spec``, without ``skip``; ``node``: with Hydra's ``_target_`` and
    ``_partial_`` (a group's node; not a nested settings node). A setting without a default is ``???``."""
    specs: list[tuple[str, Any, Any]] = []
    for entry in spec:
        if entry["name"] in skip:
            continue
        typ = entry["type"]
        typ = spec_schema(typ, entry["name"], node=False) if isinstance(typ, list) else _TYPES.get(typ, Any)
        default = entry.get("default", "???")  # OmegaConf's mark of a value that must be set
        mutable = isinstance(default, (list, dict))
        made = (
            field(default_factory=lambda d=default: copy.deepcopy(d)) if mutable else field(default=default)
        )
        specs.append((entry["name"], typ, made))
    hydra = [("_target_", str, field(default="")), ("_partial_", bool, field(default=False))] if node else []
    return make_dataclass(f"{name}Settings", [*hydra, *specs])


def settings(schema: type) -> list[str]:
    """A schema's settings, as a user writes them (Hydra's ``_target_``/``_partial_`` apart)."""
    return sorted(f.name for f in fields(schema) if not f.name.startswith("_"))


# Each option's constructor settings (``signature_spec``), keyed "group target", with the stamp of the code they
# were read from: composing a config and planning it then import no option's class.
# ``python scripts/settings_page.py --specs`` writes it; tests/unit/training/test_settings_once.py checks it.
SPECS_FILE = Path(__file__).with_name("settings_specs.json")


def code_stamp(target: str) -> str | None:
    """What a target's signature depends on, without importing it: the SHA-256 of a gptmini module's source, else
    the installed version of the distribution named like its top-level package (None: unknown)."""
    module, top = target.rsplit(".", 1)[0], target.split(".")[0]
    if top == "gptmini":
        source = Path(__file__).parents[2].joinpath(*module.split(".")[1:]).with_suffix(".py")
        return hashlib.sha256(source.read_bytes()).hexdigest() if source.is_file() else None
    try:
        return importlib.metadata.version(top)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def _stored_specs() -> dict[str, Any]:
    return json.loads(SPECS_FILE.read_text()) if SPECS_FILE.is_file() else {}


@functools.cache
def target_spec(group: str, target: str) -> list[dict[str, Any]] | None:
    """The settings of ``group``'s option whose ``_target_`` is ``target``: from ``SPECS_FILE`` where its stamp
    is the code's, else read from the signature (a class of the user's own). None when ``target`` cannot be
    imported (a class of the user's own that fails to import fails when built)."""
    stored = _stored_specs().get(f"{group} {target}")
    if stored is not None and stored["stamp"] is not None and stored["stamp"] == code_stamp(target):
        return stored["settings"]
    from hydra.utils import get_object

    try:
        obj = get_object(target)
    except Exception:  # hydra raises ImportError or its own error, with the import's reason
        return None
    return signature_spec(obj, BUILT_BY_THE_RUN.get(group, ()))


@functools.cache
def schema_of(group: str, target: str, user: bool = True, key: str | None = None) -> type | None:
    """The schema of the ``group`` option (at ``key``, by default ``group``) whose ``_target_`` is ``target``
    (``target_spec``); ``user``: without the derived values (``DERIVED``), the settings a user writes."""
    spec = target_spec(group, target)
    skip = derived_of(key or group) if user else ()
    return None if spec is None else spec_schema(spec, target.rsplit(".", 1)[-1], skip)


# The groups built from their ``_target_``: one node each, or named nodes (``callbacks.<name>``, ``logger.<name>``).
INSTANTIATED = ("data", "optimizer", "scheduler", "trainer")
NAMED = ("callbacks", "logger")


def option_settings(conf: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """Every setting of each option of the instantiated groups in ``conf`` (by group and option), with its
    constructor's default: what conf/train.yaml's ``settings/<group>`` entries merge in before the option's own
    values, so that an option file writes only what it chooses differently and the composed config (``gptmini
    train --cfg job``, ``.hydra/config.yaml``, the checkpoints) still holds every setting with its value. Required
    settings are left out (the plan names one missing), as are nodes whose ``_target_`` does not import."""
    out = {}
    for group in (*INSTANTIATED, *NAMED):
        for path in sorted((conf / group).glob("*.yaml")):
            option = option_file(conf / group, path.stem)
            named = option.items() if group in NAMED else [(None, option)]
            node = {}
            for name, values in named:
                key = f"{group}.{name}" if name else group
                target = values.get("_target_") if isinstance(values, dict) else None
                schema = schema_of(group, str(target), key=key) if target else None
                # ("???": the option makes the user set it; a merge would not drop a value)
                if schema is not None:
                    node[name] = {k: v for k, v in _defaults(schema).items() if values.get(k) != "???"}
            out[group, path.stem] = node.get(None, node)
    return out


def option_file(folder: Path, option: str) -> dict[str, Any]:
    """An option file's values, over those of the options of its group it names in its defaults list."""
    raw = OmegaConf.to_container(OmegaConf.load(folder / f"{option}.yaml"), resolve=False)
    parents = [d for d in raw.pop("defaults", []) if isinstance(d, str) and d != "_self_"]
    merged = OmegaConf.merge(*(option_file(folder, p) for p in parents), raw)
    return OmegaConf.to_container(merged, resolve=False)


def _defaults(schema: type) -> dict[str, Any]:
    """A schema's defaults, those of its nested settings nodes (optimizer.hidden, ...) included."""
    nested = {f.name: _defaults(f.type) for f in fields(schema) if dataclasses.is_dataclass(f.type)}
    values = OmegaConf.to_container(OmegaConf.structured(schema)) | nested
    return {k: v for k, v in values.items() if not k.startswith("_") and v != "???"}


def unknown_keys(group: str, target: str, schema: type, extra: list[str]) -> RunError:
    one = len(extra) == 1
    derived = [k for k in extra if f"{group}.{k}" in DERIVED]
    if derived:
        return RunError(derived_refusal(f"{group}.{derived[0]}"))
    drop = " ".join(f"~{group}.{k}" for k in extra)
    nodes = [f.name for f in fields(schema) if dataclasses.is_dataclass(f.type)]
    from gptmini.training.loop.optimizers import ROLES

    if group == "optimizer" and not nodes and all(k in ROLES for k in extra):
        text = (
            f"{'it is a per-role setting' if one else 'they are per-role settings'} of optimizer=muon: use "
            f"optimizer=muon, or drop {'it' if one else 'them'} ({drop})"
        )
    elif nodes:  # settings grouped in nodes, one per parameter role (MuonAdamW.settings_of)
        text = (
            f"its settings are per parameter role ({', '.join(nodes)}), e.g. optimizer.hidden.lr=0.02 (Muon) or "
            "optimizer.embedding.lr=3e-3 (AdamW); drop the flat key (an experiment written for optimizer=adamw "
            "sets optimizer.lr)"
        )
    else:
        text = f"its settings are {', '.join(settings(schema))}; drop {'it' if one else 'them'} ({drop})"
    return RunError(
        f"{', '.join(f'{group}.{k}' for k in extra)} {'is not a setting' if one else 'are not settings'} of "
        f"{target}: {text}"
    )


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _numbers(value: Any, n: int) -> bool:
    return isinstance(value, (list, tuple)) and len(value) == n and all(map(_number, value))


@dataclass(frozen=True)
class Range:
    """What a third-party constructor documents for one of its parameters: its own refusal does not name the
    setting (``torch.optim.AdamW``: "Invalid epsilon value: -1.0"), so the plan checks this first."""

    accepts: Callable[[Any], bool]
    rule: str  # the refusal's reason: what a value must be


_AT_LEAST_0 = Range(lambda v: _number(v) and v >= 0, "it must be >= 0")

# By class, followed along a target's bases (torch.optim.AdamW's checks are torch.optim.Adam's, BatchedMuon's
# torch.optim.Muon's); gptmini's own constructors name the setting themselves.
THIRD_PARTY_RANGES: dict[type, dict[str, Range]] = {
    torch.optim.Adam: {
        "lr": _AT_LEAST_0,
        # torch takes 0: a parameter whose gradient is 0 (an embedding row the batch lacks) then steps by 0 / 0
        "eps": Range(
            lambda v: _number(v) and v > 0,
            "Adam divides by sqrt(v) + eps, so a parameter whose gradient is 0 becomes NaN; give it a small "
            "positive value (torch's default is 1e-08)",
        ),
        "betas": Range(
            lambda v: _numbers(v, 2) and all(0 <= b < 1 for b in v), "two decay rates, each in [0, 1)"
        ),
        "weight_decay": _AT_LEAST_0,
    },
    torch.optim.Muon: {
        "lr": _AT_LEAST_0,
        "momentum": _AT_LEAST_0,
        "weight_decay": _AT_LEAST_0,
        "ns_coefficients": Range(lambda v: _numbers(v, 3), "the three Newton-Schulz coefficients [a, b, c]"),
        "adjust_lr_fn": Range(
            lambda v: v in (None, "original", "match_rms_adamw"),
            "it takes null, 'original' or 'match_rms_adamw'",
        ),
    },
}


def out_of_range(key: str, target: Any, values: Mapping[str, Any]) -> str | None:
    """The refusal of the first setting in ``values`` (the settings of ``target``'s node at ``key``, nested settings
    nodes included) outside ``THIRD_PARTY_RANGES``; None when there is none."""
    ranges: dict[str, Range] = {}
    for cls in reversed(getattr(target, "__mro__", ())):
        ranges |= THIRD_PARTY_RANGES.get(cls, {})
    nested = getattr(target, "settings_of", {})
    for name, value in values.items():
        if name in nested and isinstance(value, Mapping):
            refusal = out_of_range(f"{key}.{name}", nested[name][0], value)
            if refusal is not None:
                return refusal
        elif name in ranges and not ranges[name].accepts(value):
            return f"{key}.{name}={value!r} is invalid: {ranges[name].rule}"
    return None


def typed_node(values: dict[str, Any], key: str, group: str) -> Any:
    """A node's resolved ``values`` (with a ``_target_``) read through its constructor's schema: a key the
    constructor does not take, a required one missing, or a value of the wrong type is refused in one line naming
    ``key``. None for a ``_target_`` that does not import (its build reports it)."""
    target = str(values.get("_target_") or "")
    schema = schema_of(group, target, key=key)
    if schema is None:
        return None
    extra = sorted(str(k) for k in values if k not in {f.name for f in fields(schema)})
    if extra:
        raise unknown_keys(key, target, schema, extra)
    _check_kinds(values, target_spec(group, target) or [], key)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), values)
        missing = sorted(OmegaConf.missing_keys(merged))
        if missing:
            raise RunError(
                f"{key}.{missing[0]} must be set: {target} takes no default for it (dropped with "
                f"~{key}.{missing[0]}?); set it, or choose another option of {group}"
            )
        return OmegaConf.to_object(merged)
    except ConfigKeyError as err:  # a key a nested settings node (optimizer.hidden, ...) does not have
        full = f"{key}.{err.full_key}"
        owner = full.rsplit(".", 1)[0]
        known = settings(err.object_type) if dataclasses.is_dataclass(err.object_type) else []
        raise RunError(
            f"{full} is not a setting of {owner}: its settings are {', '.join(known)}; drop it (~{full})"
        ) from None
    except OmegaConfBaseException as err:  # a value of the wrong type
        full = f"{key}.{err.full_key}" if err.full_key else key
        value = getattr(err, "value", None)
        shown = f"={value!r}" if value is not None else ""
        raise RunError(f"{full}{shown} is invalid: {str(err.msg).splitlines()[0]}") from None


def _kinds(hint: Any) -> tuple[set[type], set[Any]]:
    """The plain types and the literal values a type hint accepts (Any: ``object``)."""
    if hint is Any:
        return {object}, set()
    if typing.get_origin(hint) is typing.Literal:
        return set(), set(typing.get_args(hint))
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        kinds: set[type] = set()
        literals: set[Any] = set()
        for arg in typing.get_args(hint):
            k, lit = _kinds(arg)
            kinds |= k
            literals |= lit
        return kinds, literals
    origin = typing.get_origin(hint) or hint
    return ({origin} if isinstance(origin, type) else {object}), set()


def _check_kinds(values: dict[str, Any], spec: list[dict[str, Any]], key: str) -> None:
    """A true/false setting given anything but true or false (OmegaConf would read 3 or "yes" as true); a setting
    the constructor types as a number or a switch, given text or another number (its schema reads such unions as
    Any): ``trainer.gradient_clip_val=${oc.env:CLIP}`` is the text "1.0" (an environment variable's value is
    text), ``trainer.deterministic=3`` no switch. ``spec``: the node's ``signature_spec``."""
    by_name = {entry["name"]: entry for entry in spec}
    for name, value in values.items():
        entry = by_name.get(name, {"type": "any", "kinds": ["object"]})
        if isinstance(entry["type"], list) and isinstance(value, dict):  # a nested settings node
            _check_kinds(value, entry["type"], f"{key}.{name}")
        elif entry["type"] in ("bool", "bool?") and value is not None and not isinstance(value, bool):
            raise RunError(f"{key}.{name}={value!r} is invalid: true or false")
        if entry["type"] != "any":
            continue  # typed by the schema itself
        kinds = {getattr(builtins, k) for k in entry["kinds"]}
        literals = entry.get("literals", [])
        if not isinstance(value, _SIMPLE) or object in kinds or value in literals or type(value) in kinds:
            continue
        numbers = kinds & {int, float}
        if isinstance(value, str) and numbers and str not in kinds:
            raise RunError(
                f"{key}.{name}={value!r} is text where a number is expected (an environment variable's value is "
                f"text: ${{oc.decode:${{oc.env:VAR}}}} reads it as a number)"
            )
        if isinstance(value, int) and not isinstance(value, bool) and bool in kinds and not numbers:
            allowed = ", ".join(["true", "false", *(repr(v) for v in sorted(literals, key=str))])
            raise RunError(f"{key}.{name}={value} is invalid: it takes {allowed}")
