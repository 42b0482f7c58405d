"""`fairaudit report`'s engine section: each headline metric per engine, its spread, and the answers that change.

Built when the selected runs differ in their `engine` tag (the `+experiment=engines` study, or any selection
mixing engines). Runs are grouped by the other axes (model, dataset and whatever else varies); a group that two
or more engines ran gives, for each of its runs' headline metrics, each engine's value with its logged interval,
the spread with a paired bootstrap interval over pairs (from the records, through the probe's `point_metrics`),
and whether the engines' conclusions differ (`analysis.engines`); then, per record, the answers and pair cells
that differ from the reference engine's by its confidence, and a figure. The spreads go to the report's metrics
and onto the study's parent run (`engine_spread/<cell>/<metric>`, with `_ci_low`, `_ci_high`, and
`engine_differs/<cell>/<metric>`).
"""

from __future__ import annotations

import json
import math

import pandas as pd

from fairaudit.analysis import engines, study
from fairaudit.analysis.engine_figures import engine_figure
from fairaudit.analysis.numbers import format_number as num
from fairaudit.catalog.registry import names, probe_classes
from fairaudit.probes import Probe
from fairaudit.views.sections import RecordsLoader, Report, Section

AXIS = "engine"
FIGURE_METRICS = 4  # metric panels in a group's figure: those with intervals first


def engine_groups(runs: pd.DataFrame) -> list[tuple[dict, pd.DataFrame]]:
    """(cell, runs) for each cell of the other axes that two or more engines ran; one run per engine (the latest)."""
    axes = study.cell_axes(runs, drop=(AXIS,))
    groups = []
    for key, group in runs.groupby(axes, sort=False, dropna=False) if axes else [((), runs)]:
        group = group.drop_duplicates(AXIS, keep="last")
        if group[AXIS].nunique() >= 2:
            groups.append((dict(zip(axes, key if isinstance(key, tuple) else (key,))), group.reset_index(drop=True)))
    return groups


def headline(group: pd.DataFrame) -> list[str]:
    """The group's headline metric names (the first run's `fairaudit.headline` tag), those logged by every run."""
    tags = [t for t in group.get("headline", pd.Series(dtype=object)).dropna()]
    listed = json.loads(tags[0]) if tags else []
    return [m for m in listed if m in group and group[m].notna().all()]


def point_metrics_of(probe: str):
    """The probe's `point_metrics`, None where it recomputes nothing from records (the default) or is not shipped."""
    cls = probe_classes().get(probe) if probe in names("probe") else None
    if cls is None or cls.point_metrics.__func__ is Probe.point_metrics.__func__:
        return None
    return cls.point_metrics


def group_label(cell: dict) -> str:
    return "/".join(str(v) for v in cell.values())


def analyse_group(cell: dict, group: pd.DataFrame, load_records: RecordsLoader, settings) -> dict:
    """Values, verdicts, spread intervals and flips of one group (frames), its figure and its metrics."""
    metrics = headline(group)
    values = engines.engine_values(group, metrics, AXIS)
    verdict = engines.disagreements(values)
    loaded = load_records(list(group["run_id"]))
    records = {engine: {"records": loaded[run_id]} for engine, run_id in zip(group[AXIS], group["run_id"])}
    reference = settings.reference if settings.reference in records else group[AXIS].iloc[0]
    point = point_metrics_of(str(cell.get("probe", group["probe"].iloc[0])))
    intervals = (engines.spread_intervals(records, point, metrics, int(settings.n_boot), int(settings.seed),
                                          float(settings.level)) if point else pd.DataFrame(columns=["metric"]))
    verdict = verdict.merge(intervals, on="metric", how="left")
    frames = {engine: r["records"] for engine, r in records.items()}
    readable = all(set(engines.RECORD_KEYS) | {"answer", "p_yes"} <= set(f) for f in frames.values())
    flips = engines.flip_table(frames, reference, list(settings.bins)) if readable else pd.DataFrame()
    sets = engines.within_engine_sets(group, AXIS)
    within = engines.within_engine_spreads(values, sets)
    if readable:
        within = within.merge(within_changes(frames, sets), on=["axis", "shared"], how="left")
    with_ci = [m for m in metrics if values.loc[values["metric"] == m, "ci_low"].notna().any()]
    shown = (with_ci + [m for m in metrics if m not in with_ci])[:FIGURE_METRICS]
    return {"values": values, "verdict": verdict, "flips": flips, "within": within, "reference": reference,
            "bootstrapped": bool(point),
            "figure": engine_figure(values, flips, shown, reference)}


