"""The frontier: the lowest val/loss on tinyshakespeare characters within a whole-process wall-clock budget (1, 3
and 10 minutes), for ``experiment=frontier_char_cpu`` and for nanoGPT's recipe (``experiment=shakespeare_char_cpu``:
the quick start's model with AdamW and warmup-cosine) at the same budgets.

Each run is one ``python -m gptmini.training`` process given ``trainer.max_time`` = the budget less
``MARGIN_S`` (both schedules are paced by that time and finish their decay when it stops the run), then one
``gptmini.inference.evaluate`` process scoring its last checkpoint on the whole held-out tenth. The budget counts
both processes whole: imports, data, model, training, checkpoints and the evaluation; a row says whether the
run kept to it. A finished study, apart from ``make bench``: ``python -m benchmarks.frontier --tinyshakespeare
input.txt`` regenerates the table; without the file the embedded corpus stands in.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import BenchOptions, markdown_table, max_time_string, run_module

log = logging.getLogger("benchmarks")

BUDGETS_S = (60, 180, 600)
QUICK_BUDGETS_S = (20,)
# what a run spends outside trainer.max_time: imports, data, model, the last checkpoint and the evaluation process
MARGIN_S = 20
QUICK_ARGS = ("model.n_layer=1", "model.n_embd=32", "model.n_head=2", "model.block_size=16")


@dataclass(frozen=True)
class Recipe:
    name: str
    overrides: tuple[str, ...]


RECIPES = (
    Recipe("frontier_char_cpu", ("experiment=frontier_char_cpu",)),
    # nanoGPT's quick-start recipe, its cosine paced by the same time budget instead of 2,000 steps
    Recipe(
        "nanoGPT's quick start",
        ("experiment=shakespeare_char_cpu", "data=text", "trainer.max_steps=10000000"),
    ),
)

FRONTIER_COLUMNS = [
    "recipe",
    "budget_s",
    "val_loss",
    "steps",
    "train_s",
    "eval_s",
    "total_s",
    "within_budget",
]


def run_args(recipe: Recipe, budget_s: float, source: str, root: Path, seed: int, quick: bool) -> list[str]:
    """The training command's overrides for ``recipe`` within ``budget_s`` seconds, whole process."""
    return [
        *recipe.overrides,
        f"trainer.max_time='{max_time_string(budget_s - MARGIN_S)}'",
        f"data.source={source}",
        f"seed={seed}",
        f"run_name={run_name(recipe, budget_s)}",
        f"paths.output_root={root / 'outputs'}",
        f"paths.data_root={root / 'data'}",
        "~callbacks.progress_bar",
        "trainer.enable_progress_bar=false",
        *(QUICK_ARGS if quick else ()),
    ]


def run_name(recipe: Recipe, budget_s: float) -> str:
    return f"frontier_{recipe.name.split()[0].replace(chr(39), '').lower()}_{budget_s:g}s"


def run_once(
    recipe: Recipe, budget_s: float, source: str, root: Path, seed: int, quick: bool
) -> dict[str, Any]:
    """Train ``recipe`` within ``budget_s`` and score it on the whole held-out split: one table row."""
    import torch

    train_s = run_module(
        ["gptmini.training", *run_args(recipe, budget_s, source, root, seed, quick)],
        f"{recipe.name} at {budget_s:g} s",
    )
    (run_dir,) = (root / "outputs" / run_name(recipe, budget_s)).glob("*/")
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    out = root / f"eval_{run_name(recipe, budget_s)}.json"
    limit = ["--max-batches", "2"] if quick else []
    eval_s = run_module(
        ["gptmini.inference.evaluate", "--ckpt", str(ckpt), "--out", str(out), *limit],
        f"evaluating {recipe.name} at {budget_s:g} s",
    )
    steps = torch.load(ckpt, map_location="cpu", weights_only=True)["global_step"]
    total = train_s + eval_s
    return {
        "recipe": recipe.name,
        "budget_s": budget_s,
        "val_loss": round(json.loads(out.read_text())["loss"], 4),
        "steps": steps,
        "train_s": round(train_s, 1),
        "eval_s": round(eval_s, 1),
        "total_s": round(total, 1),
        "within_budget": "yes" if total <= budget_s else f"no (+{total - budget_s:.0f} s)",
    }


def bench_frontier(opts: BenchOptions) -> tuple[list[dict[str, Any]], list[str]]:
    from gptmini.data.corpora import prepared_folder_name
    from gptmini.data.prepare import prepare

    source = opts.extra.get("tinyshakespeare") or "shakespeare"
    budgets = opts.extra.get("frontier_budgets") or (QUICK_BUDGETS_S if opts.quick else BUDGETS_S)
    recipes = [r for r in RECIPES if r.name in opts.extra.get("frontier_recipes", [r.name for r in RECIPES])]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gptmini-bench-frontier-") as tmp:
        root = Path(tmp)
        # prepared once, outside the clock (a user prepares once too)
        prepare(source, "char", root / "data" / prepared_folder_name(source, "char"))
        for budget in budgets:
            for recipe in recipes:
                rows.append(run_once(recipe, budget, source, root, opts.seed, opts.quick))
                log.info("frontier %s", rows[-1])
    data = (
        f"tinyshakespeare ({source})"
        if source != "shakespeare"
        else "the embedded corpus (pass --tinyshakespeare FILE for the figures nanoGPT's belong to)"
    )
    notes = [
        f"data: {data}, characters, 90/10 split; val_loss: `gptmini eval` of the run's last checkpoint on the "
        "whole held-out tenth",
        f"each run: trainer.max_time = budget - {MARGIN_S} s (the schedule decays by that clock), then the "
        "evaluation; total_s counts both processes whole (imports, data, training, checkpoints, evaluation)",
        "nanoGPT's quick start: 4 layers x 4 heads x 128, block 64, batch 12, AdamW 1e-3, warmup-cosine to 0.1x",
        "regenerate: python -m benchmarks.frontier --tinyshakespeare input.txt",
    ]
    if opts.quick:
        notes.append(
            "quick: a 1-layer model for a few seconds, scored on two batches; checks that the section runs"
        )
    return rows, notes


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.frontier", description=__doc__.split("\n\n")[0])
    p.add_argument("--tinyshakespeare", default=None, help="a local copy (default: the embedded corpus)")
    p.add_argument("--budgets", default=",".join(str(b) for b in BUDGETS_S), help="seconds, comma-separated")
    p.add_argument("--recipes", default=",".join(r.name for r in RECIPES), help="which recipes")
    p.add_argument("--seed", type=int, default=1337)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    budgets = tuple(float(b) for b in a.budgets.split(","))
    bad = [b for b in budgets if b <= MARGIN_S]
    if bad:
        p.error(f"--budgets {bad}: each budget must exceed the {MARGIN_S} s a run spends outside training")
    extra = {
        "tinyshakespeare": a.tinyshakespeare,
        "frontier_budgets": budgets,
        "frontier_recipes": a.recipes.split(","),
    }
    rows, notes = bench_frontier(BenchOptions(seed=a.seed, extra=extra))
    print(markdown_table(rows, FRONTIER_COLUMNS))
    print("\n".join(f"- {n}" for n in notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
