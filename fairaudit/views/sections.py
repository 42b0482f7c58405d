"""The report's parts: a Section per table, and the Report they make (no MLflow, no rendering)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import pandas as pd

RecordsLoader = Callable[..., Mapping[str, pd.DataFrame]]  # (run ids, frame name="records") -> {run id: frame}


@dataclass
class Section:
    """One table of the report: numeric (CSV) and as shown (Markdown, terminal)."""

    name: str                 # file stem of its CSV
    title: str
    table: pd.DataFrame
    shown: pd.DataFrame | None = None   # None: CSV only
    note: str = ""
    pooled_last: bool = False
    main: bool = False        # a headline table: the first one a report has is printed in the terminal
    row_runs: list[str | None] | None = None  # the run each row of `table` shows (None: a pooled row); the report
    #                                           marks each such row with its run's warnings


@dataclass
class Report:
    sections: list[Section] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    main: str | None = None   # name of the main section (the report run's description)
    headlines: list[str] = field(default_factory=list)  # names of the sections printed in the terminal
    missing: list[str] = field(default_factory=list)  # one line per table the selection cannot fill: why, how to select
    parent_metrics: dict[str, float] = field(default_factory=dict)  # also logged on the selection's parent (sweep) run
    warnings: list[str] = field(default_factory=list)  # the source runs' warnings, each once with the runs it holds for
    na: list[str] = field(default_factory=list)  # why the source runs' n/a metrics are undefined, a line per reason

    def section(self, name: str) -> Section:
        return next(s for s in self.sections if s.name == name)
