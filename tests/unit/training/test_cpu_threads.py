"""callbacks.cpu_threads: torch's thread count follows the cores other programs leave free."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from gptmini.training.callbacks import cpu_threads
from gptmini.training.callbacks.cpu_threads import (
    CpuThreads,
    CpuTimes,
    others_busy_cores,
    process_ticks,
    read_cpu_times,
    threads_for,
)

LINUX_PROC = Path("/proc/self/stat").is_file()
SPIN = "import time\nt = time.monotonic() + 20\nwhile time.monotonic() < t: pass"


def _fake_proc(root: Path, cpu: str, self_stat: str, children: dict[str, str]) -> Path:
    (root / "self" / "task" / "100").mkdir(parents=True)
    (root / "stat").write_text(f"{cpu}\ncpu0 1 2 3 4 5 6 7 8 9 10\nintr 12345\n")
    (root / "self" / "stat").write_text(self_stat)
    (root / "self" / "task" / "100" / "children").write_text(" ".join(children) + (" " if children else ""))
    for pid, stat in children.items():
        (root / pid).mkdir()
        (root / pid / "stat").write_text(stat)
    return root


def _stat(comm: str, utime: int, stime: int) -> str:
    # fields 1-13, then utime (14) and stime (15), then the rest
    return f"100 ({comm}) R 1 100 100 0 -1 4194304 500 0 0 0 {utime} {stime} 0 0 20 0 3 0 1000 0 0\n"


def test_the_readings_add_up_the_machines_busy_ticks_and_the_process_trees_own(tmp_path: Path) -> None:
    # user nice system idle iowait irq softirq steal guest guest_nice
    cpu = "cpu  1000 20 300 5000 80 10 5 2 400 0"
    proc = _fake_proc(
        tmp_path,
        cpu,
        _stat("python (a) b", 70, 30),  # a command name with spaces and parentheses
        {"201": _stat("pt_data_worker", 11, 4), "202": _stat("w", 5, 0)},
    )
    times = read_cpu_times(proc)
    total = 1000 + 20 + 300 + 5000 + 80 + 10 + 5 + 2  # guest time is already inside user
    assert times == CpuTimes(busy=total - 5000 - 80, total=total, own=70 + 30 + 11 + 4 + 5)


def test_a_child_that_ended_between_the_reads_is_left_out(tmp_path: Path) -> None:
    proc = _fake_proc(
        tmp_path, "cpu  10 0 10 80 0 0 0 0 0 0", _stat("python", 3, 1), {"201": _stat("w", 2, 2)}
    )
    (proc / "201" / "stat").unlink()
    assert read_cpu_times(proc).own == 4


def test_other_processes_share_is_counted_in_cores() -> None:
    before = CpuTimes(busy=1000, total=4000, own=400)
    # 2 cores, 100 ticks each: 150 busy ticks of which 50 were this process's -> others took one core
    after = CpuTimes(busy=1150, total=4200, own=450)
    assert others_busy_cores(before, after, cores=2) == pytest.approx(1.0)
    # this process alone busy: nobody else
    assert others_busy_cores(before, CpuTimes(busy=1200, total=4200, own=600), cores=2) == 0.0
    # no time passed
    assert others_busy_cores(before, before, cores=2) == 0.0


@pytest.mark.parametrize(
    ("others", "cores", "most", "threads"),
    [
        (0.0, 2, 2, 2),
        (0.4, 2, 2, 2),
        (0.6, 2, 2, 1),
        (1.0, 2, 2, 1),
        (2.0, 2, 2, 1),  # never fewer than one
        (0.0, 16, 4, 4),  # never more than training started with
        (5.2, 16, 16, 11),
    ],
)
def test_threads_fill_the_free_cores(others: float, cores: int, most: int, threads: int) -> None:
    assert threads_for(others, cores, most) == threads


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_the_callback_drops_to_the_free_cores_and_comes_back(
    monkeypatch: pytest.MonkeyPatch, two_threads: None
) -> None:
    clock = iter(float(t) for t in range(100))
    monkeypatch.setattr(cpu_threads.time, "monotonic", lambda: next(clock))
    # 2 cores, 100 ticks a core between readings; own ticks 100 each time; others' busy ticks per reading:
    readings = iter(
        [
            CpuTimes(busy=0, total=0, own=0),  # on_train_start
            CpuTimes(busy=200, total=200, own=100),  # others took one core -> 1 thread
            CpuTimes(busy=370, total=400, own=200),  # others 0.7 of a core -> still 1
            CpuTimes(busy=480, total=600, own=300),  # others 0.1 -> back to 2
        ]
    )
    monkeypatch.setattr(cpu_threads, "read_cpu_times", lambda: next(readings))
    cb = CpuThreads(interval_s=1.0)
    cb.cores = 2
    module = SimpleNamespace(device=torch.device("cpu"))
    cb.on_train_start(None, module)
    seen = []
    for i in range(3):
        cb.on_train_batch_end(None, module, None, None, i)
        seen.append(torch.get_num_threads())
    assert seen == [1, 1, 2]
    torch.set_num_threads(1)
    cb.on_fit_end(None, module)
    assert torch.get_num_threads() == 2  # the count training started with


def test_readings_wait_for_the_interval(monkeypatch: pytest.MonkeyPatch, two_threads: None) -> None:
    times = iter([0.0, 0.3, 0.6, 1.2, 1.2])
    monkeypatch.setattr(cpu_threads.time, "monotonic", lambda: next(times))
    calls = []

    def reading() -> CpuTimes:
        calls.append(1)
        return CpuTimes(busy=200 * len(calls), total=200 * len(calls), own=0)

    monkeypatch.setattr(cpu_threads, "read_cpu_times", reading)
    cb = CpuThreads(interval_s=1.0)
    cb.cores = 2
    module = SimpleNamespace(device=torch.device("cpu"))
    cb.on_train_start(None, module)
    cb.on_train_batch_end(None, module, None, None, 0)  # 0.3 s
    cb.on_train_batch_end(None, module, None, None, 1)  # 0.6 s
    assert len(calls) == 1 and torch.get_num_threads() == 2
    cb.on_train_batch_end(None, module, None, None, 2)  # 1.2 s: others took both cores
    assert len(calls) == 2 and torch.get_num_threads() == 1


def test_off_the_cpu_or_without_proc_nothing_changes(
    monkeypatch: pytest.MonkeyPatch, two_threads: None
) -> None:
    monkeypatch.setattr(cpu_threads, "read_cpu_times", lambda: CpuTimes(busy=10**9, total=10**9, own=0))
    cb = CpuThreads(interval_s=1e-9)
    gpu = SimpleNamespace(device=torch.device("cuda", 0))
    cb.on_train_start(None, gpu)
    assert cb.on_train_batch_end is None  # nothing to watch: Lightning calls it at no batch
    assert torch.get_num_threads() == 2

    def no_proc() -> CpuTimes:
        raise FileNotFoundError("/proc/stat")

    monkeypatch.setattr(cpu_threads, "read_cpu_times", no_proc)
    cpu = SimpleNamespace(device=torch.device("cpu"))
    cb.on_train_start(None, cpu)
    assert cb.on_train_batch_end is None
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("bad", [0, -1.0, "1", True, None])
def test_a_bad_interval_is_one_line_naming_the_key(bad: object) -> None:
    with pytest.raises(
        ValueError,
        match=r"callbacks\.cpu_threads\.interval_s=.* is invalid: it must be a number of seconds > 0",
    ):
        CpuThreads(interval_s=bad)  # type: ignore[arg-type]


@pytest.mark.skipif(not LINUX_PROC, reason="reads Linux's /proc")
def test_a_busy_program_elsewhere_counts_as_others_and_a_child_as_own() -> None:
    # Whatever else the machine runs (a second test worker), the spinner's own ticks are the oracle: another
    # program's land in "others", a child's in "own".
    cores = os.cpu_count() or 1

    def measured(pid: int) -> tuple[CpuTimes, CpuTimes, int]:
        time.sleep(0.3)  # the interpreter's start
        spinner = Path(f"/proc/{pid}/stat")
        before, spun = read_cpu_times(), process_ticks(spinner)
        time.sleep(1.0)
        after, spun = read_cpu_times(), process_ticks(spinner) - spun
        assert spun >= 10  # it ran (0.1 s of a core at least)
        return before, after, spun

    # another program: started through a shell that exits at once, so it is nobody's child of ours
    shell = subprocess.run(
        ["sh", "-c", f'"{sys.executable}" -c "{SPIN}" >/dev/null 2>&1 & echo $!'],
        capture_output=True,
        text=True,
        check=True,
    )
    other = int(shell.stdout.split()[0])
    try:
        before, after, spun = measured(other)
    finally:
        subprocess.run(["kill", str(other)], check=False)
    ticks_per_core = (after.total - before.total) / cores
    assert others_busy_cores(before, after, cores) * ticks_per_core >= 0.9 * spun
    assert after.own - before.own < 0.5 * spun  # this test itself mostly sleeps

    child = subprocess.Popen([sys.executable, "-c", SPIN])
    try:
        before, after, spun = measured(child.pid)
    finally:
        child.kill()
        child.wait()
    assert after.own - before.own >= spun - 2  # read a moment apart: a tick or two either way


def test_a_deterministic_run_keeps_its_thread_count_whatever_the_load(
    monkeypatch: pytest.MonkeyPatch, two_threads: None
) -> None:
    """trainer.deterministic=true (torch's deterministic algorithms on) is the reproducible mode: the thread count,
    which changes a CPU operation's result, stays what the run started with even with every core busy."""
    # other programs keep both cores busy: without the switch, one thread (test_the_callback_drops_...)
    ticks = iter(CpuTimes(busy=200 * k, total=200 * k, own=0) for k in range(100))
    monkeypatch.setattr(cpu_threads, "read_cpu_times", ticks.__next__)
    monkeypatch.setattr(cpu_threads.time, "monotonic", iter(float(t) for t in range(100)).__next__)
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        cb = CpuThreads(interval_s=1.0)
        cb.cores = 2
        module = SimpleNamespace(device=torch.device("cpu"))
        cb.on_train_start(None, module)
        assert cb.on_train_batch_end is None  # the count stays: nothing to read at any batch
        assert torch.get_num_threads() == 2
    finally:
        torch.use_deterministic_algorithms(before)
