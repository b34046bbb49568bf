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

from benchmarks.common import preset_config
from gptmini.board import PLUGIN_NAME

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
TARGET_RENDER_MS = 1000.0  # first render of every head of a 12 x 12 model, after its data arrived
TARGET_TEXT_MS = 300.0
BOARD_COLUMNS = [
    "what",
    "value",
    "unit",
    "target",
    "met",
]  # own-text round trip, 64 tokens, the quick-start model on the CPU


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
            listing = None
            with contextlib.suppress(OSError, ValueError):
                listing = get_json(f"{url}/data/plugins_listing", timeout=5)
            if listing is not None and PLUGIN_NAME not in listing:
                raise RuntimeError(
                    f"TensorBoard has no {PLUGIN_NAME} plugin: gptmini's tensorboard_plugins entry point is not "
                    "registered in this environment (pip install -e . registers it)"
                )
            if listing is not None and listing[PLUGIN_NAME].get("enabled"):
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


def write_summary_run(logdir: Path, config: Any, t: int = 64, steps: int = 3, seed: int = 0) -> Path:
    """A run whose summaries are what a run of ``config`` writes on a ``t``-token probe at ``steps`` validations
    (the model initialised at random: the maps cost the browser the same whatever the weights)."""
    import torch
    from torch.utils.tensorboard import SummaryWriter

    from gptmini.board.summary import summary_proto
    from gptmini.model import GPT

    torch.manual_seed(seed)
    model = GPT(config)
    ids = torch.randint(0, config.vocab_size, (t,)).tolist()
    writer = SummaryWriter(str(logdir / "run" / "tb"))
    for step in range(1, steps + 1):
        summary = probe_summary(model, ids, [f" tok{i}" for i in ids], _scores(config))
        writer.file_writer.add_summary(summary_proto(summary), step * 100)
    writer.close()
    return logdir / "run" / "tb"


def probe_summary(model: Any, ids: list[int], tokens: list[str], scores: dict[str, Any]) -> Any:
    """The attention of ``model`` (a GPT) on ``ids`` as the summary callback writes it."""
    import torch

    from gptmini.training.callbacks.summary_logging import attention_summary
    from gptmini.training.loop.probe import eval_mode

    with eval_mode(model), torch.no_grad():
        maps = model.attention_maps(torch.tensor([ids], dtype=torch.long))[:, 0]
    return attention_summary(maps, tokens, scores)


def _scores(config: Any) -> dict[str, Any]:
    import torch

    shape = (config.n_layer, config.n_head)
    return {
        "previous_token": torch.rand(shape),
        "induction": torch.rand(shape),
        "first_token": torch.rand(shape),
        "mean_distance": 10 * torch.rand(shape),
    }


def event_bytes_per_step(logdir: Path, steps: int = 3) -> float:
    """Bytes the event files of ``logdir`` grew by per logged step (what one validation adds on disk)."""
    files = list(logdir.rglob("events.out.tfevents.*"))
    return sum(f.stat().st_size for f in files) / steps


