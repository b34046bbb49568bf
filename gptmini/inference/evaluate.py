"""Validation loss and perplexity of a checkpoint on any prepared corpus, as JSON and in the log; with
``--context``, at several context lengths, longer than training included (length extrapolation), for one
checkpoint or several side by side, as JSON and a PNG of loss against context length.

``gptmini eval --ckpt last [--data-dir data/shakespeare_gpt2] [--split val] [--out outputs/eval.json]``
``gptmini eval --ckpt a/last.ckpt b/last.ckpt --context 64,128,256,512 --out outputs/lengths.json``

With ``--tasks``, benchmark tasks of EleutherAI's lm-evaluation-harness instead
(``gptmini.inference.benchmark_tasks``):
``gptmini eval --ckpt last --tasks hellaswag,arc_easy [--num-fewshot N] [--limit N] [--include-path DIR]``
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from gptmini.data.corpora import EMBEDDED_SOURCES
from gptmini.data.errors import DataError
from gptmini.data.reader import check_vocab, load_meta, load_split, load_tokenizer
from gptmini.data.windows import StridedWindowDataset
from gptmini.fileio import atomic_write_bytes, atomic_write_text, unwritable_reason
from gptmini.limits import check_fits, forward_bytes
from gptmini.model import GPT
from gptmini.options import EtaProgress, HelpFormatter, int_at_least, positive_int, resolve_device
from gptmini.runs.checkpoint import CheckpointError
from gptmini.runs.discovery import resolve_checkpoint
from gptmini.runs.loading import LoadedRun, add_run_options, open_run
from gptmini.viz import context_sweep_chart, png

log = logging.getLogger("gptmini.inference.evaluate")
# --out of a sweep (--context, or several checkpoints) when none is named: under the runs folder, not loose
SWEEP_OUT = "outputs/length_extrapolation.json"


@torch.no_grad()
def evaluate(
    model: GPT,
    data_dir: str | Path,
    split: str = "val",
    batch_size: int = 16,
    block_size: int | None = None,
    max_batches: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Token-weighted mean cross entropy over strided (non-overlapping) windows of a prepared split, and bits per
    byte: the summed nats over ln 2 times the UTF-8 bytes the scored tokens stand for (comparable across
    tokenizers). ``progress(done, total)`` is called after each batch."""
    meta = load_meta(data_dir)
    check_vocab(model.config.vocab_size, meta)
    tokens = load_split(data_dir, split, meta)
    token_bytes = torch.from_numpy(load_tokenizer(data_dir, meta).token_bytes())
    block = block_size or model.config.block_size
    windows = StridedWindowDataset(tokens, block, name=split, vocab_size=int(meta["vocab_size"]))
    loader = DataLoader(windows, batch_size=batch_size)
    device = next(model.parameters()).device
    model.eval()
    batches = len(loader) if max_batches is None else min(len(loader), max_batches)
    total, count, nbytes, t0 = 0.0, 0, 0, time.perf_counter()
    for i, (x, y) in enumerate(loader):
        if i >= batches:
            break
        _, loss = model(x.to(device), y.to(device))
        total += loss.item() * y.numel()
        count += y.numel()
        nbytes += int(token_bytes[y].sum())
        if progress is not None:
            progress(i + 1, batches)
    if count == 0:
        raise DataError(
            f"the {split} split of {data_dir} has no window of {block} tokens to evaluate: use a smaller context "
            "or a larger split"
        )
    mean = total / count
    return {
        "data_dir": str(data_dir),
        "split": split,
        "tokens": count,
        "block_size": block,
        "loss": mean,
        "ppl": math.exp(mean),
        "bpb": total / (math.log(2) * nbytes) if nbytes else None,
        "seconds": round(time.perf_counter() - t0, 3),
    }


def context_sweep(
    model: GPT,
    data_dir: str | Path,
    contexts: Sequence[int],
    split: str = "val",
    batch_size: int = 16,
    max_tokens: int | None = None,
    max_batches: int | None = None,
) -> list[dict[str, Any]]:
    """``evaluate`` at each context length: every window is that long and every position of it is scored, over
    (up to ``max_tokens`` of, up to ``max_batches`` batches of) the same split. A length the model cannot take is
    reported, not evaluated."""
    rows = []
    for context in contexts:
        if context > model.config.block_size and (limit := model.length_limit) is not None:
            reason = f"cannot run {context} tokens: {limit}"
            log.warning("context %d: %s", context, reason)
            rows.append({"context": context, "loss": None, "skipped": reason})
            continue
        by_tokens = None if max_tokens is None else max(1, math.ceil(max_tokens / (batch_size * context)))
        batches = min((n for n in (by_tokens, max_batches) if n is not None), default=None)
        result = evaluate(model, data_dir, split, batch_size, block_size=context, max_batches=batches)
        log.info("context %d: %s loss %.4f over %d tokens", context, split, result["loss"], result["tokens"])
        rows.append({"context": context} | {k: result[k] for k in ("loss", "ppl", "tokens", "seconds")})
    return rows


