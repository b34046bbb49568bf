"""Checkpoints: loaded with ``torch.load(weights_only=True)`` only, so a file from elsewhere cannot run code;
written atomically (temp file in the same folder, fsync, rename), so a crash or a kill during a save leaves the
previous checkpoint intact; and carrying a checksum of their tensors and settings, written at save time and verified
at every load, so damage inside a file (or an edited setting) is refused instead of turning into NaN losses or
another model."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any, Literal

import torch

from gptmini import fileio
from gptmini.model import GPT, GPTConfig
from gptmini.runs.files import SUMMARY_FILE, write_summary
from gptmini.runs.record import RunRecord, RunRecordError, read_record

log = logging.getLogger(__name__)

# The checkpoint's own entry holding the checksum of its tensors (plain data: loads with weights_only=True).
CHECKSUM_KEY = "gptmini_checksum"
# A checkpoint of a run with callbacks.ema (Lightning's WeightAveraging) holds the average as "state_dict", what
# every command reads, and the trained weights under this key, what a resume continues from.
TRAINED_WEIGHTS_KEY = "current_model_state"


class CheckpointError(ValueError):
    """A checkpoint cannot be used; the message names the file and the reason."""


class CheckpointSaveError(CheckpointError):
    """A checkpoint could not be written (full disk, unwritable folder); the message says what was kept."""


# --- checksums --------------------------------------------------------------------------------------------------


def _tensors(obj: Any, key: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in a checkpoint, with its path of keys, in the checkpoint's own (pickled, so stable) order."""
    if isinstance(obj, torch.Tensor):
        yield key, obj
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            if not (key == "" and k == CHECKSUM_KEY):
                yield from _tensors(v, f"{key}/{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _tensors(v, f"{key}/{i}")


def tensor_checksum(checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    """SHA-256 over every tensor of ``checkpoint`` (key path, dtype, shape and bytes), as plain data."""
    digest = hashlib.sha256()
    count = nbytes = 0
    for key, tensor in _tensors(checkpoint):
        t = tensor.detach()
        digest.update(f"{key}|{t.dtype}|{tuple(t.shape)}\n".encode())
        data = t.cpu().contiguous().reshape(-1).view(torch.uint8)
        digest.update(data.numpy())
        count += 1
        nbytes += data.numel()
    return {"algorithm": "sha256", "tensors": count, "bytes": nbytes, "digest": digest.hexdigest()}


# What the checksum covers besides the tensors: the settings the weights are read with (the record's model: an
# edited n_head or position setting would read the same tensors as another model), the run's settings and data.
COVERED_SETTINGS = "hyper_parameters"


def _canonical(obj: Any) -> Any:
    """``obj`` as JSON-able plain data, the same before a save and after a load (mapping keys as sorted strings,
    tuples as lists; tensors, covered by their bytes, as a placeholder)."""
    if isinstance(obj, Mapping):
        return [[str(k), _canonical(v)] for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))]
    if isinstance(obj, (list, tuple)):
        return [_canonical(v) for v in obj]
    if isinstance(obj, torch.Tensor):
        return "<tensor>"
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return f"<{type(obj).__name__}> {obj}"


