"""The probe contract: one file per audit, which asks the model (through the client) for what it needs, hands
records to `analysis/` and returns words and numbers; it never computes a store key, logs to MLflow or prints.

A probe is the class named by `_target_` in `conf/probe/<name>.yaml`; that file also lists, under
`report:`, the functions that build the probe's sections of `fairaudit report`. A probe declares
what it `needs` (data set family, backend capabilities: the app checks both before anything
loads), the arms it asks under, the prompts it sends (`fairaudit dry_run=true` prints them), how
its records are shown per sample (`samples`: a records frame and a `Layout` the probe's
own module defines, `fairaudit.views.pages`), what a run found in words (`verdict`, printed before the metrics table and
kept as the run's description), and it validates its own settings in its constructor.
`prompts`, `run` and `verdict` are abstract and `needs` / `samples` are checked when a class is
defined (`fairaudit.errors.contracts`, as for backends), so a probe that lacks one fails with one `error:` line
before anything loads.
docs/adding.md walks through adding one.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping

import pandas as pd

from fairaudit.errors.contracts import Contract, Terms
from fairaudit.prompts.yesno import Arm, Thinking

if TYPE_CHECKING:
    from fairaudit.views.pages import Layout


@dataclass(frozen=True)
class ModelSpec:
    """What a probe needs to know about how the model is asked and answers."""

    name: str
    thinking: Thinking
    template_kwargs: dict
    answer_prefix: str = ""
    answer_source: str = "parsed"  # parsed | forced
    p_yes: str = "single"  # single: the one Yes / No token (paper 000 §3.3) | pooled: six spellings each


@dataclass(frozen=True)
class Needs:
    """What a probe needs: data sets of one family (or of one kind within it), arms of the families it asks them
    under (its data family alone unless it names others), and backend capabilities (`backends.NEEDABLE`)."""

    family: str                          # decision (counterfactual pairs, Yes/No) | mcq (multiple choice)
    capabilities: tuple[str, ...] = ()
    arm_families: tuple[str, ...] = ()   # the arm families it renders its items under; () = (family,)
    data: type | None = None             # the data set class whose items it reads (or a subclass); None: any

    def takes_arm(self, family: str) -> bool:
        """Whether the probe asks its items under an arm of `family`."""
        return family in (self.arm_families or (self.family,))


@dataclass(frozen=True)
class Prompt:
    """One prompt a probe sends: what it is about (a pair's side, a question's permutation), under what
    (an arm, a visibility graph), and its exact text, special tokens and pre-fill included."""

    heading: str
    label: str
    text: str


@dataclass(frozen=True)
class SampleView:
    """How `samples.html` shows a run: the records frame it reads and its layout (defined beside the probe)."""

    frame: str
    layout: Layout


@dataclass
class AuditContext:
    """Everything a probe runs against. client: the model behind the store (`fairaudit.store.client.CachingClient`),
    None in a dry run, where only prompts are rendered; tokenizer: the model's, which renders every prompt."""

    client: Any
    tokenizer: Any
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


@dataclass(frozen=True)
class PlannedTest:
    """One primary test (or interval) of a probe as `fairaudit plan` sizes it before a run: its power at (units,
    level), or for an interval its expected width at units and the width wanted. `share`: the share of the job's
    units it is computed over (e.g. the pairs of one cell)."""

    name: str                                         # e.g. "McNemar, cell b vs cell c"
    metric: str                                       # what a run logs for it; a log10 p joins the report's family
    effect: str                                       # what it is sized at, in words, with where each value came from
    method: str                                       # exact | approximate (how) | ...
    power: Callable[[int, float], float] | None = None  # (units, level) -> power; None: an interval
    width: Callable[[int], float] | None = None       # units -> expected interval width
    target_width: float | None = None
    share: float = 1.0


class Probe(metaclass=Contract):
    """Base of every probe: declare `needs` and `samples`, implement `prompts`, `run` and `verdict`."""

    terms = Terms("probe", {"needs": Needs, "samples": SampleView}, (),
                  "a probe declares `needs` (a Needs) and `samples` (a SampleView) and implements prompts(ctx), "
                  "run(ctx) and verdict(result) (docs/adding.md)")

    needs: ClassVar[Needs]
    samples: ClassVar[SampleView]

    def arms(self, arm: Arm) -> list[Arm]:
        """Every arm the probe asks the model under, given the grid's arm; checked before any model loads."""
        return [arm]

    @abstractmethod
    def prompts(self, ctx: AuditContext) -> list[Prompt]:
        """The prompts `run` sends first, in order, rendered with ctx.tokenizer (no model call)."""

    @abstractmethod
    def run(self, ctx: AuditContext) -> ProbeResult:
        """Ask the model through ctx.client, hand the records to `analysis/`, return what tracking logs."""

    @classmethod
    def point_metrics(cls, records: dict[str, pd.DataFrame]) -> dict[str, float]:
        """The run's headline metrics recomputed from its record frames, without intervals: what the engine
        study (`analysis.engines`) recomputes on resampled pairs. Default: none (the spreads then have no interval)."""
        return {}

    def planned_tests(self, arm: Arm, effect: Mapping[str, float],
                      pilot: ProbeResult | None = None) -> list[PlannedTest]:
        """Its primary tests under the grid's `arm` as `fairaudit plan` sizes them: at the effects `plan.effect.*`
        names, with what a pilot run of it measured (`pilot`, else None) in place of assumed rates. Default: none
        (the plan says the probe declares no test)."""
        return []

    @abstractmethod
    def verdict(self, result: ProbeResult) -> list[str]:
        """What `result` (this probe's own `run`'s) found, in words a newcomer can act on: one or more
        sentences (what was compared, on how many units, what came out, with its interval), then one
        line per degenerate result, each starting with WARNING (e.g. every answer identical)."""
