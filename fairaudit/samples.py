"""Per-sample views of a run's records: `samples.html` (the first page), `samples/*.html` and `samples.jsonl`.

A probe's `samples` view names its records frame and a layout (`LAYOUTS`): what one item gathers
(a counterfactual pair: the two protected values as columns, the arms as rows, each with its answer,
P(Yes), thinking trace, output and prompt; an MCQ question's permutations side by side; a
role-channel transcript) and what labels it (the pair's contingency cell a-d or "unparsed", the
question's count of correct answers, the transcript's graph). Pages are pure HTML and CSS, so they
work in MLflow's sandboxed artifact viewer: radio buttons show one value of a facet (arm, side).
A run whose items fit one page gets one samples.html whose radio buttons also filter by label. A
larger one gets pages of at most PAGE_BYTES, each holding one label's items: samples.html is the
first, the others are samples/<label>-<n>.html, linked from every page (the filter over all
records is the choice of a label's pages), so the page a browser opens first stays small whatever
the job's size and every trace is on some page. samples.jsonl holds every record with its `group`.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pandas as pd

from fairaudit.analysis.contingency import cell_labels
from fairaudit.analysis.pairs import SIDES, complete_pairs

LETTERS = "ABCD"
UNPARSED = "unparsed"
PAGE_BYTES = 2_000_000   # items per page, in bytes of HTML
PAGE_ITEMS = 200         # and in items
SLICE = 500              # items whose records are read out of the frame at a time
PAGER_SPAN = 5           # page links shown either side of the current one
TEXT_COLUMNS = ("prompt", "trace", "text")

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1em;color:#222}
h1{font-size:1.2em;margin:0 0 .5em}
.filters{position:sticky;top:0;background:#fff;padding:.4em 0;border-bottom:1px solid #ccc;z-index:1}
.filters label{margin-right:1em;cursor:pointer}
nav{margin:.3em 0}nav a,nav b{margin-right:.5em}
.item{border:1px solid #ccc;border-radius:6px;margin:.8em 0;padding:.5em}
.item h2{font-size:1em;margin:0 0 .4em}
.tag{display:inline-block;padding:0 .5em;border-radius:1em;background:#eef;margin-left:.5em}
table{border-collapse:collapse;width:100%;table-layout:fixed}
th,td{border:1px solid #ddd;padding:.3em;vertical-align:top;text-align:left}
th{background:#f6f6f6}
pre{white-space:pre-wrap;word-break:break-word;max-height:16em;overflow:auto;margin:.2em 0;background:#fafafa;font-size:12px}
.yes{color:#0a6b0a;font-weight:bold}.no{color:#a01010;font-weight:bold}.none{color:#888}.cut{color:#a05000}
details summary{cursor:pointer;color:#555}
"""


@dataclass(frozen=True)
class Layout:
    """How records become items: the column an item gathers, each record's label, one item's HTML
    (its records, its label), the filter's label prefix, the facets its HTML marks, and the
    columns records are ordered by first."""

    unit: str
    label: Callable[[pd.DataFrame], pd.Series]
    item: Callable[[list[dict], str], str]
    prefix: str = ""
    facets: tuple[str, ...] = ()
    order: tuple[str, ...] = ()


def write(records: pd.DataFrame, layout: str, title: str, folder: Path) -> list[Path]:
    """samples.html (and samples/*.html when the items need more than one page) and samples.jsonl
    of a run's records in a `LAYOUTS` layout (the probe's `samples` view names it), written into
    `folder`; returns the files written."""
    spec = LAYOUTS[layout]
    labelled = records.assign(group=np.asarray(spec.label(records), dtype=object))
    if spec.order:
        labelled = labelled.sort_values(list(spec.order), kind="stable")
    groups = sorted(set(labelled["group"]))
    folder.mkdir(parents=True, exist_ok=True)
    files = [_write_jsonl(labelled, folder / "samples.jsonl")]
    facets = {f: [str(v) for v in dict.fromkeys(labelled[f])] for f in spec.facets if f in labelled}
    page = Page(title, facets, spec.prefix)
    items = _items(labelled, spec, groups)
    if _html_estimate(labelled) <= PAGE_BYTES // 2:
        counts = labelled.drop_duplicates(spec.unit)["group"].value_counts().to_dict()
        (folder / "samples.html").write_text(page.single([h for _, h in items], groups, counts))
        return [*files, folder / "samples.html"]
    return files + _write_pages(items, page, folder)


