"""Cross-run study tables: paper 000's Tables 2, 9 and 5 with a pooled row, seed summaries, sign tests, curves.

Every function takes a `runs` frame, one row per run: the grid axes (AXES, as tagged on the
run) and the run's metrics by their public names, plus `run_id`. Nothing here reads MLflow.
"""

from __future__ import annotations

import importlib
import math
import pkgutil
import re
from functools import lru_cache
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from fairaudit.analysis import ranges
from fairaudit.analysis.contingency import contingency
from fairaudit.analysis.gap import p_gap
from fairaudit.analysis.multiplicity import combined_log10_p
from fairaudit.analysis.numbers import is_p_value
from fairaudit.analysis.ranges import COUNT
from fairaudit.analysis.stats import p_value, sign_test_log10_p, t_interval

AXES = ("model", "dataset", "probe", "arm", "checkpoint", "seed", "engine")  # engine: the backend and its numerics
ROW_AXES = ("model", "dataset")  # always shown, as in paper 000's tables
POOLED = "Pooled"


def table2_columns(treatment: str, baseline: str) -> list[str]:
    """Table 2: N, cells a-d, McNemar, mean D_disp in cells b and c under baseline and treatment."""
    return ["n_pairs", "cell_a", "cell_b", "cell_c", "cell_d", "mcnemar_log10_p",
            f"d_disp_b_{baseline}", f"d_disp_b_{treatment}", f"d_disp_c_{baseline}", f"d_disp_c_{treatment}"]


def gap_columns(treatment: str, baseline: str) -> list[str]:
    """Beside Table 2's cells: the P(Yes) gap under each arm and its change, which no answer parse can mute."""
    return [f"p_gap_{baseline}", f"p_gap_{treatment}", "delta_p_gap"]


def table9_columns(treatment: str, baseline: str) -> list[str]:
    """Table 9: D_cf and D_group under each arm and their change."""
    return ["n_pairs", f"d_cf_{treatment}", f"d_group_{treatment}", f"d_cf_{baseline}", f"d_group_{baseline}",
            "delta_d_cf", "delta_d_group"]


TABLE5_COLUMNS = ["cell_c", "c_alpha_up", "c_alpha_prime_up", "asym_c", "delta_c"]


def table7_columns(treatment: str) -> list[str]:
    """Table 7 (Appendix D): N, cells a-d, c:b, McNemar, mean D_disp at full treatment depth in cells c and b."""
    return ["n_pairs", "cell_a", "cell_b", "cell_c", "cell_d", "c_b_ratio", "mcnemar_log10_p",
            f"d_disp_c_{treatment}", f"d_disp_b_{treatment}"]


def natural_key(label: object) -> tuple:
    """Sort key that orders step2 before step10 (digits compare as numbers)."""
    parts = re.split(r"(\d+)", str(label))
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in parts if p != "")


def ordered_values(values: Sequence, explicit: Sequence | None = None) -> list:
    """Distinct `values` in `explicit` order (unknown ones after, naturally sorted), else naturally sorted."""
    distinct = list(dict.fromkeys(values))
    rest = sorted((v for v in distinct if explicit is None or v not in explicit), key=natural_key)
    return [v for v in explicit if v in distinct] + rest if explicit is not None else rest


def varying_axes(runs: pd.DataFrame, axes: Sequence[str] = AXES) -> list[str]:
    """The axes that take more than one value across `runs`."""
    return [a for a in axes if a in runs and runs[a].nunique(dropna=False) > 1]


def cell_axes(runs: pd.DataFrame, drop: Sequence[str] = ()) -> list[str]:
    """model, dataset and every other axis that varies across `runs`, less those in `drop`."""
    axes = list(ROW_AXES) + [a for a in varying_axes(runs) if a not in ROW_AXES]
    return [a for a in axes if a not in drop]


def sort_runs(runs: pd.DataFrame, axes: Sequence[str]) -> pd.DataFrame:
    """Runs ordered by axes: model and dataset in order of first appearance, seed and checkpoint naturally."""
    keys = []
    for axis in axes:
        if axis in ("seed", "checkpoint"):
            order = ordered_values(runs[axis])
        else:
            order = list(dict.fromkeys(runs[axis]))
        keys.append(runs[axis].map({v: i for i, v in enumerate(order)}))
    if not keys:
        return runs
    order_frame = pd.concat(keys, axis=1, keys=range(len(keys)))
    return runs.loc[order_frame.sort_values(list(range(len(keys))), kind="stable").index]


