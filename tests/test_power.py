"""fairaudit.analysis.power against hand-enumerated cases, published values and seeded simulations run through the
project's own tests (stats.mcnemar_exact_log10_p, multiplicity.adjusted_log10_p)."""

import functools
import itertools
import math
import sys

import numpy as np
import pytest
from scipy import stats

from conftest import REPO
from fairaudit.analysis.multiplicity import adjusted_log10_p, combined_log10_p
from fairaudit.analysis.power import (
    cell_gap_power,
    cells_at_ratio,
    combined_cdf,
    decided_power,
    expected_wilson_width,
    family_alpha,
    holm_power,
    mcnemar_critical_counts,
    mcnemar_pairs_for_power,
    mcnemar_power,
    paired_gap_pairs_for_power,
    paired_gap_power,
    units_for_wilson_width,
)
from fairaudit.analysis.stats import clopper_pearson, mcnemar_exact_log10_p, wilson_interval

sys.path.insert(0, str(REPO))
from benchmarks import plan_power  # noqa: E402

DRAWS = 4000
WITHIN = 0.03  # predicted and simulated power agree within 3 points


def simulated_mcnemar_power(pairs, p_b, p_c, alpha, seed):
    """Share of seeded studies in which the probes' McNemar rejects at `alpha`."""
    cells = np.random.default_rng(seed).multinomial(pairs, [p_b, p_c, 1.0 - p_b - p_c], size=DRAWS)
    return np.mean([mcnemar_exact_log10_p(int(b), int(c)) <= math.log10(alpha) for b, c, _ in cells])


def test_critical_counts_are_where_the_probes_mcnemar_starts_to_reject():
    for d in range(41):
        k = int(mcnemar_critical_counts(np.array([d]), 0.05)[0])
        rejected = [b for b in range(d + 1) if mcnemar_exact_log10_p(b, d - b) <= math.log10(0.05) and b <= d - b]
        assert k == (max(rejected) if rejected else -1)


def test_hand_enumerated_mcnemar_power():
    # 6 pairs, p_b = 0.1, p_c = 0.4: at alpha 0.05 the test rejects only when all 6 pairs are discordant (d = 6:
    # 2/64 = 0.031; d = 5: 2/32 = 0.0625) and one cell is empty: 0.5^6 (0.8^6 + 0.2^6)
    assert mcnemar_power(6, 0.1, 0.4) == pytest.approx(0.5 ** 6 * (0.8 ** 6 + 0.2 ** 6), rel=1e-12)
    # 9 pairs, all discordant (p_b + p_c = 1), p_c = 0.7: rejects at min(b, c) <= 1 (10/512 <= 0.025)
    by_hand = sum(math.comb(9, c) * 0.7 ** c * 0.3 ** (9 - c) for c in (0, 1, 8, 9))
    assert mcnemar_power(9, 0.3, 0.7) == pytest.approx(by_hand, rel=1e-12)
    assert mcnemar_power(5, 0.1, 0.4) == 0.0 and mcnemar_power(100, 0.0, 0.0) == 0.0


@pytest.mark.parametrize("ratio", [1.0, 2.0, 3.0])
def test_mcnemar_power_matches_simulation(ratio):
    p_b, p_c = cells_at_ratio(0.1, ratio)
    predicted = mcnemar_power(200, p_b, p_c)
    assert abs(predicted - simulated_mcnemar_power(200, p_b, p_c, 0.05, seed=int(ratio))) <= WITHIN
    if ratio == 1.0:  # no effect: the exact test keeps its size
        assert predicted <= 0.05


def test_mcnemar_pairs_for_power_is_where_the_target_is_first_crossed():
    p_b, p_c = cells_at_ratio(0.1, 2.0)
    n = mcnemar_pairs_for_power(p_b, p_c)
    assert mcnemar_power(n, p_b, p_c) >= 0.8 > mcnemar_power(n - 1, p_b, p_c)
    assert mcnemar_pairs_for_power(0.05, 0.05) is None  # no effect: no n reaches 80%


