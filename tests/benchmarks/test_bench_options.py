"""``gptmini bench`` refuses bad options with one usage line naming the option, before any benchmark runs."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import cli

BAD = [
    (["--e2e-rounds", "0"], r"argument --e2e-rounds: 0 is out of range: it must be an integer >= 1"),
    (["--corpus-mb", "100,-5"], r"argument --corpus-mb: -5 is out of range: it must be an integer >= 1"),
    (["--corpus-mb", "1e3"], r"argument --corpus-mb: '1e3' is not an integer"),
    (["--seed", "-1"], r"argument --seed: -1 is out of range: it must be an integer in \[0, \d+\]"),
    (["--seed", str(10**23)], r"argument --seed: 1{1}0{23} is out of range"),
    (
        ["--out", "FILE"],
        r"--out \S+: \S+ is a file, not a folder; pass a folder the tables can be written to",
    ),
    (["--out", "FILE/results"], r"--out \S+: \S+ is a file, not a folder; pass a folder"),
]


@pytest.mark.parametrize(("argv", "pattern"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_options_are_one_usage_error(tmp_path, capsys, argv, pattern) -> None:
    (tmp_path / "FILE").write_text("not a folder")
    argv = [a.replace("FILE", str(tmp_path / "FILE")) for a in argv]
    with pytest.raises(SystemExit) as exit_:
        cli.parse_args(["--only", "data", *argv])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and re.search(pattern, err), err
    assert "Traceback" not in err and err.count("error:") == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_device_cuda_without_a_gpu_is_one_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.parse_args(["--device", "cuda"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--device cuda: PyTorch sees no CUDA GPU on this machine" in err, err


def test_the_bench_command_refuses_zero_rounds_in_one_line(tmp_path) -> None:
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "gptmini"),  # the installed command
            "bench",
            "--only",
            "e2e",
            "--e2e-rounds",
            "0",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "argument --e2e-rounds: 0 is out of range" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and list(tmp_path.iterdir()) == []


def test_the_bench_command_says_how_long_first_and_ctrl_c_ends_it_in_one_line(run_cli, tmp_path) -> None:
    """`gptmini bench --quick` from a terminal: its first line gives the expected duration; Ctrl-C (SIGINT to the
    terminal's process group: the command and the benchmarks' process) ends both with one line, no traceback."""
    import os
    import signal

    proc = run_cli.popen(
        "gptmini.cli",
        ["bench", "--quick", "--only", "attention", "--out", tmp_path],
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        first = proc.stdout.readline()
        assert re.search(r"gptmini bench --quick: about \d+ minutes on a 2-core CPU", first), first
        os.killpg(proc.pid, signal.SIGINT)
        rest = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, rest
    assert "Traceback" not in rest and re.fullmatch(
        rf"[\d:]+ bench interrupted after \d+ s; the tables done before are in {tmp_path}\n", rest
    ), rest
