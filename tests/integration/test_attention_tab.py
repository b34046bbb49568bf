"""The ATTENTION tab in a real browser: TensorBoard started on two runs whose summaries hold known attention
patterns, the tab opened in headless Chromium. The head view draws one line per attention weight of a head (so a
previous-token pattern draws one line per token, a uniform one a line per causal pair), the step slider changes
what is drawn, hovering a token keeps its lines alone, a second run shows side by side, own text runs the run's
checkpoint, and the view exports as SVG and PNG. A second run of another shape is drawn with its own layers and
heads; own text runs for both runs shown; export works while a panel shows an error. The head picks follow the
shape of the runs shown; a run named after its overrides (about 200 characters) and its long error stay inside
their panels, on the page and in the export, which is sized by the maps; own text pressed again and again is
computed once per run shown; a run started after the tab opened joins the run boxes at TensorBoard's reload. The
neuron view's weights, from the logged queries and keys, are the model's own attention; the lens view's last row
is the model's own prediction; the head map highlights a hovered token in every panel.

Runs whenever Chromium, chromedriver and selenium are installed (Debian: apt-get install chromium
chromium-driver; pip install -e '.[dev]'), else is skipped with the reason."""

from __future__ import annotations

import dataclasses
import re
import shutil

import numpy as np
import pytest

from benchmarks.board import browser_missing, chrome, open_tab, tensorboard, wait_drawn

pytestmark = pytest.mark.skipif(browser_missing() is not None, reason=f"browser test: {browser_missing()}")

T = 6
TOKENS = ["ROM", "EO", ":", " But", " soft", ","]
# run b's: a byte-level BPE's tokens of "é" split over two tokens, as the tokenizer writes them (\xNN)
B_TOKENS = ["ROM", "EO", ":", " caf", "\\xc3", "\\xa9"]
# a run named as training names one after its overrides: about 200 characters, without a space
LONG_FOLDER = "speedrun/2026-01-01_10-00-00_000000"
LONG_LABEL = "speedrun," + ",".join(
    f"{key}={value}"
    for key, value in (
        ("model.n_layer", 2),
        ("model.n_head", 2),
        ("model.n_embd", 8),
        ("trainer.max_steps", 2000),
        ("data.batch_size", 32),
        ("optimizer.lr", 0.003),
        ("tokenizer", "bpe"),
        ("data.corpus", "tinyshakespeare_extended"),
        ("callbacks.attention_summary.max_tokens", 64),
    )
)
LONG = f"{LONG_FOLDER}/tb/{LONG_LABEL}"


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
    step 10 only over B_TOKENS, no checkpoint; "gone/tb" (deleted by a test): uniform at steps 10 and 20; all
    2 layers x 3 heads. "c/tb": another shape, 1 layer x 4 heads, previous-token
    attention at steps 10 and 20, and a checkpoint of that shape. LONG: 2 layers x 2 heads, previous-token attention
    at step 20, and a damaged checkpoint. "live/tb" (a test adds validations): 1 layer x 2 heads with circuits,
    validations at steps 0 and 10."""
    from torch.utils.tensorboard import SummaryWriter

    from gptmini.board.summary import AttentionSummary, summary_proto

    root = tmp_path_factory.mktemp("board")
    types = [["previous-token", "local", "other"], ["first-token", "induction", "other"]]
    runs = (
        ("a", (2, 3), {10: previous_token, 20: uniform}, types),
        ("b", (2, 3), {10: uniform}, types),
        ("c", (1, 4), {10: previous_token, 20: previous_token}, [["local"] * 4]),
        ("gone", (2, 3), {10: uniform, 20: uniform}, types),
    )
    for run, (n_layer, n_head), patterns, run_types in runs:
        writer = SummaryWriter(str(root / run / "tb"))
        for step, pattern in patterns.items():
            tokens = B_TOKENS if run == "b" else TOKENS
            summary = AttentionSummary(tokens, pattern(n_layer, n_head), run_types)
            writer.file_writer.add_summary(summary_proto(summary), step)
        writer.close()
    writer = SummaryWriter(str(root / LONG))
    writer.file_writer.add_summary(summary_proto(AttentionSummary(TOKENS, previous_token(2, 2))), 20)
    writer.close()
    (root / LONG_FOLDER / "checkpoints").mkdir()
    (root / LONG_FOLDER / "checkpoints" / "last.ckpt").write_bytes(b"PK\x03\x04 not really an archive")
    _detail_run(root / "d", write_checkpoint)
    _write_live(root / LIVE, (0, 10))
    for run, n_layer, n_head in (("a", 2, 3), ("c", 1, 4)):
        write_checkpoint(
            root / run / "checkpoints" / "last.ckpt",
            vocab_size=50257,
            block_size=16,
            n_layer=n_layer,
            n_head=n_head,
            n_embd=8 if n_head == 4 else 6,
            global_step=20,
        )
    return root


def _detail_run(folder, write_checkpoint) -> None:
    """Run "d/tb": a 2-layer, 2-head model with rotary positions, QK-norm and a learned sink, its summaries at
    steps 10 and 20 written as training writes them (attention, sinks, lens, queries and keys), and its checkpoint.
    At step 10 the queries and keys of its first layer only, as the summary's size cap keeps a larger model's."""
    import torch
    from torch.utils.tensorboard import SummaryWriter

    from gptmini.board.detail import probe_detail
    from gptmini.board.summary import summary_proto, vectors_header
    from gptmini.data.tokenizers import build_tokenizer
    from gptmini.runs.loading import open_run
    from gptmini.training.callbacks.summary_logging import attention_summary, inspect

    path = write_checkpoint(
        folder / "checkpoints" / "last.ckpt",
        **DETAIL_MODEL,
        vocab_size=50257,
        block_size=16,
        global_step=20,
        seed=3,
    )
    model = open_run(
        path, "cpu", tokenizer=False
    ).model  # its sinks' logits start at 0: each takes a share of every row
    tokenizer = build_tokenizer("gpt2")
    ids = tokenizer.encode("".join(TOKENS))
    tokens = [tokenizer.token_text(i) for i in ids]
    writer = SummaryWriter(str(folder / "tb"))
    for step in (10, 20):
        found = inspect(model, ids)
        summary = attention_summary(found.maps[:, 0], tokens)
        detail = probe_detail(model, found, ids, tokenizer)
        if step == 10:
            v = found.vectors
            q, k = (torch.stack([getattr(x, name)[0] for x in v]).numpy() for name in ("q", "k"))
            sink = torch.stack([x.sink for x in v]).numpy()
            detail["vectors"] = vectors_header(
                q, k, v[0].scale, None, v[0].window, sink, max_values=2 * q[0].size
            )
            assert detail["vectors"]["layers"] == 1
        writer.file_writer.add_summary(summary_proto(dataclasses.replace(summary, **detail)), step)
        for layer, heads in enumerate(detail["circuits"]["attribution"]):  # as head insight logs them beside
            for head, row in enumerate(heads):
                writer.add_scalar(
                    f"attribution/layer{layer}_head{head}", step / 100 + float(np.mean(row)), step
                )
    writer.close()


LIVE = "live/tb"


def _write_live(folder, steps) -> None:
    """Validations of a 1-layer, 2-head run at ``steps`` as training logs them: the attention summary with its
    circuits, and each head's attribution scalar (step / 1000)."""
    from torch.utils.tensorboard import SummaryWriter

    from gptmini.board.summary import AttentionSummary, circuits_header, summary_proto

    zeros = np.zeros((1, 2, 3, 3))  # QK and OV over 3 tokens
    circuits = circuits_header(
        np.zeros((1, 2, T - 1)), dict.fromkeys("QKV", np.zeros((0, 2, 2))), TOKENS[:3], zeros, zeros
    )
    proto = summary_proto(AttentionSummary(TOKENS, uniform(1, 2), circuits=circuits))
    writer = SummaryWriter(str(folder))
    for step in steps:
        writer.file_writer.add_summary(proto, step)
        for head in range(2):
            writer.add_scalar(f"attribution/layer0_head{head}", step / 1000, step)
    writer.close()


