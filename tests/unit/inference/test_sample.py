"""``gptmini sample``: prompts adapt to the checkpoint's vocabulary, decoding is inside the error handling, and a
prepared folder tokenized otherwise than the checkpoint's data is refused."""

from __future__ import annotations

import logging

import pytest

from gptmini.data.prepare import prepare
from gptmini.inference.sample import main


@pytest.fixture
def char_data(tmp_path):
    corpus = tmp_path / "lower.txt"
    corpus.write_text("but soft, what light through yonder window breaks?\n" * 40)
    return prepare(str(corpus), "char", tmp_path / "data").out_dir


def test_a_prompt_loses_only_the_characters_the_vocabulary_lacks(
    tmp_path, char_data, write_checkpoint, capsys, caplog
):
    ckpt = write_checkpoint(tmp_path / "last.ckpt", data_dir=char_data)
    with caplog.at_level(logging.WARNING):
        status = main(["--ckpt", str(ckpt), "--prompt", "ROMEO: but", "--max-new-tokens", "4"])
    assert status == 0, caplog.text
    assert capsys.readouterr().out.startswith(" but")
    assert (
        "--prompt: the characters 'R' 'O' 'M' 'E' ':' are not in the checkpoint's vocabulary" in caplog.text
    )
    assert main(["--ckpt", str(ckpt), "--prompt", "ROMEO", "--max-new-tokens", "4"]) == 2
    assert "error: --prompt 'ROMEO' encodes to no tokens of this vocabulary" in caplog.text


def test_ids_the_tokenizer_lacks_are_an_error_not_a_traceback(tmp_path, char_data, write_checkpoint, caplog):
    # A model whose vocabulary (200) is larger than its tokenizer's (a hand-set model.vocab_size) can generate ids
    # the tokenizer cannot decode.
    ckpt = write_checkpoint(tmp_path / "big_vocab.ckpt", vocab_size=200)
    args = ["--ckpt", str(ckpt), "--data-dir", str(char_data), "--temperature", "2", "--max-new-tokens", "40"]
    assert main(args) == 2
    assert "error: cannot decode the generated text (id " in caplog.text
    assert "the checkpoint's vocab_size 200 is larger than its tokenizer's" in caplog.text


def test_a_data_folder_with_another_vocabulary_is_refused(tmp_path, char_data, write_checkpoint, caplog):
    ckpt = write_checkpoint(tmp_path / "last.ckpt", data_dir=char_data)
    other = tmp_path / "upper.txt"
    other.write_text("BUT SOFT, WHAT LIGHT THROUGH YONDER WINDOW BREAKS?\n" * 40)
    prepare(str(other), "char", char_data)  # the checkpoint's folder, re-prepared from another corpus
    assert main(["--ckpt", str(ckpt), "--max-new-tokens", "4"]) == 2
    assert f"error: {char_data} (source '{other}', tokenizer 'char'" in caplog.text
    assert "is tokenized differently from the data checkpoint" in caplog.text


def test_a_checkpoint_with_non_finite_weights_is_refused_in_one_line(
    tmp_path, char_data, write_checkpoint, caplog
):
    """A diverged run's weights (NaN) ended in torch.multinomial's traceback."""
    import torch

    from gptmini.runs.checkpoint import atomic_save

    ckpt = write_checkpoint(tmp_path / "last.ckpt", data_dir=char_data)
    saved = torch.load(ckpt, weights_only=True)
    name = next(k for k in saved["state_dict"] if k.endswith("lm_head.weight") or "wte" in k)
    saved["state_dict"][name][0, 0] = float("nan")
    atomic_save(saved, ckpt)  # a checksum of the NaN weights: the file is intact, its weights are not
    assert main(["--ckpt", str(ckpt), "--max-new-tokens", "4"]) == 2
    assert f"error: {ckpt} holds non-finite weights (NaN or inf, in " in caplog.text
    assert "pass an earlier checkpoint" in caplog.text


@pytest.mark.parametrize("value", ["-1", "1e5"])
def test_a_temperature_out_of_range_names_the_documented_range(value, capsys):
    """-1 was refused with finite_float's "[0, inf)", where 1e5 got the range --help states."""
    with pytest.raises(SystemExit):
        main(["--temperature", value])
    assert f"{value} is out of range: it must be 0 (greedy) or in [0.0001, 10000]" in capsys.readouterr().err


def test_the_text_is_written_as_it_is_generated(tmp_path, char_data, write_checkpoint, monkeypatch, capsys):
    """Each token's text reaches stdout (flushed) before the next token is drawn: what a writer had seen when the
    k-th token was drawn is the prompt and the k - 1 tokens before it. The whole output is the one sample's text."""
    import io
    import sys

    from gptmini import generation

    drawn: list[int] = []
    written: list[str] = []
    seen_at_draw: list[str] = []

    class Out(io.StringIO):
        def flush(self) -> None:
            written.append(self.getvalue())

    draw = generation.sample

    def counted(*args, **kwargs):
        seen_at_draw.append(out.getvalue() if written else "")
        drawn.append(1)
        return draw(*args, **kwargs)

    out = Out()
    monkeypatch.setattr(generation, "sample", counted)
    monkeypatch.setattr(sys, "stdout", out)
    ckpt = write_checkpoint(tmp_path / "last.ckpt", data_dir=char_data)
    assert main(["--ckpt", str(ckpt), "--prompt", "but", "--max-new-tokens", "6", "--temperature", "0"]) == 0
    text = out.getvalue()
    assert (
        len(drawn) == 6 and text.endswith("\n") and len(text) == len("but") + 6 + 1
    )  # char: a token a character
    # flushed after each token: at the k-th draw, the prompt and k - 1 generated characters were out
    assert seen_at_draw == [""] + [text[: len("but") + k] for k in range(1, 6)]
