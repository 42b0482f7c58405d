"""CDPG analysis against a hand-built example whose every number is worked out below."""

import matplotlib
import numpy as np
import pandas as pd
import pytest
from scipy import stats

from fairaudit.analysis.cdpg import cdpg, pair_slopes, segment_cuts, trajectories
from fairaudit.analysis.cdpg_figures import (
    anchor_mover_figure,
    cdpg_figures,
    depth_by_cell_figure,
    k_sensitivity_figure,
)
from fairaudit.errors import AuditError

# pair_id: (cell, nothink (answer, P(Yes)) per side, think (answer, P(Yes)) per side,
#           K=2 depth P(Yes) alpha [k1, k2], alpha' [k1, k2]); k=K equals the think P(Yes).
PAIRS = {
    1: ("a", [("Yes", 0.8), ("Yes", 0.7)], [("Yes", 0.9), ("Yes", 0.9)], [0.6, 0.9], [0.8, 0.9]),
    2: ("b", [("Yes", 0.7), ("No", 0.3)], [("No", 0.1), ("No", 0.2)], [0.5, 0.1], [0.3, 0.2]),
    3: ("c", [("No", 0.4), ("No", 0.35)], [("Yes", 0.95), ("No", 0.15)], [0.6, 0.95], [0.3, 0.15]),
    4: ("c", [("Yes", 0.6), ("Yes", 0.65)], [("Yes", 0.9), ("No", 0.2)], [0.7, 0.9], [0.6, 0.2]),
    5: ("d", [("Yes", 0.6), ("No", 0.4)], [("No", 0.3), ("Yes", 0.8)], [0.4, 0.3], [0.6, 0.8]),
}
# |CDPG_k| for k = 0, 1, 2 (k=0 from nothink):
#   1 (a): 0.10, 0.20, 0.00    slope on k/K in {0.5, 1}: (y2 - y1) / 0.5 = -0.4
#   2 (b): 0.40, 0.20, 0.10    slope -0.2
#   3 (c): 0.05, 0.30, 0.80    slope  1.0
#   4 (c): 0.05, 0.10, 0.70    slope  1.2   -> cell c mean trajectory 0.05, 0.20, 0.75, slope 1.1
#   5 (d): 0.20, 0.20, 0.50    slope  0.6
# K=4: alpha' stays at its think P(Yes) and alpha follows K4_ALPHA (ending at its think P(Yes)).
K4_ALPHA = {
    1: [0.9, 0.9, 0.9, 0.9],
    2: [0.3, 0.25, 0.15, 0.1],
    3: [0.35, 0.55, 0.75, 0.95],
    4: [0.5, 0.6, 0.8, 0.9],
    5: [0.3, 0.3, 0.3, 0.3],
}
# K=4 |CDPG_k|: 1: 0,0,0,0 (slope 0); 2: .1,.05,.05,.1 (slope 0);
#   3: .2,.4,.6,.8 (slope .8); 4: .3,.4,.6,.7 (slope .56); 5: .5,.5,.5,.5 (slope 0)
#   slope = sum((x - 0.625) y) / 0.3125, e.g. pair 4: (-.375*.3 - .125*.4 + .125*.6 + .375*.7) / .3125 = .56


def build_records(pair_ids=PAIRS):
    rows = []
    for pid in pair_ids:
        _, nothink, think, _, _ = PAIRS[pid]
        for arm, sides in (("nothink", nothink), ("think", think)):
            for side, (answer, p) in zip(("alpha", "alpha_prime"), sides):
                tokens = 0 if arm == "nothink" else 40
                row = {"pair_id": pid, "side": side, "arm": arm, "answer": answer, "p_yes": p, "trace_tokens": tokens}
                rows.append(row)
    # a pair whose think answer did not parse: dropped everywhere
    for arm in ("nothink", "think"):
        for side in ("alpha", "alpha_prime"):
            answer = None if (arm, side) == ("think", "alpha") else "Yes"
            rows.append({"pair_id": 6, "side": side, "arm": arm, "answer": answer, "p_yes": 0.5, "trace_tokens": 40})
    return pd.DataFrame(rows)


