"""What qualifies the numbers travels with them: why each n/a is undefined (hand-made metrics), a run's warnings
and reasons logged as tags and warnings.txt (a real sqlite MLflow store, read back), the sweep table's marks and
lines, the experiment's jobs view, a sweep parent's params and the sweep's checks grouped per problem."""

from __future__ import annotations

import json
import math

import pytest
from omegaconf import OmegaConf

from fairaudit.analysis.undefined import GENERAL, footnotes, why_undefined
from fairaudit.job.grid import override_params
from fairaudit.job.preflight import GridJob, each_job
from fairaudit.terminal.results import summary_table
from fairaudit.tracking import tags as t
from fairaudit.tracking.jobs_view import refresh_jobs_view
from fairaudit.tracking.notes import table_notes, warning_lines
from fairaudit.tracking.runs import Tracker
from fairaudit.tracking.ui import JOBS_VIEW, RUN_NAME_COLUMN, first_screen

NAN = math.nan
YES = ("every answer (8 of 8, think and nothink) is Yes: the model answers the same whoever the person is, so no "
       "counterfactual flip can show; read the P(Yes) gap instead")


def test_each_undefined_metric_says_why_from_the_counts_beside_it():
    metrics = {"n_pairs": 20, "cell_a": 20, "cell_b": 0, "cell_c": 0, "cell_d": 0, "d_disp_c_think": NAN,
               "asym_c": NAN, "c_b_ratio": NAN, "delta_d_cf_ci_low": NAN, "delta_d_cf": 0.0, "delta_d_cf_ci_n": 1.0,
               "n_pairs_truncated": 20, "n_pairs_complete": NAN, "mcnemar_log10_p_complete": NAN, "odd": None,
               "cdpg_slope_b": NAN, "cdpg_n_b": 0}
    assert why_undefined(metrics) == {
        "d_disp_c_think": "no pair in cell c (a flip the treatment created)",
        "asym_c": "no pair in cell c (a flip the treatment created)",
        "c_b_ratio": "no discordant pair (cell_b = cell_c = 0): c/b is 0/0",
        "delta_d_cf_ci_low": "too few units for an interval (delta_d_cf_ci_n = 1)",
        "n_pairs_complete": "every pair holds a trace the token budget cut (n_pairs_truncated = 20): no complete "
                            "pair to compute it over",
        "mcnemar_log10_p_complete": "every pair holds a trace the token budget cut (n_pairs_truncated = 20): no "
                                    "complete pair to compute it over",
        "odd": GENERAL,
        "cdpg_slope_b": "no pair in cell b (a baseline flip the treatment resolved)"}
    # among the complete pairs: their own counts say why
    complete = {"n_pairs_complete": 3, "cell_c_complete": 0, "asym_c_complete": NAN}
    assert why_undefined(complete) == {"asym_c_complete": "no pair in cell c (a flip the treatment created), over "
                                                          "the complete pairs"}
    assert why_undefined(metrics, ["asym_c", "cell_a", "missing"]) == {
        "asym_c": "no pair in cell c (a flip the treatment created)"}


def test_the_runs_table_tells_under_it_why_each_n_a_is_n_a():
    metrics = {"cell_c": 0, "d_disp_c_think": NAN, "asym_c": NAN, "p_gap_think": 0.007}
    table = summary_table("t", metrics, ["cell_c", "d_disp_c_think", "asym_c", "p_gap_think"])
    assert table.notes == ["n/a: d_disp_c_think, asym_c: no pair in cell c (a flip the treatment created)"]
    assert footnotes({}) == []


@pytest.fixture()
def tracker(tmp_path):
    return Tracker(f"sqlite:///{tmp_path}/mlflow.db", "notes")


def test_a_runs_warnings_and_reasons_are_logged_as_tags_and_warnings_txt(tracker, tmp_path):
    run_id = tracker.start("adult | m counterfactual think", {t.KIND_TAG: "job"}, {})
    verdict = ["think against nothink on 2 pairs: nothing.", f"warning: {YES}", "warning: second"]
    tracker.content.log_verdict(verdict, {"cell_c": 0, "asym_c": NAN, "d_disp_c_think": NAN, "n_pairs": 2})
    tracker.end()
    run = tracker.client.get_run(run_id)
    assert run.data.tags[t.WARNINGS_TAG] == f"{YES}\nsecond"
    assert json.loads(run.data.tags[t.UNDEFINED_TAG]) == {
        "no pair in cell c (a flip the treatment created)": ["asym_c", "d_disp_c_think"]}
    assert run.data.tags[t.NOTE_TAG] == "\n\n".join(verdict)
    folder = tracker.client.download_artifacts(run_id, "", str(tmp_path / "got"))
    assert open(f"{folder}/warnings.txt").read() == f"{YES}\nsecond\n"
    assert open(f"{folder}/verdict.txt").read() == "\n".join(verdict) + "\n"


def child(client, experiment: str, num: int, status: str = "FINISHED", warnings: str = "", metrics=None,
          undefined=None):
    tags = {t.KIND_TAG: "job", t.JOB_NUM_TAG: str(num), t.WARNINGS_TAG: warnings,
            t.UNDEFINED_TAG: json.dumps(undefined or {})}
    run = client.create_run(experiment, tags=tags, run_name=f"seed {num} | m adult counterfactual think")
    for name, value in (metrics or {}).items():
        client.log_metric(run.info.run_id, name, value)
    client.set_terminated(run.info.run_id, status=status)
    return client.get_run(run.info.run_id)