def within_changes(frames: dict[str, pd.DataFrame], sets) -> pd.DataFrame:
    """Per within-engine set: the answers each of its engines changes against the set's first, `changed/n` joined."""
    rows = []
    for axis, shared, members in sets:
        table = engines.flip_table({engine: frames[engine] for engine in members}, members[0])
        every = table[table["confidence"] == "all"]
        rows.append({"axis": axis, "shared": shared, "answers_changed": "; ".join(
            f"{e}: {c}/{n}" for e, c, n in zip(every["engine"], every["answers_changed"], every["n_records"]))})
    return pd.DataFrame(rows, columns=["axis", "shared", "answers_changed"])


def _interval(value: float, low: float, high: float) -> str:
    if math.isnan(low) or math.isnan(high):
        return num(value)
    return f"{num(value)} [{num(low)}, {num(high)}]"


def shown_table(result: dict, cell: dict) -> pd.DataFrame:
    """One row per metric: each engine's value [interval], the spread [interval], what differs."""
    values, verdict = result["values"], result["verdict"].set_index("metric")
    rows = []
    for metric, group in values.groupby("metric", sort=False):
        row = {**{k: str(v) for k, v in cell.items()}, "metric": metric}
        row.update({engine: _interval(v, lo, hi) for engine, v, lo, hi in
                    group[["engine", "value", "ci_low", "ci_high"]].itertuples(index=False)})
        v = verdict.loc[metric]
        row["spread"] = _interval(v["spread"], v.get("spread_ci_low", math.nan), v.get("spread_ci_high", math.nan))
        flags = (("sign", v["sign_differs"]), ("significance", v["significance_differs"]))
        row["differs"] = ", ".join(word for word, flag in flags if flag)
        rows.append(row)
    return pd.DataFrame(rows).fillna("")  # groups whose engines differ (e.g. llamacpp Q4_1, Q4_K_M) share the table


def spread_metrics(label: str, verdict: pd.DataFrame) -> dict[str, float]:
    """`engine_spread/<cell>/<metric>` (and its interval) and `engine_differs/<cell>/<metric>` for MLflow."""
    out = {}
    for row in verdict.to_dict("records"):
        out[f"engine_spread/{label}/{row['metric']}"] = row["spread"]
        for end in ("ci_low", "ci_high"):
            if f"spread_{end}" in row:
                out[f"engine_spread/{label}/{row['metric']}_{end}"] = row[f"spread_{end}"]
        out[f"engine_differs/{label}/{row['metric']}"] = float(row["differs"])
    return out


def within_metrics(label: str, within: pd.DataFrame) -> dict[str, float]:
    """`engine_within/<cell>/<axis>/<shared>/<metric>`: the spread over engines that differ in that axis alone."""
    return {f"engine_within/{label}/{row['axis']}/{row['shared'].replace(' ', '_')}/{row['metric']}": row["spread"]
            for row in within.to_dict("records")}


def add_within_engine(report: Report, results: list[tuple[dict, dict]]) -> None:
    """The section of spreads over engines that differ in one within-engine axis alone (batch size, numerics)."""
    tables = [r["within"].assign(**cell) for cell, r in results if not r["within"].empty]
    if not tables:
        return
    table = pd.concat(tables, ignore_index=True)
    shown = table.assign(spread=[num(v) for v in table["spread"]],
                         differs=[", ".join(w for w, f in (("sign", s), ("significance", g)) if f)
                                  for s, g in zip(table["sign_differs"], table["significance_differs"])])
    shown = shown.drop(columns=["sign_differs", "significance_differs"]).fillna("").astype(str)
    report.sections.append(Section("engines_within", "Engine sensitivity: within one engine", table, shown,
                                   WITHIN_NOTE, main=True))
    for cell, r in results:
        add_metrics(report, within_metrics(group_label(cell), r["within"]))