def build_depth(pair_ids=PAIRS):
    rows = []
    for pid in list(pair_ids) + [6]:
        k2 = PAIRS[pid][3:] if pid in PAIRS else ([0.5, 0.5], [0.5, 0.5])
        k4 = (K4_ALPHA[pid], [PAIRS[pid][2][1][1]] * 4) if pid in PAIRS else ([0.5] * 4, [0.5] * 4)
        for K, sides in ((2, k2), (4, k4)):
            for side, probs in zip(("alpha", "alpha_prime"), sides):
                for k, p in enumerate(probs, 1):
                    rows.append({"pair_id": pid, "side": side, "arm": "think", "K": K, "k": k, "p_yes_k": p})
    return pd.DataFrame(rows)


def run(**kwargs):
    return cdpg(build_depth(), build_records(), k_list=(2, 4), K=2, seed=0, **kwargs)


def test_segment_cuts_are_equal_token_and_end_at_the_trace_length():
    assert segment_cuts(500, 10) == [50, 100, 150, 200, 250, 300, 350, 400, 450, 500]
    assert segment_cuts(12, 5) == [3, 5, 8, 10, 12]
    for n, K in ((12, 5), (97, 10), (1000, 20)):
        sizes = np.diff([0] + segment_cuts(n, K))
        assert sizes.sum() == n and sizes.max() - sizes.min() <= 1


def test_segment_cuts_of_traces_shorter_than_k_repeat_and_never_cut_at_zero():
    assert segment_cuts(3, 5) == [1, 2, 2, 3, 3]
    assert segment_cuts(1, 4) == [1, 1, 1, 1]
    assert segment_cuts(0, 3) == [0, 0, 0]
    with pytest.raises(ValueError, match="K >= 1"):
        segment_cuts(10, 0)


def test_trajectories_hold_cdpg_per_depth_with_the_baseline_at_k0():
    traj = trajectories(build_depth(), build_records(), Ks=[2]).set_index(["pair_id", "k"])
    assert sorted(traj.index.get_level_values("pair_id").unique()) == [1, 2, 3, 4, 5]  # pair 6 unparsed
    expected = {
        1: [0.1, -0.2, 0.0], 2: [0.4, 0.2, -0.1], 3: [0.05, 0.3, 0.8], 4: [-0.05, 0.1, 0.7], 5: [0.2, -0.2, -0.5],
    }
    for pid, cdpg_k in expected.items():
        np.testing.assert_allclose(traj.loc[pid, "cdpg"].to_numpy(), cdpg_k, atol=1e-12)
        np.testing.assert_allclose(traj.loc[pid, "depth"].to_numpy(), [0.0, 0.5, 1.0])
    assert traj.loc[(4, 0), "p_alpha"] == 0.6 and traj.loc[(4, 0), "p_alpha_prime"] == 0.65


def test_final_depth_gap_equals_d_disp_of_the_think_arm():
    traj = trajectories(build_depth(), build_records(), Ks=[2, 4])
    final = traj[traj["k"] == traj["K"]].groupby("pair_id")["abs_cdpg"].agg(["min", "max"])
    d_disp = {1: 0.0, 2: 0.1, 3: 0.8, 4: 0.7, 5: 0.5}
    np.testing.assert_allclose(final["min"], list(d_disp.values()), atol=1e-12)
    np.testing.assert_allclose(final["max"], list(d_disp.values()), atol=1e-12)


def test_final_depth_gap_that_departs_from_d_disp_raises_naming_the_pair():
    records = build_records()
    think_alpha_3 = (records["pair_id"] == 3) & (records["arm"] == "think") & (records["side"] == "alpha")
    records.loc[think_alpha_3, "p_yes"] = 0.95 + 1e-6
    with pytest.raises(AuditError, match=r"on 1 of 5 \(pair, K\) trajectories \(largest 1e-06 at pair_id=3, K=2\)"):
        trajectories(build_depth(), records, Ks=[2])


