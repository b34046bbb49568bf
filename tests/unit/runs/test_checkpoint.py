"""Checkpoint files (gptmini/runs/checkpoint.py): the checksum written at save time and verified at load, one clear
error for a file that is not a checkpoint, saves that fail (full disk) keeping the previous file, settings that
disagree with the tensors, the data a checkpoint records, and the one rule for which file ``last`` means."""

from __future__ import annotations

import errno
import json
import os
import re
import zipfile
from pathlib import Path

import pytest
import torch

from gptmini.runs import checkpoint
from gptmini.runs.checkpoint import CheckpointError, atomic_save, load_checkpoint
from gptmini.runs.loading import open_run
from gptmini.runs.record import read_record

# The checksum's entry in a checkpoint (read through the module: a test then fails, not its import, without it).
CHECKSUM_KEY = "gptmini_checksum"


def _overwrite_inside_tensor(path: Path, tensor: int = 0, nbytes: int = 16) -> None:
    """Overwrites bytes in the middle of one tensor's storage inside the zip, as disk damage would: the archive
    still opens, and torch.load returns the damaged values without complaint."""
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(f"/data/{tensor}"))
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    with open(path, "r+b") as f:
        f.seek(start + info.file_size // 2)
        f.write(b"\xff" * nbytes)


# --- checksums --------------------------------------------------------------------------------------------


def test_a_saved_checkpoint_carries_the_checksum_of_its_tensors(tmp_path, write_checkpoint):
    path = write_checkpoint(tmp_path / "last.ckpt")
    raw = torch.load(path, weights_only=True)  # plain data: loads with weights_only=True
    record = raw[CHECKSUM_KEY]
    assert record["algorithm"] == "sha256" and len(record["digest"]) == 64
    assert record["tensors"] == len(raw["state_dict"]) and checkpoint.CHECKSUM_KEY == CHECKSUM_KEY
    load_checkpoint(path)  # verifies


def test_damage_inside_a_checkpoint_is_refused_naming_the_file(tmp_path, write_checkpoint):
    path = write_checkpoint(tmp_path / "last.ckpt")
    _overwrite_inside_tensor(path)
    torch.load(path, weights_only=True)  # the damage itself goes unnoticed by torch
    for load in (load_checkpoint, lambda p: open_run(p, "cpu", tokenizer=False)):
        with pytest.raises(
            CheckpointError, match=rf"{re.escape(str(path))} is damaged: its tensors .* do not match"
        ):
            load(path)


def _edit_record(ckpt: dict, edit: dict) -> None:
    """Sets fields of the checkpoint's run record (one level deep), as a hand edit would."""
    record = json.loads(ckpt["hyper_parameters"]["run_record"])
    for key, value in edit.items():
        record[key] = record[key] | value if isinstance(value, dict) else value
    ckpt["hyper_parameters"]["run_record"] = json.dumps(record)


@pytest.mark.parametrize(
    "edit",
    [
        {"model": {"n_head": 1}},  # the same tensors read as another model
        {"model": {"position": "rope"}},
        {"seed": 7},
    ],
    ids=["n_head", "position", "seed"],
)
def test_an_edited_setting_is_refused_like_damaged_tensors(tmp_path, write_checkpoint, edit):
    """The checksum covers the settings (hyper_parameters) too: editing one and saving the file again without
    the checksum (as a hand edit does) is refused at load, naming the file."""
    path = write_checkpoint(tmp_path / "last.ckpt")
    raw = torch.load(path, weights_only=True)
    _edit_record(raw, edit)
    torch.save(raw, path)
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(path))} was modified: its settings"):
        load_checkpoint(path)
    # an older checksum that covered the tensors only still verifies them and loads
    del raw[CHECKSUM_KEY]["settings_digest"]
    torch.save(raw, path)
    load_checkpoint(path)


def test_a_checkpoint_without_a_checksum_still_loads(tmp_path, write_checkpoint, caplog):
    path = write_checkpoint(tmp_path / "old.ckpt")
    raw = torch.load(path, weights_only=True)
    del raw[CHECKSUM_KEY]
    torch.save(raw, path)
    load_checkpoint(path)
    assert "carries no checksum" in caplog.text


# --- files that are not checkpoints (item 4) --------------------------------------------------------------


