"""Attention maps of a checkpoint for a given text, as PNG files (one grid of heads and one mean map per layer).

``gptmini attention --ckpt last --text "ROMEO: But soft"`` writes a new folder per call, outputs/attention_png/1,
2, ...; ``--out DIR`` names the folder instead.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from gptmini.fileio import atomic_write_bytes, atomic_write_json, unwritable_reason
from gptmini.inference.sample import encode_prompt
from gptmini.options import HelpFormatter, positive_int
from gptmini.runs.checkpoint import CheckpointError
from gptmini.runs.loading import add_run_options, open_run
from gptmini.viz import attention_entropy, attention_images, png, token_labels

log = logging.getLogger("gptmini.inference.export_attention")


def export_attention(model, tokenizer, text: str, out_dir: str | Path, max_tokens: int = 48) -> list[Path]:
    ids = encode_prompt(tokenizer, text, "--text")
    limit = min(max_tokens, model.config.block_size)
    if len(ids) > limit:
        why = "--max-tokens" if limit == max_tokens else "the model's context (block_size)"
        hint = "; raise --max-tokens to see more" if limit == max_tokens < model.config.block_size else ""
        log.warning("--text is %d tokens: showing the first %d (%s %d)%s", len(ids), limit, why, limit, hint)
        ids = ids[:limit]
    device = next(model.parameters()).device
    maps = model.eval().attention_maps(torch.tensor([ids], device=device))[:, 0]  # (n_layer, n_head, T, T)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    labels = token_labels(tokenizer, ids)
    for layer, images in enumerate(attention_images(maps, labels)):
        for image, name in zip(images, (f"layer{layer}_heads.png", f"layer{layer}_mean.png"), strict=True):
            atomic_write_bytes(out / name, png(image))
            written.append(out / name)
    atomic_write_json(
        out / "entropy.json", {"tokens": labels, "entropy": attention_entropy(maps).tolist()}, indent=1
    )
    return written


def earlier_maps(out_dir: str | Path) -> str | None:
    out = Path(out_dir)
    if not out.is_dir():
        return None
    found = sorted(p.name for p in out.iterdir() if p.name == "entropy.json" or p.match("layer*_*.png"))
    return ", ".join(found[:3]) + (", ..." if len(found) > 3 else "") if found else None


MAPS_ROOT = Path("outputs/attention_png")


def new_numbered_folder(root: Path) -> Path:
    """A folder of ``root`` created now, numbered one past the highest number there (1 in a new ``root``)."""
    root.mkdir(parents=True, exist_ok=True)
    n = max((int(p.name) for p in root.iterdir() if p.name.isdigit()), default=0) + 1
    while True:
        try:
            (root / str(n)).mkdir()  # exist_ok=False: two calls at once never share a folder
            return root / str(n)
        except FileExistsError:
            n += 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gptmini attention", description=__doc__, formatter_class=HelpFormatter
    )
    add_run_options(parser)
    parser.add_argument(
        "--text", required=True, default=argparse.SUPPRESS, help="the text whose attention is drawn"
    )
    parser.add_argument(
        "--out",
        default=None,
        help=f"folder for the PNG files and entropy.json (created if missing); without it, each call writes a new "
        f"numbered folder under {MAPS_ROOT}/ (1, 2, ...)",
    )
    parser.add_argument(
        "--force", action="store_true", help="replace the attention maps an earlier run wrote in --out"
    )
    parser.add_argument(
        "--max-tokens",
        type=positive_int,
        default=48,
        help="tokens of --text shown (at most the model's context); a longer text is cut, and the log says so",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    out = args.out or MAPS_ROOT
    made = None  # the numbered folder this call made, removed again if nothing could be written in it
    try:
        if (reason := unwritable_reason(out)) is not None:
            raise ValueError(f"--out {out} cannot be written: {reason}")
        if args.out is not None and not args.force and (earlier := earlier_maps(args.out)):
            raise ValueError(
                f"--out {args.out} holds the attention maps of an earlier run ({earlier}): choose another --out, "
                "or pass --force to replace them"
            )
        run = open_run(args.ckpt, args.device, args.data_dir)
        if args.out is None:  # made once the checkpoint opened: a refused call leaves no folder behind
            out = made = new_numbered_folder(MAPS_ROOT)
        files = export_attention(run.model, run.tokenizer, args.text, out, args.max_tokens)
    except (CheckpointError, ValueError) as err:
        message = str(err)
    except OSError as err:  # a full disk while writing the images
        message = f"cannot write the attention maps to {out}: {err.strerror or err}"
    else:
        log.info("wrote %d PNG files to %s", len(files), out)
        return 0
    if made is not None and not any(made.iterdir()):
        made.rmdir()
    log.error("error: %s", message)
    return 2


if __name__ == "__main__":
    sys.exit(main())