def test_mean_abs_cdpg_per_cell_and_depth():
    table = run()["tables"]["cdpg_by_cell"]
    k2 = table[table["K"] == 2].set_index(["cell", "k"])
    expected = {"a": [0.1, 0.2, 0.0], "b": [0.4, 0.2, 0.1], "c": [0.05, 0.2, 0.75], "d": [0.2, 0.2, 0.5]}
    for cell, means in expected.items():
        np.testing.assert_allclose(k2.loc[cell, "mean_abs_cdpg"].to_numpy(), means, atol=1e-12)
        assert list(k2.loc[cell, "n"]) == [2 if cell == "c" else 1] * 3
    np.testing.assert_allclose(k2.loc["c", "depth"].to_numpy(), [0.0, 0.5, 1.0])


def test_cell_slopes_and_their_t_interval():
    metrics = run()["metrics"]
    assert metrics["cdpg_slope_a"] == pytest.approx(-0.4)
    assert metrics["cdpg_slope_b"] == pytest.approx(-0.2)
    assert metrics["cdpg_slope_c"] == pytest.approx(1.1)
    assert metrics["cdpg_slope_d"] == pytest.approx(0.6)
    # cell c: two pairs with slopes 1.0 and 1.2, SD 0.1 sqrt(2), SE 0.1; t(0.975, 1) = 12.706
    half = stats.t.ppf(0.975, 1) * 0.1
    assert metrics["cdpg_slope_c_ci_low"] == pytest.approx(1.1 - half) == pytest.approx(-0.1706, abs=1e-4)
    assert metrics["cdpg_slope_c_ci_high"] == pytest.approx(1.1 + half) == pytest.approx(2.3706, abs=1e-4)
    assert np.isnan(metrics["cdpg_slope_a_ci_low"]) and np.isnan(metrics["cdpg_slope_a_ci_high"])  # one pair: no SD
    assert [metrics[f"cdpg_n_{c}"] for c in "abcd"] == [1, 1, 2, 1] and metrics["cdpg_n_pairs"] == 5
    # every cell here has fewer than 10 pairs: its interval is flagged in the metrics and the slopes table
    assert all(metrics[f"cdpg_slope_{c}_ci_few"] == 1.0 for c in "abcd")
    assert run()["tables"]["cdpg_slopes"]["few"].all()


def test_cell_slope_is_the_slope_of_the_cell_mean_trajectory():
    traj = trajectories(build_depth(), build_records(), Ks=[4])
    cell_c = traj[(traj["cell"] == "c") & (traj["k"] >= 1)]
    mean_curve = cell_c.groupby("depth")["abs_cdpg"].mean()
    fitted = np.polyfit(mean_curve.index, mean_curve.to_numpy(), 1)[0]
    slopes = pair_slopes(traj).set_index("pair_id")["slope"]
    assert slopes[[3, 4]].mean() == pytest.approx(fitted)
    np.testing.assert_allclose(slopes.sort_index().to_numpy(), [0.0, 0.0, 0.8, 0.56, 0.0], atol=1e-12)


def test_k_sensitivity_reports_each_k_from_its_own_trajectories():
    result = run()
    metrics, table = result["metrics"], result["tables"]["cdpg_k_sensitivity"].set_index("cell")
    assert metrics["cdpg_slope_c_k2"] == pytest.approx(1.1)
    assert metrics["cdpg_slope_c_k4"] == pytest.approx(0.68)  # mean of 0.8 and 0.56
    assert metrics["cdpg_slope_a_k4"] == pytest.approx(0.0)
    assert list(table.columns) == ["n_k2", "slope_k2", "n_k4", "slope_k4"]
    assert table.loc["c", "slope_k4"] == pytest.approx(0.68) and table.loc["c", "n_k4"] == 2
    assert table.loc["d", "slope_k2"] == pytest.approx(0.6)