DETAIL_MODEL = {
    "n_layer": 2,
    "n_head": 2,
    "n_embd": 16,
    "position": "rope",
    "qk_norm": True,
    "attn_sink": True,
}


@pytest.fixture(scope="module")
def board(logdir, repo_root):
    with tensorboard(logdir, env={"PYTHONPATH": str(repo_root)}) as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium for the module's tests (its start costs seconds); ``driver`` gives each a new page."""
    with chrome() as driver:
        yield driver


@pytest.fixture
def driver(browser):
    """The module's Chromium on a blank page: each test loads the tab afresh (a ``get`` of the URL already shown
    would only move to its fragment, keeping the previous test's page)."""
    browser.switch_to.default_content()
    browser.get("about:blank")
    return browser


def _count(driver, css: str) -> int:
    return driver.execute_script(f"return document.querySelectorAll({css!r}).length")


def _visible_lines(driver) -> int:
    return driver.execute_script(
        "return [...document.querySelectorAll('svg.headview line')].filter(l => l.style.display !== 'none').length"
    )


def test_the_tab_draws_scrubs_compares_and_takes_your_text(board, driver):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    from gptmini.data.tokenizers import build_tokenizer

    open_tab(driver, board)
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
    assert '" soft" (4) attends to: " But" (3) 1.00' in driver.find_element(By.CSS_SELECTOR, ".status").text
    # the whole row of a token takes the pointer, not its glyphs alone (the gaps made the hover flicker):
    # the blank left end of query 4's row is still query 4
    hit = driver.execute_script(
        "const g = document.querySelectorAll('.tok-q')[4], box = g.querySelector('text').getBBox();"
        "const svg = g.ownerSVGElement.getBoundingClientRect();"
        "const at = document.elementFromPoint(svg.left + 3, svg.top + box.y + box.height / 2);"
        "return at && at.closest('.tok-q') === g;"
    )
    assert hit
    # spaces are shown as ␣ (a middle dot was hard to see)
    assert driver.find_elements(By.CSS_SELECTOR, ".tok-q text")[3].text == "␣But"

    # run b beside run a: two panels, b at its step <= 10
    Select(driver.find_element(By.CSS_SELECTOR, ".compare-select")).select_by_value("b/tb")
    drawn = wait_drawn(driver, drawn)
    panels = driver.find_elements(By.CSS_SELECTOR, ".panel")
    assert [p.get_attribute("data-run") for p in panels] == ["a/tb", "b/tb"]
    assert _count(driver, ".panel[data-run='b/tb'] svg.headview line") == 3 * T * (T + 1) // 2
    # the bytes of a character split over two tokens are shown as bytes, not as backslash escapes
    keys = driver.execute_script(
        "return [...document.querySelectorAll(\".panel[data-run='b/tb'] .tok-k text\")].map(t => t.textContent)"
    )
    assert keys[3:] == ["␣caf", "⟨C3⟩", "⟨A9⟩"], keys
    # the run beside's steps are asked once, not at every draw: two slider moves ask none
    driver.execute_script(
        "const real = window.fetch; window.stepRequests = [];"
        "window.fetch = (url, options) => {"
        "  if (String(url).startsWith('steps')) window.stepRequests.push(url);"
        "  return real(url, options);"
        "};"
    )
    slider = driver.find_element(By.CSS_SELECTOR, ".step-slider")
    for key in (Keys.END, Keys.HOME):
        slider.send_keys(key)
        drawn = wait_drawn(driver, drawn)
    assert driver.execute_script("return window.stepRequests") == []
    assert "step 10" in driver.find_element(By.CSS_SELECTOR, ".step-label").text
    # beside a run whose first step is later (20) than the one shown (10): it says so, it shows no later step
    drawn = _select(driver, ".compare-select", LONG, drawn)
    note = driver.find_element(By.CSS_SELECTOR, f".panel[data-run='{LONG}'] .note").text
    assert note == "this run logged no step at or before step 10 (its first: 20)"
    assert _count(driver, f".panel[data-run='{LONG}'] svg") == 0
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


def _select(driver, css: str, value: str, drawn: int) -> int:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element(By.CSS_SELECTOR, css)).select_by_value(value)
    return wait_drawn(driver, drawn)


def _drawn(driver) -> int:
    return int(driver.execute_script("return Number(document.body.dataset.rendered)"))


