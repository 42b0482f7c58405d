"""Paper 002's Tables 1-5, its diagnostics and Fig. 4 as report sections, from the runs of the probes that
list `paper002` (influence)."""

from __future__ import annotations

import math

import pandas as pd

from fairaudit.analysis import influence_study as tables
from fairaudit.analysis.influence_figures import checkpoint_rates_figure, influence_rates_figure
from fairaudit.analysis.numbers import format_p
from fairaudit.errors.rules import check_fields, one_of
from fairaudit.probes.influence_transcripts import GRAPHS
from fairaudit.views.render import NA
from fairaudit.views.sections import RecordsLoader, Report, Section
from fairaudit.views.selection import Settings, shared

NO_CONTRASTS = "n/a (no contrasts)"
FEW_MARK = " †"
THRESHOLDS = {"influence": "> 0", "substantive": "> 0.05"}
TARGETS = {"content": "the target's own tokens, delimiters excluded", "with_tags": "the target with its tags"}
SETTINGS = {"condition": one_of(*GRAPHS), "rate": one_of(*THRESHOLDS)}


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
    shown = table[axes].astype(str) if axes else pd.DataFrame(index=table.index)
    return shown.rename(columns={a: a.removeprefix("probe.") for a in axes})


def scoring_note(runs: pd.DataFrame) -> str:
    """What the selected runs scored, said in every caption: targets and decoding, and settings that differ."""
    target = tables.setting_values(runs, "probe.target")
    said = TARGETS.get(target, target)
    varying = tables.varying_settings(runs)
    mixed = (f" Runs differ in {', '.join(v.removeprefix('probe.') for v in varying)}: Tables 1-2 and the "
             "diagnostics pool them, Tables 3-5 keep them apart.") if varying else ""
    return (f"Targets scored: {said} (probe.target={target}); blocks decoded at temperature "
            f"{tables.setting_values(runs, 'probe.sampling.temperature')}; donors length_match="
            f"{tables.setting_values(runs, 'probe.length_match')}.{mixed}")


def paper002(report: Report, runs: pd.DataFrame, load_records: RecordsLoader, settings: Settings) -> None:
    """Paper 002's Tables 1-5 from the runs (settings: condition, the graph of Tables 2-5; rate, the threshold
    Tables 3 and 5 lead with)."""
    for probe, own in settings.items():
        check_fields(f"probes.{probe}", own, SETTINGS)
    chosen = shared(settings, ("condition", "rate"))
    add_influence_tables(report, runs, chosen["condition"], chosen["rate"])


def add_influence_tables(report: Report, runs: pd.DataFrame, condition: str = "masked",
                         rate: str = "substantive") -> None:
    """Tables 1-5 of paper 002, its diagnostics, the rates figure and Fig. 4, when `runs` hold influence counts.

    condition: the graph of Tables 2-5 (the paper's are masked variants); rate: the threshold Tables 3 and 5
    lead with, influence (Δ > 0) or substantive (Δ > 0.05, Table 3's); Table 3 then shows the other one too.
    """
    runs = tables.influence_runs(runs)
    if runs.empty:
        return
    note = scoring_note(runs)
    t1 = tables.table1(runs)
    shown1 = t1.assign(**{c: [_num(v) if p.startswith("Mean") else _pct(v) for p, v in zip(t1["probe"], t1[c])]
                          for c in t1.columns if c != "probe"})
    report.sections.append(Section("influence_table1", "Table 1: probe comparison (%), at both thresholds", t1, shown1,
                                   "Pooled counts over the selected runs; influence pools both directions. " + note))
    add_table2(report, runs, condition, note)
    add_table3(report, runs, condition, rate, note)
    t4 = tables.table4(runs, condition)
    shown4 = _axes_shown(t4, tables.row_axes(runs)).assign(**{
        "Control evaluations": t4["control_n"].map(lambda v: f"{v:,.0f}"),
        "Δ_NLL = 0 rate": t4["zero_rate"].map(lambda v: f"{_pct(100 * v)}%"),
        "Mean Δ_NLL": t4["mean_delta"].map(_num)})
    report.sections.append(Section("influence_table4", f"Table 4: graph-cut control ({condition})", t4, shown4,
                                   "Natural and counterfactual NLL compared with ==.", pooled_last=True))
    add_table5(report, runs, condition, rate)
    add_diagnostics(report, runs)
    report.metrics.update({"influence_control_zero_rate": float(t4["zero_rate"].iloc[-1]),
                           "influence_n_runs": len(runs)})
    report.figures["influence_rates"] = influence_rates_figure(tables.pooled_rates(runs))


