"""Reliability through the real command line: bad input fails early with one clear line, failed runs damage
nothing, checkpoints survive kills (even during a save), signals save and exit cleanly, a resumed run ends
bit-identical to an uninterrupted one, a NaN loss stops the run without overwriting good checkpoints, and
untrusted checkpoints never run code.

Faults are injected with ``FaultInjector`` below, added to a real ``python -m gptmini.training`` through a Hydra
override (``+callbacks.fault=...``; the ``run_cli`` fixture puts this folder on the subprocess's PYTHONPATH).
Nothing in gptmini itself knows about fault injection. This module must stay importable on its own (the training
subprocess imports it): it takes the shared fixtures from tests/conftest.py as fixtures, never by import.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import time
import zipfile
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch

# A tiny run on the char tokenizer: dropout > 0 so the RNG state matters for exact resume; 20 steps with a
# periodic checkpoint every 5 and validation every 10. About 5-10 s per run on 2 cores.
RUN = [
    "model=tiny",
    "tokenizer=char",
    "trainer=cpu",
    "model.dropout=0.1",
    "data.batch_size=4",
    "trainer.max_steps=20",
    "trainer.val_check_interval=10",
    "trainer.limit_val_batches=2",
    "trainer.log_every_n_steps=1",
    "checkpoint_every_n_steps=5",
    "trainer.enable_model_summary=false",
    "~callbacks.attention_maps",
    "~callbacks.text_samples",
    "~callbacks.progress_bar",
    "trainer.enable_progress_bar=false",
]
STEPS, EVERY = 20, 5


# --- fault injection (runs inside the training subprocess) ------------------------------------------------


class FaultInjector(L.Callback):
    """Test-only callback: at optimizer step ``step`` (counted as ``trainer.global_step``) and hook ``where``
    (batch_start, before_optimizer_step, batch_end, save), does ``action``:

    - ``kill``: SIGKILL its own process (no cleanup, no handlers: like the OOM killer or a power cut);
    - ``kill_mid_write`` (with where=save): the checkpoint being saved writes half its bytes to the temp file,
      fsyncs, then the process SIGKILLs itself before the rename;
    - ``disk_full`` (with where=save): the checkpoint being saved, and every later one, fills the last 4 KiB
      of the disk (``FullDisk``);
    - ``sigterm`` / ``sigint``: sends itself that signal (a real signal, through the real handlers).
    """

    def __init__(self, action: str, step: int, where: str = "batch_end") -> None:
        self.action, self.step, self.where = action, int(step), where

    def _fire(self, trainer: L.Trainer, where: str) -> None:
        if where != self.where or trainer.global_step != self.step:
            return
        if self.action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.action in ("sigterm", "sigint"):
            os.kill(os.getpid(), signal.SIGTERM if self.action == "sigterm" else signal.SIGINT)
            self.step = -1  # once
        elif self.action == "kill_mid_write":
            ckpt_io = _atomic_checkpoint_io(trainer)
            assert type(ckpt_io).__name__ == "AtomicCheckpointIO", (
                f"checkpoints not saved atomically: {ckpt_io}"
            )

            def write_half_then_die(checkpoint: dict[str, Any], f: Any) -> None:
                buf = io.BytesIO()
                torch.save(checkpoint, buf)
                data = buf.getvalue()
                f.write(data[: len(data) // 2])
                f.flush()
                os.fsync(f.fileno())
                os.kill(os.getpid(), signal.SIGKILL)

            ckpt_io.write = write_half_then_die
        elif self.action == "disk_full":

            def write_until_full(checkpoint: dict[str, Any], f: Any) -> None:
                torch.save(checkpoint, FullDisk(f, room=4096))

            _atomic_checkpoint_io(trainer).write = write_until_full

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):  # noqa: ANN001
        self._fire(trainer, "batch_start")

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):  # noqa: ANN001
        self._fire(trainer, "before_optimizer_step")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):  # noqa: ANN001
        self._fire(trainer, "batch_end")

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):  # noqa: ANN001
        self._fire(trainer, "save")


def _atomic_checkpoint_io(trainer: L.Trainer) -> Any:
    """The plugin that writes the files: the trainer's, or the one its AsyncCheckpointIO runs on a thread."""
    ckpt_io = trainer.strategy.checkpoint_io
    return getattr(ckpt_io, "checkpoint_io", None) or ckpt_io


class FullDisk:
    """A file on a disk with ``room`` bytes left: a write beyond fails with ENOSPC, as the kernel's does (torch.save
    then raises its zip writer's RuntimeError, raised while handling that OSError)."""

    def __init__(self, f: Any, room: int) -> None:
        self.f, self.room = f, room

    def write(self, data: bytes) -> int:
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


def fault(action: str, step: int, where: str = "batch_end") -> str:
    return f"+callbacks.fault={{_target_:test_reliability.FaultInjector,action:{action},step:{step},where:{where}}}"


# --- helpers ----------------------------------------------------------------------------------------------