def test_a_run_of_another_shape_beside_is_drawn_with_its_own_layers_and_heads(board, driver):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    open_tab(driver, board)
    drawn = _select(driver, ".compare-select", "c/tb", _drawn(driver))
    # the model view: each run's own grid, 2 x 3 and 1 x 4
    assert _count(driver, ".panel[data-run='a/tb'] .cell") == 6
    assert _count(driver, ".panel[data-run='c/tb'] .cell") == 4
    assert _count(driver, ".panel[data-run='c/tb'] .cell[data-layer='1']") == 0

    # hovering a map names its query, its key and the weight between them (c: previous-token at step 20)
    canvas = driver.find_element(By.CSS_SELECTOR, ".panel[data-run='c/tb'] .cell[data-head='2'] canvas")
    size = canvas.size["height"]
    row = size / T  # query 4, key 3: offsets from the map's centre
    ActionChains(driver).move_to_element_with_offset(
        canvas, int(3.5 * row - size / 2), int(4.5 * row - size / 2)
    ).perform()
    status = driver.find_element(By.CSS_SELECTOR, ".status").text
    assert status == 'layer 0, head 2: query " soft" (4) → key " But" (3): 1.00', status

    # the head view, every head: run a draws its 3 heads, run c its 4 (previous-token: a line per query)
    driver.find_element(
        By.CSS_SELECTOR, ".panel[data-run='a/tb'] .cell[data-layer='0'][data-head='0']"
    ).click()
    drawn = wait_drawn(driver, drawn)
    driver.find_element(By.XPATH, "//button[text()='all']").click()
    drawn = wait_drawn(driver, drawn)
    assert _count(driver, ".chip") == 4
    assert _count(driver, ".panel[data-run='a/tb'] svg.headview g[data-head]") == 3
    assert _count(driver, ".panel[data-run='c/tb'] svg.headview g[data-head]") == 4
    assert _count(driver, ".panel[data-run='c/tb'] svg.headview line") == 4 * T
    assert _count(driver, ".panel[data-run='a/tb'] svg.headview line") == 3 * T * (T + 1) // 2
    title = driver.find_element(By.CSS_SELECTOR, ".panel[data-run='a/tb'] .panel-title").text
    assert "this run has 3 heads: head 3 not in it" in title

    # layer 1, which run c lacks: c says so and draws nothing; no line anywhere is malformed
    drawn = _select(driver, ".layer-select", "1", drawn)
    note = driver.find_element(By.CSS_SELECTOR, ".panel[data-run='c/tb'] .note").text
    assert note == "this run has 1 layer: layer 1 is not in it"
    assert _count(driver, ".panel[data-run='c/tb'] line") == 0
    assert _count(driver, ".panel[data-run='a/tb'] svg.headview line") == 3 * T * (T + 1) // 2
    assert _count(driver, 'line[stroke-width="NaN"]') == 0
    svg = driver.execute_script("return window.gptminiAttention.currentSVG()")
    assert "layer 1 is not in it" in svg and "NaN" not in svg


def test_own_text_for_two_runs_and_export_beside_an_error(board, driver):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    from gptmini.data.tokenizers import build_tokenizer

    text = "But soft, what light"
    n = len(build_tokenizer("gpt2").encode(text))
    open_tab(driver, board)
    drawn = _select(driver, ".compare-select", "c/tb", _drawn(driver))
    driver.find_element(By.CSS_SELECTOR, ".text-input").send_keys(text, Keys.ENTER)
    drawn = wait_drawn(driver, drawn)
    # both runs ran the text on their own checkpoints, each panel with its own heads
    assert _count(driver, ".panel .error") == 0, driver.find_element(By.CSS_SELECTOR, ".status").text
    for run, shape, cells in (("a/tb", "2 layers × 3 heads", 6), ("c/tb", "1 layer × 4 heads", 4)):
        title = driver.find_element(By.CSS_SELECTOR, f".panel[data-run='{run}'] .panel-title").text
        assert f"your text, checkpoint of step 20 · {shape} · {n} tokens" in title, title
        assert _count(driver, f".panel[data-run='{run}'] .cell canvas.map") == cells

    # run b beside has no checkpoint: its panel says so, and the view still exports, its message included
    drawn = _select(driver, ".compare-select", "b/tb", drawn)
    error = driver.find_element(By.CSS_SELECTOR, ".panel[data-run='b/tb'] .error").text
    assert "no checkpoint" in error
    svg = driver.execute_script("return window.gptminiAttention.currentSVG()")
    assert svg.startswith("<svg") and svg.count("<image ") == 6 and "no checkpoint" in svg
    png_size = driver.execute_async_script(
        "const done = arguments[0]; window.gptminiAttention.pngBlob().then(b => done(b.size), e => done(-1))"
    )
    assert png_size > 1000
    driver.find_element(By.CSS_SELECTOR, ".save-svg").click()
    assert "export failed" not in driver.find_element(By.CSS_SELECTOR, ".status").text
    # the head view beside the error exports too
    driver.find_element(
        By.CSS_SELECTOR, ".panel[data-run='a/tb'] .cell[data-layer='0'][data-head='0']"
    ).click()
    drawn = wait_drawn(driver, drawn)
    svg = driver.execute_script("return window.gptminiAttention.currentSVG()")
    assert svg.count("<line ") == _count(driver, "svg.headview line") > 0 and "no checkpoint" in svg

    # text over the limit is not cut silently and not sent: the tab says how long it is and what the limit is,
    # as the text is typed and when it is sent
    _count_text_requests(driver)
    driver.execute_script(
        "const box = document.querySelector('.text-input'); box.value = 'a'.repeat(2001);"
        "box.dispatchEvent(new Event('input'));"
    )
    said = "your text has 2001 characters; at most 2000 (and 128 tokens) can be shown: shorten it, a longer "
    assert said + "text is not sent" == driver.find_element(By.CSS_SELECTOR, ".status").text
    driver.find_element(By.CSS_SELECTOR, ".text-go").click()
    assert said + "text is not sent" == driver.find_element(By.CSS_SELECTOR, ".status").text
    assert driver.execute_script("return window.textRequests.length") == 0
    assert _drawn(driver) == drawn


def _count_text_requests(driver) -> None:
    """From now on the page's own-text requests are listed in ``window.textRequests``, each with its abort signal."""
    driver.execute_script(
        "const real = window.fetch; window.textRequests = [];"
        "window.fetch = (url, options = {}) => {"
        "  if (url === 'text') window.textRequests.push(options.signal);"
        "  return real(url, options);"
        "};"
    )


