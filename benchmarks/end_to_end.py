"""The whole run, not just the step: nanoGPT's CPU quick start (``experiment=shakespeare_char_cpu``: 4 layers x 4
heads x 128 wide, block 64, batch 12, 2000 steps, validation every 250 steps on 20 batches) through the real
command line with every default callback on, against the project's bare loop (plain PyTorch: the same model,
data windows, AdamW, clipping, schedule and evaluation cadence, nothing logged), each a fresh process timed from
its start to its exit.

Each process records a timeline (``Timeline``: the start and end of every step and validation, in wall-clock
time; ``benchmarks.step_clock.StepClock`` records it inside the training command), and :func:`phases` divides the
run into:

- ``startup_s``: process start to the start of the first training step (imports, config, data check, model);
- ``steps_s`` and ``median_step_ms``: step end to step end, so fetching the batch and every per-step callback
  count; the median leaves out the steps right after a validation or a checkpoint;
- ``val_batches_s``: the validation batches themselves;
- ``val_extras_s``: everything else a validation holds the training thread for (attention maps, text sample,
  checkpoints, logging), from the end of its batches to the start of the next step;
- ``background_s``: how much longer than the median the ``DRAG_STEPS`` steps after each validation took, i.e. the
  cost of the work left to background threads (image drawing, checkpoint writing); counted with the extras;
- ``tail_s``: from the end of training to the process's exit (final checkpoint, closing the logs).

``python -m benchmarks --only e2e`` runs it as a section of ``make bench``; ``python -m benchmarks.end_to_end
bare ...`` is the bare loop (started by the benchmark). ``benchmarks/nanogpt.py`` runs nanoGPT's own train.py
beside the training command.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import BenchOptions, loadavg, preset_config

log = logging.getLogger("benchmarks")

REPO = Path(__file__).resolve().parent.parent

# Steps after a validation whose extra time is charged to it (work it left to background threads).
DRAG_STEPS = 10


@dataclass
class Cadence:
    """The experiment's length and evaluation cadence, as ``experiment=shakespeare_char_cpu`` composes them (a
    test compares every field with the composed config, so the two cannot drift apart)."""

    steps: int = 2000
    eval_every: int = 250
    eval_batches: int = 20
    batch_size: int = 12
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.99)
    weight_decay: float = 0.1
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    seed: int = 1337

    def overrides(self) -> list[str]:
        """The training command's overrides beyond ``experiment=shakespeare_char_cpu`` (none at full size)."""
        full = Cadence()
        out = []
        if self.steps != full.steps:
            out.append(f"trainer.max_steps={self.steps}")
        if self.eval_every != full.eval_every:
            out.append(f"trainer.val_check_interval={self.eval_every}")
        if self.eval_batches != full.eval_batches:
            out.append(f"trainer.limit_val_batches={self.eval_batches}")
        if self.warmup_steps != full.warmup_steps:
            out.append(f"scheduler.warmup_steps={self.warmup_steps}")
        return out


QUICK = Cadence(steps=6, eval_every=3, eval_batches=2, warmup_steps=2)


@dataclass
class Timeline:
    """Wall-clock (``time.time``) events of one training process."""

    steps: list[tuple[float, float]] = field(default_factory=list)  # (start, end) of optimizer step 1, 2, ...
    validations: list[tuple[int, float, float]] = field(
        default_factory=list
    )  # (after step, start, batches end)
    train_end: float | None = None
    val_loss: float | None = None
    cpu: list[float] = field(default_factory=list)  # the process's CPU seconds at the end of each step

    def step(self, start: float, end: float, cpu: float | None = None) -> None:
        self.steps.append((start, end))
        if cpu is not None:
            self.cpu.append(cpu)

    def validation(self, start: float, batches_end: float) -> None:
        self.validations.append((len(self.steps), start, batches_end))

    def write(self, path: str | Path) -> None:
        from gptmini.fileio import atomic_write_json

        atomic_write_json(path, self.__dict__)

    @classmethod
    def read(cls, path: str | Path) -> Timeline:
        raw = json.loads(Path(path).read_text())
        return cls(
            steps=[tuple(s) for s in raw["steps"]],
            validations=[(int(v[0]), v[1], v[2]) for v in raw["validations"]],
            train_end=raw.get("train_end"),
            val_loss=raw.get("val_loss"),
            cpu=list(raw.get("cpu", [])),
        )


