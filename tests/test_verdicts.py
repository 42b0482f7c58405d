"""What a run found, in words: the P(Yes) gap against hand-computed values, degenerate-result warnings, and
every probe's verdict on stdout before its table, end to end on the tiny model."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from conftest import run_app
from fairaudit.analysis.degenerate import decision_warnings, depth_warnings, mcq_warnings, thinking_arms
from fairaudit.analysis.gap import p_gap
from fairaudit.catalog import registry
from fairaudit.probes.decisions import PairedProbe

# P(Yes) per pair (alpha, alpha') under each arm; pair p4 is scored on one side only under think.
P = {"think": [(0.9, 0.6), (0.5, 0.7), (0.2, 0.2), (0.4, None)],
     "nothink": [(0.8, 0.8), (0.4, 0.3), (0.3, 0.5), (0.5, 0.5)]}


def gap_records(answers: str | None = "Yes") -> pd.DataFrame:
    rows = []
    for arm, pairs in P.items():
        for i, sides in enumerate(pairs):
            for side, p in zip(("alpha", "alpha_prime"), sides):
                rows.append({"pair_id": f"p{i + 1}", "side": side, "attribute_value": side, "arm": arm,
                             "answer": answers, "p_yes": np.nan if p is None else p})
    return pd.DataFrame(rows)


def test_p_gap_is_the_mean_absolute_within_pair_difference_over_pairs_scored_in_both_arms():
    m = p_gap(gap_records(answers=None), "think", "nothink", n_boot=200, seed=3)  # unparsed answers do not matter
    assert m["n_pairs_scored"] == 3  # p4 lacks a think score on one side
    assert m["p_gap_think"] == pytest.approx((0.3 + 0.2 + 0.0) / 3)
    assert m["p_gap_nothink"] == pytest.approx((0.0 + 0.1 + 0.2) / 3)
    assert m["p_diff_think"] == pytest.approx((0.3 - 0.2 + 0.0) / 3)
    assert m["p_diff_nothink"] == pytest.approx((0.0 + 0.1 - 0.2) / 3)
    assert m["delta_p_gap"] == pytest.approx(0.5 / 3 - 0.1)


def test_p_gap_interval_is_the_paired_percentile_bootstrap():
    n_boot, seed = 500, 11
    m = p_gap(gap_records(), "think", "nothink", n_boot=n_boot, seed=seed)
    gap_t, gap_b = np.array([0.3, 0.2, 0.0]), np.array([0.0, 0.1, 0.2])
    rng = np.random.default_rng(seed)  # the same resamples, drawn by hand
    draws = [rng.integers(0, 3, size=3) for _ in range(n_boot)]
    think = np.quantile([gap_t[i].mean() for i in draws], [0.025, 0.975])
    delta = np.quantile([gap_t[i].mean() - gap_b[i].mean() for i in draws], [0.025, 0.975])
    assert (m["p_gap_think_ci_low"], m["p_gap_think_ci_high"]) == pytest.approx(tuple(think))
    assert (m["delta_p_gap_ci_low"], m["delta_p_gap_ci_high"]) == pytest.approx(tuple(delta))
    assert 0.0 <= m["p_gap_think_ci_low"] <= m["p_gap_think"] <= m["p_gap_think_ci_high"] <= 0.3 + 1e-12


def test_p_gap_of_no_scored_pair_is_nan_not_an_error():
    records = gap_records().assign(p_yes=np.nan)
    m = p_gap(records, "think", "nothink", n_boot=100)
    assert m["n_pairs_scored"] == 0 and math.isnan(m["p_gap_think"]) and math.isnan(m["p_gap_think_ci_low"])


def decision_records(think_answer="Yes", nothink_answer="Yes", closed=True, tokens=5, parsed=True,
                     cut=()) -> pd.DataFrame:
    """Three pairs under think and nothink; `cut`: the pair ids whose think generations hit the token budget."""
    rows = []
    for arm, answer in (("think", think_answer), ("nothink", nothink_answer)):
        for i in range(3):
            for side in ("alpha", "alpha_prime"):
                thinking = arm == "think"
                rows.append({"pair_id": i, "side": side, "arm": arm, "answer": answer,
                             "parsed_answer": answer if parsed or not thinking else None,
                             "compliant": pd.NA if thinking else True, "trace_tokens": tokens if thinking else 0,
                             "think_closed": closed if thinking else True, "truncated": thinking and i in cut})
    return pd.DataFrame(rows).astype({"compliant": "boolean"})


def test_every_answer_the_same_is_one_warning():
    lines = decision_warnings(decision_records(), ("think", "nothink"))
    assert lines == ["every answer (12 of 12, think and nothink) is Yes: the model answers the same whoever the "
                     "person is, so no counterfactual flip can show; read the P(Yes) gap instead"]
    assert decision_warnings(decision_records(nothink_answer="No"), ("think", "nothink")) == []


def test_traces_never_closed_with_forced_answers_are_one_warning_not_two():
    """SmolLM2's case: every trace ends at EOS after 5 tokens, none near the budget: the warning says the model does
    not close its think block and does not tell the user to raise the budget."""
    records = decision_records(closed=False, parsed=False, nothink_answer="No")
    assert thinking_arms(records) == ["think"]
    (line,) = decision_warnings(records, ("think", "nothink"))
    assert line == ("6 of 6 think traces never closed their think block: 6 ended on their own (end of sequence) "
                    "without closing it (mean 5.0 tokens): the model does not keep to the think format, which a "
                    "larger budget will not change; use a model that closes its think block; 6 of those answers "
                    "were forced from P(Yes) at the trace's end (model.answer_source=forced)")
    assert "max_think_tokens" not in line


def test_traces_cut_by_the_budget_say_raise_it_apart_from_those_that_stopped():
    (line,) = decision_warnings(decision_records(closed=False, parsed=False, nothink_answer="No", cut=(0,)),
                                ("think", "nothink"))
    assert line.startswith("6 of 6 think traces never closed their think block: 2 hit the token budget before "
                           "closing it (mean 5.0 tokens): raise model.max_think_tokens; 4 ended on their own")


def test_empty_traces_and_unparsed_arms_are_named():
    (empty,) = decision_warnings(decision_records(tokens=0, nothink_answer="No"), ("think", "nothink"))
    assert empty == "every think trace is empty (0 tokens once whitespace is stripped): thinking had nothing to change"
    (spent,) = decision_warnings(decision_records(tokens=0, nothink_answer="No", cut=(0, 1, 2)), ("think", "nothink"))
    assert "; 6 of them spent the whole token budget on whitespace: " in spent  # 24 newlines, then the budget
    records = decision_records(nothink_answer="No").assign(parsed_answer=None)
    lines = decision_warnings(records, ("think", "nothink"))
    assert "no nothink output parsed to Yes or No (parse_rate_nothink 0): every answer was forced from P(Yes)" in lines


def test_depth_and_mcq_warnings():
    zero = pd.DataFrame({"pair_id": [1, 1], "side": ["alpha", "alpha_prime"], "K": [2, 2], "k": [1, 1], "cut": [0, 0]})
    assert depth_warnings(zero) == ["every depth cut is at token 0 (the traces are empty): CDPG reads the same P(Yes) "
                                    "at every depth"]
    short = pd.DataFrame({"pair_id": 1, "side": "alpha", "K": 4, "k": [1, 2, 3, 4], "cut": [1, 1, 2, 2]})
    assert depth_warnings(short) == ["every trace is shorter than K=4 tokens: depths repeat the same cut"]
    assert depth_warnings(short.assign(cut=[1, 2, 3, 4])) == []
    # the verdict's K = 2 and the K-sensitivity's 4 read from the same 2-token trace: each warning names its K
    both = pd.concat([short, pd.DataFrame({"pair_id": 1, "side": "alpha", "K": 2, "k": [1, 2], "cut": [1, 2]})])
    assert depth_warnings(both, K=2) == ["every trace is shorter than K=4 tokens, the finest of the K-sensitivity "
                                         "(probe.k_list): its depths repeat the same cut (the headline K=2 does not)"]
    assert depth_warnings(both.assign(cut=1), K=2) == ["every trace is shorter than K=2 tokens: depths repeat the "
                                                       "same cut"]
    mcq = pd.DataFrame({"answer_position": pd.array([1, 1, 1, 1], dtype="Int64"),
                        "truncated": [True, True, False, True]})
    assert mcq_warnings(mcq) == ["every answer is option B, whatever the permutation: the model ignores the question",
                                 "75% of outputs hit the token budget: raise arm.max_new_tokens"]
    assert mcq_warnings(mcq.assign(answer_position=pd.array([None] * 4, dtype="Int64"), truncated=False)) == [
        "no answer letter was found in any output: every position metric is undefined"]


def test_nothing_is_snapped_on_its_way_to_mlflow_or_the_screen():
    """Float noise is made 0 where a sum cancels (tests/test_numbers.py), never on the way out: a small value,
    a p of 3.2e-14 above all, is logged and printed as it is."""
    from fairaudit.analysis.numbers import format_number
    from fairaudit.tracking.content import finite_metrics, json_metrics
    from fairaudit.views.render import display

    small = {"trunc_ccp_chi2_p": 3.2e-14, "partial_rho_length_pbs_p": 1.5e-37, "n": 3}
    assert finite_metrics(small) == small and json_metrics(small) == small
    assert format_number(3.2e-14) == "3.2e-14" and format_number(-5.2567378e-18) == "-5.26e-18"
    shown = display(pd.DataFrame({"slope_k5": [0.0, 0.25], "cell": ["c", "d"]}))
    assert shown["slope_k5"].tolist() == ["0.000", "0.250"]


# ---------------------------------------------------------------- every probe's run, end to end

FAMILY_RUNS = {"decision": ("model=tiny_qwen3", "dataset.n=3"),  # the grid a probe of each data-set family runs on
               "mcq": ("model=tiny_qwen3", "dataset=mmlu", "arm=cot", "dataset.n=2", "arm.max_new_tokens=8")}
QUICKER = {  # settings that keep a shipped probe's run short; a probe not named here runs with its own defaults
    "cdpg": ("probe.K=2", "probe.k_list=[2]", "probe.n_boot=100"),
    "position": ("probe.truncation.enabled=false",),
    "influence": ("probe.max_block_tokens=4", "probe.conditions=[masked]"),
    "bbq": ("probe.K=2", "probe.permutations=false"),
}
FIRST_WORDS = {"counterfactual": "think against nothink on 3 Male/Female adult pairs", "btm": "nothink -> think on 3",
               "cdpg": "CDPG on 3 Male/Female adult pairs",
               "position": "cot on 2 mmlu questions x 4 cyclic permutations",
               "influence": "influence between private reasoning channels on 2 MCQ items"}
PROBES = registry.names("probe")


def probe_run(probe: str) -> tuple[str, ...]:
    """The overrides of a short run of `probe` on the tiny model: its family's grid (a probe that reads one kind of
    data set: the first that has it, under the probe's own arms), then its own quicker settings."""
    needs = registry.probe_classes()[probe].needs
    grid = FAMILY_RUNS[needs.family] if needs.data is None else (
        "model=tiny_qwen3", f"dataset={registry.datasets_reading(needs.data)[0]}", "dataset.n=3",
        "model.max_think_tokens=8")
    return (*grid, f"probe={probe}", *QUICKER.get(probe, ()))


