"""How `samples.html` shows a paired probe's records: one item per counterfactual pair, the two protected
values as columns and the arms as rows (answer, P(Yes), thinking trace, output, prompt), labelled by
the pair's contingency cell a-d, or "unparsed" where a side has no answer."""

from __future__ import annotations

import pandas as pd

from fairaudit.analysis.contingency import cell_labels
from fairaudit.analysis.pairs import SIDES, complete_pairs
from fairaudit.views.pages import Layout, esc, item, slug, three_decimals

UNPARSED = "unparsed"


def pair_cells(records: pd.DataFrame) -> pd.Series:
    """Contingency cell of every pair_id (treatment = the records' first arm), "unparsed" where a side has no answer."""
    arms = list(dict.fromkeys(records["arm"]))
    pair_ids = pd.Index(records["pair_id"].unique(), name="pair_id")
    if len(arms) != 2:
        return pd.Series(arms[0] if arms else UNPARSED, index=pair_ids, name="cell")
    cells = cell_labels(complete_pairs(records, arms[0], arms[1]), arms[0], arms[1])
    return cells.reindex(pair_ids).fillna(UNPARSED)


def pair_item(rows: list[dict], group: str) -> str:
    """A pair: the two protected values as columns, the arms as rows."""
    by_key = {(r["arm"], r["side"]): r for r in rows}
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    values = [next((r["attribute_value"] for (a, s), r in by_key.items() if s == side), side) for side in SIDES]
    head = "".join(f"<th class='side side-{slug(side)}'>{esc(v)} <span class=none>({side})</span></th>"
                   for v, side in zip(values, SIDES))
    body = "".join(f"<tr class='arm arm-{slug(arm)}'><th>{esc(arm)}</th>"
                   + "".join(pair_cell(by_key.get((arm, side)), side) for side in SIDES) + "</tr>" for arm in arms)
    return item(group, f"pair {esc(rows[0]['pair_id'])}<span class=tag>cell {esc(group)}</span>",
                f"<table><tr><th style='width:7em'>arm</th>{head}</tr>{body}</table>")


def pair_cell(row: dict | None, side: str) -> str:
    """One side of a pair under one arm: answer, P(Yes), trace length, trace, output and prompt."""
    cell = f"<td class='side side-{slug(side)}'>"
    if row is None:
        return f"{cell}<span class=none>no record</span></td>"
    answer = row.get("answer") if isinstance(row.get("answer"), str) else None  # null answers come back as NaN
    css = {"Yes": "yes", "No": "no"}.get(answer, "none")
    trace = row.get("trace") or ""
    text = str(row.get("text", "") or "")
    shown = text.replace(trace, "[the thinking trace above]", 1) if trace and trace in text else text
    parts = [f"answer <span class={css}>{esc(answer or 'none')}</span> &middot; P(Yes) "
             f"{three_decimals(row.get('p_yes'))} &middot; {trace_length(row)}",
             f"<details open><summary>thinking trace</summary><pre>{esc(trace) or '(empty)'}</pre></details>"
             if trace else "",
             f"<details><summary>output</summary><pre>{esc(shown)}</pre></details>",
             f"<details><summary>prompt</summary><pre>{esc(row.get('prompt', ''))}</pre></details>"]
    return cell + "".join(parts) + "</td>"


def trace_length(row: dict) -> str:
    """The trace's length and whether the token budget cut the generation; a generation of nothing but whitespace
    up to the budget (0 trace tokens once stripped) says so, instead of a bare "0 trace tokens, cut"."""
    tokens, cut = int(row.get("trace_tokens") or 0), row.get("truncated") is True
    if not tokens and cut and not str(row.get("text") or "").strip():
        return "0 trace tokens: <span class=cut>the whole token budget went on whitespace</span>"
    return f"{tokens} trace tokens" + (" &middot; <span class=cut>cut at the token budget</span>" if cut else "")


PAIRS = Layout("pair_id", lambda r: r["pair_id"].map(pair_cells(r)), pair_item, "cell ", ("arm", "side"))
