"""benchmarks/calibration.py at a tiny size: the planted truth is exact where it can be worked by hand and agrees
with a simulation of the same model elsewhere, the mock plants what the truth assumes, coverage and rejection
are counted right, and a few dozen real studies land where analysis/power.py says they should."""

from __future__ import annotations

import argparse
import math
import os
import sys
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from scipy.special import expit, logit

from conftest import REPO
from fairaudit.analysis.position import length_bins
from fairaudit.analysis.power import (
    cell_gap_power,
    correlation_power,
    expected_wilson_width,
    mcnemar_power,
    paired_gap_power,
)
from fairaudit.analysis.stats import partial_correlation
from warm import run_python

sys.path.insert(0, str(REPO))
from benchmarks import calibration as bench  # noqa: E402
from benchmarks import calibration_cdpg as cdpg_bench  # noqa: E402
from benchmarks import calibration_influence as influence_bench  # noqa: E402
from benchmarks import calibration_position as position_bench  # noqa: E402
from benchmarks import exact_coverage  # noqa: E402
from benchmarks.calibration_truth import (  # noqa: E402
    Plant,
    cells,
    counterfactual_truth,
    gap_difference_sd,
    influence_rate,
    p_gap,
    simulated_truth,
    wilson_coverage,
)


def phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def test_without_a_pair_spread_the_cells_are_the_flip_probabilities_at_zero():
    """L = 0: a side answers Yes with Phi(+-d/2), so a pair flips with q^2 + (1-q)^2, q = Phi(d/2)."""
    same = cells(Plant(effect=0.0, base_sd=0.0, side_sd=1.0))
    assert (same["b"], same["c"], same["d"]) == pytest.approx((0.25, 0.25, 0.25), abs=1e-12)
    q_b, q_t = phi(0.5), phi(1.5)   # effect 1 under nothink, 1 + 2 under think, side_sd 1
    f_b, f_t = q_b ** 2 + (1 - q_b) ** 2, q_t ** 2 + (1 - q_t) ** 2
    found = cells(Plant(thinking_gap=2.0, effect=1.0, base_sd=0.0, side_sd=1.0))
    assert found["b"] == pytest.approx(f_b * (1 - f_t), abs=1e-12)
    assert found["c"] == pytest.approx((1 - f_b) * f_t, abs=1e-12)
    assert p_gap(0.0, 2.0, 1e-9) == pytest.approx(expit(1.0) - expit(-1.0), abs=1e-7)


def test_the_quadrature_agrees_with_a_simulation_of_the_same_model():
    plant = Plant(thinking_gap=1.0, trace_sd=0.7)
    exact, simulated = counterfactual_truth(plant), simulated_truth(plant, 400_000, seed=3)
    for name, value in simulated.items():   # 400k draws: an SE of at most 0.0008 on these shares and means
        assert exact[name] == pytest.approx(value, abs=0.003), name
    null = counterfactual_truth(Plant())
    assert null["p_b"] == pytest.approx(null["p_c"], abs=1e-14) and null["delta_p_gap"] == pytest.approx(0, abs=1e-14)
    assert counterfactual_truth(Plant(), degree=32)["p_gap_think"] == pytest.approx(null["p_gap_think"], abs=1e-6)


def test_the_gap_differences_sd_vanishes_without_spread_and_matches_the_simulated_gaps():
    """No pair spread and no side draw: every pair's |gap| is expit(+-d/2) apart under each arm, a constant."""
    assert gap_difference_sd(Plant(thinking_gap=1.0, base_sd=0.0, side_sd=1e-12), draws=1000) < 1e-9
    plant = Plant(thinking_gap=1.5)
    first, second = gap_difference_sd(plant, 200_000, 1), gap_difference_sd(plant, 200_000, 2)
    assert first == pytest.approx(second, rel=0.01) and 0.2 < first < 0.3   # 0.242 at 2M draws