def test_head_picks_follow_the_shape_of_the_run_shown(board, driver):
    from selenium.webdriver.common.by import By

    def chips_on(driver) -> list[str]:
        return [c.get_attribute("data-head") for c in driver.find_elements(By.CSS_SELECTOR, ".chip.on")]

    open_tab(driver, board)
    drawn = _drawn(driver)
    driver.find_element(By.CSS_SELECTOR, ".cell[data-layer='0'][data-head='0']").click()
    drawn = wait_drawn(driver, drawn)
    driver.find_element(By.XPATH, "//button[text()='all']").click()
    drawn = wait_drawn(driver, drawn)
    assert chips_on(driver) == ["0", "1", "2"]

    # every head of the 3-head run, then the 4-head run: every head of it, none hidden unasked
    drawn = _select(driver, ".run-select", "c/tb", drawn)
    assert chips_on(driver) == ["0", "1", "2", "3"]
    assert _count(driver, ".panel[data-run='c/tb'] svg.headview g[data-head]") == 4

    # heads 1 and 3 picked, then the 3-head run: head 1 stays picked, head 3 is not in it
    driver.find_element(By.XPATH, "//button[text()='none']").click()
    drawn = wait_drawn(driver, drawn)
    for head in ("1", "3"):
        driver.find_element(By.CSS_SELECTOR, f".chip[data-head='{head}']").click()
        drawn = wait_drawn(driver, drawn)
    drawn = _select(driver, ".run-select", "a/tb", drawn)
    assert chips_on(driver) == ["1"]
    assert _count(driver, ".panel[data-run='a/tb'] svg.headview g[data-head]") == 1


# the export's layout (currentSVG): padding, the gap between panels, the widest message, a model view's cell
PAD, GAP, MESSAGE_W, CELL_W = 12, 30, 480, 84 + 6


def test_a_long_run_name_and_its_long_error_stay_inside_their_panels(board, driver):
    """A run named after its overrides whose checkpoint is damaged, beside the 4-head run, on own text: the error
    names the run once (its panel's title), wraps inside its panel on the page and in the export, and the export
    is as wide as the maps and the message, not as the names; it is named after the panel that shows maps."""
    import base64
    import struct

    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    open_tab(driver, board)
    drawn = _select(driver, ".run-select", LONG, _drawn(driver))
    # the run box, narrower than the name, ends it with "…" and holds it whole in its title
    box = driver.execute_script(
        "const s = document.querySelector('.run-select');"
        "return [s.title, getComputedStyle(s).textOverflow, s.scrollWidth <= s.clientWidth]"
    )
    assert box == [LONG, "ellipsis", True], box
    drawn = _select(driver, ".compare-select", "c/tb", drawn)
    driver.find_element(By.CSS_SELECTOR, ".text-input").send_keys("But soft", Keys.ENTER)
    drawn = wait_drawn(driver, drawn)
    panel = f".panel[data-run='{LONG}']"
    error = driver.find_element(By.CSS_SELECTOR, f"{panel} .error").text
    assert (
        error.startswith("this run's checkpoint cannot be loaded: ")
        and "is not a gptmini checkpoint" in error
    )
    page = driver.execute_script(
        "return [document.querySelector(arguments[0]).textContent, document.querySelector('.status').textContent]",
        panel,
    )
    assert page[0].count(LONG) == 1 and LONG_LABEL not in page[1] and error in page[1], page

    # on the page: the panel is as wide as its message allows, its title wraps inside it
    box = driver.execute_script(
        "const p = document.querySelector(arguments[0]), t = p.querySelector('.panel-title');"
        "return [p.querySelector('.error').getBoundingClientRect().width, t.scrollWidth, t.clientWidth];",
        panel,
    )
    assert box[0] <= MESSAGE_W and box[1] <= box[2], box

    # the export: drawn by the browser, every text inside its own panel; the message and the name whole
    layout = driver.execute_script(
        "const holder = document.createElement('div');"
        "holder.innerHTML = window.gptminiAttention.currentSVG(); document.body.append(holder);"
        "const root = holder.querySelector('svg');"
        "const texts = [...root.querySelectorAll('text')].map((t) => { const b = t.getBBox();"
        "  return {x: Number(t.getAttribute('x')), right: b.x + b.width, text: t.textContent,"
        "          bold: t.getAttribute('font-weight') === 'bold', fill: t.getAttribute('fill')}; });"
        "holder.remove();"
        "return {width: Number(root.getAttribute('width')), height: Number(root.getAttribute('height')), texts};"
    )
    texts = layout["texts"]
    second = min(t["x"] for t in texts if t["bold"] and t["x"] > 0)  # where the panel of c/tb starts
    assert layout["width"] <= 2 * PAD + MESSAGE_W + GAP + 60 + 4 * CELL_W, layout["width"]
    for t in texts:
        end = second - GAP if t["x"] < second else layout["width"] - 2 * PAD
        assert t["right"] <= end + 0.5, (t, end)
    first_panel = [t for t in texts if t["x"] < second]
    assert "".join(t["text"] for t in first_panel if t["bold"]) == LONG
    message = [t["text"] for t in first_panel if t["fill"] == "#b00020"]
    assert len(message) > 1 and "".join(message).replace(" ", "") == error.replace(" ", ""), message

    # the PNG: twice the SVG's size; the file named after c/tb, the panel that shows maps
    png = driver.execute_async_script(
        "const done = arguments[0]; window.gptminiAttention.pngBlob().then((b) => {"
        "  const r = new FileReader(); r.onload = () => done(r.result); r.readAsDataURL(b); });"
    )
    header = base64.b64decode(png.split(",", 1)[1])[:24]
    assert struct.unpack(">II", header[16:24]) == (2 * layout["width"], 2 * layout["height"])
    assert driver.execute_script("return window.gptminiAttention.fileName('png')") == (
        "attention-c_tb-model-text.png"
    )


