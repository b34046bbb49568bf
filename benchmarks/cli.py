"""``python -m benchmarks`` / ``scripts/bench.py``: run the sections and write every table."""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import (
    ALLOC_DEFAULT,
    ALLOC_RETAINED,
    SECTIONS,
    BenchOptions,
    loadavg,
    log,
    machine_info,
    write_table,
)
from gptmini.fileio import unwritable_reason
from gptmini.options import positive_int, seed_int


def run(opts: BenchOptions, only: Sequence[str] = SECTIONS) -> dict[str, list[dict[str, Any]]]:
    """Run the chosen sections, writing every table as soon as it is done; returns the rows."""
    unknown = sorted(set(only) - set(SECTIONS))
    if unknown:
        raise ValueError(f"unknown section(s) {unknown}; valid: {', '.join(SECTIONS)}")
    if opts.on_gpu and not torch.cuda.is_available():
        raise ValueError("--device cuda but no CUDA GPU is available: use --device cpu")
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    info = machine_info(opts.device)
    extra = {
        "mode": "quick" if opts.quick else "full",
        "compile": "on" if opts.compile else "off",
        "freed memory retained (glibc mallopt)": "yes" if opts.retain_memory else "no",
        "load average at start (1/5/15 min)": loadavg(),
    }
    results: dict[str, list[dict[str, Any]]] = {}
    seconds: dict[str, float] = {}
    t_all = time.perf_counter()

    def table(
        name: str, title: str, rows: list[dict[str, Any]], columns: list[str], notes: list[str]
    ) -> None:
        # every table: results[name] (for the summary), results/<name>.md and .csv, and printed
        results[name] = rows
        print(write_table(out, name, title, rows, columns, notes), flush=True)

    for section in SECTIONS:
        if section not in only:
            continue
        t0 = time.perf_counter()
        log.info("--- %s (load average %s)", section, loadavg())
        _run_section(section, opts, out, table)
        seconds[section] = time.perf_counter() - t0
    extra["load average at end (1/5/15 min)"] = loadavg()
    extra["wall time"] = ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items()) + (
        f"; total {time.perf_counter() - t_all:.0f} s"
    )
    from benchmarks.summary import write_summary

    print(write_summary(out, results, info, extra), flush=True)
    return results


def _sizes(text: str) -> list[int]:
    """``--corpus-mb``: comma-separated positive integers."""
    return [positive_int(part.strip()) for part in text.split(",")]


# the whole run with every section, on a 2-core CPU (docs/benchmarks.md, "Further measurements, by CPU")
QUICK_MINUTES, FULL_MINUTES = 4, 5

Table = Callable[[str, str, list[dict[str, Any]], list[str], list[str]], None]


Benchmark = Callable[[BenchOptions], tuple[list[dict[str, Any]], list[str]]]


def tables() -> dict[str, list[tuple[Benchmark, str, str, list[str]]]]:
    """The sections whose benchmarks each give one table as it is: (benchmark, table name, title, columns). The
    sections are imported here, not at the top: `gptmini bench --help` needs none of them (nor Lightning)."""
    from benchmarks.board import BOARD_COLUMNS, bench_board
    from benchmarks.end_to_end import bench_end_to_end
    from benchmarks.generation import bench_generate
    from benchmarks.host import HOST_COLUMNS, bench_host
    from benchmarks.insight import INSIGHT_COLUMNS, bench_insight
    from benchmarks.lm_loss import LM_LOSS_COLUMNS, bench_lm_loss
    from benchmarks.runs import RUNS_COLUMNS, bench_runs
    from benchmarks.startup import STARTUP_COLUMNS, bench_startup
    from benchmarks.summary import (
        E2E_COLUMNS,
        GENERATE_COLUMNS,
        TRAIN_COLUMNS,
    )
    from benchmarks.training import bench_train

    return {
        "train": [
            (bench_train, "train", "Training throughput", TRAIN_COLUMNS),
            (bench_insight, "insight", "Head insight: cost per validation", INSIGHT_COLUMNS),
            (bench_lm_loss, "lm_loss", "Output-layer loss: logits vs chunked", LM_LOSS_COLUMNS),
        ],
        "host": [
            (bench_host, "host", "Host cost per step: the training command vs the bare loop", HOST_COLUMNS)
        ],
        "e2e": [(bench_end_to_end, "e2e", "The whole run: training command vs bare loop", E2E_COLUMNS)],
        "board": [(bench_board, "board", "Attention tab: size, render and own-text timings", BOARD_COLUMNS)],
        "runs": [(bench_runs, "runs", "`gptmini runs` over many runs", RUNS_COLUMNS)],
        "generate": [(bench_generate, "generate", "Generation (batch 1, greedy)", GENERATE_COLUMNS)],
        "startup": [
            (bench_startup, "startup", "Start-up: the command to the first training step", STARTUP_COLUMNS)
        ],
    }


