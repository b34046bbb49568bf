"""``make bench-tokenizers`` (``python -m benchmarks.tokenizers``): characters, GPT-2's BPE and byte-level BPEs
trained on the corpus (1k, 4k and 16k tokens) compared by validation bits per byte after the same training wall
clock each, on the embedded plays (``--source`` for another corpus).

For each tokenizer: its data is prepared first, outside the clock (the BPE's training included, timed apart);
then one ``python -m gptmini.training`` process trains the CPU default model (``hardware=cpu``) at a constant
learning rate after warm-up, stopped by Lightning's ``trainer.max_time`` (the same for every tokenizer); then
``gptmini eval`` scores its last checkpoint on the whole held-out split: loss per token and bits per byte (the
measure that compares tokenizers, docs/data.md). ``--source cyrillic`` writes the plays transliterated letter by
letter into Cyrillic (``cyrillic_plays``: every letter two UTF-8 bytes, words GPT-2's merges never saw): a
corpus in another script that needs no download. ``--quick``: characters and a BPE of 512 tokens, the tiny model
for a few seconds each, scored on two batches: to check that the section runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import machine_info, max_time_string, run_module, write_table

log = logging.getLogger("benchmarks")


@dataclass(frozen=True)
class TokenizerConfig:
    label: str
    name: str
    vocab_size: int | None = None  # bpe: the vocabulary it trains

    @property
    def folder(self) -> str:
        return self.label.replace(" ", "_")

    def overrides(self) -> list[str]:
        vocab = [f"tokenizer.vocab_size={self.vocab_size}"] if self.vocab_size is not None else []
        return [f"tokenizer={self.name}", *vocab]


TOKENIZERS = (
    TokenizerConfig("char", "char"),
    TokenizerConfig("gpt2", "gpt2"),
    TokenizerConfig("bpe 1k", "bpe", 1024),
    TokenizerConfig("bpe 4k", "bpe", 4096),
    TokenizerConfig("bpe 16k", "bpe", 16384),
)
QUICK_TOKENIZERS = (TokenizerConfig("char", "char"), TokenizerConfig("bpe 512", "bpe", 512))
DEFAULT_SECONDS = 300
QUICK_SECONDS = 3
QUICK_ARGS = (
    "model=tiny",
    "data.batch_size=4",
    "trainer.val_check_interval=2",
    "trainer.limit_val_batches=2",
)

# Latin -> Cyrillic, letter by letter (x and w, which have no one-letter match, take the nearest sound)
_LATIN, _CYR = "abcdefghijklmnopqrstuvwxyz", "абцдефгхийклмнопярстувшхыз"
_TO_CYRILLIC = str.maketrans(_LATIN + _LATIN.upper(), _CYR + _CYR.upper())
CYRILLIC = "cyrillic"


def cyrillic_plays(path: Path) -> Path:
    """The embedded plays, every Latin letter replaced by a Cyrillic one, written to ``path`` (UTF-8)."""
    from benchmarks.common import shakespeare_text

    path.write_text(shakespeare_text().translate(_TO_CYRILLIC), encoding="utf-8")
    return path


COLUMNS = [
    "tokenizer",
    "vocab",
    "bytes_per_token",
    "tokenizer_train_s",
    "train_s",
    "steps",
    "val_loss",
    "val_bpb",
    "wall_s",
]


def run_args(config: TokenizerConfig, root: Path, seconds: int, quick: bool, seed: int) -> list[str]:
    """The training command's overrides for ``config``'s run of ``seconds`` of training."""
    return [
        *config.overrides(),
        "hardware=cpu",
        "scheduler=constant",
        "scheduler.warmup_steps=20",
        # the clock stops it, not the step count; a constant rate needs no length to decay over
        "trainer.max_steps=1000000",
        f"trainer.max_time='{max_time_string(seconds)}'",
        f"seed={seed}",
        f"run_name=tokenizers_{config.folder}",
        f"paths.output_root={root / 'outputs'}",
        f"data.data_dir={root / 'data' / config.folder}",
        "~callbacks.progress_bar",
        "trainer.enable_progress_bar=false",
        *(QUICK_ARGS if quick else ()),
    ]


def _prepare(config: TokenizerConfig, source: str, root: Path) -> tuple[float, float]:
    """Prepare ``config``'s data (what the run then finds up to date): (seconds, bytes per held-out token)."""
    import numpy as np

    from gptmini.data.bpe import bytes_per_token
    from gptmini.data.prepare import prepare
    from gptmini.data.reader import load_split, load_tokenizer

    t0 = time.perf_counter()
    result = prepare(
        source,
        config.name,
        root / "data" / config.folder,
        tokenizer_options={"vocab_size": config.vocab_size},
    )
    seconds = time.perf_counter() - t0
    val = np.asarray(load_split(result.out_dir, "val"))
    return seconds, bytes_per_token(load_tokenizer(result.out_dir), val)


