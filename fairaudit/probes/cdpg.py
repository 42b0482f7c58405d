"""Probe `cdpg`: the Counterfactual Depth Probability Gap along the thinking trace (paper 000 §3.3, §4.3)."""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

import pandas as pd

from fairaudit.analysis.cdpg import cdpg, segment_cuts
from fairaudit.analysis.cdpg_figures import cdpg_figures
from fairaudit.analysis.contingency import CELLS
from fairaudit.analysis.degenerate import WARNING, depth_warnings
from fairaudit.analysis.numbers import format_number as num
from fairaudit.analysis.pairs import answer_accounting
from fairaudit.analysis.power import cells_at_ratio
from fairaudit.analysis.stats import FEW
from fairaudit.errors import AuditError
from fairaudit.errors.rules import MAX_CUTS, check_fields, integer, list_of, number, optional
from fairaudit.probes import AuditContext, Needs, PlannedTest, ProbeResult
from fairaudit.probes.decisions import (
    RESAMPLING,
    PairedProbe,
    analysed,
    answer_choices,
    answer_parts_all,
    arm_names,
    few_units,
    gap_sentence,
    interval,
    paired_metrics,
    paired_records,
    pairs_phrase,
    sides,
    warnings_of,
)
from fairaudit.probes.planned import measured, paired_mean_test
from fairaudit.prompts.yesno import Arm

SETTINGS = {**RESAMPLING, "K": integer(1, MAX_CUTS), "k_list": list_of(integer(1, MAX_CUTS)),
            "identity_atol": number(0),
            "k_sensitivity_subsample": optional(integer(1, why=" (pairs per model and dataset, or null for all)"))}

HEADLINE = ["cdpg_n_pairs", "cdpg_n_c", "cdpg_slope_a", "cdpg_slope_b", "cdpg_slope_c", "cdpg_slope_c_ci_low",
            "cdpg_slope_c_ci_high", "cdpg_slope_c_ci_few", "cdpg_slope_c_from0", "cdpg_slope_d", "p_gap_{t}",
            "n_pairs_truncated", "cdpg_n_pairs_complete", "cdpg_slope_c_complete"]
CELL_NAMES = {"a": "no flip", "b": "flips resolved", "c": "flips created", "d": "flips under both"}


