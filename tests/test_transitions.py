"""Bias transition matrices against hand-computed numbers and the published Tables 3, 4, 10-14 and App. G."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest

from fairaudit.analysis import transitions
from fairaudit.analysis.pairs import SIDES, complete_instances
from fairaudit.analysis.transition_figures import group_transition_heatmaps, tpair_heatmap
from fairaudit.analysis.transitions import independence_bound, independence_table, pooled_transitions

ANSWER = {"Y": "Yes", "N": "No", "-": None}


def records_from_pairs(moves: list[tuple[str, str]]) -> pd.DataFrame:
    """Long records from one (nothink, think) pair state per pair; a state spells (alpha, alpha'), "-" unparsable."""
    rows = [
        {"pair_id": i, "side": side, "arm": arm, "answer": ANSWER[letter], "p_yes": float(letter == "Y")}
        for i, (nothink, think) in enumerate(moves)
        for arm, state in (("nothink", nothink), ("think", think))
        for side, letter in zip(SIDES, state)
    ]
    return pd.DataFrame(rows)


def expand(counts: dict[tuple[str, str], int]) -> list[tuple[str, str]]:
    return [move for move, n in counts.items() for _ in range(n)]


# Six pairs, (nothink, think): a, c, c, a, b, b; a seventh whose alpha' think output does not parse.
HAND = [("NN", "NN"), ("NN", "YN"), ("NN", "NY"), ("YY", "YY"), ("YN", "YY"), ("NY", "NN"), ("NN", "Y-")]


@pytest.fixture(scope="module")
def hand():
    return transitions(records_from_pairs(HAND))


def test_hand_group_level_transitions_and_their_gap(hand):
    m = hand["metrics"]
    # alpha: from N (pairs 1,2,3,6) -> N,Y,N,N; from Y (4,5) -> Y,Y.
    # alpha': from N (1,2,3,5) -> N,N,Y,Y; from Y (4,6) -> Y,N.
    assert (m["t_alpha_yy"], m["t_alpha_ny"], m["t_alpha_nn"]) == (1.0, 0.25, 0.75)
    assert (m["t_alpha_prime_yy"], m["t_alpha_prime_ny"]) == (0.5, 0.5)
    assert m["dp_yes_alpha"] == pytest.approx(3 / 6 - 2 / 6)
    assert m["dp_yes_alpha_prime"] == pytest.approx(3 / 6 - 2 / 6)
    assert (m["delta_t_yy"], m["delta_t_ny"], m["delta_t_max_abs"]) == (0.5, -0.25, 0.5)
    assert m["delta_dp_yes"] == pytest.approx(0.0)
    t_alpha = hand["tables"]["t_alpha"]
    assert t_alpha["n"].tolist() == [2, 4, 6]
    assert t_alpha.loc["total", ["Y", "N"]].tolist() == [3, 3]
    assert hand["tables"]["t_group"].loc["delta"].tolist() == pytest.approx([0.5, -0.25, 0.0])


def test_hand_pair_state_transitions_hold_cells_b_and_c(hand):
    m, tables = hand["metrics"], hand["tables"]
    assert m["n_pairs"] == 6
    assert (m["tpair_nn_nn"], m["tpair_nn_m"], m["tpair_yy_yy"]) == pytest.approx((1 / 3, 2 / 3, 1.0))
    assert (m["tpair_m_nn"], m["tpair_m_yy"], m["tpair_m_m"]) == (0.5, 0.5, 0.0)
    assert (m["tpair_split_nn_yn"], m["tpair_split_yn_yy"], m["tpair_split_ny_nn"]) == pytest.approx((1 / 3, 1.0, 1.0))
    assert tables["tpair"]["n"].tolist() == [3, 1, 2, 6]
    assert tables["tpair"].loc["total", ["NN", "YY", "M"]].tolist() == [2, 2, 2]
    assert tables["tpair_split"].loc["total", ["YN", "NY"]].tolist() == [1, 1]
    # cell c = {NN,YY}->M = pairs 2, 3; cell b = M->{NN,YY} = pairs 5, 6
    assert (m["c_actual"], m["b_actual"]) == (2, 2)
    assert (m["n_nothink_m"], m["n_think_m"], m["n_nothink_yn"], m["n_think_ny"]) == (2, 2, 1, 1)


def test_hand_independence_bound(hand):
    m = hand["metrics"]
    # p = (1/4 + 1/2) / 2, q = (0 + 1/2) / 2; |NN| = 3, |YY| = 1, |M| = 2
    assert (m["ind_p"], m["ind_q"]) == (0.375, 0.25)
    assert m["c_ind"] == pytest.approx(2 * 0.375 * 0.625 * 3 + 2 * 0.25 * 0.75 * 1)  # 1.78125
    assert m["b_ind"] == pytest.approx((0.375 * 0.75 + 0.25 * 0.625) * 2)  # 0.875
    assert (m["c_ind_ratio"], m["b_ind_ratio"]) == pytest.approx((1.78125 / 2, 0.875 / 2))
    assert (m["c_b_ratio_ind"], m["c_b_ratio_actual"]) == pytest.approx((1.78125 / 0.875, 1.0))


def test_per_side_filter_keeps_instance_whose_partner_failed_to_parse(hand):
    instances = complete_instances(records_from_pairs(HAND), "think", "nothink")
    assert ("alpha", 6) in instances.index and ("alpha_prime", 6) not in instances.index
    m = hand["metrics"]
    # 12 instances of the six complete pairs + pair 7's alpha (N -> Y)
    assert m["n_marginal"] == 13
    assert (m["t_marginal_yy"], m["t_marginal_ny"]) == pytest.approx((3 / 4, 4 / 9))
    assert m["dp_yes_marginal"] == pytest.approx(7 / 13 - 4 / 13)


# Table 4, Qwen3-32B Adult: integer counts rounding to the printed fractions, M split evenly-ish into YN / NY.
TABLE4_ADULT = {
    ("NN", "NN"): 3325, ("NN", "YY"): 131, ("NN", "YN"): 132, ("NN", "NY"): 132,
    ("YY", "NN"): 59, ("YY", "YY"): 1016, ("YY", "YN"): 49, ("YY", "NY"): 49,
    ("YN", "NN"): 16, ("YN", "YY"): 22, ("YN", "YN"): 10, ("YN", "NY"): 6,
    ("NY", "NN"): 15, ("NY", "YY"): 22, ("NY", "YN"): 8, ("NY", "NY"): 8,
}  # fmt: skip


def test_table4_qwen3_adult_pair_state_matrix_recovered():
    result = transitions(records_from_pairs(expand(TABLE4_ADULT)))
    tpair = result["tables"]["tpair"]
    published = {"NN": [0.894, 0.035, 0.071], "YY": [0.050, 0.866, 0.084], "M": [0.290, 0.411, 0.299]}
    for state, row in published.items():
        assert tpair.loc[state, ["NN", "YY", "M"]].round(3).tolist() == row
    assert tpair["n"].tolist() == [3720, 1173, 107, 5000]
    assert tpair.loc["total", ["NN", "YY", "M"]].tolist() == [3415, 1191, 394]
    m = result["metrics"]
    assert round(m["tpair_nn_m"], 3) == 0.071 and round(m["tpair_m_yy"], 3) == 0.411
    assert (m["c_actual"], m["b_actual"]) == (362, 75)  # Table 2: b = 75, c = 362 (c + d = 394)


# Table 12 rows from Tables 3, 10, 11 (P(Y|Y), P(Y|N) for alpha, alpha') and Tables 4, 13, 14 (|NN|, |YY|, |M|).
TABLE12 = {
    "qwen3_adult": ((0.889, 0.076), (0.903, 0.077), (3720, 1173, 107), (744, 18)),
    "qwen3_compas": ((0.998, 0.281), (0.997, 0.272), (3157, 1698, 145), (1272, 40)),
    "qwen3_credit": ((0.908, 0.012), (0.912, 0.011), (3170, 1802, 24), (367, 2)),
    "qwq_adult": ((0.980, 0.300), (0.988, 0.302), (4149, 690, 134 + 27), (1768, 50)),
    "qwq_compas": ((1.000, 0.525), (1.000, 0.515), (4981, 4, 14 + 1), (2487, 8)),
    "qwq_credit": ((0.977, 0.387), (0.961, 0.381), (4616, 244, 114 + 10), (2198, 49)),
    "r1_adult": ((0.968, 0.196), (0.977, 0.201), (3715, 1186, 68 + 30), (1246, 21)),
    "r1_compas": ((1.000, 0.215), (1.000, 0.203), (1356, 70, 0 + 4), (448, 1)),
    "r1_credit": ((1.000, 0.382), (1.000, 0.392), (4971, 14, 5 + 5), (2359, 4)),
}


def published_p_q(alpha: tuple[float, float], alpha_prime: tuple[float, float]) -> tuple[float, float]:
    """p = P(Y|N) and q = 1 - P(Y|Y), averaged over the two sides."""
    return (alpha[1] + alpha_prime[1]) / 2, 1 - (alpha[0] + alpha_prime[0]) / 2


# QwQ Adult is left out: the printed 3-decimal inputs give |b| ind. 49.49, Table 12 prints 50.
@pytest.mark.parametrize("cell", [cell for cell in TABLE12 if cell != "qwq_adult"])
def test_independence_bound_reproduces_table12(cell):
    alpha, alpha_prime, populations, (c_published, b_published) = TABLE12[cell]
    c_ind, b_ind = independence_bound(*published_p_q(alpha, alpha_prime), *populations)
    assert (round(c_ind), round(b_ind)) == (c_published, b_published)


# Table 12's remaining columns: actual |c|, |b|; ratios independence / actual; c/b independent and actual.
TABLE12_RATIOS = {
    "qwq_adult": ((444, 152), (3.98, 0.33, 36, 2.9)),
    "qwq_credit": ((598, 121), (3.68, 0.40, 45, 4.9)),
    "r1_adult": ((649, 77), (1.92, 0.27, 59, 8.4)),
    "r1_credit": ((487, 10), (4.84, 0.39, 609, 48.7)),
}


@pytest.mark.parametrize("cell", TABLE12_RATIOS)
def test_independence_table_reproduces_table12_ratios(cell):
    alpha, alpha_prime, populations, _ = TABLE12[cell]
    (c_actual, b_actual), (c_ratio, b_ratio, cb_ind, cb_actual) = TABLE12_RATIOS[cell]
    row = independence_table(*published_p_q(alpha, alpha_prime), *populations, c_actual, b_actual).iloc[0]
    assert (round(row["c_ind_ratio"], 2), round(row["b_ind_ratio"], 2)) == (c_ratio, b_ratio)
    assert (round(row["c_b_ratio_ind"]), round(row["c_b_ratio_actual"], 1)) == (cb_ind, cb_actual)


def records_from_instances(counts: dict[tuple[str, str], int]) -> pd.DataFrame:
    """Long records from one (nothink, think) answer per instance; consecutive instances form a pair."""
    before, after = (np.array(letters) for letters in zip(*expand(counts)))
    i = np.arange(len(before))
    base = pd.DataFrame({"pair_id": i // 2, "side": np.array(SIDES)[i % 2]})
    arms = {"nothink": before, "think": after}
    records = pd.concat([base.assign(arm=arm, answer=pd.Series(a).map(ANSWER)) for arm, a in arms.items()],
                        ignore_index=True)
    return records.assign(p_yes=(records["answer"] == "Yes").astype(float))


def test_appendix_g_pooled_marginal():
    counts = {("Y", "Y"): 13_891, ("Y", "N"): 705, ("N", "Y"): 20_216, ("N", "N"): 49_616}
    result = transitions(records_from_instances(counts))
    m = result["metrics"]
    assert m["n_marginal"] == 84_428
    published = {"yy": 0.952, "yn": 0.048, "ny": 0.289, "nn": 0.711}
    assert {key: round(m[f"t_marginal_{key}"], 3) for key in published} == published
    t = result["tables"]["t_marginal"]
    assert t["n"].tolist() == [14_596, 69_832, 84_428]
    assert t.loc["total", ["Y", "N"]].tolist() == [13_891 + 20_216, 705 + 49_616]


def test_pooled_transitions_per_cell_and_pooled():
    first = records_from_pairs(HAND).assign(model="m1", dataset="adult")
    second = records_from_pairs([("NN", "YY"), ("YY", "YN"), ("YN", "YN")]).assign(model="m2", dataset="compas")
    pooled = pooled_transitions(pd.concat([first, second]))
    tpair = pooled["tpair"]
    pd.testing.assert_frame_equal(tpair.loc[("m1", "adult")], transitions(first)["tables"]["tpair"])
    assert tpair.loc[("m2", "compas"), "n"].tolist() == [1, 1, 1, 3]
    assert tpair.loc[("pooled", "pooled"), "n"].tolist() == [4, 2, 3, 9]
    assert tpair.loc[("pooled", "pooled", "total"), ["NN", "YY", "M"]].tolist() == [2, 3, 4]
    assert tpair.at[("pooled", "pooled", "NN"), "M"] == pytest.approx(2 / 4)
    assert pooled["t_marginal"].at[("pooled", "pooled", "total"), "n"] == 13 + 6
    assert pooled["tpair_split"].at[("pooled", "pooled", "YN"), "YN"] == pytest.approx(1 / 2)


def test_figures_annotate_probabilities_and_counts():
    tables = transitions(records_from_pairs(expand(TABLE4_ADULT)))["tables"]
    fig = tpair_heatmap(tables["tpair_split"])
    labels = [text.get_text() for text in fig.axes[0].texts]
    assert "0.894\n(3,325)" in labels and len(labels) == 16
    assert fig.axes[0].get_yticklabels()[0].get_text() == "NN (n=3,720)"
    side_by_side = group_transition_heatmaps(tables["t_alpha"], tables["t_alpha_prime"])
    assert [len(ax.texts) for ax in side_by_side.axes[:2]] == [4, 4]
    side_by_side.savefig(io.BytesIO(), format="png")


def test_missing_arm_is_named():
    with pytest.raises(ValueError, match="think"):
        complete_instances(records_from_pairs(HAND).query("arm == 'nothink'"), "think", "nothink")
