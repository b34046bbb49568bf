"""The head report of a checkpoint: which heads look at the previous token, copy, do induction, park on the first
token, which matter (mean ablation), and the loss by position in the context.

``gptmini analyze --ckpt last --out outputs/head_report/`` writes ``report.html`` (self-contained: images
inline, opens in any browser without a server) and ``report.json`` (one record per head: ``layer``, ``head`` and
every score by name).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from gptmini.data.errors import DataError
from gptmini.data.reader import load_split
from gptmini.fileio import unwritable_reason
from gptmini.insight.probes import check_probe_settings, make_probes
from gptmini.insight.report import analyze, write_report
from gptmini.limits import check_fits, forward_bytes
from gptmini.options import EtaProgress, HelpFormatter, positive_int, seed_int
from gptmini.runs.checkpoint import CheckpointError
from gptmini.runs.loading import add_run_options, open_run
from gptmini.viz import token_labels

log = logging.getLogger("gptmini.inference.analyze")
# what write_report puts in --out
REPORT_FILES = ("report.html", "report.json")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gptmini analyze", description=__doc__, formatter_class=HelpFormatter)
    add_run_options(p)
    p.add_argument("--out", default="outputs/head_report", help="folder for report.html and report.json")
    p.add_argument("--force", action="store_true", help="replace the report an earlier run wrote in --out")
    p.add_argument("--split", default="val", choices=["train", "val"], help="the split probed")
    p.add_argument("--probe-tokens", type=positive_int, default=128, help="length of each probe sequence")
    p.add_argument("--probe-batch", type=positive_int, default=4, help="sequences per probe")
    p.add_argument(
        "--windows",
        type=positive_int,
        default=32,
        help="validation windows for the loss by position and ablation",
    )
    p.add_argument("--seed", type=seed_int, default=1234, help="seed of the random-token probe")
    p.add_argument("--no-ablation", action="store_true", help="skip mean ablation (n_layer * n_head passes)")
    p.add_argument("--batch-size", type=positive_int, default=8, help="windows per forward pass")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        check_probe_settings(args.probe_tokens, args.probe_batch, args.windows, where="--")
        # before any work: a report that cannot be written is known now, and nothing in --out is touched
        if (reason := unwritable_reason(Path(args.out).absolute())) is not None:
            raise DataError(f"--out {args.out} cannot be written: {reason}")
        earlier = [name for name in REPORT_FILES if (Path(args.out) / name).exists()]
        if earlier and not args.force:
            raise DataError(
                f"--out {args.out} holds the report of an earlier run ({', '.join(earlier)}): choose another --out, "
                "or pass --force to replace them"
            )
        run = open_run(args.ckpt, args.device, args.data_dir)
        model, path, c = run.model, run.path, run.model.config
        data_dir, meta = run.data_folder(args.data_dir, "analyze")
        device = run.device
        per_probe = 2 * forward_bytes(c, args.probe_tokens, attention_maps=True)
        check_fits("--probe-batch", args.probe_batch, per_probe, device, "probe sequences (x2)")
        check_fits("--windows", args.windows, 8 * (c.block_size + 1), device, "windows")
        per_window = forward_bytes(c, c.block_size, attention_maps=True)
        check_fits("--batch-size", args.batch_size, per_window, device, "windows")
        tokens = load_split(data_dir, args.split, meta)
        probes = make_probes(
            tokens, c.vocab_size, c.block_size, args.probe_tokens, args.probe_batch, args.windows, args.seed
        )
    except (CheckpointError, DataError, ValueError) as err:
        log.error("error: %s", err)
        return 2
    log.info(
        "analyzing %s: %d layers x %d heads on %d probe tokens, %d windows of %d tokens%s",
        path,
        c.n_layer,
        c.n_head,
        probes.text.size(1),
        probes.windows.size(0),
        c.block_size,
        "" if args.no_ablation else f", ablating each of the {c.n_layer * c.n_head} heads",
    )
    analysis = analyze(
        model,
        probes,
        ablate=not args.no_ablation,
        batch_size=args.batch_size,
        progress=EtaProgress(log, "analyze", "passes"),
    )
    analysis.summary["about"] = {
        "checkpoint": str(path),
        "step": run.step,
        "data": f"{data_dir} ({args.split} split)",
        "attention": c.attention,
    }
    labels = token_labels(run.tokenizer, analysis.text_ids)
    try:
        json_path, html_path = write_report(analysis, args.out, labels, title=f"Head report: {path}")
    except OSError as err:
        log.error("error: cannot write the report to %s: %s", args.out, err.strerror or err)
        return 2
    s = analysis.summary
    log.info("val loss %.4f, ICL score %+.4f nats", s["val_loss"], s["icl_score"])
    for name, heads in s["top_heads"].items():  # each head type's, and the ablation's
        top = ", ".join(f"L{h['layer']}H{h['head']} {h['value']:.3f}" for h in heads)
        log.info("top %s: %s", name, top)
    log.info("wrote %s and %s", html_path, json_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