def bench_board(opts: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """Event bytes per logged step and the first render of a GPT-2-small summary (12 x 12 heads, 64 tokens) in
    the tab (median of page loads), the summary's share of training time on the quick start, and the own-text
    round trip with the quick-start model on the CPU. ``--quick``: tiny shapes, no browser."""
    from gptmini.model import GPTConfig

    if opts.quick:
        big = small = GPTConfig(vocab_size=50257, block_size=16, n_layer=2, n_head=2, n_embd=16)
        t, name, small_name = 16, "tiny (2 x 2 heads, 16 tokens)", "tiny"
    else:
        big = preset_config("gpt2", vocab_size=50257)
        small = preset_config("small", vocab_size=50257)
        t, name, small_name = (
            64,
            "GPT-2 small (12 x 12 heads, 64 tokens)",
            "quick start (conf/model/small.yaml)",
        )
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gptmini-bench-board-") as tmp:
        root = Path(tmp)
        write_summary_run(root / "render", big, t)
        size = event_bytes_per_step(root / "render")
        rows.append(_row(f"event bytes per logged step, {name}", size / 2**20, "MiB", 2.0))
        missing = "--quick" if opts.quick else browser_missing()
        if missing is None:
            with tensorboard(root / "render") as url, chrome() as driver:
                times = []
                for _ in range(5):
                    open_tab(driver, url)
                    times.append(driver.execute_script("return window.gptminiAttention.timings[0].ms"))
                    driver.switch_to.default_content()
            rows.append(
                _row(
                    f"first render of every head, model view, {name}",
                    statistics.median(times),
                    "ms",
                    TARGET_RENDER_MS,
                )
            )
        else:
            notes.append(f"no render timing: {missing}")
        rows.append(_validation_share(opts, small, small_name, root / "share"))
        run = _checkpointed_run(root / "text", small)
        text = " ".join(["word"] * min(64, small.block_size))
        # --quick: TensorBoard's WSGI app in this process (no server to start, torch already imported)
        with (
            contextlib.nullcontext(_in_process(root / "text"))
            if opts.quick
            else tensorboard(root / "text") as url
        ):
            first = _round_trip(url, run, text)
            times = [_round_trip(url, run, text) for _ in range(3 if opts.quick else 10)]
        rows.append(
            _row(
                f"own-text round trip, {min(64, small.block_size)} tokens, {small_name}, CPU",
                statistics.median(times),
                "ms",
                TARGET_TEXT_MS,
            )
        )
        rows.append(_row("own-text first request (loads the checkpoint)", first, "ms", None))
    notes += [
        "event bytes: growth of the event file per logged step (one attention summary: uint8 over the causal "
        "triangle of every head, tokens, head types and scores)",
        "render: performance.now() in the page, from the decoded summary to the next animation frame after the "
        "model view's maps are drawn; median of 5 page loads in headless Chromium",
        "share: one summary (the probe through the explicit attention path, quantised, written and flushed) "
        "against 100 training steps (the quick start validates every 100 steps), interleaved; median",
        "own text: HTTP POST to the tab's text route and its JSON answer (urllib), median of the requests after "
        "the first, which loads the checkpoint (weights_only, CPU) and caches the model",
    ]
    return rows, notes


def _row(what: str, value: float, unit: str, target: float | None) -> dict[str, Any]:
    return {
        "what": what,
        "value": round(value, 3),
        "unit": unit,
        "target": target,
        "met": None if target is None else value <= target,
    }


def _validation_share(
    opts: Any, config: Any, name: str, logdir: Path, val_every: int = 100
) -> dict[str, Any]:
    """What the summary adds to a validation of the quick start (batch 8, validation every 100 steps): the probe
    (64 tokens, or the context) through the explicit attention path, quantised and written, against the training
    between two validations (training steps and summaries interleaved)."""
    import torch
    from torch.utils.tensorboard import SummaryWriter

    from benchmarks.training import TrainSetup, _batches, run_bare_loop
    from gptmini.board.summary import summary_proto
    from gptmini.model import GPT

    setup = TrainSetup(model=config, batch=8)
    torch.manual_seed(opts.seed)
    model = GPT(config)
    ids = torch.randint(0, config.vocab_size, (min(64, config.block_size),)).tolist()
    scores = _scores(config)
    writer = SummaryWriter(str(logdir))

    def summary_pass(step: int) -> float:
        t0 = time.perf_counter()
        proto = summary_proto(probe_summary(model, ids, [str(i) for i in ids], scores))
        writer.file_writer.add_summary(proto, step)
        writer.flush()
        return time.perf_counter() - t0

    summary_pass(0)  # warm-up
    run_bare_loop(model, _batches(setup, 2, "cpu", opts.seed), setup, "cpu")
    step_times, pass_times = [], []
    for r in range(2 if opts.quick else 3):
        ends = run_bare_loop(model, _batches(setup, 6, "cpu", opts.seed + r), setup, "cpu")
        step_times += [b - a for a, b in zip(ends[:-1], ends[1:], strict=True)]
        pass_times.append(summary_pass(r + 1))
    writer.close()
    step, pass_s = statistics.median(step_times), statistics.median(pass_times)
    share = pass_s / (val_every * step)
    return _row(
        f"summary's share of training, {name}: {pass_s * 1e3:.1f} ms per validation vs {val_every} steps of "
        f"{step * 1e3:.0f} ms",
        100 * share,
        "%",
        5.0,
    )


def _checkpointed_run(logdir: Path, config: Any) -> str:
    """A run folder laid out as training writes one: an attention summary in tb/ and checkpoints/last.ckpt."""
    import torch
    from torch.utils.tensorboard import SummaryWriter

    from gptmini.board.summary import AttentionSummary, summary_proto
    from gptmini.model import GPT
    from gptmini.runs.checkpoint import atomic_save

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


def _in_process(logdir: Path) -> Any:
    """A werkzeug test client of TensorBoard's WSGI app with this plugin alone, over ``logdir``."""
    from tensorboard.backend import application
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from werkzeug.test import Client

    from gptmini.board.plugin import AttentionLoader

    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(logdir))
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, str(logdir))
    context = base_plugin.TBContext(data_provider=provider, logdir=str(logdir), sampling_hints={})
    return Client(application.TensorBoardWSGI([AttentionLoader().load(context)], data_provider=provider))


def _round_trip(url: Any, run: str, text: str) -> float:
    """One own-text request: ``url`` is a server's base URL, or a werkzeug test client."""
    t0 = time.perf_counter()
    route, body = f"/data/plugin/{PLUGIN_NAME}/text", {"run": run, "text": text}
    if isinstance(url, str):
        code, body = post_json(url + route, body)
    else:
        response = url.post(route, data=json.dumps(body), content_type="application/json")
        code, body = response.status_code, response.get_json()
    elapsed = (time.perf_counter() - t0) * 1e3
    if code != 200:
        raise RuntimeError(f"own text failed: HTTP {code}: {body}")
    return elapsed
