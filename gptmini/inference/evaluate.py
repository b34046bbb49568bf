"""Validation loss and perplexity of a checkpoint on any prepared corpus, as JSON and in the log.

``python -m gptmini.inference.evaluate --ckpt last [--data-dir data/shakespeare_gpt2] [--split val] [--out eval.json]``
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from gptmini.checkpoint import CheckpointError, check_trained_data, model_and_checkpoint
from gptmini.data.errors import DataError
from gptmini.data.prepare import check_vocab, load_meta, load_split
from gptmini.data.windows import StridedWindowDataset
from gptmini.fileio import atomic_write_text, unwritable_reason
from gptmini.inference.sample import find_checkpoint
from gptmini.model import GPT

log = logging.getLogger("gptmini.inference.evaluate")


@torch.no_grad()
def evaluate(
    model: GPT,
    data_dir: str | Path,
    split: str = "val",
    batch_size: int = 16,
    block_size: int | None = None,
    max_batches: int | None = None,
) -> dict[str, Any]:
    """Token-weighted mean cross entropy over strided (non-overlapping) windows of a prepared split."""
    meta = load_meta(data_dir)
    check_vocab(model.config.vocab_size, meta)
    tokens = load_split(data_dir, split, meta)
    block = block_size or model.config.block_size
    loader = DataLoader(StridedWindowDataset(tokens, block, name=split), batch_size=batch_size)
    device = next(model.parameters()).device
    model.eval()
    total, count, t0 = 0.0, 0, time.perf_counter()
    for i, (x, y) in enumerate(loader):
        if max_batches is not None and i >= max_batches:
            break
        _, loss = model(x.to(device), y.to(device))
        total += loss.item() * y.numel()
        count += y.numel()
    mean = total / count
    return {
        "data_dir": str(data_dir),
        "split": split,
        "tokens": count,
        "block_size": block,
        "loss": mean,
        "ppl": math.exp(mean),
        "seconds": round(time.perf_counter() - t0, 3),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gptmini-eval", description=__doc__)
    parser.add_argument(
        "--ckpt", default="last", help="checkpoint path, or 'last' for the newest under outputs/"
    )
    parser.add_argument(
        "--data-dir", default=None, help="prepared data folder (default: the one it trained on)"
    )
    parser.add_argument("--split", default="val", choices=["train", "val"])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-batches", type=int, default=None, help="evaluate only the first N batches")
    parser.add_argument("--out", default=None, help="also write the result as JSON here")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if args.out and (reason := unwritable_reason(Path(args.out).absolute().parent)) is not None:
            raise DataError(f"--out {args.out} cannot be written: {reason}")
        path = find_checkpoint(args.ckpt)
        model, checkpoint = model_and_checkpoint(path, map_location=args.device)
        run_config = dict(checkpoint["hyper_parameters"].get("run_config") or {})
        data_dir = args.data_dir or run_config.get("data", {}).get("data_dir")
        if not data_dir:
            raise DataError("the checkpoint does not name its data folder: pass --data-dir")
        meta = load_meta(data_dir)
        # The folder it trained on must still hold that data (a folder re-prepared from another corpus would give
        # a wrong loss, silently); other data given explicitly with --data-dir is evaluated, with a note.
        other = check_trained_data(
            path,
            checkpoint,
            data_dir,
            meta,
            other_data="warn" if args.data_dir else "refuse",
            fix="it was re-prepared since; prepare the original corpus again, or pass --data-dir to evaluate on "
            "this data on purpose",
        )
        if other:
            log.info("note: %s", other)
        trained_with = run_config.get("tokenizer", {}).get("name")
        if trained_with and meta.get("tokenizer") != trained_with:
            raise DataError(
                f"{data_dir} was tokenized with {meta.get('tokenizer')!r} but the checkpoint was trained with "
                f"{trained_with!r}: prepare the corpus with --tokenizer {trained_with}"
            )
        result = evaluate(
            model.to(args.device), data_dir, args.split, args.batch_size, max_batches=args.max_batches
        )
    except (CheckpointError, DataError, ValueError) as err:
        log.error("error: %s", err)
        return 2
    result["checkpoint"] = str(path)
    log.info(
        "%s loss %.4f, perplexity %.2f over %d tokens",
        args.split,
        result["loss"],
        result["ppl"],
        result["tokens"],
    )
    text = json.dumps(result, indent=2)
    if args.out:
        try:
            atomic_write_text(args.out, text + "\n")
        except OSError as err:
            log.error(
                "error: cannot write --out %s: %s (the result is printed below)",
                args.out,
                err.strerror or err,
            )
            sys.stdout.write(text + "\n")
            return 2
    sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
