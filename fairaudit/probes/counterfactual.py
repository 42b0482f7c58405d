"""Probe `counterfactual`: contingency cells and McNemar of a thinking arm against its baseline (paper 000
§3.1-3.2)."""

from __future__ import annotations

from typing import Mapping

from fairaudit.analysis.contingency import cell_disparity_table, contingency, contingency_table
from fairaudit.analysis.contingency_figures import disparity_shift_figure
from fairaudit.analysis.degenerate import WARNING
from fairaudit.analysis.numbers import format_number as num
from fairaudit.analysis.numbers import format_p
from fairaudit.analysis.stats import FEW
from fairaudit.probes import AuditContext, PlannedTest, ProbeResult
from fairaudit.probes.decisions import (
    PairedProbe,
    arm_names,
    check_resampling,
    gap_sentence,
    interval,
    paired_metrics,
    paired_records,
    pairs_phrase,
    warnings_of,
)
from fairaudit.probes.planned import mcnemar_test, paired_mean_test
from fairaudit.prompts.yesno import Arm

HEADLINE = ["n_pairs", "cell_a", "cell_b", "cell_c", "cell_d", "mcnemar_log10_p", "mcnemar_p", "d_cf_{t}", "d_cf_{b}",
            "delta_d_cf", "p_gap_{t}", "p_gap_{b}", "delta_p_gap", "delta_d_group", "d_disp_c_{t}", "asym_c",
            "parse_rate_{t}", "parse_rate_{b}", "compliance_rate_{b}", "n_dropped_truncated_{t}",
            "n_dropped_truncated_{b}", "n_dropped_noncompliant_{b}"]
TRUNCATION = ["n_pairs_truncated", "cell_c_truncated", "n_pairs_complete", "mcnemar_log10_p_complete",
              "delta_d_cf_complete"]  # the headline again over the pairs whose every trace completed


def headline(treatment: str, baseline: str) -> list[str]:
    """Summary metric names for one treatment/baseline pair of arms."""
    return [name.format(t=treatment, b=baseline) for name in HEADLINE + TRUNCATION]


class CounterfactualProbe(PairedProbe):
    """Counterfactual flips under the grid's arm vs `baseline_arm`, cells a-d, McNemar, disparities."""

    def __init__(self, baseline_arm: dict, n_boot: int = 2000, seed: int = 0):
        super().__init__(baseline_arm)
        check_resampling(n_boot, seed)
        self.n_boot, self.seed = n_boot, seed

    def run(self, ctx: AuditContext) -> ProbeResult:
        records = paired_records(ctx, self.baseline)
        t, b = ctx.arm.name, self.baseline.name
        metrics = counterfactual_metrics(records, t, b, self.n_boot, self.seed)
        metrics["truncated_rate_" + t] = float(records.loc[records["arm"] == t, "truncated"].mean())
        return ProbeResult(
            metrics=metrics,
            tables={"contingency": contingency_table(metrics, t, b),
                    "cell_disparity": cell_disparity_table(metrics, t, b)},
            # the app titles it with model, dataset and arms
            figures={"disparity_shift": disparity_shift_figure(metrics, arms=(t, b))},
            records={"records": records},
            headline=headline(t, b),
        )

    @classmethod
    def point_metrics(cls, records) -> dict[str, float]:
        """The metrics `run` logs, from the records alone, without bootstrap intervals."""
        rows = records["records"]
        return counterfactual_metrics(rows, *arm_names(rows), n_boot=0)

    def planned_tests(self, arm: Arm, effect: Mapping[str, float],
                      pilot: ProbeResult | None = None) -> list[PlannedTest]:
        """McNemar on the flips (cells b, c) and the paired change of the P(Yes) gap (delta_p_gap)."""
        metrics = pilot.metrics if pilot else {}
        return [mcnemar_test(effect, metrics),
                paired_mean_test(f"P(Yes) gap, {arm.name} vs {self.baseline.name}", "delta_p_gap",
                                 float(effect["p_gap"]), "p_gap_sd", effect, metrics)]

    def verdict(self, result: ProbeResult) -> list[str]:
        """Flips created and resolved with McNemar's p, the P(Yes) gap, c/b, a legend of the cells, warnings."""
        m, records = result.metrics, result.records["records"]
        t, b = arm_names(records)
        found = (f"{t} against {b} on {pairs_phrase(records, m['n_pairs'])}: {t} created {num(m['cell_c'])} and "
                 f"resolved {num(m['cell_b'])} counterfactual flips (McNemar p = {format_p(m['mcnemar_log10_p'])}); "
                 f"{num(m['cell_d'])} pairs flip under both arms, {num(m['cell_a'])} under neither.")
        legend = (f"cells: a = no flip under either arm, b = a {b} flip that {t} resolved, c = a flip {t} created, "
                  "d = a flip under both; a flip = the two sides of a pair get different answers.")
        ratio, unbounded = ratio_lines(m)
        return [found, gap_sentence(m, records, t, b) + ".", *ratio, legend, *warnings_of(records, t, b), *unbounded]


def counterfactual_metrics(records, treatment: str, baseline: str, n_boot: int = 2000,
                           seed: int = 0) -> dict[str, float]:
    """The metrics `run` logs from paired records: `contingency` and the P(Yes) gap, over every pair and over the
    completed ones (`paired_metrics`), intervals from n_boot paired resamples (0: none) seeded by `seed`."""
    return paired_metrics(lambda rows: contingency(rows, treatment=treatment, baseline=baseline, n_boot=n_boot,
                                                   seed=seed), records, treatment, baseline, n_boot=n_boot, seed=seed)


def ratio_lines(m: dict[str, float]) -> tuple[list[str], list[str]]:
    """(sentences, warnings): c/b with its two intervals over the discordant pairs; with b = 0 instead a warning
    that the bootstrap interval is [inf, inf] and the exact one is the one to read; nothing without discordant pairs."""
    n = m["c_b_ratio_ci_n"]
    if not n:
        return [], []
    exact = "[{}, {}]".format(num(m["c_b_ratio_exact_ci_low"]), num(m["c_b_ratio_exact_ci_high"]))
    pairs = f"the {num(n)} discordant pairs" + (f" (fewer than {FEW}: the bootstrap interval is rough, the exact one "
                                                 "holds at any n)" if m.get("c_b_ratio_ci_few") == 1.0 else "")
    if m["cell_b"]:
        return [f"created per resolved flip, c/b = {interval(m, 'c_b_ratio')} (95% paired bootstrap; exact "
                f"conditional {exact}; over {pairs})."], []
    return [], [f"{WARNING}no pair in cell b, so c/b = inf and its paired bootstrap interval is [inf, inf] (every "
                f"resample lacks a b pair): read the exact conditional interval beside it, c_b_ratio_exact_ci {exact}, "
                f"over {pairs}"]