@pytest.mark.slow
def test_the_mock_plants_the_gaps_the_truth_assumes(tmp_path, data_root):
    """Without side_sd each reading's logit gap is exactly effect (nothink) and effect + thinking gap (think);
    with it the gaps spread by sqrt(2) side_sd and the pair's logit is shared by the arms."""
    pairs = bench.adult_pairs(60, 5, str(data_root))
    assert pairs["pair_id"].nunique() == 60 and pairs[pairs["side"] == "alpha"]["user_message"].is_unique
    for side_sd in (0.0, 1.0):
        plant = Plant(thinking_gap=2.0, side_sd=side_sd)
        records = bench.counterfactual_records(plant, pairs, 5, tmp_path / str(side_sd))
        wide = records.assign(logit=logit(records["p_yes"])).pivot_table(index="pair_id", columns=["arm", "side"],
                                                                         values="logit")
        gap = {arm: wide[(arm, "alpha")] - wide[(arm, "alpha_prime")] for arm in ("think", "nothink")}
        if side_sd == 0.0:
            np.testing.assert_allclose(gap["nothink"], 0.5, atol=1e-9)
            np.testing.assert_allclose(gap["think"], 2.5, atol=1e-9)
            total = wide.T.groupby(level="arm").sum().T
            np.testing.assert_allclose(total["think"], total["nothink"], atol=1e-9)   # trace_sd 0: one L
        else:
            assert 1.0 < gap["nothink"].std() < 1.9 and 1.5 < gap["think"].mean() < 3.5
    assert (records["trace_tokens"][records["arm"] == "think"] == bench.TRACE).all()


@pytest.mark.slow
def test_coverage_and_rejections_are_counted_by_hand():
    assert bench.covers(0.1, 0.3, 0.3) and bench.covers(0.1, 0.3, 0.1) and not bench.covers(0.1, 0.3, 0.31)
    assert not bench.covers(math.inf, math.inf, 1.0) and not bench.covers(math.nan, 0.3, 0.2)
    assert bench.covers(0.5, math.inf, 1.0)
    truth = counterfactual_truth(Plant())
    rows = pd.DataFrame({"thinking_gap": 0.0, "pairs": 50, "mcnemar_log10_p": [-3.0, -1.31, -1.30, 0.0],
                         **{f"{n}_ci_low": truth[n] - 0.01 for n in bench.INTERVALS},
                         **{f"{n}_ci_high": truth[n] + 0.01 for n in bench.INTERVALS}})
    rows.loc[3, "p_gap_think_ci_low"] = truth["p_gap_think"] + 0.001   # one study misses
    table = bench.summary(rows).iloc[0]
    assert table["rejected_share"] == 0.5   # log10(0.05) = -1.301: -3.0 and -1.31 reject, -1.30 does not
    assert table["p_gap_think_share"] == 0.75 and table["delta_d_cf_share"] == 1.0
    assert table["predicted"] == pytest.approx(mcnemar_power(50, truth["p_b"], truth["p_c"]))
    assert table["gap_excludes"] == 0.0 and table["gap_predicted"] == pytest.approx(0.05)   # [-0.01, 0.01]; no gap
    assert bench.pooled_coverage(rows)["p_gap_think"]["share"] == 0.75


@pytest.mark.slow
def test_a_few_dozen_real_studies_reject_and_cover_as_planned():
    """20 studies of 40 pairs at a thinking gap of 2.5 (the benchmark's table holds the null and the other gaps)."""
    studies, pairs = 20, 40
    rows = bench.run_plant(2.5, studies, pairs, 200, seed=7)
    assert len(rows) == studies and (rows["n_pairs"] == pairs).all()
    table = bench.summary(rows).iloc[0]
    predicted = mcnemar_power(pairs, table["p_b"], table["p_c"])
    assert predicted == pytest.approx(0.822, abs=0.001)   # power.py at the planted cells
    low, high = stats.binom.ppf([0.0005, 0.9995], studies, predicted)   # 99.9% of what 20 studies can show
    assert low <= table["rejected_share"] * studies <= high
    for name in bench.INTERVALS[:4]:   # a 95% interval holds its truth in at least 14 of 20 studies 999 times in 1000
        assert table[f"{name}_share"] * studies >= stats.binom.ppf(0.001, studies, 0.95), name


