"""0/1 columns read alike whatever their dtype: bool, integer, float, or pandas' nullable Int64 and boolean."""

from __future__ import annotations

import numpy as np
import pandas as pd


def as_flags(values, name: str, missing: bool | None = None) -> pd.Series:
    """`values` as a bool Series (index kept): True/False, 1/0 and 1.0/0.0 in any of numpy's or pandas' dtypes.

    missing: what a missing value (NA, NaN, None) means; None refuses it. Anything else (other numbers,
    strings) is refused with one line naming the column, since `astype(bool)` would read "False" and 2 as True
    and a reindex on [True, False] finds no 0/1 labels (a chi-square of NaN, silently).
    """
    series = values if isinstance(values, pd.Series) else pd.Series(values)
    absent = series.isna()
    if absent.any() and missing is None:
        raise ValueError(f"{name}: {int(absent.sum())} of {len(series)} values are missing; "
                         "expected True/False or 1/0 in every row")
    flags = pd.Series(bool(missing), index=series.index)
    flags[~absent] = _present_flags(series[~absent], name)
    return flags.astype(bool)


def _present_flags(series: pd.Series, name: str) -> pd.Series:
    """`as_flags` of values none of which is missing."""
    if pd.api.types.is_bool_dtype(series.dtype):
        return series.astype(bool)
    numeric = pd.to_numeric(series, errors="coerce") if series.dtype == object else series
    if not pd.api.types.is_numeric_dtype(numeric.dtype) or numeric.isna().any():
        raise ValueError(f"{name}: expected True/False or 1/0, got dtype {series.dtype} (e.g. {series.iloc[0]!r})")
    as_float = numeric.astype(float)
    odd = ~np.isin(as_float.to_numpy(), (0.0, 1.0))
    if odd.any():
        raise ValueError(f"{name}: expected True/False or 1/0, got {as_float[odd].iloc[0]:g} "
                         f"({int(odd.sum())} of {len(series)} values are neither)")
    return as_float.eq(1.0)