class CDPGProbe(PairedProbe):
    """Each treatment trace cut into K equal-token segments; P(Yes) re-read after every prefix.

    Generations come from the store (shared with the counterfactual and btm probes); every
    K in {K} and `k_list` is read from one packed pass per trace, since the cuts of coarser
    K are among those of the finest.
    """

    needs = Needs("decision", ("scores", "depth_reads"))

    def __init__(self, baseline_arm: dict, K: int = 10, k_list: tuple[int, ...] = (5, 10, 20), n_boot: int = 2000,
                 seed: int = 0, identity_atol: float = 1e-4, k_sensitivity_subsample: int | None = None):
        super().__init__(baseline_arm)
        check_fields("probe", {"K": K, "k_list": list(k_list), "n_boot": n_boot, "seed": seed,
                               "identity_atol": identity_atol, "k_sensitivity_subsample": k_sensitivity_subsample},
                     SETTINGS)
        self.K, self.k_list = K, tuple(k_list)
        self.n_boot, self.seed, self.identity_atol = n_boot, seed, identity_atol
        self.k_sensitivity_subsample = k_sensitivity_subsample

    def arms(self, arm: Arm) -> list[Arm]:
        if not arm.think:
            raise AuditError(f"probe 'cdpg' cuts thinking traces; arm {arm.name!r} does not think: audit a thinking "
                             "arm (arm=think)")
        return super().arms(arm)

    def run(self, ctx: AuditContext) -> ProbeResult:
        records = paired_records(ctx, self.baseline)
        depth = self.depth_records(ctx, records)
        t, b = ctx.arm.name, self.baseline.name

        def analyse(rows: pd.DataFrame) -> dict:  # cdpg on the depth records of these records' pairs
            return cdpg(depth[depth["pair_id"].isin(rows["pair_id"])], rows, treatment=t, baseline=b,
                        k_list=self.k_list, seed=self.seed, K=self.K, identity_atol=self.identity_atol,
                        k_sensitivity_subsample=self.k_sensitivity_subsample)

        slim = analysed(records)
        result = analyse(slim)
        metrics = paired_metrics(lambda rows: analyse(rows)["metrics"] | answer_accounting(rows, t, b), records, t, b,
                                 result["metrics"] | answer_accounting(slim, t, b), self.n_boot, self.seed)
        return ProbeResult(metrics=metrics, tables=result["tables"],
                           figures=cdpg_figures(result["tables"], K=self.K, k_list=self.k_list, arms=(t, b)),
                           records={"records": records, "depth_records": depth},
                           headline=[name.format(t=t) for name in HEADLINE])

    def planned_tests(self, arm: Arm, effect: Mapping[str, float],
                      pilot: ProbeResult | None = None) -> list[PlannedTest]:
        """The slope of |CDPG| over depth in cell c (the cell the paper's amplification is in): the t-test of the mean
        pair slope over the cell's pairs, which the probe's t interval is, each pair in the cell with chance a
        pilot's share (over at least stats.FEW pairs), else cell c's share at plan.effect.discordant and
        c_b_ratio."""
        metrics = pilot.metrics if pilot else {}
        in_c, pairs = measured(metrics, "cdpg_n_c"), measured(metrics, "cdpg_n_pairs")
        piloted = in_c and pairs and pairs >= FEW
        share = in_c / pairs if piloted else cells_at_ratio(effect["discordant"], effect["c_b_ratio"])[1]
        return [paired_mean_test("CDPG slope in cell c", "cdpg_slope_c", float(effect["cdpg_slope"]), "cdpg_slope_sd",
                                 effect, metrics, share, student_t=True)]

    def verdict(self, result: ProbeResult) -> list[str]:
        """How |CDPG| grows along the trace per cell (slope with its interval), the P(Yes) gap, warnings."""
        m, records = result.metrics, result.records["records"]
        t, b = arm_names(records)
        alpha, alpha_prime = sides(records)
        slopes = [f"{cell} ({CELL_NAMES[cell]}, {_pairs(m[f'cdpg_n_{cell}'])}{few_units(m, f'cdpg_slope_{cell}')}) "
                  f"{interval(m, f'cdpg_slope_{cell}')}" for cell in CELLS if m[f"cdpg_n_{cell}"]]
        empty = [cell for cell in CELLS if not m[f"cdpg_n_{cell}"]]
        found = (f"CDPG on {pairs_phrase(records, m['cdpg_n_pairs'])}: |P(Yes | {alpha}) - P(Yes | {alpha_prime})| "
                 f"re-read after each of K={self.K} equal segments of the {t} trace; the slope of its mean against "
                 f"depth (0 to 1, 95% t interval), by cell: {'; '.join(slopes) or 'no pair counts'}"
                 + (f"; cell{'s' if len(empty) > 1 else ''} {', '.join(empty)} empty" if empty and slopes else "")
                 + ".")
        depth = [WARNING + line for line in depth_warnings(result.records["depth_records"], self.K)]
        return [found, gap_sentence(m, records, t, b) + ".", *warnings_of(records, t, b), *depth]

    def depth_records(self, ctx: AuditContext, records: pd.DataFrame) -> pd.DataFrame:
        """P(Yes) after every cut of every treatment trace."""
        # -> pair_id, side, arm, K, k, cut, p_yes_k, model, dataset
        rows = records[records["arm"] == ctx.arm.name].reset_index(drop=True)
        parts = answer_parts_all(ctx, list(rows["prompt"]), list(rows["trace"]), ctx.arm)
        Ks = sorted({self.K, *self.k_list})
        cuts = [{K: segment_cuts(len(part.trace_ids), K) for K in Ks} for part in parts]
        requests = [replace(part, cuts=tuple(sorted({c for K in Ks for c in by_k[K]})))
                    for part, by_k in zip(parts, cuts)]
        probs = ctx.client.depth_choice_probs(requests, answer_choices(ctx), label=f"depth {ctx.arm.name}")
        out = []
        for record, request, by_k, p in zip(rows.itertuples(), requests, cuts, probs):
            p_yes_at = dict(zip(request.cuts, p[:, 0]))
            for K in Ks:
                out += [(record.pair_id, record.side, ctx.arm.name, K, k, by_k[K][k - 1], p_yes_at[by_k[K][k - 1]])
                        for k in range(1, K + 1)]
        frame = pd.DataFrame(out, columns=["pair_id", "side", "arm", "K", "k", "cut", "p_yes_k"])
        return frame.assign(model=ctx.model.name, dataset=ctx.dataset.name)


def _pairs(n: float) -> str:
    return f"{num(n)} pair{'' if n == 1 else 's'}"
