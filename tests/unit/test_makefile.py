"""``make help`` lists every target, in colour on a terminal only: piped, its output is plain text."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_help_prints_no_colour_codes_into_a_pipe() -> None:
    out = subprocess.run(["make", "-s", "help"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert "\033" not in out
    targets = [line.split()[0] for line in out.splitlines() if line.startswith("  ")]
    assert {"install", "train", "test", "help"} <= set(targets)


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_attention_twice_writes_a_new_folder_each_time(
    tmp_path, write_checkpoint, cli_env, gptmini_cli
) -> None:
    """`make attention` as README types it, twice in a row, then docs/export-import.md's `gptmini attention`
    line: each call writes its maps into a folder of its own, none refused for the maps an earlier call left.
    The first call runs make and the command it starts; the second is the command line make runs (`make -n`),
    and the docs line, through the command's own main in this process."""
    from gptmini.data.prepare import prepare

    if not (REPO / ".venv" / "bin" / "gptmini").is_file():
        pytest.skip("no .venv in the checkout (`make install` was not run)")
    (tmp_path / "corpus.txt").write_text("ROMEO: But soft, to be, or not to be: that is the question.\n" * 60)
    folder = prepare(str(tmp_path / "corpus.txt"), "char", tmp_path / "data").out_dir
    ckpt = write_checkpoint(tmp_path / "last.ckpt", data_dir=folder, block_size=16, n_layer=1, n_head=2)
    venv = REPO / ".venv"
    make = ["make", "-s", "-f", str(REPO / "Makefile"), f"VENV={venv}", "-o", f"{venv}/.installed"]
    target = ["attention", f"CKPT={ckpt}", "TEXT=to be, or not"]
    proc = subprocess.run(
        [*make, *target], cwd=tmp_path, env=cli_env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "wrote 2 PNG files to outputs/attention_png/1" in proc.stderr
    printed = subprocess.run(
        [*make, "-n", *target], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout
    argv = shlex.split(printed)
    assert argv[:2] == [str(venv / "bin" / "gptmini"), "attention"], printed
    again = gptmini_cli(argv[1:], cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "wrote 2 PNG files to outputs/attention_png/2" in again.stderr
    docs = (REPO / "docs" / "export-import.md").read_text(encoding="utf-8")
    line = next(line for line in docs.splitlines() if line.startswith("gptmini attention "))
    argv = shlex.split(line, comments=True)[1:]
    argv[argv.index("last")] = str(ckpt)
    proc = gptmini_cli(argv, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    maps = tmp_path / "outputs" / "attention_png"
    assert sorted(p.name for p in maps.iterdir()) == ["1", "2", "3"]
    for n in "123":
        assert sorted(p.name for p in (maps / n).iterdir()) == [
            "entropy.json",
            "layer0_heads.png",
            "layer0_mean.png",
        ]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize(("args", "port"), [([], "6006"), (["PORT=6007"], "6007")])
def test_make_tensorboard_serves_on_the_port_asked(args, port) -> None:
    """`make tensorboard PORT=N` (6006 when not given), as make would run it (-n: printed, not started)."""
    proc = subprocess.run(
        ["make", "--no-print-directory", "-n", "-o", ".venv/.installed", "tensorboard", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout.split() == [".venv/bin/gptmini", "board", "--logdir", "outputs", "--port", port]
    help_text = subprocess.run(["make", "-s", "help"], cwd=REPO, capture_output=True, text=True).stdout
    assert "PORT=6006" in next(line for line in help_text.splitlines() if line.split()[:1] == ["tensorboard"])


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_clean_lists_runs_data_and_results_and_deletes_them_only_when_told(tmp_path) -> None:
    """`make clean` removes the caches, then lists outputs/, the prepared data and results/ with their sizes and
    asks: no answer (not a terminal) or "n" deletes nothing, "y" or YES=1 deletes them; data/README.md stays."""
    (tmp_path / "outputs" / "run").mkdir(parents=True)
    (tmp_path / "outputs" / "run" / "last.ckpt").write_bytes(b"x" * 5000)
    (tmp_path / "data" / "shakespeare_gpt2").mkdir(parents=True)
    (tmp_path / "data" / "README.md").write_text("data")
    (tmp_path / "results").mkdir()
    (tmp_path / ".pytest_cache").mkdir()

    def clean(answer: str | None, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["make", "-s", "-f", str(REPO / "Makefile"), "clean", *args],
            cwd=tmp_path,
            input=answer,
            stdin=subprocess.DEVNULL if answer is None else None,
            capture_output=True,
            text=True,
            timeout=60,
        )

    kept = ["README.md", "shakespeare_gpt2"]
    for answer in (None, "n\n", "\n"):
        proc = clean(answer)
        assert proc.returncode == 0, proc.stderr
        assert (
            "outputs" in proc.stdout and "data/shakespeare_gpt2" in proc.stdout and "results" in proc.stdout
        )
        assert proc.stdout.rstrip().endswith("nothing deleted")
        assert (tmp_path / "outputs" / "run" / "last.ckpt").is_file() and (tmp_path / "results").is_dir()
        assert sorted(p.name for p in (tmp_path / "data").iterdir()) == kept
    assert not (tmp_path / ".pytest_cache").exists()  # the caches go at once

    proc = clean("y\n")
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("deleted"), proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]
    assert [p.name for p in (tmp_path / "data").iterdir()] == ["README.md"]
    assert clean(None).stdout.strip() == "no runs, prepared data or results to delete"

    (tmp_path / "outputs").mkdir()
    proc = clean(None, "YES=1")
    assert proc.stdout.rstrip().endswith("deleted") and not (tmp_path / "outputs").exists()


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize(
    ("gpu", "index", "build"),
    [
        ("GPU 0: NVIDIA H200 (UUID: GPU-0)", "reachable", "CUDA"),
        ("No devices were found", "reachable", "CPU"),
        ("No devices were found", "unreachable", "configured"),
        (None, "reachable", "CPU"),
    ],
)
def test_make_install_takes_the_torch_build_the_machine_can_use(tmp_path, gpu, index, build) -> None:
    """`make install`'s torch: the CUDA build (pip's configured index) where `nvidia-smi` finds a GPU; elsewhere
    the CPU build from TORCH_INDEX, or the configured index at once when TORCH_INDEX does not answer; a line
    says which before pip starts. The venv's python is a stand-in that records pip's arguments."""
    if gpu is None and shutil.which("nvidia-smi") is not None:
        pytest.skip("this machine has an nvidia-smi of its own")
    bin_dir, venv = tmp_path / "bin", tmp_path / "venv"
    bin_dir.mkdir()
    (venv / "bin").mkdir(parents=True)
    calls = tmp_path / "pip_calls"
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\n[ "$1" = -c ] && exec python3 "$@"\necho "$@" >> {calls}\n')
    if gpu is not None:
        status = 0 if gpu.startswith("GPU") else 6
        (bin_dir / "nvidia-smi").write_text(f'#!/bin/sh\necho "{gpu}"\nexit {status}\n')
    for script in bin_dir.iterdir():
        script.chmod(0o755)
    python.chmod(0o755)
    (tmp_path / "simple").write_text("<html></html>")
    url = (tmp_path / "simple").as_uri() if index == "reachable" else (tmp_path / "absent").as_uri()
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "-f",
            str(REPO / "Makefile"),
            f"VENV={venv}",
            f"TORCH_INDEX={url}",
            f"{venv}/.installed",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    torch_call = next(line.split() for line in calls.read_text().splitlines() if "torch==2.13.0" in line)
    said = next(
        line for line in proc.stdout.splitlines() if "torch==2.13.0, its" in line or "from pip's" in line
    )
    assert said.index("torch==2.13.0") < proc.stdout.index("-m pip install")  # said before pip starts
    if build == "CPU":
        assert torch_call == ["-m", "pip", "install", "--index-url", url, "torch==2.13.0"]
        assert said.startswith("no CUDA GPU found: torch==2.13.0, its CPU build from") and "MB" in said
    else:
        assert torch_call == ["-m", "pip", "install", "torch==2.13.0"]
        assert ("its CUDA build" if build == "CUDA" else f"{url} not reachable") in said and "GB" in said
    assert (venv / ".installed").is_file()