def bench_tokenizers(
    source: str = "shakespeare",
    seconds: int | None = None,
    quick: bool = False,
    seed: int = 1337,
    root: Path | None = None,
    only: Sequence[str] | None = None,
) -> tuple[list[dict[str, Any]], list[str]]:
    import torch

    seconds = seconds or (QUICK_SECONDS if quick else DEFAULT_SECONDS)
    configs = QUICK_TOKENIZERS if quick else TOKENIZERS
    if only is not None:
        configs = tuple(c for c in configs if c.label in only)
    rows = []
    with tempfile.TemporaryDirectory(prefix="gptmini-bench-tokenizers-") as tmp:
        root = root or Path(tmp)
        corpus = source
        if source == CYRILLIC:
            corpus = str(cyrillic_plays(root / "cyrillic_plays.txt"))
        for config in configs:
            prep_s, bpt = _prepare(config, corpus, root)
            wall = run_module(
                ["gptmini.training", *run_args(config, root, seconds, quick, seed), f"data.source={corpus}"],
                f"training with {config.label}",
            )
            (run_dir,) = (root / "outputs" / f"tokenizers_{config.folder}").glob("*/")
            ckpt = run_dir / "checkpoints" / "last.ckpt"
            out = root / f"eval_{config.folder}.json"
            limit = ["--max-batches", "2"] if quick else []
            run_module(
                ["gptmini.inference.evaluate", "--ckpt", str(ckpt), "--out", str(out), *limit], "evaluation"
            )
            result = json.loads(out.read_text())
            state = torch.load(ckpt, map_location="cpu", weights_only=True)
            rows.append(
                {
                    "tokenizer": config.label,
                    "vocab": state["hyper_parameters"]["data_identity"]["vocab_size"],
                    "bytes_per_token": round(bpt, 3),
                    "tokenizer_train_s": round(prep_s, 1) if config.name == "bpe" else None,
                    "train_s": seconds,
                    "steps": state["global_step"],
                    "val_loss": round(result["loss"], 4),
                    "val_bpb": round(result["bpb"], 4),
                    "wall_s": round(wall, 1),
                }
            )
            log.info("tokenizers %s: %s", config.label, rows[-1])
    notes = [
        f"corpus: {'the embedded plays transliterated letter by letter into Cyrillic' if source == CYRILLIC else source}; each tokenizer trains the {'tiny' if quick else 'CPU default'} model for "
        f"{seconds:g} s of training (trainer.max_time), constant learning rate after 20 warm-up steps",
        "val_bpb: bits per byte of the held-out split (summed nats / (ln 2 x its UTF-8 bytes)), comparable across "
        "tokenizers; val_loss is per token of each tokenizer's own vocabulary",
        "bytes_per_token: UTF-8 bytes per held-out token; tokenizer_train_s: preparing the data, the BPE's "
        "training included (outside the training clock)",
    ]
    return rows, notes


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.tokenizers", description=__doc__)
    p.add_argument(
        "--source",
        default="shakespeare",
        help=f"corpus: the embedded plays (default), '{CYRILLIC}' (the plays in Cyrillic letters), or a path",
    )
    p.add_argument(
        "--seconds", type=float, default=None, help=f"training seconds each (default {DEFAULT_SECONDS:g})"
    )
    p.add_argument("--quick", action="store_true", help="two tokenizers, the tiny model, a few seconds each")
    p.add_argument(
        "--only",
        default=None,
        help=f"comma-separated labels of the tokenizers to run (default all: {', '.join(c.label for c in TOKENIZERS)})",
    )
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--out", type=Path, default=Path("results"), help="output folder (default: results/)")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    only = None
    if a.only is not None:
        only = [label.strip() for label in a.only.split(",") if label.strip()]
        unknown = sorted(set(only) - {c.label for c in TOKENIZERS})
        if unknown or not only:
            p.error(
                f"--only {a.only!r}: unknown tokenizer(s) {unknown}; valid: {', '.join(c.label for c in TOKENIZERS)}"
            )
    rows, notes = bench_tokenizers(a.source, a.seconds, a.quick, a.seed, only=only)
    info = machine_info("cpu")
    notes.append("machine: " + ", ".join(f"{k} {v}" for k, v in info.items()))
    a.out.mkdir(parents=True, exist_ok=True)
    print(
        write_table(
            a.out, "tokenizers", "Tokenizers by bits per byte at equal training time", rows, COLUMNS, notes
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
