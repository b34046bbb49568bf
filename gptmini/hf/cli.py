"""``gptmini export`` and ``gptmini import``: training checkpoints to Hugging Face folders and back.

    gptmini export --ckpt last --out outputs/my-model [--force] [--tokenizer none|auto|...]
    gptmini export --format llama --ckpt last --out outputs/my-llama [--tokenizer auto|gpt2|char|bpe|none]
    gptmini import --hf DIR --out outputs/model.ckpt    # a GPT-2, Llama or Qwen3 folder, by its config.json

``--format auto`` (the default) is the format whose block the model has: ``gpt2`` for learned positions, else
``qwen3`` with q/k norms, else ``llama``. ``gpt2`` writes ``GPT2LMHeadModel`` weights (and the run's tokenizer
files, unless the run used GPT-2's own BPE: then with ``--tokenizer auto``); ``llama`` and ``qwen3`` write
``LlamaForCausalLM`` / ``Qwen3ForCausalLM`` weights and the run's tokenizer (``AutoTokenizer`` loads it), read
from the checkpoint's run settings: the GPT-2 BPE, or the ``char`` vocabulary or trained BPE of the prepared data
folder it was trained on (``--data-dir`` when that folder has moved).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gptmini.hf.common import HFWeightsError
from gptmini.hf.formats import FORMATS, load_hf_model
from gptmini.hf.llama import llama_format
from gptmini.options import HelpFormatter
from gptmini.runs.discovery import CKPT_RULE
from gptmini.runs.record import RECORD_KEY, RunRecord

log = logging.getLogger("gptmini.hf")

EXPORT_FORMATS = ("auto", *FORMATS)
TOKENIZER_CHOICES = ("auto", "gpt2", "char", "bpe", "none")


def default_tokenizer_choice(export_format: str, record: RunRecord) -> str:
    """``--tokenizer`` left out: ``auto`` (the run's own tokenizer files), except ``none`` for a GPT-2 export of
    a run trained with GPT-2's BPE or recording no tokenizer (Hugging Face's own ``gpt2`` tokenizer is the one).
    A char vocabulary or trained BPE is always written: without its files ``AutoTokenizer`` would load an empty
    tokenizer from the folder, silently."""
    from gptmini.data.tokenizers import SAVED_TOKENIZERS

    recorded = record.tokenizer_name
    return "auto" if export_format != "gpt2" or recorded in SAVED_TOKENIZERS else "none"


def export_tokenizer(choice: str, record: RunRecord, data_dir: str | None, checkpoint: Path) -> Any | None:
    """The gptmini tokenizer whose files go with an export: ``auto`` is the one the run recorded (None, with a
    warning, for a checkpoint that records none), ``none`` writes none; found as every command finds a run's
    tokenizer (``gptmini.runs.loading.tokenizer_for_run``). Raises HFWeightsError when a ``char`` vocabulary
    cannot be found or is not the one the checkpoint was trained with."""
    from gptmini.data.errors import DataError
    from gptmini.runs.checkpoint import CheckpointError
    from gptmini.runs.loading import tokenizer_for_run

    if choice == "none":
        return None
    recorded = record.tokenizer_name
    name = recorded if choice == "auto" else choice
    if name is None:
        log.warning(
            "the checkpoint records no tokenizer (it was not written by a training run): exporting without "
            "tokenizer files; pass --tokenizer gpt2 or --tokenizer char --data-dir DIR to add them"
        )
        return None
    if recorded is not None and name != recorded:
        raise HFWeightsError(
            f"--tokenizer {name}: the checkpoint was trained with the {recorded!r} tokenizer (use --tokenizer auto)"
        )
    try:
        tokenizer = tokenizer_for_run(
            dataclasses.replace(record, tokenizer={"name": name}), data_dir, checkpoint
        )
    except (CheckpointError, DataError) as err:
        raise HFWeightsError(f"{err}, or --tokenizer none") from None
    if tokenizer.name != name:
        raise HFWeightsError(f"{data_dir} was prepared with the {tokenizer.name!r} tokenizer, not {name!r}")
    return tokenizer


def _export(args: argparse.Namespace) -> None:
    from gptmini.runs.checkpoint import CheckpointError
    from gptmini.runs.loading import open_run

    try:
        run = open_run(args.ckpt, device="cpu", tokenizer=False)  # the export writes the weights from the CPU
        model, ckpt_path = run.model, run.path
        fmt = args.format
        if fmt == "auto":
            fmt = "gpt2" if model.config.position == "learned" else llama_format(model.config)
            log.info("--format auto: %s (the format of the model's blocks)", fmt)
        if args.tokenizer is None:
            args.tokenizer = default_tokenizer_choice(fmt, run.record)
        FORMATS[fmt].check(model.config, "export")  # before looking for a tokenizer: the model comes first
        tokenizer = export_tokenizer(args.tokenizer, run.record, args.data_dir, run.path)
        files = ", ".join(FORMATS[fmt].save(model, args.out, tokenizer=tokenizer, overwrite=args.force))
    except CheckpointError as err:
        raise HFWeightsError(str(err)) from None
    log.info(
        "exported %s -> %s (%s parameters): %s", ckpt_path, args.out, f"{model.num_parameters():,}", files
    )


def _check_import_target(out: Path, force: bool) -> None:
    if out.is_dir():
        raise HFWeightsError(
            f"--out {out} is a folder: pass the checkpoint file to write, e.g. {out / 'model.ckpt'}"
        )
    if out.exists() and not force:
        raise HFWeightsError(
            f"--out {out} exists: choose another file, or pass --force to replace it (it is replaced only once the "
            "new checkpoint is complete)"
        )
    if out.exists() and not out.is_file():
        raise HFWeightsError(f"--out {out} exists and is not a regular file")
    if out.exists() and _is_training_checkpoint(out):
        raise HFWeightsError(
            f"--out {out} is a training checkpoint (resumable: optimizer state and loop progress), which an import "
            "would replace by weights only: --force replaces an earlier import or another file; choose another --out"
        )


def _is_training_checkpoint(path: Path) -> bool:
    from gptmini.runs.checkpoint import CheckpointError, load_checkpoint

    try:
        ckpt = load_checkpoint(path, mmap=True, verify=False)
    except CheckpointError:
        return False
    return bool(ckpt.get("optimizer_states") or ckpt.get("loops"))


def _imported_record(args: argparse.Namespace, model: dict[str, Any]) -> RunRecord:
    """The imported checkpoint's run record: its model, where it came from (``init_from``), and its tokenizer (the commands that sample or show attention need
    one): the prepared data folder given with --data-dir (its char vocabulary or BPE), GPT-2's BPE when the
    model's vocabulary is GPT-2's, else nothing (those commands then ask for --data-dir)."""
    from gptmini.data.reader import load_meta
    from gptmini.data.tokenizers import build_tokenizer

    vocab_size = int(model["vocab_size"])
    record = {"model": model, "init_from": str(Path(args.hf).absolute())}
    if args.data_dir:
        meta = load_meta(args.data_dir)
        if int(meta["vocab_size"]) > vocab_size:
            raise HFWeightsError(
                f"--data-dir {args.data_dir} holds a {meta['tokenizer']} vocabulary of {meta['vocab_size']} tokens "
                f"but the model has {vocab_size}: it is not the vocabulary the model was trained with"
            )
        return RunRecord(
            **record,
            tokenizer={"name": meta["tokenizer"]},
            data={"data_dir": str(Path(args.data_dir).absolute())},
        )
    gpt2 = build_tokenizer("gpt2").vocab_size
    if gpt2 <= vocab_size <= gpt2 + 128:  # GPT-2's vocabulary, possibly padded
        return RunRecord(**record, tokenizer={"name": "gpt2"})
    log.warning(
        "the model's vocabulary (%d tokens) is not GPT-2's and no --data-dir was given: the checkpoint records no "
        "tokenizer, so sampling and attention maps will ask for --data-dir (the prepared folder of its vocabulary)",
        vocab_size,
    )
    return RunRecord(**record)


def _import(args: argparse.Namespace) -> None:
    from gptmini.runs.checkpoint import CheckpointError, atomic_save

    out = Path(args.out)
    _check_import_target(out, args.force)  # before reading the model
    model = load_hf_model(args.hf)
    record = _imported_record(args, model.config.to_dict())
    ckpt = {
        "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
        "hyper_parameters": {RECORD_KEY: record.to_json()},
    }
    try:
        atomic_save(ckpt, out)  # with the checksum every gptmini command verifies
    except CheckpointError as err:
        raise HFWeightsError(str(err)) from None
    log.info("imported %s -> %s (%s parameters)", args.hf, out, f"{model.num_parameters():,}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gptmini", description="gptmini models in Hugging Face formats (GPT-2, Llama, Qwen3)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_export(sub)
    _add_import(sub)
    return parser


def _add_export(sub: Any) -> None:
    exp = sub.add_parser(
        "export",
        help="write a training checkpoint as a Hugging Face folder",
        description="Write a gptmini checkpoint as a Hugging Face folder (config.json + model.safetensors) that "
        "transformers loads: GPT2LMHeadModel, or LlamaForCausalLM / Qwen3ForCausalLM with the run's tokenizer "
        "files.",
        formatter_class=HelpFormatter,
    )
    exp.add_argument(
        "--ckpt",
        default="last",
        help=f"a .ckpt written by gptmini training (or imported): {CKPT_RULE}",
    )
    exp.add_argument(
        "--out",
        required=True,
        default=argparse.SUPPRESS,
        help="output folder (config.json + model.safetensors)",
    )
    exp.add_argument(
        "--format",
        choices=EXPORT_FORMATS,
        default="auto",
        help="gpt2: GPT2LMHeadModel (learned positions, LayerNorm, GELU); llama: LlamaForCausalLM (rotary, "
        "RMSNorm, SwiGLU, e.g. model=llama_small) with tokenizer files; qwen3: Qwen3ForCausalLM (a Llama block "
        "with q/k norms, model.qk_norm=true); auto: the one of the model's blocks",
    )
    exp.add_argument(
        "--tokenizer",
        choices=TOKENIZER_CHOICES,
        default=None,
        help="the tokenizer files to write (auto: the one the run trained with; default: auto, except none for "
        "--format gpt2 of a run trained with GPT-2's own BPE, which Hugging Face ships as 'gpt2')",
    )
    exp.add_argument(
        "--data-dir",
        help="llama or qwen3 format, char or bpe tokenizer: the prepared data folder holding its vocabulary (None: the one "
        "it trained on)",
    )
    exp.add_argument(
        "--force",
        action="store_true",
        help="replace an earlier export in --out (only a folder an export wrote: anything else is refused)",
    )


def _add_import(sub: Any) -> None:
    imp = sub.add_parser(
        "import",
        help="convert a Hugging Face GPT-2, Llama or Qwen3 folder into a gptmini checkpoint file",
        description="Turn a local Hugging Face GPT-2, Llama or Qwen3 folder (config.json + model.safetensors; the kind is "
        "read from config.json) into a gptmini checkpoint file that sample, eval, attention, analyze and "
        "model.init_from= take.",
        formatter_class=HelpFormatter,
    )
    imp.add_argument(
        "--hf",
        required=True,
        default=argparse.SUPPRESS,
        help="local folder with config.json + model.safetensors",
    )
    imp.add_argument(
        "--out",
        required=True,
        default=argparse.SUPPRESS,
        help="checkpoint file to write (usable with gptmini sample --ckpt)",
    )
    imp.add_argument("--force", action="store_true", help="replace an existing --out file")
    imp.add_argument(
        "--data-dir",
        help="the prepared data folder whose vocabulary the model uses (a char model): recorded in the checkpoint "
        "for the commands that need its tokenizer",
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "export" and args.tokenizer == "none" and args.data_dir:
        parser.error(
            "--data-dir finds a tokenizer's vocabulary: pass --tokenizer auto (or char, bpe) with it"
        )
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    from gptmini.data.errors import DataError
    from gptmini.data.tokenizers import TokenizerError
    from gptmini.hf.tokenizer_files import TokenizerExportError

    try:
        if args.command == "export":
            _export(args)
        else:
            _import(args)
    except (HFWeightsError, DataError, TokenizerError, TokenizerExportError, ImportError) as err:
        parser.exit(2, f"error: {err}\n")
    except OSError as err:  # writing the export folder: unwritable, full disk
        parser.exit(2, f"error: cannot write {args.out}: {err.strerror or err}\n")
    return 0
