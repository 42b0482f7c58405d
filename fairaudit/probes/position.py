"""Probe `position`: length-driven position bias in MCQ answers under one arm (position-bias paper §3-5).

Every sampled question is asked in its four cyclic permutations (greedy); answers are read
by the A.2 cascade (with the letter-frequency fallback of §4 unless `letter_fallback` is off)
and the metrics come from `analysis.position`. The truncation
intervention (§3.4) cuts each trajectory with a CCP at CCP + offset and resamples its
continuation a few times under fixed seeds; every generation goes through the store.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Mapping

import pandas as pd

from fairaudit.analysis.degenerate import WARNING, mcq_warnings
from fairaudit.analysis.numbers import format_number as num
from fairaudit.analysis.numbers import format_p
from fairaudit.analysis.position import LETTERS, position, preferred_position, with_trajectory_metrics
from fairaudit.analysis.position_figures import pbs_by_length_figure, pbs_length_figure, truncation_figure
from fairaudit.analysis.position_truncation import (
    OFFSETS,
    extraction_warning,
    truncation,
    truncation_cuts,
    truncation_trajectories,
)
from fairaudit.analysis.stats import PARTIAL_METHODS
from fairaudit.backends import GenerationRequest
from fairaudit.errors import AuditError
from fairaudit.errors.rules import (
    MAX_RELABELINGS,
    MAX_SAMPLES,
    boolean,
    check_fields,
    integer,
    list_of,
    number,
    one_of,
    optional,
    text,
)
from fairaudit.probes import AuditContext, Needs, PlannedTest, Probe, ProbeResult, Prompt, SampleView
from fairaudit.probes.decisions import encode
from fairaudit.probes.planned import correlation_test, measured
from fairaudit.probes.position_samples import QUESTIONS
from fairaudit.prompts.mcq import MCQ_ARMS, MENTION_CASES, final_answer, render_mcq_prompt
from fairaudit.prompts.yesno import Arm

HEADLINE = ["n_questions_complete", "extraction_rate", "fallback_rate", "answered_rate", "accuracy", "pbs", "pbs_q1",
            "pbs_q2", "pbs_q3", "pbs_q4", "partial_rho_length_pbs", "partial_rho_length_pbs_p",
            "partial_rho_length_pbs_pearson", "partial_rho_length_pbs_spearman", "ccp", "eff_sw", "length_chars",
            "preferred_position", "truncated_rate", "trunc_n_questions", "trunc_n", "trunc_change_rate",
            "trunc_directional_shift", "trunc_change_rate_before_ccp", "trunc_change_rate_after_ccp",
            "trunc_ccp_chi2_p", "trunc_ccp_perm_p", "trunc_ccp_perm_n_questions"]


SETTINGS = {  # probe.* keys this probe checks; the budget's upper bound (model.max_context) is the arm's check
    "think_instruction": text(empty=True), "letter_fallback": boolean, "mention_case": one_of(*MENTION_CASES),
    "partial_corr": one_of(*PARTIAL_METHODS), "truncation.relabelings": integer(100, MAX_RELABELINGS),
    "truncation.enabled": boolean, "truncation.arms": list_of(text(), nonempty=False),
    "truncation.n_questions": optional(integer(1)), "truncation.permutation": optional(integer(0, 3)),
    "truncation.include_ccp_bounds": boolean, "truncation.offsets": list_of(number(-1, 1)),
    "truncation.samples": integer(1, MAX_SAMPLES), "truncation.temperature": number(0, 10, lo_open=True),
    "truncation.top_p": number(0, 1, lo_open=True), "truncation.seed": integer(0, 2**32 - 1),
    "truncation.max_new_tokens": optional(integer(1)),
}


@dataclass(frozen=True)
class Truncation:
    """The truncation intervention's settings (§3.4; nucleus sampling p=0.95, T=0.7 as §4)."""

    enabled: bool = True
    arms: tuple[str, ...] = ("cot", "reason")  # arms whose trajectories are cut (direct answers have none)
    n_questions: int | None = 200  # questions with a detectable CCP, in sampled order (None: all)
    permutation: int | None = 0  # the permutation whose trajectory is cut (None: every permutation)
    include_ccp_bounds: bool = False  # also cut trajectories with CCP = 0 or 1
    offsets: tuple[float, ...] = OFFSETS
    samples: int = 3
    temperature: float = 0.7
    top_p: float = 0.95
    seed: int = 0
    max_new_tokens: int | None = None  # None: the arm's budget
    relabelings: int = 10000  # draws of the within-question test where its exact law is too large to convolve

    def applies_to(self, arm: Arm) -> bool:
        return self.enabled and arm.name in self.arms