def pair_cells(records: pd.DataFrame) -> pd.Series:
    """Contingency cell of every pair_id (treatment = the records' first arm), "unparsed" where a side has no answer."""
    arms = list(dict.fromkeys(records["arm"]))
    pair_ids = pd.Index(records["pair_id"].unique(), name="pair_id")
    if len(arms) != 2:
        return pd.Series(arms[0] if arms else UNPARSED, index=pair_ids, name="cell")
    cells = cell_labels(complete_pairs(records, arms[0], arms[1]), arms[0], arms[1])
    return cells.reindex(pair_ids).fillna(UNPARSED)


def _write_jsonl(labelled: pd.DataFrame, path: Path, chunk: int = 2000) -> Path:
    """The labelled records as JSON lines, a chunk at a time."""
    with open(path, "w", encoding="utf-8") as handle:
        for start in range(0, len(labelled), chunk):
            text = labelled.iloc[start:start + chunk].to_json(orient="records", lines=True, force_ascii=False)
            handle.write(text if text.endswith("\n") else text + "\n")
    return path


def _html_estimate(labelled: pd.DataFrame) -> int:
    """Bytes the records' HTML takes, roughly: their texts plus a fixed share per record."""
    texts = sum(int(labelled[c].astype(str).str.len().sum()) for c in TEXT_COLUMNS if c in labelled)
    return texts + 600 * len(labelled)


def _items(labelled: pd.DataFrame, spec: Layout, groups: list[str]) -> Iterator[tuple[str, str]]:
    """(label, HTML) of every item, labels in `groups` order, items in the order their records first appear."""
    first = {u: i for i, u in enumerate(dict.fromkeys(labelled[spec.unit]))}
    rank = {g: i for i, g in enumerate(groups)}
    order = np.lexsort((labelled[spec.unit].map(first).to_numpy(), labelled["group"].map(rank).to_numpy()))
    units = labelled[spec.unit].to_numpy()[order]
    starts = [*np.flatnonzero(np.r_[True, units[1:] != units[:-1]]).tolist(), len(units)] if len(units) else [0]
    for s in range(0, len(starts) - 1, SLICE):
        bounds = starts[s:s + SLICE + 1]
        rows = labelled.iloc[order[bounds[0]:bounds[-1]]].to_dict("records")  # a slice at a time: texts are large
        for a, b in zip(bounds, bounds[1:]):
            unit_rows = rows[a - bounds[0]:b - bounds[0]]
            yield unit_rows[0]["group"], spec.item(unit_rows, unit_rows[0]["group"])


def _page_name(group: str, number: int, prefix: str) -> str:
    return f"samples/{_slug(prefix + group)}-{number:04d}.html"


def _write_pages(items: Iterator[tuple[str, str]], page: "Page", folder: Path) -> list[Path]:
    """Items in pages of one label each, at most PAGE_BYTES and PAGE_ITEMS; the first is samples.html."""
    (folder / "samples").mkdir(exist_ok=True)
    plan: list[list] = []  # [group, number in group, item count, body file]
    body, size, group = [], 0, None
    for item_group, item in _with_end(items):
        if body and (item_group != group or size + len(item) > PAGE_BYTES or len(body) >= PAGE_ITEMS):
            number = sum(1 for p in plan if p[0] == group) + 1
            part = folder / "samples" / f".part-{len(plan)}"
            part.write_text("".join(body))
            plan.append([group, number, len(body), part])
            body, size = [], 0
        if item_group is None:
            break
        group = item_group
        body.append(item)
        size += len(item)
    names = ["samples.html"] + [_page_name(g, n, page.prefix) for g, n, _, _ in plan[1:]]
    written = []
    for index, (g, n, count, part) in enumerate(plan):
        nav = page.nav(plan, names, index)
        path = folder / names[index]
        path.write_text(page.paged(nav, part.read_text(), g, n, count))
        part.unlink()
        written.append(path)
    return written


def _with_end(items: Iterator[tuple[str, str]]) -> Iterator[tuple[str | None, str]]:
    yield from items
    yield None, ""


def _href(target: str, here: str) -> str:
    """A link from page `here` to page `target`, both named from the run's artifact root."""
    if not here.startswith("samples/"):
        return target
    return target.removeprefix("samples/") if target.startswith("samples/") else f"../{target}"


