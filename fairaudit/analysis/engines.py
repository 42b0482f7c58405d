"""Engine sensitivity: how far the engine alone (its kernels, dtype, quantisation) moves an audit's numbers.

The same audit on the same pairs under each engine (`+experiment=engines`). Per headline metric: each
engine's value with the interval its run logged, the spread (max - min over the engines) with a paired
bootstrap interval over pairs (every engine's records resampled with the same pairs), and whether the
engines' conclusions differ: in sign (one engine's value above zero, another's below) or in significance
at 0.05 (a `*_log10_p` metric below log10 0.05 for some engines only; an interval excluding zero for some
only). Per record: the share of answers, and of pairs' contingency cells (a-d), that differ from the
reference engine's, split by the reference engine's confidence |P(Yes) - 0.5|, so that changes which cancel
in an aggregate are seen (Hua, Lotfi, Chen 2026, arXiv 2602.06181: up to 21% of responses flipped under
quantisation with the aggregate bias score unchanged, uncertain responses 3-11x more often).
No MLflow and no probe here: records come in as frames, a probe's metrics as a function of its records.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from fairaudit.analysis.contingency import cell_labels
from fairaudit.analysis.pairs import complete_pairs

ALPHA_LEVEL = 0.05
CONFIDENCE_BINS = (0.0, 0.1, 0.25, 0.5)  # |P(Yes) - 0.5| of the reference engine: [0, 0.1), [0.1, 0.25), [0.25, 0.5]
RECORD_KEYS = ("pair_id", "side", "arm")  # what names one record across engines
Records = Mapping[str, pd.DataFrame]  # one run's record frames by name ("records", "depth_records", ...)


def engine_values(runs: pd.DataFrame, metrics: Sequence[str], engine: str = "engine") -> pd.DataFrame:
    """One row per (metric, engine) in run order: value, ci_low, ci_high (the run's `<metric>_ci_low/_ci_high`,
    NaN where it logged none). runs: one row per engine (its metrics as columns)."""
    rows = []
    for metric in metrics:
        for _, run in runs.iterrows():
            rows.append({"metric": metric, "engine": run[engine], "value": run.get(metric, math.nan),
                         "ci_low": run.get(f"{metric}_ci_low", math.nan),
                         "ci_high": run.get(f"{metric}_ci_high", math.nan)})
    return pd.DataFrame(rows, columns=["metric", "engine", "value", "ci_low", "ci_high"]).astype(
        {"value": float, "ci_low": float, "ci_high": float})


def significant(metric: str, value: float, low: float, high: float) -> float:
    """1.0 when `value` is significant at 0.05, 0.0 when not, NaN when the metric says nothing of it: a log10
    p-value (name ending `log10_p`) below log10 0.05; else an interval that excludes zero."""
    if metric.endswith("log10_p"):
        return math.nan if math.isnan(value) else float(value < math.log10(ALPHA_LEVEL))
    if math.isnan(low) or math.isnan(high):
        return math.nan
    return float(low > 0 or high < 0)


def disagreements(values: pd.DataFrame) -> pd.DataFrame:
    """Per metric (of `engine_values`): spread (max - min over engines), sign_differs (a value above zero and
    another below), significance_differs (significant for some engines, not for others), differs (either)."""
    rows = []
    for metric, group in values.groupby("metric", sort=False):
        finite = group["value"].dropna()
        signs = set(np.sign(finite[finite != 0]))
        verdicts = {significant(metric, *row) for row in group[["value", "ci_low", "ci_high"]].itertuples(index=False)}
        verdicts = {v for v in verdicts if not math.isnan(v)}
        rows.append({"metric": metric, "spread": float(finite.max() - finite.min()) if len(finite) else math.nan,
                     "sign_differs": len(signs) > 1, "significance_differs": len(verdicts) > 1})
    frame = pd.DataFrame(rows, columns=["metric", "spread", "sign_differs", "significance_differs"])
    frame["differs"] = frame["sign_differs"] | frame["significance_differs"]
    return frame


ENGINE_PARAMS = ("engine.backend", "engine.numerics", "engine.batch_size")  # what a run's engine computed with
WITHIN_AXES = {"batch_size": "engine.batch_size", "numerics": "engine.numerics"}  # within one backend, varied alone


def _shared_label(shared: Mapping[str, str]) -> str:
    """What the engines of a within-engine set share, e.g. `hf float32` or `hf batch 8`."""
    words = [shared.get("engine.backend", ""), shared.get("engine.numerics", "")]
    if "engine.batch_size" in shared:
        words.append(f"batch {shared['engine.batch_size']}")
    return " ".join(w for w in words if w)


def within_engine_sets(runs: pd.DataFrame, engine: str = "engine") -> list[tuple[str, str, list[str]]]:
    """(axis, shared, engines) for each within-engine axis (`WITHIN_AXES`): the engines (runs' `engine` values) that
    share every other `engine.*` param and differ in this one alone, e.g. ("batch_size", "hf float32", ["hf float32
    batch 8", "hf float32 batch 1"]). Runs without the params (logged before they were) take part in none."""
    if not set(ENGINE_PARAMS) <= set(runs):
        return []
    known = runs.dropna(subset=list(ENGINE_PARAMS))
    sets = []
    for axis, param in WITHIN_AXES.items():
        others = [p for p in ENGINE_PARAMS if p != param]
        for key, part in known.groupby(others, sort=False):
            if part[param].nunique() >= 2:
                sets.append((axis, _shared_label(dict(zip(others, key))), list(part[engine])))
    return sets


def within_engine_spreads(values: pd.DataFrame, sets: Sequence[tuple[str, str, list[str]]]) -> pd.DataFrame:
    """Per within-engine set and metric: `disagreements` over that set's engines alone (how far batching or the
    kernels alone move the metric). values: `engine_values` of every engine."""
    frames = [disagreements(values[values["engine"].isin(members)]).assign(axis=axis, shared=shared,
                                                                           engines=", ".join(members))
              for axis, shared, members in sets]
    columns = ["axis", "shared", "engines", "metric", "spread", "sign_differs", "significance_differs", "differs"]
    return pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(columns=columns)


def common_units(records: Mapping[str, Records], unit: str = "pair_id") -> np.ndarray:
    """The units (pairs) every engine's `records` frame holds, sorted."""
    sets = [set(frames["records"][unit]) for frames in records.values()]
    return np.array(sorted(set.intersection(*sets))) if sets else np.array([])


def _rows_by_unit(frames: Records, unit: str) -> dict[str, dict]:
    return {name: frame.groupby(unit).indices for name, frame in frames.items() if unit in frame}


def resampled(frames: Records, rows_of: dict[str, dict], drawn: np.ndarray,
              unit: str = "pair_id") -> dict[str, pd.DataFrame]:
    """Each frame holding `unit` with the rows of the drawn units, in draw order, each draw relabelled as its own unit
    (a pair drawn twice counts twice); frames without the unit column as they are."""
    out = dict(frames)
    for name, rows in rows_of.items():
        pieces = [rows.get(u, np.array([], dtype=int)) for u in drawn]
        index = np.concatenate(pieces) if pieces else np.array([], dtype=int)
        labels = np.repeat(np.arange(len(drawn)), [len(p) for p in pieces])
        out[name] = frames[name].iloc[index].assign(**{unit: labels}).reset_index(drop=True)
    return out


def spread_intervals(records: Mapping[str, Records], point_metrics: Callable[[Records], Mapping[str, float]],
                     metrics: Sequence[str], n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> pd.DataFrame:
    """Per metric: the paired bootstrap percentile interval of the spread (max - min over engines) over pairs.

    records: engine -> its run's record frames. Every resample draws pairs (from those every engine holds) with
    replacement, the same draw for every engine, and recomputes each engine's metrics with `point_metrics`.
    Resamples where a metric is NaN for an engine are dropped for that metric. Columns: metric, spread_ci_low,
    spread_ci_high, n_units, n_boot_used.
    """
    units = common_units(records)
    rows_of = {engine: _rows_by_unit(frames, "pair_id") for engine, frames in records.items()}
    rng = np.random.default_rng(seed)
    spreads = {metric: [] for metric in metrics}
    for _ in range(n_boot if len(units) else 0):
        drawn = units[rng.integers(0, len(units), size=len(units))]
        found = [point_metrics(resampled(frames, rows_of[engine], drawn)) for engine, frames in records.items()]
        for metric in metrics:
            values = np.array([m.get(metric, math.nan) for m in found], dtype=float)
            if np.isfinite(values).all():
                spreads[metric].append(values.max() - values.min())
    tail = (1 - level) / 2
    rows = []
    for metric, values in spreads.items():
        low, high = np.quantile(values, [tail, 1 - tail]) if values else (math.nan, math.nan)
        rows.append({"metric": metric, "spread_ci_low": float(low), "spread_ci_high": float(high),
                     "n_units": len(units), "n_boot_used": len(values)})
    return pd.DataFrame(rows, columns=["metric", "spread_ci_low", "spread_ci_high", "n_units", "n_boot_used"])


def bin_labels(bins: Sequence[float]) -> list[str]:
    """"[0, 0.1)", ..., the last closed: "[0.25, 0.5]"."""
    edges = [f"{b:g}" for b in bins]
    return [f"[{a}, {b})" for a, b in zip(edges[:-2], edges[1:-1])] + [f"[{edges[-2]}, {edges[-1]}]"]


def confidence_bin(p_yes: pd.Series, bins: Sequence[float]) -> pd.Series:
    """The bin label of |p_yes - 0.5| (NaN P(Yes): no bin)."""
    confidence = (p_yes.astype(float) - 0.5).abs()
    index = np.clip(np.searchsorted(np.asarray(bins[1:-1]), confidence.to_numpy(), side="right"), 0, len(bins) - 2)
    labels = np.array(bin_labels(bins), dtype=object)[index]
    return pd.Series(np.where(confidence.isna(), None, labels), index=p_yes.index)


def answer_changes(reference: pd.DataFrame, other: pd.DataFrame,
                   bins: Sequence[float] = CONFIDENCE_BINS) -> pd.DataFrame:
    """Per confidence bin of the reference's records: n_records (in both), answers_changed (a different answer,
    an unparsed answer counting as one of its own), plus an `all` row."""
    keys = list(RECORD_KEYS)
    both = reference[keys + ["answer", "p_yes"]].merge(other[keys + ["answer"]], on=keys, suffixes=("_ref", ""))
    both["changed"] = both["answer_ref"].fillna("<none>").astype(str) != both["answer"].fillna("<none>").astype(str)
    both["confidence"] = confidence_bin(both["p_yes"], bins)
    return _shares(both, "changed", bins, "n_records", "answers_changed")


def pair_cells(records: pd.DataFrame, treatment: str, baseline: str) -> pd.Series:
    """Each pair's contingency cell (a-d) under these arms; "dropped" for a pair without a parsed answer on every
    side of both arms (indexed by pair_id)."""
    cells = cell_labels(complete_pairs(records, treatment, baseline), treatment, baseline)  # indexed by pair_id
    return cells.reindex(pd.Index(sorted(records["pair_id"].unique()), name="pair_id"), fill_value="dropped")


def cell_changes(reference: pd.DataFrame, other: pd.DataFrame, bins: Sequence[float] = CONFIDENCE_BINS) -> pd.DataFrame:
    """Per confidence bin of the pair (its least confident reference record): n_pairs (in both), cells_changed,
    plus an `all` row. Arms: the records' first (treatment) and last (baseline); one arm: no rows."""
    arms = list(dict.fromkeys(reference["arm"]))
    if len(arms) < 2:
        return pd.DataFrame(columns=["confidence", "n_pairs", "cells_changed"])
    treatment, baseline = arms[0], arms[-1]
    ref_cells, other_cells = pair_cells(reference, treatment, baseline), pair_cells(other, treatment, baseline)
    shared = ref_cells.index.intersection(other_cells.index)
    least = (reference["p_yes"].astype(float) - 0.5).abs().groupby(reference["pair_id"]).min()
    frame = pd.DataFrame({"changed": ref_cells[shared].to_numpy() != other_cells[shared].to_numpy(),
                          "confidence": confidence_bin(least.reindex(shared) + 0.5, bins).to_numpy()})
    return _shares(frame, "changed", bins, "n_pairs", "cells_changed")


def _shares(frame: pd.DataFrame, flag: str, bins: Sequence[float], n_name: str, changed_name: str) -> pd.DataFrame:
    rows = [{"confidence": label, n_name: int((frame["confidence"] == label).sum()),
             changed_name: int(frame.loc[frame["confidence"] == label, flag].sum())} for label in bin_labels(bins)]
    rows.append({"confidence": "all", n_name: len(frame), changed_name: int(frame[flag].sum())})
    return pd.DataFrame(rows)


def flip_table(records: Mapping[str, pd.DataFrame], reference: str,
               bins: Sequence[float] = CONFIDENCE_BINS) -> pd.DataFrame:
    """For every engine but the reference: per confidence bin, answers and pair cells that differ from the
    reference's, with their shares (NaN where a bin is empty). records: engine -> its `records` frame."""
    out = []
    for engine, frame in records.items():
        if engine == reference:
            continue
        answers = answer_changes(records[reference], frame, bins)
        cells = cell_changes(records[reference], frame, bins)
        table = answers.merge(cells, on="confidence", how="left") if not cells.empty else answers
        table.insert(0, "engine", engine)
        out.append(table)
    if not out:
        return pd.DataFrame()
    table = pd.concat(out, ignore_index=True)
    table["answer_change_share"] = table["answers_changed"] / table["n_records"].where(table["n_records"] > 0)
    if "n_pairs" in table:
        table["cell_change_share"] = table["cells_changed"] / table["n_pairs"].where(table["n_pairs"] > 0)
    return table
