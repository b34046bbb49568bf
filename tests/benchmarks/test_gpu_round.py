"""``python -m benchmarks.gpu_round`` on a machine without a GPU: it refuses with one line, and ``--cpu-dry-run``
runs every section on the CPU with tiny shapes, so the script is known to work before a GPU is lent (the code
paths, not the numbers). No timing thresholds."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from benchmarks import gpu_round

pytestmark = [
    pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated"),
]


def test_it_refuses_a_machine_without_cuda(tmp_path, capsys):
    assert not torch.cuda.is_available()
    assert gpu_round.main(["--out", str(tmp_path / "results")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "--cpu-dry-run" in err[0]
    assert not (tmp_path / "results").exists()


def test_the_kernel_sections_run_on_the_cpu_and_write_one_table(tmp_path):
    out = tmp_path / "results"
    assert gpu_round.main(["--cpu-dry-run", "--only", "sdpa", "fp8", "--out", str(out)]) == 0
    table = (out / "gpu_round.md").read_text()
    rows = [
        line.split(" | ")
        for line in table.splitlines()
        if line.startswith("| sdpa") or line.startswith("| fp8")
    ]
    by_row = {(r[0].strip("| "), r[1]): r for r in rows}
    assert {name.lower() for name in gpu_round.SDPA_BACKENDS} == {
        row for section, row in by_row if section == "sdpa"
    }
    assert float(by_row[("sdpa", "math")][2]) > 0  # the math kernel runs anywhere
    fp8 = by_row[("fp8", "torchao float8 training")]
    expected = (
        "torchao is not installed" if importlib.util.find_spec("torchao") is None else "needs a CUDA GPU"
    )
    assert fp8[2] == "—" and expected in fp8[4]


def _table(out) -> list[list[str]]:
    lines = [line for line in (out / "gpu_round.md").read_text().splitlines() if line.startswith("| ")][2:]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def _fused_rows_run(rows: list[list[str]], steps) -> None:
    speed = {r[1]: r for r in rows if r[0] == "fused" and r[3] == "tokens/s"}
    assert speed.keys() == set(steps)
    for label, (settings, _) in steps.items():
        assert float(speed[label][2]) > 0, speed[label]
        # liger's rows on a CPU: the settings' CPU hand-off, said in the row
        assert ("PyTorch's ops on the CPU" in speed[label][4]) == ("liger" in settings.values())


def test_the_fused_sections_eager_rows_run_on_the_cpu(tmp_path, monkeypatch):
    # every loss path and kernel setting through the bare step (the compiled rows: the slow test below)
    eager = {label: row for label, row in gpu_round.FUSED_STEPS.items() if not row[1]}
    assert len(eager) >= 4
    monkeypatch.setattr(gpu_round, "FUSED_STEPS", eager)
    out = tmp_path / "results"
    assert gpu_round.main(["--cpu-dry-run", "--only", "fused", "--out", str(out)]) == 0
    _fused_rows_run(_table(out), eager)


@pytest.mark.slow
def test_the_cpu_dry_run_runs_the_training_sections_through_the_real_command(tmp_path):
    out = tmp_path / "results"
    assert gpu_round.main(["--cpu-dry-run", "--only", "fused", "mfu", "pairs", "--out", str(out)]) == 0
    rows = _table(out)
    _fused_rows_run(rows, gpu_round.FUSED_STEPS)
    liger_rows = [r for r in rows if r[0] == "mfu" and r[1] in gpu_round.LIGER_MFU_VARIANTS]
    assert len(liger_rows) == len(gpu_round.LIGER_MFU_VARIANTS)
    assert all(r[2] == "—" and r[4] for r in liger_rows), liger_rows  # no CUDA here: the reason, no run
    rows = [r for r in rows if r[0] != "fused"]
    assert not [r for r in rows if "exit" in r[4] or "stopped after" in r[4]], rows
    mfu = {(r[1], r[3]): r[2] for r in rows if r[0] == "mfu"}
    for variant in gpu_round.MFU_VARIANTS:
        assert float(mfu[(variant, "tokens/s")]) > 0
        assert float(mfu[(variant, "s from the process's start to its first logged step")]) > 0
    pairs = {r[1]: r[2] for r in rows if r[0] == "pairs"}
    assert float(pairs["nanogpt: whole process"]) > 0 and float(pairs["default: whole process"]) > 0
    assert float(pairs["nanogpt: at nanoGPT's final val/loss"]) > 0  # the recipe reaches its own final loss