def phases(tl: Timeline, started: float, ended: float) -> dict[str, Any]:
    """The run's wall clock divided into phases (see the module docstring); times in seconds unless named _ms."""
    if not tl.steps:
        raise ValueError("the timeline has no training step")
    after = {k: (s, b) for k, s, b in tl.validations}  # validation after step k
    step_s, boundary = [], tl.steps[0][0]
    val_batches = extras = 0.0
    disturbed: set[int] = set()  # steps right after a validation (their time is judged against the median)
    for i, (start, end) in enumerate(tl.steps, start=1):
        if i - 1 in after and i > 1:
            # the validation cycle: end of step i-1 to the start of step i
            v_start, v_batches_end = after[i - 1]
            cycle = start - tl.steps[i - 2][1]
            val_batches += v_batches_end - v_start
            extras += cycle - (v_batches_end - v_start)
            boundary = start
            disturbed.update(range(i, i + DRAG_STEPS))
        step_s.append(end - boundary)
        boundary = end
    last = len(tl.steps)
    train_end = tl.train_end if tl.train_end is not None else tl.steps[-1][1]
    if last in after:  # the validation after the final step ends with training
        v_start, v_batches_end = after[last]
        val_batches += v_batches_end - v_start
        extras += (train_end - tl.steps[-1][1]) - (v_batches_end - v_start)
    quiet = [s for i, s in enumerate(step_s, start=1) if i not in disturbed and i > 1] or step_s
    median = statistics.median(quiet)
    # CPU time per step (every thread of the process), over the same steps: what the host spends, whatever else
    # runs on the machine
    cpu_steps = (
        [
            b - a
            for i, (a, b) in enumerate(zip(tl.cpu[:-1], tl.cpu[1:], strict=True), start=2)
            if i not in disturbed
        ]
        if len(tl.cpu) == last
        else []
    )
    background = sum(
        step_s[i - 1] - median
        for k, *_ in tl.validations
        for i in range(k + 1, k + 1 + DRAG_STEPS)
        if i <= last
    )
    total = ended - started
    return {
        "total_s": total,
        "startup_s": tl.steps[0][0] - started,
        "steps": last,
        "steps_s": sum(step_s),
        "median_step_ms": median * 1e3,
        "median_step_cpu_ms": statistics.median(cpu_steps) * 1e3 if cpu_steps else None,
        "validations": len(tl.validations),
        "val_batches_s": val_batches,
        "val_extras_s": extras,
        "background_s": background,
        "extras_share": (extras + max(0.0, background)) / total,
        "tail_s": ended - train_end,
        "val_loss": tl.val_loss,
    }


# --- running a command as a user does ---------------------------------------------------------------------


@dataclass
class Run:
    started: float
    ended: float
    returncode: int
    lines: list[tuple[float, str]]  # each output line with the time it arrived
    output: Path


def run_timed(cmd: Sequence[str], cwd: Path, output: Path, env: dict[str, str] | None = None) -> Run:
    """Runs ``cmd`` on a pseudo-terminal (progress bars draw as they do for a user at a terminal), timed from just
    before it starts to its exit; its output goes to ``output``."""
    import pty
    import struct
    import termios
    from fcntl import ioctl

    master, slave = pty.openpty()
    ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # 40 rows x 120 columns
    started = time.time()
    proc = subprocess.Popen(
        list(cmd), cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, close_fds=True
    )
    os.close(slave)
    lines: list[tuple[float, str]] = []
    pending = b""
    with open(output, "wb") as f:
        while True:
            try:
                data = os.read(master, 1 << 16)
            except OSError:  # EIO: every copy of the terminal is closed, the process has exited
                break
            if not data:
                break
            now = time.time()
            f.write(data)
            *complete, pending = (pending + data).split(b"\n")
            lines += [(now, line.decode(errors="replace").rstrip("\r")) for line in complete]
    returncode = proc.wait()
    ended = time.time()
    os.close(master)
    if pending:
        lines.append((ended, pending.decode(errors="replace")))
    return Run(started, ended, returncode, lines, output)


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("TERM", "xterm-256color")
    return env