def _contexts(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or any(v <= 1 for v in values):
        raise argparse.ArgumentTypeError(
            f"--context {text!r} is invalid: give context lengths > 1 separated by commas, e.g. 64,128,256"
        )
    return sorted(set(values))


def _task_names(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"--tasks {text!r} names no task: e.g. hellaswag,arc_easy")
    return list(dict.fromkeys(names))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gptmini eval", description=__doc__, formatter_class=HelpFormatter)
    add_run_options(parser, several=True)
    parser.add_argument(
        "--context",
        type=_contexts,
        default=None,
        help="context lengths to evaluate at, e.g. 64,128,256,512 (longer than training: length extrapolation; "
        f"learned positions cannot and say so). Writes --out ({SWEEP_OUT} when not given) and a PNG "
        "beside it",
    )
    parser.add_argument(
        "--max-tokens",
        type=positive_int,
        default=None,
        help="with --context: score about this many tokens per length",
    )
    parser.add_argument(
        "--corpus",
        default=None,
        help="the corpus the run trained on (a file, folder, glob or URL, as data.source takes), for "
        "when its data folder is gone or was re-prepared: re-tokenized with the checkpoint's own tokenizer into a "
        "temporary folder and checked against the data it recorded. The corpus a checkpoint records is never "
        "fetched or read unless named here (the embedded shakespeare excepted)",
    )
    parser.add_argument("--split", default="val", choices=["train", "val"], help="the split scored")
    parser.add_argument("--batch-size", type=positive_int, default=16, help="windows per forward pass")
    parser.add_argument(
        "--max-batches", type=positive_int, default=None, help="evaluate only the first N batches (None: all)"
    )
    parser.add_argument("--out", default=None, help="also write the result as JSON here (None: the log only)")
    tasks = parser.add_argument_group("benchmark tasks (lm-evaluation-harness: pip install 'gptmini[eval]')")
    tasks.add_argument(
        "--tasks",
        type=_task_names,
        default=None,
        help="the harness's tasks, groups or tags, e.g. hellaswag,arc_easy: a table, eval_tasks_step<N>.json in "
        "the run folder (or --out) and eval/<task>/<metric> scalars in its TensorBoard run; --batch-size is "
        "then requests per forward pass",
    )
    tasks.add_argument(
        "--num-fewshot",
        type=int_at_least(0),
        default=None,
        help="examples before each question (None: the task's)",
    )
    tasks.add_argument(
        "--limit",
        type=positive_int,
        default=None,
        help="score the first N documents of each task (a quick look)",
    )
    tasks.add_argument("--include-path", default=None, help="a folder of task YAML files of your own")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.max_tokens is not None and args.context is None:
        parser.error("--max-tokens applies with --context (without it, use --max-batches)")
    if args.tasks is None and (args.num_fewshot is not None or args.limit or args.include_path):
        parser.error("--num-fewshot, --limit and --include-path apply with --tasks")
    if args.tasks is not None and (args.context is not None or args.max_batches or len(args.ckpt) > 1):
        parser.error("--tasks evaluates one --ckpt, without --context, --max-tokens or --max-batches")
    if args.corpus is not None and args.data_dir is not None:
        parser.error("--corpus rebuilds the run's own data folder; with --data-dir there is none to rebuild")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.tasks is not None:
        try:
            from gptmini.inference.benchmark_tasks import run_tasks
        except ModuleNotFoundError as err:
            log.error(
                "error: --tasks needs EleutherAI's lm-evaluation-harness (%s is not installed): "
                "pip install 'gptmini[eval]'",
                err.name,
            )
            return 2
        return run_tasks(args)
    sweep = args.context is not None or len(args.ckpt) > 1
    out = args.out or (SWEEP_OUT if sweep else None)
    scratch = ExitStack()  # folders rebuilt for the runs evaluated, removed at the end
    try:
        args.device = resolve_device(args.device)
        if out and (reason := unwritable_reason(Path(out).absolute().parent)) is not None:
            raise DataError(f"--out {out} cannot be written: {reason}")
        if out and (Path(out).is_dir() or zipfile.is_zipfile(out) if Path(out).exists() else False):
            # the result is a small JSON file: never written over a folder or a checkpoint
            raise DataError(f"--out {out} is a folder or a checkpoint: name a .json file for the result")
        # every checkpoint found before any is evaluated
        paths = [resolve_checkpoint(spec) for spec in args.ckpt]
        runs = []
        for path in paths:
            run, data_dir = _open(path, args, scratch)
            model = run.model
            if not sweep:
                scope = (
                    f"the first {args.max_batches} batches of {args.batch_size} windows"
                    if args.max_batches
                    else f"the whole {args.split} split"
                )
                # why this loss differs from the val/loss training logged: what each one scores
                log.info(
                    "evaluating %s of %s, in non-overlapping windows of the model's context; the val/loss "
                    "training logs (and `gptmini runs` shows) scores only the first trainer.limit_val_batches "
                    "batches of the validation split, so the two differ a little",
                    scope,
                    data_dir,
                )
                result = evaluate(
                    model,
                    data_dir,
                    args.split,
                    args.batch_size,
                    max_batches=args.max_batches,
                    progress=EtaProgress(log, "eval", "batches"),
                ) | {"checkpoint": str(path)}
                log.info(
                    "%s loss %.4f, perplexity %.2f, %.4f bits per byte over %s tokens (%s)",
                    args.split,
                    result["loss"],
                    result["ppl"],
                    result["bpb"] if result["bpb"] is not None else float("nan"),
                    f"{result['tokens']:,}",
                    scope,
                )
                return _emit(result, out)
            log.info("%s (%s):", path, run.name)
            contexts = args.context or [model.config.block_size]
            results = context_sweep(
                model, data_dir, contexts, args.split, args.batch_size, args.max_tokens, args.max_batches
            )
            runs.append(
                {
                    "name": _label(run),
                    "checkpoint": str(path),
                    "data_dir": str(data_dir),
                    "split": args.split,
                    "block_size": model.config.block_size,
                    "position": model.config.position,
                    "results": results,
                }
            )
    except (CheckpointError, DataError, ValueError) as err:
        log.error("error: %s", err)
        return 2
    finally:
        scratch.close()
    labels = [r["name"] for r in runs]
    for r in runs:  # two runs of one name and shape apart: their folders
        if labels.count(r["name"]) > 1:
            r["name"] += f" ({Path(r['checkpoint']).parent.parent.name})"
    plot = Path(out).with_suffix(".png")
    try:
        plot.parent.mkdir(parents=True, exist_ok=True)
        # an earlier plot is replaced whole or not at all
        atomic_write_bytes(plot, png(context_sweep_chart(runs)))
    except OSError as err:
        log.error("error: cannot write the plot %s: %s", plot, err.strerror or err)
        return 2
    log.info("loss against context length: %s", plot)
    return _emit({"runs": runs}, out)


def _label(run: LoadedRun) -> str:
    """A run's name in the chart's legend: its run_name, position encoding and training context."""
    name = run.record.run_name or run.name
    c = run.model.config
    return f"{name}: {c.position} positions, trained at {c.block_size}"


def _open(path: Path, args: argparse.Namespace, scratch: ExitStack) -> tuple[LoadedRun, str]:
    """The run at ``path`` and the prepared folder to evaluate it on, every size and data check done; a folder
    rebuilt for it lives as long as ``scratch``."""
    run = open_run(path, args.device, tokenizer=False)
    contexts = args.context or [run.model.config.block_size]
    per_window = max(forward_bytes(run.model.config, c, clamp=False) for c in contexts)
    check_fits("--batch-size", args.batch_size, per_window, args.device, "windows")
    # The folder it trained on must still hold that data (a folder re-prepared from another corpus would give
    # a wrong loss, silently); other data given explicitly with --data-dir is evaluated, with a note.
    try:
        data_dir, _ = run.data_folder(args.data_dir, "evaluate")
    except (CheckpointError, DataError) as refused:
        if args.data_dir is not None or not run.can_rebuild_data():
            raise
        # re-prepared with another vocabulary, or gone: the checkpoint's own tokenizer on its own corpus gives the
        # same tokens again when the corpus is unchanged (checked against the fingerprint it recorded). A
        # checkpoint is data: the corpus it records is read only when the user names it (or it is embedded).
        recorded = str(run.record.data_identity["source"])
        source = args.corpus or (recorded if recorded in EMBEDDED_SOURCES else None)
        if source is None:
            raise DataError(
                f"{refused}; to re-tokenize the corpus it trained on, name it with --corpus (it recorded "
                f"{recorded[:200]!r}, which eval does not fetch or read unless named), or pass --data-dir"
            ) from None
        log.info("note: %s", refused)
        log.info("re-tokenizing the corpus it was trained on with its own tokenizer, into a temporary folder")
        folder = Path(scratch.enter_context(tempfile.TemporaryDirectory(prefix="gptmini-eval-")))
        data_dir = run.rebuild_data(folder / "data", source)
        return run, data_dir
    if args.corpus is not None:
        log.info(
            "note: --corpus %s is not read: the run's data folder %s still holds its data",
            args.corpus,
            data_dir,
        )
    return run, data_dir


def _emit(result: dict[str, Any], out: str | None) -> int:
    text = json.dumps(result, indent=2)
    if out:
        try:
            atomic_write_text(out, text + "\n")
        except OSError as err:
            log.error(
                "error: cannot write --out %s: %s (the result is printed below)", out, err.strerror or err
            )
            sys.stdout.write(text + "\n")
            return 2
    sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
