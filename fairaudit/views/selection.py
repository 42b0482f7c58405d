"""What the section builders share to pick and stack their runs and read their settings.

A builder is handed the runs of the probes that list it and those probes' report settings
(`fairaudit.report.build`); these helpers select among those runs by what they logged or by what
their probe's settings say, never by a probe's name.
"""

from __future__ import annotations

from typing import Any, Mapping

import pandas as pd

from fairaudit.errors import AuditError

Settings = Mapping[str, Any]  # probe name -> its report settings (probes.<name>.*)


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


def flagged(settings: Settings, key: str) -> list[str]:
    """The probes whose report setting `key` is true, in name order."""
    return sorted(probe for probe, own in settings.items() if own.get(key) is True)


def declaring(settings: Settings, key: str) -> list[str]:
    """The probes whose report settings hold `key`, in name order."""
    return sorted(probe for probe, own in settings.items() if key in own)


def runs_of(runs: pd.DataFrame, probes: list[str]) -> pd.DataFrame:
    """The runs of the given probes."""
    return runs[runs["probe"].isin(probes)] if "probe" in runs else runs.iloc[0:0]


def with_metric(runs: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The runs that logged `metric`."""
    return runs[runs[metric].notna()] if metric in runs else runs.iloc[0:0]


def first_per_cell(runs: pd.DataFrame, probes: list[str]) -> pd.DataFrame:
    """Runs of the first of `probes` each (model, dataset) has (runs of several paired probes of one cell hold
    the same generations: one of them feeds a table of records)."""
    rows = runs_of(runs, probes).copy()
    rows["rank"] = rows["probe"].map({p: i for i, p in enumerate(probes)})
    first = rows.groupby(["model", "dataset"], sort=False)["rank"].transform("min")
    return rows[rows["rank"] == first]


def comparison(rows: pd.DataFrame) -> tuple[str, str]:
    """The (treatment, baseline) arms every paired run compares; an AuditError when they differ."""
    arms = rows[["arm", "baseline"]].drop_duplicates()
    if len(arms) > 1 or arms["baseline"].isna().any():
        pairs = [f"{a} vs {b}" for a, b in arms.itertuples(index=False)]
        raise AuditError(f"the paired runs compare different arms ({pairs}); pool one comparison at a time, "
                         "e.g. select.tags.arm=think")
    return tuple(arms.iloc[0])


def shared(settings: Settings, keys: tuple[str, ...]) -> dict[str, Any]:
    """The values of `keys` the probes' settings agree on (a builder of several probes reads one value);
    an AuditError naming the probes.<name>.<key> that differ."""
    values = {probe: {key: own.get(key) for key in keys} for probe, own in settings.items()}
    first = next(iter(values.values()), {key: None for key in keys})
    differ = [key for key in keys if any(v[key] != first[key] for v in values.values())]
    if differ:
        found = ", ".join(f"probes.{probe}.{key}={v[key]!r}" for key in differ for probe, v in values.items())
        raise AuditError(f"these probes' report settings build the same tables but differ: {found}; set them alike")
    return first
