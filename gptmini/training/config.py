"""The run's configuration as Hydra composes it: the schemas and resolvers it needs registered
(``register_configs``, before composing), and the names the rest of gptmini uses to check one.

Where each part lives: the schema of every group and the checks of its own values in ``training.schema``; the
checks across groups and the machine, and what they derive, in ``training.plan`` (``plan_run`` -> ``RunPlan``);
the files a run reads in ``training.inputs``; resuming in ``training.resume``; the run folder in
``training.run_folder``; sweeps in ``training.sweeps``; precision and the CPU's share in ``training.hardware``;
memory in ``training.memory``.
"""

from __future__ import annotations

import re

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from gptmini.model import GPTConfig
from gptmini.training.errors import RunError
from gptmini.training.hardware import (
    CPU_BF16_MIN_VOCAB,
    FLOAT16_AMP,
    PRECISIONS,
    cpu_cores,
    register_hardware_configs,
    resolve_precision,
)
from gptmini.training.inputs import check_input_files
from gptmini.training.memory import check_training_memory, training_memory_estimate
from gptmini.training.plan import RunPlan, output_vocab, plan_run
from gptmini.training.resume import (
    check_resume_plan,
    find_last_checkpoint,
    resolve_ckpt_path,
    resolve_init_from,
)
from gptmini.training.run_folder import OutputFolderCheck, check_run_folder_free, check_run_name
from gptmini.training.schema import ModelSchema, TrainSchema
from gptmini.training.sweeps import JobFailed, SweepSummary

__all__ = [
    "CPU_BF16_MIN_VOCAB",
    "FLOAT16_AMP",
    "PRECISIONS",
    "JobFailed",
    "ModelSchema",
    "OutputFolderCheck",
    "RunError",
    "RunPlan",
    "SweepSummary",
    "check_input_files",
    "check_resume_plan",
    "check_run_folder_free",
    "check_run_name",
    "check_training_memory",
    "cpu_cores",
    "find_last_checkpoint",
    "output_vocab",
    "plan_run",
    "register_configs",
    "resolve_ckpt_path",
    "resolve_init_from",
    "resolve_precision",
    "training_memory_estimate",
    "validate_config",
]


def register_configs() -> None:
    ConfigStore.instance().store(name="train_schema", node=TrainSchema)
    # hardware=auto (the default): an alias of hardware/gpu on a machine with a CUDA GPU, else of hardware/cpu
    register_hardware_configs()
    # ${attention_names:}: every causal attention in the registry, comma-separated, so a sweep over all of them
    # (conf/experiment/attention_sweep.yaml) picks up a newly registered implementation by itself
    if not OmegaConf.has_resolver("attention_names"):
        from gptmini.attention import available_attention

        OmegaConf.register_new_resolver("attention_names", lambda: ",".join(available_attention()))
    # ${attention_variants:}: every option of conf/attention_variant/, comma-separated, for the zoo's sweep
    # (conf/experiment/attention_zoo.yaml), so a new variant file joins it by itself
    if not OmegaConf.has_resolver("attention_variants"):
        OmegaConf.register_new_resolver("attention_variants", attention_variants)
    # ${prepared_folder:SOURCE,TOKENIZER}: the prepared-data folder name of a corpus, keyed by the corpus itself
    # (conf/data/text.yaml), so two corpora never share one folder
    # ${default_run_name:SOURCE,TOKENIZER}: run_name's default (conf/train.yaml)
    if not OmegaConf.has_resolver("default_run_name"):
        OmegaConf.register_new_resolver("default_run_name", default_run_name)
    if not OmegaConf.has_resolver("prepared_folder"):
        from gptmini.data.corpora import prepared_folder_name

        OmegaConf.register_new_resolver("prepared_folder", prepared_folder_name)


def default_run_name(source: str | None, tokenizer: str) -> str:
    """``default`` for the embedded corpus in GPT-2's BPE, else ``<corpus name>_<tokenizer>``: a run on other data
    or another tokenizer is not named like the default run."""
    from gptmini.data.corpora import source_name

    if source == "shakespeare" and tokenizer == "gpt2":
        return "default"
    corpus = source_name(source) if source else "corpus"
    return re.sub(r"[^A-Za-z0-9_.,=+@-]", "_", f"{corpus}_{tokenizer}")


def attention_variants() -> str:
    from gptmini.conf_dir import conf_dir

    return ",".join(sorted(p.stem for p in (conf_dir() / "attention_variant").glob("*.yaml")))


def validate_config(cfg: DictConfig) -> GPTConfig:
    """``plan_run``'s checks, for callers that need only the checked model config."""
    return plan_run(cfg).model
