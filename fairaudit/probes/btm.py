"""Probe `btm`: group-level and pair-state bias transition matrices (paper 000 §3.4, §4.4)."""

from __future__ import annotations

from fairaudit.analysis.numbers import format_number as num
from fairaudit.analysis.pairs import answer_accounting
from fairaudit.analysis.transition_figures import group_transition_heatmaps, tpair_heatmap
from fairaudit.analysis.transitions import transitions
from fairaudit.probes import AuditContext, ProbeResult
from fairaudit.probes.decisions import (
    PairedProbe,
    analysed,
    arm_names,
    gap_sentence,
    paired_metrics,
    paired_records,
    pairs_phrase,
    sides,
    warnings_of,
)

HEADLINE = ["n_pairs", "t_alpha_ny", "t_alpha_prime_ny", "t_alpha_yy", "t_alpha_prime_yy", "delta_t_max_abs",
            "tpair_nn_m", "tpair_m_m", "c_actual", "c_ind", "b_actual", "b_ind", "n_pairs_truncated",
            "n_pairs_complete", "delta_t_max_abs_complete"]


class BiasTransitionProbe(PairedProbe):
    """How predictions move from `baseline_arm` to the grid's arm, per side and per pair state.

    Reads the same generations as the counterfactual probe (from the store when it ran first).
    """

    def run(self, ctx: AuditContext) -> ProbeResult:
        records = paired_records(ctx, self.baseline)
        t, b = ctx.arm.name, self.baseline.name
        slim = analysed(records)
        result = transitions(slim, treatment=t, baseline=b)
        tables = result["tables"]
        figures = {
            "tpair_split": tpair_heatmap(tables["tpair_split"], t, b, title="pair-state transitions"),
            "t_alpha_vs_alpha_prime": group_transition_heatmaps(
                tables["t_alpha"], tables["t_alpha_prime"], t, b, labels=sides(records)
            ),
        }
        metrics = paired_metrics(lambda rows: transitions(rows, treatment=t, baseline=b)["metrics"]
                                 | answer_accounting(rows, t, b), records, t, b,
                                 result["metrics"] | answer_accounting(slim, t, b))
        headline = HEADLINE + [f"p_gap_{t}", f"p_gap_{b}", "delta_p_gap"]
        return ProbeResult(metrics=metrics, tables=tables, figures=figures,
                           records={"records": records}, headline=headline)

    @classmethod
    def point_metrics(cls, records) -> dict[str, float]:
        """The metrics `run` logs, from the records alone, without bootstrap intervals."""
        rows = records["records"]
        t, b = arm_names(rows)
        return paired_metrics(lambda r: transitions(r, treatment=t, baseline=b)["metrics"] | answer_accounting(r, t, b),
                              rows, t, b, n_boot=0)

    def verdict(self, result: ProbeResult) -> list[str]:
        """Yes-rate shifts per side, the largest gap between the sides' transitions, flips against independence."""
        m, records = result.metrics, result.records["records"]
        t, b = arm_names(records)
        alpha, alpha_prime = sides(records)
        found = (f"{b} -> {t} on {pairs_phrase(records, m['n_pairs'])}: "
                 f"the Yes rate moved {_signed(m['dp_yes_alpha'])} "
                 f"for {alpha} and {_signed(m['dp_yes_alpha_prime'])} for {alpha_prime}; the two sides' transition "
                 f"probabilities differ by at most {num(m['delta_t_max_abs'])}; {t} created {num(m['c_actual'])} flips "
                 f"(independent sides would give {num(m['c_ind'])}) and resolved {num(m['b_actual'])} "
                 f"({num(m['b_ind'])}).")
        return [found, gap_sentence(m, records, t, b) + ".", *warnings_of(records, t, b)]


def _signed(value: float) -> str:
    """A shift with its sign: +0.05, -0.1, 0, n/a."""
    text = num(value)
    return f"+{text}" if value == value and value > 0 else text
