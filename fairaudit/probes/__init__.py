"""Probes: one file per audit. A probe asks the backend for what it needs and hands records to analysis."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from fairaudit.prompts.yesno import Arm, Thinking


@dataclass(frozen=True)
class ModelSpec:
    """What a probe needs to know about how the model is asked and answers."""

    name: str
    thinking: Thinking
    template_kwargs: dict
    answer_prefix: str = ""
    answer_source: str = "parsed"  # parsed | forced
    p_yes: str = "single"  # single: the one Yes / No token (paper 000 §3.3) | pooled: six spellings each


@dataclass
class AuditContext:
    """Everything a probe runs against: the (store-wrapped) backend, model, data and the grid's arm."""

    backend: Any  # fairaudit.store.CachedBackend
    model: ModelSpec
    dataset: Any
    arm: Arm


@dataclass
class ProbeResult:
    """What a probe hands to tracking: flat metrics, tables, figures and record frames."""

    metrics: dict[str, float]
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)
    records: dict[str, pd.DataFrame] = field(default_factory=dict)
    headline: list[str] = field(default_factory=list)
