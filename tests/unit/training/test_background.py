"""The background thread for logging work: jobs run in order off the training thread, are all done when fitting
ends (normally or not), a failing one is reported once and never stops the run, and without the callback a job
runs at once."""

from __future__ import annotations

import logging
import threading

import pytest

from gptmini.training.callbacks.background import BackgroundWork, submit


def test_jobs_run_in_order_on_one_background_thread_and_close_returns_when_done():
    work = BackgroundWork()
    gate = threading.Event()
    seen: list[tuple[int, str]] = []

    def job(i: int) -> None:
        gate.wait(5)
        seen.append((i, threading.current_thread().name))

    for i in range(5):
        submit(work, "job", lambda i=i: job(i))
    assert seen == []  # queued: the submitter did not wait for them
    gate.set()
    work.close()
    assert [i for i, _ in seen] == list(range(5))
    (thread,) = {name for _, name in seen}
    assert thread != threading.current_thread().name and thread.startswith("gptmini-logging")


@pytest.mark.parametrize("hook", ["teardown", "on_exception"])
def test_fitting_ends_only_after_every_job_is_done(hook):
    # Lightning closes the loggers right after these hooks: what was queued must have reached them
    work = BackgroundWork()
    done = []
    gate = threading.Event()
    work.submit("slow", lambda: gate.wait(5) and done.append(1))
    threading.Timer(0.2, gate.set).start()
    if hook == "teardown":
        work.teardown(None, None, "fit")
    else:
        work.on_exception(None, None, RuntimeError("boom"))
    assert done == [1]


def test_a_failing_job_is_reported_once_and_later_jobs_still_run(caplog):
    work = BackgroundWork()
    done = []

    def broken() -> None:
        raise RuntimeError("font not found")

    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            work.submit("attention maps", broken)
            work.submit("samples", lambda: done.append(1))
        work.close()
    reports = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert reports == [
        "background job 'attention maps' failed and is skipped; training goes on (reported once): "
        "RuntimeError: font not found"
    ]
    assert done == [1, 1, 1]


def test_a_full_queue_holds_the_submitter_until_a_job_is_done():
    work = BackgroundWork(max_pending=1)
    gate = threading.Event()
    work.submit("first", lambda: gate.wait(5))
    submitted = threading.Event()
    threading.Thread(target=lambda: (work.submit("second", lambda: None), submitted.set())).start()
    assert not submitted.wait(0.3)  # blocked behind the first job
    gate.set()
    assert submitted.wait(5)
    work.close()


def test_without_the_callback_a_job_runs_at_once_on_the_caller():
    seen = []
    submit(None, "job", lambda: seen.append(threading.current_thread()))
    assert seen == [threading.current_thread()]
    with pytest.raises(ValueError, match="max_pending=0 is invalid: it must be an integer >= 1"):
        BackgroundWork(max_pending=0)
