"""The report's multiple-comparison section: the study's family of tests (`report.family`), each raw p beside its
Holm and Benjamini-Hochberg adjusted p, and how many stay significant after each correction."""

from __future__ import annotations

import pandas as pd

from fairaudit.analysis import multiplicity, study
from fairaudit.views import render
from fairaudit.views.sections import Report, Section

HEADERS = {"test": "test", "p": "p", "p_holm": "Holm p", "p_bh": "BH p"}


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
    sentence = multiplicity.counts_sentence(counts, alpha, f"tests in the family ({', '.join(metrics)}, one per run)")
    note = (f"{sentence}. Holm controls the family-wise error rate, Benjamini-Hochberg the false discovery rate; "
            "adjusted p from statsmodels' multipletests, in log10 space by the same formulas where a p is below the "
            "smallest double (multipletests would see 0). report.family.metrics chooses the tests, "
            "report.family.alpha the level.")
    shown = render.display(tests.drop(columns=["run_id"]), HEADERS)
    report.sections.append(Section("family", f"Multiple comparisons: {counts['n_tests']} tests, Holm and "
                                   "Benjamini-Hochberg", tests, shown, note))
    report.metrics.update({f"family_{name}": value for name, value in counts.items()})