def _run_section(section: str, opts: BenchOptions, out: Path, table: Table) -> None:
    """One section's benchmarks, each of its tables handed to ``table`` (name, title, rows, columns, notes)."""
    from benchmarks.attention import (
        attention_key_other_allocator,
        bench_attention,
        bench_attention_key,
        bench_attention_options,
        plot_attention,
    )
    from benchmarks.data import bench_data
    from benchmarks.summary import (
        ATTENTION_COLUMNS,
        ATTENTION_KEY_COLUMNS,
        ATTENTION_OPTION_COLUMNS,
        DATA_COLUMNS,
    )
    from benchmarks.zoo import ZOO_COLUMNS, bench_attention_zoo

    by_section = tables()
    if section in by_section:
        for bench, name, title, columns in by_section[section]:
            rows, notes = bench(opts)
            table(name, title, rows, columns, notes)
    elif section == "attention":
        rows, notes = bench_attention(opts)
        table("attention", "Attention implementations", rows, ATTENTION_COLUMNS, notes)
        plot_attention(rows, out / "attention.png")
        key_rows, key_notes = bench_attention_key(opts)
        key_rows += attention_key_other_allocator(opts)
        key_rows.sort(key=lambda r: r["allocator"] != ALLOC_DEFAULT)  # glibc's default first
        if len({r["allocator"] for r in key_rows}) > 1:
            key_notes.append(
                f"allocator: '{ALLOC_DEFAULT}' is glibc's malloc as it comes (every block over 32 MiB is a "
                f"fresh mmap, faulted in page by page on each call); '{ALLOC_RETAINED}' keeps freed memory "
                "in the process (gptmini.training.hardware.retain_freed_memory, what training uses). The two were measured in separate "
                "processes. The (T, T) score matrices of chapter 3's MHA (8 x 12 x 1024 x 1024 floats, "
                "403 MB, and as much again for the softmax and its gradient) cost it page faults on every "
                "call under the default; retained, it runs at the speed of its arithmetic"
            )
        table(
            "attention_key",
            "Attention head-to-head (interleaved)",
            key_rows,
            ATTENTION_KEY_COLUMNS,
            key_notes,
        )
        rows, notes = bench_attention_zoo(opts)
        table("attention_zoo", "Attention zoo: training step per variant", rows, ZOO_COLUMNS, notes)
        rows, notes = bench_attention_options(opts)
        table(
            "attention_options",
            "Attention options (model.attention=sdpa)",
            rows,
            ATTENTION_OPTION_COLUMNS,
            notes,
        )
    else:
        with tempfile.TemporaryDirectory(prefix="gptmini-bench-data-") as tmp:
            rows, notes = bench_data(opts, Path(tmp))
        table("data", "Data preparation and loading", rows, DATA_COLUMNS, notes)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gptmini bench",
        description="gptmini benchmarks: attention, training, generation, data (tables in results/)",
    )
    p.add_argument(
        "--only", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}"
    )
    p.add_argument("--quick", action="store_true", help="tiny shapes and 1-2 repeats (smoke test)")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if available")
    p.add_argument("--out", type=Path, default=Path("results"), help="output folder (default: results/)")
    p.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also measure torch.compile variants (on CPU: sdpa and ch3 MHA at the largest T, and the training "
        "model); --no-compile skips them",
    )
    p.add_argument(
        "--retain-memory",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep freed memory in the process as training does (retain_freed_memory=true); "
        "--no-retain-memory measures glibc's default behaviour",
    )
    p.add_argument("--seed", type=seed_int, default=1337)
    p.add_argument(
        "--tinyshakespeare",
        default=None,
        help="e2e: train on this file (tinyshakespeare.txt, the char-rnn file) instead of the embedded corpus",
    )
    p.add_argument(
        "--e2e-rounds", type=positive_int, default=None, help="e2e: runs of each path (default 2; quick: 1)"
    )
    p.add_argument(
        "--corpus-mb",
        type=_sizes,
        default=None,
        help="data: sizes of the generated corpora to prepare, MB, comma-separated (default 100; none with "
        "--quick), e.g. 300,1000 for the goals of data.py (peak memory, throughput against tiktoken)",
    )
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def parse_args(argv: Sequence[str] | None = None) -> tuple[BenchOptions, list[str]]:
    p = _parser()
    a = p.parse_args(argv)
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: PyTorch sees no CUDA GPU on this machine: use --device cpu (or leave it out)")
    unwritable = unwritable_reason(a.out)
    if unwritable or (a.out.exists() and not a.out.is_dir()):
        p.error(f"--out {a.out}: {unwritable or 'it is a file'}; pass a folder the tables can be written to")
    only = [s.strip() for s in a.only.split(",") if s.strip()]
    bad = sorted(set(only) - set(SECTIONS))
    if bad:
        p.error(f"--only: unknown section(s) {', '.join(bad)}; valid: {', '.join(SECTIONS)}")
    logging.basicConfig(
        level=logging.DEBUG if a.verbose else logging.INFO,
        format="%(asctime)s %(message)s",
        datefmt="%H:%M:%S",
    )
    e2e = {
        "tinyshakespeare": a.tinyshakespeare,
        "e2e_rounds": a.e2e_rounds,
    }
    return BenchOptions(
        device=device,
        quick=a.quick,
        compile=a.compile and not a.quick,
        out=a.out,
        seed=a.seed,
        retain_memory=a.retain_memory,
        extra=({"corpus_mb": a.corpus_mb} if a.corpus_mb else {})
        | {k: v for k, v in e2e.items() if v is not None},
    ), only


