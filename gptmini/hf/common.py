"""What the Hugging Face formats share (``gptmini.hf.gpt2``, ``gptmini.hf.llama``): the folder's file names, its
``config.json`` read and type-checked, its weight files (safetensors or PyTorch, sharded or not) read without
running code, and export folders written atomically, replaced only when an export wrote them."""

from __future__ import annotations

import json
import math
import os
import pickle
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:
    from gptmini.model import GPTConfig

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
PYTORCH_FILE = "pytorch_model.bin"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PYTORCH_INDEX = "pytorch_model.bin.index.json"


class HFWeightsError(ValueError):
    """A Hugging Face folder (GPT-2, Llama or Qwen3) or a model cannot be converted; the message names the file/field and why."""


def safetensors_torch():
    try:
        import safetensors.torch as st
    except ImportError:
        raise ImportError(
            "reading/writing model.safetensors needs the 'safetensors' package: "
            "pip install 'gptmini[hf]' (or: pip install safetensors)"
        ) from None
    return st


def check_dir(path: Path) -> None:
    if not path.is_dir():
        raise HFWeightsError(
            f"{path} is not a directory: pass a local Hugging Face GPT-2 folder holding {CONFIG_FILE} and "
            f"{SAFETENSORS_FILE} (or {PYTORCH_FILE}), e.g. from "
            f"`hf download openai-community/gpt2 --local-dir {path}`"
        )


def wrong_shapes(
    path: Path, state: dict[str, Tensor], expected: dict[str, tuple[int, ...]], weights: str
) -> list[str]:
    """The tensors of ``state`` whose shapes differ from ``expected``, one line each; a missing or unexpected
    name is one clear error first (``weights`` says which weights config.json describes)."""
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise HFWeightsError(
            f"{path} does not hold the {weights} its {CONFIG_FILE} describes: missing {missing[:8]}"
            f"{' ...' if len(missing) > 8 else ''}, unexpected {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}"
        )
    return [
        f"{k}: {tuple(state[k].shape)} (expected {s})"
        for k, s in expected.items()
        if tuple(state[k].shape) != s
    ]


def read_config_json(path: Path, holds: str) -> dict[str, Any]:
    """The JSON object in ``path``'s config.json, or one clear error; ``holds`` says what such a folder holds."""
    check_dir(path)
    cfg_file = path / CONFIG_FILE
    if not cfg_file.is_file():
        raise HFWeightsError(f"{path} has no {CONFIG_FILE}: {holds}")
    try:
        cfg = json.loads(cfg_file.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise HFWeightsError(f"{cfg_file} is not readable JSON: {err}") from None
    if not isinstance(cfg, dict):
        raise HFWeightsError(f"{cfg_file} does not hold a JSON object")
    return cfg


# JSON types by name, for the config.json fields each format reads (a bool is no number here).
NUMBER, INTEGER, STRING, BOOLEAN, NULL, OBJECT = "number", "integer", "string", "boolean", "null", "object"


_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    NUMBER: lambda v: isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v),
    INTEGER: lambda v: isinstance(v, int) and not isinstance(v, bool),
    STRING: lambda v: isinstance(v, str),
    BOOLEAN: lambda v: isinstance(v, bool),
    NULL: lambda v: v is None,
    OBJECT: lambda v: isinstance(v, dict),
}


def check_json_types(
    cfg: dict[str, Any], types: dict[str, tuple[str, ...]], bad: Callable[[str], Exception]
) -> None:
    """Every field of ``types`` that ``cfg`` holds is of one of its JSON types (absent fields take their
    defaults); else ``bad(message)`` naming the field, its value and the types it may have."""
    for key, allowed in types.items():
        if key in cfg and not any(_JSON_TYPES[t](cfg[key]) for t in allowed):
            shown = repr(cfg[key])
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            raise bad(f"{key}={shown} is not {' or '.join(allowed)}")


