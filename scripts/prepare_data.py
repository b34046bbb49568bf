"""Prepare a corpus without training, with a progress bar (``make data ARGS="..."``).

``python scripts/prepare_data.py [training overrides]`` prepares the data that ``make train`` with the same
overrides trains on: the config is composed exactly as training composes it, so the folder, tokenizer and
settings are the run's (with no arguments, the default run's: the embedded corpus, GPT-2 BPE on a CPU machine,
characters where ``hardware=auto`` picks the GPU defaults). Examples::

    python scripts/prepare_data.py data=fineweb data.source=/data/fineweb/sample/10BT
    python scripts/prepare_data.py experiment=shakespeare_char_cpu

Arguments starting with ``-`` are ``gptmini data``'s instead (``--source``, ``--tokenizer``, ``--out``, ...).
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Sequence

log = logging.getLogger("gptmini.prepare_data")


def prepare_for_training(overrides: Sequence[str]) -> int:
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from hydra.errors import HydraException
    from hydra.utils import instantiate
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from gptmini.conf_dir import conf_dir
    from gptmini.data.errors import DataError
    from gptmini.data.prepare import cli_logging
    from gptmini.data.reader import load_meta
    from gptmini.data.tokenizers import TokenizerError
    from gptmini.training.errors import RunError
    from gptmini.training.run.compose import register_configs
    from gptmini.training.run.plan import check_input_files, plan_data

    callback, shown = cli_logging()
    try:
        register_configs()
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            cfg = compose("train", overrides=list(overrides), return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)  # paths.data_root is relative to hydra's runtime.cwd
        missing = [f"data.{k}" for k in cfg.data if OmegaConf.is_missing(cfg.data, k)]
        if missing:
            raise RunError(f"{', '.join(missing)} must be set: pass {missing[0]}=...")
        check_input_files(cfg)
        # the DataModule as the run builds it: the tokenizer and context derived from their groups
        datamodule = instantiate(dataclasses.asdict(plan_data(cfg)), _convert_="all")
    except (
        HydraException,
        OmegaConfBaseException,
        RunError,
    ) as e:  # (an InstantiationException is a HydraException)
        log.error("error: %s", e)
        return 2
    try:
        with shown:
            datamodule.prepare_data(progress=callback)
    except (DataError, TokenizerError) as e:
        log.error("error: %s", e)
        return 2
    meta = load_meta(datamodule.data_dir)
    log.info(
        "%s (%s): %s documents, %s tokens in %d shard(s); train %s, val %s -> %s",
        cfg.data.source,
        meta["tokenizer"],
        f"{meta['documents']:,}",
        f"{meta['tokens']:,}",
        len(meta["shards"]),
        f"{meta['splits']['train']['tokens']:,}",
        f"{meta['splits']['val']['tokens']:,}",
        datamodule.data_dir,
    )
    if meta["tokenizer"] == "bpe":  # the trained tokenizer against GPT-2's, on the held-out text
        from gptmini.data.bpe import log_compression

        log_compression(datamodule.data_dir, meta)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a.startswith("-") for a in argv):
        from gptmini.data.prepare import main as prepare_main

        return prepare_main(argv)
    return prepare_for_training(argv)


if __name__ == "__main__":
    sys.exit(main())
