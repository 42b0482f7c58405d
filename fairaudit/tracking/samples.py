"""Per-sample views of a run's records: `samples.html` (the first page), `samples/*.html` and `samples.jsonl`.

A probe's `samples` view names its records frame and its `Layout`, which the probe's own module
defines: what one item gathers (a counterfactual pair's sides and arms, an MCQ question's
permutations, a role-channel transcript), what labels it (a contingency cell, a count of correct
answers, a graph) and one item's HTML, built with `item`, `esc` and `slug` (`fairaudit.views.pages`). Pages are pure
CSS, so they work in MLflow's sandboxed artifact viewer: radio buttons show one value of a facet (arm, side).
Every page carries a content-security policy (`POLICY`) that allows no script at all.
A run whose items fit one page gets one samples.html whose radio buttons also filter by label. A
larger one gets pages of at most PAGE_BYTES, each holding one label's items: samples.html is the
first, the others are samples/<label>-<n>.html, linked from every page (the filter over all
records is the choice of a label's pages), so the page a browser opens first stays small whatever
the job's size and every trace is on some page. samples.jsonl holds every record with its `group`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd

from fairaudit.analysis.pairs import TEXT_COLUMNS  # the long texts of a record
from fairaudit.views.pages import Layout, esc, slug

PAGE_BYTES = 2_000_000   # items per page, in bytes of HTML
PAGE_ITEMS = 200         # and in items
SLICE = 500              # items whose records are read out of the frame at a time
PAGER_SPAN = 5           # page links shown either side of the current one

STYLE = (Path(__file__).parent / "samples.css").read_text()  # inlined into every page
# Model text and data fields are escaped into the pages; the policy is the second wall: no script, no fetch, no
# form, no base URL of any kind, styles only inline (the <style> element and the few style attributes).
POLICY = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"


def write(records: pd.DataFrame, spec: Layout, title: str, folder: Path) -> list[Path]:
    """samples.html (and samples/*.html when the items need more than one page) and samples.jsonl
    of a run's records in the layout `spec` (the probe's `samples` view carries it), written into
    `folder`; returns the files written."""
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
    return f"samples/{slug(prefix + group)}-{number:04d}.html"


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
        facet_rules = [f"body:has(#{f}-{slug(v)}:checked) .{f}:not(.{f}-{slug(v)}){{display:none}}"
                       for f, values in self.facets.items() for v in values]
        return (f"<!DOCTYPE html><html><head><meta charset=utf-8>"
                f"<meta http-equiv=Content-Security-Policy content=\"{POLICY}\"><title>{esc(self.title)}</title>"
                f"<style>{STYLE}{''.join(rules + facet_rules)}</style></head><body><h1>{esc(self.title)}</h1>"
                f"<div class=filters>{controls}{self._facet_radios()}</div><main>{body}</main></body></html>")

    def _facet_radios(self) -> str:
        rows = []
        for facet, values in self.facets.items():
            radios = [f"<input type=radio name={facet} id={facet}-all checked><label for={facet}-all>all</label>"]
            radios += [f"<input type=radio name={facet} id={facet}-{slug(v)}>"
                       f"<label for={facet}-{slug(v)}>{esc(v)}</label>" for v in values]
            rows.append(f"<div>{esc(facet)}: {''.join(radios)}</div>")
        return "".join(rows)

    def single(self, items: list[str], groups: list[str], counts: dict) -> str:
        """One page of every item; radio buttons per label hide the items outside it (CSS only)."""
        radios = [f"<input type=radio name=f id=f-all checked><label for=f-all>all ({sum(counts.values())})</label>"]
        rules = []
        for group in groups:
            key = slug(group)
            radios.append(f"<input type=radio name=f id=f-{key}><label for=f-{key}>{esc(self.prefix + group)} "
                          f"({counts.get(group, 0)})</label>")
            rules.append(f"body:has(#f-{key}:checked) .item:not(.g-{key}){{display:none}}")
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
        labels = [f"<b>{esc(self.prefix + g)} ({totals[g]})</b>" if g == group
                  else link(i, f"{esc(self.prefix + g)} ({totals[g]})") for g, i in firsts.items()]
        own = [i for i, p in enumerate(plan) if p[0] == group]
        shown = [i for i in own if abs(i - index) <= PAGER_SPAN or i in (own[0], own[-1])]
        pages = [f"<b>{plan[i][1]}</b>" if i == index else link(i, str(plan[i][1])) for i in shown]
        steps = [link(index - 1, "&lsaquo; previous page") if index else "",
                 link(index + 1, "next page &rsaquo;") if index + 1 < len(plan) else ""]
        return (f"<nav>show: {' '.join(labels)}</nav><nav>{esc(self.prefix + group)}, page: {' '.join(pages)} "
                f"&middot; page {index + 1} of {len(plan)} of the run {' '.join(s for s in steps if s)}</nav>")

    def paged(self, nav: str, body: str, group: str, number: int, count: int) -> str:
        """One page of a label's items between its links."""
        note = (f"<div class=none>{count} items of {esc(self.prefix + group)}, page {number}. "
                "MLflow's artifact viewer does not follow links between pages: open the others from samples/ "
                "in the run's artifact list, or download the run's artifacts and open samples.html there.</div>")
        return self._document([], nav + note, body + nav)


