"""What Hydra needs before it composes the run's config: the schema of the top-level keys stored, and the
resolvers the YAML files name (``register_configs``)."""

from __future__ import annotations

import re

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from gptmini.conf_dir import conf_dir
from gptmini.data.corpora import prepared_folder_name, source_name
from gptmini.training.hardware import register_hardware_configs
from gptmini.training.run.schema import TrainSchema, option_settings


def register_configs() -> None:
    store = ConfigStore.instance()
    store.store(name="train_schema", node=TrainSchema)
    # hardware=auto (the default): an alias of hardware/gpu on a machine with a CUDA GPU, else of hardware/cpu
    register_hardware_configs()
    # ${attention_names:}: every causal attention in the registry, comma-separated, so a sweep over all of them
    # (conf/experiment/attention_sweep.yaml) picks up a newly registered implementation by itself
    OmegaConf.register_new_resolver("attention_names", attention_names, replace=True)
    # ${attention_variants:}: every option of conf/attention_variant/, comma-separated, for the zoo's sweep
    # (conf/experiment/attention_zoo.yaml), so a new variant file joins it by itself
    OmegaConf.register_new_resolver("attention_variants", attention_variants, replace=True)
    # ${default_run_name:SOURCE,TOKENIZER}: run_name's default (conf/train.yaml)
    OmegaConf.register_new_resolver("default_run_name", default_run_name, replace=True)
    # ${prepared_folder:SOURCE,TOKENIZER}: the prepared-data folder name of a corpus, keyed by the corpus itself
    # (conf/data/text.yaml), so two corpora never share one folder
    OmegaConf.register_new_resolver("prepared_folder", prepared_folder_name, replace=True)
    try:
        conf = conf_dir()
    except FileNotFoundError:  # an install without its configs: the command says so in one line
        return
    # every setting of each option with its constructor's default, merged before the option (conf/train.yaml)
    for (group, option), node in option_settings(conf).items():
        store.store(group=f"hydra/gptmini_settings/{group}", name=option, node=node)


def default_run_name(source: str | None, tokenizer: str) -> str:
    """``default`` for the embedded corpus in GPT-2's BPE, else ``<corpus name>_<tokenizer>``: a run on other data
    or another tokenizer is not named like the default run."""
    if source == "shakespeare" and tokenizer == "gpt2":
        return "default"
    corpus = source_name(source) if source else "corpus"
    return re.sub(r"[^A-Za-z0-9_.,=+@-]", "_", f"{corpus}_{tokenizer}")


def attention_names() -> str:
    from gptmini.attention import available_attention

    return ",".join(available_attention())


def attention_variants() -> str:
    return ",".join(sorted(p.stem for p in (conf_dir() / "attention_variant").glob("*.yaml")))
