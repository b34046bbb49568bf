"""Structured schema of the Hydra config: a typo or a wrongly-typed value fails at composition, naming the key."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore


@dataclass
class ModelSchema:
    # null: take the tokenizer's vocabulary size (known once the data is prepared).
    vocab_size: Optional[int] = None
    block_size: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True
    attention: str = "sdpa"
    tie_weights: bool = True
    pad_vocab_multiple: int = 64
    # Load weights before training: a Hugging Face GPT-2 directory (config.json + model.safetensors).
    init_from: Optional[str] = None


@dataclass
class TokenizerSchema:
    name: str = "gpt2"


@dataclass
class PathsSchema:
    data_root: str = "data"
    output_root: str = "outputs"
    output_dir: str = "${hydra:runtime.output_dir}"


@dataclass
class TrainSchema:
    model: ModelSchema = field(default_factory=ModelSchema)
    tokenizer: TokenizerSchema = field(default_factory=TokenizerSchema)
    paths: PathsSchema = field(default_factory=PathsSchema)
    # Groups whose content is instantiated (_target_) are checked by their targets' signatures.
    data: Any = field(default_factory=dict)
    optimizer: Any = field(default_factory=dict)
    scheduler: Any = None
    trainer: Any = field(default_factory=dict)
    callbacks: Any = field(default_factory=dict)
    logger: Any = field(default_factory=dict)
    run_name: str = "default"
    seed: int = 1337
    # null: start fresh; "last": the newest last/on_exception checkpoint of this run_name; or a path.
    ckpt_path: Optional[str] = None
    compile: bool = False
    # CPU speed: keep freed memory in the process instead of re-faulting it every step (gptmini.allocator).
    retain_freed_memory: bool = True
    # Steps between periodic "last.ckpt" saves (a hard kill loses at most this many steps).
    checkpoint_every_n_steps: int = 100
    # Keys an experiment needs the user to set (a "???" cannot override a schema default when configs merge).
    required: list[str] = field(default_factory=list)


def register_configs() -> None:
    ConfigStore.instance().store(name="train_schema", node=TrainSchema)
