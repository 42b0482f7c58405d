"""samples.html / samples.jsonl: every pair (or MCQ question) side by side, labelled and filterable."""

from __future__ import annotations

import json
import os
import re

import pandas as pd
import pytest

from fairaudit.probes.influence_samples import TRANSCRIPTS
from fairaudit.probes.paired_samples import PAIRS, pair_cells
from fairaudit.probes.position_samples import QUESTIONS
from fairaudit.tracking import samples
from sample_pages import artifacts, decision_records


def test_pair_cells_follow_the_contingency_definition():
    cells = pair_cells(decision_records())
    assert cells.to_dict() == {"p1": "c", "p2": "d", "p3": "unparsed"}


def test_page_shows_both_sides_both_arms_escaped_and_one_filter_per_cell():
    files = artifacts(decision_records(), PAIRS, "adult | counterfactual smollm2 think")
    page = files["samples.html"]
    assert page.startswith("<!DOCTYPE html>") and "<script" not in page and "://" not in page  # self-contained
    assert page.count("<section class='item") == 3
    assert "cell c" in page and "cell d" in page and "cell unparsed" in page
    for cell in ("c", "d", "unparsed"):
        assert f"id=f-{cell}>" in page and f"body:has(#f-{cell}:checked) .item:not(.g-{cell})" in page
    assert "&lt;b&gt;p1&lt;/b&gt;" in page and "<b>p1</b>" not in page
    assert "thinking about p2 Female" in page and "P(Yes) 0.750" in page and "P(Yes) n/a" in page
    assert page.index("Male") < page.index("Female")  # alpha column first


def test_jsonl_has_one_object_per_record_with_its_cell():
    lines = artifacts(decision_records(), PAIRS, "t")["samples.jsonl"].splitlines()
    rows = [json.loads(line) for line in lines]
    assert len(rows) == 12
    assert {(r["pair_id"], r["group"]) for r in rows} == {("p1", "c"), ("p2", "d"), ("p3", "unparsed")}
    assert any(r["p_yes"] is None for r in rows)  # NaN becomes null, valid JSON


def test_mcq_page_groups_each_questions_permutations_by_correct_count():
    records = pd.DataFrame({
        "question_id": [7] * 4 + [9] * 4,
        "permutation": [0, 1, 2, 3] * 2,
        "gold_position": [0, 1, 2, 3] * 2,
        "answer_position": pd.array([0, 1, 2, None, 0, 0, 0, 0], dtype="Int64"),
        "answer_source": ["cascade"] * 8,
        "length_chars": [10] * 8,
        "arm": "cot",
        "prompt": ["Q?"] * 8,
        "text": [f"The answer is {c}" for c in "ABCDAAAA"],
    })
    files = artifacts(records, QUESTIONS, "mmlu | position smollm2 cot")
    page = files["samples.html"]
    assert page.count("<section class='item") == 2
    assert "3/4 correct" in page and "1/4 correct" in page
    assert page.count("permutation 3 (gold D)") == 2
    rows = [json.loads(line) for line in files["samples.jsonl"].splitlines()]
    assert len(rows) == 8 and {r["group"] for r in rows if r["question_id"] == 9} == {"1/4 correct"}


def test_influence_transcripts_are_shown_per_trace_and_filterable_by_graph():
    blocks = {f"{name}_tokens": 8 for name in ("a_private", "a_public", "b_private", "b_public")}
    traces = pd.DataFrame([
        {"trace_id": 0, "question_id": 7, "condition": "masked", "valid": True, **blocks, "ngram_raw": 0.5,
         "ngram_corrected": 0.25, "canary": "zq81", "canary_reproduced": False, "text": "<A private> x < y"},
        {"trace_id": 1, "question_id": 7, "condition": "unmasked", "valid": False, **blocks, "ngram_raw": 0.0,
         "ngram_corrected": 0.0, "canary": None, "canary_reproduced": None, "text": "B says yes"},
    ])
    files = artifacts(traces, TRANSCRIPTS, "mmlu | influence smollm2")
    page = files["samples.html"]
    assert "&lt;A private&gt; x &lt; y" in page and "<A private>" not in page
    assert "id=f-masked" in page and "id=f-unmasked" in page
    assert page.count("class='item g-masked'") == 1 and page.count("class='item g-unmasked'") == 1
    assert "canary not reproduced" in page and "corrected 0.250" in page
    lines = [json.loads(line) for line in files["samples.jsonl"].splitlines()]
    assert [line["group"] for line in lines] == ["masked", "unmasked"]


