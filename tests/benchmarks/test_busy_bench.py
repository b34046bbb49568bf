"""The busy-machine benchmark: its commands compose as the runs it names, the competing processes live only for
their block and in sessions of their own, the ratios and the verdict are the arithmetic they say; the quick run
(slow: real training processes) writes a row per program, load and round."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks import busy
from benchmarks.common import BenchOptions


@pytest.mark.parametrize(
    "program", [busy.SPEEDRUN, busy.SPEEDRUN_FIXED_THREADS, busy.QUICK_START], ids=lambda p: p.slug
)
def test_every_gptmini_command_composes_and_passes_the_config_checks(program, compose_cfg, tmp_path: Path):
    from gptmini.training.run.plan import validate_config

    cmd = busy.gptmini_command(program, str(tmp_path / "input.txt"), tmp_path, "run", quick=False)
    assert cmd[1:3] == ["-m", "gptmini.training"]
    cfg = compose_cfg(cmd[3:])
    validate_config(cfg)
    assert cfg.data.source == str(tmp_path / "input.txt") and cfg.tokenizer.name == "char"
    if program is busy.SPEEDRUN_FIXED_THREADS:
        assert cfg.callbacks.cpu_threads is None
    else:
        assert cfg.callbacks.cpu_threads._target_ == "gptmini.training.callbacks.cpu_threads.CpuThreads"
    if program is busy.QUICK_START:
        assert cfg.trainer.max_steps == 2000 and cfg.data.batch_size == 12
    else:
        assert cfg.target_val_loss == pytest.approx(1.8857)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads Linux's /proc")
def test_the_competitors_run_in_their_own_sessions_and_only_within_the_block():
    with busy.competitors(2) as pids:
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        assert all(os.getsid(p) == p != os.getsid(0) for p in pids)
    assert not any(_alive(p) for p in pids)


def test_ratios_are_per_round_and_load_and_the_verdict_compares_busy_with_quiet():
    rows = [
        {"program": "speedrun", "load": "quiet", "round": 1, "wall_s": 30.0},
        {"program": "ref", "load": "quiet", "round": 1, "wall_s": 100.0},
        {"program": "speedrun", "load": "busy", "round": 1, "wall_s": 90.0},
        {"program": "ref", "load": "busy", "round": 1, "wall_s": 200.0},
        {"program": "speedrun", "load": "quiet", "round": 2, "wall_s": 25.0},
        {"program": "ref", "load": "quiet", "round": 2, "wall_s": 50.0},
        {"program": "speedrun", "load": "busy", "round": 2, "wall_s": 80.0},
        {"program": "ref", "load": "busy", "round": 2, "wall_s": 400.0},
    ]
    busy.ratios(rows, "ref")
    assert [r["ratio"] for r in rows] == [0.3, 1.0, 0.45, 1.0, 0.5, 1.0, 0.2, 1.0]
    quiet, loaded, factor = busy.verdict(rows)
    assert (quiet, loaded) == (pytest.approx(0.4), pytest.approx(0.325))
    assert factor == pytest.approx(0.325 / 0.4)


def test_nanogpts_last_validation_is_read_from_its_log():
    log = "step 0: train loss 4.2874, val loss 4.2823\niter 0: loss 4.2, time 50.00ms\nstep 2000: train loss 1.7, val loss 1.8857\n"
    assert busy.nanogpt_val_loss(log) == 1.8857
    assert busy.nanogpt_val_loss("no evaluation") is None


@pytest.mark.slow
def test_quick_run_writes_a_row_per_program_load_and_round(tmp_path: Path):
    rows, notes = busy.bench_busy(BenchOptions(quick=True, out=tmp_path))
    got = [(r["program"], r["load"]) for r in rows]
    assert got == [
        ("speedrun", "quiet"),
        ("gptmini quick start", "quiet"),
        ("speedrun", "busy"),
        ("gptmini quick start", "busy"),
        ("speedrun, threads fixed", "busy"),
    ]
    assert all(r["wall_s"] > 0 and 0 < r["val_loss"] < 10 for r in rows)
    assert any("quick, not judged" in n for n in notes)
