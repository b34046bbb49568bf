"""``gptmini data [overrides]``: the data folder that ``gptmini train`` with the same overrides reads, prepared
without training, as the run's DataModule prepares it, without building it."""

from __future__ import annotations

import dataclasses
import shutil
import sys
from argparse import SUPPRESS, ArgumentParser
from collections.abc import Sequence
from pathlib import Path

from gptmini.training.run.override_errors import EXIT_USER_ERROR, one_line

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


def main(argv: Sequence[str] | None = None) -> int:
    cli = ArgumentParser(
        prog="gptmini data",
        description="Prepare the data folder that `gptmini train` with the same settings reads (token shards + "
        "meta.json; streamed, resumable), without training. The settings are the run's: `gptmini train --cfg "
        "job` lists them. E.g. gptmini data data=text data.source=corpus.txt tokenizer=char",
    )
    cli.add_argument("overrides", nargs="*", help="training settings: key=value, group=option")
    for option, override in OLD_OPTIONS.items():  # refused below, naming the override to type instead
        cli.add_argument(option, dest=override, help=SUPPRESS)
    cli.add_argument("--force", dest="data.force_prepare", action="store_const", const="true", help=SUPPRESS)
    args = vars(cli.parse_intermixed_args(sys.argv[1:] if argv is None else argv))
    overrides = args.pop("overrides")
    instead = [f"{override}={value}" for override, value in args.items() if value is not None]
    if instead:
        sys.stderr.write(f"error: gptmini data takes the training settings: {' '.join(instead)}\n")
        return EXIT_USER_ERROR
    from gptmini.options import starting

    starting("gptmini data", "composing the config, then the data")
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from hydra.errors import HydraException
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    from gptmini.conf_dir import conf_dir
    from gptmini.data.bpe import log_compression
    from gptmini.data.errors import DataError
    from gptmini.data.prepare import prepare_run_data
    from gptmini.data.progress import cli_logging
    from gptmini.data.reader import load_meta
    from gptmini.data.tokenizers import TokenizerError
    from gptmini.training.errors import RunError
    from gptmini.training.run.compose import register_configs
    from gptmini.training.run.plan import plan_preparation

    callback, shown = cli_logging()
    register_configs()
    before = HydraConfig.instance().cfg
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            cfg = compose("train", overrides=overrides, return_hydra_config=True)
        # Hydra's config as in a run, its run folder named, not made (one that does not resolve: check_resolves)
        if (run_dir := OmegaConf.select(cfg, "hydra.run.dir", throw_on_resolution_failure=False)) is not None:
            cfg.hydra.runtime.output_dir = str(Path(run_dir).absolute())
        HydraConfig.instance().set_config(cfg)
        with open_dict(cfg):
            del cfg["hydra"]  # as the run's task function receives it
        data = plan_preparation(cfg)
        folder = Path(data.data_dir).absolute()  # made: the outermost folder preparing it creates, if any
        made = next((p for p in (*reversed(folder.parents), folder) if not p.exists()), None)
        with shown:  # the run's DataModule prepares through the same function
            prepared = prepare_run_data(dataclasses.asdict(data), progress=callback)
        meta = load_meta(prepared.out_dir)
        if data.tokenizer == "bpe":
            log_compression(prepared.out_dir, meta)
        # a train split without one window of the run's context: training would refuse it (a short val split is
        # the run's to judge: the data may be prepared for another model's eval)
        tokens, need = int(meta["splits"].get("train", {}).get("tokens", 0)), data.block_size + 1
        if tokens < need:
            if made is not None:
                shutil.rmtree(made)
            raise DataError(
                f"{prepared.out_dir} {'is prepared' if made is None else 'was not kept'}: its train split has "
                f"{tokens} tokens where one window of model.block_size={data.block_size} needs {need}: training "
                "would refuse it; give more text or a smaller model.block_size"
            )
    except (HydraException, OmegaConfBaseException, RunError, DataError, TokenizerError) as err:
        sys.stderr.write(f"error: {one_line(err, overrides)}\n")
        return EXIT_USER_ERROR
    finally:
        HydraConfig.instance().cfg = before
    return 0
