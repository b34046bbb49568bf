"""Generate text from a training checkpoint: ``python -m gptmini.inference.sample --ckpt last --prompt "ROMEO:"``."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from gptmini.checkpoint import CheckpointError, check_trained_data, model_and_checkpoint, resolve_checkpoint
from gptmini.model import GPT

log = logging.getLogger("gptmini.inference.sample")


def find_checkpoint(spec: str, output_root: str | Path = "outputs") -> Path:
    """``spec`` is a path, or "last" (``gptmini.checkpoint.find_last_checkpoint``: the most recently written
    last.ckpt or on_exception.ckpt of any run under ``output_root``, the rule of every command)."""
    return resolve_checkpoint(spec, output_root)


def tokenizer_for_run(
    run_config: dict[str, Any],
    data_dir: str | Path | None = None,
    checkpoint: tuple[Path, dict[str, Any]] | None = None,
) -> Any:
    """The tokenizer a checkpoint was trained with: from its prepared data folder (char vocab) or by name.
    ``checkpoint`` (path, dict): refuse a folder tokenized otherwise than the data the checkpoint recorded."""
    from gptmini.data.prepare import load_tokenizer
    from gptmini.data.tokenizers import build_tokenizer

    folder = Path(data_dir) if data_dir else Path(run_config.get("data", {}).get("data_dir", ""))
    if (folder / "meta.json").is_file():
        if checkpoint is not None:
            check_trained_data(
                *checkpoint,
                folder,
                other_data="allow",
                fix="pass --data-dir with the prepared folder it was trained on",
            )
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
    model, checkpoint = model_and_checkpoint(path, map_location=device)
    run_config = dict(checkpoint["hyper_parameters"].get("run_config") or {})
    tokenizer = tokenizer_for_run(run_config, data_dir, (path, checkpoint))
    log.info("loaded %s (%s parameters)", path, f"{model.num_parameters():,}")
    return model.to(device), tokenizer


def encode_prompt(tokenizer: Any, text: str, option: str) -> list[int]:
    """``text`` as ids; characters the tokenizer's vocabulary lacks (a char vocabulary) are left out with one
    warning, and a text with nothing left is refused (ValueError naming ``option``)."""
    from gptmini.data.tokenizers import encode_known

    ids, unknown = encode_known(tokenizer, text)
    if unknown:
        log.warning(
            "%s: the characters %s are not in the checkpoint's vocabulary and are left out",
            option,
            " ".join(repr(c) for c in unknown),
        )
    if not ids:
        raise ValueError(
            f"{option} {text!r} encodes to no tokens{' of this vocabulary' if unknown else ''}: give at least one "
            "character the corpus contains"
        )
    return ids


def decode_samples(tokenizer: Any, rows: list[list[int]], model_vocab_size: int) -> list[str]:
    """Each row of ids as text; an id the tokenizer lacks (a model whose vocab_size exceeds its tokenizer's can
    generate one) is a ValueError saying so."""
    from gptmini.data.tokenizers import TokenizerError

    try:
        return [tokenizer.decode(row) for row in rows]
    except (TokenizerError, KeyError) as err:
        why = (
            f": the checkpoint's vocab_size {model_vocab_size} is larger than its tokenizer's "
            f"{tokenizer.vocab_size}, so it can generate ids the tokenizer does not have (train with "
            "model.vocab_size=null)"
            if model_vocab_size > tokenizer.vocab_size
            else ""
        )
        raise ValueError(f"cannot decode the generated text ({err}){why}") from None


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
        ids = encode_prompt(tokenizer, args.prompt, "--prompt")
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
        texts = decode_samples(tokenizer, out.tolist(), model.config.vocab_size)
    except (CheckpointError, ValueError) as err:
        log.error("error: %s", err)
        return 2
    for i, text in enumerate(texts):
        if args.num_samples > 1:
            sys.stdout.write(f"--- sample {i + 1} ---\n")
        sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
