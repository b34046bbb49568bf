"""Time to nanoGPT's quick-start loss: how long the training command takes, whole process, to reach val/loss <=
1.8857 on tinyshakespeare characters (``TARGET``: nanoGPT's quick-start value), with nanoGPT's recipe
(``experiment=shakespeare_char_cpu``), with the full recipe (``experiment=speedrun_char_cpu``) and with the
recipe minus each of its ingredients and plus each speedrun ingredient it does not use (ReLU², zero-initialised
projections, value embeddings, the smear gate, the bigram embedding, NorMuon, cautious weight decay, momentum
warmup, weight averaging), over several seeds.

Each run is a fresh ``python -m gptmini.training`` process that stops itself at the first validation at or below
the target (``target_val_loss``), validating on the whole held-out tenth (over 100k tokens). Its time to target is
``perf/time_to_target_process`` (process start to that validation's end: imports, config, model, training and
validations; the data is prepared beforehand, once); the step is the validation's. A run that never gets there
reports its final loss. A finished study, apart from ``make bench``: ``python -m benchmarks.recipe
--tinyshakespeare input.txt`` regenerates the table; without the file the embedded corpus stands in (another text:
the target means little there).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import BenchOptions

log = logging.getLogger("benchmarks")

TARGET = 1.8857
# the speedrun's ablations start from it without its bigram embedding, over 180 steps: the configuration the
# study's table in docs/benchmarks.md measured, and one where "+ bigram" is an ingredient like the others
SPEEDRUN = (
    "experiment=speedrun_char_cpu",
    "model.bigram_embed=false",
    "trainer.max_steps=180",
    "trainer.val_check_interval=180",
)


@dataclass(frozen=True)
class RecipeConfig:
    name: str
    overrides: tuple[str, ...]
    what: str


CONFIGS = (
    RecipeConfig(
        "nanoGPT",
        ("experiment=shakespeare_char_cpu", "data=text", "trainer.limit_val_batches=1.0"),
        "nanoGPT's recipe: AdamW 1e-3 + warmup-cosine, GELU, learned positions, tied head, 2000 steps",
    ),
    RecipeConfig("recipe", SPEEDRUN, " ".join(SPEEDRUN)),
    RecipeConfig(
        "- muon",
        (*SPEEDRUN, "optimizer=adamw", "optimizer.lr=3e-3", "~optimizer.hidden"),
        "AdamW 3e-3 for every parameter",
    ),
    RecipeConfig(
        "- wsd",
        (*SPEEDRUN, "scheduler=warmup_cosine", "scheduler.warmup_steps=50", "~scheduler.decay_fraction"),
        "warmup-cosine (50 warmup steps, floor 0.1)",
    ),
    RecipeConfig("- rope+qk_norm", (*SPEEDRUN, "attention_variant=learned"), "learned positions, no QK-norm"),
    RecipeConfig(
        "+ zero_init",
        (*SPEEDRUN, "model.zero_init=true"),
        "zero-initialised output projections (modded-nanogpt's) in place of GPT-2's initialisation",
    ),
    RecipeConfig(
        "+ relu2",
        (*SPEEDRUN, "model.mlp=relu2", "model.gelu_approximate=tanh"),
        "ReLU^2 MLP (modded-nanogpt's) in place of GELU",
    ),
    RecipeConfig(
        "+ value_embeds",
        (*SPEEDRUN, "model.value_embeds=2"),
        "gated value embeddings in the 4th and 2nd of the 4 layers (modded-nanogpt; nanochat's gate)",
    ),
    RecipeConfig(
        "+ smear_gate",
        (*SPEEDRUN, "model.smear_gate=true"),
        "the previous token's embedding mixed in through a learned gate (modded-nanogpt)",
    ),
    RecipeConfig(
        "+ bigram",
        (*SPEEDRUN, "model.bigram_embed=true"),
        "an exact (previous, current) character-pair embedding added at the input: 65^2 + 1 rows of 128",
    ),
    RecipeConfig(
        "+ normuon",
        (*SPEEDRUN, "optimizer.hidden.normuon=true"),
        "NorMuon: Muon's update variance-normalised per neuron, beta2 0.95 (modded-nanogpt, nanochat)",
    ),
    RecipeConfig(
        "+ cautious_wd",
        (*SPEEDRUN, "optimizer.hidden.weight_decay=0.1", "optimizer.hidden.cautious_weight_decay=true"),
        "cautious weight decay 0.1 on the hidden matrices (the recipe has none there)",
    ),
    RecipeConfig(
        "+ momentum_warmup",
        (*SPEEDRUN, "optimizer.hidden.momentum_warmup_steps=50"),
        "Muon's momentum ramped from 0.85 to 0.95 over the first 50 steps (modded-nanogpt)",
    ),
    RecipeConfig(
        "+ ema",
        (*SPEEDRUN, "callbacks.ema={_target_:gptmini.training.loop.ema.EMAWeightAveraging,decay:0.95}"),
        "validation on an exponential moving average of the weights (decay 0.95 per step)",
    ),
)

RECIPE_COLUMNS = [
    "config",
    "seeds",
    "reached",
    "steps_to_target",
    "time_to_target_s",
    "time_to_target_fit_s",
    "final_val_loss",
    "wall_s",
    "what",
]


def run_name(config: RecipeConfig, seed: int) -> str:
    name = config.name.replace(" ", "").replace("-", "minus_").replace("+", "_")
    return f"recipe_{name}_s{seed}"


def run_args(
    config: RecipeConfig, seed: int, source: str, root: Path, extra: Sequence[str] = ()
) -> list[str]:
    """The training command's overrides for one run of ``config``."""
    return [
        *config.overrides,
        f"data.source={source}",
        f"seed={seed}",
        f"target_val_loss={TARGET}",
        f"run_name={run_name(config, seed)}",
        f"paths.output_root={root / 'outputs'}",
        f"paths.data_root={root / 'data'}",
        "~callbacks.progress_bar",
        "trainer.enable_progress_bar=false",
        *extra,
    ]


