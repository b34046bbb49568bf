"""``gptmini data [overrides]``: the data folder that ``gptmini train`` with the same overrides reads, prepared
without training. The training config is composed (``compose.composed``) and planned (``plan.plan_preparation``)
as the run plans it, and the run's DataModule prepares it (``prepare_data``)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from collections.abc import Sequence

from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from gptmini.data.errors import DataError
from gptmini.data.tokenizers import TokenizerError
from gptmini.training.errors import RunError
from gptmini.training.run.override_errors import EXIT_HYDRA_ERROR, one_line

log = logging.getLogger(__name__)

# the options of the command before it took the training settings, and the override each became
OLD_OPTIONS = {
    "--source": "data=text data.source",
    "--tokenizer": "tokenizer",
    "--vocab-size": "tokenizer.vocab_size",
    "--train-bytes": "tokenizer.train_bytes",
    "--out": "data.data_dir",
    "--val-fraction": "data.val_fraction",
    "--num-threads": "data.prepare_threads",
    "--text-field": "data.text_field",
    "--shard-tokens": "data.shard_tokens",
    "--buffer-mb": "data.buffer_mb",
}
OLD_SWITCHES = {"--force": "data.force_prepare=true"}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gptmini data",
        description="Prepare the data folder that `gptmini train` with the same settings reads (token shards + "
        "meta.json; streamed, resumable), without training. The settings are the training run's: `gptmini train "
        "--cfg job` lists them, docs/settings.md explains each.",
        epilog="examples: gptmini data data=text data.source=corpus.txt tokenizer=char | gptmini data "
        "experiment=shakespeare_char_cpu | gptmini data data=fineweb data.source=/data/fineweb/sample/10BT",
    )
    parser.add_argument("overrides", nargs="*", help="training settings: key=value, group=option")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug log lines")
    return parser


def old_options(argv: Sequence[str]) -> str | None:
    """The refusal of the options ``gptmini data`` took before, naming the overrides to type instead."""
    given, instead = [], []
    args = iter(argv)
    for arg in args:
        option, eq, value = arg.partition("=")
        if option in OLD_SWITCHES:
            given.append(option)
            instead.append(OLD_SWITCHES[option])
        elif option in OLD_OPTIONS:
            given.append(option)
            instead.append(f"{OLD_OPTIONS[option]}={value if eq else next(args, '...')}")
    if not given:
        return None
    return (
        f"gptmini data takes the training settings: {' '.join(instead)} (in place of {', '.join(given)}; "
        "`gptmini train --cfg job` lists every setting)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    refused = old_options(argv)
    if refused:
        sys.stderr.write(f"error: {refused}\n")
        return EXIT_HYDRA_ERROR
    args = _parser().parse_args(argv)
    from hydra.utils import instantiate

    from gptmini.data.bpe import log_compression
    from gptmini.data.progress import cli_logging
    from gptmini.training.run.compose import composed
    from gptmini.training.run.plan import plan_preparation

    callback, shown = cli_logging(args.verbose)
    try:
        with composed(args.overrides) as cfg:
            data = plan_preparation(cfg)
        # the DataModule the run builds (app.build_data), preparing as the run's does
        datamodule = instantiate(dataclasses.asdict(data), _convert_="all")
        with shown:
            result = datamodule.prepare_data(progress=callback)
        if result.meta["tokenizer"] == "bpe":
            log_compression(result.out_dir, result.meta)
    except (HydraException, OmegaConfBaseException, RunError, DataError, TokenizerError) as err:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        sys.stderr.write(f"error: {one_line(err, args.overrides)}\n")
        return EXIT_HYDRA_ERROR
    log.info(
        "%s %s: train %d tokens, val %d tokens (%s, vocab %d, %d shard(s)) in %.2fs -> %s",
        "skipped (up to date)" if result.skipped else "prepared",
        result.meta["source"],
        result.train_tokens,
        result.val_tokens,
        result.meta["dtype"],
        result.meta["vocab_size"],
        len(result.meta["shards"]),
        result.seconds,
        result.out_dir,
    )
    return 0
