"""The start-up section: its rows from real processes (a quick round), and how it reads ``python -X importtime``."""

from __future__ import annotations

import math

import pytest

from benchmarks import cli, common
from benchmarks.startup import EAGER, STARTUP_COLUMNS, TORCH, TRAIN, imported_seconds

IMPORTTIME = """\
import time: self [us] | cumulative | imported package
import time:       120 |        120 |     scipy._lib
import time:      2000 |     250000 |   scipy
import time:       300 |        300 |       transformers.utils
import time:      1000 |     500000 |     transformers
import time:       400 |     900000 | lightning
"""


def test_what_the_eager_imports_took_is_their_cumulative_time() -> None:
    assert imported_seconds(IMPORTTIME, EAGER) == pytest.approx(0.75)
    assert imported_seconds(IMPORTTIME, ("scipy._lib",)) == pytest.approx(0.00012)
    assert imported_seconds(IMPORTTIME, ("torch",)) == 0


@pytest.mark.slow
def test_a_quick_round_writes_every_row(tmp_path) -> None:
    opts = common.BenchOptions(device="cpu", quick=True, compile=False, out=tmp_path)
    rows = cli.run(opts, only=("startup",))["startup"]
    assert [r["what"] for r in rows][:2] == [TORCH, TRAIN] and len(rows) == 6
    for r in rows:
        assert set(STARTUP_COLUMNS) <= set(r) and r["rounds"] == 1
        assert math.isfinite(r["median_s"]) and r["median_s"] > 0, r
    assert rows[0]["x_import_torch"] == 1.0
    table = (tmp_path / "startup.md").read_text()
    assert "CPU: " in table and "load average" in table