def main(argv: Sequence[str] | None = None) -> int:
    opts, only = parse_args(argv)
    t0 = time.perf_counter()
    try:
        log.info(
            "%s: about %s minutes on a 2-core CPU with every section, longer under load; Ctrl-C stops it, the "
            "tables done by then stay in %s",
            "gptmini bench --quick" if opts.quick else "gptmini bench",
            QUICK_MINUTES if opts.quick else FULL_MINUTES,
            opts.out,
        )
        _main(opts, only)
    except KeyboardInterrupt:
        log.info(
            "bench interrupted after %.0f s; the tables done before are in %s",
            time.perf_counter() - t0,
            opts.out,
        )
        return 130
    log.info("bench done in %.0f s; results in %s", time.perf_counter() - t0, opts.out)
    return 0


def _main(opts: BenchOptions, only: list[str]) -> None:
    if opts.retain_memory:
        from gptmini.training.hardware import retain_freed_memory

        opts.retain_memory = retain_freed_memory()  # False where it is not glibc
    import lightning.pytorch  # noqa: F401  (its loggers exist once imported)

    for name in list(logging.root.manager.loggerDict):
        if name.split(".")[0] in ("lightning", "lightning_fabric", "pytorch_lightning"):
            logging.getLogger(name).setLevel(logging.WARNING)
    run(opts, only)
