"""What a probe's sample pages are made of: its `Layout` (what an item gathers, what labels it, one item's HTML)
and the helpers an item's HTML is built with (`item`, `esc`, `slug`, `three_decimals`). Strings only: the pages
are written by `fairaudit.tracking.samples`."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Callable

import pandas as pd


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


def item(group: str, heading: str, body: str) -> str:
    """One item's HTML: its label's class (the filters hide it by that), a heading, a body."""
    return f"<section class='item g-{slug(group)}'><h2>{heading}</h2>{body}</section>"


def slug(text: str) -> str:
    """`text` as a CSS class or id: every character but letters and digits as '-'."""
    return "".join(c if c.isalnum() else "-" for c in str(text))


def esc(value) -> str:
    """`value` as HTML text (None as empty)."""
    return html.escape("" if value is None else str(value))


def three_decimals(value) -> str:
    """A number with 3 decimals, n/a for a missing one."""
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{float(value):.3f}"
