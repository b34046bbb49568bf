"""Generate text from a training checkpoint: ``gptmini sample --ckpt last --prompt "ROMEO:"``."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

import torch

from gptmini.generation import TEMPERATURE_RANGE, temperature_problem
from gptmini.limits import check_fits, generation_bytes
from gptmini.options import DEFAULT_SEED, HelpFormatter, finite_float, int_at_least, positive_int, seed_int
from gptmini.runs.checkpoint import CheckpointError
from gptmini.runs.loading import add_run_options, open_run

log = logging.getLogger("gptmini.inference.sample")


def _temperature(text: str) -> float:
    """``--temperature``'s argparse type: a finite number, 0 or in ``TEMPERATURE_RANGE``."""
    value = finite_float()(text)
    if (problem := temperature_problem(value)) is not None:
        raise argparse.ArgumentTypeError(f"{text} {problem}")
    return value


_temperature.__name__ = "temperature"


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
    # the length first: a single sample too long to fit is --max-new-tokens's doing, not --num-samples's
    prompt = generation_bytes(config, prompt_tokens)
    check_fits("--max-new-tokens", max_new_tokens, 24, device, "new tokens", fixed=prompt)
    total = prompt_tokens + max_new_tokens
    per_sample = generation_bytes(config, total)
    check_fits("--num-samples", num_samples, per_sample, device, f"samples of {total:,} tokens")
    check_fits(
        "--max-new-tokens", max_new_tokens, 24 * num_samples, device, "new tokens", fixed=num_samples * prompt
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gptmini sample", description=__doc__, formatter_class=HelpFormatter
    )
    add_run_options(parser)
    parser.add_argument("--prompt", default="\n", help="text to continue (default: %(default)r)")
    parser.add_argument("--max-new-tokens", type=int_at_least(0), default=200, help="tokens to generate")
    parser.add_argument(
        "--temperature",
        type=_temperature,
        default=0.8,
        help=f"0 = greedy, else in [{TEMPERATURE_RANGE[0]:g}, {TEMPERATURE_RANGE[1]:g}]",
    )
    parser.add_argument("--top-k", type=positive_int, default=200, help="sample among the k likeliest tokens")
    parser.add_argument(
        "--top-p",
        type=finite_float(0.0, 1.0, low_open=True),
        default=None,
        help="nucleus sampling: among the likeliest tokens whose probabilities add up to p (None: off)",
    )
    parser.add_argument("--num-samples", type=positive_int, default=1, help="samples to generate")
    parser.add_argument("--seed", type=seed_int, default=DEFAULT_SEED, help="seed of the sampling")
    parser.add_argument("--no-cache", action="store_true", help="generate without the key/value cache")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        run = open_run(args.ckpt, args.device, args.data_dir)
        model, tokenizer, device = run.model, run.tokenizer, run.device
        diverged = next((n for n, p in model.named_parameters() if not torch.isfinite(p).all()), None)
        if diverged is not None:
            raise CheckpointError(
                f"{run.path} holds non-finite weights (NaN or inf, in {diverged}): its training diverged, so "
                "nothing can be sampled from it; pass an earlier checkpoint"
            )
        ids = encode_prompt(tokenizer, args.prompt, "--prompt")
        check_generation_sizes(model.config, len(ids), args.max_new_tokens, args.num_samples, device)
        idx = torch.tensor([ids] * args.num_samples, dtype=torch.long, device=device)
        gen = torch.Generator(device=device).manual_seed(args.seed)
        shown = Shown(tokenizer) if args.num_samples == 1 else None  # one sample: its text as it is generated
        out = model.generate(
            idx,
            args.max_new_tokens,
            args.temperature,
            args.top_k,
            args.top_p,
            eos_token=getattr(tokenizer, "eot_id", None),
            use_cache=not args.no_cache,
            generator=gen,
            on_token=shown,
        )
        texts = decode_samples(tokenizer, out.tolist(), model.config.vocab_size)
    except (CheckpointError, ValueError) as err:
        log.error("error: %s", err)
        return 2
    for i, text in enumerate(texts):
        if args.num_samples > 1:
            sys.stdout.write(f"--- sample {i + 1} ---\n")
        sys.stdout.write((shown.rest(text) if shown else text) + "\n")
    return 0


class Shown:
    """One sample's text written to stdout as its tokens come: each time the decoded text so far extends what is
    shown by whole characters (a token may end inside a character's bytes), the new part."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.text = ""

    def __call__(self, idx: torch.Tensor) -> None:
        from gptmini.data.tokenizers import TokenizerError

        try:
            text = self.tokenizer.decode(idx[0].tolist())
        except (TokenizerError, KeyError, ValueError):
            return  # an id the tokenizer lacks: the final decode says so
        if text.startswith(self.text) and not text.endswith("\ufffd"):
            sys.stdout.write(text[len(self.text) :])
            sys.stdout.flush()
            self.text = text

    def rest(self, text: str) -> str:
        return text[len(self.text) :] if text.startswith(self.text) else "\n" + text


if __name__ == "__main__":
    sys.exit(main())
