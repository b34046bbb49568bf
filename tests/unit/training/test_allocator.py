"""retain_freed_memory: large freed blocks are reused instead of being faulted in again on every step."""

import subprocess
import sys

import pytest

# 64 MiB tensors (above glibc's largest mmap threshold) allocated, touched and freed again and again, as a
# training step does with its logits: minor page faults and resident size after a warm-up, then after 20 more.
PROBE = """
import resource, sys, torch
from gptmini.training.hardware import retain_freed_memory
ok = retain_freed_memory() if sys.argv[1] == "retain" else None
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * 4096
def step():
    t = torch.empty(16 * 2**20)
    t.fill_(1.0)  # touch every page
    del t
for _ in range(12):
    step()
f0, r0 = faults(), rss()
for _ in range(20):
    step()
print(ok, faults() - f0, rss() - r0)
"""
PAGES = 64 * 2**20 // 4096


def _probe(mode: str) -> tuple[str, int, int]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0], int(out[1]), int(out[2])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's (Linux)")
def test_freed_memory_is_reused_instead_of_faulted_in_again():
    _, default_faults, _ = _probe("default")
    ok, faults, growth = _probe("retain")
    assert ok == "True"
    # glibc's default: a fresh mmap for every tensor, each of its pages faulted in again, step after step
    assert default_faults >= 15 * PAGES
    # retained: after the warm-up the blocks are reused; no page faults to speak of, and no growth
    assert faults < PAGES // 4
    assert growth < 8 * 2**20
