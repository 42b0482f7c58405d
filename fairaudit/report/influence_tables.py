"""Paper 002's Tables 1-5 as report sections, from the influence runs of a selection."""

from __future__ import annotations

import math

import pandas as pd

from fairaudit.analysis import influence_study as tables
from fairaudit.analysis.influence_figures import influence_rates_figure
from fairaudit.report.sections import RecordsLoader, Report, Section
from fairaudit.report.render import NA, p_from_log10


def _pct(value: float) -> str:
    return NA if not math.isfinite(value) else f"{value:.1f}"


def _num(value: float, digits: int = 3) -> str:
    return NA if not math.isfinite(value) else f"{value:.{digits}f}"


def rate_with_ci(rate: float, low: float, high: float) -> str:
    """'23.6% [21.9, 25.4]' as paper 002 Table 3 prints a rate and its Wilson interval."""
    if not math.isfinite(rate):
        return NA
    return f"{100 * rate:.1f}% [{100 * low:.1f}, {100 * high:.1f}]"


def _axes_shown(table: pd.DataFrame, axes: list[str]) -> pd.DataFrame:
    return table[axes].astype(str) if axes else pd.DataFrame(index=table.index)


def paper002(report: Report, runs: pd.DataFrame, load_records: RecordsLoader, cfg) -> None:
    """Paper 002's Tables 1-5 from the influence runs (registered by influence)."""
    add_influence_tables(report, runs, cfg.influence.condition, cfg.influence.rate)


def add_influence_tables(report: Report, runs: pd.DataFrame, condition: str = "masked", rate: str = "substantive") -> None:
    """Tables 1-5 of paper 002 and the rates figure, when the selection holds influence runs.

    condition: the graph of Tables 2-5 (the paper's are masked variants); rate: influence (Δ > 0)
    or substantive (Δ > 0.05, Table 3's threshold).
    """
    runs = tables.influence_runs(runs)
    if runs.empty:
        return
    t1 = tables.table1(runs)
    shown1 = t1.assign(**{c: [_num(v) if p.startswith("Mean") else _pct(v) for p, v in zip(t1["probe"], t1[c])]
                          for c in t1.columns if c != "probe"})
    report.sections.append(Section("influence_table1", "Table 1: probe comparison (%)", t1, shown1,
                                   "Pooled counts over the selected runs; influence pools both directions at Δ_NLL > 0."))
    t2 = tables.table2(runs, condition)
    shown2 = t2.assign(value=[_num(v, 0 if "traces" in m else 3 if "delta" in m else 1)
                              for m, v in zip(t2["metric"], t2["value"])])
    report.sections.append(Section("influence_table2", f"Table 2: length-matched validation ({condition})", t2, shown2))
    add_table3(report, runs, condition, rate)
    t4 = tables.table4(runs, condition)
    shown4 = _axes_shown(t4, tables.row_axes(runs)).assign(**{"Control evaluations": t4["control_n"].map(lambda v: f"{v:,.0f}"),
                                              "Δ_NLL = 0 rate": t4["zero_rate"].map(lambda v: f"{_pct(100 * v)}%"),
                                              "Mean Δ_NLL": t4["mean_delta"].map(_num)})
    report.sections.append(Section("influence_table4", f"Table 4: graph-cut control ({condition})", t4, shown4,
                                   "Natural and counterfactual NLL compared with ==.", pooled_last=True))
    add_table5(report, runs, condition, rate)
    report.metrics.update({"influence_control_zero_rate": float(t4["zero_rate"].iloc[-1]),
                           "influence_n_runs": len(runs)})
    report.figures["influence_rates"] = influence_rates_figure(tables.pooled_rates(runs))


def add_table3(report, runs: pd.DataFrame, condition: str, rate: str) -> None:
    t3 = tables.table3(runs, condition, rate)
    shown = _axes_shown(t3, tables.row_axes(runs))
    for d, label in (("a_to_b", "A-to-B"), ("b_to_a", "B-to-A")):
        shown[f"{label} rate (95% CI)"] = [rate_with_ci(r, lo, hi) for r, lo, hi in
                                           zip(t3[f"rate_{d}"], t3[f"ci_low_{d}"], t3[f"ci_high_{d}"])]
        shown[f"{label} k/n"] = [f"{k:.0f}/{n:.0f}" for k, n in zip(t3[f"k_{d}"], t3[f"n_{d}"])]
        shown[f"{label} mean Δ_NLL"] = t3[f"mean_delta_{d}"].map(_num)
    threshold = {"influence": "> 0", "substantive": "> 0.05"}.get(rate, rate)
    report.sections.append(Section("influence_table3", f"Table 3: rates at Δ_NLL {threshold} ({condition})", t3, shown,
                                   "Wilson 95% intervals from the counts pooled over seeds.", main=True))


def add_table5(report, runs: pd.DataFrame, condition: str, rate: str) -> None:
    t5, tests = tables.table5(runs, condition, rate)
    shown = _axes_shown(t5, tables.row_axes(runs))
    for short, label, digits in (("rate_a_to_b", "A-to-B rate (%)", 2), ("rate_b_to_a", "B-to-A rate (%)", 2),
                                 ("delta_a_to_b", "A-to-B Δ_NLL", 4), ("delta_b_to_a", "B-to-A Δ_NLL", 4)):
        shown[label] = [f"{_num(m, digits)} ± {_num(s, digits)}" for m, s in zip(t5[f"{short}_mean"], t5[f"{short}_sd"])]
    shown["A>B by rate"] = [f"{k}/{n}" for k, n in zip(t5["a_gt_b_by_rate"], t5["cells_by_rate"])]
    shown["A>B by Δ"] = [f"{k}/{n}" for k, n in zip(t5["a_gt_b_by_delta"], t5["cells_by_delta"])]
    total = {c: "" for c in shown.columns}
    total[shown.columns[0]] = "All cells"
    total["A>B by rate"], total["A>B by Δ"] = (f"{tests[k][0]}/{tests[k][1]}" for k in ("by_rate", "by_delta"))
    shown = pd.concat([shown, pd.DataFrame([total])], ignore_index=True)
    note = "; ".join(f"sign test {k.replace('_', ' ')}: {s}/{n} cells, one-sided p = {p_from_log10(p)}"
                     for k, (s, n, p) in tests.items())
    report.sections.append(Section("influence_table5", f"Table 5: seed-level statistics ({condition})", t5, shown,
                                   note, pooled_last=True))
    report.metrics.update({f"influence_sign_{k}_log10_p": v[2] for k, v in tests.items()})
