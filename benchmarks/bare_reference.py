"""The bare loop's step measured inside the training command's own process (``+callbacks.bare_reference=...``):
``steps`` bare-loop steps (the model size, data windows, fused AdamW, schedule and clipping of
``python -m benchmarks.end_to_end bare``) after every ``every``-th training step, each timed by the training
thread's CPU time, against the training command's own steps between them. Both see the same load at the same
moments, so their ratio holds on a busy machine where two processes' CPU times do not. Written when fitting ends:
the two medians, and the share of the process's CPU time its other threads (progress bar, TensorBoard) took."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch

from benchmarks.common import preset_config
from benchmarks.end_to_end import Cadence


class BareReference(L.Callback):
    def __init__(
        self, data_dir: str, path: str, sizes: dict[str, int], every: int = 20, steps: int = 5, skip: int = 50
    ) -> None:
        self.data_dir, self.path, self.sizes = Path(data_dir), Path(path), dict(sizes)
        self.every, self.steps, self.skip = every, steps, skip  # skip: the first training steps warm up
        self.train_cpu: list[float] = []
        self.bare_cpu: list[float] = []
        self._last: float | None = None
        self._start = (0.0, 0.0)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        from torch.utils.data import DataLoader

        from gptmini.data.reader import load_meta, load_split
        from gptmini.data.windows import RandomWindowDataset, StreamSampler
        from gptmini.model import GPT
        from gptmini.training.loop.module import optimizer_kernel_kwargs, weight_decay_groups
        from gptmini.training.loop.schedulers import WarmupCosineLR

        c = Cadence()
        self.skip = min(self.skip, trainer.max_steps // 3)  # a short run (the quick benchmark) still measures
        meta = load_meta(self.data_dir)
        self.model = GPT(preset_config("cpu", vocab_size=int(meta["vocab_size"]), **self.sizes)).train()
        windows = trainer.max_steps * self.steps * c.batch_size
        data = RandomWindowDataset(
            load_split(self.data_dir, "train", meta), self.model.config.block_size, windows, c.seed
        )
        loader = DataLoader(data, batch_size=c.batch_size, sampler=StreamSampler(len(data)), drop_last=True)
        self.batches = iter(loader)
        kernel = optimizer_kernel_kwargs(torch.optim.AdamW, "cpu")
        self.opt = torch.optim.AdamW(
            weight_decay_groups(self.model), lr=c.lr, betas=c.betas, weight_decay=c.weight_decay, **kernel
        )
        self.sched = WarmupCosineLR(self.opt, trainer.max_steps, c.warmup_steps, c.min_lr_ratio)
        self._start = (time.process_time(), time.thread_time())

    def _bare_steps(self) -> None:
        for _ in range(self.steps):
            start = time.thread_time()
            x, y = next(self.batches)
            _, loss = self.model(x, y, return_logits=False)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), Cadence.grad_clip)
            self.opt.step()
            self.sched.step()
            self.opt.zero_grad(set_to_none=True)
            self.bare_cpu.append(time.thread_time() - start)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        now, step = time.thread_time(), trainer.global_step
        if self._last is not None and step > self.skip and (step - 1) % self.every:
            self.train_cpu.append(now - self._last)  # not the step the bare steps ran before
        if step > self.skip and step % self.every == 0:
            self._bare_steps()
        self._last = time.thread_time()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        process, thread = time.process_time() - self._start[0], time.thread_time() - self._start[1]
        self.path.write_text(json.dumps(self.result(process, thread)))

    def result(self, process_s: float, thread_s: float) -> dict[str, float]:
        train, bare = statistics.median(self.train_cpu), statistics.median(self.bare_cpu)
        return {
            "train_step_cpu_ms": train * 1e3,
            "bare_step_cpu_ms": bare * 1e3,
            "cpu_ratio": bare / train,
            "other_threads_share": (process_s - thread_s) / process_s if process_s > 0 else 0.0,
        }