@pytest.mark.slow
def test_the_table_shows_prediction_measurement_and_coverage():
    rows = pd.DataFrame({"thinking_gap": [0.0, 0.0], "pairs": 50, "mcnemar_log10_p": [-2.0, 0.0],
                         **{f"{n}_ci_{end}": [0.0, 0.0] for n in bench.INTERVALS for end in ("low", "high")}})
    table = bench.summary(rows)   # [0, 0] holds the deltas' truth at the null (0) and no other
    lines = bench.markdown(table, bench.pooled_coverage(rows)).splitlines()
    assert lines[0].startswith("| thinking gap (logit) | p_b | p_c | pairs | studies | predicted (%)")
    assert lines[2].startswith("| 0 | 0.1338 | 0.1338 | 50 | 2 | 2.6 | 50.0 [1.3, 98.7] | +47.4 |")
    assert lines[-1].startswith("| all | 0.0 [0.0, 84.2] | 0.0 [0.0, 84.2] | 100.0 [15.8, 100.0] |")
    exact = exact_coverage.ratio_study_coverage(50, table["p_b"][0], table["p_c"][0])
    assert 0.95 * (1 - (1 - 2 * table["p_b"][0]) ** 50) <= exact < 1   # Clopper-Pearson's floor, given b + c > 0
    assert lines[-2].endswith(f"(truth 1; exact {100 * exact:.1f}) |")   # what the exact interval should cover


def test_the_influence_truth_is_a_half_without_a_shift_and_agrees_with_a_simulation():
    assert influence_rate(0.0, 0.0) == pytest.approx(0.5, abs=1e-9)   # Delta symmetric about 0
    z_cf, z_nat = np.random.default_rng(1).standard_normal((2, 400_000))
    delta = 2 * np.exp(z_cf / 4) - 2 * np.exp(z_nat / 4) + 0.5
    assert influence_rate(0.5, 0.05) == pytest.approx((delta > 0.05).mean(), abs=0.003)
    assert influence_rate(50.0, 0.05) == pytest.approx(1.0, abs=1e-12)


def test_wilsons_exact_coverage_by_hand_at_two_contrasts():
    """n = 2, rate 0.5: Wilson at k = 0 is [0, 0.658], at 1 [0.095, 0.905], at 2 [0.342, 1]: all hold 0.5.
    Rate 0.2: k = 2's interval [0.342, 1] misses it, so the coverage is 1 - 0.2^2."""
    assert wilson_coverage(2, 0.5) == pytest.approx(1.0)
    assert wilson_coverage(2, 0.2) == pytest.approx(1 - 0.04)


def test_the_coverage_table_is_each_intervals_exact_coverage_per_n():
    """Wilson at 25 contrasts covers 91.1 to 97.9% over the 97 rates (16 outside 93-97%), the same sums as
    `wilson_coverage`; the exact c/b interval never covers less than 95% at any number of discordant pairs."""
    wilson = exact_coverage.wilson_row(25)
    assert len(wilson) == 97 and (round(100 * wilson.min(), 1), round(100 * wilson.max(), 1)) == (91.1, 97.9)
    assert wilson[30] == pytest.approx(wilson_coverage(25, exact_coverage.RATES[30]), rel=1e-12)
    assert ((wilson < 0.93) | (wilson > 0.97)).sum() == 16
    assert all(exact_coverage.ratio_row(n).min() >= 0.95 for n in (3, 10, 25))
    assert exact_coverage.markdown([5]).splitlines()[2].startswith("| Wilson 95% | 5 | ")


