"""What a person sees: run names, short params, the sweep parent's summary, the console's tables and numbers."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from datetime import datetime
from pathlib import Path

import pandas as pd
import pytest

from conftest import run_app
from fairaudit.analysis.numbers import format_number
from fairaudit.job.grid import sweep_run_name, swept
from fairaudit.job.tags import job_run_name
from fairaudit.tracking.content import json_metrics
from servers import free_port, wait_until

TAGS = {"model": "smollm2", "dataset": "adult", "probe": "counterfactual", "arm": "think", "seed": "3",
        "checkpoint": "step100"}


@pytest.mark.parametrize("value, shown", [
    (-5.257e-18, "-5.26e-18"), (2.2e-46, "2.2e-46"), (float("nan"), "n/a"), (0.123456, "0.1235"), (3.0, "3"),
    (1.5e-7, "1.5e-07"), (12345678.9, "1.23e+07"), (float("-inf"), "-inf"), (42, "42"), ("Yes", "Yes"),
])
def test_numbers_print_rounded_and_as_they_are(value, shown):  # float noise is 0 where a sum cancels (test_numbers)
    assert format_number(value) == shown


def test_metrics_json_is_strict_json():
    metrics = json_metrics({"asym_c": math.nan, "n_pairs": 20, "ratio": math.inf, "preferred": "A"})
    assert json.loads(json.dumps(metrics, allow_nan=False)) == {"asym_c": None, "n_pairs": 20, "ratio": None,
                                                                "preferred": "A"}


@pytest.mark.parametrize("varied, name", [
    (["dataset"], "adult | smollm2 counterfactual think"),
    (["dataset.seed", "model.checkpoint.label"], "seed 3 step100 | smollm2 adult counterfactual think"),
    (["model", "arm", "dataset.n"], "smollm2 think | adult counterfactual"),
    ([], "smollm2 adult counterfactual think"),
])
def test_run_names_lead_with_what_differs(varied, name):
    assert job_run_name(TAGS, varied) == name


def test_swept_keys_come_from_the_command_line_and_the_sweeper_params():
    found = swept(["model=tiny_qwen3", "dataset=adult,compas", "dataset.seed=range(0,3)"],
                  {"probe": "counterfactual,cdpg"})
    assert found == {"dataset": "adult,compas", "dataset.seed": "range(0,3)", "probe": "counterfactual,cdpg"}
    assert sweep_run_name(found, datetime(2026, 11, 30, 8, 51)) == (
        "sweep 2026-11-30 08:51 dataset=adult,compas dataset.seed=range(0,3) probe=counterfactual,cdpg")


DATASETS = ("adult", "compas", "credit")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """One 3-dataset sweep on the tiny Qwen3 (2 pairs each), read back from its sqlite store: (result, client,
    parent run, children by run name, tmp folder)."""
    from mlflow.tracking import MlflowClient

    tmp_path = tmp_path_factory.mktemp("sweep")
    result = run_app(tmp_path, "model=tiny_qwen3", "dataset.n=2", "model.max_think_tokens=8", "-m",
                     f"dataset={','.join(DATASETS)}")
    assert result.returncode == 0, result.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    found = client.search_runs([client.get_experiment_by_name("fairaudit").experiment_id])
    (parent,) = [r for r in found if r.data.tags["fairaudit.kind"] == "sweep"]
    children = {r.info.run_name: r for r in found if r.data.tags["fairaudit.kind"] == "job"}
    return result, client, parent, children, tmp_path


@pytest.mark.slow
def test_sweep_parent_children_and_console_at_a_glance(sweep):
    result, client, parent, children, tmp_path = sweep
    experiment = client.get_experiment(parent.info.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert set(children) == {f"{d} | tiny_qwen3 counterfactual think" for d in DATASETS}
    adult = children["adult | tiny_qwen3 counterfactual think"]
    assert {k: adult.data.params[k] for k in ("model", "dataset", "probe", "arm", "seed", "checkpoint")} == {
        "model": "tiny_qwen3", "dataset": "adult", "probe": "counterfactual", "arm": "think", "seed": "0",
        "checkpoint": "base"}
    artifacts = {a.path for a in client.list_artifacts(adult.info.run_id)}
    assert {"samples.html", "samples.jsonl", "metrics.json"} <= artifacts
    metrics_json = client.download_artifacts(adult.info.run_id, "metrics.json", str(tmp_path))
    metrics = json.loads(open(metrics_json).read(), parse_constant=lambda c: pytest.fail(f"{c} in metrics.json"))
    assert metrics["n_pairs"] == 2
    page = open(client.download_artifacts(adult.info.run_id, "samples.html", str(tmp_path))).read()
    assert page.count("<section class='item") == 2 and "Male" in page and "Female" in page

    assert re.fullmatch(r"sweep \d{4}-\d\d-\d\d \d\d:\d\d counterfactual dataset=adult,compas,credit",
                        parent.info.run_name)
    assert parent.data.params["sweep.dataset"] == "adult,compas,credit"
    assert parent.data.params["sweep.model"] == "tiny_qwen3"
    assert re.fullmatch(r"[0-9a-f]{40}", parent.data.tags["mlflow.source.git.commit"])
    parent_files = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"multirun.yaml", "sweep_summary.json", "config", "tables"} <= parent_files
    table = pd.read_parquet(client.download_artifacts(parent.info.run_id, "tables/sweep_summary.parquet",
                                                      str(tmp_path)))
    assert table.set_index("dataset").loc["adult", "cell_a"] == adult.data.metrics["cell_a"]
    summary = json.loads(open(client.download_artifacts(parent.info.run_id, "sweep_summary.json",
                                                        str(tmp_path))).read())
    assert sorted(row[0] for row in summary["data"]) == sorted(children)

    assert "sweep jobs" in result.stdout and "[HYDRA]" not in result.stdout and "MLflow run" not in result.stdout
    assert f"sweep parent run {parent.info.run_id}: 3 jobs, 3 finished" in result.stderr
    assert f"fairaudit report select.parent={parent.info.run_id}" in result.stderr
    assert " INFO " not in result.stderr and "Launching 3 jobs" in result.stderr


@pytest.mark.slow
def test_the_sweeps_parent_holds_its_verdict_and_each_jobs_headline_metrics_by_step(sweep):
    """The description is the sweep's verdict, a line per job with its first verdict line and P(Yes) gap; each
    headline metric is one key on the parent, logged at step = the job's number (no per-job copies)."""
    result, client, parent, children, _ = sweep
    note = parent.data.tags["mlflow.note.content"].split("\n\n")
    family = note[:4]  # first, at the top of the run's page: the family of tests, then what ran, each job, warnings
    assert note[4] == ("3 jobs, 3 finished; each job's headline metrics are on this run at step = the job's number "
                       "(tables/sweep_summary.parquet holds them all).")
    by_num = {int(run.data.tags["fairaudit.job_num"]): run for run in children.values()}
    assert sorted(by_num) == [0, 1, 2]
    jobs = note[5:8]
    assert all(line.startswith("warning: ") for line in note[8:])
    assert family and family[0].startswith("3 tests (mcnemar_log10_p: one per model x dataset hypothesis) across the "
                                           "sweep's 3 finished jobs: ")
    assert [line.split(" · ")[0] for line in family[1:]] == list(DATASETS)   # each test's p, Holm p and BH p
    assert all(re.search(r": p = \S+, Holm p = \S+, BH p = \S+$", line) for line in family[1:])
    for num, line in enumerate(jobs):
        run, dataset = by_num[num], DATASETS[num]
        metrics = run.data.metrics
        assert line.startswith(f"job {num} · {dataset}: think against nothink on 2 ")
        assert run.data.tags["mlflow.note.content"].split("\n\n")[0] in line  # the job's own first verdict line
        assert f"P(Yes) gap think {format_number(metrics['p_gap_think'])} [" in line
        assert f", difference {format_number(metrics['delta_p_gap'])} [" in line
        assert f"{format_number(metrics['delta_p_gap_ci_low'])}, {format_number(metrics['delta_p_gap_ci_high'])}]" \
            in line
    assert jobs == [line for line in result.stdout.splitlines() if line.startswith("job ")]  # printed too
    assert family[0] in result.stdout
    with tempfile.TemporaryDirectory() as tmp:  # the whole verdict is its verdict.txt, as a job's is
        saved = Path(client.download_artifacts(parent.info.run_id, "verdict.txt", tmp)).read_text()
    assert saved.splitlines() == [line for line in note if line]

    headline = json.loads(by_num[0].data.tags["fairaudit.headline"])
    logged = {name for name in headline if any(name in run.data.metrics for run in children.values())}  # finite
    family_counts = {"family_n_tests", "family_n_significant", "family_n_significant_holm", "family_n_significant_bh"}
    tests = {f"family/mcnemar_{name}{suffix}/{dataset}" for name in ("p", "log10_p") for suffix in ("", "_holm", "_bh")
             for dataset in DATASETS}
    assert set(parent.data.metrics) == logged | family_counts | tests  # one key per headline metric, no per-job copies
    assert parent.data.metrics["family_n_tests"] == 3
    for name in ("cell_c", "p_gap_think", "delta_p_gap"):
        history = client.get_metric_history(parent.info.run_id, name)
        assert sorted((m.step, m.value) for m in history) == [(n, by_num[n].data.metrics[name]) for n in range(3)]


