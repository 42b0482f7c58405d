"""benchmarks/cluster_test_size.py at a tiny size: the simulated studies have the layouts their designs name, the
issue's case breaks the sign flip and not the stratified test, and the script prints the table docs/probes.md
shows."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from conftest import REPO
from fairaudit.analysis.position_truncation import ccp_cluster_test
from fairaudit.analysis.stats import clopper_pearson

sys.path.insert(0, str(REPO))
from benchmarks import cluster_test_size as bench  # noqa: E402


def test_a_simulated_study_has_its_designs_cuts_and_late_questions_lose_one():
    rng = np.random.default_rng(0)
    paper = bench.simulate(rng, bench.DESIGNS["paper: 200 q, late lose a cut"])
    per_question = paper.groupby("question_id").size()
    assert (per_question.iloc[:80] == 9).all() and (per_question.iloc[80:] == 12).all()   # 40% late: 6 before, 3 after
    assert (paper[paper["question_id"] < 80].groupby("question_id")["offset"].nunique() == 3).all()
    issue = bench.simulate(rng, bench.DESIGNS["1 after vs 9 before, 3%, 20 q"])
    assert len(issue) == 200 and issue.groupby("question_id")["offset"].apply(lambda o: (o > 0).sum()).eq(1).all()
    skewed = bench.simulate(rng, bench.DESIGNS["skewed counts, 5%"])
    sides = skewed.assign(after=skewed["offset"] > 0).groupby(["question_id", "after"]).size().unstack()
    assert sides[True].between(1, 4).all() and sides[False].between(1, 8).all() and sides[False].nunique() > 1


def test_the_issues_minimal_case_the_sign_flip_rejects_and_the_stratified_test_does_not():
    """20 questions, 1 unchanged after-continuation and 9 before each, one of which changed in 15 questions."""
    changed = np.zeros(200, dtype=bool)
    changed[np.arange(15) * 10 + 1] = True
    rows = pd.DataFrame({"question_id": np.repeat(np.arange(20), 10), "changed": changed,
                         "offset": np.tile([0.01] + [-0.01 * (i + 1) for i in range(9)], 20)})
    assert bench.sign_flip_p(rows, 20000, 0) < 1e-3   # 2 x 2^5 of 2^20 sign vectors reach |mean| = 1/12: 6e-5
    assert ccp_cluster_test(rows)["trunc_ccp_perm_p"] == pytest.approx(2 * 0.9 ** 15)


@pytest.mark.slow
def test_a_few_dozen_studies_of_the_issues_design_show_the_sign_flip_rejecting_too_often():
    design = {"issue": bench.DESIGNS["1 after vs 9 before, 3%, 20 q"]}
    rates = bench.rejection_rates(design, 60, 200, 0)
    at = rates[rates["alpha"] == 0.05].set_index("test")
    assert at.loc["sign flip", "rejected"] > 0.1 and at.loc["stratified, cut rates", "rejected"] <= 0.05
    hits = round(at.loc["sign flip", "rejected"] * 60)
    assert (at.loc["sign flip", "ci_low"], at.loc["sign flip", "ci_high"]) == pytest.approx(clopper_pearson(hits, 60))
    assert not at.loc["sign flip", "holds"] and at.loc["stratified, cut rates", "holds"] # its interval: above 0.05
    assert rates["studies"].eq(60).all() and rates["rejected"].tolist() == \
        bench.rejection_rates(design, 60, 200, 0)["rejected"].tolist()   # seeded


@pytest.mark.slow
def test_continuations_kept_unevenly_break_the_count_per_cut_and_not_the_rate():
    """All answers extracted before the CCP and 60% after it, at one change rate: each study's cut counts say the
    after side changes less; the cuts' rates do not."""
    design = bench.DESIGNS["extraction 100% before, 60% after"]
    study = bench.simulate(np.random.default_rng(0), design)
    assert len(study) < 1200 and (study[study["offset"] < 0].groupby("question_id").size() == 6).all()
    rates = bench.rejection_rates({"kept": design}, 30, 50, 0)
    at = rates[rates["alpha"] == 0.05].set_index("test")
    assert at.loc["stratified, cut counts", "rejected"] > 0.5 and not at.loc["stratified, cut counts", "holds"]
    assert at.loc["stratified, cut rates", "holds"]


def test_power_rows_have_no_size_verdict_and_the_table_bolds_a_size_above_alpha():
    rates = pd.DataFrame([{"design": "d", "test": test, "alpha": alpha, "rejected": 0.2, "ci_low": 0.15,
                           "ci_high": 0.25, "holds": test != "sign flip"} for test in bench.TESTS
                          for alpha in bench.ALPHAS])
    table = bench.markdown(rates).splitlines()
    assert table[0] == "| at 0.05 | " + " | ".join(bench.TESTS) + " |"
    assert table[2].split(" | ")[2] == "**0.200 [0.150, 0.250]**" and table[2].split(" | ")[1] == "0.200 [0.150, 0.250]"
    power = bench.rejection_rates({"p": bench.POWER["paper, effect -0.3"]}, 2, 50, 0)
    assert power["holds"].map(math.isnan).all() and not power["null"].any()


@pytest.mark.slow
def test_the_script_prints_the_table_docs_probes_md_shows():
    done = subprocess.run([sys.executable, "benchmarks/cluster_test_size.py", "--studies", "4", "--power-studies", "2",
                           "--flips", "50", "--designs", "few questions: 5, late", "paper, effect -0.3"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("4 simulated studies per null design, 2 per design with an effect, seed 0")
    assert lines[1] == ("| at 0.05 | chi-square | sign flip | stratified, continuations | stratified, cut counts | "
                        "stratified, cut rates |")
    names = [line.split(" | ")[0].lstrip("| ") for line in lines[3:5]]
    assert names == ["few questions: 5, late", "paper, effect -0.3"]
    assert lines[-2].startswith("sizes within their interval of alpha or below, by test: chi-square ")
