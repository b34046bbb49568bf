"""Opening a trained run (``open_run``): the one way every command turns what the user named into a
:class:`LoadedRun`: the model in eval mode on the chosen device, the tokenizer it was trained with and the run's
record, from a checkpoint read once (``weights_only=True``, its checksum verified)."""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gptmini.data.errors import DataError
from gptmini.data.reader import check_vocab, load_meta, load_tokenizer
from gptmini.data.tokenizers import (
    SAVED_TOKENIZERS,
    Tokenizer,
    TokenizerError,
    build_tokenizer,
    tokenizer_from_payload,
)
from gptmini.fileio import name_too_long
from gptmini.model import GPT
from gptmini.options import resolve_device
from gptmini.runs.checkpoint import (
    CheckpointError,
    check_trained_data,
    checkpoint_record,
    load_checkpoint,
    stored_model,
)
from gptmini.runs.discovery import CKPT_RULE, resolve_checkpoint
from gptmini.runs.record import RunRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedRun:
    path: Path  # the checkpoint file read
    model: GPT  # in eval mode, on ``device``
    tokenizer: Tokenizer | None  # None when open_run was asked for none
    record: RunRecord  # what the run was (an empty one for a checkpoint that records nothing)
    checkpoint: dict[str, Any]  # the whole checkpoint: global_step, state_dict, callbacks, ...
    device: str  # resolved: "cpu", "cuda", "cuda:1", ...

    @property
    def step(self) -> int | None:
        return self.checkpoint.get("global_step")

    @property
    def name(self) -> str:
        """The folder that names the run: outputs/<run>/<time or sweep job>/checkpoints/last.ckpt gives the job
        folder; a file elsewhere gives its stem."""
        return self.path.parent.parent.name if self.path.parent.name == "checkpoints" else self.path.stem

    def data_folder(self, data_dir: str | Path | None, purpose: str) -> tuple[str, dict[str, Any]]:
        """The prepared data folder to read with this model, and its metadata: ``data_dir`` when given (other
        data than the run trained on is allowed, with a note in the log), else the one the run recorded, which
        must still hold that data. Another tokenization than the run's is refused either way. ``purpose``
        ("evaluate") ends the fix of a refusal."""
        folder = data_dir or self.record.data_dir
        if not folder:
            raise DataError(f"checkpoint {self.path} does not name its data folder: pass --data-dir")
        meta = load_meta(folder)
        # The data first: another vocabulary is the cause of a vocab_size difference check_vocab would name.
        note = check_trained_data(
            self.path,
            self.record.data_identity,
            folder,
            meta,
            other_data="warn" if data_dir else "refuse",
            fix=f"it was re-prepared since; prepare the original corpus again, or pass --data-dir to {purpose} "
            "on this data on purpose",
        )
        if note:
            log.info("note: %s", note)
        trained_with = self.record.tokenizer_name
        if trained_with and meta.get("tokenizer") != trained_with:
            raise DataError(
                f"{folder} was tokenized with {meta.get('tokenizer')!r} but the checkpoint was trained with "
                f"{trained_with!r}: prepare the corpus with --tokenizer {trained_with}"
            )
        check_vocab(self.model.config.vocab_size, meta)
        return str(folder), meta

    def can_rebuild_data(self) -> bool:
        recorded = self.record.data_identity
        return (
            "fingerprint" in recorded
            and bool(recorded.get("source"))
            and self.record.saved_tokenizer is not None
        )

    def rebuild_data(self, out: Path, source: str) -> str:
        """The data this run trained on, prepared again into the new folder ``out`` from ``source`` with the
        tokenizer its checkpoint carries (its data folder was re-prepared with another vocabulary since, or is
        gone), and proven the same data by the fingerprint the checkpoint recorded; DataError when the corpus
        changed since (its split could not be the one the run trained and validated on). ``source`` is a corpus
        the user named (the one the checkpoint records is never fetched or read on its say-so)."""
        from gptmini.data.prepare import prepare
        from gptmini.data.reader import data_identity

        recorded = self.record.data_identity
        data = self.record.data
        tokenizer = carried_tokenizer(self.path, self.record)
        assert tokenizer is not None, "rebuild_data needs can_rebuild_data()"
        changed = (
            f"the corpus {source!r} is not the one checkpoint {self.path} was trained on, or it changed since: its "
            "validation split cannot be rebuilt; pass --data-dir to evaluate on other data on purpose"
        )
        try:
            prepared = prepare(
                source,
                recorded["tokenizer"],
                out,
                # the run's own split and field, where its config records them; prepare's defaults where not (a
                # wrong guess fails the fingerprint below, never gives other data)
                **{k: data[k] for k in ("val_fraction", "text_field") if data.get(k) is not None},
                # a trained BPE's settings, as meta.json records them (the BPE itself is the one given)
                tokenizer_options={
                    k: v for k, v in self.record.tokenizer.items() if k in ("vocab_size", "train_bytes")
                },
                given_tokenizer=tokenizer,
            )
        except (DataError, TokenizerError) as err:  # gone, or text the carried vocabulary lacks
            raise DataError(f"{changed} ({err})") from None
        if data_identity(prepared.out_dir, prepared.meta)["fingerprint"] != recorded["fingerprint"]:
            raise DataError(changed)
        return str(prepared.out_dir)