@pytest.mark.slow
def test_the_console_sweep_table_shows_the_p_yes_gaps(sweep):
    result, _, _, children, _ = sweep
    header = next(line for line in result.stdout.splitlines() if "┃ run" in line)
    columns = [c.strip() for c in header.strip("┃").split("┃")]
    assert columns[:2] == ["run", "status"] and columns[-3:] == ["p_gap_think", "p_gap_nothink", "delta_p_gap"]
    adult = children["adult | tiny_qwen3 counterfactual think"].data.metrics
    row = next(line for line in result.stdout.splitlines() if line.startswith("│ adult"))
    assert row.rstrip("│ ").endswith(format_number(adult["delta_p_gap"]))


@pytest.mark.slow
def test_the_sweeps_compare_view_is_saved_on_its_experiment(sweep):
    """The view the sweep prints (compare its jobs: ...): MLflow's saved-view tag on the experiment, whose state
    lists the jobs alone and a parallel-coordinates chart over the swept axis and the P(Yes) gaps."""
    result, client, parent, children, _ = sweep
    experiment = client.get_experiment(parent.info.experiment_id)
    envelope = json.loads(experiment.tags[f"mlflow.sharedViewState.{parent.info.run_id}"])
    assert envelope["name"] == parent.info.run_name
    state = json.loads(envelope["state"])
    assert state["searchFilter"] == f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
    assert state["orderByKey"] != "attributes.start_time"  # sorted by start time, MLflow nests them under the parent
    (chart,) = state["compareRunCharts"]
    assert chart["type"] == "PARALLEL" and chart["selectedParams"] == ["dataset"]
    assert chart["selectedMetrics"][-3:] == ["p_gap_think", "p_gap_nothink", "delta_p_gap"]
    assert "params.`dataset`" in state["selectedColumns"] and "metrics.`delta_p_gap`" in state["selectedColumns"]
    width = state["columnWidths"]["attributes.`Run Name`"]
    assert width >= 5.8 * max(len(name) for name in children)  # whole names
    room = (1070 - width - 64) // 80  # metric columns a 1,400-px window shows beside them, the gaps among them
    assert state["columnOrder"][:2] == ["attributes.`Run Name`", "runDateAndNestInfo"]
    assert state["columnOrder"].index("metrics.`delta_p_gap`") < 2 + room
    url = (f"http://127.0.0.1:5000/#/experiments/{parent.info.experiment_id}/runs"
           f"?workflowType=machine_learning&viewStateShareKey={parent.info.run_id}")
    assert f"compare its jobs: {url}\n" in result.stderr  # its table: the numbers
    assert f"its jobs on a parallel-coordinates chart: {url}&compareRunsMode=CHART" in result.stderr


