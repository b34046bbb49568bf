"""gptmini's tokenizers as Hugging Face tokenizer files (``tokenizer.json`` + ``tokenizer_config.json``), so an
exported folder is usable with ``transformers.AutoTokenizer.from_pretrained(folder)``.

Built with the ``tokenizers`` library from the same data gptmini tokenizes with, so both encode every text to
gptmini's ids; a character a ``char`` vocabulary lacks is an error in both, as there is no unknown token.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gptmini.data.tokenizers import ENDOFTEXT, Tokenizer, gpt2_data_dir

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"


class TokenizerExportError(ValueError):
    """A tokenizer that gptmini cannot write in Hugging Face's format."""


def _tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError:
        raise ImportError(
            "writing tokenizer files needs the 'tokenizers' package: pip install 'gptmini[hf]' "
            "(or: pip install tokenizers), or export with --tokenizer none"
        ) from None
    return tokenizers


def _gpt2_bpe(tokenizer: Tokenizer) -> tuple[Any, dict[str, str]]:
    tk = _tokenizers()
    data = gpt2_data_dir()  # the files tiktoken's gpt2 encoding was built (and verified) from
    hf = tk.Tokenizer(tk.models.BPE.from_file(str(data / "encoder.json"), str(data / "vocab.bpe")))
    # byte-level BPE with GPT-2's pre-tokenizing regex, no prefix space: GPT-2's own tokenizer
    hf.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = tk.decoders.ByteLevel()
    hf.add_special_tokens([tk.AddedToken(ENDOFTEXT, special=True)])
    return hf, {"bos_token": ENDOFTEXT, "eos_token": ENDOFTEXT, "unk_token": ENDOFTEXT}


def _chars(tokenizer: Tokenizer) -> tuple[Any, dict[str, str]]:
    tk = _tokenizers()
    vocab = {c: i for i, c in enumerate(tokenizer.chars)}
    hf = tk.Tokenizer(tk.models.WordLevel(vocab, unk_token=None))
    # every character its own piece (newlines too: [\s\S], not '.'), and ids joined back without separators
    hf.pre_tokenizer = tk.pre_tokenizers.Split(tk.Regex(r"[\s\S]"), behavior="isolated")
    hf.decoder = tk.decoders.Fuse()
    return hf, {}


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte, in which byte-level BPE files spell their tokens."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    others = [b for b in range(256) if b not in printable]
    return {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(others)}


def _trained_bpe(tokenizer: Tokenizer) -> tuple[Any, dict[str, str]]:
    """A trained BPE's ranks as Hugging Face's vocabulary and merges: every split of a token into two tokens of
    lower rank is a merge, ordered by the token's rank (then the parts'), so merging by priority yields the
    tokens tiktoken's lowest-rank-first merging does (tests compare the ids)."""
    tk = _tokenizers()
    spell = _byte_to_unicode()
    ranks = {t: i for i, t in enumerate(tokenizer.tokens)}
    merges = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = ranks.get(token[:cut]), ranks.get(token[cut:])
            if left is not None and right is not None and left < rank and right < rank:
                merges.append((rank, left, right, token[:cut], token[cut:]))
    merges.sort()

    def text(token: bytes) -> str:
        return "".join(spell[b] for b in token)

    vocab = {text(t): i for t, i in ranks.items()}
    model = tk.models.BPE(vocab, [(text(a), text(b)) for *_, a, b in merges], ignore_merges=False)
    hf = tk.Tokenizer(model)
    hf.pre_tokenizer = tk.pre_tokenizers.Sequence(
        [
            tk.pre_tokenizers.Split(tk.Regex(tokenizer.pattern), behavior="isolated"),
            tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    hf.decoder = tk.decoders.ByteLevel()
    hf.add_special_tokens([tk.AddedToken(ENDOFTEXT, special=True)])
    return hf, {"bos_token": ENDOFTEXT, "eos_token": ENDOFTEXT, "unk_token": ENDOFTEXT}


# by gptmini tokenizer name: a function giving the tokenizers.Tokenizer and its special tokens
_BUILDERS: dict[str, Callable[[Tokenizer], tuple[Any, dict[str, str]]]] = {
    "gpt2": _gpt2_bpe,
    "char": _chars,
    "bpe": _trained_bpe,
}


def check_exportable(tokenizer: Tokenizer) -> None:
    if tokenizer.name not in _BUILDERS:
        raise TokenizerExportError(
            f"tokenizer {tokenizer.name!r} cannot be written as Hugging Face tokenizer files (gptmini writes "
            f"{' and '.join(sorted(_BUILDERS))}): export with --tokenizer none and add the tokenizer yourself"
        )


def write_tokenizer_files(tokenizer: Tokenizer, folder: str | Path, model_max_length: int) -> list[str]:
    """Writes ``tokenizer.json`` and ``tokenizer_config.json`` into ``folder``; returns the file names."""
    check_exportable(tokenizer)
    hf, special = _BUILDERS[tokenizer.name](tokenizer)
    folder = Path(folder)
    hf.save(str(folder / TOKENIZER_FILE))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": model_max_length,
        # decode exactly: no space clean-up (" ." stays " .") and no BOS added in front of every text
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "add_eos_token": False,
        "model_input_names": ["input_ids", "attention_mask"],  # no token_type_ids, which Llama does not take
        **special,
    }
    (folder / TOKENIZER_CONFIG_FILE).write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    return [TOKENIZER_FILE, TOKENIZER_CONFIG_FILE]
