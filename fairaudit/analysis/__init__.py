"""Pure analysis: records DataFrames in, metrics, tables and figures out; exact statistics (`stats`) and numbers as
they are and as they read (`numbers`). It never does I/O, asks a model or names a probe's run."""

from fairaudit.analysis.cdpg import cdpg
from fairaudit.analysis.contingency import contingency
from fairaudit.analysis.position import pbs_wilcoxon, position
from fairaudit.analysis.transitions import transitions

__all__ = ["cdpg", "contingency", "pbs_wilcoxon", "position", "transitions"]