def many_pairs(n: int, trace_chars: int = 400) -> pd.DataFrame:
    """n pairs cycling through cells a, b, c, d (think against nothink), each think trace `trace_chars` long."""
    patterns = {"a": (("Yes", "Yes"), ("Yes", "Yes")), "b": (("Yes", "Yes"), ("Yes", "No")),
                "c": (("Yes", "No"), ("No", "No")), "d": (("Yes", "No"), ("No", "Yes"))}
    rows = []
    for i in range(n):
        think, nothink = patterns["abcd"[i % 4]]
        for arm, answers in (("think", think), ("nothink", nothink)):
            for side, value, answer in zip(("alpha", "alpha_prime"), ("Male", "Female"), answers):
                trace = f"pair{i} {value} " + "x" * trace_chars if arm == "think" else ""
                rows.append({"pair_id": f"p{i}", "side": side, "attribute_value": value, "arm": arm, "answer": answer,
                             "p_yes": 0.7 if answer == "Yes" else 0.3, "trace_tokens": len(trace) // 4,
                             "truncated": i == 5 and arm == "think", "prompt": f"person {i} {value}",
                             "trace": trace, "text": f"<think>\n{trace}\n</think>\n\n{answer}"})
    return pd.DataFrame(rows)


def test_a_run_beyond_one_page_gets_pages_of_one_cell_each_every_pair_once_every_link_resolving(tmp_path, monkeypatch):
    monkeypatch.setattr(samples, "PAGE_BYTES", 20_000)
    records = many_pairs(80)
    files = artifacts(records, PAIRS, "adult | counterfactual", tmp_path)
    pages = {name: text for name, text in files.items() if name.endswith(".html")}
    assert "samples.html" in pages and len(pages) > 8
    assert all(n == "samples.html" or n.startswith("samples/") for n in pages)
    assert max(len(text) for text in pages.values()) < 40_000  # the budget plus the page's own links and style
    seen = []
    for name, page in pages.items():
        assert len(set(re.findall(r"class='item g-([^']+)'", page))) == 1  # one cell per page
        seen += re.findall(r"<h2>pair (p\d+)<", page)
        for href in re.findall(r"href='([^']+)'", page):
            assert os.path.normpath(os.path.join(os.path.dirname(name), href)) in pages, (name, href)
    assert sorted(seen) == sorted(records["pair_id"].unique())  # every pair, once
    first = pages["samples.html"]
    for cell, count in (("a", 20), ("b", 20), ("c", 20), ("d", 20)):
        assert re.search(rf"href='samples/cell-{cell}-0001\.html'>cell {cell} \({count}\)</a>", first) or \
            f"<b>cell {cell} ({count})</b>" in first
    assert "cut at the token budget" in "".join(pages.values())
    assert len(files["samples.jsonl"].splitlines()) == len(records)


def test_arm_and_side_radios_show_one_arm_or_one_side_on_every_page():
    page = artifacts(many_pairs(4), PAIRS, "t")["samples.html"]
    for facet, value in (("arm", "think"), ("arm", "nothink"), ("side", "alpha"), ("side", "alpha-prime")):
        assert f"id={facet}-{value}>" in page
        assert f"body:has(#{facet}-{value}:checked) .{facet}:not(.{facet}-{value}){{display:none}}" in page
    assert page.count("<tr class='arm arm-think'>") == 4 and page.count("class='side side-alpha-prime'") == 4 * 3
    assert "[the thinking trace above]" in page  # the output repeats the answer, not the trace


@pytest.mark.parametrize("pairs", [1, 3])
def test_a_small_run_is_one_page_whose_radios_filter_by_cell(pairs):
    page = artifacts(many_pairs(pairs), PAIRS, "t")
    assert set(page) == {"samples.html", "samples.jsonl"}
    assert page["samples.html"].count("<section class='item") == pairs


def test_a_trace_of_only_whitespace_up_to_the_budget_says_so():
    from fairaudit.probes.paired_samples import trace_length

    assert trace_length({"trace_tokens": 0, "truncated": True, "text": "\n" * 24}) == (
        "0 trace tokens: <span class=cut>the whole token budget went on whitespace</span>")
    assert trace_length({"trace_tokens": 12, "truncated": True, "text": "x"}) == (
        "12 trace tokens &middot; <span class=cut>cut at the token budget</span>")
    assert trace_length({"trace_tokens": 0, "truncated": False, "text": " Yes"}) == "0 trace tokens"
    assert trace_length({"trace_tokens": 0, "truncated": True, "text": "Yes, because"}) == (
        "0 trace tokens &middot; <span class=cut>cut at the token budget</span>")  # a nothink answer the budget cut