def pool_records(records: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Several runs' records as one frame; pair_id becomes f"{run}:{pair_id}" so pairs stay distinct.

    records: run id -> records frame (pair_id, side, arm, answer, p_yes, ...).
    """
    frames = [frame.assign(pair_id=f"{run}:" + frame["pair_id"].astype(str)) for run, frame in records.items()]
    if not frames:
        raise ValueError("no records to pool")
    return pd.concat(frames, ignore_index=True)


def pooled_metrics(records: Mapping[str, pd.DataFrame], treatment: str, baseline: str) -> dict[str, float]:
    """contingency() and the P(Yes) gaps on the pooled records of several runs (the paper's pooled row, not a mean
    of rows)."""
    pooled = pool_records(records)
    gaps = p_gap(pooled, treatment, baseline, n_boot=0)
    return contingency(pooled, treatment, baseline, n_boot=0) | {k: gaps[k] for k in gap_columns(treatment, baseline)}


def study_table(runs: pd.DataFrame, columns: Sequence[str], axes: Sequence[str],
                pooled: Mapping[str, float] | None = None) -> pd.DataFrame:
    """One row per run keyed by `axes`, the metric `columns`, and a last pooled row from `pooled`.

    runs: axes + metric columns (missing metrics show as NaN); the pooled row's first axis
    reads "Pooled (k cells)", its other axes are empty.
    """
    table = sort_runs(runs, axes).reindex(columns=[*axes, *columns]).reset_index(drop=True)
    if pooled is not None:
        row = {a: "" for a in axes}
        if axes:
            row[axes[0]] = f"{POOLED} ({len(runs)} cells)"
        row.update({c: pooled.get(c, math.nan) for c in columns})
        table = pd.concat([table, pd.DataFrame([row])], ignore_index=True)
    return table


def row_runs(runs: pd.DataFrame, axes: Sequence[str], pooled: bool = True) -> list[str | None]:
    """The run each row of `study_table(runs, ..., axes)` shows, None for its pooled row."""
    return [*sort_runs(runs, axes)["run_id"], *([None] if pooled else [])]


def paper_tables(runs: pd.DataFrame, pooled: Mapping[str, float] | None, treatment: str, baseline: str,
                 axes: Sequence[str]) -> dict[str, pd.DataFrame]:
    """Paper 000's Table 2 (cells, McNemar, D_disp; the P(Yes) gaps beside them), Table 9 (D_cf, D_group),
    Table 5 (direction of cell c) and Table 7 (Table 2 in Appendix D's layout)."""
    return {
        "table2": study_table(runs, table2_columns(treatment, baseline) + gap_columns(treatment, baseline), axes,
                              pooled),
        "table9": study_table(runs, table9_columns(treatment, baseline), axes, pooled),
        "table5": study_table(runs, TABLE5_COLUMNS, axes, pooled),
        "table7": study_table(runs, table7_columns(treatment), axes, pooled),
    }


RANGES = {"model_calls": COUNT}  # counted by the store's client, logged by every job


@lru_cache(maxsize=1)
def declared() -> dict[str, ranges.Range]:
    """Every metric range the analysis modules declare: the `RANGES` of each module of `fairaudit.analysis`,
    found by walking the package (a new module's table counts without being listed anywhere)."""
    package = importlib.import_module(__package__)
    modules = [importlib.import_module(f"{__package__}.{info.name}") for info in pkgutil.iter_modules(package.__path__)]
    return ranges.merged(*(module.RANGES for module in modules if hasattr(module, "RANGES")))


def metric_range(name: str) -> tuple[float, float]:
    """The values metric `name` can take, as the module that defines it declares (`analysis.ranges`): counts >= 0,
    rates and shares in [0, 1], their differences in [-1, 1], log10 p-values <= 0...; a metric nothing declares
    (a probe of one's own) is unbounded, so nothing cuts its interval."""
    return ranges.declared_range(name, declared()) or ranges.FREE


def seed_summary(runs: pd.DataFrame, metrics: Sequence[str], axes: Sequence[str], level: float = 0.95) -> pd.DataFrame:
    """Per cell (`axes`, seed excluded) and metric: n seeds with a finite value, how many were infinite and how many
    missing (NaN: undefined or not logged), both left out of the rest; mean, SD (ddof=1) and a t-based `level`
    interval cut to the metric's range (`t_interval`, `metric_range`). A p-value or its log10 is never averaged
    (a mean of p-values is no p-value): its row holds the seeds' combined p instead, as the family combines them
    (`multiplicity.combined_log10_p`, K / ceil(K / 2) x their median), its mean, SD and interval NaN.

    runs: one row per seed run with `axes` and metric columns. Returns columns
    *axes, metric, n, n_infinite, n_missing, mean, sd, ci_low, ci_high, log10_p_combined (long format, one row per
    cell x metric).
    """
    rows = []
    present = [m for m in metrics if m in runs]
    ordered = sort_runs(runs, axes)
    groups = ordered.groupby(list(axes), sort=False, dropna=False) if axes else [((), ordered)]
    for key, group in groups:
        key = key if isinstance(key, tuple) else (key,)
        for metric in present:
            values = group[metric].to_numpy(dtype=float)
            counts = {"n": int(np.isfinite(values).sum()), "n_infinite": int(np.isinf(values).sum()),
                      "n_missing": int(np.isnan(values).sum())}
            if is_p_value(metric):
                with np.errstate(divide="ignore", invalid="ignore"):
                    logs = values if "log10" in metric.split("_") else np.log10(values)
                shown = {"mean": math.nan, "sd": math.nan, "ci_low": math.nan, "ci_high": math.nan,
                         "log10_p_combined": combined_log10_p(logs)}
            else:
                mean, sd, low, high = t_interval(values, level, metric_range(metric))
                shown = {"mean": mean, "sd": sd, "ci_low": low, "ci_high": high, "log10_p_combined": math.nan}
            rows.append({**dict(zip(axes, key)), "metric": metric, **counts, **shown})
    return pd.DataFrame(rows, columns=[*axes, "metric", "n", "n_infinite", "n_missing", "mean", "sd", "ci_low",
                                       "ci_high", "log10_p_combined"])


def sign_comparisons(runs: pd.DataFrame, greater: str, than: str | float) -> pd.DataFrame:
    """Per cell (run): the two compared values and the outcome "+" (as predicted), "-" or "tie".

    runs: `greater` and, unless `than` is a number, `than` metric columns. Cells lacking
    either value are dropped.
    """
    left = runs[greater].astype(float)
    right = pd.Series(float(than), index=runs.index) if is_number(than) else runs[than].astype(float)
    keep = left.notna() & right.notna()
    out = runs.loc[keep].copy()
    out["greater"], out["than"] = left[keep], right[keep]
    out["outcome"] = np.select([left[keep] > right[keep], left[keep] < right[keep]], ["+", "-"], default="tie")
    return out


def sign_test(comparisons: pd.DataFrame, alternative: str = "greater") -> dict[str, float]:
    """Exact sign test over cells: ties dropped, successes = cells in the predicted direction.

    Under no directional preference each non-tied cell goes either way with probability 1/2;
    `alternative="greater"` is one-sided (all n cells one way: p = 2^-n); p is NaN below the smallest double
    (2^-1100), where log10_p still holds it.
    """
    successes = int((comparisons["outcome"] == "+").sum())
    failures = int((comparisons["outcome"] == "-").sum())
    n = successes + failures
    log10_p = sign_test_log10_p(successes, n, alternative) if n else 0.0
    return {"n_cells": len(comparisons), "n_ties": len(comparisons) - n, "n": n, "successes": successes,
            "log10_p": log10_p, "p": p_value(log10_p)}


def sign_counts(comparisons: pd.DataFrame, axes: Sequence[str]) -> pd.DataFrame:
    """Per group of cells (e.g. per checkpoint, over its seeds): successes out of non-tied cells, "5/5"."""
    rows = []
    groups = comparisons.groupby(list(axes), sort=False, dropna=False) if axes else [((), comparisons)]
    for key, group in groups:
        key = key if isinstance(key, tuple) else (key,)
        wins, losses = int((group["outcome"] == "+").sum()), int((group["outcome"] == "-").sum())
        rows.append({**dict(zip(axes, key)), "successes": wins, "n": wins + losses, "ties": len(group) - wins - losses})
    return pd.DataFrame(rows, columns=[*axes, "successes", "n", "ties"])


def checkpoint_curve(runs: pd.DataFrame, metric: str, line_axes: Sequence[str], order: Sequence | None = None,
                     level: float = 0.95) -> pd.DataFrame:
    """`metric` against checkpoint order, one line per cell of `line_axes`, seeds averaged.

    runs: checkpoint, line_axes and `metric` columns. Returns columns *line_axes, checkpoint,
    position (0-based in checkpoint order), n, mean, sd, ci_low, ci_high.
    """
    checkpoints = ordered_values(runs["checkpoint"], order)
    position = {c: i for i, c in enumerate(checkpoints)}
    rows = []
    keys = [*line_axes, "checkpoint"]
    for key, group in runs.groupby(keys, sort=False, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        mean, sd, low, high = t_interval(group[metric].to_numpy(dtype=float), level, metric_range(metric))
        rows.append({**dict(zip(keys, key)), "position": position[key[-1]], "n": int(group[metric].notna().sum()),
                     "mean": mean, "sd": sd, "ci_low": low, "ci_high": high})
    frame = pd.DataFrame(rows, columns=[*keys, "position", "n", "mean", "sd", "ci_low", "ci_high"])
    return frame.sort_values([*line_axes, "position"], kind="stable").reset_index(drop=True)


def is_number(value: object) -> bool:
    """True for a number or a string that parses as one (a sign test against a constant)."""
    if isinstance(value, (int, float)):
        return True
    try:
        float(str(value))
    except ValueError:
        return False
    return True