def weight_files(path: Path) -> list[Path]:
    for index in (SAFETENSORS_INDEX, PYTORCH_INDEX):
        if (path / index).is_file():  # a sharded checkpoint: the index maps each tensor to its shard
            try:
                weight_map = json.loads((path / index).read_text())["weight_map"]
            except (OSError, json.JSONDecodeError, KeyError, TypeError) as err:
                raise HFWeightsError(f"{path / index} is not a valid shard index: {err}") from None
            shards = [path / name for name in sorted(set(weight_map.values()))]
            missing = [str(s) for s in shards if not s.is_file()]
            if missing:
                raise HFWeightsError(f"{path / index} names shard(s) that do not exist: {missing}")
            return shards
    for name in (SAFETENSORS_FILE, PYTORCH_FILE):
        if (path / name).is_file():
            return [path / name]
    raise HFWeightsError(
        f"{path} has no weights: expected {SAFETENSORS_FILE} or {PYTORCH_FILE} (or a sharded "
        f"{SAFETENSORS_INDEX} / {PYTORCH_INDEX}) next to {CONFIG_FILE}"
    )


def read_state(path: Path) -> dict[str, Tensor]:
    """Every tensor of the folder's weight files."""
    state: dict[str, Tensor] = {}
    for file in weight_files(path):
        state.update(read_tensors(file))
    return state


def export_tensor(x: Tensor) -> Tensor:
    """A fresh contiguous float32 CPU copy: safetensors refuses shared or strided storage."""
    return x.detach().to("cpu", torch.float32).clone().contiguous()


def vocab_rows(config: GPTConfig, weight: Tensor) -> Tensor:
    """A folder's (vocab, n_embd) token rows as the model's (padded_vocab_size, n_embd) table. Rows for real
    tokens the folder lacks (a larger model vocabulary) start at the mean row, so that their logits are ordinary
    rather than 0 (far above typical logits); gptmini's padding rows (always -inf) are zeros."""
    rows = torch.zeros(config.padded_vocab_size, config.n_embd)
    vocab = weight.shape[0]
    rows[:vocab] = weight.float()
    rows[vocab : config.vocab_size] = weight.float().mean(dim=0)
    return rows


def read_tensors(file: Path) -> dict[str, Tensor]:
    if file.name.endswith(".safetensors"):
        st = safetensors_torch()
        try:
            return st.load_file(str(file), device="cpu")
        except Exception as err:  # safetensors raises its own SafetensorError
            raise HFWeightsError(f"{file} is not a readable safetensors file: {err}") from None
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise HFWeightsError(
            f"refusing to load {file}: it contains pickled Python objects beyond tensors (loaded with "
            f"weights_only=True so a file from elsewhere cannot run code). Detail: {str(err).splitlines()[0]}"
        ) from None
    except (RuntimeError, EOFError, OSError) as err:
        raise HFWeightsError(f"{file} is not a readable PyTorch weights file: {err}") from None
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise HFWeightsError(f"{file} is not a state dict of tensors")
    return state


# Written into every export folder: the files the export wrote. ``overwrite`` replaces a folder only when it holds
# nothing else (an export's own folder), never a run folder, a repository or anything a user put there.
EXPORT_MANIFEST = "gptmini-export.json"


