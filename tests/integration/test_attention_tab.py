"""The ATTENTION tab in a real browser: TensorBoard started on two runs whose summaries hold known attention
patterns, the tab opened in headless Chromium. The head view draws one line per attention weight of a head (so a
previous-token pattern draws one line per token, a uniform one a line per causal pair), the step slider changes
what is drawn, hovering a token keeps its lines alone, a second run shows side by side, own text runs the run's
checkpoint, and the view exports as SVG and PNG.

Runs whenever Chromium, chromedriver and selenium are installed (Debian: apt-get install chromium
chromium-driver; pip install -e '.[dev]'), else is skipped with the reason."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.board import browser_missing, chrome, open_tab, tensorboard, wait_drawn

pytestmark = pytest.mark.skipif(browser_missing() is not None, reason=f"browser test: {browser_missing()}")

T = 6
TOKENS = ["ROM", "EO", ":", " But", " soft", ","]


def previous_token(n_layer: int, n_head: int) -> np.ndarray:
    maps = np.zeros((n_layer, n_head, T, T), dtype=np.float32)
    maps[..., 0, 0] = 1.0
    for i in range(1, T):
        maps[..., i, i - 1] = 1.0
    return maps


def uniform(n_layer: int, n_head: int) -> np.ndarray:
    maps = np.tril(np.ones((T, T), dtype=np.float32))
    return np.broadcast_to(maps / maps.sum(-1, keepdims=True), (n_layer, n_head, T, T)).copy()


@pytest.fixture(scope="module")
def logdir(tmp_path_factory, write_checkpoint):
    """ "a/tb": previous-token attention at step 10, uniform at step 20, and a checkpoint; "b/tb": uniform at
    step 10 only, no checkpoint. 2 layers x 3 heads."""
    from torch.utils.tensorboard import SummaryWriter

    from gptmini.board.summary import AttentionSummary, summary_proto

    root = tmp_path_factory.mktemp("board")
    types = [["previous-token", "local", "other"], ["first-token", "induction", "other"]]
    for run, patterns in (("a", {10: previous_token, 20: uniform}), ("b", {10: uniform})):
        writer = SummaryWriter(str(root / run / "tb"))
        for step, pattern in patterns.items():
            summary = AttentionSummary(TOKENS, pattern(2, 3), types)
            writer.file_writer.add_summary(summary_proto(summary), step)
        writer.close()
    write_checkpoint(
        root / "a" / "checkpoints" / "last.ckpt",
        vocab_size=50257,
        block_size=16,
        n_layer=2,
        n_head=3,
        n_embd=6,
        global_step=20,
    )
    return root


def _count(driver, css: str) -> int:
    return driver.execute_script(f"return document.querySelectorAll({css!r}).length")


def _visible_lines(driver) -> int:
    return driver.execute_script(
        "return [...document.querySelectorAll('svg.headview line')].filter(l => l.style.display !== 'none').length"
    )


def test_the_tab_draws_scrubs_compares_and_takes_your_text(logdir, repo_root):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    from gptmini.data.tokenizers import build_tokenizer

    with tensorboard(logdir, env={"PYTHONPATH": str(repo_root)}) as url, chrome() as driver:
        open_tab(driver, url)
        # the model view: every head of the latest step (20) of the first run, labelled by type
        assert _count(driver, ".cell canvas.map") == 6
        labels = [e.text for e in driver.find_elements(By.CSS_SELECTOR, ".cell .type")]
        assert labels == ["previous token", "local", "other", "first token (sink)", "induction", "other"]
        assert "step 20" in driver.find_element(By.CSS_SELECTOR, ".step-label").text

        # click layer 0, head 1: its head view, that head alone; uniform attention: a line per causal pair
        drawn = int(driver.execute_script("return Number(document.body.dataset.rendered)"))
        driver.find_element(By.CSS_SELECTOR, '.cell[data-layer="0"][data-head="1"]').click()
        drawn = wait_drawn(driver, drawn)
        assert _count(driver, ".tok-q") == _count(driver, ".tok-k") == T
        assert _count(driver, "svg.headview line") == T * (T + 1) // 2
        assert _count(driver, '.chip.on[data-head="1"]') == 1 and _count(driver, ".chip.on") == 1
        driver.find_element(By.XPATH, "//button[text()='all']").click()
        drawn = wait_drawn(driver, drawn)
        assert _count(driver, "svg.headview line") == 3 * T * (T + 1) // 2

        # the step slider back to step 10: previous-token attention, one line per query and head
        driver.find_element(By.CSS_SELECTOR, ".step-slider").send_keys(Keys.HOME)
        drawn = wait_drawn(driver, drawn)
        assert "step 10" in driver.find_element(By.CSS_SELECTOR, ".step-label").text
        assert _count(driver, "svg.headview line") == 3 * T

        # hovering query 4 keeps only its lines (one per head, to key 3) and names what it attends to
        token = driver.find_elements(By.CSS_SELECTOR, ".tok-q")[4]
        ActionChains(driver).move_to_element(token).perform()
        assert _visible_lines(driver) == 3
        assert (
            '" soft" (4) attends to: " But" (3) 1.00' in driver.find_element(By.CSS_SELECTOR, ".status").text
        )

        # run b beside run a: two panels, b at its step <= 10
        Select(driver.find_element(By.CSS_SELECTOR, ".compare-select")).select_by_value("b/tb")
        drawn = wait_drawn(driver, drawn)
        panels = driver.find_elements(By.CSS_SELECTOR, ".panel")
        assert [p.get_attribute("data-run") for p in panels] == ["a/tb", "b/tb"]
        assert _count(driver, ".panel[data-run='b/tb'] svg.headview line") == 3 * T * (T + 1) // 2
        Select(driver.find_element(By.CSS_SELECTOR, ".compare-select")).select_by_value("")
        drawn = wait_drawn(driver, drawn)

        # export: the head view as SVG (every line in it) and PNG
        svg = driver.execute_script("return window.gptminiAttention.currentSVG()")
        assert svg.startswith("<svg") and svg.count("<line ") == 3 * T
        png_size = driver.execute_async_script(
            "const done = arguments[0]; window.gptminiAttention.pngBlob().then(b => done(b.size), e => done(-1))"
        )
        assert png_size > 1000

        # your own text: the run's checkpoint, its tokens, attention for the whole text
        text = "But soft, what light"
        box = driver.find_element(By.CSS_SELECTOR, ".text-input")
        box.send_keys(text, Keys.ENTER)
        drawn = wait_drawn(driver, drawn)
        n = len(build_tokenizer("gpt2").encode(text))
        assert _count(driver, ".tok-q") == n
        assert "your text, checkpoint of step 20" in driver.find_element(By.CSS_SELECTOR, ".panel-title").text
        assert 0 < _count(driver, "svg.headview line") <= 3 * n * (n + 1) // 2
        driver.find_element(By.CSS_SELECTOR, "button.back").click()
        wait_drawn(driver, drawn)
        assert _count(driver, ".tok-q") == T
