"""scalars.csv reads from the left: the step, the losses and bpb, the learning rates, then every other tag."""

from __future__ import annotations

import csv
import io

from gptmini.training.run.run_report import Scalars


def test_scalars_csv_puts_step_losses_bpb_and_learning_rates_first() -> None:
    series = {
        tag: [(10, float(i))]
        for i, tag in enumerate(
            ["attention/entropy", "val/ppl", "lr-AdamW/no_decay", "val/bpb", "perf/mfu", "train/loss"]
            + ["lr-AdamW/decay", "val/loss", "train/grad_norm"]
        )
    }
    series["train/loss"].insert(0, (5, 9.5))
    rows = list(csv.reader(io.StringIO(Scalars(series).csv_text())))
    assert rows[0] == [
        "step",
        "train/loss",
        "val/loss",
        "val/bpb",
        "lr-AdamW/decay",
        "lr-AdamW/no_decay",
        "attention/entropy",
        "perf/mfu",
        "train/grad_norm",
        "val/ppl",
    ]
    assert rows[1] == ["5", "9.5", "", "", "", "", "", "", "", ""]
    assert rows[2] == ["10", "5.0", "7.0", "3.0", "6.0", "2.0", "0.0", "4.0", "8.0", "1.0"]


def test_scalars_csv_without_a_validation_starts_with_what_was_logged() -> None:
    rows = list(
        csv.reader(io.StringIO(Scalars({"perf/mfu": [(1, 0.5)], "train/loss": [(1, 2.0)]}).csv_text()))
    )
    assert rows == [["step", "train/loss", "perf/mfu"], ["1", "2.0", "0.5"]]


def test_the_next_commands_run_in_the_shell_that_started_the_run(tmp_path, monkeypatch) -> None:
    """The summary's commands name `gptmini` as the shell finds it: by name when PATH holds this one, else by
    its path (`.venv/bin/gptmini` from the checkout, as `make train` leaves it; absolute from elsewhere)."""
    import sys

    from gptmini.training.run.run_report import summary

    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "gptmini").write_text("#!/bin/sh\n")
    (bin_dir / "gptmini").chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))

    def commands() -> list[str]:
        text = summary(tmp_path / "outputs" / "run", [], None, "outputs", None, None)
        return [line.split()[0] for line in text.split("  next:\n")[1].splitlines()]

    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.chdir(tmp_path)
    assert commands() == [".venv/bin/gptmini"] * 4
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert commands() == [str(bin_dir / "gptmini")] * 4
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    assert commands() == ["gptmini"] * 4
