"""``gptmini data`` on a terminal: a progress bar per phase below the log lines while it prepares, gone at the
end, so that the log's last line is the last line on the screen."""

from __future__ import annotations

import io
import logging
import re
import sys


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _screen(raw: str) -> list[str]:
    """The lines a terminal shows after ``raw``: text, newlines, carriage returns, "erase line" and "cursor up"
    (what Rich's live display writes); colours and the cursor's visibility dropped."""
    lines, row, col = [""], 0, 0
    for token in re.findall(r"\x1b\[[0-9;?]*[A-Za-z]|\n|\r|[^\x1b\n\r]+", raw):
        if token == "\n":
            row, col = row + 1, 0
            lines += [""] * (row + 1 - len(lines))
        elif token == "\r":
            col = 0
        elif token == "\x1b[2K":
            lines[row] = ""
        elif (up := re.fullmatch(r"\x1b\[(\d*)A", token)) is not None:
            row = max(0, row - int(up.group(1) or 1))
        elif not token.startswith("\x1b"):
            line = lines[row].ljust(col)
            lines[row] = line[:col] + token + line[col + len(token) :]
            col += len(token)
    return [line.rstrip() for line in lines]


def test_the_bars_are_gone_when_the_preparation_ends(monkeypatch) -> None:
    from gptmini.data.progress import PrepareProgress, cli_logging

    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(logging.root, "handlers", [])
    monkeypatch.setattr(logging.root, "level", logging.root.level)
    callback, shown = cli_logging()
    with shown:
        callback(PrepareProgress("checking", 10, 0, 500, 1000, 1.0))
        callback(PrepareProgress("tokenizing", 20, 200, 1000, 1000, 2.0))
        logging.getLogger("gptmini.data.prepare").info("prepared 200 tokens")
    shown_lines = [line for line in _screen(terminal.getvalue()) if line]
    assert "tokenizing" in terminal.getvalue()  # the bars were drawn
    assert shown_lines[-1] == "prepared 200 tokens", shown_lines
