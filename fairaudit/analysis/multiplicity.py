"""Multiple comparisons across a study: a family of tests (e.g. every McNemar test of a models x datasets x arms
grid) and its Holm and Benjamini-Hochberg adjusted p-values, from the tests' log10 p.

Pure: a runs frame in (one row per run, metrics by their public names), frames and counts out; no MLflow.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

from fairaudit.analysis.numbers import LOG10_SMALLEST
from fairaudit.analysis.stats import p_value
from fairaudit.errors import AuditError

METHODS = {"holm": "holm", "bh": "fdr_bh"}  # column suffix -> statsmodels' multipletests method
LABELS = {"holm": "Holm", "bh": "Benjamini-Hochberg"}


def family_settings(cfg) -> tuple[list[str], float]:
    """(metrics, alpha) of a `family` config node (report.yaml); an AuditError naming the key for a metric that is
    not a log10 p or an alpha outside (0, 1)."""
    metrics, alpha = list(cfg["metrics"] or []), float(cfg["alpha"])
    wrong = [name for name in metrics if "_log10_p" not in f"_{name}"]
    if wrong:
        raise AuditError(f"report.family.metrics: {wrong} are not log10 p metrics (names holding log10_p, e.g. "
                         "mcnemar_log10_p or trunc_ccp_chi2_log10_p_cot); the family is adjusted from log10 p")
    if not 0.0 < alpha < 1.0:
        raise AuditError(f"report.family.alpha must be in (0, 1), got {alpha}")
    return metrics, alpha


def adjusted_log10_p(log10_p: Sequence[float], method: str) -> np.ndarray:
    """log10 of the family's adjusted p-values (`holm`: family-wise error; `bh`: false discovery rate), in order.

    statsmodels' `multipletests` on p = 10^log10 p where every p is a normal double. A p below the smallest
    double (McNemar's 10^-485.6) would reach it as 0.0 and come back adjusted to 0; such a family is adjusted by
    the same formulas in log10 space, exact at any size: Holm, over the p sorted ascending, log10 p_(i)^adj =
    min(0, max_{j <= i} log10((m - j + 1) p_(j))); BH, min(0, min_{j >= i} log10(m p_(j) / j)). Both equal
    multipletests' wherever it is defined (tests/test_multiplicity.py).
    """
    from statsmodels.stats.multitest import multipletests

    values = np.asarray(log10_p, dtype=float)
    if values.size == 0:
        return values
    if (values >= LOG10_SMALLEST).all():
        return np.log10(multipletests(10.0 ** values, method=METHODS[method])[1])
    m, order = len(values), np.argsort(values, kind="stable")
    rank = np.arange(1, m + 1)
    if method == "holm":
        sorted_adjusted = np.maximum.accumulate(values[order] + np.log10(m - rank + 1))
    else:
        sorted_adjusted = np.minimum.accumulate((values[order] + np.log10(m / rank))[::-1])[::-1]
    adjusted = np.empty(m)
    adjusted[order] = np.minimum(0.0, sorted_adjusted)
    return adjusted


def family(runs: pd.DataFrame, metrics: Sequence[str], axes: Sequence[str]) -> pd.DataFrame:
    """The family: one row per selected run and metric of `metrics` (log10 p's) it logged, with its raw p and
    its Holm and BH adjusted p over the whole family (as log10 and, where a normal double, as p).

    runs: axes, run_id and the metrics; a run without the metric (another probe's) or with NaN is no test.
    # -> *axes, test, run_id, log10_p, p, log10_p_holm, p_holm, log10_p_bh, p_bh
    """
    parts = [runs.loc[runs[name].notna(), [*axes, "run_id"]].assign(test=name, log10_p=runs[name].astype(float))
             for name in metrics if name in runs]
    columns = [*axes, "test", "run_id", "log10_p"]
    tests = pd.concat(parts, ignore_index=True)[columns] if parts else pd.DataFrame(columns=columns)
    tests["p"] = tests["log10_p"].map(p_value)
    for suffix in METHODS:
        tests[f"log10_p_{suffix}"] = adjusted_log10_p(tests["log10_p"], suffix)
        tests[f"p_{suffix}"] = tests[f"log10_p_{suffix}"].map(p_value)
    return tests


def significant(tests: pd.DataFrame, alpha: float) -> dict[str, int]:
    """How many of the family's tests have p <= alpha: raw (`n_significant`) and after each correction.

    tests: `family`'s frame; compared in log10 so a p below the smallest double counts too."""
    bound = math.log10(alpha)
    return {"n_tests": len(tests), "n_significant": int((tests["log10_p"] <= bound).sum()),
            **{f"n_significant_{s}": int((tests[f"log10_p_{s}"] <= bound).sum()) for s in METHODS}}


def counts_sentence(counts: dict[str, int], alpha: float, what: str) -> str:
    """e.g. "9 McNemar tests (mcnemar_log10_p): 7 significant at 0.05 uncorrected, 5 after Holm, 6 after
    Benjamini-Hochberg"."""
    after = ", ".join(f"{counts[f'n_significant_{s}']} after {LABELS[s]}" for s in METHODS)
    return f"{counts['n_tests']} {what}: {counts['n_significant']} significant at {alpha:g} uncorrected, {after}"