@pytest.mark.slow
def test_a_few_dozen_real_influence_studies_land_on_the_planted_rate(data_root):
    studies, items = 16, 25
    rows = influence_bench.run_shift(1.0, studies, items, 3, str(data_root))
    table = influence_bench.summary(rows)
    assert (table["contrasts"] == items).all() and (table["studies"] == studies).all()
    for r in table.itertuples():   # every contrast finds a donor; k ~ Binomial(25, truth) in each study
        se = math.sqrt(r.truth * (1 - r.truth) / (studies * items))
        assert abs(r.mean_rate - r.truth) < 4 * se, r.rate
        assert r.coverage * studies >= stats.binom.ppf(0.001, studies, r.exact), r.rate
        assert r.width == pytest.approx(r.width_predicted, abs=0.03), r.rate   # the width varies by ~0.05 per study
    assert table.loc[0, "truth"] == pytest.approx(influence_rate(1.0, 0.0))
    assert table.loc[0, "width_predicted"] == pytest.approx(expected_wilson_width(items, table.loc[0, "truth"]))


@pytest.mark.slow
def test_the_script_prints_every_probes_tables(tmp_path):
    tiny = ["--rows", str(tmp_path / "rows"), "--studies", "2", "--pairs", "20", "--gaps", "0", "2", "--n-boot", "100",
            "--influence-studies", "2", "--items", "10", "--shifts", "1", "--cdpg-studies", "2", "--cdpg-pairs", "20",
            "--cdpg-gaps", "1", "--position-studies", "2", "--questions", "20", "--growths", "30"]
    done = run_python([sys.executable, "benchmarks/calibration.py", *tiny], cwd=REPO, env=dict(os.environ),
                      timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("counterfactual on backend=mock: 2 studies x 20 pairs per planted thinking gap")
    assert [line.split(" | ")[0] for line in lines[3:5]] == ["| 0", "| 2"]
    start = lines.index("influence on backend=mock (unmasked): 2 studies x 10 questions per planted shift, seed 0; "
                        "Wilson intervals at 0.95")
    assert lines[start + 1].startswith("| planted shift (nats/token) | rate | planted rate |")
    assert [line.split(" | ")[1] for line in lines[start + 3:start + 7]] == [
        "influence A->B", "influence B->A", "substantive A->B", "substantive B->A"]
    start = lines.index("cdpg on backend=mock (K=10): 2 studies x 20 pairs per planted thinking gap, seed 0; "
                        "Student t intervals at 0.95")
    assert lines[start + 1].startswith("| thinking gap (logit) | planted slope in c | SD of pair slopes |")
    assert lines[start + 3].startswith("| 1 | 0.1865 |")
    start = lines.index("position on backend=mock (reason arm): 2 studies x 20 questions per planted growth, seed 0; "
                        "partial correlation's test at 0.05, intervals at 0.95")
    assert lines[start + 3].startswith("| 30 | 0.3111 | 20 | 2 | 25.1 |") and lines[start + 7].startswith("| 30 | ")
    assert lines[start + 9].startswith("| planted growth | studies | pbs | pbs_q1 |")
    assert lines[start + 11].startswith("| 30 | 2 | ") and lines[start + 12].startswith("| all | 2 | ")
    rows = str(tmp_path / "rows-position.csv")   # the same studies twice, as runs of two seeds are pooled
    pooled = run_python([sys.executable, "benchmarks/calibration.py", "--pool", rows, rows], cwd=REPO,
                        env=dict(os.environ), timeout=120)
    assert pooled.returncode == 0, pooled.stderr[-2000:]
    lines = pooled.stdout.splitlines()
    assert lines[0] == "position: the 4 studies of 2 files pooled" and lines[3].startswith("| 30 | 0.3111 | 20 | 4 |")


@pytest.mark.slow
def test_the_cdpg_truth_agrees_with_the_cells_and_a_simulation_and_averages_to_no_slope_at_no_gap():
    """Its cells are the counterfactual truth's (the cut at K is the think arm's read); weighted by them, the cell
    slopes average to sum_k w_k E|CDPG_k|, which is 0 when the gap does not grow (every cut alike), though cells c and
    d, chosen by a flip at the last cut, are not."""
    plant = Plant(thinking_gap=1.0)
    truth, flips = cdpg_bench.cdpg_truth(plant, 40, 2), cells(plant)
    for cell in "abcd":
        assert truth[f"p_{cell}"] == pytest.approx(flips[cell], abs=1e-12), cell
    gaps, w = cdpg_bench.cut_gaps(plant, 40, 2), cdpg_bench.slope_weights()
    assert gaps[0] == pytest.approx(0.5 + 2 / 38) and gaps[-1] == pytest.approx(1.5)   # 4 tokens cut, 2 of them band
    assert w.sum() == pytest.approx(0, abs=1e-12) and w @ (np.arange(1, 11) / 10) == pytest.approx(1.0)
    mixture = sum(truth[f"p_{c}"] * truth[f"slope_{c}"] for c in "abcd")
    assert mixture == pytest.approx(sum(w_k * p_gap(2.0, d, 1.0) for w_k, d in zip(w, gaps)), abs=1e-9)
    null = cdpg_bench.cdpg_truth(Plant(), 40, 2)
    assert sum(null[f"p_{c}"] * null[f"slope_{c}"] for c in "abcd") == pytest.approx(0, abs=1e-12)
    assert null["slope_c"] == pytest.approx(0.0908, abs=1e-4)   # the flip at K chooses a wide last gap
    simulated = cdpg_bench.simulated_slopes(plant, 40, 2, draws=400_000, seed=4)
    for cell in "abcd":   # >= 40,000 pairs a cell, slope SD <= 0.21: an SE of at most 0.001
        assert truth[f"slope_{cell}"] == pytest.approx(simulated[f"slope_{cell}"], abs=0.004), cell


@pytest.mark.slow
def test_the_mock_plants_the_cut_gaps_the_cdpg_truth_assumes(tmp_path, data_root):
    """Without side_sd every pair's logit gap after cut k is exactly d_k, and the cut at K reads the think arm."""
    plant = Plant(thinking_gap=1.0, side_sd=0.0)
    pairs = bench.adult_pairs(12, 6, str(data_root))
    records, depth = cdpg_bench.cdpg_records(plant, pairs, 6, tmp_path)
    gaps = depth.assign(logit=logit(depth["p_yes_k"])).pivot_table(index=["pair_id", "k"], columns="side",
                                                                    values="logit")
    found = (gaps["alpha"] - gaps["alpha_prime"]).unstack("k").to_numpy()
    expected = cdpg_bench.cut_gaps(plant, *cdpg_bench._trace_and_opener())
    np.testing.assert_allclose(found, np.tile(expected, (12, 1)), atol=1e-9)
    assert sorted(depth["cut"].unique()) == list(range(4, 41, 4)) and len(records) == 48


@pytest.mark.slow
def test_cdpg_coverage_and_power_are_counted_by_hand():
    truth = cdpg_bench.mock_cdpg_truth(Plant())
    rows = pd.DataFrame({"thinking_gap": 0.0, "pairs": 30, "study": range(4),
                         **{f"{key}_{c}": np.nan for key in ("n", "slope", "low", "high") for c in "abcd"}})
    rows["n_c"], rows["slope_c"] = [10, 12, 1, 8], truth["slope_c"]
    rows["low_c"] = [truth["slope_c"] - 0.05, 0.01, truth["slope_c"], -0.2]   # the third: one pair, not counted
    rows["high_c"] = [truth["slope_c"] + 0.05, 0.05, truth["slope_c"], 0.3]   # truth 0.0908: the second misses
    table = cdpg_bench.summary(rows, draws=20_000, drawn=100).set_index("cell")
    c = table.loc["c"]
    assert (c["reported"], c["coverage_share"], c["excludes_0_share"]) == (3, pytest.approx(2 / 3),
                                                                           pytest.approx(2 / 3))
    assert c["mean_n"] == pytest.approx(31 / 4) and c["truth"] == truth["slope_c"]
    assert c["predicted"] == pytest.approx(np.mean([paired_gap_power(n, truth["slope_c"], c["sd"])
                                                    for n in (10, 12, 8)]))
    assert c["planned"] == pytest.approx(cell_gap_power(30, truth["p_c"], truth["slope_c"], c["sd"]))
    assert table.loc["a", "reported"] == 0 and "| 0 | 0.0908 |" in cdpg_bench.markdown(table.reset_index())


@pytest.mark.slow
def test_a_few_dozen_real_cdpg_studies_land_on_the_planted_slope():
    """12 studies of 60 pairs at a thinking gap of 1 (the benchmark's table holds the null and the other gaps)."""
    rows = cdpg_bench.run_gap(1.0, 12, 60, seed=7)
    truth = cdpg_bench.mock_cdpg_truth(Plant(thinking_gap=1.0))
    table = cdpg_bench.summary(rows, draws=200_000, drawn=2000).set_index("cell")
    assert ((rows[[f"n_{c}" for c in "abcd"]].sum(axis=1)) == 60).all()
    for cell in "ac":   # a cell's slope over every study's pairs: within 4 SE of its planted value
        n = rows[f"n_{cell}"]
        pooled = (n * rows[f"slope_{cell}"]).sum() / n.sum()
        assert abs(pooled - truth[f"slope_{cell}"]) < 4 * table.loc[cell, "sd"] / math.sqrt(n.sum()), cell
        count = table.loc[cell, "reported"]
        assert table.loc[cell, "coverage_share"] * count >= stats.binom.ppf(0.001, count, 0.95), cell
    c = table.loc["c"]
    for measured, count in ((c["excludes_0_share"], c["reported"]), (c["drawn_excludes_0"], c["drawn_studies"])):
        low, high = stats.binom.ppf([0.0005, 0.9995], count, c["planned"])   # the mock's and numpy's draws
        assert low <= measured * count <= high
    assert c["drawn_coverage"] * c["drawn_studies"] >= stats.binom.ppf(0.001, c["drawn_studies"], 0.95)


def test_without_a_preference_the_position_truth_is_four_uniform_answers_by_hand():
    """Four answers uniform on four slots: all alike 4/256 (PBS sqrt .75), 3 + 1 48/256 (sqrt .375), 2 + 2 36/256
    (.5), 2 + 1 + 1 144/256 (sqrt .125), all different 24/256 (0); nothing depends on length."""
    words, opener = position_bench.mock_facts()
    truth = position_bench.position_truth(position_bench.PositionPlant(), words, opener, 1)
    by_hand = (4 * math.sqrt(0.75) + 48 * math.sqrt(0.375) + 36 * 0.5 + 144 * math.sqrt(0.125)) / 256
    assert truth["pbs"] == pytest.approx(by_hand, abs=1e-12) and truth["partial_rho"] == pytest.approx(0, abs=1e-12)
    for name in ("pbs_q1", "pbs_q2", "pbs_q3", "pbs_q4"):
        assert truth[name] == pytest.approx(by_hand, abs=1e-12), name
    assert truth["answer_share_a"] == pytest.approx(0.25, abs=1e-12) and truth["accuracy"] == pytest.approx(0.25)
    assert position_bench.first_wins(np.array([0.0, 50.0]), 2.0) == pytest.approx([0.25, 1.0], abs=1e-12)
    assert position_bench.pbs_given_a(4) == pytest.approx(math.sqrt(0.75))
    assert position_bench.pbs_given_a(3) == pytest.approx(math.sqrt(0.375))   # shares (3/4, 1/4, 0, 0)


def test_at_a_fixed_length_the_preference_is_binomial_and_unrelated_to_length():
    """Every trace alike: k A answers ~ Binomial(4, p) at the one bonus, the others uniform over B, C, D; the
    length then varies by the words' characters alone, so rho is 0 whatever the preference."""
    words, opener = position_bench.mock_facts()
    plant = position_bench.PositionPlant(per_1k_tokens=30.0, pref=0.2, low=50, high=50)
    truth = position_bench.position_truth(plant, words, opener, 1)
    p = float(position_bench.first_wins(np.array(0.2 + 30.0 * (50 - opener + 1) / 1000), 2.0))
    binomial = sum(stats.binom.pmf(k, 4, p) * position_bench.pbs_given_a(k) for k in range(5))
    assert truth["answer_share_a"] == pytest.approx(p, abs=1e-12) and truth["pbs"] == pytest.approx(binomial, abs=1e-12)
    assert truth["partial_rho"] == pytest.approx(0, abs=1e-12) and truth["pbs_q4"] == pytest.approx(binomial, abs=1e-9)


@pytest.mark.slow
def test_the_position_truth_agrees_with_a_simulation_of_the_same_model():
    words, opener = position_bench.mock_facts()
    plant = position_bench.PositionPlant(per_1k_tokens=30.0)
    truth = position_bench.position_truth(plant, words, opener, 1)
    found = position_bench.simulated_questions(plant, words, opener, 1, 200_000, seed=2)   # SE 0.0022 on rho
    assert partial_correlation(found["length_chars"], found["pbs"], found["accuracy"])[0] == pytest.approx(
        truth["partial_rho"], abs=0.01)
    assert found["pbs"].mean() == pytest.approx(truth["pbs"], abs=0.003)
    assert found["share_a"].mean() == pytest.approx(truth["answer_share_a"], abs=0.003)
    quartiles = length_bins(found, 4)["pbs_mean"].to_numpy()   # SE 0.0012 each
    np.testing.assert_allclose(quartiles, [truth[f"pbs_q{q}"] for q in range(1, 5)], atol=0.005)


@pytest.mark.slow
def test_the_mock_writes_the_traces_the_position_truth_assumes(data_root):
    """Each completion: the open tag (the native model opens its own), "Okay," (the opener's tokens), m = n -
    opener band words, n in low..high, the close tag and a letter, never cut; a question's prompts hold the template's
    one band token; its length is the words' characters plus a constant."""
    from fairaudit.probes import AuditContext
    from fairaudit.probes.position import PositionProbe

    plant = position_bench.PositionPlant(per_1k_tokens=30.0)
    backend, client, spec = position_bench.position_mock(plant, 11)
    probe = PositionProbe(truncation={"enabled": False})
    ctx = AuditContext(client, backend.tokenizer, spec, SimpleNamespace(name="mmlu"), position_bench.reason_arm())
    variants = influence_bench.mcq_variants(str(data_root))
    kept, prompt_band = position_bench.template_questions(probe, ctx, variants[variants["question_id"] < 40])
    assert prompt_band == 1 and 0 < kept["question_id"].nunique() < 40
    assert (kept.groupby("question_id").size() == 4).all()
    records, _ = probe.answer(ctx, kept)
    band = {backend.tokenizer.decode([t]) for t in backend.band}
    trace = records["text"].str.split("</think>").str[0].str.removeprefix("<think>").str.split()
    assert trace.map(lambda words: words[0] == "Okay," and set(words[1:]) <= {w.strip() for w in band}).all()
    m = trace.str.len() - 1
    assert m.between(plant.low - 2, plant.high - 2).all() and m.nunique() > 30
    extra = records["length_chars"] - trace.map(lambda words: sum(len(w) + 1 for w in words[1:]))
    assert extra.nunique() == 1   # the tags, the opener and one letter
    assert (records["answer_source"] == "cascade").all() and not records["truncated"].any()


def test_position_power_and_points_are_counted_by_hand():
    words, opener = position_bench.mock_facts()
    truth = position_bench.position_truth(position_bench.PositionPlant(per_1k_tokens=20.0), words, opener, 1)
    rows = pd.DataFrame({"per_1k_tokens": 20.0, "questions": 60, "prompt_band": 1, "n_questions_complete": 60,
                         "partial_rho_length_pbs_log10_p": [-3.0, -1.31, -1.30, 0.0],
                         "partial_rho_length_pbs": [0.1, 0.2, 0.3, 0.4], "pbs": [0.4, 0.5, 0.5, 0.6],
                         **{name: 0.25 for name in ("answer_share_a", "accuracy", "pbs_q1", "pbs_q2", "pbs_q3",
                                                    "pbs_q4")},
                         **{f"covers_{name}": [1.0, 1.0, 1.0, 0.0] for name in position_bench.INTERVALS}})
    rows["covers_pbs_q4"] = 1.0
    table = position_bench.summary(rows).iloc[0]
    assert table["covers_pbs_share"] == 0.75 and table["covers_pbs_q4_share"] == 1.0
    assert (table["covers_pbs_low"], table["covers_pbs_high"]) == pytest.approx(stats.beta.ppf([0.025, 0.975], [3, 4],
                                                                                               [2, 1]))
    assert table["rejected_share"] == 0.5   # log10(0.05) = -1.301: -3.0 and -1.31 reject
    assert table["predicted"] == pytest.approx(correlation_power(60, truth["partial_rho"], 0.05, 1))
    assert table["partial_rho_mean"] == pytest.approx(0.25) and table["partial_rho_truth"] == truth["partial_rho"]
    assert table["pbs_se"] == pytest.approx(np.std([0.4, 0.5, 0.5, 0.6], ddof=1) / 2)
    lines = position_bench.markdown(position_bench.summary(rows), position_bench.pooled_coverage(rows)).splitlines()
    assert lines[2].startswith(f"| 20 | {truth['partial_rho']:.4f} | 60 | 4 | ")
    assert lines[-2].startswith("| 20 | 4 | 75.0 [19.4, 99.4] | 75.0 [19.4, 99.4] |")
    assert lines[-1].startswith("| all | 4 | 75.0 [19.4, 99.4] |")   # pbs_q4 covers in every study, rho in 3 of 4
    assert lines[-1].endswith("| 100.0 [39.8, 100.0] | 75.0 [19.4, 99.4] | 75.0 [19.4, 99.4] | 75.0 [19.4, 99.4] |")
    with pytest.raises(ValueError, match="fewer than its 60 questions"):
        position_bench.summary(rows.assign(n_questions_complete=59))


@pytest.mark.slow
def test_a_few_real_position_studies_reject_and_land_as_planned(data_root):
    """8 studies of 60 questions at a growth of 40 (the benchmark's table holds the null and the other growths)."""
    studies = 8
    rows = position_bench.run_effect(40.0, studies, 60, 5, str(data_root))
    table = position_bench.summary(rows).iloc[0]
    assert len(rows) == studies and (rows["truncated_rate"] == 0).all()
    low, high = stats.binom.ppf([0.0005, 0.9995], studies, table["predicted"])
    assert low <= table["rejected_share"] * studies <= high
    for name in ("pbs", "answer_share_a", "pbs_q1", "pbs_q4"):   # each study's value: its mean within 4 SE
        assert abs(table[f"{name}_mean"] - table[f"{name}_truth"]) < 4 * table[f"{name}_se"], name
    truth = position_bench.planted(position_bench.PositionPlant(per_1k_tokens=40.0), int(rows["prompt_band"].iloc[0]))
    for name, key in position_bench.INTERVALS.items():   # 60 questions: every interval finite, its flag its own
        low, high = rows[f"{name}_ci_low"], rows[f"{name}_ci_high"]
        assert (low < high).all(), name
        assert rows[f"covers_{name}"].tolist() == ((low <= truth[key]) & (truth[key] <= high)).astype(float).tolist()


def test_growth_studies_reads_growth_equals_studies():
    assert bench.growth_studies("40=600") == (40.0, 600)
    with pytest.raises(argparse.ArgumentTypeError, match="GROWTH=STUDIES"):
        bench.growth_studies("40")
