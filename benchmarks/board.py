"""The ATTENTION tab in a real browser: TensorBoard started on a log folder (127.0.0.1, a free port, bounded waits,
always stopped), headless Chromium through Selenium, the tab opened. Shared by the browser test
(tests/integration/test_attention_tab.py), the screenshot of the docs and the ``board`` benchmark section, which
measures the first render of a GPT-2-small summary (12 x 12 heads, 64 tokens) in the page and the own-text round
trip of the quick-start model on the CPU.

Needs Debian's ``chromium`` and ``chromium-driver`` (or any Chromium and matching chromedriver on PATH) and the
``selenium`` package (dev extras); :func:`browser_missing` says what is absent."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from gptmini.board import PLUGIN_NAME

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
TARGET_RENDER_MS = 1000.0  # first render of every head of a 12 x 12 model, after its data arrived
TARGET_TEXT_MS = 300.0  # own-text round trip, 64 tokens, the quick-start model on the CPU


def browser_missing() -> str | None:
    """Why the browser tests cannot run here (None: they can)."""
    if importlib.util.find_spec("selenium") is None:
        return "selenium is not installed (pip install -e '.[dev]')"
    if not any(shutil.which(b) for b in BROWSERS):
        return "no Chromium browser on PATH (Debian: apt-get install chromium chromium-driver)"
    if not shutil.which("chromedriver"):
        return "no chromedriver on PATH (Debian: apt-get install chromium-driver)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, timeout: float = 10.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def post_json(url: str, body: Any, timeout: float = 30.0) -> tuple[int, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@contextlib.contextmanager
def tensorboard(
    logdir: str | Path, timeout: float = 60.0, env: dict[str, str] | None = None
) -> Iterator[str]:
    """TensorBoard serving ``logdir`` on 127.0.0.1 until the block ends; yields its base URL once the ATTENTION
    tab is listed as enabled. Raises RuntimeError with TensorBoard's output when it does not get there within
    ``timeout`` seconds. The process is always stopped."""
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="gptmini-tensorboard-", suffix=".log", delete=False)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensorboard.main",
            f"--logdir={logdir}",
            "--host=127.0.0.1",
            f"--port={port}",
            "--reload_interval=1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"TensorBoard exited with {proc.returncode}: {_tail(log.name)}")
            with contextlib.suppress(OSError, ValueError):
                if get_json(f"{url}/data/plugins_listing", timeout=5).get(PLUGIN_NAME, {}).get("enabled"):
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the ATTENTION tab was not enabled within {timeout:.0f} s: {_tail(log.name)}"
                )
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()
        os.unlink(log.name)


def _tail(path: str, n: int = 3000) -> str:
    return Path(path).read_text(errors="replace")[-n:]


@contextlib.contextmanager
def chrome(width: int = 1500, height: int = 1000) -> Iterator[Any]:
    """A headless Chromium driven by Selenium (the system's browser and chromedriver: nothing is downloaded)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = next(shutil.which(b) for b in BROWSERS if shutil.which(b))
    for arg in (
        "--headless=new",
        "--no-sandbox",  # containers and root users
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
        "--force-device-scale-factor=1",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    driver.set_page_load_timeout(30)
    driver.set_script_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def open_tab(driver: Any, url: str, timeout: float = 30.0) -> None:
    """Opens TensorBoard at ``url``, clicks the ATTENTION tab and switches into its frame once it has drawn."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(f"{url}/#{PLUGIN_NAME}")
    wait = WebDriverWait(driver, timeout)
    frame = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "iframe")))
    driver.switch_to.frame(frame)
    wait_drawn(driver, timeout=timeout)


def wait_drawn(driver: Any, after: int = 0, timeout: float = 30.0) -> int:
    """Waits until the tab has drawn more than ``after`` times; returns its draw count."""
    from selenium.webdriver.support.ui import WebDriverWait

    def drawn(d: Any) -> int | bool:
        n = d.execute_script("return Number(document.body.dataset.rendered || 0)")
        return n if n > after else False

    return WebDriverWait(driver, timeout).until(drawn)


def screenshot(driver: Any, path: str | Path) -> Path:
    """The whole page as a PNG (the frame's content included)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    driver.switch_to.default_content()
    driver.save_screenshot(str(path))
    return path


# --- the benchmark -----------------------------------------------------------------------------------------------


def write_gpt2_small_run(logdir: Path, steps: int = 3, t: int = 64, seed: int = 0) -> Path:
    """A run whose summaries are what a GPT-2-small run (12 x 12 heads) writes on a ``t``-token probe: a GPT-2
    small initialised at random (the maps cost the browser the same whatever the weights)."""
    import torch
    from torch.utils.tensorboard import SummaryWriter

    from gptmini.board.summary import summary_proto
    from gptmini.insight.scores import head_types
    from gptmini.model import GPT, GPTConfig
    from gptmini.training.board import probe_summary

    torch.manual_seed(seed)
    model = GPT(GPTConfig.from_preset("gpt2", vocab_size=50257))
    ids = torch.randint(0, 50257, (t,)).tolist()
    scores = {
        k: torch.rand(12, 12) for k in ("previous_token", "induction", "first_token", "duplicate_token")
    } | {"mean_distance": 10 * torch.rand(12, 12)}
    writer = SummaryWriter(str(logdir / "gpt2_small" / "tb"))
    sizes = []
    for step in range(1, steps + 1):
        summary = probe_summary(model, ids, [f" tok{i}" for i in ids], scores)
        assert summary.head_types == head_types(scores)
        proto = summary_proto(summary)
        sizes.append(proto.ByteSize())
        writer.file_writer.add_summary(proto, step * 100)
    writer.close()
    return logdir / "gpt2_small" / "tb"


def event_bytes_per_step(logdir: Path, steps: int = 3) -> float:
    """Bytes the event files of ``logdir`` grew by per logged step (what one validation adds on disk)."""
    files = list(logdir.rglob("events.out.tfevents.*"))
    return sum(f.stat().st_size for f in files) / steps


def bench_board(opts: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """Event bytes per logged step and the first render of a GPT-2-small summary in the tab (median of
    ``repeats`` page loads), and the own-text round trip with the quick-start model on the CPU."""
    from gptmini.model import GPTConfig

    rows: list[dict[str, Any]] = []
    repeats = 2 if opts.quick else 5
    with tempfile.TemporaryDirectory(prefix="gptmini-bench-board-") as tmp:
        root = Path(tmp)
        write_gpt2_small_run(root / "render")
        size = event_bytes_per_step(root / "render")
        rows.append(
            {
                "what": "event bytes per logged step (GPT-2 small, 64 tokens)",
                "value": size / 2**20,
                "unit": "MiB",
                "target": 2.0,
                "met": size <= 2 * 2**20,
            }
        )
        missing = browser_missing()
        if missing is None:
            with tensorboard(root / "render") as url, chrome() as driver:
                times = []
                for _ in range(repeats):
                    open_tab(driver, url)
                    times.append(driver.execute_script("return window.gptminiAttention.timings[0].ms"))
                    driver.switch_to.default_content()
            render = statistics.median(times)
            rows.append(
                {
                    "what": "first render, model view of 12 x 12 heads, 64 tokens (page, after data)",
                    "value": render,
                    "unit": "ms",
                    "target": TARGET_RENDER_MS,
                    "met": render <= TARGET_RENDER_MS,
                }
            )
        # own text: the quick-start model (conf/model/small.yaml, GPT-2 BPE) from a checkpoint, 64 tokens
        config = GPTConfig.from_preset("small", vocab_size=50257)
        run = _checkpointed_run(root / "text", config)
        with tensorboard(root / "text") as url:
            text = " ".join(["word"] * 64)
            first = _round_trip(url, run, text)
            times = [_round_trip(url, run, text) for _ in range(10 if not opts.quick else 3)]
        median = statistics.median(times)
        rows.append(
            {
                "what": "own-text round trip, 64 tokens, quick-start model, CPU (cached model)",
                "value": median,
                "unit": "ms",
                "target": TARGET_TEXT_MS,
                "met": median <= TARGET_TEXT_MS,
            }
        )
        rows.append(
            {
                "what": "own-text first request (loads the checkpoint)",
                "value": first,
                "unit": "ms",
                "target": None,
                "met": None,
            }
        )
    notes = [
        "render: performance.now() in the page from the decoded summary to the next animation frame after the "
        "model view's 144 maps are drawn; median of page loads",
        "own text: HTTP POST to the tab's text route and its JSON answer, as the page sends it (urllib); median "
        "of requests after the first, which loads the checkpoint with weights_only on the CPU",
    ]
    if browser_missing():
        notes.append(f"no render timing: {browser_missing()}")
    return rows, notes


def _checkpointed_run(logdir: Path, config: Any) -> str:
    """A run folder laid out as training writes one: an attention summary in tb/ and checkpoints/last.ckpt."""
    import torch
    from torch.utils.tensorboard import SummaryWriter

    from gptmini.board.summary import AttentionSummary, summary_proto
    from gptmini.checkpoint import atomic_save
    from gptmini.model import GPT

    torch.manual_seed(0)
    model = GPT(config)
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    hyper = {"model_config": config.to_dict(), "run_config": {"tokenizer": {"name": "gpt2"}}}
    (logdir / "quick" / "checkpoints").mkdir(parents=True)
    atomic_save(
        {"state_dict": state, "hyper_parameters": hyper, "global_step": 1},
        logdir / "quick" / "checkpoints" / "last.ckpt",
    )
    writer = SummaryWriter(str(logdir / "quick" / "tb"))
    probs = np.tril(np.ones((config.n_layer, config.n_head, 4, 4), dtype=np.float32))
    writer.file_writer.add_summary(
        summary_proto(AttentionSummary(list("abcd"), probs / probs.sum(-1, keepdims=True))), 1
    )
    writer.close()
    return "quick/tb"


def _round_trip(url: str, run: str, text: str) -> float:
    t0 = time.perf_counter()
    code, body = post_json(f"{url}/data/plugin/{PLUGIN_NAME}/text", {"run": run, "text": text})
    elapsed = (time.perf_counter() - t0) * 1e3
    if code != 200:
        raise RuntimeError(f"own text failed: HTTP {code}: {body}")
    return elapsed