@pytest.mark.parametrize("kind", ["random_bytes", "text", "truncated", "empty", "zip_of_other_things"])
def test_a_file_that_is_not_a_checkpoint_is_one_clear_error(kind, tmp_path, write_checkpoint):
    path = tmp_path / "model.ckpt"
    if kind == "random_bytes":
        path.write_bytes(os.urandom(5000))
    elif kind == "text":
        path.write_text("ROMEO:\nBut soft, what light through yonder window breaks?\n" * 20)
    elif kind == "truncated":
        data = write_checkpoint(tmp_path / "good.ckpt").read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif kind == "empty":
        path.write_bytes(b"")
    else:
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("notes.txt", "hello")
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(path))} is not a gptmini checkpoint \("):
        load_checkpoint(path)


# --- failed saves (item 5) --------------------------------------------------------------------------------


def test_a_full_disk_during_a_save_keeps_the_previous_checkpoint_and_says_so(tmp_path, write_checkpoint):
    path = write_checkpoint(tmp_path / "last.ckpt", global_step=5)
    before = path.read_bytes()

    class FullDisk:  # 1,000 bytes left: torch.save's zip writer fails with a RuntimeError over the OSError
        def __init__(self, f):
            self.f, self.room = f, 1000

        def write(self, data):
            if len(data) > self.room:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            self.room -= len(data)
            return self.f.write(data)

        def flush(self):
            self.f.flush()

    def disk_full(checkpoint, f):
        torch.save(checkpoint, FullDisk(f))

    with pytest.raises(checkpoint.CheckpointSaveError) as info:
        atomic_save({"state_dict": {"w": torch.zeros(10_000)}, "global_step": 10}, path, write=disk_full)
    assert re.fullmatch(
        rf"could not save checkpoint {re.escape(str(path))}: No space left on device; the previous last\.ckpt "
        r"\(step 5\) is kept unchanged\. Free disk space or make \S+ writable, then resume with ckpt_path=last",
        str(info.value),
    ), info.value
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # no temp file left


def test_an_unwritable_checkpoint_folder_is_a_save_error(tmp_path):
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("")
    with pytest.raises(
        checkpoint.CheckpointSaveError, match=r"could not save checkpoint .*; no last\.ckpt was written"
    ):
        atomic_save({"state_dict": {}}, blocker / "checkpoints" / "last.ckpt")


# --- settings that disagree with the tensors (item 9) -----------------------------------------------------


def test_settings_that_disagree_with_the_tensors_are_one_clear_error(tmp_path, write_checkpoint):
    path = write_checkpoint(tmp_path / "edited.ckpt", n_embd=8)
    raw = torch.load(path, weights_only=True)
    _edit_record(raw, {"model": {"n_embd": 16}})
    atomic_save({k: v for k, v in raw.items() if k != CHECKSUM_KEY}, path)  # a consistent checksum
    with pytest.raises(
        CheckpointError,
        match=r"edited\.ckpt is inconsistent: its saved model settings \(n_layer=1, n_embd=16, .*\) disagree "
        r"with its tensors \(wte\.weight is \[64, 8\] but the settings need \[64, 16\]",
    ):
        open_run(path, "cpu", tokenizer=False)


# --- the data a checkpoint was trained on (item 2) --------------------------------------------------------


def test_a_checkpoint_records_its_data_and_refuses_other_data(tmp_path, write_checkpoint):
    from gptmini.data.prepare import prepare

    folder = tmp_path / "data"
    prepare(str(_corpus(tmp_path / "a.txt", "to be or not to be\n" * 300)), "char", folder)
    path = write_checkpoint(tmp_path / "last.ckpt", data_dir=folder)
    ckpt = read_record(load_checkpoint(path)).data_identity
    assert checkpoint.check_trained_data(path, ckpt, folder) is None
    # Same characters, other text: other data, same tokenizer.
    prepare(str(_corpus(tmp_path / "b.txt", "not to be or to be\n" * 300)), "char", folder)
    with pytest.raises(CheckpointError, match=r"holds other data than checkpoint .* was trained on: .*: FIX"):
        checkpoint.check_trained_data(path, ckpt, folder, fix="FIX")
    assert "holds other data" in checkpoint.check_trained_data(path, ckpt, folder, other_data="warn")
    assert checkpoint.check_trained_data(path, ckpt, folder, other_data="allow") is None
    # Other characters: another vocabulary, refused whatever other_data says.
    prepare(str(_corpus(tmp_path / "c.txt", "ROMEO: hello\n" * 300)), "char", folder)
    with pytest.raises(
        CheckpointError, match=r"is tokenized differently .* its token ids would mean other text"
    ):
        checkpoint.check_trained_data(path, ckpt, folder, other_data="allow")


def _corpus(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# --- which file "last" means (item 8) ---------------------------------------------------------------------


def _touch(path: Path, mtime: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    os.utime(path, (mtime, mtime))
    return path


def test_last_is_one_rule_for_every_command_multirun_jobs_included(tmp_path, monkeypatch, write_checkpoint):
    from gptmini.runs.discovery import newest_checkpoint, resolve_checkpoint
    from gptmini.training.run.resume import resolve_ckpt_path

    out = tmp_path / "outputs"
    _touch(out / "exp" / "2026-01-01_10-00-00_000000" / "checkpoints" / "last.ckpt", 1000)
    # the commands' "last" opens it: a checkpoint that loads (a damaged one is skipped)
    top = write_checkpoint(out / "exp" / "2026-01-01_11-00-00_000000" / "checkpoints" / "on_exception.ckpt")
    os.utime(top, (2000, 2000))
    job = out / "exp" / "multirun_2026-01-01_12-00-00" / "model.n_head=2" / "checkpoints"
    _touch(job / "last.ckpt", 3000)
    # a multirun job interrupted after its last periodic save
    newest = _touch(job / "on_exception.ckpt", 4000)
    _touch(job / ".last.ckpt.123.abcd1234.tmp", 5000)  # a killed save's temp file: never a candidate
    _touch(out / "exp" / "2026-01-01_10-00-00_000000" / "checkpoints" / "best.ckpt", 6000)  # not "last"

    assert newest_checkpoint(out, "exp") == newest
    assert resolve_ckpt_path("last", tmp_path / "new", out, "exp") == str(newest)  # ckpt_path=last
    monkeypatch.chdir(tmp_path)
    # --ckpt last in the commands: the newest run outside the sweeps (tests/unit/test_runs.py)
    assert resolve_checkpoint("last") == Path("outputs") / top.relative_to(out)
    # A newer run of another run_name is "last" for the commands that take no run_name, not for ckpt_path=last.
    other = _touch(out / "other" / "2026-01-02_00-00-00_000000" / "checkpoints" / "last.ckpt", 7000)
    assert newest_checkpoint(out) == other and newest_checkpoint(out, "exp") == newest
    assert newest_checkpoint(tmp_path / "nothing", "exp") is None
    with pytest.raises(CheckpointError, match=r"no last\.ckpt or on_exception\.ckpt found under nowhere/"):
        resolve_checkpoint("last", "nowhere")


@pytest.mark.parametrize("tie", [True, False])
def test_a_tied_output_layer_is_written_once_after_the_background_copy(tmp_path, tie):
    """Lightning's background save copies every tensor on its own: the tied output layer (the token embedding)
    is stored once all the same, and loads back equal under both names; an untied one keeps its own tensor."""
    from gptmini.model import GPT, GPTConfig

    torch.manual_seed(0)
    config = GPTConfig(block_size=8, n_layer=1, n_head=2, n_embd=16, vocab_size=2048, tie_weights=tie)
    model = GPT(config)
    state = {f"model.{k}": v.detach().clone() for k, v in model.state_dict().items()}  # as the copy does
    embedding = state["model.wte.weight"]
    assert state["model.lm_head.weight"] is not embedding
    atomic_save({"state_dict": state, "hyper_parameters": {"model": config.to_dict()}}, tmp_path / "a.ckpt")
    loaded = load_checkpoint(tmp_path / "a.ckpt")["state_dict"]
    torch.testing.assert_close(loaded["model.wte.weight"], embedding, rtol=0, atol=0)
    torch.testing.assert_close(loaded["model.lm_head.weight"], state["model.lm_head.weight"], rtol=0, atol=0)
    tensors = sum(v.numel() * v.element_size() for v in state.values())
    size = (tmp_path / "a.ckpt").stat().st_size
    if tie:  # the embedding (2048 x 16 floats, 128 KiB) once
        assert size < tensors - embedding.numel() * embedding.element_size() + 16_000
        assert loaded["model.lm_head.weight"].untyped_storage().data_ptr() == (
            loaded["model.wte.weight"].untyped_storage().data_ptr()
        )
    else:
        assert size > tensors