def test_anchor_keeps_its_baseline_answer_and_the_mover_changes():
    sides = run()["tables"]["cdpg_sides"]
    k2 = sides[sides["K"] == 2].set_index(["cell", "anchor_answer", "role"])
    # pair 2 (b): alpha' keeps No (anchor), alpha moves Yes -> No
    np.testing.assert_allclose(k2.loc[("b", "No", "anchor"), "p_yes"], [0.3, 0.3, 0.2])
    np.testing.assert_allclose(k2.loc[("b", "No", "mover"), "p_yes"], [0.7, 0.5, 0.1])
    # pair 3 (c): alpha' keeps No, alpha moves to Yes; pair 4 (c): alpha keeps Yes, alpha' moves to No
    np.testing.assert_allclose(k2.loc[("c", "No", "anchor"), "p_yes"], [0.35, 0.3, 0.15])
    np.testing.assert_allclose(k2.loc[("c", "No", "mover"), "p_yes"], [0.4, 0.6, 0.95])
    np.testing.assert_allclose(k2.loc[("c", "Yes", "anchor"), "p_yes"], [0.6, 0.7, 0.9])
    np.testing.assert_allclose(k2.loc[("c", "Yes", "mover"), "p_yes"], [0.65, 0.6, 0.2])
    assert set(sides["cell"]) == {"b", "c"} and list(k2.loc[("c", "Yes", "mover"), "k"]) == [0, 1, 2]


def test_pooled_and_per_model_dataset_tables():
    records = pd.concat([build_records().assign(model="m", dataset=name) for name in ("adult", "compas")])
    depth = pd.concat([build_depth().assign(model="m", dataset=name) for name in ("adult", "compas")])
    # compas loses pair 4: cell c holds pair 3 alone there
    records = records[~((records["dataset"] == "compas") & (records["pair_id"] == 4))]
    result = cdpg(depth, records, k_list=(2, 4), K=2)
    slopes = result["tables"]["cdpg_slopes"].set_index(["model", "dataset", "K", "cell"])
    assert slopes.loc[("pooled", "pooled", 2, "c"), "slope"] == pytest.approx((1.0 + 1.2 + 1.0) / 3)
    assert slopes.loc[("m", "adult", 2, "c"), "slope"] == pytest.approx(1.1)
    assert slopes.loc[("m", "compas", 2, "c"), "slope"] == pytest.approx(1.0)
    assert slopes.loc[("pooled", "pooled", 2, "c"), "n"] == 3
    assert result["metrics"]["cdpg_n_pairs"] == 9
    assert result["metrics"]["cdpg_slope_c"] == pytest.approx(3.2 / 3)
    sensitivity = result["tables"]["cdpg_k_sensitivity"]
    assert list(sensitivity.columns[:3]) == ["model", "dataset", "cell"] and len(sensitivity) == 12


def test_missing_k_or_columns_are_named():
    with pytest.raises(AuditError, match=r"no trajectories for K=\[10\]; K values present: \[2, 4\]"):
        cdpg(build_depth(), build_records(), k_list=(2, 10), K=2)
    with pytest.raises(AuditError, match=r"lack column\(s\) \['p_yes_k'\]"):
        cdpg(build_depth().drop(columns="p_yes_k"), build_records(), k_list=(2,), K=2)


def test_a_trajectory_missing_a_depth_is_left_out():
    depth = build_depth()
    depth = depth[~((depth["pair_id"] == 1) & (depth["K"] == 2) & (depth["k"] == 1) & (depth["side"] == "alpha"))]
    metrics = cdpg(depth, build_records(), k_list=(2, 4), K=2)["metrics"]
    assert metrics["cdpg_n_a"] == 0 and np.isnan(metrics["cdpg_slope_a"]) and metrics["cdpg_n_pairs"] == 4
    assert metrics["cdpg_slope_a_k4"] == pytest.approx(0.0)  # its K=4 trajectory is complete


