"""The report's multiple-comparison section: the study's family of tests (`report.family`), one per hypothesis with
its seed and engine replicates combined into one p, each p beside its Holm and Benjamini-Hochberg adjusted p, and how
many stay significant after each correction."""

from __future__ import annotations

import pandas as pd

from fairaudit.analysis import multiplicity, study
from fairaudit.analysis.numbers import format_p
from fairaudit.views import render
from fairaudit.views.sections import Report, Section

HEADERS = {"test": "test", "n_replicates": "runs", "p": "p", "p_holm": "Holm p", "p_bh": "BH p",
           "p_median": "median p"}


def add_family(report: Report, runs: pd.DataFrame, cfg) -> None:
    """The family section when the selected runs logged any of its tests; else a line in `report.missing`."""
    metrics, alpha = multiplicity.family_settings(cfg)
    if not metrics:
        return
    axes = study.cell_axes(runs)
    tests = multiplicity.family(study.sort_runs(runs, axes), metrics, axes)
    if tests.empty:
        report.missing.append(f"multiple comparisons: no selected run logged {'/'.join(metrics)} "
                              "(report.family.metrics names the family's tests)")
        return
    counts = multiplicity.significant(tests, alpha)
    what = f"tests in the family ({', '.join(metrics)}: {multiplicity.family_phrase(runs, tests)})"
    note = (f"{multiplicity.counts_sentence(counts, alpha, what)}. Holm controls the family-wise error rate, "
            "Benjamini-Hochberg the false discovery rate; adjusted p by their step-down and step-up formulas in log10 "
            "space (exact below the smallest double, where statsmodels' multipletests would see 0). runs: the "
            "hypothesis' runs, median p and range their own p-values. report.family.metrics chooses the tests, "
            "report.family.alpha the level.")
    report.sections.append(Section("family", f"Multiple comparisons: {counts['n_tests']} tests, Holm and "
                                   "Benjamini-Hochberg", tests, shown_family(tests), note))
    report.metrics.update({f"family_{name}": value for name, value in counts.items()})


def shown_family(tests: pd.DataFrame) -> pd.DataFrame:
    """The family as report.md shows it: each p by `format_p`, the replicates' range as "low to high"."""
    columns = [c for c in tests.columns if c not in ("log10_p_min", "log10_p_max", "run_ids")]
    shown = render.display(tests[columns], HEADERS)
    shown["range"] = [format_p(low) if low == high else f"{format_p(low)} to {format_p(high)}"
                      for low, high in zip(tests["log10_p_min"], tests["log10_p_max"])]
    return shown