@dataclass(frozen=True)
class Page:
    """What every page of one run shares: its title, its facets (column -> values) and the label prefix."""

    title: str
    facets: dict[str, list[str]]
    prefix: str = ""

    def _document(self, rules: list[str], controls: str, body: str) -> str:
        facet_rules = [f"body:has(#{f}-{_slug(v)}:checked) .{f}:not(.{f}-{_slug(v)}){{display:none}}"
                       for f, values in self.facets.items() for v in values]
        return (f"<!DOCTYPE html><html><head><meta charset=utf-8><title>{_esc(self.title)}</title>"
                f"<style>{STYLE}{''.join(rules + facet_rules)}</style></head><body><h1>{_esc(self.title)}</h1>"
                f"<div class=filters>{controls}{self._facet_radios()}</div><main>{body}</main></body></html>")

    def _facet_radios(self) -> str:
        rows = []
        for facet, values in self.facets.items():
            radios = [f"<input type=radio name={facet} id={facet}-all checked><label for={facet}-all>all</label>"]
            radios += [f"<input type=radio name={facet} id={facet}-{_slug(v)}><label for={facet}-{_slug(v)}>{_esc(v)}</label>"
                       for v in values]
            rows.append(f"<div>{_esc(facet)}: {''.join(radios)}</div>")
        return "".join(rows)

    def single(self, items: list[str], groups: list[str], counts: dict) -> str:
        """One page of every item; radio buttons per label hide the items outside it (CSS only)."""
        radios = [f"<input type=radio name=f id=f-all checked><label for=f-all>all ({sum(counts.values())})</label>"]
        rules = []
        for group in groups:
            slug = _slug(group)
            radios.append(f"<input type=radio name=f id=f-{slug}><label for=f-{slug}>{_esc(self.prefix + group)} "
                          f"({counts.get(group, 0)})</label>")
            rules.append(f"body:has(#f-{slug}:checked) .item:not(.g-{slug}){{display:none}}")
        return self._document(rules, f"<div>show: {''.join(radios)}</div>", "".join(items))

    def nav(self, plan: list[list], names: list[str], index: int) -> str:
        """Links from page `index`: every label's first page, this label's pages, the previous and next page."""
        here, group = names[index], plan[index][0]
        totals: dict[str, int] = {}
        firsts: dict[str, int] = {}
        for i, (g, _, count, _) in enumerate(plan):
            totals[g] = totals.get(g, 0) + count
            firsts.setdefault(g, i)
        link = lambda i, text: f"<a href='{_href(names[i], here)}'>{text}</a>"  # noqa: E731
        labels = [f"<b>{_esc(self.prefix + g)} ({totals[g]})</b>" if g == group else link(i, f"{_esc(self.prefix + g)} ({totals[g]})")
                  for g, i in firsts.items()]
        own = [i for i, p in enumerate(plan) if p[0] == group]
        shown = [i for i in own if abs(i - index) <= PAGER_SPAN or i in (own[0], own[-1])]
        pages = [f"<b>{plan[i][1]}</b>" if i == index else link(i, str(plan[i][1])) for i in shown]
        steps = [link(index - 1, "&lsaquo; previous page") if index else "",
                 link(index + 1, "next page &rsaquo;") if index + 1 < len(plan) else ""]
        return (f"<nav>show: {' '.join(labels)}</nav><nav>{_esc(self.prefix + group)}, page: {' '.join(pages)} "
                f"&middot; page {index + 1} of {len(plan)} of the run {' '.join(s for s in steps if s)}</nav>")

    def paged(self, nav: str, body: str, group: str, number: int, count: int) -> str:
        """One page of a label's items between its links."""
        note = (f"<div class=none>{count} items of {_esc(self.prefix + group)}, page {number}. "
                "MLflow's artifact viewer does not follow links between pages: open the others from samples/ "
                "in the run's artifact list, or download the run's artifacts and open samples.html there.</div>")
        return self._document([], nav + note, body + nav)


def _pair_item(rows: list[dict], group: str) -> str:
    """A pair: the two protected values as columns, the arms as rows."""
    by_key = {(r["arm"], r["side"]): r for r in rows}
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    values = [next((r["attribute_value"] for (a, s), r in by_key.items() if s == side), side) for side in SIDES]
    head = "".join(f"<th class='side side-{_slug(side)}'>{_esc(v)} <span class=none>({side})</span></th>"
                   for v, side in zip(values, SIDES))
    body = "".join(f"<tr class='arm arm-{_slug(arm)}'><th>{_esc(arm)}</th>"
                   + "".join(_pair_cell(by_key.get((arm, side)), side) for side in SIDES) + "</tr>" for arm in arms)
    return _item(group, f"pair {_esc(rows[0]['pair_id'])}<span class=tag>cell {_esc(group)}</span>",
                 f"<table><tr><th style='width:7em'>arm</th>{head}</tr>{body}</table>")


