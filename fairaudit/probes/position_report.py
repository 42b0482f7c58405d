"""The position-bias paper's report sections (Tables 1-4, the truncation tests, Figs. 2-4) from the runs of
the probes that list `paper001` (position), each a pure function of `fairaudit.analysis.position_tables`
applied to the runs' records stacked with their model and dataset."""

from __future__ import annotations

import math
from typing import Mapping

import pandas as pd

from fairaudit.analysis import position_tables as f001
from fairaudit.analysis.position import ZERO_METHODS
from fairaudit.analysis.position_figures import length_pbs_panels, pbs_length_figure, truncation_figure
from fairaudit.analysis.position_truncation import truncation
from fairaudit.analysis.stats import PARTIAL_METHODS
from fairaudit.errors.rules import check_fields, one_of
from fairaudit.views.render import count, section
from fairaudit.views.sections import RecordsLoader, Report
from fairaudit.views.selection import Settings, shared, stacked

SETTINGS = {"partial_corr": one_of(*PARTIAL_METHODS), "zero_method": one_of(*ZERO_METHODS)}


def paper001(report: Report, runs: pd.DataFrame, load_records: RecordsLoader, settings: Settings) -> None:
    """The position-bias paper's Tables 1-4, the truncation tests and Figs. 2-4 (settings: partial_corr,
    zero_method, pairs)."""
    for probe, own in settings.items():
        check_fields(f"probes.{probe}", own, SETTINGS)
    chosen = shared(settings, ("partial_corr", "zero_method", "pairs"))
    key = "/".join(f"probes.{probe}" for probe in settings)
    sections, figures = paper001_sections(runs, load_records, dict(chosen["pairs"] or {}), chosen["partial_corr"],
                                          chosen["zero_method"], key)
    report.sections += sections
    report.figures |= figures


def paper001_sections(runs: pd.DataFrame, load: RecordsLoader, pairs: Mapping[str, str], partial_corr: str = "pearson",
                      zero_method: str = "wilcox", key: str = "probes.position") -> tuple[list, dict]:
    """The position-bias paper's Tables 1-4, the truncation tests and Figs. 2-4 from the probe's runs.

    partial_corr: Table 1's method (the other one follows as a table of its own); zero_method: Table 4's p
    (all three of scipy's are shown beside it); key: where the settings are set (probes.<name>), for the notes.
    """
    sections, figures = [], {}
    if runs.empty:
        return sections, figures
    records = stacked(runs, load(list(runs["run_id"])))
    metrics = f001.configuration_metrics(records, partial_corr)
    sections += _partial_correlation_sections(metrics, partial_corr, key)
    sections.append(section(
        "p001_table2", "Position bias, Table 2: full per-configuration results", f001.summary_table(metrics),
        POSITION_HEADERS | {"partial_rho_length_pbs": f"partial ρ ({partial_corr})"},
        "Acc over extracted answers; PBS over questions with all four permutations extracted "
        "(at most √0.75); extraction = the A.2 cascade alone (App. B), fallback reported apart.",
        {"n_records": count, "length_chars": count}))
    sections.append(section(
        "p001_table3", "Position bias, Table 3: length-bucket robustness", f001.robustness_table(metrics),
        {}, "monotonic_k{k}: 1 when PBS rises strictly from the shortest to the longest of k equal-frequency bins; "
            "first_violation_k{k}: the first bin out of order (viol@i); gradient: longest-bin minus shortest-bin PBS.",
        {c: count for c in f001.robustness_table(metrics).columns if c.startswith(("monotonic", "first"))}))
    wilcoxon = f001.wilcoxon_table(records, pairs, zero_method=zero_method)
    if not wilcoxon.empty:
        sections.append(section(
            "p001_table4",
            "Position bias, Table 4: paired Wilcoxon signed-rank test, reasoning PBS against Instruct PBS",
            wilcoxon, {"mean_diff": "Mean diff", "p": f"p (1-sided, {zero_method})", "zeros": "zero diffs",
                       **{f"p_{m}": f"p {m}" for m in ZERO_METHODS}},
            "One-sided alternative: the reasoning model's per-question PBS exceeds the Instruct model's, paired by "
            f"question; {key}.pairs names the matched pairs. Zero differences: `{zero_method}` "
            f"({key}.zero_method; the paper does not say) in p; wilcox drops them, pratt ranks then drops "
            "them, zsplit splits their ranks.",
            {"n": count, "zeros": count}))
    figures["p001_fig2_length_pbs"] = length_pbs_panels(f001.length_bins(records), metrics)
    for dataset, rows in metrics.groupby("dataset", sort=False):
        labelled = rows.assign(label=rows["model"] + " " + rows["arm"])
        if (labelled["pbs"].notna() & (labelled["length_chars"] > 0)).any():
            figures[f"p001_fig4_pbs_length_{dataset}"] = pbs_length_figure(labelled.dropna(subset=["pbs"]),
                                                                           label="label")
    truncated_sections, truncated_figures = _truncation_sections(runs, load)
    return sections + truncated_sections, figures | truncated_figures


