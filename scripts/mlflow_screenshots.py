"""The MLflow UI views docs/studies.md names, as Chromium renders them: docs/mlflow_*.png.

Playwright drives Debian's chromium (`apt-get install -y chromium`); install it in a venv of its own
(`python -m venv /tmp/shots && /tmp/shots/bin/pip install playwright`, no browser download needed).
Serve the store of docs/studies.md's example on loopback (`mlflow ui --port 5055 ...`), then

    /tmp/shots/bin/python scripts/mlflow_screenshots.py docs http://127.0.0.1:5055/ SEED_PARENT_RUN_ID RUN_ID

The runs table's row positions (the three sweep parents' expanders) assume that example's store. With `--view
SWEEP_PARENT_RUN_ID` it takes only docs/mlflow_sweep_view.png: the view a sweep prints (`compare its jobs: ...`),
e.g. of `fairaudit -m dataset=adult,compas,credit`.
"""
import sys

from playwright.sync_api import sync_playwright

VIEW = "?workflowType=machine_learning"
if sys.argv[1] == "--view":
    sweep_view, out, base = sys.argv[2:5]
    seed_parent = run = None
else:
    out, base, seed_parent, run = sys.argv[1:5]
    sweep_view = None

with sync_playwright() as p:
    browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"])
    page = None

    def go(url, wait=7000):
        global page
        page = browser.new_page(viewport={"width": 1400, "height": 860})  # a fresh page per view: no state carried over
        page.goto(base + url)
        page.wait_for_load_state("load")
        page.wait_for_timeout(wait)

    def close_assistant():
        button = page.locator("button[aria-label='Close']").first
        if button.count():
            button.click(timeout=3000)
            page.wait_for_timeout(800)

    if sweep_view:
        go(f"#/experiments/1/runs{VIEW}&viewStateShareKey={sweep_view}&compareRunsMode=CHART", wait=12000)
        close_assistant()
        page.screenshot(path=f"{out}/mlflow_sweep_view.png")
        browser.close()
        sys.exit(0)

    go("#/experiments/1")
    page.screenshot(path=f"{out}/mlflow_genai_view.png")

    go(f"#/experiments/1{VIEW}")
    close_assistant()
    search = page.get_by_placeholder("Search columns")
    for name in ["n_pairs", "cell_c", "p_gap_think", "Source", "Models"]:
        if not (search.count() and search.is_visible()):  # ticking an attribute closes the menu
            page.get_by_role("button", name="Columns").click()
            page.wait_for_timeout(1500)
        search.fill(name)
        page.wait_for_timeout(800)
        page.locator("[data-radix-popper-content-wrapper]").get_by_text(name, exact=True).first.click()
        page.wait_for_timeout(500)
    page.keyboard.press("Escape")
    page.wait_for_timeout(800)
    for y in (361, 329, 297):  # the three sweep parents' expanders, bottom up
        page.mouse.click(319, y)
        page.wait_for_timeout(1200)
    page.screenshot(path=f"{out}/mlflow_runs.png")

    go(f"#/experiments/1/runs/{run}{VIEW}")
    close_assistant()
    page.mouse.move(600, 500)
    page.mouse.wheel(0, 420)  # down to the Description: the verdict
    page.wait_for_timeout(1500)
    page.screenshot(path=f"{out}/mlflow_run.png")

    go(f"#/experiments/1/runs/{seed_parent}/model-metrics{VIEW}", wait=12000)
    close_assistant()
    page.get_by_placeholder("Search metric charts").fill("p_gap_think")
    page.wait_for_timeout(6000)
    page.screenshot(path=f"{out}/mlflow_parent_steps.png")

    go(f"#/experiments/1/runs/{run}/artifacts{VIEW}")
    close_assistant()
    page.get_by_text("samples.html", exact=True).first.click()
    page.wait_for_timeout(6000)
    page.screenshot(path=f"{out}/mlflow_artifacts.png")
    browser.close()