def _pair_cell(row: dict | None, side: str) -> str:
    cell = f"<td class='side side-{_slug(side)}'>"
    if row is None:
        return f"{cell}<span class=none>no record</span></td>"
    answer = row.get("answer") if isinstance(row.get("answer"), str) else None  # null answers come back as NaN
    css = {"Yes": "yes", "No": "no"}.get(answer, "none")
    trace = row.get("trace") or ""
    text = str(row.get("text", "") or "")
    shown = text.replace(trace, "[the thinking trace above]", 1) if trace and trace in text else text
    cut = " &middot; <span class=cut>cut at the token budget</span>" if row.get("truncated") is True else ""
    parts = [f"answer <span class={css}>{_esc(answer or 'none')}</span> &middot; P(Yes) {_num(row.get('p_yes'))}"
             f" &middot; {int(row.get('trace_tokens') or 0)} trace tokens{cut}",
             f"<details open><summary>thinking trace</summary><pre>{_esc(trace) or '(empty)'}</pre></details>" if trace else "",
             f"<details><summary>output</summary><pre>{_esc(shown)}</pre></details>",
             f"<details><summary>prompt</summary><pre>{_esc(row.get('prompt', ''))}</pre></details>"]
    return cell + "".join(parts) + "</td>"


def _question_labels(records: pd.DataFrame) -> pd.Series:
    correct = records["answer_position"].eq(records["gold_position"]).fillna(False).astype(int)
    per_question = correct.groupby(records["question_id"]).agg(["sum", "size"])
    labels = {q: f"{int(r['sum'])}/{int(r['size'])} correct" for q, r in per_question.iterrows()}
    return records["question_id"].map(labels)


def _question_item(rows: list[dict], group: str) -> str:
    """A question: its permutations side by side."""
    head = "".join(f"<th>permutation {r['permutation']} (gold {LETTERS[int(r['gold_position'])]})</th>" for r in rows)
    body = "".join(_question_cell(r) for r in rows)
    return _item(group, f"question {rows[0]['question_id']}<span class=tag>{_esc(group)}</span>"
                 f"<span class=tag>arm {_esc(rows[0]['arm'])}</span>", f"<table><tr>{head}</tr><tr>{body}</tr></table>")


def _question_cell(row: dict) -> str:
    position = row.get("answer_position")
    letter = None if position is None or pd.isna(position) else LETTERS[int(position)]
    css = "none" if letter is None else "yes" if int(position) == int(row["gold_position"]) else "no"
    parts = [f"answer <span class={css}>{letter or 'none'}</span> ({_esc(row.get('answer_source', ''))})"
             f" &middot; {int(row.get('length_chars') or 0)} chars",
             f"<details open><summary>output</summary><pre>{_esc(row.get('text', ''))}</pre></details>",
             f"<details><summary>prompt</summary><pre>{_esc(row.get('prompt', ''))}</pre></details>" if "prompt" in row else ""]
    return "<td>" + "".join(parts) + "</td>"


def _transcript_item(rows: list[dict], group: str) -> str:
    """A role-channel transcript. # row: trace_id, question_id, condition, valid, *_tokens, ngram_raw,
    ngram_corrected, canary(_reproduced), text"""
    row = rows[0]
    lengths = " &middot; ".join(f"{name} {int(row[f'{name}_tokens'])}" for name in ("a_private", "a_public", "b_private", "b_public"))
    facts = (f"{'valid' if row['valid'] else 'invalid'} &middot; tokens: {lengths} &middot; 4-gram overlap raw "
             f"{_num(row['ngram_raw'])}, corrected {_num(row['ngram_corrected'])}"
             + (f" &middot; canary {'reproduced' if row['canary_reproduced'] else 'not reproduced'}" if row.get("canary") else ""))
    return _item(group, f"trace {row['trace_id']} &middot; question {_esc(row['question_id'])}"
                 f"<span class=tag>{_esc(group)}</span>", f"<p>{facts}</p><pre>{_esc(row['text'])}</pre>")


LAYOUTS = {
    "pairs": Layout("pair_id", lambda r: r["pair_id"].map(pair_cells(r)), _pair_item, "cell ", ("arm", "side")),
    "questions": Layout("question_id", _question_labels, _question_item, order=("question_id", "permutation")),
    "transcripts": Layout("trace_id", lambda t: t["condition"].astype(str), _transcript_item,
                          order=("question_id", "condition")),
}


def _item(group: str, heading: str, body: str) -> str:
    return f"<section class='item g-{_slug(group)}'><h2>{heading}</h2>{body}</section>"


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in str(text))


def _esc(value) -> str:
    return html.escape("" if value is None else str(value))


def _num(value) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{float(value):.3f}"