def test_fig2_draws_float_noise_as_labelled_zero_bars_on_a_readable_scale():
    import pandas as pd

    from fairaudit.analysis.study_figures import delta_figure

    table9 = pd.DataFrame({"dataset": ["adult", "compas"], "delta_d_cf": [-1.6e-17, 0.05],
                           "delta_d_group": [0.0, float("nan")]})
    ax = delta_figure(table9, ["dataset"], ("think", "nothink")).axes[0]
    heights = [bar.get_height() for bar in ax.patches]
    assert heights == [0.0, 0.05, 0.0, 0.0]
    assert [text.get_text() for text in ax.texts] == ["0", "+0.050", "0", "n/a"]
    low, high = ax.get_ylim()
    assert low <= -0.01 and high >= 0.05 and ax.get_ylabel() == "think − nothink"


def test_a_checkpoint_study_draws_each_headline_metric_against_training_step_on_its_parent():
    from fairaudit.tracking.sweeps import step_series, training_steps

    assert training_steps(pd.Series(["step1000", "step20", "step300"])).tolist() == [1000, 20, 300]
    assert training_steps(pd.Series(["base", "sft", "step2"])).tolist() == [0, 1, 2]  # natural order: no number in all
    rows = [{"run": f"r{i}", "status": "FINISHED", "job": i, "model": "m", "dataset": "adult",
             "probe": "counterfactual", "arm": "think", "seed": str(seed), "checkpoint": label, "d_cf_think": value}
            for i, (label, seed, value) in enumerate([("step20", 0, 0.1), ("step20", 1, 0.3), ("step100", 0, 0.5),
                                                      ("step100", 1, 0.7)])]
    summary = pd.DataFrame(rows + [{**rows[0], "run": "bad", "status": "FAILED", "d_cf_think": 9.0}])
    assert sorted(step_series(summary)) == sorted([("d_cf_think", 0.2, 20), ("d_cf_think", 0.6, 100)])  # seeds averaged
    seeds = summary[summary["checkpoint"] == "step20"]
    assert sorted(step_series(seeds)) == [("d_cf_think", 0.1, 0), ("d_cf_think", 0.3, 1)]  # a seed study: step = seed
    two = pd.concat([summary.iloc[:4], summary.iloc[:4].assign(dataset="compas", d_cf_think=1.0)])
    assert ("d_cf_think/compas", 1.0, 20) in step_series(two)  # other varied axes split the curves
    neither = summary.iloc[[0, 2]].assign(checkpoint="base")  # neither axis varies: step = the job's number
    assert step_series(neither) == [("d_cf_think", 0.1, 0), ("d_cf_think", 0.5, 2)]