def add_run_options(parser: argparse.ArgumentParser, *, several: bool = False) -> None:
    """The options of :func:`open_run`, as every command that opens a run names them: ``--ckpt`` (``several``:
    one or more), ``--device`` and ``--data-dir``."""
    if several:
        parser.add_argument(
            "--ckpt",
            nargs="+",
            default=["last"],
            help=f"one or more, compared side by side; each {CKPT_RULE}",
        )
    else:
        parser.add_argument("--ckpt", default="last", help=CKPT_RULE)
    parser.add_argument("--device", default="auto", help="auto (a GPU when there is one), cpu, cuda, cuda:N")
    parser.add_argument(
        "--data-dir", default=None, help="prepared data folder, when it moved (None: the one it trained on)"
    )


def open_run(
    spec: str | Path,
    device: str = "auto",
    data_dir: str | Path | None = None,
    output_root: str | Path = "outputs",
    tokenizer: bool = True,
) -> LoadedRun:
    """The run ``spec`` names (``resolve_checkpoint``), loaded on ``device`` (auto, cpu, cuda, cuda:N, mps).
    ``data_dir``: the prepared data folder whose vocabulary the tokenizer is read from, when it moved or the
    checkpoint records none; ``tokenizer=False`` skips the tokenizer. Raises ValueError for a bad device,
    CheckpointError for a file that is missing, not a checkpoint, damaged or inconsistent, and for a tokenizer
    that cannot be the model's."""
    device = resolve_device(device)  # before any file is read
    path = resolve_checkpoint(spec, output_root)
    checkpoint = load_checkpoint(path, map_location=device)
    record = checkpoint_record(checkpoint, path)  # the one read of the record
    model = stored_model(checkpoint, record, path)
    tok = tokenizer_for_run(record, data_dir, path, model.config.vocab_size) if tokenizer else None
    log.info("loaded %s (%s parameters)", path, f"{model.num_parameters():,}")
    return LoadedRun(path, model.to(device).eval(), tok, record, checkpoint, device)


def tokenizer_for_run(
    record: RunRecord, data_dir: str | Path | None, checkpoint: Path, model_vocab: int | None = None
) -> Tokenizer:
    """The tokenizer the checkpoint ``checkpoint`` (whose record is ``record``) was trained with: the one it
    carries, else from its prepared data folder (char vocab; a folder tokenized otherwise than the data it recorded
    is refused) or by name. ``model_vocab``: the model's vocabulary; a tokenizer with more ids than that is refused
    (its ids would index past the embedding), and a checkpoint that records no tokenizer (imported) gets GPT-2's
    BPE only when the model's vocabulary holds it."""
    # its own copy first, unless a data folder is named: the recorded folder may be re-prepared or gone
    tokenizer = carried_tokenizer(checkpoint, record) if not data_dir else None
    folder = Path(data_dir) if data_dir else Path(record.data_dir or "")
    name = record.tokenizer_name
    if tokenizer is not None:
        pass
    elif too_long := name_too_long(folder / "meta.json"):
        raise CheckpointError(f"the data folder {str(folder)[:80]}...: {too_long}; pass a shorter path")
    elif (folder / "meta.json").is_file():
        check_trained_data(
            checkpoint,
            record.data_identity,
            folder,
            other_data="allow",
            fix="pass --data-dir with the prepared folder it was trained on",
        )
        tokenizer = load_tokenizer(folder)
    elif name is None:  # a checkpoint not written by training (imported from Hugging Face): nothing recorded
        tokenizer = build_tokenizer("gpt2")
        if model_vocab is not None and model_vocab < tokenizer.vocab_size:
            raise CheckpointError(
                f"checkpoint {checkpoint} records no tokenizer (imported, not trained by gptmini) and its vocabulary "
                f"({model_vocab} tokens) is smaller than GPT-2's ({tokenizer.vocab_size}): pass --data-dir with the "
                "prepared data folder whose vocabulary it uses (e.g. data/<corpus>_char), or import it again "
                "with --data-dir to record it"
            )
        log.warning(
            "checkpoint %s records no tokenizer: using GPT-2's BPE (pass --data-dir for another)", checkpoint
        )
    elif name in SAVED_TOKENIZERS:
        raise CheckpointError(
            f"the checkpoint uses the {name} tokenizer but its prepared data folder ({folder}), which holds its "
            "vocabulary, is missing: pass --data-dir pointing at the prepared data folder it was trained on"
        )
    else:
        tokenizer = build_tokenizer(name)
    if model_vocab is not None and tokenizer.vocab_size > model_vocab:
        raise CheckpointError(
            f"the tokenizer ({tokenizer.name}, {tokenizer.vocab_size} tokens) has more tokens than the model's "
            f"vocabulary ({model_vocab}): it is not the one the checkpoint was trained with; pass --data-dir with "
            "the prepared data folder it was trained on"
        )
    return tokenizer


def carried_tokenizer(path: str | Path, record: RunRecord) -> Tokenizer | None:
    """The tokenizer the checkpoint ``path`` carries in its record (a char vocabulary or trained BPE); None when
    it carries none (a tokenizer known by name, or a checkpoint written before they were carried)."""
    payload = record.saved_tokenizer
    if payload is None:
        return None
    try:
        return tokenizer_from_payload(payload, f"the tokenizer checkpoint {path} carries")
    except TokenizerError as err:
        raise CheckpointError(
            f"{err}: pass --data-dir with the prepared data folder it was trained on"
        ) from None
