"""The bbq probe's sections of `fairaudit report`: the per-category scores, the arm comparison and the depth figure,
recomputed from each run's records (`analysis.bbq`)."""

from __future__ import annotations

import pandas as pd

from fairaudit.analysis.bbq import bbq, depth_table
from fairaudit.analysis.bbq_figures import depth_figure
from fairaudit.errors.rules import check_fields, integer
from fairaudit.views.render import count, section
from fairaudit.views.sections import RecordsLoader, Report
from fairaudit.views.selection import Settings, shared

SETTINGS = {"digits": integer(0, 12)}
ARM_COLUMNS = ("bbq_delta_s_dis", "bbq_delta_s_amb", "bbq_n_paired", "bbq_flips_b", "bbq_flips_c", "bbq_mcnemar_p")


def run_tables(runs: pd.DataFrame, load_records: RecordsLoader) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """(per-category rows, one arm-comparison row, depth tables) of every run, each row with its model and data set."""
    records = load_records(list(runs["run_id"]))
    depths = load_records(list(runs["run_id"]), "depth_records")
    categories, arms, depth = [], [], {}
    for run in runs.itertuples(index=False):
        frame, reads = records[run.run_id], depths.get(run.run_id, pd.DataFrame())
        treatment, baseline = list(dict.fromkeys(frame["arm"]))
        found = bbq(frame, reads if len(reads) else pd.DataFrame(), treatment, baseline)
        tags = {"model": run.model, "dataset": run.dataset}
        categories.append(found["tables"]["bbq_categories"].assign(**tags))
        arms.append({**tags, "treatment": treatment, "baseline": baseline,
                     **{name: found["metrics"][name] for name in ARM_COLUMNS}})
        if len(reads):
            depth[f"{run.model}_{run.dataset}"] = depth_table(reads)
    return pd.concat(categories, ignore_index=True), pd.DataFrame(arms), depth


def bbq_sections(report: Report, runs: pd.DataFrame, load_records: RecordsLoader, settings: Settings) -> None:
    """Per-category s_DIS, s_AMB and accuracy with intervals; the arms compared; the depth figure of each run."""
    for probe, own in settings.items():
        check_fields(f"probes.{probe}", own, SETTINGS)
    if runs.empty:
        return
    digits = shared(settings, ("digits",))["digits"]
    decimals = f"{{:.{digits}f}}".format
    categories, arms, depth = run_tables(runs, load_records)
    columns = ["model", "dataset", "arm", "category", "s_dis", "s_dis_ci_low", "s_dis_ci_high", "s_dis_ci_n",
               "s_amb", "s_amb_ci_low", "s_amb_ci_high", "s_amb_ci_n", "accuracy_ambig", "accuracy_disambig"]
    shown = {c: decimals for c in columns[4:] if not c.endswith("_n")} | {"s_dis_ci_n": count, "s_amb_ci_n": count}
    report.sections.append(section(
        "bbq_categories", "BBQ: bias scores per category", categories[columns], {}, formats=shown,
        note="s_DIS over disambiguated items, s_AMB = (1 - accuracy) s over ambiguous ones (Parrish et al. 2022 §5); "
             "95% intervals clustered by template, n = templates."))
    report.sections.append(section(
        "bbq_arms", "BBQ: the arms compared on the same items", arms, {},
        formats={c: decimals for c in ARM_COLUMNS} | {c: count for c in ("bbq_n_paired", "bbq_flips_b", "bbq_flips_c")},
        note="delta = treatment - baseline; b, c: items biased under the baseline only, the treatment only "
             "(original option order); exact McNemar p."))
    report.figures |= {f"bbq_depth_{key}": depth_figure(table) for key, table in depth.items()}
