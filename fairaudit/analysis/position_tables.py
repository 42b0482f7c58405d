"""The position-bias paper's cross-configuration tables from stacked MCQ records (Tables 1-4).

records: the MCQ records of several runs stacked, each row with model, dataset (the
benchmark), arm (the mode) and the columns `analysis.position.position` reads. A
configuration is one (model, arm, dataset); configurations keep their order of first appearance.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import pandas as pd

from fairaudit.analysis.position import LENGTH_BIN_COUNTS, ZERO_METHODS, pbs_wilcoxon, position

CONFIGURATION = ["model", "arm", "dataset"]
SUMMARY_COLUMNS = ["n_records", "accuracy", "pbs", "ccp", "eff_sw", "length_chars", "extraction_rate",
                   "fallback_rate", "partial_rho_length_pbs", "partial_rho_length_pbs_p",
                   "partial_rho_length_pbs_log10_p"]
ROBUSTNESS_BINS = tuple(k for k in LENGTH_BIN_COUNTS if k != 4)  # Appendix C: 3, 5, 10


def configuration_metrics(records: pd.DataFrame, partial_corr: str = "pearson") -> pd.DataFrame:
    """`position` metrics (unsuffixed names) and its length-bin table per configuration.

    Returns one row per (model, arm, dataset) with every metric of `position` (n_records,
    accuracy, pbs, ccp, eff_sw, length_chars, extraction_rate, pbs_q1..q4, pbs_monotonic_k{k}, ...);
    partial_rho_length_pbs by `partial_corr`, each method also under its own name.
    """
    rows = []
    for (model, dataset), frame in records.groupby(["model", "dataset"], sort=False):
        summary = position(frame, partial_corr)["tables"]["position_summary"]
        rows.append(summary.assign(model=model, dataset=dataset))
    table = pd.concat(rows, ignore_index=True)
    return table[CONFIGURATION + [c for c in table.columns if c not in CONFIGURATION]]


def length_bins(records: pd.DataFrame) -> pd.DataFrame:
    """Mean PBS per equal-frequency length bin (k = 3, 4, 5, 10) per configuration (Fig. 2, Table 3)."""
    rows = [position(frame)["tables"]["pbs_by_length"].assign(model=model, dataset=dataset)
            for (model, dataset), frame in records.groupby(["model", "dataset"], sort=False)]
    table = pd.concat(rows, ignore_index=True)
    return table[CONFIGURATION + [c for c in table.columns if c not in CONFIGURATION]]


def summary_table(metrics: pd.DataFrame) -> pd.DataFrame:
    """Table 2: n-rec, Acc, PBS, CCP, Eff-Sw and Len per configuration, with the extraction rates of App. B.

    metrics: `configuration_metrics(...)`.
    """
    return metrics.reindex(columns=CONFIGURATION + SUMMARY_COLUMNS)


def partial_correlation_table(metrics: pd.DataFrame, method: str | None = None) -> pd.DataFrame:
    """Table 1: partial rho(length, PBS | accuracy) and its p per (model, mode), one column pair per benchmark.

    method: "pearson" or "spearman" (None: the metrics' partial_rho_length_pbs, whichever method made it).
    Columns model, arm, then {dataset}_rho, {dataset}_p and {dataset}_log10_p for each benchmark.
    """
    datasets = list(dict.fromkeys(metrics["dataset"]))
    rho = "partial_rho_length_pbs" + (f"_{method}" if method else "")
    wide = metrics.pivot_table(index=["model", "arm"], columns="dataset", sort=False, dropna=False,
                               values=[rho, f"{rho}_p", f"{rho}_log10_p"])
    names = {rho: "rho", f"{rho}_p": "p", f"{rho}_log10_p": "log10_p"}
    wide.columns = [f"{dataset}_{names[value]}" for value, dataset in wide.columns]
    return wide.reindex(columns=[f"{d}_{v}" for d in datasets for v in ("rho", "p", "log10_p")]).reset_index()


def robustness_table(metrics: pd.DataFrame, bins: Sequence[int] = ROBUSTNESS_BINS) -> pd.DataFrame:
    """Table 3: per configuration and k, strictly monotonic PBS across k length bins, first violation, gradient.

    Columns model, arm, dataset, then monotonic_k{k} (1 / 0), first_violation_k{k} (1-based
    bin, 0 when monotonic) and gradient_k{k} (longest-bin PBS minus shortest-bin PBS).
    """
    columns = {f"pbs_{name}_k{k}": f"{name}_k{k}"
               for k in bins for name in ("monotonic", "first_violation", "gradient")}
    return metrics.reindex(columns=CONFIGURATION + list(columns)).rename(columns=columns)


def wilcoxon_table(records: pd.DataFrame, pairs: Mapping[str, str], reasoning_arm: str = "reason",
                   references: Sequence[str] = ("cot", "direct"), zero_method: str = "wilcox") -> pd.DataFrame:
    """Table 4: one-sided paired Wilcoxon of per-question PBS, each reasoning model against its Instruct pair.

    pairs: reasoning model -> Instruct model of the same family (the matched pairs of §3.1).
    For each pair, benchmark and reference mode: n questions paired, the zero differences among
    them, mean PBS difference (reasoning − reference) and p for the alternative reasoning PBS >
    reference PBS under `zero_method`, then p under each of scipy's three zero methods.
    Columns family, dataset, comparison, n, zeros, mean_diff, p, p_wilcox, p_pratt, p_zsplit and the log10 of
    each p (log10_p, log10_p_<method>); combinations without records are skipped.
    """
    rows = []
    for reasoning, instruct in pairs.items():
        for dataset in dict.fromkeys(records["dataset"]):
            on = records[records["dataset"] == dataset]
            a = on[(on["model"] == reasoning) & (on["arm"] == reasoning_arm)]
            for reference in references:
                b = on[(on["model"] == instruct) & (on["arm"] == reference)]
                if a.empty or b.empty:
                    continue
                tests = {method: pbs_wilcoxon(a, b, zero_method=method) for method in ZERO_METHODS}
                test = tests[zero_method]
                rows.append({"family": reasoning, "dataset": dataset, "comparison": f"{reasoning_arm} > {reference}",
                             "n": test["pbs_wilcoxon_n"], "zeros": test["pbs_wilcoxon_zeros"],
                             "mean_diff": test["pbs_wilcoxon_mean_diff"], "p": test["pbs_wilcoxon_p"],
                             **{f"p_{m}": t["pbs_wilcoxon_p"] for m, t in tests.items()},
                             "log10_p": test["pbs_wilcoxon_log10_p"],
                             **{f"log10_p_{m}": t["pbs_wilcoxon_log10_p"] for m, t in tests.items()}})
    return pd.DataFrame(rows, columns=["family", "dataset", "comparison", "n", "zeros", "mean_diff", "p",
                                       *[f"p_{m}" for m in ZERO_METHODS], "log10_p",
                                       *[f"log10_p_{m}" for m in ZERO_METHODS]])
