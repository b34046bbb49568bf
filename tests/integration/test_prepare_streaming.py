"""Preparing a corpus in its own process, with the writer ``gptmini data`` runs: killed with SIGKILL in the
middle (twice), a rerun resumes after the last finished shard and ends with exactly the bytes of an uninterrupted
preparation; and peak memory does not grow with the corpus."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.common import shakespeare_text
from gptmini.data.errors import DataError
from gptmini.data.prepare import DEFAULT_BUFFER_MB, prepare
from gptmini.data.reader import load_meta

SHARD_TOKENS = 4_000


def _write_corpus(folder: Path, copies: float = 0.25) -> Path:
    """Documents of a few kB (scenes of the plays) in two JSONL files and a text file: several kinds of document.
    ``copies``: how many times the plays' text (4.8 MB)."""
    folder.mkdir(parents=True, exist_ok=True)
    blocks = shakespeare_text().split("\n\n")
    scenes = ["\n\n".join(blocks[i : i + 20]) for i in range(0, len(blocks), 20)]
    docs = (scenes * int(copies + 1))[: int(len(scenes) * copies)]
    half = len(docs) // 2
    for name, part in (("a.jsonl", docs[:half]), ("b.jsonl", docs[half:-50])):
        with open(folder / name, "w", encoding="utf-8") as f:
            for i, doc in enumerate(part):
                f.write(json.dumps({"id": i, "text": doc}) + "\n")
    (folder / "c.txt").write_text("\n\n".join(docs[-50:]), encoding="utf-8")
    return folder


# the writer `gptmini data` runs, in a process of its own (without the training command's start-up)
WRITER = (
    "import logging, sys; from gptmini.data.prepare import prepare; "
    "logging.basicConfig(level=logging.INFO, format='%(message)s'); "
    "prepare(sys.argv[1], 'gpt2', sys.argv[2], shard_tokens=int(sys.argv[3]), buffer_mb=int(sys.argv[4]), "
    "num_threads=2)"
)


def _command(
    source: Path, out: Path, shard_tokens: int = SHARD_TOKENS, buffer_mb: int = DEFAULT_BUFFER_MB
) -> list[str]:
    return [sys.executable, "-c", WRITER, str(source), str(out), str(shard_tokens), str(buffer_mb)]


def _kill_after(cmd: list[str], out: Path, shards: int) -> list[str]:
    """Start ``cmd``, SIGKILL it once its progress records at least ``shards`` finished shards; the shards recorded when it died."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"finished before it could be killed: {proc.stderr.read()}"
            for progress in out.glob("tokens-*/progress.json"):
                try:
                    done = json.loads(progress.read_text())["shards"]
                except (OSError, ValueError):
                    continue  # replaced as we read it
                if len(done) >= shards:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
                    # read again once it is dead: it may have recorded another shard between the read and the kill
                    return [s["file"] for s in json.loads(progress.read_text())["shards"]]
            time.sleep(0.005)
        raise AssertionError("no progress within 120 s")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()


def test_sigkill_mid_preparation_resumes_to_the_same_bytes(tmp_path: Path) -> None:
    source = _write_corpus(tmp_path / "corpus")
    out = tmp_path / "killed"
    cmd = _command(source, out)

    first = _kill_after(cmd, out, shards=3)
    assert not (out / "meta.json").exists()  # never mistaken for a finished preparation
    with pytest.raises(DataError, match="not a prepared data folder"):
        load_meta(out)
    (shard_dir,) = out.glob("tokens-*")
    written = {name: (shard_dir / name).stat().st_mtime_ns for name in first}
    second = _kill_after(cmd, out, shards=len(first) + 3)  # resumed, and killed again
    assert set(first) < set(second)
    assert {name: (shard_dir / name).stat().st_mtime_ns for name in first} == written  # kept, not rewritten

    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"resuming after {len(second)} finished shard(s)" in done.stderr

    fresh = prepare(str(source), "gpt2", tmp_path / "fresh", shard_tokens=SHARD_TOKENS, num_threads=2)
    assert len(fresh.meta["shards"]) > len(second) + 1 and fresh.meta["documents"] > 100
    assert (out / "meta.json").read_bytes() == (fresh.out_dir / "meta.json").read_bytes()
    names = sorted(p.name for p in shard_dir.iterdir())
    assert names == sorted(s["file"] for s in fresh.meta["shards"])  # no progress file, no temp file left
    fresh_dir = fresh.out_dir / fresh.meta["shard_dir"]
    assert fresh_dir.name == shard_dir.name
    for name in names:
        assert (shard_dir / name).read_bytes() == (fresh_dir / name).read_bytes(), name


def _peak_rss_mib(cmd: list[str]) -> float:
    """Peak resident memory of ``cmd`` run in a child (which has its own getrusage record)."""
    code = (
        "import resource, subprocess, sys\n"
        f"subprocess.run({cmd!r}, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=600
    )
    return int(out.stdout.split()[-1]) / 1024


@pytest.mark.slow
def test_peak_memory_does_not_grow_with_the_corpus(tmp_path: Path) -> None:
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss > 0  # Linux: kB
    small = _write_corpus(tmp_path / "small", copies=2)  # ~10 MB
    large = _write_corpus(tmp_path / "large", copies=8)  # ~40 MB
    sizes = [sum(p.stat().st_size for p in d.iterdir()) for d in (small, large)]
    assert sizes[1] > 3.5 * sizes[0]
    peaks = []
    for source in (small, large):
        peaks.append(
            _peak_rss_mib(_command(source, tmp_path / f"{source.name}_out", 2_000_000, buffer_mb=16))
        )
    # The old whole-text preparation held ~15x the corpus; a streamed one holds the same at any size.
    assert peaks[1] < peaks[0] + 24, (
        f"peak RSS {peaks[0]:.0f} MiB for {sizes[0] >> 20} MiB, {peaks[1]:.0f} MiB "
    )
    assert os.path.getsize(tmp_path / "large_out" / "meta.json") > 0