def test_own_text_pressed_again_and_again_is_computed_once_per_run_shown(board, driver):
    """Six texts sent at once (two runs shown): each new one aborts the requests of the one before, whose second
    run is then never asked; the same text sent six times while it is computed is sent once per run."""
    from selenium.webdriver.common.by import By

    from gptmini.data.tokenizers import build_tokenizer

    press = (
        "const box = document.querySelector('.text-input'), go = document.querySelector('.text-go');"
        "for (const t of arguments[0]) { box.value = t; go.click(); }"
    )
    texts = [
        "But",
        "But soft",
        "But soft,",
        "But soft, what",
        "But soft, what light",
        "But soft, what light?",
    ]
    open_tab(driver, board)
    drawn = _select(driver, ".compare-select", "c/tb", _drawn(driver))
    _count_text_requests(driver)
    driver.execute_script(press, texts)
    drawn = wait_drawn(driver, drawn)
    aborted = driver.execute_script("return window.textRequests.map((s) => (s ? s.aborted : null))")
    assert aborted == [True] * 5 + [False, False], aborted
    n = len(build_tokenizer("gpt2").encode(texts[-1]))
    status = driver.find_element(By.CSS_SELECTOR, ".status").text
    assert _count(driver, ".panel[data-run='a/tb'] .cell") == 6 and _count(driver, ".panel .error") == 0, (
        status
    )
    assert all(f"{n} tokens" in t for t in _titles(driver)), _titles(driver)

    driver.execute_script("window.textRequests.length = 0")
    driver.execute_script(press, ["what light"] * 6)
    wait_drawn(driver, drawn)
    assert driver.execute_script("return window.textRequests.map((s) => (s ? s.aborted : null))") == [
        False,
        False,
    ]


def _titles(driver) -> list[str]:
    return driver.execute_script(
        "return [...document.querySelectorAll('.panel-title')].map((t) => t.textContent)"
    )


def test_a_run_started_after_the_tab_opened_joins_the_run_boxes_at_tensorboards_reload(
    tmp_path, repo_root, driver
):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    from torch.utils.tensorboard import SummaryWriter

    from benchmarks.board import get_json
    from gptmini.board import PLUGIN_NAME
    from gptmini.board.summary import AttentionSummary, summary_proto

    def write(run: str) -> None:
        writer = SummaryWriter(str(tmp_path / run))
        writer.file_writer.add_summary(summary_proto(AttentionSummary(TOKENS, uniform(1, 2))), 1)
        writer.close()

    def options(driver, css: str) -> list[str]:
        return driver.execute_script(
            f"return [...document.querySelectorAll('{css} option')].map((o) => o.value)"
        )

    write("first/tb")
    with tensorboard(tmp_path, env={"PYTHONPATH": str(repo_root)}) as url:
        open_tab(driver, url)
        assert options(driver, ".run-select") == ["first/tb"]
        write("second/tb")
        WebDriverWait(driver, 30).until(
            lambda _: len(get_json(f"{url}/data/plugin/{PLUGIN_NAME}/runs")["runs"]) == 2
        )
        driver.switch_to.default_content()
        reload = driver.find_element(By.CSS_SELECTOR, "button.reload-button")
        assert reload.is_enabled()
        reload.click()
        driver.switch_to.frame(driver.find_element(By.CSS_SELECTOR, "iframe"))
        WebDriverWait(driver, 30).until(lambda d: options(d, ".run-select") == ["first/tb", "second/tb"])
        assert options(driver, ".compare-select") == ["", "first/tb", "second/tb"]
        assert driver.execute_script("return document.querySelector('.run-select').value") == "first/tb"


def _shown(token: str) -> str:
    # as the page shows a token (index.js, shown)
    s = re.sub(r"\\x([0-9a-f]{2})", lambda m: f"⟨{m[1].upper()}⟩", token)
    s = s.replace("\n", "↵").replace("\t", "⇥").replace(" ", "␣")
    return (s[:11] + "…" if len(s) > 12 else s) or "∅"


def _neuron_rows(driver) -> list[dict]:
    return driver.execute_script(
        "return [...document.querySelectorAll('.panel tr.nv-row')].map(r => ({key: Number(r.dataset.key), "
        "weight: Number(r.dataset.weight), logged: Number(r.dataset.logged), score: Number(r.dataset.score)}))"
    )


def test_the_neuron_view_computes_the_models_own_weights(board, logdir, driver):
    """Layer 1, head 1, query 4 of run d (rotary positions, QK-norm, a sink): the view's softmax of q . k over the
    logged queries and keys gives the model's attention probabilities (float16 vectors: within 0.01), and with
    the sink's weight each row sums to 1; on your own text, every key of the last token has its row."""
    import torch
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    from gptmini.data.tokenizers import build_tokenizer
    from gptmini.runs.loading import open_run

    model = open_run(logdir / "d" / "checkpoints" / "last.ckpt", "cpu", tokenizer=False).model
    tokenizer = build_tokenizer("gpt2")
    ids = tokenizer.encode("".join(TOKENS))
    with torch.no_grad():
        maps = model.attention_maps(torch.tensor([ids]))[:, 0].numpy()  # (L, nh, T, T)
    open_tab(driver, board)
    drawn = _select(driver, ".run-select", "d/tb", _drawn(driver))
    driver.find_element(By.CSS_SELECTOR, "button.view-neuron").click()
    drawn = wait_drawn(driver, drawn)
    drawn = _select(driver, ".pick-layer", "1", drawn)
    drawn = _select(driver, ".pick-head", "1", drawn)
    drawn = _select(driver, ".pick-query", "4", drawn)  # the last token (5) is the default
    rows = _neuron_rows(driver)
    assert [r["key"] for r in rows] == list(range(5))
    # each row names its key's position, as the query's does
    positions = driver.execute_script(
        "return [...document.querySelectorAll('tr.nv-row .nv-pos, tr.nv-query .nv-pos')].map(s => s.textContent)"
    )
    assert positions == ["4", "0", "1", "2", "3", "4"]
    want = maps[1, 1, 4, :5]
    np.testing.assert_allclose([r["weight"] for r in rows], want, atol=0.01)
    np.testing.assert_allclose([r["logged"] for r in rows], want, atol=0.5 / 255 + 1e-4)
    sink = float(driver.find_element(By.CSS_SELECTOR, "tr.nv-sink").get_attribute("data-weight"))
    assert sink == pytest.approx(1 - want.sum(), abs=0.01) and sink > 0.01
    assert sum(r["weight"] for r in rows) + sink == pytest.approx(1.0, abs=1e-3)
    assert (
        _count(driver, "tr.nv-row canvas.strip") == 2 * 5 and _count(driver, "tr.nv-query canvas.strip") == 1
    )

    # run a logged no queries and keys: its panel says so
    drawn = _select(driver, ".compare-select", "a/tb", drawn)
    note = driver.find_element(By.CSS_SELECTOR, ".panel[data-run='a/tb'] .note").text
    assert "holds no queries and keys" in note
    drawn = _select(driver, ".compare-select", "", drawn)

    # step 10 kept its first layer's queries and keys only (the size cap): layer 1 asks for your own text
    driver.find_element(By.CSS_SELECTOR, ".step-slider").send_keys(Keys.HOME)
    drawn = wait_drawn(driver, drawn)
    note = driver.find_element(By.CSS_SELECTOR, ".panel .note").text
    assert "type your own text to see layer 1" in note, note

    # your own text: the checkpoint's queries and keys at every layer, the last token's row for every key
    text = "But soft, what light through"
    driver.find_element(By.CSS_SELECTOR, ".text-input").send_keys(text, Keys.ENTER)
    drawn = wait_drawn(driver, drawn)
    assert driver.execute_script("return document.querySelector('.pick-layer').value") == "1"
    assert _count(driver, ".panel .note") == 0
    n = len(tokenizer.encode(text))
    assert _count(driver, ".pick-query option") == n
    drawn = _select(driver, ".pick-query", str(n - 1), drawn)
    rows = _neuron_rows(driver)
    assert [r["key"] for r in rows] == list(range(n))
    for r in rows:
        assert abs(r["weight"] - r["logged"]) < 0.01


