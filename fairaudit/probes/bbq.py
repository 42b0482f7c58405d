"""Probe `bbq`: BBQ's accuracy and bias scores (Parrish et al. 2022) under two arms, the same items compared, and the
answer distribution read along the thinking trace (the CDPG depth reads over BBQ's three options).

Every sampled item is asked under the grid's arm (treatment) and `baseline_arm` (nothink by default), in its file's
option order and, with `permutations`, its other two cyclic orders. The think/nothink arms ask the item with the
letter instruction below in the model's own think channel (or none); the MCQ arms (direct, cot, reason) ask it with
their A.1 prompts. The answer is the letter parsed from the answer text (A.2's cascade), or under
`model.answer_source: forced` the option with the highest probability at the answer position (the softmax over the
letters A, B, C, as P(Yes) is read for the paired probes). Numbers come from `analysis.bbq`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

import numpy as np
import pandas as pd

from fairaudit.analysis.bbq import ROLES, bbq
from fairaudit.analysis.bbq_figures import depth_figure
from fairaudit.analysis.cdpg import segment_cuts
from fairaudit.analysis.degenerate import WARNING, mcq_warnings
from fairaudit.analysis.numbers import format_number as num
from fairaudit.analysis.numbers import format_p
from fairaudit.analysis.power import cells_at_ratio, mcnemar_power
from fairaudit.backends import GenerationRequest
from fairaudit.data.bbq import N_OPTIONS, OPTION_LETTERS, BBQDataset, options_text
from fairaudit.errors import AuditError
from fairaudit.errors.rules import MAX_CUTS, arm_rules, boolean, check_fields, integer, text
from fairaudit.probes import AuditContext, Needs, PlannedTest, Probe, ProbeResult, Prompt, SampleView
from fairaudit.probes.bbq_samples import ITEMS
from fairaudit.probes.decisions import answer_parts_all, encode_all, interval
from fairaudit.probes.planned import measured
from fairaudit.prompts.mcq import MCQ_ARMS, extract_answer, render_mcq_prompt
from fairaudit.prompts.yesno import Arm, render_prompt, split_output

SHIPPED_CATEGORIES = 6  # the categories the CI copy holds, dataset.categories' default
INSTRUCTION = "Answer with the letter of the correct option: A, B or C."
SETTINGS = {"baseline_arm.name": text(), "permutations": boolean, "K": integer(1, MAX_CUTS),
            "think_instruction": text(empty=True)}
HEADLINE = ["bbq_s_dis_{t}", "bbq_s_amb_{t}", "bbq_s_dis_{b}", "bbq_s_amb_{b}", "bbq_delta_s_dis", "bbq_delta_s_amb",
            "bbq_accuracy_ambig_{t}", "bbq_accuracy_disambig_{t}", "bbq_flips_b", "bbq_flips_c", "bbq_mcnemar_p",
            "bbq_order_consistency_{t}", "bbq_takeover_share_{t}"]


def shown(options: list[str], s: int) -> list[str]:
    """The options in cyclic order s: option j moves to position (j + s) mod 3."""
    return [options[(position - s) % N_OPTIONS] for position in range(N_OPTIONS)]


def letter_ids(tokenizer, answer_prefix: str) -> list[list[int]]:
    """The one token of each letter A, B, C as written at the answer position (after a word, with a space)."""
    space = " " if answer_prefix and not answer_prefix[-1].isspace() else ""
    ids = [tokenizer.encode(f"{space}{letter}", add_special_tokens=False) for letter in OPTION_LETTERS]
    if any(len(piece) != 1 for piece in ids):
        raise AuditError(f"the letters A, B, C are not single tokens after {answer_prefix!r} in this tokenizer ({ids})")
    return ids


class BBQProbe(Probe):
    """BBQ under the grid's arm and a baseline arm: accuracy, s_DIS, s_AMB, the paired flips, option order, depth."""

    needs = Needs("mcq", ("scores", "depth_reads"), arm_families=("decision", "mcq"),  # think/nothink and A.1 arms
                  data=BBQDataset)  # its contexts, conditions and biased options
    samples = SampleView("records", ITEMS)

    def __init__(self, baseline_arm: dict, permutations: bool = True, K: int = 4, think_instruction: str = ""):
        check_fields("probe.baseline_arm", baseline_arm, arm_rules())
        check_fields("probe", {"permutations": permutations, "K": K, "think_instruction": think_instruction},
                     {k: v for k, v in SETTINGS.items() if "." not in k})
        self.baseline = Arm(**baseline_arm)
        self.permutations, self.K, self.think_instruction = permutations, K, think_instruction

    def arms(self, arm: Arm) -> list[Arm]:
        """The grid's arm and the baseline, each asked as a BBQ question (an MCQ arm by its A.1 prompt, think and
        nothink by the letter instruction); the two must differ."""
        if arm.name == self.baseline.name:
            raise AuditError(f"arm={arm.name} is also the probe's baseline: an arm compared with itself shows "
                             f"nothing; choose another arm or arm@probe.baseline_arm")
        return [arm, self.baseline]

    def variants(self, ctx: AuditContext) -> pd.DataFrame:
        """Each sampled item in its option orders: the item's columns, permutation and the options as shown."""
        items = ctx.dataset.items()
        orders = range(N_OPTIONS) if self.permutations else range(1)
        rows = [dict(row._asdict(), permutation=s, shown_options=shown(row.options, s))
                for row in items.itertuples(index=False) for s in orders]
        return pd.DataFrame(rows)

    def render(self, ctx: AuditContext, variants: pd.DataFrame, arm: Arm) -> list[str]:
        """The full prompt of each variant under `arm`."""
        model = ctx.model
        if arm.name in MCQ_ARMS:
            return [render_mcq_prompt(ctx.tokenizer, arm, f"{r.context} {r.question}", options_text(r.shown_options),
                                      model.thinking, model.template_kwargs, self.think_instruction)
                    for r in variants.itertuples(index=False)]
        return [render_prompt(ctx.tokenizer, f"{r.context} {r.question}\n\n{options_text(r.shown_options)}\n\n"
                              f"{INSTRUCTION}", arm, model.thinking, model.template_kwargs)
                for r in variants.itertuples(index=False)]

    def prompts(self, ctx: AuditContext) -> list[Prompt]:
        """Every variant under each arm, item by item."""
        variants = self.variants(ctx)
        by_arm = {arm.name: self.render(ctx, variants, arm) for arm in self.arms(ctx.arm)}
        return [Prompt(f"item {row.item_id} ({row.condition}, {row.polarity}), order {row.permutation}", f"arm {a}",
                       texts[i])
                for i, row in enumerate(variants.itertuples(index=False)) for a, texts in by_arm.items()]

    def run(self, ctx: AuditContext) -> ProbeResult:
        variants = self.variants(ctx)
        t, b = ctx.arm.name, self.baseline.name
        asked = [self.answer(ctx, variants, arm) for arm in (ctx.arm, self.baseline)]
        records = pd.concat([frame for frame, _ in asked], ignore_index=True)
        depth = pd.concat([self.depth_reads(ctx, frame, parts, arm)
                           for (frame, parts), arm in zip(asked, (ctx.arm, self.baseline)) if arm.think],
                          ignore_index=True) if ctx.arm.think or self.baseline.think else pd.DataFrame()
        found = bbq(records.drop(columns=["prompt", "text", "trace"]), depth, t, b)
        figures = {"bbq_depth": depth_figure(found["tables"]["bbq_depth"])} if "bbq_depth" in found["tables"] else {}
        return ProbeResult(metrics=found["metrics"], tables=found["tables"], figures=figures,
                           records={"records": records, "depth_records": depth},
                           headline=[h.format(t=t, b=b) for h in HEADLINE])

    def answer(self, ctx: AuditContext, variants: pd.DataFrame, arm: Arm) -> tuple[pd.DataFrame, list]:
        """Generate and score every variant under `arm`: its records, and each answer position's parts (the depth
        reads cut their traces). The answer's option is in the file's order (`answer_option`) and as shown."""
        prompts = self.render(ctx, variants, arm)
        requests = [GenerationRequest(ids, arm.max_new_tokens) for ids in encode_all(ctx, prompts)]
        completions = ctx.client.generate(requests, label=f"generate {arm.name}")
        outputs = [split_output(p, c.text, arm, ctx.model.thinking) for p, c in zip(prompts, completions)]
        parts = answer_parts_all(ctx, prompts, [o.trace for o in outputs], arm)
        choices = letter_ids(ctx.tokenizer, ctx.model.answer_prefix)
        probs = ctx.client.choice_probs([p.prompt_ids + p.trace_ids + p.suffix_ids for p in parts], choices,
                                        label=f"score {arm.name}")
        parsed = [parsed_position(o.answer_text) if o.closed else None for o in outputs]
        forced = list(probs.argmax(axis=1))
        position = forced if ctx.model.answer_source == "forced" else parsed
        records = variants.drop(columns=["options", "option_groups", "stereotyped_groups"]).assign(
            model=ctx.model.name, dataset=ctx.dataset.name, arm=arm.name,
            answer_position=pd.array(position, dtype="Int64"),
            parsed_position=pd.array(parsed, dtype="Int64"),
            trace_tokens=[len(p.trace_ids) for p in parts], think_closed=[o.closed for o in outputs],
            truncated=[c.finish_reason == "length" for c in completions], prompt_hash=[c.key for c in completions],
            prompt=prompts, trace=[o.trace for o in outputs], text=[c.text for c in completions])
        records["answer_option"] = (records["answer_position"] - records["permutation"]) % N_OPTIONS
        return with_role_probs(records, probs), parts

    def depth_reads(self, ctx: AuditContext, records: pd.DataFrame, parts: list, arm: Arm) -> pd.DataFrame:
        """The three options' probabilities after 0 (none of the trace), 1, ..., K of K equal-token segments of each
        trace whose biased option is known."""
        # -> item_id, permutation, arm, K, k, cut, p_biased, p_other, p_unknown, model, dataset
        keep = np.flatnonzero(records["biased_option"].to_numpy() >= 0)
        cuts = [[0, *segment_cuts(len(parts[i].trace_ids), self.K)] for i in keep]
        requests = [replace(parts[i], cuts=tuple(sorted(set(c)))) for i, c in zip(keep, cuts)]
        probs = ctx.client.depth_choice_probs(requests, letter_ids(ctx.tokenizer, ctx.model.answer_prefix),
                                              label=f"depth {arm.name}")
        rows = []
        for i, request, by_k, p in zip(keep, requests, cuts, probs):
            record = records.iloc[i]
            at = dict(zip(request.cuts, p))
            roles = role_probs(np.array([at[cut] for cut in by_k]), record)
            rows += [(record.item_id, record.permutation, arm.name, self.K, k, by_k[k], *roles[k])
                     for k in range(self.K + 1)]
        frame = pd.DataFrame(rows, columns=["item_id", "permutation", "arm", "K", "k", "cut",
                                            *(f"p_{role}" for role in ROLES)])
        return frame.assign(model=ctx.model.name, dataset=ctx.dataset.name)

    def planned_tests(self, arm: Arm, effect: Mapping[str, float],
                      pilot: ProbeResult | None = None) -> list[PlannedTest]:
        """McNemar's exact test on the items whose bias status the arms change, at plan.effect.c_b_ratio and a pilot's
        share of such items (else plan.effect.discordant). Its n is dataset.n per category times the categories: a
        pilot's, else the six the shipped copy holds (the config's default)."""
        metrics = pilot.metrics if pilot else {}
        b, c, paired = (measured(metrics, name) for name in ("bbq_flips_b", "bbq_flips_c", "bbq_n_paired"))
        piloted = bool(paired) and b is not None and c is not None and b + c > 0
        discordant = (b + c) / paired if piloted else float(effect["discordant"])
        p_b, p_c = cells_at_ratio(discordant, float(effect["c_b_ratio"]))
        source = f"pilot: {num(b + c)} of {num(paired)} items" if piloted else "assumed: plan.effect.discordant"
        categories = len({name for name in metrics if name.startswith("bbq_s_dis_") and name.endswith(
            f"_{arm.name}") and name.count("_") > 3 and "_ci_" not in name}) or SHIPPED_CATEGORIES
        return [PlannedTest("McNemar, items biased under one arm only", "bbq_mcnemar_log10_p",
                            f"c/b = {num(effect['c_b_ratio'])} at {num(discordant)} changing ({source}); "
                            f"{categories} categories", "exact",
                            power=lambda n, level: mcnemar_power(n, p_b, p_c, level), share=float(categories))]

    def verdict(self, result: ProbeResult) -> list[str]:
        """s_DIS and s_AMB per arm with intervals, the arm difference and the exact test, order, depth."""
        m, records = result.metrics, result.records["records"]
        t, b = list(dict.fromkeys(records["arm"]))
        items = records["item_id"].nunique()
        lines = [f"BBQ on {items} items of {records['category'].nunique()} categories, asked under {t} and {b}"
                 f"{' in 3 option orders' if self.permutations else ''}; bias scores (0: none, 1: always the "
                 f"stereotype; 95% intervals clustered by template):"]
        for arm in (t, b):
            lines.append(f"{arm}: s_DIS {interval(m, f'bbq_s_dis_{arm}')} (n {num(m[f'bbq_s_dis_{arm}_ci_n'])} "
                         f"templates), s_AMB {interval(m, f'bbq_s_amb_{arm}')}; accuracy ambiguous "
                         f"{num(m[f'bbq_accuracy_ambig_{arm}'])}, disambiguated "
                         f"{num(m[f'bbq_accuracy_disambig_{arm}'])}; same option in every order for "
                         f"{num(m[f'bbq_order_consistency_{arm}'])} of items.")
        lines.append(f"{t} - {b}: s_DIS {interval(m, 'bbq_delta_s_dis')}, s_AMB {interval(m, 'bbq_delta_s_amb')}; "
                     f"of {num(m['bbq_n_paired'])} items, {num(m['bbq_flips_c'])} biased under {t} only and "
                     f"{num(m['bbq_flips_b'])} under {b} only (exact McNemar p = "
                     f"{format_p(m['bbq_mcnemar_log10_p'])}).")
        for arm in (t, b):
            if f"bbq_takeover_share_{arm}" in m:
                lines.append(f"along the {arm} traces ({num(m[f'bbq_depth_n_traces_{arm}'])}, K={self.K}): the "
                             f"stereotyped option takes over in {num(m[f'bbq_takeover_share_{arm}'])} of them, at "
                             f"median depth {num(m[f'bbq_takeover_depth_{arm}'])}.")
        return lines + [f"{WARNING}{arm}: {line}" for arm in (t, b)
                        for line in mcq_warnings(records[records["arm"] == arm])]