def test_no_p_value_is_averaged_over_seeds_and_no_seed_is_dropped_for_underflow():
    """The issue's case: at one checkpoint, seeds at 10^-485.6 (mcnemar_p NaN: no double) and 0.30 logged
    mcnemar_p = 0.30, the mean over the one seed left. Now each seed's log10 p is logged, and at the step their
    combination, 2 x the smaller p for two seeds (a p-value whatever their dependence): 10^-485.3, so no mcnemar_p."""
    from fairaudit.tracking.sweeps import step_series

    rows = [{"run": f"r{i}", "status": "FINISHED", "job": i, "model": "m", "dataset": "adult", "probe": "c",
             "arm": "think", "seed": str(seed), "checkpoint": label, "mcnemar_log10_p": log10_p,
             "mcnemar_p": 10 ** log10_p if log10_p > -300 else math.nan, "d_cf_think": 0.1 * (i + 1)}
            for i, (label, seed, log10_p) in enumerate([("step20", 0, -485.6), ("step20", 1, math.log10(0.3)),
                                                        ("step100", 0, -2.0), ("step100", 1, -1.0)])]
    series = {(key, step): value for key, value, step in step_series(pd.DataFrame(rows))}
    assert ("mcnemar_p", 20) not in series and series[("mcnemar_log10_p", 20)] == pytest.approx(-485.6 + math.log10(2))
    assert series[("mcnemar_log10_p/seed 0", 20)] == -485.6
    assert series[("mcnemar_log10_p/seed 1", 20)] == pytest.approx(math.log10(0.3))
    assert series[("mcnemar_p", 100)] == pytest.approx(0.02) and series[("mcnemar_log10_p/seed 1", 100)] == -1.0
    assert series[("d_cf_think", 20)] == pytest.approx(0.15)   # other metrics: the mean over seeds, as before