def test_paired_gap_power_matches_published_and_statsmodels_values():
    # G*Power (and Cohen 1988, table 2.4.1): a paired t-test at d = 0.5, alpha 0.05 two-sided needs 34 pairs for
    # 80%, with power 0.8078 there
    assert paired_gap_pairs_for_power(0.05, 0.1) == 34
    assert paired_gap_power(34, 0.5, 1.0) == pytest.approx(0.8077775, abs=1e-6)
    from statsmodels.stats.power import TTestPower

    assert paired_gap_power(20, 0.3, 1.0) == pytest.approx(TTestPower().power(0.3, 20, 0.05), rel=1e-9)


@pytest.mark.parametrize("mean", [0.0, 0.3, 0.5])
def test_paired_gap_power_matches_simulation(mean):
    differences = np.random.default_rng(7).normal(mean, 1.0, size=(DRAWS, 30))
    simulated = np.mean(stats.ttest_1samp(differences, 0.0, axis=1).pvalue <= 0.05)
    assert abs(paired_gap_power(30, mean, 1.0) - simulated) <= WITHIN


@pytest.mark.slow
def test_cell_gap_power_by_hand_and_by_simulation():
    """A cell holding each of 3 pairs with chance 1/2 has 2 pairs with chance 3/8 and 3 with 1/8 (under 2: no test)."""
    by_hand = 3 / 8 * paired_gap_power(2, 0.5, 1.0) + 1 / 8 * paired_gap_power(3, 0.5, 1.0)
    assert cell_gap_power(3, 0.5, 0.5, 1.0) == pytest.approx(by_hand, rel=1e-12)
    assert cell_gap_power(30, 1.0, 0.3, 1.0) == paired_gap_power(30, 0.3, 1.0)
    rng = np.random.default_rng(5)
    counts = rng.binomial(80, 0.15, size=DRAWS)
    rejected = [stats.ttest_1samp(rng.normal(0.5, 1.0, size=m), 0.0).pvalue <= 0.05 for m in counts if m >= 2]
    assert abs(cell_gap_power(80, 0.15, 0.5, 1.0) - np.sum(rejected) / DRAWS) <= WITHIN


exact_log10_p = functools.lru_cache(maxsize=None)(mcnemar_exact_log10_p)  # the families' cells repeat: each once


@pytest.mark.parametrize("ratio", [1.0, 2.0, 3.0])
def test_holm_power_bound_matches_a_simulated_family(ratio):
    # one test with the effect among 4 without: Holm rejects it about as often as Bonferroni's alpha / 5 predicts
    rng, alpha, pairs = np.random.default_rng(11), 0.05, 300
    p_b, p_c = cells_at_ratio(0.1, ratio)
    rejected = 0
    for _ in range(1000):
        effect = rng.multinomial(pairs, [p_b, p_c, 1.0 - p_b - p_c])
        nulls = rng.multinomial(pairs, [0.05, 0.05, 0.9], size=4)
        log10_p = [exact_log10_p(int(b), int(c)) for b, c, _ in [effect, *nulls]]
        if log10_p[0] <= math.log10(alpha / 5) or log10_p[0] > math.log10(alpha):  # Holm's answer is known here
            rejected += log10_p[0] <= math.log10(alpha / 5)
        else:  # alpha / 5 < p <= alpha: Holm as the report adjusts a family
            rejected += adjusted_log10_p(log10_p, "holm")[0] <= math.log10(alpha)
    predicted = mcnemar_power(pairs, p_b, p_c, family_alpha(alpha, 5, "holm"))
    assert abs(predicted - rejected / 1000) <= WITHIN + 0.01  # 1000 families: a 1.6-point standard error at 0.5


P_LAW = {0.001: 0.2, 0.01: 0.15, 0.02: 0.1, 0.04: 0.15, 0.3: 0.2, 1.0: 0.2}  # a discrete p's law: value -> chance


def law_cdf(level: float) -> float:
    return sum(chance for value, chance in P_LAW.items() if value <= level + 1e-15)


