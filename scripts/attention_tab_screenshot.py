"""A screenshot of TensorBoard's ATTENTION tab on a log folder, as docs/images/attention-tab.png shows it:
``python scripts/attention_tab_screenshot.py --logdir outputs --out docs/images/attention-tab.png``.

Starts TensorBoard on 127.0.0.1 (a free port), opens the tab in headless Chromium (benchmarks/board.py, shared
with the browser test), optionally opens the head view of one layer and head, or the neuron, lens or head-map
view of one layer, head and query, and saves the page as PNG."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root holds `benchmarks/`

from benchmarks.board import browser_missing, chrome, open_tab, screenshot, tensorboard, wait_drawn  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--logdir", required=True)
    p.add_argument("--out", default="docs/images/attention-tab.png")
    p.add_argument("--run", default=None, help="the run to show (default: the first)")
    p.add_argument("--beside", default=None, help="a second run side by side")
    p.add_argument("--head", default=None, help="LAYER,HEAD: open this head's head view")
    p.add_argument("--text", default=None, help="show attention on this text (the run's checkpoint)")
    p.add_argument("--hover", type=int, default=None, help="hover this query token in the head view")
    p.add_argument(
        "--view", choices=("neuron", "lens", "map", "circuits"), default=None, help="open this view"
    )
    p.add_argument(
        "--pick",
        default=None,
        help="LAYER,HEAD[,QUERY]: what the neuron view, head map (and circuits, no QUERY) show",
    )
    p.add_argument("--step", type=int, default=None, help="the logged step to show (default: the newest)")
    p.add_argument("--size", default="1500,1000", help="window WIDTH,HEIGHT")
    args = p.parse_args()
    if (missing := browser_missing()) is not None:
        print(f"error: {missing}", file=sys.stderr)
        return 2
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select, WebDriverWait

    width, height = (int(x) for x in args.size.split(","))
    with tensorboard(args.logdir) as url, chrome(width, height) as driver:
        open_tab(driver, url)
        drawn = wait_drawn(driver)
        runs = Select(driver.find_element(By.CSS_SELECTOR, ".run-select"))
        if args.run and runs.first_selected_option.get_attribute("value") != args.run:
            runs.select_by_value(args.run)
            drawn = wait_drawn(driver, drawn)
        if args.beside:
            Select(driver.find_element(By.CSS_SELECTOR, ".compare-select")).select_by_value(args.beside)
            drawn = wait_drawn(driver, drawn)
        if args.text:
            driver.find_element(By.CSS_SELECTOR, ".text-input").send_keys(args.text, Keys.ENTER)
            drawn = wait_drawn(driver, drawn)
        if args.step is not None:
            index = driver.execute_script(
                "return [...document.querySelectorAll('#step-ticks option')].findIndex(o => o.label === arguments[0])",
                str(args.step),
            )
            if index < 0:
                print(f"error: --step {args.step} is not a logged step of the run", file=sys.stderr)
                return 2
            driver.execute_script(
                "const s = document.querySelector('.step-slider'); s.value = arguments[0];"
                "s.dispatchEvent(new Event('input'));",
                index,
            )
            drawn = wait_drawn(driver, drawn)
        if args.view:
            driver.find_element(By.CSS_SELECTOR, f"button.view-{args.view}").click()
            drawn = wait_drawn(driver, drawn)
        if args.pick:
            for name, value in zip(("layer", "head", "query"), args.pick.split(","), strict=False):
                select = Select(driver.find_element(By.CSS_SELECTOR, f".pick-{name}"))
                if select.first_selected_option.get_attribute("value") != value:
                    select.select_by_value(value)
                    drawn = wait_drawn(driver, drawn)
        if args.head:
            layer, head = args.head.split(",")
            driver.find_element(By.CSS_SELECTOR, f'.cell[data-layer="{layer}"][data-head="{head}"]').click()
            drawn = wait_drawn(driver, drawn)
        if args.hover is not None:
            token = driver.find_elements(By.CSS_SELECTOR, ".tok-q")[args.hover]
            ActionChains(driver).move_to_element(token).perform()
        if args.view == "circuits":  # the heads x steps map is filled in when the attribution route answers
            WebDriverWait(driver, 30).until(
                lambda d: d.find_elements(
                    By.CSS_SELECTOR, ".attribution-steps canvas, .attribution-steps .note"
                )
            )
        print(screenshot(driver, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
