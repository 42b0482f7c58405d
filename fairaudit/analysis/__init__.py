"""Pure analysis: records DataFrame in, metrics, tables and figures out. No I/O, no model."""

from fairaudit.analysis.cdpg import cdpg
from fairaudit.analysis.contingency import contingency
from fairaudit.analysis.position import pbs_wilcoxon, position
from fairaudit.analysis.transitions import transitions

__all__ = ["cdpg", "contingency", "pbs_wilcoxon", "position", "transitions"]