def add_table2(report: Report, runs: pd.DataFrame, condition: str, note: str) -> None:
    t2 = tables.table2(runs, condition)
    digits = [0 if "traces" in m else 3 if "delta" in m else 1 for m in t2["metric"]]
    shown = pd.DataFrame({"metric": t2["metric"], "value": [_num(v, d) for v, d in zip(t2["value"], digits)],
                          "95% CI": [f"[{lo:.1f}, {hi:.1f}]" if math.isfinite(lo) else "" for lo, hi in
                                     zip(t2["ci_low"], t2["ci_high"])],
                          "k/n": [f"{k:.0f}/{n:.0f}" if math.isfinite(n) else "" for k, n in zip(t2["k"], t2["n"])]})
    few = t2["few"].eq(True)
    shown.loc[few, "95% CI"] = shown.loc[few, "95% CI"] + FEW_MARK
    shown.loc[t2["n"].eq(0) & t2["metric"].str.contains("rate"), "value"] = NO_CONTRASTS
    report.sections.append(Section("influence_table2", f"Table 2: length-matched validation ({condition}), "
                                                        "at both thresholds", t2, shown,
                                   "Rates in % of the pooled contrasts with Wilson 95% intervals; †: fewer than "
                                   f"{tables.FEW} contrasts (or items), a rough interval. " + note))


def _rate_cell(rate: float, low: float, high: float, n: float) -> str:
    if not math.isfinite(n) or n == 0:
        return NO_CONTRASTS
    return rate_with_ci(rate, low, high) + (FEW_MARK if n < tables.FEW else "")


def add_table3(report, runs: pd.DataFrame, condition: str, rate: str, note: str = "") -> None:
    """Table 3 at `rate` first, then at the other threshold (where the runs logged its counts)."""
    axes = tables.row_axes(runs)
    order = [rate, *[r for r in THRESHOLDS if r != rate]]
    parts = [tables.table3(runs, condition, r).assign(threshold=f"Δ_NLL {THRESHOLDS.get(r, r)}") for r in order]
    parts = [p for p in parts if p[["k_a_to_b", "k_b_to_a"]].notna().any(axis=None)] or parts[:1]
    t3 = pd.concat(parts, ignore_index=True)
    t3 = t3[["threshold", *[c for c in t3.columns if c != "threshold"]]]
    shown = pd.concat([t3[["threshold"]], _axes_shown(t3, axes)], axis=1)
    for d, label in (("a_to_b", "A-to-B"), ("b_to_a", "B-to-A")):
        shown[f"{label} rate (95% CI)"] = [_rate_cell(r, lo, hi, n) for r, lo, hi, n in
                                           zip(t3[f"rate_{d}"], t3[f"ci_low_{d}"], t3[f"ci_high_{d}"], t3[f"n_{d}"])]
        shown[f"{label} k/n"] = [f"{k:.0f}/{n:.0f}" if math.isfinite(k) else NA
                                 for k, n in zip(t3[f"k_{d}"], t3[f"n_{d}"])]
        shown[f"{label} mean Δ_NLL"] = t3[f"mean_delta_{d}"].map(_num)
    report.sections.append(Section("influence_table3",
                                   f"Table 3: rates at Δ_NLL {THRESHOLDS.get(rate, rate)}, then at the "
                                   f"other threshold ({condition})", t3, shown,
                                   "Wilson 95% intervals from the counts pooled over seeds; †: fewer than "
                                   f"{tables.FEW} contrasts. " + note, main=True))
    lead = t3[t3["threshold"] == t3["threshold"].iloc[0]].reset_index(drop=True)
    threshold = lead["threshold"].iloc[0].removeprefix("Δ_NLL ")
    report.figures["influence_fig4_checkpoints"] = checkpoint_rates_figure(lead, axes, threshold)