def test_holm_power_is_the_reports_holm_summed_over_every_family():
    """Three hypotheses, each p drawn from P_LAW: every one of the 6^3 families adjusted as the report adjusts them,
    each weighed by its chance; the share of hypotheses rejected."""
    expected = 0.0
    for family in itertools.product(P_LAW, repeat=3):
        chance = math.prod(P_LAW[p] for p in family)
        expected += chance * np.mean(adjusted_log10_p(np.log10(family), "holm") <= math.log10(0.05))
    assert holm_power(law_cdf, 3, 0.05) == pytest.approx(expected, rel=1e-12)
    assert holm_power(law_cdf, 1, 0.05) == pytest.approx(law_cdf(0.05))


def test_combined_replicates_are_the_reports_median_rule_summed_over_every_draw():
    for replicates in (2, 3, 4):
        expected = sum(math.prod(P_LAW[p] for p in draw) for draw in itertools.product(P_LAW, repeat=replicates)
                       if combined_log10_p(np.log10(draw)) <= math.log10(0.035))
        assert combined_cdf(law_cdf, replicates, 0.035) == pytest.approx(expected, rel=1e-12)
    assert combined_cdf(law_cdf, 1, 0.035) == law_cdf(0.035)   # no support point at a threshold


def test_decided_power_is_exact_for_holm_over_alike_hypotheses_and_a_lower_bound_otherwise():
    holm, exact = decided_power(law_cdf, 3, 4, 0.05, "holm")
    assert exact and holm == pytest.approx(holm_power(lambda t: combined_cdf(law_cdf, 3, t), 4, 0.05))
    bonferroni, exact = decided_power(law_cdf, 3, 4, 0.05, "holm", alike=False)
    assert not exact and bonferroni == combined_cdf(law_cdf, 3, 0.05 / 4) <= holm
    bh, exact = decided_power(law_cdf, 3, 4, 0.05, "bh")
    assert not exact and bh == holm   # BH rejects at least what Holm does
    assert decided_power(law_cdf, 1, 1, 0.05, "holm") == (law_cdf(0.05), True)
    assert decided_power(law_cdf, 1, 4, 0.05, "none") == (law_cdf(0.05), True)


def test_the_plans_power_for_seeds_and_holm_is_a_simulation_of_the_reports_rule():
    """Two data sets x three seeds at c/b = 1.5, 15% discordant, 500 pairs a seed: 600 simulated studies through the
    probes' McNemar, the report's seed combination and Holm (benchmarks/plan_power.py runs 10,000)."""
    hits, total = plan_power.simulated_power(500, 600, 3)
    low, high = clopper_pearson(hits, total)
    planned = plan_power.planned_power(500)
    assert low - WITHIN <= planned <= high + WITHIN and abs(planned - hits / total) <= WITHIN
    p_b, p_c = cells_at_ratio(0.15, 1.5)
    assert mcnemar_power(500, p_b, p_c, 0.025) - planned > 0.1   # one seed at alpha / m: twice the power


def test_family_alpha():
    assert family_alpha(0.05, 4, "none") == 0.05
    assert family_alpha(0.05, 4, "holm") == family_alpha(0.05, 4, "bh") == 0.0125
    with pytest.raises(ValueError, match="correction"):
        family_alpha(0.05, 4, "sidak")


def wilson_width(k, n):
    low, high = wilson_interval(k, n)
    return high - low


@pytest.mark.slow
def test_expected_wilson_width_by_hand_and_by_simulation():
    # 2 units at rate 0.3: k = 0, 1, 2 with probabilities 0.49, 0.42, 0.09
    by_hand = 0.49 * wilson_width(0, 2) + 0.42 * wilson_width(1, 2) + 0.09 * wilson_width(2, 2)
    assert expected_wilson_width(2, 0.3) == pytest.approx(by_hand, rel=1e-12)
    for rate in (0.05, 0.2, 0.5):
        drawn = np.random.default_rng(3).binomial(400, rate, size=DRAWS)
        simulated = np.mean([wilson_width(int(k), 400) for k in drawn])
        assert expected_wilson_width(400, rate) == pytest.approx(simulated, abs=0.001)


def test_units_for_wilson_width_is_where_the_width_is_first_reached():
    n = units_for_wilson_width(0.2, 0.05)
    assert expected_wilson_width(n, 0.2) <= 0.05 < expected_wilson_width(n - 1, 0.2)
