"""Checkpoints: loaded with ``torch.load(weights_only=True)`` only, so a file from elsewhere cannot run code, and
written atomically (temp file in the same folder, fsync, rename), so a crash or a kill during a save leaves the
previous checkpoint intact."""

from __future__ import annotations

import logging
import pickle
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

import torch

from gptmini import fileio
from gptmini.model import GPT, GPTConfig

log = logging.getLogger(__name__)


class CheckpointError(ValueError):
    """A checkpoint cannot be used; the message names the file and the reason."""


def load_checkpoint(
    path: str | Path, map_location: str | torch.device = "cpu", mmap: bool = False
) -> dict[str, Any]:
    """The checkpoint's dict, loaded with ``weights_only=True``: a file carrying pickled code is refused before
    any of it runs. ``mmap=True`` maps tensors instead of reading them (cheap when only metadata is needed)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(
            f"checkpoint {path} does not exist: pass the path of a .ckpt file written by training"
        )
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        raise CheckpointError(
            f"refusing to load {path}: it contains pickled Python objects beyond tensors and plain data, which "
            "could run arbitrary code (loaded with weights_only=True). Only a checkpoint written by gptmini is "
            f"accepted. Detail: {str(err).splitlines()[0]}"
        ) from None
    except (RuntimeError, EOFError, OSError) as err:
        raise CheckpointError(
            f"{path} is not a readable checkpoint ({err}); it may be truncated or not a .ckpt"
        ) from None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise CheckpointError(f"{path} is not a gptmini/Lightning checkpoint (no 'state_dict' entry)")
    return ckpt


def _model_config(ckpt: dict[str, Any], path: str | Path) -> dict[str, Any]:
    hp = ckpt.get("hyper_parameters") or {}
    if "model_config" not in hp:
        raise CheckpointError(
            f"{path} has no model_config in its hyper-parameters: it was not written by gptmini"
        )
    return dict(hp["model_config"])


def model_from_checkpoint(
    path: str | Path, map_location: str | torch.device = "cpu"
) -> tuple[GPT, dict[str, Any]]:
    """The plain ``GPT`` stored in a training checkpoint, and the run's resolved config (a dict)."""
    ckpt = load_checkpoint(path, map_location)
    config = GPTConfig.from_dict(_model_config(ckpt, path))
    model = GPT(config)
    state = {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    missing, unexpected = model.load_state_dict(state, strict=False)
    # lm_head.weight is the tied embedding: absent from nothing, but tolerate either spelling.
    missing = [k for k in missing if not (config.tie_weights and k == "lm_head.weight")]
    if missing or unexpected:
        raise CheckpointError(
            f"{path} does not match its own model config: missing {missing}, unexpected {unexpected}"
        )
    model.eval()
    return model, dict(ckpt["hyper_parameters"].get("run_config") or {})


def check_resume_compatible(
    path: str | Path, model_config: dict[str, Any], ignore: Iterable[str] = ()
) -> None:
    """Refuses to resume a run whose model differs from the checkpoint's, naming the differing fields, and a
    checkpoint that does not load with ``weights_only=True``. ``ignore``: fields not known yet (vocab_size before
    the data is prepared)."""
    saved = _model_config(load_checkpoint(path, mmap=True), path)
    keys = (
        "vocab_size",
        "block_size",
        "n_layer",
        "n_head",
        "n_embd",
        "bias",
        "attention",
        "tie_weights",
        "pad_vocab_multiple",
    )
    diff = {
        k: (saved.get(k), model_config.get(k))
        for k in keys
        if k not in ignore and saved.get(k) != model_config.get(k)
    }
    if diff:
        desc = ", ".join(f"model.{k}: checkpoint {a!r} vs config {b!r}" for k, (a, b) in diff.items())
        raise CheckpointError(
            f"checkpoint {path} was trained with a different model shape ({desc}): resume with the same model "
            "settings (e.g. the same experiment), or start a new run without ckpt_path"
        )


# --- atomic saving ---------------------------------------------------------------------------------------------


def remove_stale_temp_files(folder: str | Path) -> list[Path]:
    """Deletes the temp checkpoint files a process killed while saving left in ``folder`` (see ``fileio``)."""
    return fileio.remove_stale_temp_files(folder, ".*.ckpt.*.tmp")


def atomic_save(checkpoint: dict[str, Any], path: str | Path, write: Any = torch.save) -> None:
    """Writes ``checkpoint`` to ``path`` atomically (``fileio.atomic_write``); ``write(checkpoint, file)``
    serialises. Temp files left by killed saves in the same folder are removed first."""
    remove_stale_temp_files(Path(path).parent)
    fileio.atomic_write(path, lambda f: write(checkpoint, f))


def _make_atomic_checkpoint_io() -> type:
    from lightning.pytorch.plugins.io import TorchCheckpointIO

    class AtomicCheckpointIO(TorchCheckpointIO):
        """Lightning checkpoint I/O through :func:`atomic_save`: never a half-written checkpoint under its
        final name. (Lightning's own ``_atomic_save`` puts its temp file in the system temp dir: when that is
        another filesystem the final "rename" is a copy into place, which a kill can leave truncated; and
        nothing is fsync'ed.) Remote paths (``s3://``...) fall back to Lightning's implementation."""

        def save_checkpoint(
            self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
        ) -> None:
            if storage_options is not None or "://" in str(path):
                return super().save_checkpoint(checkpoint, path, storage_options)
            atomic_save(checkpoint, path, write=self.write)

        def write(self, checkpoint: dict[str, Any], f: IO[bytes]) -> None:
            """Serialises ``checkpoint`` into the open temp file (the step a kill can interrupt)."""
            torch.save(checkpoint, f)

    AtomicCheckpointIO.__module__ = __name__
    return AtomicCheckpointIO


def __getattr__(name: str) -> Any:
    # ``AtomicCheckpointIO`` subclasses Lightning's TorchCheckpointIO; it is built on first use so that importing
    # this module (sampling, config checks) does not import Lightning (seconds).
    if name == "AtomicCheckpointIO":
        cls = _make_atomic_checkpoint_io()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
