"""benchmarks/calibration_bbq.py at a tiny size: the planted model answers at its planted rates, the truth is the
paper's scores at those rates, and the coverage table has a row per score and scope."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from conftest import REPO

sys.path.insert(0, str(REPO))
from benchmarks import calibration_bbq as bench  # noqa: E402


@pytest.fixture(scope="module")
def items(data_root):
    return bench.shipped_items(str(data_root), ["Religion", "Sexual_orientation"])


def test_the_truth_is_the_papers_scores_at_the_planted_rates():
    assert bench.truth(0.7, 0.3) == pytest.approx({"s_dis": 0.4, "s_amb": 0.28})
    assert bench.truth(0.5, 0.0) == {"s_dis": 0.0, "s_amb": 0.0}


def test_the_planted_model_answers_at_its_rates(items):
    answers = bench.planted_answers(items, bias=0.8, unknown=0.25, spread=1e6, rng=np.random.default_rng(0))
    chosen = answers["answer_option"].astype(int)
    unknown = float((chosen == answers["unknown_option"]).mean())
    biased = float((chosen == answers["biased_option"]).sum() / (chosen != answers["unknown_option"]).sum())
    assert len(answers) == 3 * len(items) and set(answers["permutation"]) == {0, 1, 2}
    assert abs(unknown - 0.25) < 0.02 and abs(biased - 0.8) < 0.02  # 6,192 answers: a few SDs


def test_a_tiny_calibration_covers_and_reports_every_scope(items):
    table = bench.coverage(items, studies=4, n=30, bias=0.7, unknown=0.3, spread=20.0)
    assert list(table["scope"]) == ["all", "all", "Religion", "Religion", "Sexual_orientation", "Sexual_orientation"]
    assert table["coverage"].between(0, 1).all() and (table["coverage_low"] <= table["coverage"]).all()
    assert (table["wilson_low"] <= table["coverage"]).all() and (table["coverage"] <= table["wilson_high"]).all()
    assert (table["templates"] <= 50).all() and (table["mean_width"] > 0).all()
