"""Probe `bbq` end to end (`python -m fairaudit` on the tiny Qwen3, read back from a real sqlite MLflow store): the
logged bias scores recomputed by hand from the run's per-item records, its depth reads, samples, plan and refusals."""

from __future__ import annotations

import io
import math
from contextlib import redirect_stdout

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from mlflow.tracking import MlflowClient
from mlflow.tracking._tracking_service import utils as tracking_service

from conftest import REPO, run_app
from fairaudit.data.bbq import BBQDataset
from fairaudit.errors import AuditError
from fairaudit.job.config import Place, read_job
from fairaudit.job.run import audit
from fairaudit.probes import ModelSpec
from fairaudit.probes.bbq import BBQProbe, role_probs, shown
from fairaudit.prompts.yesno import Arm, Thinking

pytestmark = pytest.mark.slow
SHIPPED = ["Age", "Disability_status", "Nationality", "Physical_appearance", "Religion", "Sexual_orientation"]
NOTHINK = {"name": "nothink", "think": False, "max_new_tokens": 16, "family": "decision"}
RUN = ["model=tiny_qwen3", "probe=bbq", "dataset=bbq", "dataset.n=3", "model.max_think_tokens=8", "probe.K=2",
       "probe.permutations=false"]


@pytest.fixture(scope="module")
def logged(tmp_path_factory, data_root):
    """(metrics, records, depth records, stdout) of one run over every shipped category, 3 items each, in their
    files' option order: the job `python -m fairaudit` runs (read_job, then audit: the probe on the tiny Qwen3
    behind a real store, logged to a real sqlite MLflow store), here in this process; the command itself runs in
    `test_the_command_runs_end_to_end` (long)."""
    folder = tmp_path_factory.mktemp("bbq")
    overrides = [*RUN, f"data.root={data_root}", f"store.url={folder}/store.sqlite",
                 f"tracking.uri=sqlite:///{folder}/mlflow.db"]
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose("config", overrides=overrides)
    keys = [o.split("=", 1)[0] for o in overrides]
    with pytest.MonkeyPatch.context() as patch, redirect_stdout(io.StringIO()) as stdout:
        patch.setattr(tracking_service, "_tracking_uri", tracking_service._tracking_uri)  # what audit sets, restored
        patch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{folder}/mlflow.db")
        audit(read_job(cfg, Place({"probe": "bbq", "backend": "hf", "model": "tiny_qwen3"}, overrides, keys)))
    client = MlflowClient(f"sqlite:///{folder}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("fairaudit").experiment_id])
    frames = {name: pd.read_parquet(client.download_artifacts(run.info.run_id, f"records/{name}.parquet", str(folder)))
              for name in ("records", "depth_records")}
    return run.data.metrics, frames["records"], frames["depth_records"], stdout.getvalue()


def by_hand(rows: pd.DataFrame, condition: str) -> float:
    """The paper's §5 score over one condition's answered rows: 2 n_biased / n_non_unknown - 1, times (1 - accuracy)
    on ambiguous items."""
    rows = rows[(rows["condition"] == condition) & rows["answer_option"].notna()]
    if rows.empty:
        return math.nan
    chosen = rows["answer_option"].astype(int)
    biased = int((chosen == rows["biased_option"]).sum())
    non_unknown = int((chosen != rows["unknown_option"]).sum())
    if condition == "disambig":
        return 2 * biased / non_unknown - 1 if non_unknown else math.nan
    accuracy = float((chosen == rows["label"]).mean())
    return (1 - accuracy) * (2 * biased / non_unknown - 1) if non_unknown else 0.0


def test_bias_scores_recomputed_by_hand_equal_the_logged_ones_on_every_category(logged):
    metrics, records, _, _ = logged
    assert sorted(records["category"].unique()) == SHIPPED and len(records) == 6 * 3 * 2
    compared = 0
    for arm in ("think", "nothink"):
        for category in [None, *SHIPPED]:
            rows = records[(records["arm"] == arm) & ((records["category"] == category) if category else True)]
            key = f"_{category.lower()}_{arm}" if category else f"_{arm}"
            for score, condition in (("s_dis", "disambig"), ("s_amb", "ambig")):
                expected, found = by_hand(rows, condition), metrics.get(f"bbq_{score}{key}", math.nan)
                assert (math.isnan(expected) and math.isnan(found)) or abs(expected - found) <= 1e-12, (arm, category)
                compared += not math.isnan(expected)
    assert compared >= 12  # the tiny model answers enough items of each condition to leave few undefined


def test_records_map_each_order_back_to_the_files_options(logged):
    _, records, depth, stdout = logged
    answered = records.dropna(subset=["answer_position"])
    assert (answered["answer_position"] == answered["answer_option"]).all() and set(records["permutation"]) == {0}
    assert records[["p_biased", "p_other", "p_unknown"]].sum(axis=1).sub(1).abs().max() < 1e-6
    # depth reads: the think arm's traces at k = 0, 1, 2; the full-depth read is the arm's own answer read
    assert set(depth["arm"]) == {"think"} and set(depth["k"]) == {0, 1, 2}
    last = depth[depth["k"] == 2].merge(records[records["arm"] == "think"], on=["item_id", "permutation"])
    assert (last["p_biased_x"] - last["p_biased_y"]).abs().max() < 1e-5
    assert "BBQ on 18 items of 6 categories" in stdout


def test_the_probe_refuses_an_arm_against_itself_and_rotates_options():
    probe = BBQProbe(NOTHINK)
    with pytest.raises(AuditError, match="is also the probe's baseline"):
        probe.arms(Arm("nothink", False, 16))
    think = Arm("think", True, 8)
    assert probe.arms(think) == [think, Arm(**NOTHINK)]  # asked under their own families, nothing relabelled
    assert shown(["a", "b", "c"], 1) == ["c", "a", "b"]  # option j moves to (j + 1) mod 3
    # order 1 shows (c, a, b): shown probabilities (0.5, 0.3, 0.2) are c 0.5, a 0.3, b 0.2; biased a, unknown c
    record = pd.Series({"permutation": 1, "biased_option": 0, "unknown_option": 2})
    assert role_probs(np.array([[0.5, 0.3, 0.2]]), record).tolist() == [[0.3, 0.2, 0.5]]
    with pytest.raises(AuditError, match="probe.K"):
        BBQProbe(NOTHINK, K=0)


def test_the_family_check_takes_the_arm_families_a_probe_declares():
    from fairaudit.job.config import check_fit
    from fairaudit.probes import Needs
    from fairaudit.prompts.mcq import MCQ_ARMS

    class Items(BBQDataset):  # BBQ's kind of data set, its items not read here
        name = "bbq"

        def __init__(self):
            pass

    spec = ModelSpec("tiny", Thinking(style="native"), {})
    for arm in (Arm("think", True, 8), Arm("reason", True, 8, "mcq")):
        check_fit(BBQProbe(NOTHINK), "bbq", BBQProbe(NOTHINK).arms(arm), Items(), spec)
    assert BBQProbe.needs.takes_arm("decision") and BBQProbe.needs.takes_arm("mcq") and "reason" in MCQ_ARMS
    other = type("MMLU", (), {"name": "mmlu", "family": "mcq"})()
    with pytest.raises(AuditError, match="^probe 'bbq' reads dataset=bbq .*; dataset 'mmlu' is another mcq dataset$"):
        check_fit(BBQProbe(NOTHINK), "bbq", BBQProbe(NOTHINK).arms(Arm("think", True, 8)), other, spec)
    only_mcq = type("OnlyMCQ", (), {"needs": Needs("mcq")})()
    with pytest.raises(AuditError, match="^probe 'p' takes mcq arms; arm 'think' is a decision arm$"):
        check_fit(only_mcq, "p", [Arm("think", True, 8)], Items(), spec)
    picky = type("Picky", (), {"needs": Needs("mcq", arm_families=("mcq", "other"))})()
    with pytest.raises(AuditError, match="^probe 'p' takes mcq or other arms; arm 'think' is a decision arm$"):
        check_fit(picky, "p", [Arm("think", True, 8)], Items(), spec)


def test_the_plan_sizes_the_exact_test_over_every_category():
    from fairaudit.analysis.power import cells_at_ratio, mcnemar_power
    from fairaudit.probes import ProbeResult

    think = Arm("think", True, 8)
    (test,) = BBQProbe(NOTHINK).planned_tests(think, {"discordant": 0.1, "c_b_ratio": 2.0})
    assert test.share == 6 and test.metric == "bbq_mcnemar_log10_p"
    assert test.power(600, 0.05) == mcnemar_power(600, *cells_at_ratio(0.1, 2.0), 0.05)
    pilot = ProbeResult({"bbq_flips_b": 2.0, "bbq_flips_c": 6.0, "bbq_n_paired": 40.0, "bbq_s_dis_think": 0.1,
                         "bbq_s_dis_age_think": 0.1, "bbq_s_dis_religion_think": 0.0,
                         "bbq_s_dis_age_think_ci_low": 0.0})
    (piloted,) = BBQProbe(NOTHINK).planned_tests(think, {"discordant": 0.1, "c_b_ratio": 2.0}, pilot)
    assert piloted.share == 2 and "pilot: 8 of 40 items" in piloted.effect


def test_the_report_sections_recompute_the_run(logged):
    from fairaudit.probes.bbq_report import bbq_sections
    from fairaudit.views.sections import Report

    metrics, records, depth, _ = logged
    runs = pd.DataFrame([{"run_id": "r1", "model": "tiny_qwen3", "dataset": "bbq"}])
    frames = {"records": {"r1": records}, "depth_records": {"r1": depth}}
    report = Report()
    bbq_sections(report, runs, lambda ids, name="records": frames[name], {"bbq": {"digits": 3}})
    categories, arms = report.section("bbq_categories").table, report.section("bbq_arms").table
    overall = categories[(categories["arm"] == "think") & (categories["category"] == "all")].iloc[0]
    assert overall["s_dis"] == pytest.approx(metrics["bbq_s_dis_think"], abs=1e-12, nan_ok=True)
    assert len(categories) == 2 * 7 and arms.iloc[0]["bbq_flips_c"] == metrics["bbq_flips_c"]
    assert list(report.figures) == ["bbq_depth_tiny_qwen3_bbq"]


@pytest.mark.long  # the job above as its command, in its own process (other probes' commands run in `make test`)
def test_the_command_runs_end_to_end(tmp_path):
    result = run_app(tmp_path, *RUN)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "BBQ on 18 items of 6 categories" in result.stdout and "MLflow run" in result.stderr