@pytest.mark.slow
def test_the_parent_logs_step_metrics_read_back_from_a_real_store(tmp_path):
    from mlflow.tracking import MlflowClient

    from fairaudit.tracking.sweeps import log_summary

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment = client.create_experiment("e", artifact_location=(tmp_path / "a").as_uri())
    parent = client.create_run(experiment).info.run_id
    summary = pd.DataFrame([{"run": f"r{s}", "status": "FINISHED", "model": "m", "dataset": "adult", "probe": "p",
                             "arm": "think", "seed": "0", "checkpoint": f"step{s}", "cell_c": float(s)}
                            for s in (10, 20)])
    log_summary(client, parent, summary, tmp_path)
    history = client.get_metric_history(parent, "cell_c")
    assert sorted((m.step, m.value) for m in history) == [(10, 10.0), (20, 20.0)]
    assert set(client.get_run(parent).data.metrics) == {"cell_c"}  # no cell_c/<cell> copies


@pytest.mark.slow
@pytest.mark.long  # `mlflow ui` and Chromium: a minute on top of the sweep
@pytest.mark.skipif(not shutil.which("chromium"), reason="needs Debian's chromium (apt-get install chromium)")
def test_chromium_opens_the_sweeps_view_on_a_parallel_coordinates_chart_of_its_axes_and_gaps(sweep):
    """`mlflow ui` on the sweep's store, on loopback; headless Chromium opens the printed view: the three jobs
    listed, and the chart's axes are the swept data set and the P(Yes) gaps."""
    result, _, parent, children, tmp_path = sweep
    port = free_port()
    ui = subprocess.Popen([str(Path(sys.executable).with_name("mlflow")), "ui", "--backend-store-uri",
                           f"sqlite:///{tmp_path}/mlflow.db", "--host", "127.0.0.1", "--port", str(port),
                           "--workers", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          start_new_session=True)
    try:
        wait_until(lambda: answers(f"http://127.0.0.1:{port}/health"), 240, "mlflow ui")
        chart = re.search(r"its jobs on a parallel-coordinates chart: (\S+)", result.stderr).group(1)
        url = chart.replace("127.0.0.1:5000", f"127.0.0.1:{port}")
        for _ in range(6):  # a cold or busy server may answer the page's first requests after the budget
            dom = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu",
                                  "--disable-background-networking", "--no-first-run", "--window-size=1500,1000",
                                  "--virtual-time-budget=60000", "--dump-dom", url],
                                 capture_output=True, text=True, timeout=300).stdout
            texts = set(re.findall(r"<text[^>]*>([^<]+)</text>", dom))  # the chart's SVG labels
            if "delta_p_gap" in texts:
                break
    finally:
        os.killpg(ui.pid, signal.SIGTERM)  # the UI's process group (its uvicorn worker), by the leader's pid
        ui.wait(timeout=60)
    assert "viewing a shared view" in dom and all(name in dom for name in children)
    assert {"dataset", "p_gap_think", "p_gap_nothink", "delta_p_gap", *DATASETS} <= texts, texts


def answers(url: str) -> bool:
    try:
        return urllib.request.urlopen(url, timeout=2).status == 200
    except OSError:
        return False
