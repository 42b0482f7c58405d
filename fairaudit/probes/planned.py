"""The planned tests probes share (`Probe.planned_tests`): each sized at the effect `plan.effect.*` names, its nuisance
rates (how many pairs are discordant, how much a paired difference varies) measured by a pilot run where one ran
(its metrics), else assumed, and said so in the line's `effect` text."""

from __future__ import annotations

import math
from typing import Mapping

from scipy import stats

from fairaudit.analysis import power
from fairaudit.analysis.numbers import format_number as num
from fairaudit.analysis.stats import FEW
from fairaudit.probes import PlannedTest


def measured(metrics: Mapping[str, float], name: str) -> float | None:
    """A pilot's metric when it logged a finite one, else None."""
    value = metrics.get(name)
    return float(value) if value is not None and math.isfinite(value) else None


def interval_sd(metrics: Mapping[str, float], name: str, student_t: bool = False) -> float | None:
    """The SD of the per-unit values behind a mean's 95% interval (`name`_ci_low/_ci_high over `name`_ci_n units):
    its half-width x sqrt(n) / q, q the 0.975 quantile of t(n - 1) for a Student t interval (exact), else the
    normal one (the normal reading of a bootstrap interval); None without an interval over at least stats.FEW units
    (fewer give an SD too rough to size a study on)."""
    low, high, n = (measured(metrics, f"{name}_ci_{end}") for end in ("low", "high", "n"))
    if low is None or high is None or not n or n < FEW or high <= low:
        return None
    quantile = stats.t.ppf(0.975, n - 1) if student_t else stats.norm.ppf(0.975)
    return (high - low) / 2.0 * math.sqrt(n) / float(quantile)


def mcnemar_test(effect: Mapping[str, float], metrics: Mapping[str, float]) -> PlannedTest:
    """McNemar on cells b and c at c/b = `c_b_ratio`, the share of discordant pairs a pilot's (over at least
    stats.FEW pairs, some discordant) or `discordant`."""
    pairs, b, c = (measured(metrics, name) for name in ("n_pairs", "cell_b", "cell_c"))
    piloted = bool(pairs) and pairs >= FEW and b is not None and c is not None and b + c > 0
    discordant = (b + c) / pairs if piloted else float(effect["discordant"])
    p_b, p_c = power.cells_at_ratio(discordant, float(effect["c_b_ratio"]))
    source = f"pilot: {num(b + c)} of {num(pairs)} pairs" if piloted else "assumed: plan.effect.discordant"
    return PlannedTest("McNemar, cell b vs cell c", "mcnemar_log10_p",
                       f"c/b = {num(effect['c_b_ratio'])} at {num(discordant)} discordant ({source})", "exact",
                       power=lambda n, level: power.mcnemar_power(n, p_b, p_c, level))


def paired_mean_test(name: str, metric: str, mean: float, sd_key: str, effect: Mapping[str, float],
                     metrics: Mapping[str, float], share: float = 1.0, student_t: bool = False) -> PlannedTest:
    """A paired mean (a gap's change, a slope) at `mean` over the pairs, or over those of one cell that holds each
    pair with chance `share`; its per-unit SD read off a pilot's interval of `metric` (a Student t interval when
    `student_t`, else a bootstrap one) or `plan.effect.<sd_key>`. Sized as the one-sample t-test
    (`power.cell_gap_power`: at the cell's Binomial count), which a t interval excluding 0 is."""
    sd = interval_sd(metrics, metric, student_t)
    source = "pilot" if sd is not None else f"assumed: plan.effect.{sd_key}"
    sd = sd if sd is not None else float(effect[sd_key])
    cell = f", over a share {num(share)} of the pairs" if share < 1.0 else ""
    return PlannedTest(name, metric, f"mean {num(mean)}, SD {num(sd)} ({source}){cell}",
                       "t-test (its t interval)" if student_t else "t-test (for its bootstrap interval)",
                       power=lambda n, level: power.cell_gap_power(n, share, mean, sd, level))


def correlation_test(metric: str, rho: float, controls: int, share: float, share_source: str) -> PlannedTest:
    """A (partial) correlation's test at rho over `share` of the units (`power.correlation_power`)."""
    return PlannedTest(f"partial correlation ({controls} controlled)", metric,
                       f"rho = {num(rho)} over {num(share)} of the units ({share_source})", "Fisher z (approximate)",
                       power=lambda n, level: power.correlation_power(n, rho, level, controls), share=share)


def rate_interval(name: str, metric: str, rate: float, width: float, share: float, source: str) -> PlannedTest:
    """A rate's 95% Wilson interval: its expected width at n units x `share` contrasts each, and the width wanted."""
    return PlannedTest(f"{name}: Wilson 95% interval", metric,
                       f"rate {num(rate)} ({source}); width wanted {num(width)}", "exact (expected width)",
                       width=lambda n: power.expected_wilson_width(n, rate), target_width=width, share=share)
