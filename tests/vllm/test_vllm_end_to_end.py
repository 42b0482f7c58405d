"""`python -m fairaudit backend=vllm` as a user runs it: the default audit on the CPU build's defaults, swept with a
cdpg job on one engine (a parent run and a child per probe), and a repeat served from the store without starting an
engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from conftest import probe_metric_names, run_app

pytestmark = pytest.mark.slow
SMALL = ("dataset.n=4",)
ENGINE_START = "Initializing a V1 LLM engine"  # vLLM's log line when an engine starts
ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
TIMEOUT = 3600  # an engine start alone takes minutes on a busy 2-core machine
COUNTERFACTUAL = "tags.probe = 'counterfactual' and tags.`fairaudit.kind` = 'job'"  # the default audit's runs


def runs(uri: str, filter_string: str = ""):
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("fairaudit")
    return client.search_runs([experiment.experiment_id], filter_string, order_by=["attributes.start_time"])


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """One store and MLflow db shared by the module's runs, in order."""
    return tmp_path_factory.mktemp("vllm_e2e")


@pytest.fixture(scope="module")
def first(workdir):
    """The default audit on `backend=vllm` with no other setting (its CPU defaults), swept with the same audit's
    cdpg job: the module's first run, one engine for both jobs."""
    result = run_app(workdir, "backend=vllm", *SMALL, "-m", "probe=counterfactual,cdpg", env=ENV, timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_default_audit_logs_the_hf_metric_names_and_the_prefix_cache_hit_rate(first, workdir):
    hf_dir = workdir / "hf"
    hf_dir.mkdir()
    hf = run_app(hf_dir, *SMALL, env=ENV, timeout=TIMEOUT)  # the hf backend in this environment (transformers < 5.20)
    assert hf.returncode == 0, hf.stderr[-3000:]
    (hf_run,) = runs(f"sqlite:///{hf_dir}/mlflow.db")
    (run,) = runs(f"sqlite:///{workdir}/mlflow.db", COUNTERFACTUAL)
    assert run.info.status == "FINISHED"
    assert set(run.data.metrics) == probe_metric_names(hf_run.data.metrics) | {"prefix_cache_hit_rate"}
    assert run.data.metrics["model_calls"] == hf_run.data.metrics["model_calls"] > 0
    assert 0 <= run.data.metrics["prefix_cache_hit_rate"] <= 1
    assert run.data.params["backend._target_"] == "fairaudit.backends.vllm.VLLMBackend"


def test_a_sweep_has_a_parent_and_a_child_per_probe_on_one_engine(first, workdir):
    assert first.stderr.count(ENGINE_START) + first.stdout.count(ENGINE_START) == 1  # reused by every job
    uri = f"sqlite:///{workdir}/mlflow.db"
    (parent,) = runs(uri, "tags.`fairaudit.kind` = 'sweep'")
    children = runs(uri, f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert sorted(c.data.tags["probe"] for c in children) == ["cdpg", "counterfactual"]
    assert all(c.info.status == "FINISHED" and c.data.tags["dataset"] == "adult" for c in children)
    # every metric is in metrics.json (null where not finite, e.g. a slope of a cell with no pairs); MLflow holds
    # the finite ones
    for child in children:
        logged = json.loads(Path(MlflowClient(uri).download_artifacts(child.info.run_id, "metrics.json",
                                                                      str(workdir / child.info.run_id))).read_text())
        assert set(child.data.metrics) == {name for name, value in logged.items() if isinstance(value, (int, float))}
        assert {"prefix_cache_hit_rate", "model_calls"} <= set(logged)
        assert ("cdpg_slope_c" in logged) == (child.data.tags["probe"] == "cdpg")
    (cdpg,) = [c for c in children if c.data.tags["probe"] == "cdpg"]
    assert cdpg.data.metrics["prefix_cache_hit_rate"] > 0  # the cuts of a trace share its prompt + trace


def test_repeated_run_makes_no_model_call_and_starts_no_engine(first, workdir):
    again = run_app(workdir, "backend=vllm", *SMALL, env=ENV, timeout=TIMEOUT)
    assert again.returncode == 0, again.stderr[-3000:]
    assert ENGINE_START not in again.stderr + again.stdout
    latest = runs(f"sqlite:///{workdir}/mlflow.db", COUNTERFACTUAL)[-1]
    assert latest.data.metrics["model_calls"] == 0
    assert "prefix_cache_hit_rate" not in latest.data.metrics  # nothing was looked up: no rate to report


def test_the_cpu_build_runs_with_its_defaults_alone(first, workdir):
    """`python -m fairaudit backend=vllm dataset.n=4`, no other setting: on a CPU, vllm_cpu sizes the KV cache from
    the free memory, binds every core, uses 32-token blocks and eager mode."""
    run = runs(f"sqlite:///{workdir}/mlflow.db", COUNTERFACTUAL)[0]
    assert run.info.status == "FINISHED" and run.data.metrics["n_pairs"] == 4
    logs = first.stderr + first.stdout
    assert "VLLM_CPU_OMP_THREADS_BIND='0-" in logs and "'block_size': 32" in logs


def test_an_engine_that_cannot_start_is_one_error_line_and_a_failed_run(tmp_path):
    """A KV cache too small for one sequence never reaches vLLM; one the engine itself refuses (vLLM's error above)
    ends the same way: one error line naming the setting, the run FAILED, nothing left RUNNING."""
    small = run_app(tmp_path, "backend=vllm", "dataset.n=2", "backend.kv_cache_space_gib=0.001", env=ENV,
                    timeout=TIMEOUT)
    assert small.returncode == 2
    assert small.stderr.strip().splitlines()[-1].startswith("error: backend.kv_cache_space_gib=0.001 holds ")
    assert ENGINE_START not in small.stderr + small.stdout
    (run,) = runs(f"sqlite:///{tmp_path}/mlflow.db")
    assert run.info.status == "FAILED" and "backend.kv_cache_space_gib" in run.data.tags["fairaudit.error"]
    # vLLM's CPU attention takes blocks of a multiple of 32 tokens: its worker process fails after the engine starts
    refused = run_app(tmp_path, "backend=vllm", "dataset.n=2", "backend.block_size=48", env=ENV, timeout=TIMEOUT)
    assert refused.returncode == 2 and ENGINE_START in refused.stderr + refused.stdout
    (line,) = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert line.startswith("error: backend=vllm: the engine did not start (RuntimeError: ")
    assert "backend.block_size=32" in line
    assert [r.info.status for r in runs(f"sqlite:///{tmp_path}/mlflow.db")] == ["FAILED", "FAILED"]
