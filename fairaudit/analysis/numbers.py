"""Numbers as they are: the rounding residue of a sum that cancels is 0, and a p-value is shown from its log10.

No value is snapped on its way to MLflow, metrics.json or the screen: a p-value of 2.2e-46 is 2.2e-46.
The one rule for float noise is `cancelled`, applied where a difference of O(1) quantities is computed
(a slope of a flat trajectory, a mean of within-pair differences that cancel), relative to their scale.
"""

from __future__ import annotations

import math
import re
import sys
from typing import Any

import numpy as np

NOISE = 1e-12  # relative: a sum within NOISE of its terms' scale from 0 is rounding (0.1 + 0.2 - 0.3 = 5.6e-17)
LOG10_SMALLEST = math.log10(sys.float_info.min)  # -307.65: a p below the smallest normal double lives as its log10


def cancelled(value, scale):
    """`value`, a sum or difference of terms at most `scale` in magnitude, as exactly 0 where it is within
    NOISE * scale of 0: the rounding of terms that cancel (a flat trajectory's OLS slope comes out -5.3e-18),
    not a value. Anything else, NaN included, is unchanged. Floats and arrays (elementwise) alike; never
    for a p-value, a probability or a rate, whose small values are values."""
    value = np.asarray(value, dtype=float)
    out = np.where(np.abs(value) <= NOISE * np.abs(np.asarray(scale, dtype=float)), 0.0, value)
    return float(out) if out.ndim == 0 else out


def cancelled_mean(values) -> float:
    """The mean of signed differences (pair slopes, P(Yes) differences, NLL deltas), `cancelled` at the scale of
    the largest: differences that cancel give 0, not their rounding; NaN for none."""
    values = np.asarray(values, dtype=float)
    return cancelled(values.mean(), np.abs(values).max()) if values.size else math.nan


def log10_sibling(name: str) -> str | None:
    """The name of the log10 twin of p-value metric or column `name`, its last `p` part written `log10_p`:
    mcnemar_p -> mcnemar_log10_p, trunc_ccp_chi2_p_cot -> trunc_ccp_chi2_log10_p_cot, p_pratt -> log10_p_pratt;
    None for a name without such a part (or one that already is a log10)."""
    parts = name.split("_")
    at = [i for i, part in enumerate(parts) if part == "p" and (i == 0 or parts[i - 1] != "log10")]
    return "_".join(parts[:at[-1]] + ["log10"] + parts[at[-1]:]) if at else None


P_VALUE = re.compile(r"_(log10_)?p(_(?!(gap|yes)(_|$))[a-z0-9]+)*$")  # `p` after the first part, then suffixes


def is_p_value(name: str) -> bool:
    """Whether metric `name` is a p-value or its log10: a `p` part after its first, followed only by qualifiers
    (mcnemar_p, trunc_ccp_chi2_p_cot, mcnemar_log10_p), never a P(Yes) (p_yes_alpha, p_gap_think, delta_p_gap)."""
    return P_VALUE.search(name) is not None


LEVELS = (0.1, 0.05, 0.01, 0.005, 0.001)  # the levels a p-value is read against: never printed rounded onto one


def format_p(log10_p: float) -> str:
    """A p-value from its log10, as people read it, exact far below float range: 0 -> "1", -1.9 -> "0.0126",
    -45.657 -> "2.2e-46", and below the smallest double (1e-308) the power itself, -485.605 -> "10^-485.6". A p
    that would round onto a level it is not (LEVELS: 0.04996 and 0.05004 both "0.05") gets the digits that
    tell it from that level: "0.04996", "0.05004"."""
    if not math.isfinite(log10_p):
        return "0" if log10_p == -math.inf else "n/a"
    if log10_p < LOG10_SMALLEST:
        return f"10^{log10_p:.1f}"
    p = 10.0 ** log10_p
    for digits in range(3, 18):
        text = _p_text(log10_p, digits)
        if float(text) not in LEVELS or math.isclose(p, float(text), rel_tol=1e-12):
            break
    return text


def _p_text(log10_p: float, digits: int) -> str:
    """p with `digits` significant digits: plain from 0.001 up, else mantissa and exponent from the log10."""
    if log10_p >= -3:
        return f"{10.0 ** log10_p:.{digits}g}"
    exponent = math.floor(log10_p)
    mantissa = 10.0 ** (log10_p - exponent)
    if round(mantissa, digits - 2) >= 10.0:
        mantissa, exponent = mantissa / 10.0, exponent + 1
    return f"{mantissa:.{digits - 2}f}e{exponent}"


def format_number(value: Any) -> str:
    """A number as people read it: 4 significant digits, 2.2e-46 as 2.2e-46, NaN as n/a (float noise is made 0
    where it arises: `numbers.cancelled`)."""
    if isinstance(value, (bool, int)) or not isinstance(value, float):
        return str(value)
    if math.isnan(value):
        return "n/a"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    if 1e-4 <= abs(value) < 1e6:
        return f"{value:.4g}"
    return f"{value:.3g}"
