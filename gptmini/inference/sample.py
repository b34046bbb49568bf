"""Generate text from a training checkpoint: ``python -m gptmini.inference.sample --ckpt last --prompt "ROMEO:"``."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from gptmini.checkpoint import CheckpointError, model_from_checkpoint
from gptmini.model import GPT

log = logging.getLogger("gptmini.inference.sample")


def find_checkpoint(spec: str, output_root: str | Path = "outputs") -> Path:
    """``spec`` is a path, or "last": the newest last/on_exception checkpoint of any run under output_root."""
    if spec != "last":
        return Path(spec)
    candidates = [
        p for pattern in ("**/last.ckpt", "**/on_exception.ckpt") for p in Path(output_root).glob(pattern)
    ]
    if not candidates:
        raise CheckpointError(
            f"no checkpoint found under {output_root}/: train first (make train) or pass --ckpt PATH"
        )
    return max(candidates, key=lambda p: p.stat().st_mtime)


def tokenizer_for_run(run_config: dict[str, Any], data_dir: str | Path | None = None) -> Any:
    """The tokenizer a checkpoint was trained with: from its prepared data folder (char vocab) or by name."""
    from gptmini.data.prepare import load_tokenizer
    from gptmini.data.tokenizers import build_tokenizer

    folder = Path(data_dir) if data_dir else Path(run_config.get("data", {}).get("data_dir", ""))
    if (folder / "meta.json").is_file():
        return load_tokenizer(folder)
    name = run_config.get("tokenizer", {}).get("name", "gpt2")
    if name == "char":
        raise CheckpointError(
            f"the checkpoint uses the char tokenizer but its vocabulary ({folder}/vocab.json) is missing: pass "
            "--data-dir pointing at the prepared data folder it was trained on"
        )
    return build_tokenizer(name)


def load_for_inference(ckpt: str, device: str, data_dir: str | None = None) -> tuple[GPT, Any]:
    path = find_checkpoint(ckpt)
    model, run_config = model_from_checkpoint(path, map_location=device)
    log.info("loaded %s (%s parameters)", path, f"{model.num_parameters():,}")
    return model.to(device), tokenizer_for_run(run_config, data_dir)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gptmini-sample", description=__doc__)
    parser.add_argument(
        "--ckpt", default="last", help="checkpoint path, or 'last' for the newest under outputs/"
    )
    parser.add_argument("--prompt", default="\n", help="text to continue")
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    parser.add_argument("--top-k", type=int, default=200)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--num-samples", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--data-dir", default=None, help="prepared data folder (char vocab), if moved")
    parser.add_argument("--no-cache", action="store_true", help="generate without the key/value cache")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        model, tokenizer = load_for_inference(args.ckpt, args.device, args.data_dir)
        ids = tokenizer.encode(args.prompt)
        if not ids:
            raise CheckpointError("--prompt encodes to no tokens: give at least one character")
        idx = torch.tensor([ids] * args.num_samples, dtype=torch.long, device=args.device)
        gen = torch.Generator(device=args.device).manual_seed(args.seed)
        out = model.generate(
            idx,
            args.max_new_tokens,
            args.temperature,
            args.top_k,
            args.top_p,
            eos_token=getattr(tokenizer, "eot_id", None),
            use_cache=not args.no_cache,
            generator=gen,
        )
    except (CheckpointError, ValueError) as err:
        log.error("error: %s", err)
        return 2
    for i, row in enumerate(out.tolist()):
        if args.num_samples > 1:
            sys.stdout.write(f"--- sample {i + 1} ---\n")
        sys.stdout.write(tokenizer.decode(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