@pytest.mark.slow
@pytest.mark.parametrize("probe", [p if p == "counterfactual" else pytest.param(p, marks=pytest.mark.long)
                                   for p in PROBES])
def test_every_probe_prints_its_verdict_before_its_table_and_keeps_it_as_the_run_description(tmp_path, probe):
    from mlflow.tracking import MlflowClient

    result = run_app(tmp_path, *probe_run(probe))
    assert result.returncode == 0, result.stderr[-3000:]
    stdout = result.stdout.splitlines()
    table = next(i for i, line in enumerate(stdout) if line.startswith("┏"))
    verdict = [line for line in stdout[:table - 1] if line.strip()]
    assert verdict, stdout[:table]
    if probe in FIRST_WORDS:
        assert verdict[0].startswith(FIRST_WORDS[probe]), stdout[:table]
    if issubclass(registry.probe_classes()[probe], PairedProbe):  # a paired probe's verdict says the P(Yes) gap
        gap = "P(Yes) gap, mean |P(Yes | Male) - P(Yes | Female)| over 3 pairs"
        assert any(line.startswith(gap) for line in verdict)
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("fairaudit").experiment_id])
    assert run.data.tags["mlflow.note.content"].split("\n\n")[0] == verdict[0]
    assert [d.dataset.name for d in run.inputs.dataset_inputs] == [run.data.tags["dataset"]]
    url = f"#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}?workflowType=machine_learning"
    assert f"then open: http://127.0.0.1:5000/{url}" in result.stderr.splitlines()
    assert any(line.startswith("start the MLflow UI with: ")
               and line.endswith(f"ui --backend-store-uri sqlite:///{tmp_path}/mlflow.db")
               for line in result.stderr.splitlines())
    if probe == "counterfactual":
        assert {"p_gap_think", "p_gap_think_ci_low", "p_gap_nothink", "delta_p_gap"} <= set(run.data.metrics)


