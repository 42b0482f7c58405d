"""Paper 000's tables rebuilt from its own published pair-state counts.

Tables 13 and 14 print, per (model, dataset), T^pair over {NN, YY, YN, NY} to three decimals
with row counts n and column totals. That pins down one integer matrix of pair-state moves
(nothink -> think) per cell (found below by search; exactly one fits), and those moves fix
every pair's four answers. From records built that way, the report's analysis functions must
reproduce what the paper prints for QwQ-32B and R1-Distill-Qwen-32B in Tables 2, 5, 9, 10,
11, 12, 13 and 14. Table 4 (Qwen3-32B) does not split M, so it fixes Table 2's cells b, c, d
and Table 9's D_cf for Qwen3 only.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from fairaudit.analysis import contingency
from fairaudit.analysis import fairness_tables as tables
from fairaudit.analysis.numbers import format_p
from fairaudit.analysis.transitions import independence_bound

SPLIT = ("NN", "YY", "YN", "NY")
PAIR = ("NN", "YY", "M")
# Tables 13 (QwQ) and 14 (R1-Distill): rows NN, YY, YN, NY as (P(to NN), P(to YY), P(to YN), P(to NY), n);
# column totals.
TABLE_13_14 = {
    ("QwQ", "Adult"): ([(.659, .236, .055, .050, 4149), (.004, .984, .006, .006, 690), (.045, .888, .030, .037, 134),
                        (0, 1, 0, 0, 27)], (2743, 1805, 235, 217)),
    ("QwQ", "COMPAS"): ([(.445, .484, .016, .054, 4981), (0, 1, 0, 0, 4), (0, 1, 0, 0, 14), (0, 1, 0, 0, 1)],
                        (2218, 2431, 82, 269)),
    ("QwQ", "Credit"): ([(.561, .312, .050, .077, 4616), (.008, .943, .012, .037, 244), (.009, .965, .009, .018, 114),
                         (0, 1, 0, 0, 10)], (2594, 1792, 233, 365)),
    ("R1-Distill", "Adult"): ([(.728, .108, .087, .078, 3715), (.007, .964, .012, .018, 1186),
                               (.059, .735, .103, .103, 68), (.100, .667, .133, .100, 30)], (2718, 1614, 348, 319)),
    ("R1-Distill", "COMPAS"): ([(.726, .142, .046, .086, 1356), (0, 1, 0, 0, 70), (None,) * 4 + (0,), (0, 1, 0, 0, 4)],
                               (985, 266, 63, 116)),
    ("R1-Distill", "Credit"): ([(.565, .338, .056, .042, 4971), (0, 1, 0, 0, 14), (0, 1, 0, 0, 5), (0, 1, 0, 0, 5)],
                               (2808, 1704, 276, 207)),
}
# Table 4 (Qwen3-32B): rows NN, YY, M as (P(to NN), P(to YY), P(to M), n); column totals.
TABLE_4 = {
    ("Qwen3", "Adult"): ([(.894, .035, .071, 3720), (.050, .866, .084, 1173), (.290, .411, .299, 107)],
                         (3415, 1191, 394)),
    ("Qwen3", "COMPAS"): ([(.686, .207, .108, 3157), (.001, .996, .002, 1698), (.000, .986, .014, 145)],
                          (2167, 2487, 346)),
    ("Qwen3", "Credit"): ([(.981, .004, .015, 3170), (.068, .899, .033, 1802), (.917, .042, .042, 24)],
                          (3256, 1634, 106)),
}
# Table 2: N, a, b, c, d, McNemar p. Qwen3-Adult prints c = 363, which makes a + b + c + d = 5001;
# Table 4's counts (and Table 5's |c|) give c = 362, and so does its printed p (3.7e-46; (75, 363) gives 2.2e-46).
TABLE_2 = {
    ("Qwen3", "Adult"): (5000, 4531, 75, 362, 32, 3.7e-46), ("Qwen3", "COMPAS"): (5000, 4511, 143, 344, 2, 3.7e-20),
    ("Qwen3", "Credit"): (4996, 4867, 23, 105, 1, 1.0e-13), ("QwQ", "Adult"): (5000, 4396, 152, 443, 9, 6.1e-34),
    ("QwQ", "COMPAS"): (5000, 4634, 15, 351, 0, 2.3e-84), ("QwQ", "Credit"): (4984, 4265, 121, 595, 3, 5.3e-76),
    ("R1-Distill", "Adult"): (4999, 4255, 77, 646, 21, 7.6e-113),
    ("R1-Distill", "COMPAS"): (1430, 1247, 4, 179, 0, 7.5e-48),
    ("R1-Distill", "Credit"): (4995, 4502, 10, 483, 0, 1.7e-128),
}
# Table 5: |c|, c alpha-up, c alpha'-up, asym(c), delta_c (%).
TABLE_5 = {
    ("QwQ", "Adult"): (443, 231, 212, .04, .38), ("QwQ", "COMPAS"): (351, 82, 269, .53, -3.74),
    ("QwQ", "Credit"): (595, 232, 363, .22, -2.63), ("R1-Distill", "Adult"): (646, 337, 309, .04, .56),
    ("R1-Distill", "COMPAS"): (179, 63, 116, .30, -3.71), ("R1-Distill", "Credit"): (483, 276, 207, .14, 1.38),
}
# Table 9: D_cf and D_group under think, then nothink.
TABLE_9 = {
    ("Qwen3", "Adult"): (.079, .006, .021, .012), ("Qwen3", "COMPAS"): (.069, .001, .029, .010),
    ("Qwen3", "Credit"): (.021, .004, .005, .004), ("QwQ", "Adult"): (.090, .004, .032, .021),
    ("QwQ", "COMPAS"): (.070, .037, .003, .003), ("QwQ", "Credit"): (.120, .026, .025, .021),
    ("R1-Distill", "Adult"): (.133, .006, .020, .008), ("R1-Distill", "COMPAS"): (.125, .037, .003, .003),
    ("R1-Distill", "Credit"): (.097, .014, .002, .000),
}
# Tables 3, 10, 11: P(Y|Y), P(Y|N), dP(Y) for alpha, then alpha'.
TABLE_3_10_11 = {
    ("Qwen3", "Adult"): ((.889, .076, .033), (.903, .077, .032)),
    ("Qwen3", "COMPAS"): ((.998, .281, .174), (.997, .272, .182)),
    ("Qwen3", "Credit"): ((.908, .012, -.026), (.912, .011, -.025)),
    ("QwQ", "Adult"): ((.980, .300, .249), (.988, .302, .255)),
    ("QwQ", "COMPAS"): ((1.000, .525, .525), (1.000, .515, .513)),
    ("QwQ", "Credit"): ((.977, .387, .361), (.961, .381, .355)),
    ("R1-Distill", "Adult"): ((.968, .196, .138), (.977, .201, .147)),
    ("R1-Distill", "COMPAS"): ((1.000, .215, .203), (1.000, .203, .193)),
    ("R1-Distill", "Credit"): ((1.000, .382, .381), (1.000, .392, .391)),
}
# Table 12: |c| ind., |c| actual, |b| ind., |b| actual ("actual" there is rows x rounded probabilities).
TABLE_12 = {
    ("Qwen3", "Adult"): (744, 363, 18, 75), ("Qwen3", "COMPAS"): (1272, 344, 40, 143),
    ("Qwen3", "Credit"): (367, 107, 2, 23), ("QwQ", "Adult"): (1768, 444, 50, 152),
    ("QwQ", "COMPAS"): (2487, 349, 8, 15), ("QwQ", "Credit"): (2198, 598, 49, 121),
    ("R1-Distill", "Adult"): (1246, 649, 21, 77), ("R1-Distill", "COMPAS"): (448, 179, 1, 4),
    ("R1-Distill", "Credit"): (2359, 487, 4, 10),
}
ANSWERS = {"N": "No", "Y": "Yes"}


def integer_moves(rows, totals):
    """The one integer matrix whose rows print as `rows` (3 decimals, row counts n), columns summing to `totals`."""
    def candidates(p, n):
        return [0] if p is None or n == 0 else [k for k in range(n + 1) if abs(k / n - p) <= 0.0005 + 1e-12]

    per_row = [[c for c in itertools.product(*(candidates(p, row[-1]) for p in row[:-1])) if sum(c) == row[-1]]
               for row in rows]
    fits = [m for m in itertools.product(*per_row) if all(sum(r[j] for r in m) == t for j, t in enumerate(totals))]
    assert len(fits) == 1, f"{len(fits)} integer matrices fit the printed table"
    return np.array(fits[0])


def pair_records(moves: np.ndarray, states: tuple[str, ...]) -> pd.DataFrame:
    """Records whose pairs make `moves[i, j]` transitions from state i (nothink) to state j (think).

    A mixed state M (unsplit, Table 4) is rendered YN.
    """
    rows, pair = [], 0
    for (i, before), (j, after) in itertools.product(enumerate(states), enumerate(states)):
        for _ in range(int(moves[i, j])):
            for arm, state in (("nothink", before), ("think", after)):
                state = "YN" if state == "M" else state
                for side, letter in zip(("alpha", "alpha_prime"), state):
                    rows.append((pair, side, arm, ANSWERS[letter], 1.0 if letter == "Y" else 0.0))
            pair += 1
    return pd.DataFrame(rows, columns=["pair_id", "side", "arm", "answer", "p_yes"])


@pytest.fixture(scope="module")
def split_records() -> pd.DataFrame:
    """The QwQ and R1-Distill cells, stacked with model and dataset."""
    frames = [pair_records(integer_moves(*table), SPLIT).assign(model=model, dataset=dataset)
              for (model, dataset), table in TABLE_13_14.items()]
    return pd.concat(frames, ignore_index=True)


@pytest.fixture(scope="module")
def qwen3_records() -> pd.DataFrame:
    frames = [pair_records(integer_moves(*table), PAIR).assign(model=model, dataset=dataset)
              for (model, dataset), table in TABLE_4.items()]
    return pd.concat(frames, ignore_index=True)


def cell_metrics(records: pd.DataFrame) -> dict:
    return {key: contingency(frame, "think", "nothink", n_boot=0) for key, frame in tables.cells(records)}


@pytest.mark.slow
def test_table_2_cells_and_mcnemar(split_records, qwen3_records):
    for key, m in {**cell_metrics(split_records), **cell_metrics(qwen3_records)}.items():
        n, a, b, c, d, p = TABLE_2[key]
        assert [m["n_pairs"], m["cell_a"], m["cell_b"], m["cell_c"], m["cell_d"]] == [n, a, b, c, d], key
        assert format_p(m["mcnemar_log10_p"]) == f"{p:.1e}", key


def test_table_5_direction_of_created_flips(split_records):
    for key, m in cell_metrics(split_records).items():
        c, up, up_prime, asym, delta = TABLE_5[key]
        assert [m["cell_c"], m["c_alpha_up"], m["c_alpha_prime_up"]] == [c, up, up_prime], key
        assert round(m["asym_c"], 2) == asym and round(100 * m["delta_c"], 2) == delta, key


def test_table_9_disparities(split_records, qwen3_records):
    for key, m in cell_metrics(split_records).items():
        printed = TABLE_9[key]
        ours = (m["d_cf_think"], m["d_group_think"], m["d_cf_nothink"], m["d_group_nothink"])
        assert [round(v, 3) for v in ours] == list(printed), key
    for key, m in cell_metrics(qwen3_records).items():  # Table 4 fixes D_cf, not D_group
        assert (round(m["d_cf_think"], 3), round(m["d_cf_nothink"], 3)) == (TABLE_9[key][0], TABLE_9[key][2]), key


def test_tables_13_14_reprint_from_the_records(split_records):
    table = tables.pair_state_transitions(split_records, split=True).set_index(["model", "dataset", "from"])
    for (model, dataset), (rows, totals) in TABLE_13_14.items():
        for state, row in zip(SPLIT, rows):
            assert table.at[(model, dataset, state), "n"] == row[-1]
            if row[-1]:
                assert [round(table.at[(model, dataset, state), s], 3) for s in SPLIT] == list(row[:-1])
        assert [table.at[(model, dataset, "total"), s] for s in SPLIT] == list(totals)
    pooled = table.loc[("pooled", "pooled", "total"), ["NN", "YY", "YN", "NY"]]
    assert pooled.sum() == sum(sum(t) for _, t in TABLE_13_14.values())


def test_table_4_reprints_and_its_mixed_column_is_cells_c_plus_d(qwen3_records):
    table = tables.pair_state_transitions(qwen3_records).set_index(["model", "dataset", "from"])
    for (model, dataset), (rows, totals) in TABLE_4.items():
        for state, row in zip(PAIR, rows):
            assert [round(table.at[(model, dataset, state), s], 3) for s in PAIR] == list(row[:-1])
        assert [table.at[(model, dataset, "total"), s] for s in PAIR] == list(totals)
        _, _, _, c, d, _ = TABLE_2[(model, dataset)]
        assert totals[2] == c + d


def test_tables_10_11_side_averaged_group_transitions(split_records):
    """T^A from the pairs that parse on both sides of both arms. Averaged over alpha and alpha' (the p, q
    of Table 12) they match Tables 10 and 11 to 0.002. Side by side they do not: the printed
    T^alpha - T^alpha' gaps (|Delta| <= 0.017) are up to 0.05 smaller than Tables 13 and 14's own
    YN / NY counts imply (QwQ-COMPAS P(Y|N): 0.501 and 0.539 from the counts, 0.525 and 0.515 printed),
    so the paper's per-side T^A rests on another population (App. G's per-side filter is one candidate)."""
    wide = tables.group_transitions(split_records).set_index(["model", "A"])
    gaps = []
    for (model, dataset), (alpha, alpha_prime) in TABLE_3_10_11.items():
        if model == "Qwen3":
            continue
        columns = [f"{dataset}_{v}" for v in ("p_y_given_y", "p_y_given_n", "dp_yes")]
        ours = (wide.loc[(model, "alpha"), columns].to_numpy(float)
                + wide.loc[(model, "alpha_prime"), columns].to_numpy(float)) / 2
        np.testing.assert_allclose(ours, (np.array(alpha) + np.array(alpha_prime)) / 2, atol=0.002,
                                   err_msg=f"{model} {dataset}")
        delta = wide.loc[(model, "delta"), columns].to_numpy(float)
        np.testing.assert_allclose(delta, wide.loc[(model, "alpha"), columns].to_numpy(float)
                                   - wide.loc[(model, "alpha_prime"), columns].to_numpy(float))
        gaps.append(abs(delta[1] - (alpha[1] - alpha_prime[1])))
    assert 0.04 < max(gaps) < 0.06


def test_table_12_independence_bound_from_the_published_inputs(split_records, qwen3_records):
    """E|c|, E|b| from Table 3/10/11's p, q (averaged over alpha, alpha') and the nothink row totals."""
    for (model, dataset), (c_ind, c_act, b_ind, b_act) in TABLE_12.items():
        (yy_a, yn_a, _), (yy_b, yn_b, _) = TABLE_3_10_11[(model, dataset)]
        p, q = (yn_a + yn_b) / 2, 1 - (yy_a + yy_b) / 2
        if model == "Qwen3":
            nn, yy, m = (row[-1] for row in TABLE_4[(model, dataset)][0])
        else:
            nn, yy, yn, ny = (row[-1] for row in TABLE_13_14[(model, dataset)][0])
            m = yn + ny
        expected_c, expected_b = independence_bound(p, q, nn, yy, m)
        assert round(expected_c) == pytest.approx(c_ind, abs=1), (model, dataset)
        assert round(expected_b) == pytest.approx(b_ind, abs=1), (model, dataset)
    table = tables.independence_check(split_records).set_index(["model", "dataset"])
    for key in TABLE_5:
        c_ind, c_act, b_ind, b_act = TABLE_12[key]
        assert table.at[key, "b_actual"] == b_act  # exact counts; Table 12's c "actual" is rows x rounded P
        assert table.at[key, "c_actual"] == pytest.approx(c_act, abs=4)
        assert table.at[key, "c_ind"] == pytest.approx(c_ind, rel=0.02)  # p, q from our T^A (see Tables 10, 11)
        assert table.at[key, "c_b_ratio_actual"] == pytest.approx(table.at[key, "c_actual"] / b_act)


def test_pooled_row_of_table_2_over_the_six_split_cells(split_records):
    from fairaudit.analysis.study import pooled_metrics

    per_cell = {f"{m}/{d}": frame for (m, d), frame in tables.cells(split_records)}
    pooled = pooled_metrics(per_cell, "think", "nothink")
    expected = [sum(TABLE_2[key][i] for key in TABLE_5) for i in range(5)]
    assert [pooled[k] for k in ("n_pairs", "cell_a", "cell_b", "cell_c", "cell_d")] == expected
    assert math.isfinite(pooled["mcnemar_log10_p"]) and pooled["mcnemar_log10_p"] < -300


def test_marginal_t_counts_every_parsed_instance(split_records):
    marginal = tables.marginal_transition(split_records).set_index("nothink")
    assert marginal["n"].sum() == 2 * sum(TABLE_2[key][0] for key in TABLE_5)  # both sides of every pair parse
    assert marginal.at["Y", "p_to_y"] + marginal.at["Y", "p_to_n"] == pytest.approx(1.0)
    assert marginal.at["N", "n_to_y"] > marginal.at["Y", "n_to_n"]  # the group-level N -> Y push of App. G


def test_marginal_t_of_a_model_that_answers_yes_to_everyone_has_an_empty_no_row():
    """The tiny model says Yes to all: no baseline No, so that row counts 0 with undefined P (it used to raise)."""
    rows = [{"model": "m", "dataset": "adult", "pair_id": i, "side": side, "arm": arm, "answer": "Yes", "p_yes": 0.9}
            for i in range(3) for side in ("alpha", "alpha_prime") for arm in ("think", "nothink")]
    marginal = tables.marginal_transition(pd.DataFrame(rows)).set_index("nothink")
    assert marginal.loc["Y", ["n_to_y", "n_to_n", "n"]].tolist() == [6, 0, 6]
    assert marginal.loc["N", ["n_to_y", "n_to_n", "n"]].tolist() == [0, 0, 0] and math.isnan(marginal.at["N", "p_to_y"])
