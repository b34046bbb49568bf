"""The run folder's lock (``gptmini.fileio.hold_folder``) and the filesystem's name limits."""

from __future__ import annotations

import os
import subprocess
import sys

from gptmini.fileio import RUN_LOCK, hold_folder, name_too_long


def test_a_folder_is_held_by_one_live_process_and_a_stale_lock_is_taken_over(tmp_path) -> None:
    # held by a live process (pid 1): refused, naming it
    (tmp_path / RUN_LOCK).write_text("1\n")
    assert hold_folder(tmp_path) == 1
    assert (tmp_path / RUN_LOCK).read_text() == "1\n"
    # held by a process that is gone: taken over
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (tmp_path / RUN_LOCK).write_text(f"{gone.pid}\n")
    assert hold_folder(tmp_path) is None
    assert (tmp_path / RUN_LOCK).read_text() == f"{os.getpid()}\n"
    assert hold_folder(tmp_path) is None  # this process holds it already
    # released when the holder exits; a new folder is created with its lock
    child = tmp_path / "child"
    code = f"from gptmini.fileio import hold_folder; assert hold_folder({str(child)!r}) is None"
    subprocess.run([sys.executable, "-c", code], check=True)
    assert child.is_dir() and not (child / RUN_LOCK).exists()


def test_names_over_the_filesystem_limit_are_named_without_touching_them(tmp_path) -> None:
    assert name_too_long(tmp_path / ("x" * 255)) is None
    assert "is 256 bytes long, over the filesystem's limit of 255" in name_too_long(tmp_path / ("x" * 256))
    assert "over the filesystem's limit of 4095" in name_too_long("/".join(["y" * 200] * 21))


def test_clean_up_removes_only_this_hosts_temp_files_of_a_process_that_is_gone(tmp_path) -> None:
    from gptmini.fileio import host_identity, remove_stale_temp_files, temp_name

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    host = host_identity()
    stale = tmp_path / f".last.ckpt.{gone.pid}@{host}.0123abcd.tmp"
    kept = [
        tmp_path / f".last.ckpt.{gone.pid}@other-{host}.0123abcd.tmp",  # another machine on shared storage
        tmp_path / f".last.ckpt.1@{host}.0123abcd.tmp",  # a live process: a save in progress
        tmp_path / f".last.ckpt.{gone.pid}.0123abcd.tmp",  # no host: not a name gptmini writes
        tmp_path / ".thesis.ckpt.424242.draft.tmp",  # a user's file
    ]
    for path in [stale, *kept]:
        path.write_text("x")
    assert remove_stale_temp_files(tmp_path) == [stale]
    assert all(p.exists() for p in kept) and not stale.exists()
    # what atomic writes name their temp files: this process, this host
    name = temp_name(tmp_path / "last.ckpt").name
    assert name.startswith(f".last.ckpt.{os.getpid()}@{host}.") and name.endswith(".tmp")
