"""samples.html in a real browser: headless Chromium renders the pages, and their CSS-only filters (cell on a
one-page run, arm and side on every page) hide what they should; a mock job's pages hold every pair once."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from matplotlib.image import imread

from conftest import run_app
from fairaudit.probes.paired_samples import PAIRS
from fairaudit.tracking.samples import POLICY
from sample_pages import artifacts, decision_records

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (shutil.which("chromium") or shutil.which("chromium-browser")),
                                 reason="needs Debian's chromium (apt-get install chromium)")]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
         "--hide-scrollbars", "--window-size=1100,900"]
COUNT = ("<script>function count(q){return [...document.querySelectorAll(q)].filter("
         "e => getComputedStyle(e).display != 'none').length}"
         "document.body.dataset.shown = JSON.stringify({items: count('.item'), think: count('tr.arm-think'), "
         "nothink: count('tr.arm-nothink'), alpha_prime: count('td.side-alpha-prime')})</script>")


def screenshot(page: Path, png: Path) -> None:
    """Chromium's screenshot of a local page (the same flags the README's screenshot was taken with)."""
    subprocess.run([CHROMIUM, *FLAGS, f"--screenshot={png}", page.as_uri()], check=True, capture_output=True,
                   timeout=120)


def inked(png: Path) -> float:
    """Share of pixels that are not (near) white."""
    image = imread(png)[..., :3]
    return float((image.min(axis=-1) < 0.9).mean())


def without_policy(text: str) -> str:
    """A page without its content-security policy, which would refuse the tests' own counting script."""
    return text.replace(f'<meta http-equiv=Content-Security-Policy content="{POLICY}">', "", 1)


def shown(page: Path, choose: str | None = None) -> dict:
    """What Chromium displays of a page (items, arm rows, alpha' cells) with the radio button `choose` checked."""
    text = page.read_text()
    if choose:
        group = choose.rsplit("-", 1)[0] if not choose.startswith("f-") else "f"
        text = text.replace(f"id={group}-all checked", f"id={group}-all").replace(f"id={choose}>",
                                                                                  f"id={choose} checked>")
    probe = page.with_name(f".shown-{page.name}")
    probe.write_text(without_policy(text).replace("</body>", COUNT + "</body>"))  # the count is a script
    dom = subprocess.run([CHROMIUM, *FLAGS, "--dump-dom", probe.as_uri()], capture_output=True, text=True,
                         timeout=180).stdout
    probe.unlink()
    return json.loads(re.search(r'data-shown="([^"]+)"', dom).group(1).replace("&quot;", '"'))


def test_chromium_renders_every_pair_and_the_filter_hides_the_others(tmp_path):
    artifacts(decision_records(), PAIRS, "adult | counterfactual smollm2 think", tmp_path)
    page = tmp_path / "samples.html"
    assert shown(page) == {"items": 3, "think": 3, "nothink": 3, "alpha_prime": 6}
    assert shown(page, "f-c")["items"] == 1 and shown(page, "f-unparsed")["items"] == 1
    only_c = tmp_path / "c.html"
    only_c.write_text(page.read_text().replace("id=f-all checked", "id=f-all").replace("id=f-c>", "id=f-c checked>"))
    screenshot(page, tmp_path / "all.png")
    screenshot(only_c, tmp_path / "c.png")
    assert 0.02 < inked(tmp_path / "c.png") < inked(tmp_path / "all.png")  # one pair drawn instead of three


def run_artifacts(tmp_path: Path, n: int) -> Path:
    """The artifact folder of a counterfactual job on backend=mock: n Adult pairs, 2,000-token traces."""
    done = run_app(tmp_path, "backend=mock", "model=tiny_qwen3", f"dataset.n={n}", "model.max_think_tokens=3000",
                   "backend.trace_tokens.median=2000", timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    (folder,) = (tmp_path / "mlartifacts").glob("*/*/artifacts")
    return folder


@pytest.mark.parametrize("n", [pytest.param(300, id="300 pairs", marks=pytest.mark.long),
                               pytest.param(5000, id="5000 pairs", marks=pytest.mark.paper)])
def test_a_mock_jobs_pages_hold_every_pair_once_and_filter_in_chromium(tmp_path, n):
    folder = run_artifacts(tmp_path, n)
    first = folder / "samples.html"
    assert first.stat().st_size <= 10 * 2**20
    pages = [first, *sorted((folder / "samples").glob("*.html"))]
    records = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]
    cell_of = {r["pair_id"]: r["group"] for r in records}
    seen = []
    for page in pages:
        text = page.read_text()
        pairs = re.findall(r"<h2>pair ([^<]+)<span", text)
        assert len({cell_of[p] for p in pairs}) == 1  # a page holds one cell
        seen += pairs
        for href in re.findall(r"href='([^']+)'", text):
            assert (page.parent / href).resolve().exists(), (page, href)
    assert sorted(seen) == sorted(cell_of)  # every pair, on one page only

    everything = shown(first)
    assert everything["items"] > 0 and everything["think"] == everything["nothink"] == everything["items"]
    cell_c = folder / re.search(r"href='(samples/cell-c-0001\.html)'", first.read_text()).group(1)
    on_c = shown(cell_c)
    assert on_c["items"] == len(re.findall(r"class='item g-c'", cell_c.read_text())) > 0
    assert shown(cell_c, "arm-nothink") == {**on_c, "think": 0}
    assert shown(cell_c, "side-alpha")["alpha_prime"] == 0
