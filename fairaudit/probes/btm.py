"""Probe `btm`: group-level and pair-state bias transition matrices (paper 000 §3.4, §4.4)."""

from __future__ import annotations

from fairaudit.analysis.transition_figures import group_transition_heatmaps, tpair_heatmap
from fairaudit.analysis.pairs import answer_accounting
from fairaudit.analysis.transitions import transitions
from fairaudit.probes import AuditContext, ProbeResult
from fairaudit.probes.decisions import PairedProbe, analysed, paired_metrics, paired_records

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
        result = transitions(analysed(records), treatment=t, baseline=b)
        tables = result["tables"]
        figures = {
            "tpair_split": tpair_heatmap(tables["tpair_split"], t, b, title="pair-state transitions"),
            "t_alpha_vs_alpha_prime": group_transition_heatmaps(
                tables["t_alpha"], tables["t_alpha_prime"], t, b, labels=tuple(_side_labels(records))
            ),
        }
        metrics = paired_metrics(lambda rows: transitions(rows, treatment=t, baseline=b)["metrics"]
                                 | answer_accounting(rows, t, b), records, t, b,
                                 result["metrics"] | answer_accounting(analysed(records), t, b))
        return ProbeResult(metrics=metrics, tables=tables, figures=figures,
                           records={"records": records}, headline=HEADLINE)


def _side_labels(records) -> list[str]:
    """The protected values rendered on the alpha and alpha' sides, e.g. Male, Female."""
    values = records.drop_duplicates("side").set_index("side")["attribute_value"]
    return [values.get("alpha", "alpha"), values.get("alpha_prime", "alpha_prime")]
