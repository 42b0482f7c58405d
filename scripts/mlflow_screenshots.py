"""The MLflow UI views docs/studies.md names, as Chromium renders them at 1,400 x 900: docs/mlflow_*.png.

Playwright drives Debian's chromium (`apt-get install -y chromium`); install it in a venv of its own
(`python -m venv /tmp/shots && /tmp/shots/bin/pip install playwright`, no browser download needed).
Serve the store of docs/studies.md's example on loopback (`mlflow ui --port 5055 ...`), then

    /tmp/shots/bin/python scripts/mlflow_screenshots.py docs http://127.0.0.1:5055/ SWEEP_PARENT_RUN_ID \\
        SEED_PARENT_RUN_ID RUN_ID

with the parent run ids of that example's first sweep and of its seed study, and the id of its plain run. Each view
opens as the URL a run or sweep prints opens it, nothing clicked but the assistant panel's close button (and, for
the seed study's parent, a search of its metric charts; for the artifacts, samples.html).
"""
import os
import sys

from playwright.sync_api import sync_playwright

VIEW = "?workflowType=machine_learning"
WAIT = int(os.environ.get("WAIT_MS", "15000"))  # a loaded machine's `mlflow ui` takes seconds to fill a page
out, base, sweep, seed_parent, run = sys.argv[1:6]

with sync_playwright() as p:
    browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"])

    def shot(url: str, name: str, search: str | None = None, click: str | None = None) -> None:
        page = browser.new_page(viewport={"width": 1400, "height": 900})  # a fresh page per view: no state carried
        page.goto(base + url)
        page.wait_for_load_state("load")
        page.wait_for_timeout(WAIT)
        button = page.locator("button[aria-label='Close']").first
        if "workflowType" in url and button.count():
            button.click(timeout=3000)
            page.wait_for_timeout(800)
        if search:
            page.get_by_placeholder("Search metric charts").fill(search)
            page.wait_for_timeout(WAIT // 2)
        if click:
            page.get_by_text(click, exact=True).first.click()
            page.wait_for_timeout(WAIT // 2)
        page.screenshot(path=f"{out}/{name}.png")
        page.close()

    shot("#/experiments/1", "mlflow_genai_view")
    shot(f"#/experiments/1/runs{VIEW}&viewStateShareKey=fairaudit-jobs", "mlflow_runs")  # every run prints it
    shot(f"#/experiments/1/runs/{run}{VIEW}", "mlflow_run")
    shot(f"#/experiments/1/runs/{seed_parent}/model-metrics{VIEW}", "mlflow_parent_steps", search="p_gap_think")
    shot(f"#/experiments/1/runs/{run}/artifacts{VIEW}", "mlflow_artifacts", click="samples.html")
    shot(f"#/experiments/1/runs{VIEW}&viewStateShareKey={sweep}", "mlflow_sweep_view")  # compare its jobs: ...
    shot(f"#/experiments/1/runs{VIEW}&viewStateShareKey={sweep}&compareRunsMode=CHART", "mlflow_sweep_chart")
    browser.close()
