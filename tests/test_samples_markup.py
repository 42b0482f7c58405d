"""Sample pages under attack: records whose texts and fields hold markup render it as text in Chromium, no
script runs, and the pages' content-security policy refuses any script that would get past the escaping."""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest

from fairaudit.probes.influence_samples import TRANSCRIPTS
from fairaudit.probes.paired_samples import PAIRS
from fairaudit.probes.position_samples import QUESTIONS
from fairaudit.tracking.samples import POLICY
from sample_pages import artifacts

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(CHROMIUM is None,
                                                   reason="needs Debian's chromium (apt-get install chromium)")]
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
MARK = "document.body.setAttribute('data-pwned', '{}')"  # what each payload's script would do if it ran
PAYLOADS = [
    f"<script>{MARK.format('script')}</script>",
    f"\"><img src=x onerror=\"{MARK.format('img')}\">",
    f"'><svg onload=\"{MARK.format('svg')}\"></svg>",
    f"</pre></td></tr></table><iframe srcdoc=\"<script>parent.{MARK.format('iframe')}</script>\"></iframe>",
    f"</style></title><script>{MARK.format('close')}</script>",
    f"<a href=\"javascript:{MARK.format('link')}\">x</a><base href=\"http://evil.invalid/\">",
    "<meta http-equiv=refresh content=\"0;url=http://evil.invalid/\"><!--",
]
INJECTED = {"script", "img", "svg", "iframe", "base"}  # elements the pages never hold themselves


def attack(index: int) -> str:
    """A text with every payload, rotated so each field starts with another one."""
    return " ".join(PAYLOADS[index % len(PAYLOADS):] + PAYLOADS[:index % len(PAYLOADS)])


def paired_records() -> pd.DataFrame:
    rows = []
    for pair in range(2):
        for arm in ("think", attack(1)):
            for side, value in (("alpha", attack(2)), ("alpha_prime", "Female")):
                rows.append({"pair_id": f"{attack(3)}{pair}", "side": side, "attribute_value": value, "arm": arm,
                             "answer": attack(4), "p_yes": 0.5, "trace_tokens": 3, "prompt": attack(5),
                             "trace": attack(6), "text": attack(0)})
    return pd.DataFrame(rows)


def position_records() -> pd.DataFrame:
    return pd.DataFrame({"question_id": [attack(0)] * 4, "permutation": [0, 1, 2, 3], "gold_position": [0, 1, 2, 3],
                         "answer_position": pd.array([0, 1, None, 3], dtype="Int64"), "answer_source": attack(1),
                         "length_chars": 10, "arm": attack(2), "prompt": attack(3), "text": attack(4)})


def influence_records() -> pd.DataFrame:
    blocks = {f"{name}_tokens": 8 for name in ("a_private", "a_public", "b_private", "b_public")}
    return pd.DataFrame([{"trace_id": 0, "question_id": attack(0), "condition": attack(1), "valid": True, **blocks,
                          "ngram_raw": 0.5, "ngram_corrected": 0.25, "canary": attack(2), "canary_reproduced": False,
                          "text": attack(3)}])


class Elements(HTMLParser):
    """The elements and attribute names of a document, and its text."""

    def __init__(self, html: str):
        super().__init__()
        self.tags: list[str] = []
        self.attributes: list[str] = []
        self.body: dict[str, str | None] = {}
        self.text: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attributes += [name for name, _ in attrs]
        if tag == "body":
            self.body = dict(attrs)

    def handle_data(self, data):
        self.text.append(data)


def rendered(page: Path) -> Elements:
    """The DOM Chromium builds from the page, after its load events."""
    dom = subprocess.run([CHROMIUM, *FLAGS, "--dump-dom", page.as_uri()], capture_output=True, text=True,
                         timeout=180).stdout
    assert "</html>" in dom, dom[-2000:]
    return Elements(dom)


@pytest.mark.parametrize("records, layout", [(paired_records, PAIRS), (position_records, QUESTIONS),
                                             (influence_records, TRANSCRIPTS)], ids=["paired", "position", "influence"])
def test_markup_in_every_text_and_field_renders_as_text_and_runs_nothing(tmp_path, records, layout):
    files = artifacts(records(), layout, f"title {attack(5)}", tmp_path)
    page = tmp_path / "samples.html"
    assert files["samples.html"].count(f'<meta http-equiv=Content-Security-Policy content="{POLICY}">') == 1
    dom = rendered(page)
    assert not INJECTED & set(dom.tags), INJECTED & set(dom.tags)
    assert not [a for a in dom.attributes if a.startswith("on") or a == "srcdoc"]
    assert "data-pwned" not in dom.body and dom.tags.count("meta") == 2  # charset and the policy
    text = "".join(dom.text)
    assert text.count(PAYLOADS[0]) >= 3 and all(payload in text for payload in PAYLOADS)  # shown as written


def test_the_policy_refuses_a_script_that_got_past_the_escaping(tmp_path):
    artifacts(paired_records(), PAIRS, "t", tmp_path)
    shipped = (tmp_path / "samples.html").read_text()
    smuggled = f"<script>{MARK.format('script')}</script><img src=x onerror=\"{MARK.format('img')}\"></body>"
    for name, text in (("with", shipped), ("without", shipped.replace(f"content=\"{POLICY}\"", "content=\"\""))):
        (tmp_path / f"{name}.html").write_text(text.replace("</body>", smuggled))
    assert "data-pwned" not in rendered(tmp_path / "with.html").body
    assert rendered(tmp_path / "without.html").body.get("data-pwned") in ("script", "img")  # the check can see it
