"""Probe `influence`: counterfactual-likelihood tests of private reasoning channels (paper 002).

The configured chat model writes role-channel transcripts on MCQ items, block by block, under
a role-visibility graph (`influence_transcripts`): A_private, A_public (the proposer), B_private,
B_public (the verifier), then a next A turn, A's private and public blocks (natural when the model
opens it, else after a fixed bridge, §6.2). Blocks are sampled (`probe.sampling`, seeded per item
and block) or greedy. Each directional contrast scores a fixed target under the natural and a
donor-replaced prefix (Eq. 1-4); the graph-cut control re-scores it with the private-to-public
carrier edges blocked (§6.3) (`influence_contrasts`). Diagnostics (§4): 4-gram overlap and canary
reproduction (`influence_diagnostics`). Metrics come from `analysis.influence`.
"""

from __future__ import annotations

import math
from typing import Mapping

import pandas as pd

from fairaudit.analysis.degenerate import WARNING
from fairaudit.analysis.influence import THRESHOLDS, influence
from fairaudit.analysis.influence_figures import influence_rates_figure
from fairaudit.analysis.numbers import format_number as num
from fairaudit.analysis.stats import FEW
from fairaudit.errors.rules import (
    MAX_CANARY,
    MAX_CONTEXT,
    boolean,
    check_fields,
    integer,
    list_of,
    number,
    one_of,
    template_fields,
    text,
)
from fairaudit.probes import AuditContext, Needs, PlannedTest, Probe, ProbeResult, Prompt, SampleView
from fairaudit.probes.decisions import few_units
from fairaudit.probes.influence_contrasts import ContrastScorer, Donors
from fairaudit.probes.influence_diagnostics import trace_records
from fairaudit.probes.influence_samples import TRANSCRIPTS
from fairaudit.probes.influence_transcripts import DEFAULT_TAGS, GRAPHS, Tags, TranscriptWriter
from fairaudit.probes.planned import measured, rate_interval
from fairaudit.prompts.yesno import Arm

TARGETS = ("content", "with_tags")   # score a target's own tokens, or its delimiters too
LENGTH_MATCH = ("exact", "complete", "off")
HEADLINE = ["validity_rate", "truncated_rate", "n_contrasts_a_to_b", "influence_rate_a_to_b", "substantive_rate_a_to_b",
            "mean_delta_a_to_b", "n_contrasts_b_to_a", "influence_rate_b_to_a", "substantive_rate_b_to_a",
            "mean_delta_b_to_a", "skipped_identical_a_to_b", "skipped_identical_b_to_a", "control_zero_rate",
            "bridge_share", "ngram_raw_rate", "ngram_corrected_rate", "canary_rate"]
TAG = template_fields({"role", "channel"}, set())
SETTINGS = {  # probe.* keys this probe checks (tags' presence and the length_match spelling are checked apart)
    "conditions": list_of(one_of(*GRAPHS)), "system_prompt": text(empty=True), "tags.open": TAG, "tags.close": TAG,
    "max_block_tokens": integer(1, MAX_CONTEXT), "bridge": text(empty=True), "donor_seed": integer(0, 2**32 - 1),
    "thresholds": list_of(number(0, 10)), "ngram": integer(1), "control": boolean, "target": one_of(*TARGETS),
    "sampling.temperature": number(0, 10), "sampling.top_p": number(0, 1, lo_open=True),
    "sampling.seed": integer(0, 2**32 - 1), "canary.enabled": boolean, "canary.length": integer(1, MAX_CANARY),
    "canary.seed": integer(0, 2**32 - 1), "canary.text": template_fields({"canary"}, {"canary"}),
}
DEFAULT_SAMPLING = {"temperature": 0.6, "top_p": 0.95, "seed": 0}
DEFAULT_CANARY = {"enabled": True, "length": 8, "seed": 0, "text": " The secret code is {canary}."}