def parsed_position(answer_text: str) -> int | None:
    """The letter A.2's cascade finds, as a position 0..2; None without one or for a letter past C."""
    letter = extract_answer(answer_text)
    return OPTION_LETTERS.index(letter) if letter is not None and letter in OPTION_LETTERS else None


def role_probs(shown_probs: np.ndarray, record) -> np.ndarray:
    """(p_biased, p_other, p_unknown) of each row of probabilities over the shown positions A, B, C."""
    original = np.stack([shown_probs[:, (j + record.permutation) % N_OPTIONS] for j in range(N_OPTIONS)], axis=1)
    biased, unknown = int(record.biased_option), int(record.unknown_option)
    if biased < 0:
        return np.full((len(shown_probs), 3), np.nan)
    other = next(j for j in range(N_OPTIONS) if j not in (biased, unknown))
    return original[:, [biased, other, unknown]]


def with_role_probs(records: pd.DataFrame, probs: np.ndarray) -> pd.DataFrame:
    """records with p_biased, p_other, p_unknown: the answer position's probabilities by the options' roles."""
    roles = np.vstack([role_probs(probs[i:i + 1], row) for i, row in enumerate(records.itertuples(index=False))])
    return records.assign(**{f"p_{role}": roles[:, j] for j, role in enumerate(ROLES)})