def test_the_lens_view_and_the_head_map(board, logdir, driver):
    import torch
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    from gptmini.data.tokenizers import build_tokenizer
    from gptmini.runs.loading import open_run

    model = open_run(logdir / "d" / "checkpoints" / "last.ckpt", "cpu", tokenizer=False).model
    tokenizer = build_tokenizer("gpt2")
    ids = tokenizer.encode("".join(TOKENS))
    with torch.no_grad():
        logits, _ = model(torch.tensor([ids]))
    open_tab(driver, board)
    drawn = _select(driver, ".run-select", "d/tb", _drawn(driver))
    driver.find_element(By.CSS_SELECTOR, "button.view-lens").click()
    drawn = wait_drawn(driver, drawn)
    # the lens view is HTML, not exported: Save is off (it wrote an empty image)
    assert not any(driver.find_element(By.CSS_SELECTOR, b).is_enabled() for b in (".save-png", ".save-svg"))
    # layers down (the embeddings, then each block), tokens across; the last row is the model's prediction
    rows = driver.find_elements(By.CSS_SELECTOR, "table.lens tr[data-row]")
    assert [r.get_attribute("data-row") for r in rows] == ["embed", "layer0", "layer1"]
    assert _count(driver, "table.lens tr[data-row='layer1'] td.lens-cell") == len(ids)
    tops = driver.execute_script(
        "return [...document.querySelectorAll(\"table.lens tr[data-row='layer1'] td.lens-cell .top\")]"
        ".map(c => c.textContent)"
    )
    want = [tokenizer.token_text(int(i)) for i in logits[0].argmax(-1)]
    assert tops == [_shown(w) for w in want]

    # the head map: one head and the layer's mean, large; the text coloured by the query's weights
    driver.find_element(By.CSS_SELECTOR, "button.view-map").click()
    drawn = wait_drawn(driver, drawn)
    assert _count(driver, "canvas.bigmap") == 2
    weights = driver.execute_script(
        "return [...document.querySelectorAll('.colored-tokens .ct')].map(s => Number(s.dataset.weight))"
    )
    assert len(weights) == len(ids) and sum(weights) < 1.0  # the sink takes the rest
    # hovering a token highlights it in every panel: run d beside itself shows it twice
    drawn = _select(driver, ".compare-select", "d/tb", drawn)
    token = driver.find_elements(By.CSS_SELECTOR, ".colored-tokens .ct")[2]
    ActionChains(driver).move_to_element(token).perform()
    assert _count(driver, ".panel .ct.hl") == 2
    assert _count(driver, ".panel .axis-x .hl") == 4  # both maps of both panels

    # a longer text beside itself: two panels wider together than the 1,500 px window each hold their own maps
    # (squeezed, a panel's maps ran 200 px into the next one); the keys' labels stand under their own columns,
    # the queries' beside their own rows
    text = "But soft, what light through yonder window breaks? It is the east."  # 16 tokens: its context
    driver.find_element(By.CSS_SELECTOR, ".text-input").send_keys(text, Keys.ENTER)
    drawn = wait_drawn(driver, drawn)
    boxes = driver.execute_script(
        "return [...document.querySelectorAll('.panel')].map(p => [p.getBoundingClientRect().left,"
        "  p.getBoundingClientRect().right,"
        "  Math.max(...[...p.querySelectorAll('.bigmap-wrap')].map(w => w.getBoundingClientRect().right))])"
    )
    assert len(boxes) == 2 and boxes[0][1] <= boxes[1][0], boxes
    assert all(maps <= right for _, right, maps in boxes), boxes
    axes = driver.execute_script(
        "const wrap = document.querySelector('.bigmap-wrap');"
        "const map = wrap.querySelector('canvas.bigmap').getBoundingClientRect();"
        "const centre = (sel, lo, hi) => [...wrap.querySelectorAll(sel)].map(l => {"
        "  const b = l.getBoundingClientRect(); return (b[lo] + b[hi]) / 2; });"
        "return {map: [map.left + 1, map.top + 1, map.width - 2], x: centre('.axis-x .tok-label', 'left', 'right'),"
        "        y: centre('.axis-y .tok-label', 'top', 'bottom')};"
    )
    n = len(tokenizer.encode(text))
    left, top, width = axes["map"]
    cell = width / n
    assert len(axes["x"]) == len(axes["y"]) == n
    np.testing.assert_allclose(axes["x"], [left + (j + 0.5) * cell for j in range(n)], atol=cell / 4)
    np.testing.assert_allclose(axes["y"], [top + (i + 0.5) * cell for i in range(n)], atol=cell / 4)

    # the head map is not exported either; the model view is
    assert not driver.find_element(By.CSS_SELECTOR, ".save-svg").is_enabled()
    driver.find_element(By.CSS_SELECTOR, "button.tab").click()  # the model view
    wait_drawn(driver, drawn)
    assert all(driver.find_element(By.CSS_SELECTOR, b).is_enabled() for b in (".save-png", ".save-svg"))