def continuation_seed(base: int, question_id: int, permutation: int, offset: float, sample: int) -> int:
    """A fixed seed per continuation, stable across n and runs (so continuations are cached)."""
    return zlib.crc32(f"{base}/{question_id}/{permutation}/{offset:+.4f}/{sample}".encode())


def _position(letter: str | None) -> int | None:
    return None if letter is None else LETTERS.index(letter)


class PositionProbe(Probe):
    """Position bias (PBS, CCP, Eff-Sw, length quartiles) of the grid's MCQ arm, plus the truncation intervention."""

    needs = Needs("mcq")  # answers are parsed from generations alone: no scores
    samples = SampleView("records", QUESTIONS)

    def __init__(self, think_instruction: str = "", letter_fallback: bool = True, mention_case: str = "insensitive",
                 truncation: dict | None = None, partial_corr: str = "pearson"):
        check_fields("probe", {"think_instruction": think_instruction, "letter_fallback": letter_fallback,
                               "mention_case": mention_case, "truncation": truncation or {},
                               "partial_corr": partial_corr}, SETTINGS)
        self.think_instruction, self.partial_corr = think_instruction, partial_corr
        self.letter_fallback = letter_fallback
        self.mention_case = mention_case
        spec = dict(truncation or {})
        for key in ("arms", "offsets"):
            if key in spec:
                spec[key] = tuple(spec[key])
        try:
            self.truncation = Truncation(**spec)
        except TypeError as err:
            raise AuditError(f"probe.truncation: {err}; fields: {list(Truncation.__dataclass_fields__)}") from None

    def arms(self, arm: Arm) -> list[Arm]:
        """The grid's arm alone; an MCQ arm must name one of the A.1 prompts."""
        if arm.family == self.needs.family and arm.name not in MCQ_ARMS:
            raise AuditError(f"arm {arm.name!r} has no MCQ prompt; choices: {list(MCQ_ARMS)}")
        return [arm]

    def planned_tests(self, arm: Arm, effect: Mapping[str, float],
                      pilot: ProbeResult | None = None) -> list[PlannedTest]:
        """rho(length, PBS | accuracy) over the complete questions (all four permutations answered): a pilot's share
        of them, else all."""
        metrics = pilot.metrics if pilot else {}
        complete, asked = (measured(metrics, f"{name}_{arm.name}") for name in ("n_questions_complete", "n_questions"))
        share, source = (complete / asked, "pilot") if complete is not None and asked else (1.0, "assumed")
        return [correlation_test(f"partial_rho_length_pbs_log10_p_{arm.name}", float(effect["length_rho"]), 1,
                                 share, f"{source}: complete questions")]

    def prompts(self, ctx: AuditContext) -> list[Prompt]:
        """Every sampled question in each of its cyclic permutations, under the grid's arm."""
        variants = ctx.dataset.variants()
        texts = self.render(ctx, variants)
        return [Prompt(f"question {row.question_id}, permutation {row.permutation}, gold {LETTERS[row.gold_position]}",
                       f"arm {ctx.arm.name}", text) for row, text in zip(variants.itertuples(index=False), texts)]

    def render(self, ctx: AuditContext, variants: pd.DataFrame) -> list[str]:
        """The full prompt text of every variant under the grid's arm. variants: question, options_text"""
        return [render_mcq_prompt(ctx.tokenizer, ctx.arm, q, o, ctx.model.thinking, ctx.model.template_kwargs,
                                  self.think_instruction)
                for q, o in zip(variants["question"], variants["options_text"])]

    def run(self, ctx: AuditContext) -> ProbeResult:
        arm = ctx.arm.name
        records, prompt_ids = self.answer(ctx, ctx.dataset.variants())
        report = position(records, self.partial_corr)
        metrics = dict(report["metrics"])
        metrics[f"truncated_rate_{arm}"] = float(records["truncated"].mean())
        tables = dict(report["tables"])
        figures = {"pbs_by_length": pbs_by_length_figure(tables["pbs_by_length"])}
        summary = tables["position_summary"]
        if (summary["pbs"].notna() & (summary["length_chars"] > 0)).all():  # a log-length axis needs a point
            figures["pbs_length"] = pbs_length_figure(summary)
        frames = {"records": records}
        if self.truncation.applies_to(ctx.arm):
            continuations = self.resume(ctx, records, prompt_ids)
            trunc = truncation(continuations, relabelings=self.truncation.relabelings, seed=self.truncation.seed)
            metrics.update({f"{name}_{arm}": value for name, value in trunc["metrics"].items()})
            tables.update(trunc["tables"])
            figures["truncation"] = truncation_figure(trunc["tables"]["truncation_by_position"])
            frames["continuations"] = continuations
        return ProbeResult(metrics=metrics, tables=tables, figures=figures, records=frames,
                           headline=[f"{name}_{arm}" for name in HEADLINE])

    def verdict(self, result: ProbeResult) -> list[str]:
        """PBS with its scale, answers found, accuracy and preferred position; PBS by length; truncation; warnings."""
        records = result.records["records"]
        arm = str(records["arm"].iloc[0])
        m = {name[:-len(arm) - 1]: value for name, value in result.metrics.items() if name.endswith(f"_{arm}")}
        preferred = m.get("preferred_position", math.nan)
        found = (f"{arm} on {records['question_id'].nunique()} {records['dataset'].iloc[0]} questions x 4 cyclic "
                 f"permutations: position bias PBS = {num(m['pbs'])} over {num(m['n_questions_complete'])} questions "
                 f"answered in every permutation (0: the answer follows the content; {num(math.sqrt(0.75))}: "
                 f"always the same position); answers found in {num(m['answered_rate'])} of outputs, "
                 f"accuracy {num(m['accuracy'])}"
                 + (f", most often at position {LETTERS[int(preferred)]}" if preferred == preferred else "") + ".")
        lines = [found, f"PBS by output length quartile (short to long): "
                        f"{', '.join(num(m[f'pbs_q{q}']) for q in range(1, 5))}."]
        if "trunc_change_rate" in m:
            lines.append(f"truncation: {num(m['trunc_n'])} continuations resampled from CCP + offset changed the "
                         f"answer in {num(m['trunc_change_rate'])} of cases "
                         f"({num(m['trunc_change_rate_before_ccp'])} before the CCP, "
                         f"{num(m['trunc_change_rate_after_ccp'])} after; chi-square p = "
                         f"{format_p(m['trunc_ccp_chi2_log10_p'])} counting every continuation, exact p = "
                         f"{format_p(m['trunc_ccp_perm_log10_p'])} relabeling cuts within each of "
                         f"{num(m['trunc_ccp_perm_n_questions'])} questions).")
        extraction = extraction_warning(m)
        return lines + [WARNING + line for line in mcq_warnings(records) + ([extraction] if extraction else [])]

    def answer(self, ctx: AuditContext, variants: pd.DataFrame) -> tuple[pd.DataFrame, list[tuple[int, ...]]]:
        """Greedy generations of every variant under the grid's arm: the MCQ records and each prompt's token ids.

        Records carry the answer (A.2 cascade, else the letter-frequency fallback when enabled),
        its source, CCP and Eff-Sw of the whole generated text (A.3, A.4) and provenance.

        variants: question_id, permutation, gold_position, question, options_text
        """
        arm, model = ctx.arm, ctx.model
        prompts = self.render(ctx, variants)
        requests = [GenerationRequest(encode(ctx.tokenizer, p), arm.max_new_tokens) for p in prompts]
        completions = ctx.client.generate(requests, label=f"generate {arm.name}")
        answers = [final_answer(c.text, self.letter_fallback, self.mention_case) for c in completions]
        records = pd.DataFrame({
            "question_id": variants["question_id"].to_numpy(),
            "permutation": variants["permutation"].to_numpy(),
            "gold_position": variants["gold_position"].to_numpy(),
            "answer_position": pd.array([_position(letter) for letter, _ in answers], dtype="Int64"),
            "answer_source": [source for _, source in answers],
            "length_chars": [len(c.text) for c in completions],
            "completion_tokens": [len(c.token_ids) for c in completions],
            "arm": arm.name,
            "truncated": [c.finish_reason == "length" for c in completions],
            "prompt_hash": [c.key for c in completions],
            "prompt": prompts,
            "text": [c.text for c in completions],
            "model": model.name,
            "dataset": ctx.dataset.name,
        })
        return with_trajectory_metrics(records, self.mention_case), [r.prompt_ids for r in requests]

    def resume(self, ctx: AuditContext, records: pd.DataFrame, prompt_ids: list[tuple[int, ...]]) -> pd.DataFrame:
        """§3.4: continuations resampled from CCP + offset of the trajectories `truncation_trajectories` picks.

        records: the arm's records from `answer` (text, ccp, answer_position). One row per
        continuation: question_id, permutation, gold_position, arm, model, dataset, offset, position, cut_char,
        sample, seed, answer_position (the original answer), new_answer_position (of prefix +
        continuation), new_answer_source, preferred_position, truncated, prompt_hash, text.
        """
        spec, tok = self.truncation, ctx.tokenizer
        budget = spec.max_new_tokens or ctx.arm.max_new_tokens
        preferred = preferred_position(records.dropna(subset=["answer_position"]))
        chosen = truncation_trajectories(records.reset_index(drop=True), spec.n_questions, spec.permutation,
                                         spec.include_ccp_bounds)
        rows, requests = [], []
        for i, record in zip(chosen.index, chosen.itertuples(index=False)):
            for cut in truncation_cuts(record.text, record.ccp, spec.offsets):
                prefix_ids = prompt_ids[i] + encode(tok, record.text[:cut.char])
                for sample in range(spec.samples):
                    seed = continuation_seed(spec.seed, record.question_id, record.permutation, cut.offset, sample)
                    requests.append(GenerationRequest(prefix_ids, budget, spec.temperature, spec.top_p, seed))
                    rows.append({"question_id": record.question_id, "permutation": record.permutation,
                                 "gold_position": record.gold_position, "arm": record.arm, "model": record.model,
                                 "dataset": record.dataset, "offset": cut.offset,
                                 "position": cut.position, "cut_char": cut.char, "sample": sample, "seed": seed,
                                 "answer_position": record.answer_position, "prefix": record.text[:cut.char]})
        completions = ctx.client.generate(requests, label=f"resume {ctx.arm.name}")
        out = pd.DataFrame(rows, columns=[
            "question_id", "permutation", "gold_position", "arm", "model", "dataset", "offset", "position", "cut_char",
            "sample", "seed", "answer_position", "prefix"])
        answers = [final_answer(prefix + c.text, self.letter_fallback, self.mention_case)
                   for prefix, c in zip(out["prefix"], completions)]
        return out.drop(columns="prefix").assign(
            answer_position=pd.array(out["answer_position"], dtype="Int64"),
            new_answer_position=pd.array([_position(letter) for letter, _ in answers], dtype="Int64"),
            new_answer_source=[source for _, source in answers],
            preferred_position=preferred,
            truncated=[c.finish_reason == "length" for c in completions],
            prompt_hash=[c.key for c in completions],
            text=[c.text for c in completions],
        )
