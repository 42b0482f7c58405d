"""samples.html / samples.jsonl: every pair (or MCQ question) side by side, labelled and filterable."""

from __future__ import annotations

import json

import pandas as pd

from fairaudit.samples import artifacts, pair_cells


def decision_records() -> pd.DataFrame:
    """Three pairs: p1 flips under think only (cell c), p2 flips under both (d), p3 has an unparsed answer."""
    answers = {  # (pair, arm) -> (alpha answer, alpha' answer)
        ("p1", "think"): ("Yes", "No"), ("p1", "nothink"): ("No", "No"),
        ("p2", "think"): ("Yes", "No"), ("p2", "nothink"): ("No", "Yes"),
        ("p3", "think"): (None, "No"), ("p3", "nothink"): ("Yes", "Yes"),
    }
    rows = []
    for (pair, arm), sides in answers.items():
        for side, value, answer in zip(("alpha", "alpha_prime"), ("Male", "Female"), sides):
            rows.append({"pair_id": pair, "side": side, "attribute_value": value, "arm": arm, "answer": answer,
                         "p_yes": 0.75 if answer == "Yes" else float("nan") if answer is None else 0.25,
                         "trace_tokens": 3 if arm == "think" else 0,
                         "prompt": f"This person is a {value} <b>{pair}</b>",
                         "trace": f"thinking about {pair} {value}" if arm == "think" else "",
                         "text": f"{answer}"})
    return pd.DataFrame(rows)


def test_pair_cells_follow_the_contingency_definition():
    cells = pair_cells(decision_records())
    assert cells.to_dict() == {"p1": "c", "p2": "d", "p3": "unparsed"}


def test_page_shows_both_sides_both_arms_escaped_and_one_filter_per_cell():
    files = artifacts(decision_records(), "pairs", "adult | counterfactual smollm2 think")
    page = files["samples.html"]
    assert page.startswith("<!DOCTYPE html>") and "<script" not in page and "http" not in page  # self-contained
    assert page.count("<section class='item") == 3
    assert "cell c" in page and "cell d" in page and "cell unparsed" in page
    for cell in ("c", "d", "unparsed"):
        assert f"id=f-{cell}>" in page and f"body:has(#f-{cell}:checked) .item:not(.g-{cell})" in page
    assert "&lt;b&gt;p1&lt;/b&gt;" in page and "<b>p1</b>" not in page
    assert "thinking about p2 Female" in page and "P(Yes) 0.750" in page and "P(Yes) n/a" in page
    assert page.index("Male") < page.index("Female")  # alpha column first


def test_jsonl_has_one_object_per_record_with_its_cell():
    lines = artifacts(decision_records(), "pairs", "t")["samples.jsonl"].splitlines()
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
    files = artifacts(records, "questions", "mmlu | position smollm2 cot")
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
    files = artifacts(traces, "transcripts", "mmlu | influence smollm2")
    page = files["samples.html"]
    assert "&lt;A private&gt; x &lt; y" in page and "<A private>" not in page
    assert "id=f-masked" in page and "id=f-unmasked" in page
    assert page.count("class='item g-masked'") == 1 and page.count("class='item g-unmasked'") == 1
    assert "canary not reproduced" in page and "corrected 0.250" in page
    lines = [json.loads(line) for line in files["samples.jsonl"].splitlines()]
    assert [line["group"] for line in lines] == ["masked", "unmasked"]