def _partial_correlation_sections(metrics: pd.DataFrame, method: str, key: str) -> list:
    """Table 1 by `method`, then the same table by the other method."""
    sections = []
    others = [(f"p001_table1_{m}", m) for m in PARTIAL_METHODS if m != method]
    for name, shown_method in (("p001_table1", method), *others):
        rho = f001.partial_correlation_table(metrics, shown_method)
        title = ("Position bias, Table 1: partial correlation between per-question mean trajectory length and PBS, "
                 f"controlling for accuracy ({shown_method})")
        if name != "p001_table1":
            title = f"Position bias, Table 1 by the other method ({shown_method})"
        sections.append(section(
            name, title, rho, {"arm": "Mode"},
            "*: p < 0.05; **: p < 0.01; ***: p < 10^-3 (two-sided t-test of the partial correlation on n − 3 "
            "degrees of freedom). pearson: residual correlation of length and PBS after regressing each on accuracy; "
            f"spearman: the same on ranks. {key}.partial_corr chooses the first table.",
            shown=_with_stars(rho)))
    return sections


def _truncation_sections(position_runs: pd.DataFrame, load: RecordsLoader) -> tuple[list, dict]:
    """§5.3 per configuration: change rates before and after CCP, the paper's chi-square and the exact test
    within questions beside it, and Fig. 3."""
    counts = [c for c in position_runs if c.startswith("trunc_n_continuations")]
    truncated = position_runs[position_runs[counts].gt(0).any(axis=1)] if counts else position_runs.iloc[0:0]
    if truncated.empty:
        return [], {}
    frames = load(list(truncated["run_id"]), "continuations")
    continuations = stacked(truncated, {run: frame.assign(run_id=run) for run, frame in frames.items()})
    results = {key: truncation(frame) for key, frame in continuations.groupby(["model", "arm", "dataset"], sort=False)}
    by_position = pd.concat([r["tables"]["truncation_by_position"].assign(configuration=" ".join(key))
                             for key, r in results.items()])
    names = ["trunc_n", "trunc_extraction_rate_before_ccp", "trunc_extraction_rate_after_ccp",
             "trunc_change_rate_before_ccp", "trunc_change_rate_after_ccp", "trunc_ccp_chi2",
             "trunc_ccp_chi2_p", "trunc_ccp_chi2_log10_p", "trunc_ccp_perm_n_questions", "trunc_ccp_question_diff",
             "trunc_ccp_mh_diff", "trunc_ccp_perm_p", "trunc_ccp_perm_log10_p"]
    table = pd.DataFrame([{**dict(zip(("model", "arm", "dataset"), key)), **{n: r["metrics"][n] for n in names}}
                          for key, r in results.items()])
    table_section = section(
        "p001_truncation", "Position bias, §5.3: before- vs after-CCP change rate, two tests", table,
        {"arm": "Mode", "trunc_n": "continuations", "trunc_extraction_rate_before_ccp": "extracted before CCP",
         "trunc_extraction_rate_after_ccp": "extracted after CCP", "trunc_change_rate_before_ccp": "change before CCP",
         "trunc_change_rate_after_ccp": "change after CCP", "trunc_ccp_chi2": "χ²", "trunc_ccp_chi2_p": "χ² p",
         "trunc_ccp_perm_n_questions": "questions", "trunc_ccp_question_diff": "mean question change",
         "trunc_ccp_mh_diff": "MH change", "trunc_ccp_perm_p": "within-question p"},
        "χ² p: the paper's test (Yates, 2x2), every continuation independent. within-question p: two-sided, exact: "
        "each question's cuts relabeled before/after at random, keeping how many it has on each side (a cut's "
        "continuations move together: they resample one prefix), the statistic the cuts' change rates summed "
        "after the CCP; its size holds whatever a question's counts, change rates and the share of answers each "
        "side's continuations gave up to extraction, where the χ²'s and the sign flip's did not (docs/probes.md). "
        "Where the extracted shares differ by side, the χ² and the pooled change rates weigh the side that kept "
        "more. Questions cut on one side only are left out. MH change: the Mantel-Haenszel after-minus-before "
        "difference of the cuts' rates, the test's effect; mean question change: the mean of the questions' own.",
        {"trunc_n": count, "trunc_ccp_perm_n_questions": count})
    return [table_section], {"p001_fig3_truncation": truncation_figure(by_position, by="configuration")}


POSITION_HEADERS = {"arm": "Mode", "dataset": "Bench", "n_records": "n-rec", "accuracy": "Acc", "pbs": "PBS",
                    "ccp": "CCP", "eff_sw": "Eff-Sw", "length_chars": "Len (chars)", "extraction_rate": "Extraction",
                    "fallback_rate": "Fallback", "partial_rho_length_pbs": "partial ρ",
                    "partial_rho_length_pbs_p": "p"}


def _with_stars(table: pd.DataFrame) -> pd.DataFrame:
    """Table 1's cells: rho with its significance stars, as text (the CSV keeps the numbers)."""
    out = table[["model", "arm"]].copy()
    for column in [c for c in table.columns if c.endswith("_rho")]:
        dataset = column.removesuffix("_rho")
        out[dataset] = [_starred(rho, p) for rho, p in zip(table[column], table[f"{dataset}_log10_p"])]
    return out


def _starred(rho: float, log10_p: float) -> str:
    if not math.isfinite(rho):
        return "–"
    stars = "***" if log10_p < -3 else "**" if log10_p < -2 else "*" if log10_p < math.log10(0.05) else ""
    return f"{rho:.2f}{stars}"