# The files of an export written before the manifest existed (recognised without it).
EXPORT_FILE_NAMES = frozenset(
    {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", EXPORT_MANIFEST}
)


def foreign_entries(path: Path) -> list[str]:
    """What in the folder ``path`` an export did not write: entries its manifest does not list (without a
    manifest: names an export does not use), and anything that is not a plain file."""
    listed = set(EXPORT_FILE_NAMES)
    manifest = path / EXPORT_MANIFEST
    if manifest.is_file():
        try:
            listed = {*json.loads(manifest.read_text(encoding="utf-8")).get("files", []), EXPORT_MANIFEST}
        except (ValueError, AttributeError, OSError):
            listed = set(EXPORT_FILE_NAMES)
    return sorted(
        p.name + ("/" if p.is_dir() else "")
        for p in path.iterdir()
        if p.name not in listed or p.is_symlink() or not p.is_file()
    )


def check_export_target(path: str | Path, overwrite: bool) -> Path:
    """``path`` as a Path, refused when it is a file, or a non-empty folder without ``overwrite``, or (even with
    it) a folder holding anything an export did not write."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise HFWeightsError(f"export target {path} exists and is not a directory")
    if path.is_dir() and any(path.iterdir()):
        if not overwrite:
            raise HFWeightsError(
                f"export target {path} exists and is not empty: choose a new --out folder, or pass --force to "
                "replace an earlier export there (overwrite=True)"
            )
        foreign = foreign_entries(path)
        if foreign:
            shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
            raise HFWeightsError(
                f"export target {path} holds files an export did not write ({shown}): --force replaces only an "
                f"earlier export (its folder lists its files in {EXPORT_MANIFEST}), never anything else; choose a "
                "new --out folder"
            )
    return path


def write_export(
    path: str | Path,
    state: dict[str, Tensor],
    config: dict[str, Any],
    *,
    tokenizer: Any | None,
    model_config: GPTConfig,
    overwrite: bool = False,
) -> list[str]:
    """An export folder: ``config.json``, ``model.safetensors`` (``state``, float32) and with ``tokenizer`` its
    tokenizer files; returns the file names written. Every check runs first, and the folder is written into a
    temporary sibling then renamed, so a failure leaves no half-written folder and, with ``overwrite``, the
    previous one intact. ``EXPORT_MANIFEST`` lists its files, so that a later ``overwrite`` recognises it."""
    path = check_export_target(path, overwrite)
    st = safetensors_torch()
    if tokenizer is not None:
        check_export_tokenizer(tokenizer, model_config.vocab_size)
    written = [CONFIG_FILE, SAFETENSORS_FILE]
    path.parent.mkdir(parents=True, exist_ok=True)

    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        st.save_file(state, str(tmp / SAFETENSORS_FILE), metadata={"format": "pt"})
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        if tokenizer is not None:
            from gptmini.hf.tokenizer_files import write_tokenizer_files

            written.extend(write_tokenizer_files(tokenizer, tmp, model_config.block_size))
        files = sorted(p.name for p in tmp.iterdir())
        (tmp / EXPORT_MANIFEST).write_text(
            json.dumps({"written_by": "gptmini", "files": files}, indent=2) + "\n"
        )
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
        for file in tmp.iterdir():
            os.chmod(file, 0o644)  # safetensors writes its file 0600: an export is for others to read
        if path.exists():
            check_export_target(path, overwrite)  # again: nothing may have been added meanwhile
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
            os.replace(path, old / "export")
            try:
                os.replace(tmp, path)
            except BaseException:
                os.replace(old / "export", path)  # put the previous export back
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return written


def refuse_extras(
    config: GPTConfig,
    refusal: Callable[[str, Any], str],
    fmt: str,
    attention: str,
    allowed: frozenset[str] = frozenset(),
) -> None:
    """Raises HFWeightsError for the first setting of ``config`` that neither Hugging Face format holds: logit
    soft-capping, an ingredient without weights there, an attention option ``allowed`` leaves out.
    ``refusal(setting, value)`` begins the message; ``fmt`` names the format, ``attention`` what it has."""
    from gptmini.ingredients import hf_inexpressible
    from gptmini.model import _OPTION_SETTINGS

    if config.logit_softcap is not None:
        raise HFWeightsError(
            f"{refusal('logit_softcap', config.logit_softcap)}: {fmt} has no logit soft-capping, so its logits "
            "would differ (use model.logit_softcap=null)"
        )
    if (ingredient := hf_inexpressible(config)) is not None:
        raise HFWeightsError(
            f"{refusal(*ingredient)}: a {fmt} checkpoint has no weights for it (train without "
            f"model.{ingredient[0]})"
        )
    extra = sorted(set(config.attention_options()) - allowed)
    if extra:
        setting = _OPTION_SETTINGS.get(extra[0], extra[0])
        raise HFWeightsError(
            f"{refusal(setting, getattr(config, setting))}: {fmt} has {attention} (leave model.{setting} at its "
            "default)"
        )


def check_export_tokenizer(tokenizer: Any, model_vocab: int) -> None:
    """The tokenizer files an export writes can express ``tokenizer``, and the model was trained with it (a
    larger vocabulary than the model's is another tokenizer's)."""
    from gptmini.hf.tokenizer_files import check_exportable

    check_exportable(tokenizer)
    if tokenizer.vocab_size > model_vocab:
        raise HFWeightsError(
            f"the tokenizer has {tokenizer.vocab_size} tokens but the model only {model_vocab}: it was trained with "
            "another tokenizer (pass the one it was trained with, or --tokenizer none)"
        )