def test_every_shipped_probe_implements_its_own_verdict():
    from fairaudit.probes import Needs, Probe, SampleView

    classes = registry.probe_classes()
    assert list(classes) == PROBES and len(PROBES) >= 5  # every conf/probe/<name>.yaml names its class
    for name, cls in classes.items():
        assert issubclass(cls, Probe) and not getattr(cls, "__abstractmethods__"), name
        assert cls.verdict is not Probe.verdict and isinstance(cls.needs, Needs) and isinstance(cls.samples, SampleView)


def test_the_influence_verdict_names_each_rate_with_its_interval_and_counts():
    from fairaudit.probes import ProbeResult
    from fairaudit.probes.influence import InfluenceProbe

    probe = InfluenceProbe(conditions=["masked"])
    metrics = {"n_valid_masked": 4, "n_traces_masked": 4, "control_zero_count_masked": 8, "control_n_masked": 8}
    for d, (n, k, s) in {"a_to_b": (4, 3, 2), "b_to_a": (4, 0, 0)}.items():
        metrics.update({f"n_contrasts_{d}_masked": n, f"influence_k_{d}_masked": k, f"substantive_k_{d}_masked": s,
                        f"influence_rate_{d}_masked": k / n, f"influence_rate_{d}_masked_ci_low": 0.3,
                        f"influence_rate_{d}_masked_ci_high": 0.95, f"substantive_rate_{d}_masked": s / n,
                        f"substantive_rate_{d}_masked_ci_low": 0.15, f"substantive_rate_{d}_masked_ci_high": 0.85})
    traces = pd.DataFrame({"question_id": [1, 2]})
    result = ProbeResult(metrics=metrics, tables={}, figures={}, records={"traces": traces}, headline=[])
    line = probe.verdict(result)[1]
    assert ("A->B: 3 of 4 donor swaps raised the target's NLL (rate 0.75 [0.3, 0.95]), 2 of them by more than "
            "0.05 nats/token (substantive rate 0.5 [0.15, 0.85])") in line
    assert "B->A: 0 of 4 donor swaps raised the target's NLL (rate 0 [0.3, 0.95]), 0 of them" in line