@pytest.mark.slow
def test_the_sweep_table_marks_each_jobs_warnings_and_says_why_each_n_a_is_n_a(tmp_path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.create_experiment("e", artifact_location=(tmp_path / "a").as_uri())
    why = "no pair in cell c (a flip the treatment created)"
    runs = [child(client, experiment, 0, warnings=f"{YES}\nonly job 0", metrics={"n_pairs": 2},
                  undefined={why: ["asym_c"]}),
            child(client, experiment, 1, warnings=YES, metrics={"n_pairs": 2, "asym_c": 0.5}),
            child(client, experiment, 2, status="FAILED")]
    marks, lines = table_notes(runs, ["n_pairs", "asym_c"])
    assert [marks[run.info.run_id] for run in runs] == ["W1, W2", "W1", ""]
    assert lines == [f"warning: W1 (jobs 0, 1): {YES}", "warning: W2 (job 0): only job 0",
                     f"n/a: asym_c (job 0): {why}", "n/a: job 2 ended FAILED: no metrics"]
    assert warning_lines(runs) == [f"warning: jobs 0, 1: {YES}", "warning: job 0: only job 0"]


@pytest.mark.slow
def test_the_experiment_page_opens_on_its_jobs_with_whole_names_axes_and_headline_metrics(tmp_path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.create_experiment("e", artifact_location=(tmp_path / "a").as_uri())
    headline = ["n_pairs", "cell_a", "cell_b", "cell_c", "cell_d", "mcnemar_log10_p", "mcnemar_p", "p_gap_think",
                "p_gap_nothink", "delta_p_gap"]
    for seed in (0, 1):
        client.create_run(experiment, run_name=f"seed {seed} | smollm2 adult counterfactual think", tags={
            t.KIND_TAG: "job", "model": "smollm2", "dataset": "adult", "probe": "counterfactual", "arm": "think",
            "seed": str(seed), "checkpoint": "base", t.HEADLINE_TAG: json.dumps(headline)})
    client.create_run(experiment, run_name="sweep 2026-12-03 11:34 counterfactual dataset.seed=range(5)",
                      tags={t.KIND_TAG: "sweep"})  # not a job: its longer name sets no width
    assert refresh_jobs_view(client, experiment) == JOBS_VIEW
    envelope = json.loads(client.get_experiment(experiment).tags[f"mlflow.sharedViewState.{JOBS_VIEW}"])
    state = json.loads(envelope["state"])
    axes = ["params.`model`", "params.`dataset`", "params.`probe`", "params.`arm`", "params.`seed`"]
    metrics = [f"metrics.`{m}`" for m in ["n_pairs", "cell_a", "cell_b", "cell_c", "cell_d", "mcnemar_log10_p",
                                          "p_gap_think", "p_gap_nothink", "delta_p_gap"]]
    # the names whole (43 characters), then as many metrics as a 1,400-px window shows beside them (1070 px of table,
    # 64 for Created, 80 a metric: 8), the P(Yes) gaps among them, then the rest and the axes the names spell out
    name = int(5.8 * 43 + 40)
    assert (1070 - name - 64) // 80 == 8
    shown = metrics[:5] + metrics[6:] + metrics[5:6]
    assert state["selectedColumns"] == shown + axes
    assert state["columnOrder"] == [RUN_NAME_COLUMN, "runDateAndNestInfo", *shown, *axes]
    assert state["columnWidths"] == {RUN_NAME_COLUMN: name, "runDateAndNestInfo": 64, **{m: 80 for m in metrics}}
    # longer names leave room for 5 (600 px of name): the gaps stay on that screen, the other metrics follow
    names = [m.removeprefix("metrics.`").removesuffix("`") for m in metrics]
    assert first_screen(names, 600) == names[:2] + names[6:] + names[2:6]
    assert state["searchFilter"] == "tags.`fairaudit.kind` = 'job'" and state["orderByKey"] != "attributes.start_time"


def test_a_sweep_parent_logs_every_swept_key_a_studys_too():
    overrides = ["model=smollm2", "+experiment=seed_sweep", "dataset=adult,compas"]
    assert override_params(overrides, {"dataset": "adult,compas", "dataset.seed": "range(5)"}) == {
        "sweep.model": "smollm2", "sweep.experiment": "seed_sweep", "sweep.dataset": "adult,compas",
        "sweep.dataset.seed": "range(5)"}


def test_a_sweep_problem_every_job_meets_reads_as_a_runs_own_and_one_some_meet_names_the_first():
    jobs = [GridJob(num, [f"dataset={name}"], f"dataset={name}", OmegaConf.create({"dataset": name}), {})
            for num, name in enumerate(["adult", "compas", "credit"])]
    assert each_job(jobs, lambda job: "server down", key=lambda job: "one backend") == ["server down"]
    found = each_job(jobs, lambda job: f"{job.config.dataset} is missing" if job.num else None)
    assert found == ["job 1 (dataset=compas): compas is missing", "job 2 (dataset=credit): credit is missing"]
    same = each_job(jobs, lambda job: "n too large" if job.num else None)
    assert same == ["job 1 (dataset=compas): n too large"]