def test_the_circuits_view(board, logdir, driver):
    """Run "d/tb": the heads x steps attribution map from its scalars, the per-token attribution of the step shown,
    the composition graph whose edge widths are the scores (Q, K or V as picked) and the picked head's QK and OV
    circuits, all as the model's own (``gptmini.board.detail.circuits``)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select, WebDriverWait

    from gptmini.board.detail import circuits
    from gptmini.data.tokenizers import build_tokenizer
    from gptmini.runs.loading import open_run

    model = open_run(logdir / "d" / "checkpoints" / "last.ckpt", "cpu", tokenizer=False).model
    tokenizer = build_tokenizer("gpt2")
    ids = tokenizer.encode("".join(TOKENS))
    want = circuits(model, ids, tokenizer)
    open_tab(driver, board)
    drawn = _select(driver, ".run-select", "d/tb", _drawn(driver))
    driver.find_element(By.CSS_SELECTOR, "button.view-circuits").click()
    drawn = wait_drawn(driver, drawn)
    assert not driver.find_element(By.CSS_SELECTOR, ".save-png").is_enabled()  # HTML: not exported
    # heads x steps, from the attribution route (filled in when it answers); the step shown framed
    WebDriverWait(driver, 10).until(lambda d: _count(d, "canvas.attr-steps"))
    canvas = driver.find_element(By.CSS_SELECTOR, "canvas.attr-steps")
    assert (canvas.get_attribute("data-heads"), canvas.get_attribute("data-steps")) == ("4", "10,20")
    assert _count(driver, ".step-mark") == 1
    # per token: a row per head, a cell per position with a next token, the model's own values
    values = driver.execute_script(
        "return [...document.querySelectorAll('table.attr-tokens tr[data-head]')]"
        ".map(r => [...r.querySelectorAll('td.attr-cell')].map(c => Number(c.dataset.value)))"
    )
    flat = [row for layer in want["attribution"] for row in layer]
    np.testing.assert_allclose(np.array(values), np.array(flat), atol=1.5e-3)
    # the graph: an edge per head pair of successive layers, its width 0.25 + 10 x the score
    widths = driver.execute_script(
        "return [...document.querySelectorAll('svg.composition line')].map(l => [l.dataset.from, l.dataset.to,"
        " Number(l.getAttribute('stroke-width'))])"
    )
    k = want["composition"]["K"][0]  # layer 0 on layer 1: (2, 2)
    assert sorted(widths) == sorted(
        [f"0,{a}", f"1,{b}", pytest.approx(0.25 + 10 * k[a][b], abs=0.011)] for a in (0, 1) for b in (0, 1)
    )
    driver.find_element(By.CSS_SELECTOR, "button.comp-V").click()
    drawn = wait_drawn(driver, drawn)
    scores = driver.execute_script(
        "return [...document.querySelectorAll('svg.composition line')].map(l => Number(l.dataset.score))"
    )
    assert sorted(scores) == pytest.approx(
        sorted(x for row in want["composition"]["V"][0] for x in row), abs=1e-3
    )
    # the picked head's QK and OV circuits over the probe's distinct tokens
    Select(driver.find_element(By.CSS_SELECTOR, ".pick-head")).select_by_value("1")
    drawn = wait_drawn(driver, drawn)
    n = len(want["circuit_tokens"])
    assert _count(driver, "canvas.circuit-qk") == _count(driver, "canvas.circuit-ov") == 1
    assert _count(driver, ".circuit-matrix .circuit-cols span") == 2 * n
    assert "layer 0, head 1" in driver.find_element(By.CSS_SELECTOR, ".circuits").text
    # the slider: the earlier step is drawn with its own frame
    driver.execute_script(
        "const s = document.querySelector('.step-slider'); s.value = 0; s.dispatchEvent(new Event('input'))"
    )
    drawn = wait_drawn(driver, drawn)
    assert "step 10" in driver.find_element(By.CSS_SELECTOR, ".step-label").text
    # your own text: the checkpoint's attribution per token; the map over training points back to the probe
    text = "But soft, what light"
    driver.find_element(By.CSS_SELECTOR, ".text-input").send_keys(text, Keys.ENTER)
    wait_drawn(driver, drawn)
    n = len(tokenizer.encode(text))
    assert _count(driver, "table.attr-tokens tr[data-layer='1'][data-head='0'] td.attr-cell") == n - 1
    assert "the logged validations" in driver.find_element(By.CSS_SELECTOR, ".attribution-steps .note").text


def _status(driver) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, ".status").text


def test_values_shown_on_hover_are_reached_by_keyboard(board, driver):
    """A map of the model view takes the focus and says what hovering its head says, its cells by the arrow keys as
    hovering them does, and Enter opens its head view; a token of the head view takes the focus (Tab goes on to the
    next) and keeps its lines alone as on hover; a byte token's title shows the byte as the page does (⟨C3⟩)."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    open_tab(driver, board)  # run a at step 20: uniform attention
    drawn = _drawn(driver)
    canvas = driver.find_element(By.CSS_SELECTOR, ".cell[data-layer='0'][data-head='1'] canvas.map")
    assert canvas.get_attribute("tabindex") == "0"
    assert canvas.get_attribute("aria-label").startswith("layer 0, head 1: local")
    canvas.send_keys(Keys.ARROW_UP)  # from the last query's first key
    assert _status(driver) == 'layer 0, head 1: query " soft" (4) → key "ROM" (0): 0.20'
    canvas.send_keys(Keys.ARROW_RIGHT * 5)
    assert (
        _status(driver)
        == 'layer 0, head 1: query " soft" (4) → key "," (5): masked (a query sees only earlier keys)'
    )
    canvas.send_keys(Keys.ENTER)
    drawn = wait_drawn(driver, drawn)
    assert _count(driver, ".chip.on") == 1 and _count(driver, '.chip.on[data-head="1"]') == 1

    driver.execute_script("document.querySelectorAll('.tok-q')[4].focus()")
    assert _visible_lines(driver) == 5
    assert _status(driver).startswith('" soft" (4) attends to: ')
    ActionChains(driver).send_keys(Keys.TAB).perform()
    focused = driver.execute_script(
        "const a = document.activeElement; return [a.getAttribute('class'), a.dataset.i]"
    )
    assert focused == ["tok tok-q hot", "5"] and _visible_lines(driver) == 6
    assert driver.execute_script("return document.activeElement.getAttribute('aria-label')") == 'query 5: ","'

    # run b's bytes of "é" in the titles as on the page, not as "\\xc3"
    drawn = _select(driver, ".compare-select", "b/tb", drawn)
    titles = driver.execute_script(
        "return [...document.querySelectorAll(\".panel[data-run='b/tb'] .tok-k title\")].map(t => t.textContent)"
    )
    assert titles[3:] == ['3: " caf"', '4: "⟨C3⟩"', '5: "⟨A9⟩"'], titles


