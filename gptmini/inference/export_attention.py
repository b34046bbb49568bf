"""Attention maps of a checkpoint for a given text, as PNG files (one grid of heads and one mean map per layer).

``gptmini attention --ckpt last --text "ROMEO: But soft" --out attention_png/``
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from gptmini.checkpoint import CheckpointError
from gptmini.fileio import unwritable_reason
from gptmini.inference.sample import encode_prompt
from gptmini.options import positive_int
from gptmini.run import open_run
from gptmini.viz import attention_entropy, attention_figures, token_labels

log = logging.getLogger("gptmini.inference.export_attention")


def export_attention(model, tokenizer, text: str, out_dir: str | Path, max_tokens: int = 48) -> list[Path]:
    if max_tokens < 1:
        raise ValueError(f"--max-tokens {max_tokens} is out of range: it must be an integer >= 1")
    ids = encode_prompt(tokenizer, text, "--text")
    limit = min(max_tokens, model.config.block_size)
    if len(ids) > limit:
        why = "--max-tokens" if limit == max_tokens else "the model's context (block_size)"
        log.warning(
            "--text is %d tokens: showing the first %d (%s %d)%s",
            len(ids),
            limit,
            why,
            limit,
            "; raise --max-tokens to see more" if limit == max_tokens < model.config.block_size else "",
        )
        ids = ids[:limit]
    device = next(model.parameters()).device
    maps = model.eval().attention_maps(torch.tensor([ids], device=device))[:, 0]  # (n_layer, n_head, T, T)
    grids, means = attention_figures(maps, token_labels(tokenizer, ids))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for layer, (grid, mean) in enumerate(zip(grids, means, strict=True)):
        for fig, name in ((grid, f"layer{layer}_heads.png"), (mean, f"layer{layer}_mean.png")):
            tmp = out / f".{name}.tmp"
            fig.savefig(tmp, format="png", dpi=110)  # written whole, then renamed
            os.replace(tmp, out / name)
            written.append(out / name)
    entropy = attention_entropy(maps).tolist()
    (out / "entropy.json").write_text(
        json.dumps({"tokens": token_labels(tokenizer, ids), "entropy": entropy}, indent=1)
    )
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gptmini attention", description=__doc__)
    parser.add_argument(
        "--ckpt",
        default="last",
        help="a checkpoint file, a run folder or run name (its newest checkpoint), or 'last' (the newest of any run "
        "under outputs/)",
    )
    parser.add_argument("--text", required=True)
    parser.add_argument("--out", default="attention_png")
    parser.add_argument(
        "--max-tokens",
        type=positive_int,
        default=48,
        help="tokens of --text shown (at most the model's context); a longer text is cut, and the log says so",
    )
    parser.add_argument(
        "--device",
        default="auto",
        help="a torch device (cpu, cuda, cuda:1, ...); auto: cuda if available, else cpu",
    )
    parser.add_argument("--data-dir", default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if (reason := unwritable_reason(args.out)) is not None:
            raise ValueError(f"--out {args.out} cannot be written: {reason}")
        run = open_run(args.ckpt, args.device, args.data_dir)
        files = export_attention(run.model, run.tokenizer, args.text, args.out, args.max_tokens)
    except (CheckpointError, ValueError) as err:
        log.error("error: %s", err)
        return 2
    except OSError as err:  # a full disk while writing the images
        log.error("error: cannot write the attention maps to %s: %s", args.out, err.strerror or err)
        return 2
    log.info("wrote %d PNG files to %s", len(files), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
