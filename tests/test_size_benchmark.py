"""benchmarks/cluster_test_size.py at a tiny size: the simulated studies have the paper's design, the script runs,
and even a few dozen studies show the pooled tests rejecting a true null that the sign-flip test keeps."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO

sys.path.insert(0, str(REPO))
from benchmarks import cluster_test_size as bench  # noqa: E402


def test_a_simulated_study_has_the_papers_cuts_and_the_unbalanced_one_loses_its_late_cuts():
    rng = np.random.default_rng(0)
    balanced, unbalanced = bench.simulate(rng, False, 0.0), bench.simulate(rng, True, 0.0)
    assert len(balanced) == 200 * 4 * 3 and balanced.groupby("question_id").size().eq(12).all()
    per_question = unbalanced.groupby("question_id").size()
    assert (per_question.iloc[:80] == 9).all() and (per_question.iloc[80:] == 12).all()   # 40% late: 6 before, 3 after
    assert set(unbalanced.loc[unbalanced["question_id"] < 80, "offset"]) == {-0.15, -0.05, 0.05}


def test_on_the_unbalanced_null_the_pooled_tests_reject_far_more_often_than_the_sign_flip():
    rates = bench.rejection_rates(60, 200, 0, {"null, unbalanced": bench.SCENARIOS["null, unbalanced"]})
    at = rates[rates["alpha"] == 0.05].set_index("test")["rejected"]
    assert at["chi-square"] > at["sign flip"] + 0.1 and at["pooled relabeling"] > at["sign flip"] + 0.1
    assert at["sign flip"] <= 0.1 and rates["studies"].eq(60).all()
    assert bench.rejection_rates(60, 200, 0, {"x": (True, 0.0)})["rejected"].tolist() == \
        bench.rejection_rates(60, 200, 0, {"x": (True, 0.0)})["rejected"].tolist()   # seeded


@pytest.mark.slow
def test_the_script_prints_the_table_docs_probes_md_shows():
    done = subprocess.run([sys.executable, "benchmarks/cluster_test_size.py", "--studies", "4", "--power-studies", "2",
                           "--flips", "50"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[1].startswith("| scenario | chi-square at 0.05 | chi-square at 0.01 | pooled relabeling at 0.05")
    assert [line.split(" | ")[0].lstrip("| ") for line in lines[3:3 + len(bench.SCENARIOS)]] == list(bench.SCENARIOS)
    assert lines[0].startswith("4 simulated studies per null, 2 per effect, 50 relabelings per test, seed 0")