def test_circuits_beside_a_shallower_run(board, driver):
    """Run d (2 layers) with layer 1 picked, beside "live/tb" (1 layer): the live run's attribution and composition,
    which do not depend on the layer, are drawn, and only its QK and OV circuits say the layer is not in it. The
    attribution map and its cells say their values to the keyboard; Circuits has no query picker (it uses none)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    open_tab(driver, board)
    drawn = _select(driver, ".run-select", "d/tb", _drawn(driver))
    driver.find_element(By.CSS_SELECTOR, "button.view-neuron").click()
    drawn = wait_drawn(driver, drawn)
    assert _count(driver, ".pick-query") == 1
    driver.find_element(By.CSS_SELECTOR, "button.view-circuits").click()
    drawn = wait_drawn(driver, drawn)
    assert _count(driver, ".pick-query") == 0
    drawn = _select(driver, ".pick-layer", "1", drawn)
    drawn = _select(driver, ".compare-select", LIVE, drawn)
    live = f".panel[data-run='{LIVE}']"
    WebDriverWait(driver, 10).until(lambda d: _count(d, f"{live} canvas.attr-steps"))
    assert _count(driver, f"{live} table.attr-tokens tr[data-head]") == 2
    assert (
        "one layer: no head feeds another"
        in driver.find_element(By.CSS_SELECTOR, f"{live} .comp-modes + .note").text
    )
    notes = [n.text for n in driver.find_elements(By.CSS_SELECTOR, f"{live} .note")]
    assert notes[-1] == "this run has 1 layer × 2 heads: layer 1, head 0 is not in it", notes
    assert _count(driver, f"{live} canvas.circuit-qk") == 0
    assert _count(driver, ".panel[data-run='d/tb'] canvas.circuit-qk") == 1

    # run d's map over training: from the last head's first step, the arrow keys; a cell per token takes the focus
    canvas = driver.find_element(By.CSS_SELECTOR, ".panel[data-run='d/tb'] canvas.attr-steps")
    canvas.send_keys(Keys.ARROW_RIGHT)
    assert _status(driver).startswith("layer 1, head 1, step 20: attribution ")
    cell = driver.find_element(By.CSS_SELECTOR, ".panel[data-run='d/tb'] td.attr-cell")
    driver.execute_script("arguments[0].focus()", cell)
    assert _status(driver) == cell.get_attribute("aria-label") == cell.get_attribute("title")
    assert cell.get_attribute("aria-label").startswith("layer 0, head 0: ")


def test_a_run_deleted_while_shown_gives_way_to_another_run(board, logdir, driver):
    """Run "gone/tb" shown beside "b/tb", then its folder deleted: once TensorBoard no longer lists it, the next
    slider move (answered with errors) leaves it for the first run listed, says so, and draws without errors."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    from benchmarks.board import get_json
    from gptmini.board import PLUGIN_NAME

    def listed() -> set[str]:
        return {r["run"] for r in get_json(f"{board}/data/plugin/{PLUGIN_NAME}/runs")["runs"]}

    open_tab(driver, board)
    drawn = _select(driver, ".run-select", "gone/tb", _drawn(driver))
    drawn = _select(driver, ".compare-select", "b/tb", drawn)
    shutil.rmtree(logdir / "gone")
    WebDriverWait(driver, 30).until(lambda _: "gone/tb" not in listed())
    driver.find_element(By.CSS_SELECTOR, ".step-slider").send_keys(Keys.HOME)

    def settled(d) -> bool:
        runs = d.execute_script("return [...document.querySelectorAll('.panel')].map(p => p.dataset.run)")
        return runs == ["a/tb", "b/tb"] and _count(d, ".panel .error") == 0

    WebDriverWait(driver, 30).until(settled)
    assert driver.execute_script("return document.querySelector('.run-select').value") == "a/tb"
    options = driver.execute_script(
        "return [...document.querySelectorAll('.run-select option')].map((o) => o.value)"
    )
    assert "gone/tb" not in options
    status = driver.find_element(By.CSS_SELECTOR, ".status").text
    assert status == "gone/tb: no longer listed (deleted?); showing a/tb", status


def test_the_tab_follows_a_training_run_past_100_validations(board, logdir, driver):
    """Run "live/tb" logs validations while the circuits view shows its newest step: at TensorBoard's reload the
    slider moves on to the new newest step and the attribution map over training gains it; past 100 validations
    too, where TensorBoard keeps a sample of 100 (always with the newest) and their count no longer grows."""
    from urllib.parse import urlencode

    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from benchmarks.board import get_json
    from gptmini.board import PLUGIN_NAME
    from gptmini.board.summary import TAG

    def map_steps(d) -> list[int]:
        canvas = d.find_elements(By.CSS_SELECTOR, "canvas.attr-steps")
        return [int(x) for x in canvas[0].get_attribute("data-steps").split(",")] if canvas else []

    def follow(steps) -> None:
        """``steps`` logged, then TensorBoard's reload: the newest shown, on the slider and in the map."""
        _write_live(logdir / LIVE, steps)
        url = f"{board}/data/plugin/{PLUGIN_NAME}/steps?{urlencode({'run': LIVE, 'tag': TAG})}"
        WebDriverWait(driver, 30).until(lambda _: get_json(url)["steps"][-1] == steps[-1])
        driver.switch_to.default_content()
        driver.find_element(By.CSS_SELECTOR, "button.reload-button").click()
        driver.switch_to.frame(driver.find_element(By.CSS_SELECTOR, "iframe"))
        newest = f"step {steps[-1]}"
        WebDriverWait(driver, 30).until(
            lambda d: d.find_element(By.CSS_SELECTOR, ".step-label").text == newest,
            f"the slider did not move on to {newest}",
        )
        WebDriverWait(driver, 30).until(
            lambda d: map_steps(d)[-1:] == [steps[-1]], f"the attribution map did not gain {newest}"
        )
        assert driver.execute_script(
            "const s = document.querySelector('.step-slider'); return s.value === s.max"
        )

    open_tab(driver, board)
    drawn = _select(driver, ".run-select", LIVE, _drawn(driver))
    driver.find_element(By.CSS_SELECTOR, "button.view-circuits").click()
    wait_drawn(driver, drawn)
    WebDriverWait(driver, 10).until(lambda d: map_steps(d) == [0, 10])
    follow([20])
    follow(list(range(30, 1010, 10)))  # 101 validations: TensorBoard keeps 100
    assert len(driver.execute_script("return window.gptminiAttention.state.steps")) == 100
    follow([1010])