def read_run(run_dir: Path) -> dict[str, Any]:
    """What a finished run logged: the validation losses, where the target was reached and how long it took."""
    from gptmini.runs.discovery import read_events, run_event_folder

    ea = read_events(run_event_folder(run_dir) or run_dir / "tb")
    tags = set(ea.Tags()["scalars"])
    vals = [(e.step, e.value) for e in ea.Scalars("val/loss")] if "val/loss" in tags else []
    reached = next((step for step, v in vals if v <= TARGET), None)

    def first(tag: str) -> float | None:
        return ea.Scalars(tag)[0].value if tag in tags else None

    return {
        "steps_to_target": None
        if reached is None
        else reached + 1,  # logged at the 0-based step: count steps
        "time_to_target_s": first("perf/time_to_target_process"),
        "time_to_target_fit_s": first("perf/time_to_target"),
        "final_val_loss": vals[-1][1] if vals else None,
    }


def summarize(config: RecipeConfig, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One table row: medians over the runs that reached the target, the mean final loss over all."""
    reached = [r for r in runs if r["steps_to_target"] is not None]

    def median(key: str) -> float | None:
        values = [r[key] for r in reached if r[key] is not None]
        return round(statistics.median(values), 2) if values else None

    finals = [r["final_val_loss"] for r in runs if r["final_val_loss"] is not None]
    return {
        "config": config.name,
        "seeds": len(runs),
        "reached": len(reached),
        "steps_to_target": median("steps_to_target"),
        "time_to_target_s": median("time_to_target_s"),
        "time_to_target_fit_s": median("time_to_target_fit_s"),
        "final_val_loss": round(statistics.mean(finals), 4) if finals else None,
        "wall_s": round(statistics.median(r["wall_s"] for r in runs), 1),
        "what": config.what,
    }


def bench_recipe(opts: BenchOptions) -> tuple[list[dict[str, Any]], list[str]]:
    from gptmini.data.corpora import prepared_folder_name
    from gptmini.data.prepare import prepare

    source = opts.extra.get("tinyshakespeare") or "shakespeare"
    seeds = int(opts.extra.get("recipe_seeds") or (1 if opts.quick else 3))
    cap = opts.extra.get("recipe_max_steps") or (2 if opts.quick else None)
    configs = [c for c in CONFIGS if c.name == "recipe"] if opts.quick else list(CONFIGS)
    extra = []
    if cap:
        every = max(1, min(50, int(cap) // 2))
        extra = [f"trainer.max_steps={cap}", f"trainer.val_check_interval={every}"]
        if opts.quick:
            extra.append("trainer.limit_val_batches=2")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gptmini-bench-recipe-") as tmp:
        root = Path(tmp)
        # prepared once, outside the timed runs
        prepare(source, "char", root / "data" / prepared_folder_name(source, "char"))
        for config in configs:
            runs = []
            for i in range(seeds):
                seed = opts.seed + i
                args = run_args(config, seed, source, root, extra)
                t0 = time.time()
                proc = subprocess.run(
                    [sys.executable, "-m", "gptmini.training", *args], capture_output=True, text=True
                )
                wall = time.time() - t0
                if proc.returncode != 0:
                    raise RuntimeError(
                        f"{config.name} seed {seed} failed:\n{(proc.stdout + proc.stderr)[-3000:]}"
                    )
                (run_dir,) = (root / "outputs" / run_name(config, seed)).glob("*/")
                run = {**read_run(run_dir), "wall_s": wall}
                log.info("recipe %s seed %d: %s", config.name, seed, run)
                runs.append(run)
            rows.append(summarize(config, runs))
    notes = [
        f"target: val/loss <= {TARGET} (nanoGPT's quick start on tinyshakespeare), validated on the whole held-out "
        "tenth; each run stops at the first validation at or below it",
        f"data: {'tinyshakespeare (' + str(source) + ')' if source != 'shakespeare' else 'the embedded corpus (pass --tinyshakespeare FILE for the figures the target belongs to)'}",
        f"{seeds} seed(s) from {opts.seed}: steps and times are medians over the runs that reached the target; "
        "final_val_loss is the mean of every run's last validation",
        "time_to_target_s: process start to the end of the validation that reached the target (imports, model, "
        "training, validations); time_to_target_fit_s: the same from the start of fit; wall_s: the whole process",
        "regenerate: python -m benchmarks.recipe --tinyshakespeare input.txt [--seeds N] [--max-steps N]",
    ]
    if cap:
        notes.append(f"capped at {cap} steps (trainer.max_steps={cap}): not the full comparison")
    return rows, notes


def main(argv: Sequence[str] | None = None) -> int:
    from benchmarks.common import markdown_table

    p = argparse.ArgumentParser(prog="benchmarks.recipe", description=__doc__.split("\n\n")[0])
    p.add_argument("--tinyshakespeare", default=None)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--seed", type=int, default=1337)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    extra = {"tinyshakespeare": a.tinyshakespeare, "recipe_seeds": a.seeds, "recipe_max_steps": a.max_steps}
    rows, notes = bench_recipe(BenchOptions(seed=a.seed, extra=extra))
    print(markdown_table(rows, RECIPE_COLUMNS))
    print("\n".join(f"- {n}" for n in notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
