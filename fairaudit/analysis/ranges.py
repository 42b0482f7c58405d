"""The values a metric can take, declared where the metric is defined: each analysis module that computes metrics
holds `RANGES`, {pattern of a metric's name: its range}, and `study.metric_range` reads them all, so an interval
across seeds is cut to what the metric can be (a share to [0, 1], a count to >= 0) and to nothing it cannot.

A pattern names the start of a metric's name; what follows it after an underscore qualifies it without changing its
range (an arm `_think`, `_complete`, `_masked`, `_cot`). The interval companions every metric may have are declared
here once: `<metric>_ci_low` / `_ci_high` take the metric's range, `_ci_n` is a count and `_ci_few` a flag; so is any
log10 p (<= 0).
"""

from __future__ import annotations

import math
import re
from typing import Mapping

Range = tuple[float, float]

SHARE: Range = (0.0, 1.0)          # a rate, a share, a probability, a p-value, a 1/0 flag, a P(Yes) gap
COUNT: Range = (0.0, math.inf)     # a count or a bin number (whole numbers >= 0)
POSITIVE: Range = (0.0, math.inf)  # a ratio, a length, a statistic, an NLL: >= 0, not necessarily whole
SIGNED: Range = (-1.0, 1.0)        # a difference of two shares, a correlation
FREE: Range = (-math.inf, math.inf)  # a slope, a difference of NLLs: any value
LOG10_P: Range = (-math.inf, 0.0)

COMPANIONS = ((re.compile(r"_ci_n(_|$)"), COUNT), (re.compile(r"_ci_few(_|$)"), SHARE),
              (re.compile(r"(^|_)log10_p(_|$)"), LOG10_P))


def declared_range(name: str, ranges: Mapping[str, Range]) -> Range | None:
    """The range declared for metric `name`: an interval companion's or a log10 p's (above), else that of the
    longest pattern in `ranges` matching the name's start up to an underscore or its end; None when none does."""
    for pattern, bounds in COMPANIONS:
        if pattern.search(name):
            return bounds
    best, length = None, -1
    for pattern, bounds in ranges.items():
        match = re.match(rf"(?:{pattern})(?=_|$)", name)
        if match and match.end() > length:
            best, length = bounds, match.end()
    return best


def merged(*declarations: Mapping[str, Range]) -> dict[str, Range]:
    """Several modules' RANGES as one; a pattern two modules declare must say the same."""
    out: dict[str, Range] = {}
    for ranges in declarations:
        for pattern, bounds in ranges.items():
            if out.setdefault(pattern, bounds) != bounds:
                raise ValueError(f"metric pattern {pattern!r} is declared as both {out[pattern]} and {bounds}")
    return out
