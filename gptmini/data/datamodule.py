"""The LightningDataModule: prepares the token shards once, memory-maps them, serves window batches. The only
module of ``gptmini.data`` that imports Lightning.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset

from gptmini.data.corpora import default_out_dir
from gptmini.data.prepare import (
    DEFAULT_BUFFER_MB,
    DEFAULT_SHARD_TOKENS,
    DEFAULT_TEXT_FIELD,
    DEFAULT_VAL_FRACTION,
    PrepareProgress,
    prepare_run_data,
)
from gptmini.data.reader import load_meta, load_split, load_tokenizer
from gptmini.data.schema import check_data_settings
from gptmini.data.tokenizers import Tokenizer
from gptmini.data.windows import (
    DeviceWindows,
    RandomWindowDataset,
    ShardSampler,
    StreamSampler,
    StridedWindowDataset,
    split_fits_device,
)
from gptmini.options import DEFAULT_SEED

log = logging.getLogger(__name__)


def device_memory(device: torch.device) -> int | None:
    return torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None


class TokenDataModule(L.LightningDataModule):
    """prepare_data: tokenize once (``gptmini.data.prepare``: streamed into shards, resumable; the check that
    nothing changed reads file sizes and times only). setup: memmap splits. Train = random windows, val =
    strided windows; windows run across shard boundaries, so the shards read as one stream.

    Exact resume needs no state of its own: train sample ``i`` is a pure function of (seed, i), and each
    pass of the train loader starts at sample ``batches_trained * batch_size``, read from the trainer's
    loop progress, which Lightning restores from the checkpoint before it creates the loader iterator.
    So a resumed run continues the sample stream at the batch after the checkpoint, whatever epoch
    bookkeeping Lightning does (also if ``train_samples`` changed because ``max_steps`` did).
    """

    def __init__(
        self,
        # the corpus: "shakespeare" (embedded), a URL, or a text, JSON Lines, Parquet or Arrow file or folder
        source: str = "shakespeare",
        *,
        # the run's tokenizer.name and model.block_size, which the plan passes (schema.DERIVED)
        tokenizer: str,
        block_size: int,
        # the prepared data's folder; null: one under paths.data_root named after the corpus and the tokenizer
        data_dir: str | Path | None = None,
        # windows per batch on each device
        batch_size: int = 32,
        # DataLoader worker processes (0: load in the main process)
        num_workers: int = 0,
        # the held-out end of the corpus, as a share of its bytes, in [0, 1)
        val_fraction: float = DEFAULT_VAL_FRACTION,
        train_samples: int | None = None,
        # null: non-overlapping validation windows (stride = block_size)
        val_stride: int | None = None,
        seed: int = DEFAULT_SEED,
        # page-locked batches for faster copies to a GPU; null: when CUDA is available
        pin_memory: bool | None = None,
        # tokenize again even when the prepared folder is up to date
        force_prepare: bool = False,
        # the JSON Lines field / Parquet or Arrow column that holds each document's text
        text_field: str = DEFAULT_TEXT_FIELD,
        # tokens per shard file of the prepared data (uint16/uint32 ids)
        shard_tokens: int = DEFAULT_SHARD_TOKENS,
        # text and ids in flight to the tokenizer threads, MB: bounds the preparation's memory at any corpus size
        buffer_mb: int = DEFAULT_BUFFER_MB,
        # tokenizer threads; null: one per core, at most 8
        prepare_threads: int | None = None,
        tokenizer_vocab_size: int | None = None,
        tokenizer_train_bytes: int | None = None,
    ) -> None:
        # each bad setting named as its config key (the run's plan builds this to run them before any work)
        check_data_settings(
            batch_size=batch_size,
            num_workers=num_workers,
            val_stride=val_stride,
            val_fraction=val_fraction,
            shard_tokens=shard_tokens,
            buffer_mb=buffer_mb,
            prepare_threads=prepare_threads,
        )
        super().__init__()  # no hyper-parameters of its own: the run record keeps the data's settings
        # what prepare_data hands prepare_run_data (`gptmini data` hands it the same settings from the plan)
        self.preparation = dict(
            source=source,
            tokenizer=tokenizer,
            val_fraction=val_fraction,
            force_prepare=force_prepare,
            prepare_threads=prepare_threads,
            text_field=text_field,
            shard_tokens=shard_tokens,
            buffer_mb=buffer_mb,
            tokenizer_vocab_size=tokenizer_vocab_size,
            tokenizer_train_bytes=tokenizer_train_bytes,
        )
        self.data_dir = Path(data_dir) if data_dir is not None else default_out_dir(source, tokenizer)
        self.block_size = block_size
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.train_samples = train_samples
        self.val_stride = val_stride
        self.seed = seed
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        self.meta: dict[str, Any] | None = None
        self.train_dataset: RandomWindowDataset | None = None
        self.val_dataset: StridedWindowDataset | None = None
        self._token_bytes: torch.Tensor | None = None

    @property
    def vocab_size(self) -> int:
        if self.meta is None:
            self.meta = load_meta(self.data_dir)
        return int(self.meta["vocab_size"])

    def prepare_data(self, progress: Callable[[PrepareProgress], None] | None = None) -> None:
        """``progress``: a progress-bar callback (``gptmini.data.progress.progress_bar``); without one, a long
        preparation logs a line every 30 s. ``gptmini data`` prepares through the same function."""
        prepare_run_data({**self.preparation, "data_dir": self.data_dir}, progress)

    def setup(self, stage: str | None = None) -> None:
        if self.meta is not None and self.train_dataset is not None:
            return
        self.meta = load_meta(self.data_dir)
        train = load_split(self.data_dir, "train", self.meta)
        # Default: one "epoch" draws as many windows as it takes to see ~every train token once.
        num = self.train_samples or max(self.batch_size, math.ceil(len(train) / self.block_size))
        vocab = int(self.meta["vocab_size"])
        self.train_dataset = RandomWindowDataset(
            train, self.block_size, num, seed=self.seed, name="train", vocab_size=vocab
        )
        if self.meta["splits"]["val"]["tokens"] > 0:
            val = load_split(self.data_dir, "val", self.meta)
            self.val_dataset = StridedWindowDataset(
                val, self.block_size, self.val_stride, name="val", vocab_size=vocab
            )

    def tokenizer(self) -> Tokenizer:
        return load_tokenizer(self.data_dir, self.meta)

    def token_bytes(self) -> torch.Tensor:
        """The UTF-8 bytes each token id stands for (0 for special tokens): validation's bits per byte."""
        if self._token_bytes is None:
            self._token_bytes = torch.from_numpy(self.tokenizer().token_bytes())
        return self._token_bytes

    def _loader(self, dataset: Dataset, **kwargs: Any) -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.num_workers > 0,
            **kwargs,
        )

    def _first_train_sample(self) -> int | None:
        trainer = self.trainer
        if trainer is None:  # plain DataLoader use: StreamSampler falls back to its epoch
            return None
        # Batches whose training step ran, over all epochs: restored from checkpoints, and counted before
        # the step's on_train_batch_end (so a checkpoint saved there includes its own batch).
        # Under DDP every rank takes its share of one global stream, which so advanced world_size batches a step.
        done = trainer.fit_loop.epoch_loop.batch_progress.total.processed
        return done * self.batch_size * trainer.world_size

    def _rank(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def train_dataloader(self) -> DataLoader:
        if self.train_dataset is None:
            self.setup("fit")
        assert self.train_dataset is not None
        rank, world = self._rank()
        # Our samplers shard across ranks themselves (the trainer configs set use_distributed_sampler: false).
        sampler = StreamSampler(
            len(self.train_dataset), start=self._first_train_sample, rank=rank, world_size=world
        )
        device = self._device()
        if split_fits_device(len(self.train_dataset.tokens), device, device_memory(device)):
            # the split on the GPU, windows cut there: the same batches, nothing but their starts copied
            log.info("train split (%s tokens) kept on %s", f"{len(self.train_dataset.tokens):,}", device)
            batches = BatchSampler(sampler, self.batch_size, drop_last=True)
            return DataLoader(DeviceWindows(self.train_dataset, device), sampler=batches, batch_size=None)
        return self._loader(self.train_dataset, sampler=sampler, drop_last=True)

    def _device(self) -> torch.device:
        """Where training runs: the trainer's device; the CPU without a trainer (plain DataLoader use)."""
        strategy = getattr(self.trainer, "strategy", None)
        return strategy.root_device if strategy is not None else torch.device("cpu")

    def val_dataloader(self) -> DataLoader | list[DataLoader]:
        if self.train_dataset is None:
            self.setup("validate")
        if self.val_dataset is None:
            return []
        rank, world = self._rank()
        return self._loader(
            self.val_dataset, sampler=ShardSampler(len(self.val_dataset), rank, world), drop_last=False
        )