def add_table5(report, runs: pd.DataFrame, condition: str, rate: str) -> None:
    t5, tests = tables.table5(runs, condition, rate)
    shown = _axes_shown(t5, tables.row_axes(runs))
    for short, label, digits in (("rate_a_to_b", "A-to-B rate (%)", 2), ("rate_b_to_a", "B-to-A rate (%)", 2),
                                 ("delta_a_to_b", "A-to-B Δ_NLL", 4), ("delta_b_to_a", "B-to-A Δ_NLL", 4)):
        shown[label] = [f"{_num(m, digits)} ± {_num(s, digits)}"
                        for m, s in zip(t5[f"{short}_mean"], t5[f"{short}_sd"])]
    shown["A>B by rate"] = [f"{k}/{n}" for k, n in zip(t5["a_gt_b_by_rate"], t5["cells_by_rate"])]
    shown["A>B by Δ"] = [f"{k}/{n}" for k, n in zip(t5["a_gt_b_by_delta"], t5["cells_by_delta"])]
    total = {c: "" for c in shown.columns}
    total[shown.columns[0]] = "All cells"
    total["A>B by rate"], total["A>B by Δ"] = (f"{tests[k][0]}/{tests[k][1]}" for k in ("by_rate", "by_delta"))
    shown = pd.concat([shown, pd.DataFrame([total])], ignore_index=True)
    note = "; ".join(f"sign test {k.replace('_', ' ')}: {s}/{n} cells, one-sided p = {format_p(p)}"
                     for k, (s, n, p) in tests.items())
    report.sections.append(Section("influence_table5", f"Table 5: seed-level statistics at Δ_NLL "
                                                        f"{THRESHOLDS.get(rate, rate)} ({condition})", t5, shown,
                                   note, pooled_last=True))
    report.metrics.update({f"influence_sign_{k}_log10_p": v[2] for k, v in tests.items()})


def _diagnostic_cell(kind: str, value: float, k: float, n: float) -> str:
    if kind == "count":
        return NA if not math.isfinite(value) else f"{value:.0f}"
    if kind in ("value", "percent"):
        return _num(value, 1 if kind == "percent" else 3)
    if not math.isfinite(n) or n == 0:
        return NO_CONTRASTS if math.isfinite(n) else NA
    return f"{value:.1f} ({k:.0f}/{n:.0f})" if math.isfinite(k) else NA


def add_diagnostics(report: Report, runs: pd.DataFrame, conditions=("unmasked", "masked")) -> None:
    """The diagnostics paper 002 reports beside its tables (`influence_study.diagnostics`), as a section."""
    table = tables.diagnostics(runs, conditions)
    shown = table[["metric"]].copy()
    for c in conditions:
        shown[c] = [_diagnostic_cell(kind, v, k, n) for kind, v, k, n in
                    zip(table["kind"], table[c], table.get(f"k_{c}", pd.Series(math.nan, index=table.index)),
                        table.get(f"n_{c}", pd.Series(math.nan, index=table.index)))]
    report.sections.append(Section(
        "influence_diagnostics", "Paper 002 diagnostics: n-grams, canary, bridge, graph-cut control, budget, skips",
        table, shown, "Pooled over the selected runs. §4: 4-gram overlap of A_private with B's blocks (corrected: "
        "less the prompt's and A_public's); §6.2: B-to-A split by natural and bridged next A turns; §6.3: the "
        "control's natural NLL and how often it differs from the primary's; contrasts skipped, by reason."))
