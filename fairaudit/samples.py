"""Per-sample views of a run's records: `samples.html` (one self-contained page) and `samples.jsonl`.

Counterfactual records show each pair side by side: the two protected values as columns, the
arms as rows, each with its answer, P(Yes), thinking trace and prompt; a pair is labelled with
its contingency cell (a-d, or "unparsed"). MCQ records show each question's permutations side
by side, labelled by how many were answered correctly. Filtering is pure CSS (radio buttons and
`:has`), so it works in MLflow's artifact viewer whether or not its frame runs scripts.
"""

from __future__ import annotations

import html
import math

import pandas as pd

from fairaudit.analysis.contingency import cell_labels
from fairaudit.analysis.pairs import SIDES, complete_pairs

LETTERS = "ABCD"
UNPARSED = "unparsed"

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1em;color:#222}
h1{font-size:1.2em;margin:0 0 .5em}
.filters{position:sticky;top:0;background:#fff;padding:.4em 0;border-bottom:1px solid #ccc;z-index:1}
.filters label{margin-right:1em;cursor:pointer}
.item{border:1px solid #ccc;border-radius:6px;margin:.8em 0;padding:.5em}
.item h2{font-size:1em;margin:0 0 .4em}
.tag{display:inline-block;padding:0 .5em;border-radius:1em;background:#eef;margin-left:.5em}
table{border-collapse:collapse;width:100%;table-layout:fixed}
th,td{border:1px solid #ddd;padding:.3em;vertical-align:top;text-align:left}
th{background:#f6f6f6}
pre{white-space:pre-wrap;word-break:break-word;max-height:16em;overflow:auto;margin:.2em 0;background:#fafafa;font-size:12px}
.yes{color:#0a6b0a;font-weight:bold}.no{color:#a01010;font-weight:bold}.none{color:#888}
details summary{cursor:pointer;color:#555}
"""


def artifacts(records: pd.DataFrame, layout: str, title: str) -> dict[str, str]:
    """{artifact file: text}: samples.html and samples.jsonl of a run's records in a `LAYOUTS` layout
    (the probe's `samples` view names it)."""
    items_of, label_prefix = LAYOUTS[layout]
    labelled, items = items_of(records)
    return {"samples.html": _page(title, sorted(set(labelled["group"])), items, label_prefix),
            "samples.jsonl": labelled.to_json(orient="records", lines=True, force_ascii=False)}


def pair_cells(records: pd.DataFrame) -> pd.Series:
    """Contingency cell of every pair_id (treatment = the records' first arm), "unparsed" where a side has no answer."""
    arms = list(dict.fromkeys(records["arm"]))
    pair_ids = pd.Index(records["pair_id"].unique(), name="pair_id")
    if len(arms) != 2:
        return pd.Series(arms[0] if arms else UNPARSED, index=pair_ids, name="cell")
    cells = cell_labels(complete_pairs(records, arms[0], arms[1]), arms[0], arms[1])
    return cells.reindex(pair_ids).fillna(UNPARSED)


def _pair_items(records: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    cells = pair_cells(records)
    labelled = records.assign(group=records["pair_id"].map(cells))
    arms = list(dict.fromkeys(records["arm"]))
    items = []
    for pair_id, rows in labelled.groupby("pair_id", sort=False):
        by_key = {(r["arm"], r["side"]): r for r in rows.to_dict("records")}
        values = [next((r["attribute_value"] for (a, s), r in by_key.items() if s == side), side) for side in SIDES]
        head = "".join(f"<th>{_esc(v)} <span class=none>({side})</span></th>" for v, side in zip(values, SIDES))
        body = "".join(f"<tr><th>{_esc(arm)}</th>" + "".join(_pair_cell(by_key.get((arm, side))) for side in SIDES) + "</tr>"
                       for arm in arms)
        group = cells[pair_id]
        items.append(_item(group, f"pair {_esc(pair_id)}<span class=tag>cell {_esc(group)}</span>",
                           f"<table><tr><th style='width:7em'>arm</th>{head}</tr>{body}</table>"))
    return labelled, items


def _pair_cell(row: dict | None) -> str:
    if row is None:
        return "<td class=none>no record</td>"
    answer = row.get("answer") if isinstance(row.get("answer"), str) else None  # null answers come back as NaN
    css = {"Yes": "yes", "No": "no"}.get(answer, "none")
    trace = row.get("trace") or ""
    parts = [f"answer <span class={css}>{_esc(answer or 'none')}</span> &middot; P(Yes) {_num(row.get('p_yes'))}"
             f" &middot; {int(row.get('trace_tokens') or 0)} trace tokens",
             f"<details open><summary>thinking trace</summary><pre>{_esc(trace) or '(empty)'}</pre></details>" if trace else "",
             f"<details><summary>output</summary><pre>{_esc(row.get('text', ''))}</pre></details>",
             f"<details><summary>prompt</summary><pre>{_esc(row.get('prompt', ''))}</pre></details>"]
    return "<td>" + "".join(parts) + "</td>"


def _question_items(records: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    correct = records["answer_position"].eq(records["gold_position"]).fillna(False)
    per_question = correct.groupby(records["question_id"]).agg(["sum", "size"])
    groups = {q: f"{int(r['sum'])}/{int(r['size'])} correct" for q, r in per_question.iterrows()}
    labelled = records.assign(group=records["question_id"].map(groups))
    items = []
    for question_id, rows in labelled.groupby("question_id", sort=True):
        rows = rows.sort_values("permutation").to_dict("records")
        head = "".join(f"<th>permutation {r['permutation']} (gold {LETTERS[int(r['gold_position'])]})</th>" for r in rows)
        body = "".join(_question_cell(r) for r in rows)
        items.append(_item(groups[question_id], f"question {question_id}<span class=tag>{groups[question_id]}</span>"
                           f"<span class=tag>arm {_esc(rows[0]['arm'])}</span>", f"<table><tr>{head}</tr><tr>{body}</tr></table>"))
    return labelled, items


def _question_cell(row: dict) -> str:
    position = row.get("answer_position")
    letter = None if position is None or pd.isna(position) else LETTERS[int(position)]
    css = "none" if letter is None else "yes" if int(position) == int(row["gold_position"]) else "no"
    parts = [f"answer <span class={css}>{letter or 'none'}</span> ({_esc(row.get('answer_source', ''))})"
             f" &middot; {int(row.get('length_chars') or 0)} chars",
             f"<details open><summary>output</summary><pre>{_esc(row.get('text', ''))}</pre></details>",
             f"<details><summary>prompt</summary><pre>{_esc(row.get('prompt', ''))}</pre></details>" if "prompt" in row else ""]
    return "<td>" + "".join(parts) + "</td>"


def _transcript_items(traces: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    # traces: trace_id, question_id, condition, valid, *_tokens, ngram_raw, ngram_corrected, canary(_reproduced), text
    labelled = traces.assign(group=traces["condition"].astype(str))
    items = []
    for row in labelled.sort_values(["question_id", "condition"]).to_dict("records"):
        lengths = " &middot; ".join(f"{name} {int(row[f'{name}_tokens'])}" for name in ("a_private", "a_public", "b_private", "b_public"))
        facts = (f"{'valid' if row['valid'] else 'invalid'} &middot; tokens: {lengths} &middot; 4-gram overlap raw "
                 f"{_num(row['ngram_raw'])}, corrected {_num(row['ngram_corrected'])}"
                 + (f" &middot; canary {'reproduced' if row['canary_reproduced'] else 'not reproduced'}" if row.get("canary") else ""))
        items.append(_item(row["group"], f"trace {row['trace_id']} &middot; question {_esc(row['question_id'])}"
                           f"<span class=tag>{_esc(row['group'])}</span>", f"<p>{facts}</p><pre>{_esc(row['text'])}</pre>"))
    return labelled, items


LAYOUTS = {  # layout -> (labelled records and their HTML items, the filter's label prefix)
    "pairs": (_pair_items, "cell "),                # counterfactual pairs: sides as columns, arms as rows
    "questions": (_question_items, ""),             # MCQ questions: permutations side by side
    "transcripts": (_transcript_items, ""),         # role-channel transcripts, by visibility graph
}


def _item(group: str, heading: str, body: str) -> str:
    return f"<section class='item g-{_slug(group)}'><h2>{heading}</h2>{body}</section>"


def _page(title: str, groups: list[str], items: list[str], label_prefix: str = "") -> str:
    """The whole page; one radio button per group hides every item outside it (CSS only)."""
    radios = ["<input type=radio name=f id=f-all checked><label for=f-all>all</label>"]
    rules = []
    for group in groups:
        slug = _slug(group)
        radios.append(f"<input type=radio name=f id=f-{slug}><label for=f-{slug}>{_esc(label_prefix + group)}</label>")
        rules.append(f"body:has(#f-{slug}:checked) .item:not(.g-{slug}){{display:none}}")
    return (f"<!DOCTYPE html><html><head><meta charset=utf-8><title>{_esc(title)}</title>"
            f"<style>{STYLE}{''.join(rules)}</style></head><body><h1>{_esc(title)}</h1>"
            f"<div class=filters>show: {''.join(radios)}</div><main>{''.join(items)}</main></body></html>")


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in str(text))


def _esc(value) -> str:
    return html.escape("" if value is None else str(value))


def _num(value) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{float(value):.3f}"
