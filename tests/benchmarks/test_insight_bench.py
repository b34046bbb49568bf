"""The validation-cost benchmark (``benchmarks/insight.py``, part of ``make bench``'s train section): head insight
alone and every default logger of a validation together."""

from __future__ import annotations

import pytest

from benchmarks.common import BenchOptions
from benchmarks.insight import INSIGHT_COLUMNS, bench_insight


@pytest.mark.slow  # the fast suite runs this section through tests/benchmarks/test_bench.py's quick run
def test_the_quick_insight_benchmark_reports_the_share_of_training_time():
    rows, notes = bench_insight(BenchOptions(device="cpu", quick=True, compile=False), rounds=1)
    (row,) = rows
    assert set(INSIGHT_COLUMNS) <= set(row)
    for key in ("step_ms", "pass_ms", "scores_ms", "loss_ms", "first_pass_ms"):
        assert row[key] > 0, key
    assert row["scores_ms"] + row["loss_ms"] < row["pass_ms"]  # the pass includes both, and the drawing
    assert row["share_pct"] == pytest.approx(100 * row["pass_ms"] / (row["val_every"] * row["step_ms"]))
    assert row["met"] == (row["share_pct"] <= row["target_pct"])
    # every default logger of a validation, on one attention pass
    assert row["passes_per_validation"] == 1
    assert row["extras_ms"] > row["scores_ms"]
    assert row["extras_pct"] == pytest.approx(100 * row["extras_ms"] / (row["val_every"] * row["step_ms"]))
    assert row["extras_met"] == (row["extras_pct"] <= row["target_pct"])
    # what the ATTENTION tab's neuron and lens views and the sinks add: a part of the extras
    assert 0 < row["detail_ms"] < row["extras_ms"] and row["projector_ms"] > 0
    assert row["detail_pct"] == pytest.approx(100 * row["detail_ms"] / (row["val_every"] * row["step_ms"]))
    assert row["detail_met"] == (row["detail_pct"] <= 2.0)
    # what the circuits add: a part of the insight pass and of the tab's detail together
    assert 0 < row["circuits_ms"] < row["pass_ms"] + row["detail_ms"]
    assert row["circuits_pct"] == pytest.approx(
        100 * row["circuits_ms"] / (row["val_every"] * row["step_ms"])
    )
    assert (
        any("share_pct" in n for n in notes)
        and any("detail_pct" in n for n in notes)
        and any("circuits_pct" in n for n in notes)
    )
