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
from gptmini.limits import check_fits, generation_bytes
from gptmini.model import GPT
from gptmini.options import finite_float, int_at_least, positive_int, resolve_device

log = logging.getLogger("gptmini.inference.sample")


def find_checkpoint(spec: str, output_root: str | Path = "outputs") -> Path:
    """``spec`` is a path, or "last" (``gptmini.checkpoint.find_last_checkpoint``: the most recently written
    last.ckpt or on_exception.ckpt of any run under ``output_root``, the rule of every command)."""
    return resolve_checkpoint(spec, output_root)


def tokenizer_for_run(
    run_config: dict[str, Any],
    data_dir: str | Path | None = None,
    checkpoint: tuple[Path, dict[str, Any]] | None = None,
    model_vocab: int | None = None,
) -> Any:
    """The tokenizer a checkpoint was trained with: from its prepared data folder (char vocab) or by name.
    ``checkpoint`` (path, dict): refuse a folder tokenized otherwise than the data the checkpoint recorded.
    ``model_vocab``: the model's vocabulary; a tokenizer with more ids than that is refused (its ids would index
    past the embedding), and a checkpoint that records no tokenizer (imported) gets GPT-2's BPE only when the
    model's vocabulary holds it."""
    tokenizer = _tokenizer_for_run(run_config, data_dir, checkpoint, model_vocab)
    if model_vocab is not None and tokenizer.vocab_size > model_vocab:
        raise CheckpointError(
            f"the tokenizer ({tokenizer.name}, {tokenizer.vocab_size} tokens) has more tokens than the model's "
            f"vocabulary ({model_vocab}): it is not the one the checkpoint was trained with; pass --data-dir with "
            "the prepared data folder it was trained on"
        )
    return tokenizer


def _tokenizer_for_run(
    run_config: dict[str, Any],
    data_dir: str | Path | None,
    checkpoint: tuple[Path, dict[str, Any]] | None,
    model_vocab: int | None,
) -> Any:
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
    name = run_config.get("tokenizer", {}).get("name")
    if name is None:  # a checkpoint not written by training (imported from Hugging Face): nothing recorded
        where = f"checkpoint {checkpoint[0]}" if checkpoint is not None else "the checkpoint"
        gpt2 = build_tokenizer("gpt2")
        if model_vocab is not None and model_vocab < gpt2.vocab_size:
            raise CheckpointError(
                f"{where} records no tokenizer (imported, not trained by gptmini) and its vocabulary "
                f"({model_vocab} tokens) is smaller than GPT-2's ({gpt2.vocab_size}): pass --data-dir with the "
                "prepared data folder whose vocabulary it uses (e.g. data/<corpus>_char), or import it again "
                "with --data-dir to record it"
            )
        log.warning("%s records no tokenizer: using GPT-2's BPE (pass --data-dir for another)", where)
        return gpt2
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
    tokenizer = tokenizer_for_run(run_config, data_dir, (path, checkpoint), model.config.vocab_size)
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


def check_generation_sizes(
    config: Any, prompt_tokens: int, max_new_tokens: int, num_samples: int, device: str | torch.device
) -> None:
    """Refuses ``--num-samples`` or ``--max-new-tokens`` whose generation cannot fit in the device's memory."""
    per_sample = generation_bytes(config, prompt_tokens + max_new_tokens)
    check_fits(
        "--num-samples",
        num_samples,
        per_sample,
        device,
        f"samples of {prompt_tokens + max_new_tokens:,} tokens",
    )
    fixed = num_samples * generation_bytes(config, prompt_tokens)
    check_fits("--max-new-tokens", max_new_tokens, 24 * num_samples, device, "new tokens", fixed=fixed)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gptmini-sample", description=__doc__)
    parser.add_argument(
        "--ckpt", default="last", help="checkpoint path, or 'last' for the newest under outputs/"
    )
    parser.add_argument("--prompt", default="\n", help="text to continue")
    parser.add_argument("--max-new-tokens", type=int_at_least(0), default=200)
    parser.add_argument("--temperature", type=finite_float(0.0), default=0.8, help="0 = greedy")
    parser.add_argument("--top-k", type=positive_int, default=200)
    parser.add_argument("--top-p", type=finite_float(0.0, 1.0, low_open=True), default=None)
    parser.add_argument("--num-samples", type=positive_int, default=1)
    parser.add_argument("--seed", type=int_at_least(0), default=1337)
    parser.add_argument("--device", default="auto", help="auto (a GPU when there is one), cpu, cuda, cuda:N")
    parser.add_argument("--data-dir", default=None, help="prepared data folder (char vocab), if moved")
    parser.add_argument("--no-cache", action="store_true", help="generate without the key/value cache")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        device = resolve_device(args.device)
        model, tokenizer = load_for_inference(args.ckpt, device, args.data_dir)
        ids = encode_prompt(tokenizer, args.prompt, "--prompt")
        check_generation_sizes(model.config, len(ids), args.max_new_tokens, args.num_samples, device)
        idx = torch.tensor([ids] * args.num_samples, dtype=torch.long, device=device)
        gen = torch.Generator(device=device).manual_seed(args.seed)
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
