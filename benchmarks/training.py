"""Training throughput: the bare loop against the LightningModule, eager and compiled."""

from __future__ import annotations

import copy
import statistics
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from benchmarks.common import BenchOptions, fmt, log, num_threads, preset_config, sync
from gptmini.model import GPT, GPTConfig
from gptmini.training.loop.module import optimizer_kernel_kwargs, weight_decay_groups


@dataclass
class TrainSetup:
    model: GPTConfig
    batch: int
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.99)
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    warmup_steps: int = 5
    steps: int = 30
    rounds: int = 3  # blocks alternate between the paths compared, so a busy neighbour slows both alike


def train_setup(opts: BenchOptions) -> TrainSetup:
    if opts.quick:
        cfg = GPTConfig(vocab_size=65, block_size=16, n_layer=1, n_head=2, n_embd=16)
        return TrainSetup(model=cfg, batch=2, warmup_steps=2, steps=4, rounds=1)
    # the shakespeare_char_cpu experiment: model preset "cpu", char vocab, batch 12, AdamW 1e-3 (0.9, 0.99)
    cfg = preset_config("cpu", vocab_size=65)
    return TrainSetup(model=cfg, batch=12)


def _batches(s: TrainSetup, n: int, device: str, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    T, V = s.model.block_size, s.model.vocab_size
    out = []
    for _ in range(n):
        # random ids stand in for random windows of the char corpus: the step's cost does not depend on them
        ids = torch.randint(0, V, (s.batch, T + 1), generator=g)
        out.append((ids[:, :-1].contiguous().to(device), ids[:, 1:].contiguous().to(device)))
    return out


def autocast(device: str) -> torch.autocast:
    """bf16 autocast on a GPU, as training runs there; a disabled context on CPU, where training is fp32."""
    if device.startswith("cuda"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def run_bare_loop(
    model: GPT,
    batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    s: TrainSetup,
    device: str,
    optimizer_kwargs: dict[str, Any] | None = None,
) -> list[float]:
    """forward, backward, clip_grad_norm_, AdamW step, zero_grad; returns the end time of every step."""
    opt = torch.optim.AdamW(
        weight_decay_groups(model),
        lr=s.lr,
        betas=s.betas,
        weight_decay=s.weight_decay,
        **(optimizer_kwargs or {}),
    )
    model.train()
    ends = []
    sync(device)
    for x, y in batches:
        with autocast(device):
            _, loss = model(x, y, return_logits=False)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(device)
        ends.append(time.perf_counter())
    return ends


def run_lightning(
    model_config: GPTConfig,
    state: dict[str, torch.Tensor],
    batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    s: TrainSetup,
    device: str,
    compile: bool = False,
) -> list[float]:
    """The same steps through GPTLightningModule + lightning.Trainer; returns the end time of every step."""
    import lightning as L
    from torch.utils.data import DataLoader

    from gptmini.training.loop.module import GPTLightningModule

    class StepTimer(L.Callback):
        def __init__(self) -> None:
            self.ends: list[float] = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            sync(device)
            self.ends.append(time.perf_counter())

    module = GPTLightningModule(
        model_config=model_config.to_dict(),
        optimizer=partial(torch.optim.AdamW, lr=s.lr, betas=s.betas, weight_decay=s.weight_decay),
        scheduler=None,
        compile=compile,
    )
    module.model.load_state_dict(state)
    timer = StepTimer()
    cpu_batches = [(x.cpu(), y.cpu()) for x, y in batches]  # Lightning moves each batch to the device
    loader = DataLoader(cpu_batches, batch_size=None, shuffle=False, num_workers=0)
    trainer = L.Trainer(
        accelerator="gpu" if device.startswith("cuda") else "cpu",
        devices=1,
        precision="bf16-mixed" if device.startswith("cuda") else "32-true",
        max_steps=len(batches),
        max_epochs=-1,
        logger=False,
        callbacks=[timer],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        gradient_clip_val=s.grad_clip,
        log_every_n_steps=10,  # conf/trainer/cpu.yaml: grad-norm logging runs on these steps
        default_root_dir=tempfile.gettempdir(),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, train_dataloaders=loader)
    return timer.ends


def _adamw_label(kernel_kwargs: dict[str, Any]) -> str:
    if kernel_kwargs.get("fused"):
        return "AdamW (fused)"
    if kernel_kwargs.get("foreach"):
        return "AdamW (foreach)"
    return "AdamW (for-loop)"


def _step_stats(ends: list[float], warmup: int) -> list[float]:
    """Per-step wall times (end-to-end, so fetching the batch and the loop's bookkeeping count) after warmup."""
    return [b - a for a, b in zip(ends[warmup - 1 : -1], ends[warmup:], strict=True)] if warmup >= 1 else []


def bench_train(opts: BenchOptions) -> tuple[list[dict[str, Any]], list[str]]:
    s = train_setup(opts)
    dev = opts.device
    torch.manual_seed(opts.seed)
    base = GPT(s.model).to(dev)
    state = copy.deepcopy(base.state_dict())
    n = s.warmup_steps + s.steps
    batches = _batches(s, n, dev, opts.seed)
    tokens = s.batch * s.model.block_size
    flops_per_step = base.flops_per_token(s.model.block_size) * tokens
    peak_flops = None
    if opts.on_gpu:
        from lightning.fabric.utilities.throughput import get_available_flops

        peak_flops = get_available_flops(torch.device(dev), torch.bfloat16)
    default_threads = torch.get_num_threads()
    precision = "bf16-mixed" if opts.on_gpu else "fp32"
    # the bare loop's default is the AdamW kernel the LightningModule picks on this device, so that the two
    # paths differ only by the framework
    default_kernel = optimizer_kernel_kwargs(torch.optim.AdamW, torch.device(dev).type)
    default_label = _adamw_label(default_kernel)

    def fresh_model(compiled: bool = False) -> GPT:
        m = GPT(s.model).to(dev)
        m.load_state_dict(state)
        if compiled:
            m.compile()
        return m

    def row(path: str, step_s: float, n_steps: int, **kw: Any) -> dict[str, Any]:
        r = {
            "path": path,
            "compiled": False,
            "threads": torch.get_num_threads(),
            "optimizer": default_label,
            "precision": precision,
            "tokens_per_s": tokens / step_s,
            "step_ms": step_s * 1e3,
            "steps": n_steps,
            "compile_s": None,
            "mfu": flops_per_step / step_s / peak_flops if peak_flops else None,
            "vs_bare": None,
        }
        r.update(kw)
        log.info(
            "train %-10s compiled=%-5s threads=%s %-18s %8.0f tok/s  %6.2f ms/step  vs_bare %s",
            path,
            r["compiled"],
            r["threads"],
            r["optimizer"],
            r["tokens_per_s"],
            r["step_ms"],
            fmt(r["vs_bare"]),
        )
        return r

    def bare_block(
        model: GPT | None = None, optimizer_kwargs: dict[str, Any] | None = None
    ) -> tuple[float, float]:
        """(median step time after warmup, time to the end of the first step) of one block of steps."""
        m = model if model is not None else fresh_model()
        t0 = time.perf_counter()
        ends = run_bare_loop(
            m, batches, s, dev, default_kernel if optimizer_kwargs is None else optimizer_kwargs
        )
        return statistics.median(_step_stats(ends, s.warmup_steps)), ends[0] - t0

    def lightning_block(compiled: bool = False) -> tuple[float, float]:
        t0 = time.perf_counter()
        ends = run_lightning(s.model, state, batches, s, dev, compile=compiled)
        return statistics.median(_step_stats(ends, s.warmup_steps)), ends[0] - t0

    def best(blocks: list[tuple[float, float]]) -> float:
        # the fastest round's median: the least disturbed by whatever else runs on the machine
        return min(b[0] for b in blocks)

    n_steps = s.steps * s.rounds
    rows: list[dict[str, Any]] = []
    # 1. Lightning vs the bare loop at the experiment's settings; the two alternate, block by block, so that
    #    a busy neighbour slows both alike
    bare_b, lit_b = [], []
    for _ in range(s.rounds):
        bare_b.append(bare_block())
        lit_b.append(lightning_block())
    rows.append(row("bare", best(bare_b), n_steps))
    rows.append(row("lightning", best(lit_b), n_steps, vs_bare=best(lit_b) / best(bare_b)))

    # 2. CPU settings that might make the step faster: the bare loop, each against an adjacent default block
    if not opts.on_gpu and not opts.quick:
        kernels = (
            {"foreach": False},  # PyTorch's own CPU default, the per-parameter loop
            {"foreach": True},
            {"fused": True},
        )
        variants: list[tuple[dict[str, Any], int | None]] = [
            (k, None) for k in kernels if k != default_kernel
        ]
        if default_threads > 1:
            variants += [({"foreach": False}, 1), (default_kernel, 1)]
        for kw, threads in variants:
            label = _adamw_label(kw)
            ref_b, var_b = [], []
            for _ in range(s.rounds):
                ref_b.append(bare_block())
                with num_threads(threads):
                    var_b.append(bare_block(optimizer_kwargs=kw))
            with num_threads(threads):
                rows.append(
                    row("bare", best(var_b), n_steps, optimizer=label, vs_bare=best(var_b) / best(ref_b))
                )

    # 3. torch.compile of the model; the first step (compile included) is timed apart
    if opts.compile and not opts.quick:
        torch.compiler.reset()  # a compiled GPT.forward would otherwise be reused by the next model
        compiled_model = fresh_model(compiled=True)
        first = bare_block(compiled_model)[1]
        ref_b, comp_b = [], []
        for _ in range(s.rounds):
            ref_b.append(bare_block())
            comp_b.append(bare_block(compiled_model))
        rows.append(
            row(
                "bare",
                best(comp_b),
                n_steps,
                compiled=True,
                compile_s=first,
                vs_bare=best(comp_b) / best(ref_b),
            )
        )
        torch.compiler.reset()
        lit_c = [lightning_block(compiled=True) for _ in range(s.rounds)]  # round 1 compiles again
        rows.append(
            row(
                "lightning",
                best(lit_c),
                n_steps,
                compiled=True,
                compile_s=lit_c[0][1],
                vs_bare=best(lit_c) / best(comp_b),
            )
        )

    c = s.model
    notes = [
        f"model: {c.n_layer} layers x {c.n_head} heads x {c.n_embd} wide, block {c.block_size}, vocab {c.vocab_size} "
        f"(padded {c.padded_vocab_size}), {base.num_parameters():,} parameters; batch {s.batch} "
        f"({tokens} tokens/step); AdamW lr {s.lr}, betas {s.betas}, weight decay {s.weight_decay} on matrices, "
        f"grad clip {s.grad_clip}; no LR scheduler in either path",
        f"step time: {s.rounds} rounds of {s.warmup_steps} warmup + {s.steps} timed steps; the median step of "
        "each round, the fastest round reported (the machine may be shared); steps timed end-of-step to "
        "end-of-step, so fetching the batch and the loop's bookkeeping count; batches are precomputed random "
        "ids, fed to Lightning through a DataLoader(batch_size=None) over the same list",
        f"bare: forward, backward, clip_grad_norm_, {default_label} step (the kernel GPTLightningModule picks "
        f"on {torch.device(dev).type}), zero_grad(set_to_none). lightning: "
        "GPTLightningModule + Trainer(logger=False, no callbacks but the timer, no progress bar, no checkpointing, "
        "gradient_clip_val, log_every_n_steps=10)",
        "vs_bare: step time / the bare loop's, measured in alternating blocks: lightning rows vs the bare loop "
        "with the same compile setting (the framework's overhead), other bare rows vs the default bare loop",
    ]
    if any(r["compiled"] for r in rows):
        notes.append(
            "compiled: model.compile() (inductor, default mode) after torch.compiler.reset(); compile_s = the "
            "first step, compile included (lightning: Trainer setup too); inductor's on-disk cache can make a "
            "later compile faster than a cold one"
        )
    if peak_flops:
        notes.append(
            f"mfu: flops_per_token (6N + 12LHQT) x tokens/s / {peak_flops / 1e12:.0f} TFLOP/s (bf16 peak)"
        )
    return rows, notes
