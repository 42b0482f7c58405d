"""Float noise is not a value: numbers within ZERO_TOL of 0 are 0 before they are logged or printed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pandas is imported where a frame is snapped: the hf backend needs torch and transformers alone
    import pandas as pd

ZERO_TOL = 1e-12  # a slope of -5.3e-18 is 0 (the rounding of a sum of terms that cancel)


def snap(value: Any) -> Any:
    """`value` with a float within ZERO_TOL of 0 made 0.0; anything else (ints, nan, strings) as it is."""
    if isinstance(value, float) and value != 0.0 and abs(value) < ZERO_TOL:
        return 0.0
    return value


def snap_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """Every metric snapped."""
    return {name: snap(value) for name, value in metrics.items()}


def snap_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of `frame` with its float columns snapped (other columns untouched)."""
    import pandas as pd

    out = frame.copy()
    for column in out.columns[[pd.api.types.is_float_dtype(t) for t in out.dtypes]]:
        values = out[column]
        out[column] = values.mask(values.abs() < ZERO_TOL, 0.0)
    return out