def prepare_char_data(source: str, out_dir: Path) -> None:
    """Prepares ``source`` into ``out_dir`` as the runs' experiment reads it, in characters (untimed: the runs start
    from a prepared corpus)."""
    data = [] if source == "shakespeare" else ["data=text", f"data.source={source}"]
    cmd = [sys.executable, "-m", "gptmini.cli", "data", "experiment=shakespeare_char_cpu", *data]
    proc = subprocess.run(
        [*cmd, f"data.data_dir={out_dir}"], cwd=REPO, env=child_env(), capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise RuntimeError(f"preparing {source} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")


def run_training_command(
    source: str,
    data_dir: Path,
    work: Path,
    cadence: Cadence,
    name: str,
    extra: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One ``python -m gptmini.training experiment=shakespeare_char_cpu ...`` run, timed; its phases."""
    clock = work / f"{name}.timeline.json"
    data = [] if source == "shakespeare" else ["data=text", f"data.source={source}"]
    cmd = [
        sys.executable,
        "-m",
        "gptmini.training",
        "experiment=shakespeare_char_cpu",
        *data,
        f"data.data_dir={data_dir}",
        f"paths.output_root={work / 'outputs'}",
        f"run_name={name}",
        *cadence.overrides(),
        f"+callbacks.step_clock={{_target_:benchmarks.step_clock.StepClock,path:'{clock}'}}",
        *extra,
    ]
    run = run_timed(cmd, REPO, work / f"{name}.out", env or child_env())
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({run.returncode}); see {run.output}")
    return phases(Timeline.read(clock), run.started, run.ended)


def run_bare_loop(
    data_dir: Path,
    work: Path,
    cadence: Cadence,
    name: str,
    extra: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    clock = work / f"{name}.timeline.json"
    cmd = [sys.executable, "-m", "benchmarks.end_to_end", "bare", "--data-dir", str(data_dir), *extra]
    cmd += ["--steps", str(cadence.steps), "--eval-every", str(cadence.eval_every)]
    cmd += ["--eval-batches", str(cadence.eval_batches), "--warmup-steps", str(cadence.warmup_steps)]
    cmd += ["--timeline", str(clock)]
    run = run_timed(cmd, REPO, work / f"{name}.out", env or child_env())
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({run.returncode}); see {run.output}")
    return phases(Timeline.read(clock), run.started, run.ended)


def bench_end_to_end(opts: BenchOptions) -> tuple[list[dict[str, Any]], list[str]]:
    """``make bench``'s end-to-end section: the training command and the bare loop, alternating, ``rounds``
    times each (2; 1 in quick mode, on a 6-step cadence)."""
    cadence = QUICK if opts.quick else Cadence()
    rounds = int(opts.extra.get("e2e_rounds", 1 if opts.quick else 2))
    source = str(opts.extra.get("tinyshakespeare") or "shakespeare")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gptmini-bench-e2e-") as tmp:
        work = Path(tmp)
        data_dir = work / "data"
        prepare_char_data(source, data_dir)
        for r in range(1, rounds + 1):
            for path in ("gptmini-train", "bare loop"):
                log.info("e2e %s, round %d/%d (load average %s)", path, r, rounds, loadavg())
                if path == "bare loop":
                    p = run_bare_loop(data_dir, work, cadence, f"bare{r}")
                else:
                    p = run_training_command(source, data_dir, work, cadence, f"train{r}")
                rows.append({"path": path, "round": r, **p})
                log.info(
                    "e2e %-13s total %.1f s, startup %.2f s, median step %.2f ms, validation extras %.2f s "
                    "(+%.2f s in the background), val loss %s",
                    path,
                    p["total_s"],
                    p["startup_s"],
                    p["median_step_ms"],
                    p["val_extras_s"],
                    p["background_s"],
                    p["val_loss"],
                )
    bare = {r["round"]: r for r in rows if r["path"] == "bare loop"}
    for r in rows:
        if r["path"] != "bare loop":
            b = bare[r["round"]]
            r["vs_bare_total"] = r["total_s"] / b["total_s"]
            r["vs_bare_step"] = r["median_step_ms"] / b["median_step_ms"]
    corpus = "the embedded corpus" if source == "shakespeare" else Path(source).name
    notes = [
        f"the quick start (experiment=shakespeare_char_cpu) on {corpus} in characters, prepared beforehand: "
        f"{cadence.steps} steps of batch {cadence.batch_size} x 64, validation every {cadence.eval_every} steps on "
        f"{cadence.eval_batches} batches; each run a fresh process on a pseudo-terminal (the progress bar draws as "
        "for a user), timed from its start to its exit; the two paths alternate, round by round",
        "gptmini-train: `python -m gptmini.training experiment=shakespeare_char_cpu`, every default callback on "
        "(attention maps, text samples, checkpoints, TensorBoard, progress bar), plus a clock callback that "
        "records when each step and validation starts and ends. bare loop: `python -m benchmarks.end_to_end bare`, "
        "the same model, data windows, AdamW (the kernel training picks), clipping and schedule in a plain loop that logs nothing",
        "startup_s: to the start of the first step; median_step_ms: step end to step end, leaving out the "
        f"{DRAG_STEPS} steps after each validation; val_extras_s: the training thread's time in a validation "
        f"beyond its batches; background_s: the extra time of the {DRAG_STEPS} steps after each validation "
        "(work left to background threads); extras_share = (val_extras_s + background_s) / total_s; tail_s: "
        "end of training to exit",
    ]
    return rows, notes


# --- the bare loop ----------------------------------------------------------------------------------------


def bare_loop(argv: Sequence[str] | None = None) -> int:
    """The plain-PyTorch loop (its own process): what the training command would cost with no framework, no
    callbacks and no logging."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.end_to_end bare")
    p.add_argument("--data-dir", type=Path, required=True, help="a corpus prepared in characters")
    p.add_argument("--steps", type=int, default=Cadence.steps)
    p.add_argument("--eval-every", type=int, default=Cadence.eval_every)
    p.add_argument("--eval-batches", type=int, default=Cadence.eval_batches)
    p.add_argument("--warmup-steps", type=int, default=Cadence.warmup_steps)
    p.add_argument("--timeline", type=Path, required=True)
    # the model's size, when not the quick start's (model preset "cpu"): the host benchmark's tiny model
    p.add_argument("--n-layer", type=int)
    p.add_argument("--n-head", type=int)
    p.add_argument("--n-embd", type=int)
    a = p.parse_args(argv)
    c = Cadence(
        steps=a.steps, eval_every=a.eval_every, eval_batches=a.eval_batches, warmup_steps=a.warmup_steps
    )

    import torch
    from torch.utils.data import DataLoader

    from gptmini.data.reader import load_meta, load_split
    from gptmini.data.windows import RandomWindowDataset, StreamSampler, StridedWindowDataset
    from gptmini.model import GPT
    from gptmini.training.hardware import retain_freed_memory
    from gptmini.training.loop.module import optimizer_kernel_kwargs, weight_decay_groups
    from gptmini.training.loop.schedulers import WarmupCosineLR

    retain_freed_memory()  # as training does (retain_freed_memory: true)
    torch.manual_seed(c.seed)
    meta = load_meta(a.data_dir)
    sizes = {k: v for k, v in (("n_layer", a.n_layer), ("n_head", a.n_head), ("n_embd", a.n_embd)) if v}
    model = GPT(preset_config("cpu", vocab_size=int(meta["vocab_size"]), **sizes))
    block = model.config.block_size
    train = RandomWindowDataset(load_split(a.data_dir, "train", meta), block, c.steps * c.batch_size, c.seed)
    val = StridedWindowDataset(load_split(a.data_dir, "val", meta), block, None, name="val")
    kernel = optimizer_kernel_kwargs(torch.optim.AdamW, "cpu")  # the kernel training picks on this CPU
    opt = torch.optim.AdamW(
        weight_decay_groups(model), lr=c.lr, betas=c.betas, weight_decay=c.weight_decay, **kernel
    )
    sched = WarmupCosineLR(opt, c.steps, c.warmup_steps, c.min_lr_ratio)
    loader = DataLoader(train, batch_size=c.batch_size, sampler=StreamSampler(len(train)), drop_last=True)
    tl = Timeline()

    def evaluate() -> float:
        model.eval()
        losses = []
        with torch.no_grad():
            for i, (x, y) in enumerate(DataLoader(val, batch_size=c.batch_size)):
                if i == c.eval_batches:
                    break
                losses.append(model(x, y, return_logits=False)[1].item())
        model.train()
        return sum(losses) / len(losses)

    model.train()
    batches = iter(loader)
    for step in range(1, c.steps + 1):
        start = time.time()
        x, y = next(batches)
        _, loss = model(x, y, return_logits=False)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), c.grad_clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        tl.step(start, time.time(), time.process_time())
        if step % c.eval_every == 0:
            v_start = time.time()
            tl.val_loss = evaluate()
            tl.validation(v_start, time.time())
    tl.train_end = time.time()
    tl.write(a.timeline)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.end_to_end bare ...``: the bare loop, which the benchmark starts as its own process.
    The benchmark itself is a section of the benchmarks' one command line (``python -m benchmarks --only e2e``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] != ["bare"]:
        sys.exit(
            "usage: python -m benchmarks.end_to_end bare --data-dir DIR --timeline FILE [...] (the bare loop the "
            "benchmark starts); to run the benchmark: python -m benchmarks --only e2e [--quick] [--e2e-rounds N]"
        )
    return bare_loop(argv[1:])


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
