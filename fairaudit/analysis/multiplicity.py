"""Multiple comparisons across a study: a family of tests, one per hypothesis (e.g. every McNemar test of a models x
datasets x arms grid, each cell's seeds combined into one), and its Holm and Benjamini-Hochberg adjusted p-values,
from the tests' log10 p.

Pure: a runs frame in (one row per run, metrics by their public names), frames and counts out; no MLflow.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

from fairaudit.analysis.numbers import format_p
from fairaudit.analysis.stats import p_value
from fairaudit.errors import AuditError

METHODS = ("holm", "bh")  # the column suffixes of the adjusted p-values
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
    """log10 of the family's adjusted p-values (`holm`: family-wise error; `bh`: false discovery rate), in order;
    a NaN entry is no test: it stays NaN and is not counted in m.

    Computed in log10 space, exact at any size (McNemar's 10^-485.6 is below the smallest double): Holm, over the p
    sorted ascending, log10 p_(i)^adj = min(0, max_{j <= i} log10((m - j + 1) p_(j))); BH, min(0, min_{j >= i}
    log10(m p_(j) / j)). Both equal statsmodels' `multipletests` wherever it is defined (tests/test_multiplicity.py),
    which is not called: it runs a full garbage collection on every call (tens of ms in a loaded process).
    """
    values = np.asarray(log10_p, dtype=float)
    adjusted, tests = np.full(values.shape, np.nan), ~np.isnan(values)
    values = values[tests]
    if values.size == 0:
        return adjusted
    m, order = len(values), np.argsort(values, kind="stable")
    rank = np.arange(1, m + 1)
    if method == "holm":
        sorted_adjusted = np.maximum.accumulate(values[order] + np.log10(m - rank + 1))
    else:
        sorted_adjusted = np.minimum.accumulate((values[order] + np.log10(m / rank))[::-1])[::-1]
    in_order = np.empty(m)
    in_order[order] = np.minimum(0.0, sorted_adjusted)
    adjusted[tests] = in_order
    return adjusted


def combined_log10_p(log10_p: Sequence[float]) -> float:
    """log10 of one p-value for a hypothesis tested by K replicates (seeds, engines) of the same study: with k =
    ceil(K / 2), K / k times the k-th smallest p (the median; 3/2 x the median of 3 seeds; the p itself for one
    replicate), at most 1. Valid whatever the replicates' dependence: P(p_(k) <= t) = P(#{p_i <= t} >= k) <=
    E#{p_i <= t} / k <= K t / k (Markov). Never a mean of p-values (not a p-value); NaN entries (no test) are
    left out, and NaN for none."""
    values = np.sort(np.asarray(log10_p, dtype=float))
    values = values[~np.isnan(values)]
    if values.size == 0:
        return math.nan
    k = math.ceil(values.size / 2)
    return min(0.0, float(values[k - 1]) + math.log10(values.size / k))


REPLICATES = ("seed", "engine")  # axes whose runs repeat one hypothesis: combined into one test, never counted


def hypothesis_axes(axes: Sequence[str]) -> list[str]:
    """The axes that tell one hypothesis from another: `axes` less the replicate axes (seed, engine)."""
    return [a for a in axes if a not in REPLICATES]


def family(runs: pd.DataFrame, metrics: Sequence[str], axes: Sequence[str]) -> pd.DataFrame:
    """The family: one test per hypothesis (a cell of `axes` but the replicate axes: model x data set x probe x arm
    x checkpoint ...) and metric of `metrics` (log10 p's), its replicates' (seeds', engines') p-values combined
    into one (`combined_log10_p`), with the Holm and BH adjusted p over the whole family (as log10 and, where a
    normal double, as p), the replicates' median and range.

    runs: axes, run_id and the metrics; a run without the metric (another probe's) or with NaN is no test.
    # -> *hypothesis axes, test, n_replicates, log10_p, p, log10_p_holm, p_holm, log10_p_bh, p_bh, log10_p_median,
    #    p_median, log10_p_min, log10_p_max, run_ids
    """
    keys = hypothesis_axes(axes)
    rows = []
    for name in [m for m in metrics if m in runs]:
        tested = runs[runs[name].notna()]
        groups = tested.groupby(keys, sort=False, dropna=False) if keys else [((), tested)]
        for key, group in groups:
            values = group[name].astype(float)
            rows.append({**dict(zip(keys, key if isinstance(key, tuple) else (key,))), "test": name,
                         "n_replicates": len(group), "log10_p": combined_log10_p(values),
                         "log10_p_median": float(values.median()), "log10_p_min": float(values.min()),
                         "log10_p_max": float(values.max()), "run_ids": ",".join(group["run_id"])})
    columns = [*keys, "test", "n_replicates", "log10_p", "log10_p_median", "log10_p_min", "log10_p_max", "run_ids"]
    tests = pd.DataFrame(rows, columns=columns)
    for suffix in METHODS:
        tests[f"log10_p_{suffix}"] = adjusted_log10_p(tests["log10_p"], suffix)
    for column in ("", "_holm", "_bh", "_median"):
        tests[f"p{column}"] = tests[f"log10_p{column}"].map(p_value)
    order = [*keys, "test", "n_replicates", "log10_p", "p", "log10_p_holm", "p_holm", "log10_p_bh", "p_bh",
             "log10_p_median", "p_median", "log10_p_min", "log10_p_max", "run_ids"]
    return tests[order]


def family_phrase(runs: pd.DataFrame, tests: pd.DataFrame) -> str:
    """What the family is, e.g. "one per model x dataset hypothesis; its 3 seed replicates combined into one p (3/2
    x their median p, valid whatever their dependence), never counted as tests"."""
    keys = [c for c in tests.columns if c not in FAMILY_COLUMNS]
    what = f"one per {' x '.join(keys)} hypothesis" if keys else "one per hypothesis"
    varied = [a for a in REPLICATES if a in runs and runs[a].nunique(dropna=False) > 1]
    if not varied:
        return what
    counts = sorted(set(tests["n_replicates"]))
    factors = ", ".join(f"{n}/{math.ceil(n / 2)}" for n in counts if n > 1)
    return (f"{what}; its {'/'.join(map(str, counts))} {' x '.join(varied)} replicates combined into one p "
            f"({factors} x their median p, valid whatever their dependence), never counted as tests")


FAMILY_COLUMNS = ("test", "n_replicates", "log10_p", "p", "log10_p_holm", "p_holm", "log10_p_bh", "p_bh",
                  "log10_p_median", "p_median", "log10_p_min", "log10_p_max", "run_ids")


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


def hypothesis_labels(tests: pd.DataFrame) -> list[str]:
    """Each test named by the hypothesis axes that vary across the family, joined by "/" ("" for a lone test)."""
    keys = [c for c in tests.columns if c not in FAMILY_COLUMNS and tests[c].nunique(dropna=False) > 1]
    return ["/".join(str(row[k]) for k in keys) for _, row in tests.iterrows()]


def family_lines(tests: pd.DataFrame) -> list[str]:
    """One line per test: its hypothesis, p, Holm p and BH p, and its replicates' median p and range, e.g.
    "adult · mcnemar_log10_p: p = 0.015, Holm p = 0.045, BH p = 0.045 (3 runs: median p 0.01, 0.005 to 0.03)"."""
    lines = []
    for label, row in zip(hypothesis_labels(tests), tests.to_dict("records")):
        line = (f"{label + ' · ' if label else ''}{row['test']}: p = {format_p(row['log10_p'])}, "
                f"Holm p = {format_p(row['log10_p_holm'])}, BH p = {format_p(row['log10_p_bh'])}")
        if row["n_replicates"] > 1:
            line += (f" ({row['n_replicates']} runs: median p {format_p(row['log10_p_median'])}, "
                     f"{format_p(row['log10_p_min'])} to {format_p(row['log10_p_max'])})")
        lines.append(line)
    return lines


def family_metrics(tests: pd.DataFrame) -> dict[str, float]:
    """Each test's p, Holm p and BH p as metrics, `family/<metric>[_holm|_bh]/<hypothesis>`, from log10 p (always)
    and as p where a normal double (the log10 metric's p twin: mcnemar_log10_p -> mcnemar_p)."""
    out = {}
    for label, row in zip(hypothesis_labels(tests), tests.to_dict("records")):
        where = f"/{label}" if label else ""
        p_name = p_twin(row["test"])
        for suffix in ("", "_holm", "_bh"):
            out[f"family/{row['test']}{suffix}{where}"] = row[f"log10_p{suffix}"]
            if not math.isnan(row[f"p{suffix}"]):
                out[f"family/{p_name}{suffix}{where}"] = row[f"p{suffix}"]
    return out


def p_twin(log10_name: str) -> str:
    """The p metric beside a log10 p metric: its last `log10_p` written `p` (mcnemar_log10_p_complete ->
    mcnemar_p_complete)."""
    head, _, tail = log10_name.rpartition("log10_p")
    return f"{head}p{tail}"