def add_metrics(report: Report, found: dict[str, float]) -> None:
    """Metrics for the report's run and the study's parent run."""
    report.metrics.update(found)
    report.parent_metrics.update(found)


WITHIN_NOTE = ("Engines that share their backend and every other engine setting and differ in one alone: "
               "`batch_size` (model.batch_size; a batch-invariant engine computes alike at any) or `numerics` (dtype, "
               "quantisation, kernels). Spread: max − min of each headline metric over them; `differs` as above; "
               "answers changed against the first of them, over all records.")


def add_engine_sensitivity(report: Report, runs: pd.DataFrame, load_records: RecordsLoader, cfg) -> None:
    """The engine sections, figures and metrics of every group two or more engines ran (see the module)."""
    results = [(cell, analyse_group(cell, group, load_records, cfg.engines)) for cell, group in engine_groups(runs)]
    if not results:
        return
    shown = pd.concat([shown_table(r, cell) for cell, r in results], ignore_index=True)
    long = pd.concat([r["values"].merge(r["verdict"], on="metric").assign(**cell) for cell, r in results],
                     ignore_index=True)
    note = (f"Each engine's value of every headline metric with its run's 95% interval where it logged one; the spread "
            f"(max − min over engines) with a {float(cfg.engines.level):.0%} paired bootstrap interval over pairs "
            f"({int(cfg.engines.n_boot)} resamples, the same pairs for every engine); `differs`: the engines "
            "disagree in "
            "sign or in significance at 0.05 (log10 p below log10 0.05, or an interval excluding 0). "
            "Figures: " + ", ".join(f"figures/engines_{i}.png" for i in range(len(results))) + ".")
    if not all(r["bootstrapped"] for _, r in results):
        note += " Spreads without an interval: the probe recomputes no metrics from its records (point_metrics)."
    title = "Engine sensitivity: headline metrics per engine"
    report.sections.append(Section("engines", title, long, shown, note, main=True))
    flips = [r["flips"].assign(reference=r["reference"], **cell) for cell, r in results if not r["flips"].empty]
    if flips:
        table = pd.concat(flips, ignore_index=True)
        report.sections.append(Section("engine_flips", "Engine sensitivity: records that change against the reference",
                                       table, flip_display(table), FLIP_NOTE))
    add_within_engine(report, results)
    for i, (cell, r) in enumerate(results):
        report.figures[f"engines_{i}"] = r["figure"]
        add_metrics(report, spread_metrics(group_label(cell), r["verdict"]))


FLIP_NOTE = ("Per engine against the reference (the first engine run, or engines.reference): records whose answer "
             "differs (an unparsed answer counts as its own), and pairs whose contingency cell (a-d, or dropped) "
             "differs, "
             "by the reference's confidence |P(Yes) − 0.5| (a pair: its least confident record). Changes that cancel "
             "in an aggregate show here.")


def flip_display(table: pd.DataFrame) -> pd.DataFrame:
    """Counts as `changed / n (share)`."""
    shown = table.drop(columns=[c for c in table if c.endswith("_share") or c.startswith(("n_", "answers_", "cells_"))])
    shown["answers changed"] = [f"{c}/{n} ({num(s)})" for c, n, s in
                                zip(table["answers_changed"], table["n_records"], table["answer_change_share"])]
    if "cells_changed" in table:
        shown["pair cells changed"] = [f"{int(c)}/{int(n)} ({num(s)})" if n == n else "" for c, n, s in
                                       zip(table["cells_changed"], table["n_pairs"], table["cell_change_share"])]
    return shown.astype(str)