def test_figures_plot_the_tables():
    matplotlib.use("Agg")
    tables = run()["tables"]
    fig3 = depth_by_cell_figure(tables["cdpg_by_cell"], K=2)
    lines = {line.get_label(): line for line in fig3.axes[0].get_lines()}
    np.testing.assert_allclose(lines["c (n=2)"].get_ydata(), [0.2, 0.75])
    np.testing.assert_allclose(lines["c (n=2)"].get_xdata(), [0.5, 1.0])
    fig4 = anchor_mover_figure(tables["cdpg_sides"], K=2)
    assert [ax.get_title() for ax in fig4.axes] == ["cell b", "cell c"]
    mover = {line.get_label(): line for line in fig4.axes[1].get_lines()}["mover, anchor ends No (n=1)"]
    np.testing.assert_allclose(mover.get_ydata(), [0.4, 0.6, 0.95])
    fig6 = k_sensitivity_figure(tables["cdpg_by_cell"], k_list=(2, 4))
    assert len(fig6.axes) == 4 and [line.get_label() for line in fig6.axes[2].get_lines()] == ["K=2", "K=4"]
    assert set(cdpg_figures(tables, K=2, k_list=(2, 4))) == {"cdpg_by_cell", "cdpg_anchor_mover", "cdpg_k_sensitivity"}
    named = cdpg_figures(tables, K=2, k_list=(2, 4), arms=("think", "nothink"))
    label = "depth k/K into the think trace (0: nothink arm)"
    assert named["cdpg_by_cell"].axes[0].get_xlabel() == label
    assert {fig.get_supxlabel() for name, fig in named.items() if name != "cdpg_by_cell"} == {label}  # one per figure


def test_slope_from_k0_fits_the_baseline_arm_too():
    """cdpg_slope_<cell>_from0 fits k = 0..K (k = 0: nothink), beside the k = 1..K slope of the main text.

    K=2, depths 0, .5, 1: slope = (y2 - y0) / 1 ... exactly sum((x - .5) y) / .5:
    pair 3: (-.5*.05 + .5*.80) / .5 = .75; pair 4: (-.5*.05 + .5*.70) / .5 = .65 -> cell c .70, SE .05.
    """
    result = run()
    metrics = result["metrics"]
    assert metrics["cdpg_slope_c_from0"] == pytest.approx(0.70)
    assert metrics["cdpg_slope_c"] == pytest.approx(1.1)
    assert metrics["cdpg_slope_a_from0"] == pytest.approx(-0.1)
    assert metrics["cdpg_slope_b_from0"] == pytest.approx(-0.3)
    assert metrics["cdpg_slope_d_from0"] == pytest.approx(0.3)
    half = stats.t.ppf(0.975, 1) * 0.05
    assert metrics["cdpg_slope_c_from0_ci_low"] == pytest.approx(0.70 - half)
    assert metrics["cdpg_slope_c_from0_ci_high"] == pytest.approx(0.70 + half)
    from0 = result["tables"]["cdpg_slopes_from0"].set_index(["K", "cell"])
    assert from0.loc[(4, "c"), "n"] == 2


def test_k_sensitivity_on_a_rerun_subsample():
    """Appendix C refitted Table 6 on a subsample; the headline slopes keep every pair."""
    full = run()
    sub = run(k_sensitivity_subsample=3)
    again = run(k_sensitivity_subsample=3)
    table = sub["tables"]["cdpg_k_sensitivity"]
    assert table["n_k2"].sum() == table["n_k4"].sum() == 3
    assert table.equals(again["tables"]["cdpg_k_sensitivity"])
    assert sub["metrics"]["cdpg_slope_c"] == full["metrics"]["cdpg_slope_c"] == pytest.approx(1.1)
    assert run(k_sensitivity_subsample=50)["tables"]["cdpg_k_sensitivity"].equals(full["tables"]["cdpg_k_sensitivity"])


def test_a_cell_with_three_pairs_is_flagged_and_one_with_ten_is_not():
    from fairaudit.analysis.cdpg import _cell_slopes

    slopes = pd.DataFrame({"K": 10, "cell": ["c"] * 3 + ["d"] * 10, "slope": np.linspace(0.0, 1.0, 13)})
    table = _cell_slopes(slopes).set_index("cell")
    assert table.loc["c", ["n", "few"]].tolist() == [3, True] and table.loc["d", ["n", "few"]].tolist() == [10, False]