def rate(metric, name: str) -> str:
    """A rate with its Wilson interval, "0.75 [0.3, 0.95]", from `metric` (a metric name's value, NaN when absent)."""
    return f"{num(metric(name))} [{num(metric(f'{name}_ci_low'))}, {num(metric(f'{name}_ci_high'))}]"


def length_match_mode(value) -> str | None:
    """probe.length_match as a mode: true is `exact`, false is `off`; None for anything else."""
    mode = {True: "exact", False: "off"}.get(value, value) if isinstance(value, bool) else value
    return mode if mode in LENGTH_MATCH else None


class InfluenceProbe(Probe):
    """Counterfactual influence A->B and B->A per visibility graph, with graph-cut controls and diagnostics.

    Its jobs are three objects: `writer` (the transcripts), `scorer` (donors via `donors`, swaps and NLLs)
    and the per-trace diagnostics of `influence_diagnostics`.
    """

    needs = Needs("mcq", ("target_nll", "attention_graphs"))  # transcripts are written and scored under 4D masks
    samples = SampleView("traces", TRANSCRIPTS)

    def __init__(self, conditions=GRAPHS, system_prompt: str = "", tags: dict | None = None,
                 max_block_tokens: int = 24, length_match="exact", bridge: str = "", donor_seed: int = 0,
                 thresholds=THRESHOLDS, ngram: int = 4, control: bool = True, canary: dict | None = None,
                 target: str = "content", sampling: dict | None = None):
        tags = dict(tags or DEFAULT_TAGS)
        values = {"conditions": list(conditions), "system_prompt": system_prompt, "tags": tags,
                  "max_block_tokens": max_block_tokens, "bridge": bridge, "donor_seed": donor_seed,
                  "thresholds": list(thresholds), "ngram": ngram, "control": control, "target": target,
                  "sampling": dict(sampling or {}), "canary": dict(canary or {})}
        missing = [k for k in ("open", "close") if k not in tags]
        check_fields("probe", values, SETTINGS, [
            f"probe.tags needs 'open' and 'close' formats over {{role}} and {{channel}}; missing {missing}"
            if missing else None,
            None if conditions else "probe.conditions must name at least one graph among ['masked', 'unmasked']",
            None if length_match_mode(length_match) else
            f"probe.length_match={length_match!r} must be one of {list(LENGTH_MATCH)} (true: exact, false: off)"])
        self.conditions, self.thresholds, self.ngram = tuple(conditions), tuple(thresholds), ngram
        self.sampling = {**DEFAULT_SAMPLING, **(sampling or {})}
        self.tags = Tags(tags["open"], tags["close"])
        self.writer = TranscriptWriter(self.conditions, self.tags, system_prompt, max_block_tokens, bridge,
                                       self.sampling, {**DEFAULT_CANARY, **(canary or {})})
        self.donors = Donors(length_match_mode(length_match), donor_seed)
        self.scorer = ContrastScorer(self.tags, self.donors, target, control)

    def arms(self, arm: Arm) -> list[Arm]:
        """None: the transcripts follow the probe's own role protocol, not an arm."""
        return []

    def prompts(self, ctx: AuditContext) -> list[Prompt]:
        """Each item's first request per graph: the chat prompt with A's private block opened."""
        opening = self.tags.text("open", "A", "private")
        return [Prompt(f"question {item.question_id}", f"graph {condition}",
                       ctx.tokenizer.decode(list(self.writer.prompt(ctx, item.question, list(item.options)).ids))
                       + opening)
                for item in self.items(ctx).itertuples(index=False) for condition in self.conditions]

    @staticmethod
    def items(ctx: AuditContext) -> pd.DataFrame:
        """The sampled MCQ items in their original option order. # question_id, question, options, ..."""
        return ctx.dataset.variants().query("permutation == 0").reset_index(drop=True)

    def measure(self, ctx: AuditContext) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
        """(contrasts, traces, `analysis.influence` of them): the transcripts written, scored and analysed."""
        traces = self.writer.write(ctx, self.items(ctx))
        valid = {t.trace_id for t in traces if t.canary is None and self.tags.valid(t, ctx.tokenizer)}
        contrasts = self.scorer.contrasts(ctx, [t for t in traces if t.canary is None and t.trace_id in valid])
        trace_rows = trace_records(ctx, traces, valid, self.tags, self.ngram)
        return contrasts, trace_rows, influence(contrasts, trace_rows, self.thresholds)

    def run(self, ctx: AuditContext) -> ProbeResult:
        contrasts, trace_rows, report = self.measure(ctx)
        return ProbeResult(metrics=report["metrics"], tables=report["tables"],
                           figures={"influence_rates": influence_rates_figure(report["tables"]["influence_rates"])},
                           records={"records": contrasts, "traces": trace_rows},
                           headline=[f"{name}_{c}" for c in self.conditions for name in HEADLINE])

    def planned_tests(self, arm: Arm, effect: Mapping[str, float],
                      pilot: ProbeResult | None = None) -> list[PlannedTest]:
        """Each graph's A-to-B influence rate with its Wilson interval, at a pilot's rate and contrasts per item (over
        at least stats.FEW contrasts), else plan.effect.influence_rate and one contrast per item."""
        metrics, items = (pilot.metrics, len(pilot.records["traces"]) / len(self.conditions)) if pilot else ({}, 0)
        tests = []
        width = float(effect["influence_width"])
        for c in self.conditions:
            name, what = f"influence_rate_a_to_b_{c}", f"A-to-B influence, {c} graph"
            rate, contrasts = measured(metrics, name), measured(metrics, f"n_contrasts_a_to_b_{c}")
            if rate is not None and contrasts and contrasts >= FEW and items:
                tests.append(rate_interval(what, name, rate, width, contrasts / items, "pilot"))
            else:
                tests.append(rate_interval(what, name, float(effect["influence_rate"]), width, 1.0,
                                           "assumed: plan.effect.influence_rate"))
        return tests

    def verdict(self, result: ProbeResult) -> list[str]:
        """Per graph: valid transcripts, the influence rate of each direction with its interval, the control."""
        traces = result.records["traces"]

        def g(name: str) -> float:
            return result.metrics.get(name, math.nan)  # a direction without contrasts has no rate

        lines, warnings = [], []
        for c in self.conditions:
            directions = "; ".join(
                f"{label}: {num(g(f'influence_k_{d}_{c}'))} of {num(g(f'n_contrasts_{d}_{c}'))} donor swaps raised the "
                f"target's NLL (rate {rate(g, f'influence_rate_{d}_{c}')}"
                f"{few_units(result.metrics, f'influence_rate_{d}_{c}', 'contrasts')}), "
                f"{num(g(f'substantive_k_{d}_{c}'))} of them by more than 0.05 nats/token (substantive rate "
                f"{rate(g, f'substantive_rate_{d}_{c}')})"
                for d, label in (("a_to_b", "A->B"), ("b_to_a", "B->A")))
            lines.append(f"graph {c}: {num(g(f'n_valid_{c}'))} of {num(g(f'n_traces_{c}'))} transcripts valid; "
                         f"{directions}; the graph-cut control left the NLL unchanged in "
                         f"{num(g(f'control_zero_count_{c}'))} of {num(g(f'control_n_{c}'))} contrasts.")
            if not g(f"n_valid_{c}"):
                warnings.append(f"no {c} transcript is valid (a block came out empty): raise probe.max_block_tokens")
            elif not g(f"n_contrasts_{c}"):
                warnings.append(f"no {c} contrast found a donor of the same length: sample more items or set "
                                "probe.length_match=false")
        head = f"influence between private reasoning channels on {traces['question_id'].nunique()} MCQ items:"
        return [head, *lines, *(WARNING + w for w in warnings)]