def settings_checksum(checkpoint: Mapping[str, Any]) -> str:
    text = json.dumps(_canonical(checkpoint.get(COVERED_SETTINGS)), allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()


def with_checksum(checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    """A shallow copy of ``checkpoint`` carrying the checksum of its tensors and of its settings."""
    record = {**tensor_checksum(checkpoint), "settings_digest": settings_checksum(checkpoint)}
    return {**checkpoint, CHECKSUM_KEY: record}


# The files verified in this process, as they were (a resume, and a command's ``--ckpt last``, read their
# checkpoint twice: the choice or the plan, then the load); a file changed in any way since is verified again (its
# inode change time moves with every write, even one that restores the modification time).
_verified: set[tuple[str, int, int, int, int]] = set()
_unverifiable_warned: set[str] = set()


def verify_checksum(ckpt: Mapping[str, Any], path: str | Path) -> None:
    """Raises CheckpointError naming ``path`` when its tensors differ from the checksum written at save time.
    A checkpoint without one (written before gptmini wrote them, or by another tool) loads with a warning."""
    st = Path(path).stat()
    stamp = (str(Path(path).resolve()), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if stamp in _verified:
        return
    recorded = ckpt.get(CHECKSUM_KEY)
    if recorded is None:
        if str(path) not in _unverifiable_warned:
            _unverifiable_warned.add(str(path))
            log.warning(
                "%s carries no checksum (an older or foreign checkpoint): its tensors are not verified", path
            )
        return
    if not isinstance(recorded, Mapping) or recorded.get("algorithm") != "sha256":
        raise CheckpointError(
            f"{path} is damaged: its checksum record is unreadable ({recorded!r}); use another checkpoint"
        )
    actual = tensor_checksum(ckpt)
    if actual["digest"] != recorded.get("digest"):
        raise CheckpointError(
            f"{path} is damaged: its tensors ({actual['tensors']} tensors, {actual['bytes']:,} bytes) do not match "
            "the checksum written when it was saved (the file was modified or corrupted on disk); use another "
            "checkpoint (best.ckpt, or an earlier run's last.ckpt)"
        )
    # (checksums written before the settings were covered have no settings_digest)
    if "settings_digest" in recorded and settings_checksum(ckpt) != recorded["settings_digest"]:
        raise CheckpointError(
            f"{path} was modified: its settings ({COVERED_SETTINGS}: the model's shape and options, the run's "
            "config) do not match the checksum written when it was saved, so its weights would be read as another "
            "model; use the checkpoint as training wrote it (best.ckpt, or an earlier run's last.ckpt)"
        )
    _verified.add(stamp)


# --- loading -------------------------------------------------------------------------------------------------


def _not_a_checkpoint(path: Path, why: str) -> CheckpointError:
    return CheckpointError(
        f"{path} is not a gptmini checkpoint ({why}): pass a .ckpt file written by gptmini training "
        "(outputs/<run_name>/<time>/checkpoints/last.ckpt)"
    )


def load_checkpoint(
    path: str | Path, map_location: str | torch.device = "cpu", mmap: bool = False, verify: bool = True
) -> dict[str, Any]:
    """The checkpoint's dict, loaded with ``weights_only=True``: a file carrying pickled code is refused before
    any of it runs. ``mmap=True`` maps tensors instead of reading them (cheap when only metadata is needed).
    ``verify``: check the tensors against the checksum written at save time. Every failure is one
    CheckpointError naming the file: missing, not a checkpoint at all, carrying code, damaged."""
    path = Path(path)
    if too_long := fileio.name_too_long(path):
        raise CheckpointError(f"checkpoint {str(path)[:80]}...: {too_long}; pass a shorter path")
    if path.is_dir():
        raise CheckpointError(
            f"checkpoint {path} is a folder: pass a .ckpt file (commands take a run folder too)"
        )
    if not path.is_file():
        raise CheckpointError(
            f"checkpoint {path} does not exist: pass the path of a .ckpt file written by training"
            if not path.exists()
            else f"checkpoint {path} is not a regular file: pass the path of a .ckpt file written by training"
        )
    # torch.save writes a zip archive; anything else (random bytes, a renamed text file, a truncated copy) is
    # refused here rather than fed to the unpickler, whose errors would only confuse.
    if not zipfile.is_zipfile(path):
        raise _not_a_checkpoint(path, "not a PyTorch archive: another kind of file, or truncated")
    _check_archive_sizes(path)
    try:
        ckpt = _torch_load(path, map_location, mmap)
    except pickle.UnpicklingError as err:
        if "GLOBAL" not in str(err):  # the unpickler met bytes it cannot read, not a forbidden object
            raise _not_a_checkpoint(path, "its contents do not unpickle: damaged") from None
        detail = next((line for line in str(err).splitlines() if "GLOBAL" in line), "").strip()
        raise CheckpointError(
            f"refusing to load {path}: it contains pickled Python objects beyond tensors and plain data, which "
            "could run arbitrary code (loaded with weights_only=True). Only a checkpoint written by gptmini is "
            f"accepted. Detail: {detail}"
        ) from None
    except Exception as err:  # the archive is unreadable: torch raises RuntimeError, EOFError, KeyError, ...
        raise _not_a_checkpoint(path, f"unreadable archive: {type(err).__name__}: {err}") from None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise _not_a_checkpoint(path, "no 'state_dict' entry")
    if verify:
        verify_checksum(ckpt, path)
    return ckpt


def _torch_load(path: Path, map_location: str | torch.device, mmap: bool) -> Any:
    try:
        os.fspath(path).encode("utf-8")
    except UnicodeEncodeError:
        # torch's archive reader takes a file name as UTF-8: a folder name that is not UTF-8 (its bytes held as
        # lone surrogates) is read through a file Python opened, without memory-mapping
        with open(path, "rb") as f:
            return torch.load(f, map_location=map_location, weights_only=True)
    return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)


# Slack over the archive's own size that its entries may declare in all: zip headers are counted in the file
# size but not in the entries', so stored (uncompressed) entries always sum to less than the file.
ARCHIVE_SLACK = 1 << 16


def _check_archive_sizes(path: Path) -> None:
    """Refuse an archive whose entries declare more bytes than the file holds, before ``torch.load`` inflates any:
    ``torch.save`` stores entries uncompressed, so only a crafted (compressed) file can declare more, and a few
    megabytes of deflated zeros would otherwise become gigabytes of memory."""
    try:
        with zipfile.ZipFile(path) as archive:
            declared = sum(info.file_size for info in archive.infolist())
    except (zipfile.BadZipFile, OSError, ValueError) as err:
        raise _not_a_checkpoint(path, f"unreadable archive: {err}") from None
    size = path.stat().st_size
    if declared > size + ARCHIVE_SLACK:
        raise _not_a_checkpoint(
            path,
            f"its entries declare {declared:,} bytes uncompressed in a file of {size:,} bytes (torch.save stores "
            "them uncompressed): a compressed or crafted archive, refused before anything is inflated",
        )


def checkpoint_record(ckpt: Mapping[str, Any], path: str | Path) -> RunRecord:
    """The run record of the checkpoint ``path`` (``read_record``), which must hold the model's settings."""
    try:
        record = read_record(ckpt)
    except RunRecordError as err:
        raise CheckpointError(f"{path}: {err}") from None
    if not record.model:
        raise CheckpointError(
            f"{path} records no model settings in its hyper-parameters: it was not written by gptmini"
        )
    return record


def check_tensors_match(state_dict: Mapping[str, Any], model: GPT, path: str | Path) -> None:
    """Raises CheckpointError when the tensors of ``state_dict`` (keys under ``model.``) are not exactly those of
    ``model``, a ``GPT`` of the checkpoint's saved settings (an edited file, or one written by another tool)."""
    if shown := _tensor_problems(state_dict, model):
        config = model.config
        raise CheckpointError(
            f"{path} is inconsistent: its saved model settings (n_layer={config.n_layer}, n_embd={config.n_embd}, "
            f"vocab_size={config.vocab_size}, block_size={config.block_size}) disagree with its tensors ({shown}); "
            "the file was edited or written by another tool: use a checkpoint written by gptmini training"
        )


def _tensor_problems(state_dict: Mapping[str, Any], model: GPT) -> str:
    """How the tensors of ``state_dict`` differ from ``model``'s (empty: they match)."""
    config = model.config
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    found = {
        k.removeprefix("model."): tuple(v.shape)
        for k, v in state_dict.items()
        if k.startswith("model.") and isinstance(v, torch.Tensor)
    }
    if config.tie_weights:  # the tied lm_head.weight is wte.weight itself, saved or not under its own name
        found.pop("lm_head.weight", None)
        expected.pop("lm_head.weight", None)
    problems = [f"{k} missing" for k in expected if k not in found]
    problems += [f"unexpected {k}" for k in found if k not in expected]
    problems += [
        f"{k} is {list(found[k])} but the settings need {list(shape)}"
        for k, shape in expected.items()
        if k in found and found[k] != shape
    ]
    return "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")


def stored_model(ckpt: Mapping[str, Any], record: RunRecord, path: str | Path) -> GPT:
    model = GPT(GPTConfig.from_dict(record.model))
    check_tensors_match(ckpt["state_dict"], model, path)
    _load_weights(model, ckpt, path)
    return model.eval()


def _load_weights(model: GPT, ckpt: Mapping[str, Any], path: str | Path) -> None:
    state = {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    # strict=False: every tensor was checked first (and a tied lm_head.weight is wte.weight)
    model.load_state_dict(state, strict=False)
    if TRAINED_WEIGHTS_KEY in ckpt:
        log.info(
            "%s holds an average of the weights (callbacks.ema) beside the trained ones: using the average",
            path,
        )


def load_weights_into(model: GPT, path: str | Path) -> None:
    """Loads the weights of the gptmini checkpoint ``path`` (trained or imported) into ``model``, whose settings
    must give exactly the checkpoint's tensors (CheckpointError naming the differences)."""
    ckpt = load_checkpoint(path)
    if problems := _tensor_problems(ckpt["state_dict"], model):
        saved = checkpoint_record(ckpt, path).model
        keys = ("n_layer", "n_head", "n_embd", "vocab_size", "block_size")
        raise CheckpointError(
            f"model.init_from={path}: its weights do not fit this run's model ({problems}); configure the model "
            f"as it was saved ({', '.join(f'model.{k}={saved.get(k)}' for k in keys)}, ...)"
        )
    _load_weights(model, ckpt, path)


# --- the data a checkpoint was trained on ----------------------------------------------------------------------


def check_trained_data(
    path: str | Path,
    recorded: Mapping[str, Any],
    data_dir: str | Path,
    meta: Mapping[str, Any] | None = None,
    other_data: Literal["refuse", "warn", "allow"] = "refuse",
    fix: str = "",
) -> str | None:
    """Compares the prepared data in ``data_dir`` with the data checkpoint ``path`` recorded at training time
    (``recorded``: its record's ``data_identity``). Another tokenization (another char vocabulary: the ids would
    mean other text) is always refused; other data with the same tokenizer is refused, returned as a warning
    text, or allowed, per ``other_data``. ``fix`` ends a refusal. Checkpoints that record nothing are not
    compared."""
    from gptmini.data.reader import data_identity

    if "fingerprint" not in recorded:
        return None
    current = data_identity(data_dir, meta)
    was = (
        f"{recorded.get('data_dir')} (source {recorded.get('source')!r}, tokenizer {recorded.get('tokenizer')!r}, "
        f"vocab {recorded.get('vocab_size')}, data {recorded.get('fingerprint')})"
    )
    now = (
        f"source {current['source']!r}, tokenizer {current['tokenizer']!r}, vocab {current['vocab_size']}, "
        f"data {current['fingerprint']}"
    )
    if recorded.get("tokenizer_fingerprint") != current["tokenizer_fingerprint"]:
        raise CheckpointError(
            f"{data_dir} ({now}) is tokenized differently from the data checkpoint {path} was trained on: {was}; "
            f"its token ids would mean other text{': ' + fix if fix else ''}"
        )
    if recorded.get("fingerprint") == current["fingerprint"] or other_data == "allow":
        return None
    text = f"{data_dir} ({now}) holds other data than checkpoint {path} was trained on: {was}"
    if other_data == "refuse":
        raise CheckpointError(text + (f": {fix}" if fix else ""))
    return text


# --- atomic saving ---------------------------------------------------------------------------------------------


def remove_stale_temp_files(folder: str | Path) -> list[Path]:
    """Deletes the temp checkpoint files a process of this host killed while saving left in ``folder`` (see
    ``fileio``). Only training calls it, on the checkpoints folder of the run it writes or resumes: a command
    that only reads a checkpoint deletes nothing."""
    return fileio.remove_stale_temp_files(folder, ".*.ckpt.*.tmp")


def _kept(path: Path) -> str:
    if not path.is_file():
        return f"no {path.name} was written"
    try:
        step = load_checkpoint(path, mmap=True, verify=False).get("global_step")
    except CheckpointError:
        step = None
    return f"the previous {path.name}{f' (step {step})' if step is not None else ''} is kept unchanged"


def _os_error(err: BaseException | None) -> OSError | None:
    """The OSError behind ``err``: itself, or one it was raised from or while handling (torch.save reports a
    full disk as a RuntimeError of its zip writer, raised while handling the OSError of the write)."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, OSError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


# A tied model's output layer is its token embedding (GPTConfig.tie_weights): one tensor under two names of a
# training checkpoint's weights.
TIED_WEIGHTS = ("model.lm_head.weight", "model.wte.weight")


def share_tied_weights(checkpoint: Mapping[str, Any]) -> Mapping[str, Any]:
    """``checkpoint`` with a tied weight stored once: Lightning's background save copies every tensor on its own,
    so the output layer of a tied model, which is its token embedding, would be written twice (about half of the
    default model's weights). Two names share one tensor only when their tensors are equal."""
    shared = {}
    for key in ("state_dict", TRAINED_WEIGHTS_KEY):
        state = checkpoint.get(key)
        if not isinstance(state, Mapping):
            continue
        head, embedding = (state.get(name) for name in TIED_WEIGHTS)
        if (
            isinstance(head, torch.Tensor)
            and isinstance(embedding, torch.Tensor)
            and head is not embedding
            and head.shape == embedding.shape
            and head.dtype == embedding.dtype
            and torch.equal(head, embedding)
        ):
            shared[key] = {**state, TIED_WEIGHTS[0]: embedding}
    return {**checkpoint, **shared} if shared else checkpoint


def atomic_save(checkpoint: Mapping[str, Any], path: str | Path, write: Any = torch.save) -> None:
    """Writes ``checkpoint`` with the checksum of its tensors to ``path`` atomically (``fileio.atomic_write``).
    A failed write (full disk, unwritable folder) becomes one CheckpointSaveError saying what was kept: the temp
    file is removed and the previous ``path``, if any, is untouched."""
    path = Path(path)
    payload = with_checksum(share_tied_weights(checkpoint))
    try:
        fileio.atomic_write(path, lambda f: write(payload, f))
    except Exception as err:
        cause = _os_error(err)
        if cause is None:
            raise
        raise CheckpointSaveError(
            f"could not save checkpoint {path}: {cause.strerror or cause}; {_kept(path)}. Free disk space or make "
            f"{path.parent} writable, then resume with ckpt_path=last"
        ) from err


def atomic_checkpoint_io() -> Any:
    """The run's checkpoint I/O (``AtomicCheckpointIO``), whose class subclasses Lightning's TorchCheckpointIO: made
    here, on first use, so that importing this module (sampling, config checks) does not import Lightning."""
    from lightning.pytorch.plugins.io import TorchCheckpointIO

    class AtomicCheckpointIO(TorchCheckpointIO):
        """Lightning checkpoint I/O through :func:`atomic_save`: never a half-written checkpoint under its
        final name, always with the checksum of its tensors (verified when resuming). (Lightning's own ``_atomic_save`` puts its temp file in the system temp dir: when that is
        another filesystem the final "rename" is a copy into place, which a kill can leave truncated; and
        nothing is fsync'ed.) Remote paths (``s3://``...) fall back to Lightning's implementation."""

        def save_checkpoint(
            self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
        ) -> None:
            if storage_options is not None or "://" in str(path):
                return super().save_checkpoint(checkpoint, path, storage_options)
            # the run's own checkpoints folder: a save of this host killed there earlier left its temp file
            remove_stale_temp_files(Path(path).parent)
            atomic_save(checkpoint, path, write=self.write)
            try:
                write_summary(path, checkpoint)
            except OSError as err:  # the checkpoint is saved; `gptmini runs` reads it instead
                log.warning("could not record %s in its run's %s: %s", path, SUMMARY_FILE, err)

        def load_checkpoint(
            self, path: Any, map_location: Any = None, weights_only: bool | None = None
        ) -> Any:
            kwargs = {} if map_location is None else {"map_location": map_location}
            checkpoint = super().load_checkpoint(path, weights_only=weights_only, **kwargs)
            if "://" not in str(path):
                verify_checksum(checkpoint, path)
            return checkpoint

        def write(self, checkpoint: dict[str, Any], f: IO[bytes]) -> None:
            """Serialises ``checkpoint`` into the open temp file (the step a kill can interrupt)."""
            torch.save(checkpoint, f)

    AtomicCheckpointIO.__module__ = __name__
    return AtomicCheckpointIO()
