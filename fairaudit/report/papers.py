"""Report sections for the rest of paper 000 (beyond Tables 2, 9, 5) and for the position-bias paper (001).

Each section is a pure function of `fairaudit.analysis` applied to the selected runs' records
frames, stacked with the model and dataset of their run; this module only picks the runs,
loads their records, and names, captions and formats the tables as the papers print them.
"""

from __future__ import annotations

import math

from typing import Mapping

import pandas as pd

from fairaudit.analysis import fairness_tables as f000
from fairaudit.analysis import study
from fairaudit.analysis.study_figures import delta_figure
from fairaudit.analysis import position_tables as f001
from fairaudit.analysis.cdpg_figures import cdpg_figures
from fairaudit.analysis.position import ZERO_METHODS, truncation
from fairaudit.analysis.position_figures import length_pbs_panels, pbs_length_figure, truncation_figure
from fairaudit.errors import AuditError
from fairaudit.report import render
from fairaudit.report.sections import RecordsLoader, Report, Section
from fairaudit.stats import PARTIAL_METHODS
from fairaudit.validate import check_fields, one_of

PAIRED_PROBES = ("counterfactual", "btm", "cdpg")


def stacked(runs: pd.DataFrame, frames: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Runs' frames stacked with their run's model and dataset; pair ids prefixed by run id, so runs stay apart.

    runs: run_id, model, dataset (tags). Columns the frames already carry are kept.
    """
    tags = runs.set_index("run_id")
    parts = []
    for run_id, frame in frames.items():
        frame = frame.assign(**{axis: tags.at[run_id, axis] for axis in ("model", "dataset") if axis not in frame})
        if "pair_id" in frame:
            frame = frame.assign(pair_id=f"{run_id}:" + frame["pair_id"].astype(str))
        parts.append(frame)
    return pd.concat(parts, ignore_index=True)


def paper000(report: Report, runs: pd.DataFrame, load_records: RecordsLoader, cfg) -> None:
    """Paper 000 from the paired probes' runs: Tables 2, 9, 5, 7 with a pooled row, then Tables 3/10/11, 4,
    13/14, 12, App. G and, from cdpg runs, Table 6 and Figs. 3, 4, 6 (registered by counterfactual, btm, cdpg)."""
    add_paper_tables(report, runs, load_records, list(cfg.tables.probes))
    paired = runs[runs["probe"].isin(PAIRED_PROBES)]
    if not paired.empty:
        sections, figures = paper000_sections(runs, load_records, *comparison(paired), cfg.cdpg, report.missing)
        report.sections += sections
        report.figures |= figures


def paper001(report: Report, runs: pd.DataFrame, load_records: RecordsLoader, cfg) -> None:
    """The position-bias paper's Tables 1-4, the truncation tests and Figs. 2-4 from the position runs
    (registered by position)."""
    settings = {"partial_corr": cfg.position.get("partial_corr", "pearson"),
                "zero_method": cfg.position.get("zero_method", "wilcox")}
    check_fields("report.position", settings, {"partial_corr": one_of(*PARTIAL_METHODS),
                                               "zero_method": one_of(*ZERO_METHODS)})
    sections, figures = paper001_sections(runs, load_records, dict(cfg.position.pairs), **settings)
    report.sections += sections
    report.figures |= figures


def table_runs(runs: pd.DataFrame, probes: list[str]) -> pd.DataFrame:
    """Runs of the paired probes that logged contingency cells."""
    if "cell_a" not in runs:
        return runs.iloc[0:0]
    return runs[runs["probe"].isin(probes) & runs["cell_a"].notna()]


def comparison(rows: pd.DataFrame) -> tuple[str, str]:
    """The (treatment, baseline) arms every paired run compares; an AuditError when they differ."""
    arms = rows[["arm", "baseline"]].drop_duplicates()
    if len(arms) > 1 or arms["baseline"].isna().any():
        pairs = [f"{a} vs {b}" for a, b in arms.itertuples(index=False)]
        raise AuditError(f"the paired runs compare different arms ({pairs}); pool one comparison at a time, "
                         "e.g. select.tags.arm=think")
    return tuple(arms.iloc[0])


def add_paper_tables(report: Report, runs: pd.DataFrame, load_records: RecordsLoader, probes: list[str]) -> None:
    """Tables 2, 9, 5 and 7 of paper 000, one row per run and a pooled row from the pooled records."""
    rows = table_runs(runs, probes)
    if rows.empty:
        wanted = "/".join(probes)
        report.missing.append(f"Tables 2, 9, 5, 7: no {wanted} runs among the {len(runs)} selected (they read their cells "
                              f"from tables.probes={probes}); run probe={probes[0]} on the same grid, or select such runs "
                              f"with select.parent=null select.tags.probe={probes[0]}")
        return
    treatment, baseline = comparison(rows)
    axes = study.cell_axes(rows)
    pooled = study.pooled_metrics(load_records(list(rows["run_id"])), treatment, baseline)
    tables = study.paper_tables(rows, pooled, treatment, baseline, axes)
    headers = render.paper_headers(treatment, baseline)
    captions = {
        "table2": ("Table 2: contingency cells, McNemar's exact test, mean D_disp in cells b and c",
                   f"Cells a-d of {treatment} against {baseline}; McNemar p is exact two-sided on (b, c); "
                   "the pooled row is computed from all runs' records pooled, not from their metrics."),
        "table9": ("Table 9: counterfactual and group disparity per arm",
                   f"D_cf and D_group under {treatment} and {baseline}, Δ = {treatment} − {baseline}."),
        "table5": ("Table 5: directional decomposition of created flips (cell c)",
                   "c α↑: alpha answered Yes and alpha' No under the treatment; δ_c in % of N."),
        "table7": ("Table 7: the asymmetric dual effect per model (Appendix D layout)",
                   f"Same protocol as Table 2; c:b the ratio of created to resolved flips; D_disp at full "
                   f"{treatment} depth within cells c and b."),
    }
    for name, table in tables.items():
        title, note = captions[name]
        report.sections.append(Section(name, title, table, render.display(table, headers), note, pooled_last=True,
                                       main=name == "table2"))
    report.figures["disparity_changes"] = delta_figure(tables["table9"], axes, (treatment, baseline))
    report.metrics.update({f"pooled_{k}": v for k, v in pooled.items() if isinstance(v, (int, float))})
    report.metrics["n_table_runs"] = len(rows)


def _one_probe_per_cell(runs: pd.DataFrame, probes: tuple[str, ...]) -> pd.DataFrame:
    """Runs of the first of `probes` each (model, dataset) has: they all hold the same generations."""
    rows = runs[runs["probe"].isin(probes)].copy()
    rows["rank"] = rows["probe"].map({p: i for i, p in enumerate(probes)})
    first = rows.groupby(["model", "dataset"], sort=False)["rank"].transform("min")
    return rows[rows["rank"] == first]


def _section(name: str, title: str, table: pd.DataFrame, headers: dict[str, str], note: str = "",
             formats: dict | None = None, shown: pd.DataFrame | None = None):
    """A report section: `table` numeric in its CSV, `shown` (default: `table` formatted) in report.md."""
    return Section(name, title, table, render.display(table if shown is None else shown, headers, formats), note)


def paper000_sections(runs: pd.DataFrame, load: RecordsLoader, treatment: str, baseline: str, cdpg_cfg,
                      missing: list[str]) -> tuple[list, dict]:
    """Tables 3 (10, 11), 4, 13 (14), 12, App. G's marginal T and, from cdpg runs, Table 6 and Figs. 3, 4, 6;
    a line in `missing` when there are no cdpg runs."""
    sections, figures = [], {}
    record_runs = _one_probe_per_cell(runs, PAIRED_PROBES)
    if record_runs.empty:
        return sections, figures
    records = stacked(record_runs, load(list(record_runs["run_id"])))
    group = f000.group_transitions(records, treatment, baseline)
    headers = {"A": "A"} | {c: _group_header(c) for c in group.columns if c not in ("model", "A")}
    sections.append(_section(
        "table3", "Table 3 (with 10, 11): group-level transition matrix T^A per model, stratified by protected attribute",
        group, headers,
        "P(Y|Y), P(Y|N): probability of a Y prediction under thinking from a Y or N prediction without; "
        "ΔP(Y) = P(Y)_th − P(Y)_nt. Tables 10 and 11 are the rows of the other models.",
        shown=group.assign(A=group["A"].map(f000.SIDE_LABELS))))
    for split, name, title in ((False, "table4", "Table 4: pair-state transition matrix T^pair (forward: nothink → think)"),
                               (True, "table13", "Tables 13, 14: T^pair with M split into YN and NY")):
        table = f000.pair_state_transitions(records, treatment, baseline, split)
        sections.append(_section(name, title, table, {"from": "from", "n": "n"},
                                 "Within-row conditional probabilities; row counts n and a `total` row of column counts "
                                 "per (model, dataset); the pooled block sums every cell.", {"n": _count}))
    independence = f000.independence_check(records, treatment, baseline)
    sections.append(_section(
        "table12", "Table 12: independence-bound check per (model, dataset) cell", independence, INDEPENDENCE_HEADERS,
        "Independence predictions E|c| = 2p(1−p)|NN|_nt + 2q(1−q)|YY|_nt, E|b| = [p(1−q) + q(1−p)]|M|_nt with "
        "p = P(Y|N), q = P(N|Y) averaged over α and α′; ratio = ind. / actual.",
        {c: _count for c in ("c_actual", "b_actual")} | {c: _one_decimal for c in ("c_ind", "b_ind")}
        | {c: _times for c in ("c_ind_ratio", "b_ind_ratio")}
        | {c: _one_decimal for c in ("c_b_ratio_ind", "c_b_ratio_actual")}))
    marginal = f000.marginal_transition(records, treatment, baseline)
    sections.append(_section(
        "marginal_t", "Appendix G: pooled marginal T = E_A[T^A] under the per-side parse filter", marginal,
        {"n_to_y": f"{treatment}=Y", "p_to_y": "P", "n_to_n": f"{treatment}=N", "p_to_n": "P", "n": "total"},
        f"Pooled over {int(marginal['n'].sum()):,} per-instance observations; an instance counts when its own "
        f"{treatment} and {baseline} answers parse, whatever its partner's.",
        {c: _count for c in ("n_to_y", "n_to_n", "n")}))
    cdpg_runs = runs[runs["probe"] == "cdpg"]
    if cdpg_runs.empty:
        missing.append("Table 6 and Figs. 3, 4, 6: no cdpg runs among those selected; run probe=cdpg on the same grid, "
                       "or select such runs with select.parent=null select.tags.probe=cdpg")
    else:
        depth = stacked(cdpg_runs, load(list(cdpg_runs["run_id"]), "depth_records"))
        cdpg_records = stacked(cdpg_runs, load(list(cdpg_runs["run_id"])))
        result = f000.pooled_cdpg(depth, cdpg_records, treatment, baseline, int(cdpg_cfg.K), list(cdpg_cfg.k_list),
                                  cdpg_cfg.k_sensitivity_subsample)
        table6 = f000.k_sensitivity(result["tables"])
        sections.append(_section(
            "table6", "Table 6: CDPG segmentation sensitivity", table6,
            {"n_c": "n_c"} | {c: f"K={c.removeprefix('slope_k')}" for c in table6.columns if c.startswith("slope_k")},
            "Fitted linear slope of the cell-c mean |CDPG_k| against k/K per K; n_c is the number of cell-c pairs"
            + (f" in a rerun subsample of {cdpg_cfg.k_sensitivity_subsample} pairs per cell."
               if cdpg_cfg.k_sensitivity_subsample else "."), {"n_c": _count}))
        drawn = cdpg_figures(result["tables"], int(cdpg_cfg.K), list(cdpg_cfg.k_list))
        figures |= {"fig3_cdpg_by_cell": drawn["cdpg_by_cell"], "fig4_anchor_mover": drawn["cdpg_anchor_mover"],
                    "fig6_k_sensitivity": drawn["cdpg_k_sensitivity"]}
    return sections, figures


def paper001_sections(runs: pd.DataFrame, load: RecordsLoader, pairs: Mapping[str, str], partial_corr: str = "pearson",
                      zero_method: str = "wilcox") -> tuple[list, dict]:
    """The position-bias paper's Tables 1-4, the truncation tests and Figs. 2-4 from position runs.

    partial_corr: Table 1's method (the other one follows as a table of its own); zero_method: Table 4's p
    (all three of scipy's are shown beside it).
    """
    sections, figures = [], {}
    position_runs = runs[runs["probe"] == "position"]
    if position_runs.empty:
        return sections, figures
    records = stacked(position_runs, load(list(position_runs["run_id"])))
    metrics = f001.configuration_metrics(records, partial_corr)
    sections += _partial_correlation_sections(metrics, partial_corr)
    sections.append(_section(
        "p001_table2", "Position bias, Table 2: full per-configuration results", f001.summary_table(metrics),
        POSITION_HEADERS | {"partial_rho_length_pbs": f"partial ρ ({partial_corr})"},
        "Acc over extracted answers; PBS over questions with all four permutations extracted "
        "(at most √0.75); extraction = the A.2 cascade alone (App. B), fallback reported apart.",
        {"n_records": _count, "length_chars": _count}))
    sections.append(_section(
        "p001_table3", "Position bias, Table 3: length-bucket robustness", f001.robustness_table(metrics),
        {}, "monotonic_k{k}: 1 when PBS rises strictly from the shortest to the longest of k equal-frequency bins; "
            "first_violation_k{k}: the first bin out of order (viol@i); gradient: longest-bin minus shortest-bin PBS.",
        {c: _count for c in f001.robustness_table(metrics).columns if c.startswith(("monotonic", "first"))}))
    wilcoxon = f001.wilcoxon_table(records, pairs, zero_method=zero_method)
    if not wilcoxon.empty:
        sections.append(_section(
            "p001_table4", "Position bias, Table 4: paired Wilcoxon signed-rank test, reasoning PBS against Instruct PBS",
            wilcoxon, {"mean_diff": "Mean diff", "p": f"p (1-sided, {zero_method})", "zeros": "zero diffs",
                       **{f"p_{m}": f"p {m}" for m in ZERO_METHODS}},
            "One-sided alternative: the reasoning model's per-question PBS exceeds the Instruct model's, paired by "
            f"question; report.position.pairs names the matched pairs. Zero differences: `{zero_method}` "
            "(report.position.zero_method; the paper does not say) in p; wilcox drops them, pratt ranks then drops "
            "them, zsplit splits their ranks.",
            {"n": _count, "zeros": _count}))
    figures["p001_fig2_length_pbs"] = length_pbs_panels(f001.length_bins(records), metrics)
    for dataset, rows in metrics.groupby("dataset", sort=False):
        labelled = rows.assign(label=rows["model"] + " " + rows["arm"])
        if (labelled["pbs"].notna() & (labelled["length_chars"] > 0)).any():
            figures[f"p001_fig4_pbs_length_{dataset}"] = pbs_length_figure(labelled.dropna(subset=["pbs"]), label="label")
    truncated_sections, truncated_figures = _truncation_sections(position_runs, load)
    return sections + truncated_sections, figures | truncated_figures


def _partial_correlation_sections(metrics: pd.DataFrame, method: str) -> list:
    """Table 1 by `method`, then the same table by the other method."""
    sections = []
    for name, shown_method in (("p001_table1", method), *[(f"p001_table1_{m}", m) for m in PARTIAL_METHODS if m != method]):
        rho = f001.partial_correlation_table(metrics, shown_method)
        title = ("Position bias, Table 1: partial correlation between per-question mean trajectory length and PBS, "
                 f"controlling for accuracy ({shown_method})")
        if name != "p001_table1":
            title = f"Position bias, Table 1 by the other method ({shown_method})"
        sections.append(_section(
            name, title, rho, {"arm": "Mode"},
            "*: p < 0.05; **: p < 0.01; ***: p < 10^-3 (two-sided t-test of the partial correlation on n − 3 "
            "degrees of freedom). pearson: residual correlation of length and PBS after regressing each on accuracy; "
            "spearman: the same on ranks. report.position.partial_corr chooses the first table.",
            shown=_with_stars(rho)))
    return sections


def _truncation_sections(position_runs: pd.DataFrame, load: RecordsLoader) -> tuple[list, dict]:
    """§5.3 per configuration: change rates before and after CCP, the paper's chi-square and the permutation
    test over questions beside it, and Fig. 3."""
    counts = [c for c in position_runs if c.startswith("trunc_n_continuations")]
    truncated = position_runs[position_runs[counts].gt(0).any(axis=1)] if counts else position_runs.iloc[0:0]
    if truncated.empty:
        return [], {}
    continuations = stacked(truncated, load(list(truncated["run_id"]), "continuations"))
    results = {key: truncation(frame) for key, frame in continuations.groupby(["model", "arm", "dataset"], sort=False)}
    by_position = pd.concat([r["tables"]["truncation_by_position"].assign(configuration=" ".join(key))
                             for key, r in results.items()])
    names = ["trunc_n", "trunc_change_rate_before_ccp", "trunc_change_rate_after_ccp", "trunc_ccp_chi2",
             "trunc_ccp_chi2_p", "trunc_ccp_chi2_log10_p", "trunc_ccp_perm_n_questions", "trunc_ccp_question_diff",
             "trunc_ccp_perm_p", "trunc_ccp_perm_log10_p"]
    table = pd.DataFrame([{**dict(zip(("model", "arm", "dataset"), key)), **{n: r["metrics"][n] for n in names}}
                          for key, r in results.items()])
    section = _section(
        "p001_truncation", "Position bias, §5.3: before- vs after-CCP change rate, two tests", table,
        {"arm": "Mode", "trunc_n": "continuations", "trunc_change_rate_before_ccp": "change before CCP",
         "trunc_change_rate_after_ccp": "change after CCP", "trunc_ccp_chi2": "χ²", "trunc_ccp_chi2_p": "χ² p",
         "trunc_ccp_perm_n_questions": "questions", "trunc_ccp_question_diff": "mean question change",
         "trunc_ccp_perm_p": "sign-flip p"},
        "χ² p: the paper's test (Yates, 2x2), every continuation independent. sign-flip p: two-sided, questions as "
        "the units: each question's own after-minus-before change rate (mean question change: their mean), its sign "
        "flipped at random, so a question that lost its late cuts weighs as much as one that kept them; questions cut "
        "on one side only are left out; exact up to 16 questions, else probe.truncation.relabelings seeded sign "
        "vectors. Its size holds at 0.05 where the χ²'s and the pooled relabeling's do not (docs/probes.md).",
        {"trunc_n": _count, "trunc_ccp_perm_n_questions": _count})
    return [section], {"p001_fig3_truncation": truncation_figure(by_position, by="configuration")}


INDEPENDENCE_HEADERS = {"ind_p": "p", "ind_q": "q", "c_ind": "|c| ind.", "c_actual": "|c| actual",
                        "c_ind_ratio": "|c| ratio", "b_ind": "|b| ind.", "b_actual": "|b| actual",
                        "b_ind_ratio": "|b| ratio", "c_b_ratio_ind": "|c|/|b| ind.", "c_b_ratio_actual": "|c|/|b| actual"}
POSITION_HEADERS = {"arm": "Mode", "dataset": "Bench", "n_records": "n-rec", "accuracy": "Acc", "pbs": "PBS",
                    "ccp": "CCP", "eff_sw": "Eff-Sw", "length_chars": "Len (chars)", "extraction_rate": "Extraction",
                    "fallback_rate": "Fallback", "partial_rho_length_pbs": "partial ρ",
                    "partial_rho_length_pbs_p": "p"}


def _group_header(column: str) -> str:
    dataset, _, value = column.partition("_")
    return f"{dataset} " + {"p_y_given_y": "P(Y|Y)", "p_y_given_n": "P(Y|N)", "dp_yes": "ΔP(Y)"}[value]


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


def _count(value: float) -> str:
    return f"{int(round(value)):,}"


def _one_decimal(value: float) -> str:
    return f"{value:.1f}" if math.isfinite(value) else render.NA


def _times(value: float) -> str:
    return f"{value:.2f}×" if math.isfinite(value) else render.NA