def output(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout + proc.stderr


def run_dirs(out: Path, run_name: str) -> list[Path]:
    return sorted((out / run_name).glob("*/"), key=lambda p: p.name)


def load(path: Path) -> dict[str, Any]:
    from gptmini.runs.checkpoint import load_checkpoint

    return load_checkpoint(path)


def snapshot(*folders: Path) -> dict[str, tuple[int, int, str]]:
    files = {}
    for folder in folders:
        for p in sorted(folder.rglob("*")):
            if p.is_file():
                st = p.stat()
                files[str(p)] = (st.st_size, st.st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
    return files


class Evil:
    """Unpickling this runs ``touch <marker>``: a stand-in for any code a malicious checkpoint could carry."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204
        return (os.system, (f"touch {self.marker}",))


def write_evil_checkpoint(path: Path, marker: Path, template: dict[str, Any]) -> None:
    ckpt = dict(template)
    ckpt["extra"] = Evil(marker)
    torch.save(ckpt, path)


@dataclass
class Workspace:
    root: Path
    data_root: Path
    out: Path
    ref_dir: Path  # an uninterrupted run of RUN
    corpora: dict[str, Path]
    evil: Path
    evil_marker: Path
    pool: ThreadPoolExecutor
    cli: Any  # the run_cli fixture (tests/conftest.py): cli(module, args, ...), cli.train(args, ...), cli.popen
    events: (
        Any  # the tb_events fixture: events(run_dir) -> EventAccumulator of the TensorBoard run it logged to
    )
    # Runs of the fast tests, started together with the reference run so that they overlap each other and the
    # bad-input table: most of each run is Python/torch/Lightning start-up on one core.
    jobs: dict[str, Future] = field(default_factory=dict)

    def args(self, run_name: str, *extra: str) -> list[str]:
        """RUN for ``run_name`` in this workspace, plus ``extra`` overrides (which replace a default of the same
        key: Hydra refuses a key given twice)."""
        base = [
            *RUN,
            f"run_name={run_name}",
            f"paths.output_root={self.out}",
            f"paths.data_root={self.data_root}",
        ]
        keys = {e.split("=", 1)[0].lstrip("+~") for e in extra}
        return [*(b for b in base if b.split("=", 1)[0].lstrip("+~") not in keys), *extra]


@pytest.fixture(scope="session")
def pool() -> Any:
    with ThreadPoolExecutor(max_workers=3) as executor:
        yield executor


@pytest.fixture(scope="session")
def ws(
    tmp_path_factory: pytest.TempPathFactory, pool: ThreadPoolExecutor, run_cli: Any, tb_events: Any
) -> Workspace:
    from gptmini.data.prepare import prepare

    root = tmp_path_factory.mktemp("reliability")
    data_root, out = root / "data", root / "outputs"
    prepare("shakespeare", "char", data_root / "shakespeare_char")
    corpora = {
        "missing": root / "corpora" / "missing.txt",
        "empty": root / "corpora" / "empty.txt",
        "blank": root / "corpora" / "blank.txt",
        "latin1": root / "corpora" / "latin1.txt",
        "small": root / "corpora" / "small.txt",
        "lower": root / "corpora" / "lower.txt",
    }
    corpora["empty"].parent.mkdir()
    corpora["empty"].write_bytes(b"")
    corpora["blank"].write_text(" \n\n\t\n")
    corpora["latin1"].write_bytes("ROMEO: caf\u00e9 cr\u00e8me\n".encode("latin-1") * 50)
    corpora["small"].write_text("To be, or not to be, that is the question.\n" * 48)  # ~2k chars: val ~200
    # no capital letter nor ":": the built-in probe text and sample prompt ("ROMEO:...") are mostly unknown
    corpora["lower"].write_text("but soft, what light through yonder window breaks?\n" * 200)
    evil, marker = root / "evil.ckpt", root / "PAYLOAD_RAN"
    ws = Workspace(root, data_root, out, out / "ref", corpora, evil, marker, pool, run_cli, tb_events)
    ref = pool.submit(ws.cli.train, ws.args("ref"))
    ws.jobs["kill_save"] = pool.submit(
        kill_then_resume_runs, ws, "kill_save", [fault("kill_mid_write", 10, "save")]
    )
    ws.jobs["signals"] = pool.submit(signal_runs, ws)
    ref = ref.result()
    assert ref.returncode == 0, output(ref)[-3000:]
    (ws.ref_dir,) = run_dirs(out, "ref")
    write_evil_checkpoint(evil, marker, load(ws.ref_dir / "checkpoints" / "last.ckpt"))
    # a real checkpoint with a few bytes overwritten inside a tensor, as disk damage does
    damaged = shutil.copy(ws.ref_dir / "checkpoints" / "last.ckpt", root / "damaged.ckpt")
    with zipfile.ZipFile(damaged) as z:
        info = next(i for i in z.infolist() if i.filename.endswith("/data/0"))
    with open(damaged, "r+b") as f:
        f.seek(info.header_offset + 30 + len(info.filename.encode()) + len(info.extra) + info.file_size // 2)
        f.write(b"\xff" * 8)
    (root / "text.ckpt").write_text("a text file renamed .ckpt\n" * 100)
    # prepared data whose train shard holds an id beyond the char vocabulary (a damaged or foreign shard)
    shutil.copytree(data_root / "shakespeare_char", root / "bad_ids" / "shakespeare_char")
    bad_meta = json.loads((root / "bad_ids" / "shakespeare_char" / "meta.json").read_text())
    shard = root / "bad_ids" / "shakespeare_char" / bad_meta["shard_dir"] / "shard_000000.bin"
    with open(shard, "r+b") as f:
        f.seek(2 * 100)
        f.write((60000).to_bytes(2, "little"))
    (root / "a_file").write_text("")  # in place of a folder: nothing can be created under it, even by root
    ws.jobs["evil_sample"] = pool.submit(
        ws.cli, "gptmini.inference.sample", ["--ckpt", str(evil), "--max-new-tokens", "5"]
    )
    return ws


def assert_identical(a: Any, b: Any, where: str) -> None:
    """``a`` and ``b`` are the same nested state (dicts, lists, tensors bit for bit)."""
    if isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=where)
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_identical(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_identical(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def assert_same_as_reference(ws: Workspace, run_dir: Path) -> None:
    """The run in ``run_dir`` ended exactly where the uninterrupted reference run did."""
    ref = load(ws.ref_dir / "checkpoints" / "last.ckpt")
    got = load(run_dir / "checkpoints" / "last.ckpt")
    assert got["global_step"] == ref["global_step"] == STEPS
    assert got["state_dict"].keys() == ref["state_dict"].keys()
    for k in ref["state_dict"]:
        torch.testing.assert_close(got["state_dict"][k], ref["state_dict"][k], rtol=0, atol=0, msg=k)
    assert_identical(got["optimizer_states"], ref["optimizer_states"], "optimizer_states")
    assert got["lr_schedulers"] == ref["lr_schedulers"]
    assert (
        ws.events(run_dir).Scalars("val/loss")[-1].value
        == ws.events(ws.ref_dir).Scalars("val/loss")[-1].value
    )


# --- bad input: a table through the command's entry point --------------------------------------------------------

# (id, overrides, message regex, exit status). {name} fields are filled from the workspace. Exit 2: every
# refusal, gptmini's own checks and Hydra's composition errors (unknown group option or key) alike, as
# docs/reliability.md promises.
BAD_INPUT = [
    (
        "heads_not_dividing_width",
        ["model.n_head=3"],
        r"error: model\.n_embd=32 is not divisible by model\.n_head=3: choose n_head among the divisors of n_embd \(1, 2, 4, 8, 16, 32\)",
        2,
    ),
    (
        "unknown_attention",
        ["model.attention=flash"],
        r"error: model\.attention='flash' is not a causal attention implementation; valid names: .*sdpa",
        2,
    ),
    (
        "unknown_tokenizer_name",
        ["tokenizer.name=bpe9"],
        r"error: tokenizer\.name='bpe9' is unknown: valid names are gpt2, char",
        2,
    ),
    ("unknown_experiment", ["experiment=nope"], r"error: Could not find 'experiment/nope'", 2),
    (
        "unknown_key",
        ["model.n_embdd=64"],
        r"error: model\.n_embdd=64: model has no setting 'n_embdd'; did you mean model\.n_embd\?",
        2,
    ),
    (
        "block_size_exceeds_split",
        ["data=text", "data.source={small}", "model.block_size=256"],
        r"error: split 'val' has \d+ tokens but block_size=256 needs at least 257; use a smaller block_size",
        2,
    ),
    (
        "missing_corpus",
        ["data=text", "data.source={missing}"],
        r"error: data\.source=\S*missing\.txt does not exist: expected 'shakespeare'",
        2,
    ),
    (
        "empty_corpus",
        ["data=text", "data.source={empty}"],
        r"error: data\.source=\S*empty\.txt is an empty file",
        2,
    ),
    (
        "checkpoint_of_other_shape",
        ["ckpt_path={ref_ckpt}", "model.n_embd=64"],
        r"error: checkpoint \S*last\.ckpt was trained with another model shape \(model\.n_embd: checkpoint 32 vs now 64\)",
        2,
    ),
    (
        # its Muon state would not load into AdamW: a KeyError traceback, and an on_exception.ckpt written
        "resume_with_another_optimizer",
        ["ckpt_path={ref_ckpt}", "optimizer=adamw", "trainer.max_steps=40"],
        r"error: checkpoint \S*last\.ckpt was trained with another optimizer \(optimizer\._target_: checkpoint "
        r"gptmini\.training\.loop\.optimizers\.MuonAdamW vs now torch\.optim\.AdamW\): its saved optimizer state",
        2,
    ),
    (
        "pickled_code_checkpoint",
        ["ckpt_path={evil}"],
        r"error: refusing to load \S*evil\.ckpt: it contains pickled Python objects",
        2,
    ),
    (
        "damaged_checkpoint",
        ["ckpt_path={damaged}"],
        r"error: \S*damaged\.ckpt is damaged: its tensors \(\d+ tensors, [\d,]+ bytes\) do not match the checksum "
        r"written when it was saved",
        2,
    ),
    (
        "text_file_as_checkpoint",
        ["ckpt_path={text_ckpt}"],
        r"error: \S*text\.ckpt is not a gptmini checkpoint \(not a PyTorch archive",
        2,
    ),
    (
        "unwritable_output_root",
        ["paths.output_root={a_file}/outputs"],
        r"error: cannot create the run folder \S*a_file/outputs/ref/\S+: \S*a_file is a file, not a folder; pass "
        r"paths\.output_root=<a writable folder>",
        2,
    ),
]
# More of the same, in the slow suite (each case costs a Python + torch start-up, ~2 s of CPU). Each check of
# these cases is also tested in-process by the unit tests of the module that makes it (test_model: shapes and
# dropout; test_config: vocabulary, GPU, devices, memory, folders; test_optimizers: Muon's per-role learning
# rates; test_limits: size settings; test_corpora / test_corpus_guards: undecodable text and device files); the
# fast table above keeps one case of each kind through the real command line.
BAD_INPUT_MORE = [
    (
        "negative_width",
        ["model.n_embd=-32"],
        r"error: model\.n_embd=-32 is invalid: it must be a positive integer",
        2,
    ),
    (
        "zero_batch",
        ["data.batch_size=0"],
        r"error: data\.batch_size=0 is invalid: it must be an integer >= 1",
        2,
    ),
    (
        "zero_steps",
        ["trainer.max_steps=0"],
        r"error: trainer\.max_steps=0 is invalid: it must be a positive",
        2,
    ),
    ("unknown_tokenizer_group", ["tokenizer=bpe9"], r"error: Could not find 'tokenizer/bpe9'", 2),
    (
        "blank_corpus",
        ["data=text", "data.source={blank}"],
        r"error: corpus '\S*blank\.txt' is empty \(no non-whitespace",
        2,
    ),
    (
        "resume_without_checkpoint",
        ["ckpt_path=last", "run_name=never_trained"],
        r"error: ckpt_path=last but no checkpoint of run_name='never_trained' was found",
        2,
    ),
    (
        "unknown_precision",
        ["trainer.precision=17"],
        r"error: trainer\.precision=17 is invalid: valid values are auto, 16, 16-mixed, 16-true, 32, 32-true",
        2,
    ),
    (
        "fp16_on_cpu",
        ["trainer.precision=16-mixed"],
        r"error: trainer\.precision=16-mixed \(float16 AMP\) needs a CUDA GPU",
        2,
    ),
    (
        "zero_layers",
        ["model.n_layer=0"],
        r"error: model\.n_layer=0 is invalid: it must be a positive integer",
        2,
    ),
    (
        "zero_lr",
        ["optimizer.hidden.lr=0"],
        r"error: optimizer\.hidden\.lr=0(\.0)? is invalid: the learning rate must be > 0",
        2,
    ),
    (
        "dropout_one",
        ["model.dropout=1.0"],
        r"error: model\.dropout=1\.0 is invalid: it must be in \[0, 1\)",
        2,
    ),
    (
        "vocab_smaller_than_tokenizer",
        ["model.vocab_size=10"],
        r"error: model vocab_size 10 is smaller than tokenizer 'char' vocab_size \d+; set the model's vocab_size >= \d+",
        2,
    ),
    (
        # a device (or FIFO, or symbolic link loop) was reported as "not found"
        "device_as_corpus",
        ["data=text", "data.source=/dev/zero"],
        r"error: data\.source=/dev/zero is a character device, not a regular file",
        2,
    ),
    (
        "undecodable_corpus",
        ["data=text", "data.source={latin1}"],
        r"error: \S*latin1\.txt is not valid UTF-8: byte offset \d+ .*iconv",
        2,
    ),
    (
        "gpu_without_gpu",
        ["trainer=gpu"],
        r"error: trainer\.accelerator=gpu asks for a CUDA GPU and no CUDA GPU is available on this machine: use "
        r"trainer=default or trainer=cpu, or run on a machine with a CUDA GPU",
        2,
    ),
    (
        "unwritable_data_root",
        ["paths.data_root={a_file}/data"],
        r"error: the prepared-data folder \S*a_file/data/shakespeare_char cannot be created: \S*a_file is a file, "
        r"not a folder; pass paths\.data_root=",
        2,
    ),
    (
        "more_cpu_devices_than_cores",
        ["trainer.devices={too_many_devices}"],
        r"error: trainer\.devices=\d+ on the CPU would start \d+ training processes \(DDP over gloo\) on this "
        r"machine's \d+ CPU cores",
        2,
    ),
    (
        # a probe of a million sequences, every layer's attention kept: tens of GiB at the first validation
        "size_setting_beyond_memory",
        ["callbacks.head_insight.probe_batch=1000000"],
        r"error: callbacks\.head_insight\.probe_batch=1000000 is too large: 1,000,000 probe sequences \(x2\) would "
        r"need about [\d,.]+ GiB of memory and this machine's memory has [\d,.]+ GiB .*: use "
        r"callbacks\.head_insight\.probe_batch=\d+ or less",
        2,
    ),
    (
        "ckpt_path_name_too_long",
        ["ckpt_path=/tmp/" + "x" * 300],
        r"error: ckpt_path=/tmp/x+\.\.\.: its name 'x+'\.\.\. is 300 bytes long, over the filesystem's limit of 255; "
        r"pass a shorter path",
        2,
    ),
    (
        "init_from_name_too_long",
        ["model.init_from=/tmp/" + "x" * 300],
        r"error: model\.init_from=/tmp/x+\.\.\.: its name 'x+'\.\.\. is 300 bytes long",
        2,
    ),
    (
        "output_root_name_too_long",
        ["paths.output_root=/tmp/" + "x" * 300],
        r"error: the run folder /tmp/x+\.\.\.: its name 'x+'\.\.\. is 300 bytes long, over the filesystem's limit "
        r"of 255; pass a shorter paths\.output_root \(or hydra\.run\.dir\)",
        2,
    ),
    (
        "data_root_name_too_long",
        ["paths.data_root=/tmp/" + "x" * 300],
        r"error: the prepared-data folder /tmp/x+\.\.\.: its name 'x+'\.\.\. is 300 bytes long, over the "
        r"filesystem's limit of 255; pass a shorter path",
        2,
    ),
    (
        "token_ids_beyond_the_vocabulary",
        ["paths.data_root={bad_ids_root}"],
        r"error: split 'train' of \S+ holds token id 60000 at token 100, but the vocabulary has \d+ ids",
        2,
    ),
    (
        # the logits alone are 4096 x 100,000 x 128 floats, twice (419 GB); the activations more
        "step_does_not_fit_in_memory",
        ["model.block_size=100000", "data.batch_size=4096"],
        r"error: model\.block_size=100000 with data\.batch_size=4096 needs about [\d,.]+ GiB of memory for one "
        r"training step \((activations|attention scores): [\d,.]+ GiB\) but this machine \([^)]*\) has [\d,.]+ GiB",
        2,
    ),
]


def _fill(arg: str, ws: Workspace) -> str:
    names = {k: str(v) for k, v in ws.corpora.items()}
    names.update(ref_ckpt=str(ws.ref_dir / "checkpoints" / "last.ckpt"), evil=str(ws.evil))
    names.update(damaged=str(ws.root / "damaged.ckpt"), text_ckpt=str(ws.root / "text.ckpt"))
    names.update(a_file=str(ws.root / "a_file"), too_many_devices=str(len(os.sched_getaffinity(0)) + 1))
    names.update(bad_ids_root=str(ws.root / "bad_ids"))
    return arg.format(**names)


def _run_cases(ws: Workspace, cases: list[tuple]) -> dict[str, subprocess.CompletedProcess]:
    def one(case: tuple) -> subprocess.CompletedProcess:
        name, overrides, _, _ = case
        # run_name=ref: the failed runs sit beside the good one, as a user's retries would.
        return ws.cli.train(ws.args("ref", *[_fill(a, ws) for a in overrides]))

    return dict(zip([c[0] for c in cases], ws.pool.map(one, cases), strict=True))


# Cases of the fast table run as a real `gptmini train` process (the rest through the command's own main in this
# process, the same code from the command line on): a Hydra composition error. A refused pickled checkpoint runs
# as a process through `sample` (test_checkpoint_with_pickled_code_is_refused_and_never_runs).
THROUGH_THE_PROCESS = ("unknown_key",)


@pytest.fixture(scope="session")
def bad_runs(ws: Workspace) -> dict[str, Any]:
    """Snapshots what the reference run and the prepared data hold (compared by test_failed_runs_damage_nothing)
    before any bad-input case runs; starts the cases run as processes."""
    before = snapshot(ws.ref_dir, ws.data_root / "shakespeare_char")
    cases = [c for c in BAD_INPUT if c[0] in THROUGH_THE_PROCESS]
    return {"before": before, "results": _run_cases(ws, cases)}


def check_bad_input(case: tuple, proc: subprocess.CompletedProcess) -> None:
    name, _, pattern, status = case
    text = output(proc)
    assert proc.returncode == status, text[-3000:]
    assert re.search(pattern, text), text[-3000:]
    assert "Traceback" not in text
    if status == 2:  # one line, starting with "error:" (no logging prefix), nothing trained
        assert len(re.findall(r"\berror: ", text)) == 1, text
        assert re.search(r"^error: ", text, re.M), text
        assert "Epoch" not in text and "run finished" not in text


@pytest.mark.parametrize("case", BAD_INPUT, ids=[c[0] for c in BAD_INPUT])
def test_bad_input_fails_with_one_clear_message(case, ws: Workspace, bad_runs, gptmini_train) -> None:
    name, overrides, _, _ = case
    if name in bad_runs["results"]:
        proc = bad_runs["results"][name]
    else:  # run_name=ref: the failed runs sit beside the good one, as a user's retries would
        proc = gptmini_train(ws.args("ref", *[_fill(a, ws) for a in overrides]))
    check_bad_input(case, proc)


@pytest.mark.slow
def test_more_bad_input_fails_with_one_clear_message(ws: Workspace) -> None:
    results = _run_cases(ws, BAD_INPUT_MORE)
    for case in BAD_INPUT_MORE:
        check_bad_input(case, results[case[0]])


def test_bad_input_table_is_large_enough() -> None:
    assert len(BAD_INPUT) >= 12 and len(BAD_INPUT) + len(BAD_INPUT_MORE) >= 32


def test_failed_runs_damage_nothing(ws: Workspace, bad_runs) -> None:
    from gptmini.training.run.resume import resolve_ckpt_path

    assert snapshot(ws.ref_dir, ws.data_root / "shakespeare_char") == bad_runs["before"]
    # No failed run left a checkpoint that `ckpt_path=last` would pick instead of the good run's.
    assert resolve_ckpt_path("last", ws.out / "new", ws.out, "ref") == str(
        ws.ref_dir / "checkpoints" / "last.ckpt"
    )
    # Nor a run folder: a run that fails its checks removes the one Hydra created for it (only .hydra/, train.log).
    assert run_dirs(ws.out, "ref") == [ws.ref_dir]


@pytest.mark.slow
def test_full_error_shows_the_traceback_on_request(ws: Workspace) -> None:
    proc = ws.cli.train(ws.args("ref", "model.n_head=3"), env={"HYDRA_FULL_ERROR": "1"})
    assert proc.returncode != 0
    assert "Traceback" in output(proc) and "ConfigError: model.n_embd=32 is not divisible" in output(proc)


# --- crashes and resume ---------------------------------------------------------------------------------


def kill_then_resume_runs(ws: Workspace, name: str, fault_args: list[str]) -> tuple[Any, Any]:
    """A run killed by ``fault_args``, then the same command with ``ckpt_path=last``."""
    killed = ws.cli.train(ws.args(name, *fault_args))
    if killed.returncode != -signal.SIGKILL:
        return killed, None
    killed.temp_files = {p: p.stat().st_size for p in (ws.out / name).glob("*/checkpoints/.*.tmp")}
    return killed, ws.cli.train(ws.args(name, "ckpt_path=last"))


def check_kill_then_resume(ws: Workspace, name: str, runs: tuple[Any, Any], resume_step: int) -> Path:
    killed, resumed = runs
    assert killed.returncode == -signal.SIGKILL, output(killed)[-3000:]
    killed_dir, resumed_dir = run_dirs(ws.out, name)
    # A hard kill loses at most the steps since the last periodic checkpoint.
    assert load(killed_dir / "checkpoints" / "last.ckpt")["global_step"] == resume_step
    assert resumed.returncode == 0, output(resumed)[-3000:]
    assert f"resuming from {killed_dir / 'checkpoints' / 'last.ckpt'}" in output(resumed)
    assert_same_as_reference(ws, resumed_dir)
    return killed_dir


def test_kill_during_checkpoint_save_keeps_previous_and_resume_is_exact(ws: Workspace) -> None:
    """SIGKILL halfway through writing the step-10 checkpoint: last.ckpt still holds step 5, complete; the
    half-written temp file is never mistaken for a checkpoint; resuming from step 5 ends exactly like the
    uninterrupted run (weights, optimizer, scheduler, val loss)."""
    runs = ws.jobs["kill_save"].result()
    killed_dir = check_kill_then_resume(ws, "kill_save", runs, resume_step=5)
    (temp, size), *others = runs[0].temp_files.items()  # what the kill left, before the resume
    assert not others and temp.name.startswith(".last.ckpt.") and temp.parent == killed_dir / "checkpoints"
    assert 0 < size < (killed_dir / "checkpoints" / "last.ckpt").stat().st_size
    # The resume removed it (its writer is gone), saying so; nothing else of the killed run.
    assert not temp.exists() and f"removed {temp}, left by a save that was interrupted" in output(runs[1])
    assert not list((killed_dir / "checkpoints").glob(".*.tmp"))
    assert (killed_dir / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.slow
@pytest.mark.parametrize(
    "where, step, resume_step",
    [
        ("before_optimizer_step", 7, 5),  # mid-step: gradients computed, weights not yet updated
        ("batch_end", 10, 5),  # right after step 10, before its checkpoint callback runs
        ("batch_end", 13, 10),  # after the validation at 10 and its best.ckpt
        ("batch_start", 19, 15),  # just before the last step
    ],
    ids=["mid_step7", "end_of_step10_before_save", "step13", "start_of_step20"],
)
def test_sigkill_then_resume_is_exact(ws: Workspace, where: str, step: int, resume_step: int) -> None:
    name = f"kill_{where}_{step}"
    check_kill_then_resume(
        ws, name, kill_then_resume_runs(ws, name, [fault("kill", step, where)]), resume_step
    )


@pytest.mark.slow
def test_external_sigkill_at_an_arbitrary_moment_then_resume_is_exact(ws: Workspace) -> None:
    """Killed from outside as soon as the first periodic checkpoint exists, wherever the run is then."""
    name = "kill_external"
    proc = ws.cli.popen(
        ws.cli.train_module, ws.args(name), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 120
        while not list((ws.out / name).glob("*/checkpoints/last.ckpt")) and proc.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    resumed = ws.cli.train(ws.args(name, "ckpt_path=last"))
    assert resumed.returncode == 0, output(resumed)[-3000:]
    assert_same_as_reference(ws, run_dirs(ws.out, name)[-1])


# --- signals ----------------------------------------------------------------------------------------------


def signal_runs(ws: Workspace) -> dict[signal.Signals, tuple[int, str]]:
    """Two real training processes (500 steps each, side by side), each sent SIGTERM or SIGINT from outside once
    it has checkpointed step 5. Returns the exit status and output of each."""
    procs = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        procs[sig] = ws.cli.popen(
            ws.cli.train_module,
            ws.args(f"signal_{sig.name}", "trainer.max_steps=500"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        pending, deadline = dict(procs), time.monotonic() + 240
        while pending and time.monotonic() < deadline:
            for sig, proc in list(pending.items()):
                if (
                    list((ws.out / f"signal_{sig.name}").glob("*/checkpoints/last.ckpt"))
                    or proc.poll() is not None
                ):
                    proc.send_signal(sig)
                    del pending[sig]
            time.sleep(0.05)
        texts = {sig: proc.communicate(timeout=240)[0] for sig, proc in procs.items()}
        return {sig: (proc.returncode, texts[sig]) for sig, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()


def test_sigterm_and_sigint_save_a_checkpoint_and_exit_cleanly(ws: Workspace) -> None:
    """Each saves on_exception.ckpt at a step boundary and exits with 128 + the signal number, no traceback."""
    results = ws.jobs["signals"].result()
    for sig, status in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
        name, (returncode, text) = f"signal_{sig.name}", results[sig]
        assert returncode == status, text[-3000:]
        assert "Traceback" not in text
        assert re.search(
            rf"interrupted by {sig.name}: saved \S*on_exception\.ckpt; resume with: gptmini train .*run_name={name} "
            rf".*ckpt_path=\S*/{name}/[^/\s]+",
            text,
        ), text[-3000:]
        (run_dir,) = run_dirs(ws.out, name)
        ckpt = load(run_dir / "checkpoints" / "on_exception.ckpt")  # weights_only=True
        assert 5 <= ckpt["global_step"] < 500
        assert all(torch.isfinite(v).all() for v in ckpt["state_dict"].values())
        # the curves so far, as a finished run has them (a stopped run left none)
        assert (run_dir / "loss_curve.png").stat().st_size > 0
        assert (run_dir / "scalars.csv").read_text().startswith("step,")


@pytest.mark.slow
@pytest.mark.parametrize("action", ["sigterm", "sigint"])
def test_signal_then_resume_is_exact(ws: Workspace, action: str) -> None:
    """The checkpoint a signal saves is a consistent end-of-step state: resuming from it is exact too."""
    name = f"resume_after_{action}"
    first = ws.cli.train(ws.args(name, fault(action, 12, "batch_start")))
    assert first.returncode == (143 if action == "sigterm" else 130), output(first)[-3000:]
    (first_dir,) = run_dirs(ws.out, name)
    assert load(first_dir / "checkpoints" / "on_exception.ckpt")["global_step"] == 13  # finishes step 13
    resumed = ws.cli.train(ws.args(name, "ckpt_path=last"))
    assert resumed.returncode == 0, output(resumed)[-3000:]
    assert "on_exception.ckpt" in output(resumed)
    assert_same_as_reference(ws, run_dirs(ws.out, name)[-1])


# --- non-finite loss ----------------------------------------------------------------------------------------


def test_nonfinite_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(
    ws: Workspace, gptmini_train: Any
) -> None:
    name = "nan"
    proc = gptmini_train(ws.args(name, "optimizer=adamw", "optimizer.lr=1e6", "checkpoint_every_n_steps=1"))
    text = output(proc)
    assert proc.returncode == 3, text[-3000:]
    assert "Traceback" not in text
    # Which comes first depends on the model and seed: a NaN loss (this config: at step 3), or weights that
    # became NaN/inf in an optimizer step, caught when the next checkpoint would have saved them.
    loss_nan = re.search(
        r"error: training loss became (nan|inf|-inf) at step (\d+); the run stopped without saving these "
        r"weights and the last good checkpoint is \S+last\.ckpt \(step (\d+)\)\. Lower the learning rate .*"
        r"\(optimizer\.lr; with optimizer=muon optimizer\.hidden\.lr and optimizer\.embedding\.lr\)",
        text,
    )
    weights_nan = re.search(
        r"error: the weights became non-finite \(NaN/inf\) at step (\d+); refusing to save them, so the last "
        r"good checkpoint \(\S+last\.ckpt\) was kept",
        text,
    )
    assert loss_nan or weights_nan, text[-3000:]
    step = int(loss_nan.group(2)) if loss_nan else int(weights_nan.group(1))
    assert step >= 2
    if loss_nan:
        assert int(loss_nan.group(3)) == step - 1
    (run_dir,) = run_dirs(ws.out, name)
    assert not (run_dir / "checkpoints" / "on_exception.ckpt").exists()
    for ckpt_file in (run_dir / "checkpoints").glob("*.ckpt"):
        ckpt = load(ckpt_file)
        assert ckpt["global_step"] < step
        assert all(torch.isfinite(v).all() for v in ckpt["state_dict"].values()), ckpt_file


def test_nonfinite_loss_stops_a_run_without_callbacks_too(ws: Workspace, gptmini_train: Any) -> None:
    """callbacks=none on a diverging run exited 0 with a NaN last.ckpt: the guard stays whatever the callbacks."""
    args = [
        a
        for a in ws.args("nan_none", "callbacks=none", "optimizer=adamw", "optimizer.lr=1e6")
        # no periodic checkpoint to pace without callbacks (checkpoint_every_n_steps would be refused)
        if not a.startswith(("~callbacks.", "checkpoint_every_n_steps="))
    ]
    proc = gptmini_train(args)
    text = output(proc)
    assert proc.returncode == 3, text[-3000:]
    assert re.search(r"error: (training loss became (nan|inf|-inf)|the weights became non-finite)", text), (
        text[-3000:]
    )
    (run_dir,) = run_dirs(ws.out, "nan_none")
    for ckpt_file in run_dir.rglob("*.ckpt"):
        assert all(torch.isfinite(v).all() for v in load(ckpt_file)["state_dict"].values()), ckpt_file


# --- a full disk, a corpus the built-in texts do not fit ------------------------------------------------------


def test_a_full_disk_during_a_save_is_one_error_that_says_what_was_kept(
    ws: Workspace, gptmini_train: Any
) -> None:
    """Every save from step 15 on fails with ENOSPC (FaultInjector disk_full): the run stops with one line naming
    the file and what survived, exit 2; the step-10 last.ckpt is intact and loads (checksum verified), and no
    temp file or on_exception.ckpt is left."""
    proc = gptmini_train(ws.args("disk_full", fault("disk_full", 15, "save")))
    text = output(proc)
    assert proc.returncode == 2, text[-3000:]
    assert "Traceback" not in text and len(re.findall(r"\berror: ", text)) == 1, text[-3000:]
    assert re.search(
        r"error: could not save checkpoint \S+/checkpoints/last\.ckpt: No space left on device; the previous "
        r"last\.ckpt \(step 10\) is kept unchanged\. Free disk space or make \S+ writable, then resume with "
        r"ckpt_path=last",
        text,
    ), text[-3000:]
    (run_dir,) = run_dirs(ws.out, "disk_full")
    assert load(run_dir / "checkpoints" / "last.ckpt")["global_step"] == 10
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["best.ckpt", "last.ckpt"]


def test_a_corpus_without_the_probe_and_prompt_characters_trains_with_every_logger(
    ws: Workspace, gptmini_train: Any
) -> None:
    """A char vocabulary of a lower-case corpus lacks most of "ROMEO:...": the probe and the prompt lose those
    characters with one warning each, and the run logs its attention maps and samples to the end."""
    # every logging callback on (RUN turns the attention maps and samples off), two validations
    args = ws.args("lower", "data=text", f"data.source={ws.corpora['lower']}")
    args = [a for a in args if "samples" not in a and "attention_maps" not in a]
    proc = gptmini_train([*args, "trainer.max_steps=4", "trainer.val_check_interval=2"])
    text = output(proc)
    assert proc.returncode == 0, text[-3000:]
    assert "Traceback" not in text and "error: " not in text
    for key in ("callbacks.attention_maps.probe_text", "callbacks.text_samples.prompt"):
        assert len(re.findall(rf"{re.escape(key)}: the characters 'R' 'O' 'M' 'E' ':'", text)) == 1, text[
            -3000:
        ]
    assert "failed at step" not in text  # no logging hook had to be skipped
    assert "sample at step 2" in text and "sample at step 4" in text
    (run_dir,) = run_dirs(ws.out, "lower")
    assert len(ws.events(run_dir).Images("attention/layer0_heads")) == 2


# --- untrusted files ----------------------------------------------------------------------------------------


def test_checkpoint_with_pickled_code_is_refused_and_never_runs(ws: Workspace, gptmini_cli: Any) -> None:
    # python -m gptmini.inference.sample --ckpt evil.ckpt (a process, started by the ws fixture); gptmini
    # attention --ckpt evil.ckpt (in this process: a payload that ran would leave its marker here too)
    exported = gptmini_cli(["attention", "--ckpt", ws.evil, "--text", "ROMEO:", "--out", ws.root / "png"])
    for proc in (ws.jobs["evil_sample"].result(), exported):
        text = output(proc)
        assert proc.returncode == 2, text[-3000:]
        assert re.search(
            r"error: refusing to load \S*evil\.ckpt: it contains pickled Python objects", text
        ), text
        assert "Traceback" not in text
    # (resuming training from it is refused in the bad-input table: pickled_code_checkpoint)
    assert not ws.evil_marker.exists(), "the checkpoint's payload ran"
    # Control: the payload is real, and runs as soon as something unpickles the file without weights_only.
    control, marker = ws.root / "control.ckpt", ws.root / "CONTROL_RAN"
    write_evil_checkpoint(control, marker, load(ws.ref_dir / "checkpoints" / "last.ckpt"))
    torch.load(control, weights_only=False)
    assert marker.exists()


def test_prepared_data_disagreeing_with_its_metadata_is_refused(ws: Workspace, tmp_path) -> None:
    import json

    from gptmini.data.errors import DataError
    from gptmini.data.reader import load_meta, load_split

    good = ws.data_root / "shakespeare_char"
    truncated = tmp_path / "truncated"
    shutil.copytree(good, truncated)
    meta = load_meta(truncated)
    shard = truncated / meta["shard_dir"] / meta["shards"][0]["file"]
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - 3)
    with pytest.raises(DataError, match=rf"{shard.name} has \d+ bytes but meta\.json says \d+ uint16 tokens"):
        load_split(truncated, "train")

    wrong_dtype = tmp_path / "wrong_dtype"
    shutil.copytree(good, wrong_dtype)
    meta = json.loads((wrong_dtype / "meta.json").read_text())
    meta["dtype"] = "float32"
    (wrong_dtype / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(
        DataError, match=r"field 'dtype' is 'float32', but must be one of \['uint16', 'uint32'\]"
    ):
        load_meta(wrong_dtype)
    # Through a command line: sampling with that folder as the tokenizer's data is refused.
    proc = ws.cli(
        "gptmini.inference.sample",
        [
            "--ckpt",
            str(ws.ref_dir / "checkpoints" / "last.ckpt"),
            "--data-dir",
            str(wrong_dtype),
            "--max-new-tokens",
            "5",
        ],
        timeout=120,
    )
    assert proc.returncode == 2 and "field 'dtype' is 'float32'" in output(proc), output(proc)
    assert "Traceback" not in output(proc)


@pytest.mark.slow
def test_training_never_uses_a_truncated_bin(ws: Workspace, tmp_path) -> None:
    """The training command re-tokenizes a prepared folder whose shard disagrees with meta.json instead of
    reading it (prepared data is a cache of the corpus)."""
    from gptmini.data.reader import load_meta

    data_root = tmp_path / "data"
    shutil.copytree(ws.data_root / "shakespeare_char", data_root / "shakespeare_char")
    meta = load_meta(data_root / "shakespeare_char")
    bin_file = data_root / "shakespeare_char" / meta["shard_dir"] / meta["shards"][0]["file"]
    good_size = bin_file.stat().st_size
    with open(bin_file, "r+b") as f:
        f.truncate(good_size // 2)
    proc = ws.cli.train(
        [
            *RUN,
            "run_name=rebuilt",
            f"paths.output_root={tmp_path / 'out'}",
            f"paths.data_root={data_root}",
            "trainer.max_steps=2",
            "trainer.val_check_interval=1",
        ]
    )
    assert proc.returncode == 0, output(proc)[-3000:]
    meta = load_meta(data_root / "shakespeare_char")  # re-prepared: whole shards again, wherever they now lie
    rebuilt = data_root / "shakespeare_char" / meta["shard_dir"] / meta["shards"][0]["file"]
    assert rebuilt.stat().st_size == good_size


def test_a_crafted_meta_json_never_makes_training_delete_or_read_outside_the_data_folder(
    ws: Workspace, tmp_path, gptmini_train: Any
) -> None:
    """meta.json's shard_dir named the folder a re-preparation removed afterwards, and the files read as data."""
    data_root = tmp_path / "data"
    shutil.copytree(ws.data_root / "shakespeare_char", data_root / "shakespeare_char")
    victim = tmp_path / "victim"
    (victim / "inner").mkdir(parents=True)
    (victim / "precious.txt").write_text("keep me")
    (victim / "inner" / "shard_000000.bin").write_bytes(b"\x00" * 4096)
    meta_file = data_root / "shakespeare_char" / "meta.json"
    meta = json.loads(meta_file.read_text())
    meta["shard_dir"] = "../../victim"
    meta_file.write_text(json.dumps(meta))
    proc = gptmini_train(
        [
            *RUN,
            "run_name=crafted_meta",
            f"paths.output_root={tmp_path / 'out'}",
            f"paths.data_root={data_root}",
            "trainer.max_steps=1",
            "trainer.val_check_interval=1",
        ]
    )
    assert proc.returncode == 0, output(proc)[-3000:]  # re-prepared inside its own folder, then trained
    assert (victim / "precious.txt").read_text() == "keep me"
    assert (victim / "inner" / "shard_000000.bin").read_bytes() == b"\x00" * 4096
    rebuilt = json.loads(meta_file.read_text())["shard_dir"]
    assert (
        re.fullmatch(r"tokens-[0-9a-f]{12}", rebuilt) and (data_root / "shakespeare_char" / rebuilt).is_dir()
    )


def _together_args(tmp_path: Path, folder: Path) -> list[str]:
    return [
        *RUN,
        "run_name=together",
        f"paths.output_root={tmp_path / 'out'}",
        f"paths.data_root={tmp_path / 'data'}",
        f"hydra.run.dir={folder}",
        "trainer.max_steps=3",
        "trainer.val_check_interval=3",
    ]


def test_a_run_into_a_folder_a_live_process_holds_is_refused_and_changes_nothing(
    tmp_path, gptmini_train
) -> None:
    """The run folder's lock held by another live process (pid 1, as a run started a moment before holds it):
    one error line naming that process, exit 2, the lock left to its holder, nothing prepared or written. The race
    itself, two training processes started together, is test_two_runs_started_together_in_one_folder_never_both_train
    (slow: two processes); the lock's O_EXCL creation and its release are tests/unit/test_fileio.py's."""
    from gptmini.fileio import RUN_LOCK

    folder = tmp_path / "shared"
    folder.mkdir()
    (folder / RUN_LOCK).write_text("1\n")
    proc = gptmini_train(_together_args(tmp_path, folder))
    text = output(proc)
    assert proc.returncode == 2, text[-3000:]
    assert re.search(
        rf"^error: another gptmini run \(process 1\) is training in the run folder {re.escape(str(folder))}: wait "
        r"for it to end, or start this run in a folder of its own",
        text,
        re.M,
    ), text[-3000:]
    assert "Traceback" not in text and len(re.findall(r"\berror: ", text)) == 1
    assert sorted(p.name for p in folder.iterdir()) == [RUN_LOCK]
    assert (folder / RUN_LOCK).read_text() == "1\n"
    assert not (tmp_path / "data").exists()


# Slow: two training processes (each an interpreter start and a run); the fast suite keeps the refusal through the
# command (test_a_run_into_a_folder_a_live_process_holds_is_refused_and_changes_nothing) and the lock's own tests.
@pytest.mark.slow
def test_two_runs_started_together_in_one_folder_never_both_train(run_cli, tmp_path) -> None:
    """Both found the folder free and trained into it (two checkpoints, two event files, one log overwritten):
    the run folder is held by one run at a time (a lock file created with O_EXCL, removed when the run ends)."""
    from gptmini.data.prepare import prepare

    prepare("shakespeare", "char", tmp_path / "data" / "shakespeare_char")
    folder = tmp_path / "shared"
    args = _together_args(tmp_path, folder)
    procs = [
        run_cli.popen(run_cli.train_module, args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2], outs
    refused = outs[[p.returncode for p in procs].index(2)]
    assert re.search(
        r"error: (another gptmini run \(process \d+\) is training in the run folder \S*shared|the run folder \S*shared "
        r"already holds a run)",
        refused,
    ), refused
    assert "Traceback" not in refused
    assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == ["best.ckpt", "last.ckpt"]  # no -v1
    assert len(list((folder / "tb").rglob("events.out.tfevents.*"))) == 1
    assert not (folder / ".gptmini-run.lock").exists()  # released when the run ended
