"""samples.html in a real browser: headless Chromium renders it, and its CSS-only cell filter hides other cells."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from matplotlib.image import imread

from fairaudit.samples import artifacts
from test_samples import decision_records

pytestmark = pytest.mark.slow
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
         "--hide-scrollbars", "--window-size=1100,900"]


def screenshot(page: Path, png: Path) -> None:
    """Chromium's screenshot of a local page (the same flags the README's screenshot was taken with)."""
    subprocess.run([CHROMIUM, *FLAGS, f"--screenshot={png}", page.as_uri()], check=True, capture_output=True, timeout=120)


def inked(png: Path) -> float:
    """Share of pixels that are not (near) white."""
    image = imread(png)[..., :3]
    return float((image.min(axis=-1) < 0.9).mean())


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")
def test_chromium_renders_every_pair_and_the_filter_hides_the_others(tmp_path):
    page = artifacts(decision_records(), "pairs", "adult | counterfactual smollm2 think")["samples.html"]
    every, only_c = tmp_path / "all.html", tmp_path / "c.html"
    every.write_text(page)
    only_c.write_text(page.replace("id=f-all checked", "id=f-all").replace("id=f-c>", "id=f-c checked>"))
    dom = subprocess.run([CHROMIUM, *FLAGS, "--dump-dom", every.as_uri()], capture_output=True, text=True, timeout=120).stdout
    assert dom.count("<section class=\"item") == 3 and "thinking about p2 Female" in dom
    screenshot(every, tmp_path / "all.png")
    screenshot(only_c, tmp_path / "c.png")
    assert 0.02 < inked(tmp_path / "c.png") < inked(tmp_path / "all.png")  # one pair drawn instead of three
