"""Why a metric is undefined (NaN, shown as n/a): read from the metrics beside it, so every n/a a table shows can
say why (an empty contingency cell, no discordant pair, no pair whose traces all completed, too few units for an
interval). Pure: metric names and values in, one reason per undefined metric out."""

from __future__ import annotations

import math
import re
from typing import Any, Mapping

from fairaudit.analysis.numbers import format_number

CELL_MEANING = {"a": "no flip under either arm", "b": "a baseline flip the treatment resolved",
                "c": "a flip the treatment created", "d": "a flip under both arms"}
CELL_METRIC = re.compile(r"^(?:d_disp_([a-d])_.+|asym_([a-d])|delta_([a-d])|([a-d])_alpha(?:_prime)?_up)$")
CDPG_CELL = re.compile(r"^cdpg_(?:slope|curve|mean)_([a-d])(?:_.+)?$")
INTERVAL = re.compile(r"^(.+)_ci_(?:low|high|few)$")
GENERAL = "undefined on these records (docs/probes.md defines it)"
COMPLETE = "_complete"


def undefined(value: Any) -> bool:
    """A metric value that is not a number: NaN or None (null in metrics.json)."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def why_undefined(metrics: Mapping[str, Any], names: list[str] | None = None) -> dict[str, str]:
    """metric -> why it is undefined, for each of `names` (default: every metric) that is NaN or None."""
    shown = metrics.keys() if names is None else [n for n in names if n in metrics]
    return {name: reason(name, metrics) for name in shown if undefined(metrics[name])}


def count(metrics: Mapping[str, Any], name: str) -> float | None:
    value = metrics.get(name)
    return None if undefined(value) else float(value)


def reason(name: str, metrics: Mapping[str, Any]) -> str:
    """Why metric `name` is undefined, from the counts beside it; GENERAL when no rule knows it."""
    if name.endswith(COMPLETE):
        return complete_reason(name, metrics)
    match = CELL_METRIC.match(name) or CDPG_CELL.match(name)
    cell = next((group for group in match.groups() if group), None) if match else None
    if cell:
        counted = count(metrics, f"cell_{cell}") if f"cell_{cell}" in metrics else count(metrics, f"cdpg_n_{cell}")
        if not counted:
            return f"no pair in cell {cell} ({CELL_MEANING[cell]})"
    if name.startswith("c_b_ratio") and not count(metrics, "cell_b") and not count(metrics, "cell_c"):
        return "no discordant pair (cell_b = cell_c = 0): c/b is 0/0"
    interval = INTERVAL.match(name)
    if interval and not undefined(metrics.get(interval.group(1))):
        n = count(metrics, f"{interval.group(1)}_ci_n")
        return f"too few units for an interval ({interval.group(1)}_ci_n = {format_number(n or 0.0)})"
    if re.match(r"^(p_gap|p_diff|delta_p_gap)", name) and not count(metrics, "n_pairs_scored"):
        return "no pair was scored on both sides under both arms (n_pairs_scored = 0)"
    if name.startswith("mcnemar") and not count(metrics, "n_pairs"):
        return "no pair was answered on both sides under both arms (n_pairs = 0)"
    return GENERAL


def complete_reason(name: str, metrics: Mapping[str, Any]) -> str:
    """A metric over the pairs whose traces all completed (`<metric>_complete`): none did, or its own reason among
    those pairs."""
    if not count(metrics, "n_pairs_complete"):
        cut = count(metrics, "n_pairs_truncated")
        held = f" (n_pairs_truncated = {format_number(cut)})" if cut is not None else ""
        return f"every pair holds a trace the token budget cut{held}: no complete pair to compute it over"
    complete = {key[:-len(COMPLETE)]: value for key, value in metrics.items() if key.endswith(COMPLETE)}
    return reason(name[:-len(COMPLETE)], complete) + ", over the complete pairs"


def reasons_by_text(reasons: Mapping[str, str]) -> dict[str, list[str]]:
    """reason -> the metrics it explains, in their order: one footnote line per reason."""
    grouped: dict[str, list[str]] = {}
    for name, text in reasons.items():
        grouped.setdefault(text, []).append(name)
    return grouped


def footnotes(reasons: Mapping[str, str]) -> list[str]:
    """e.g. "n/a: d_disp_c_think, asym_c: no pair in cell c (a flip the treatment created)", a line per reason."""
    return [f"n/a: {', '.join(names)}: {text}" for text, names in reasons_by_text(reasons).items()]
