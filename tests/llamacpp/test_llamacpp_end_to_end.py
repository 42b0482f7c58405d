"""`python -m fairaudit backend=llamacpp` as a user runs it: the default audit and its repeat served from the store
(no model loaded), cdpg, position on MMLU and a three-dataset sweep with hf's metric names, and the one-line
refusals (the influence probe, an unreachable GGUF file)."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from conftest import probe_metric_names, run_app

pytestmark = [pytest.mark.slow, pytest.mark.llamacpp]
LOADING = "into llama.cpp"  # the backend's line when it loads a model
BACKEND_METRICS = {"prefix_cache_hit_rate", "prefill_tokens_per_s", "decode_tokens_per_s"}
# each stage's prefill rate, logged for the stages a probe runs (generation's prompts, choice reads, depth reads)
STAGE_METRICS = {f"{stage}_prefill_tokens_per_s" for stage in ("prompt", "choice", "depth")}
ENV = {"OMP_NUM_THREADS": "1"}


def job_runs(uri: str):
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("fairaudit")
    return client.search_runs([experiment.experiment_id], "tags.`fairaudit.kind` = 'job'",
                              order_by=["attributes.start_time"])


def metric_names(tmp_path, backend: str, *overrides: str) -> list[set[str]]:
    """The metric names of each job of one run of the app (a sweep: one set per job, in job order)."""
    folder = tmp_path / backend
    folder.mkdir()
    result = run_app(folder, f"backend={backend}", *overrides, env=ENV, timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]
    runs = sorted(job_runs(f"sqlite:///{folder}/mlflow.db"), key=lambda r: r.data.tags.get("fairaudit.job_num", ""))
    return [set(run.data.metrics) for run in runs]


def test_the_default_audit_and_its_repeat_from_the_store(tmp_path):
    first = run_app(tmp_path, "backend=llamacpp", "dataset.n=4", env=ENV)
    assert first.returncode == 0, first.stderr[-3000:]
    assert LOADING in first.stderr
    again = run_app(tmp_path, "backend=llamacpp", "dataset.n=4", env=ENV)
    assert again.returncode == 0, again.stderr[-3000:]
    assert LOADING not in again.stderr  # every call served from the store: no model loaded
    runs = job_runs(f"sqlite:///{tmp_path}/mlflow.db")
    assert [run.data.metrics["model_calls"] for run in runs][1] == 0 and runs[0].data.metrics["model_calls"] > 0
    ran = STAGE_METRICS - {"depth_prefill_tokens_per_s"}  # counterfactual: generations and choice reads
    assert BACKEND_METRICS | ran <= set(runs[0].data.metrics)
    assert not (BACKEND_METRICS | STAGE_METRICS) & set(runs[1].data.metrics)
    assert {k: v for k, v in runs[0].data.metrics.items()
            if k not in BACKEND_METRICS | STAGE_METRICS | {"model_calls"}} == \
        {k: v for k, v in runs[1].data.metrics.items() if k != "model_calls"}


@pytest.mark.parametrize("overrides", [
    ("probe=cdpg", "dataset.n=3"),
    ("probe=position", "dataset=mmlu", "arm=cot", "dataset.n=2"),
    ("probe=counterfactual", "dataset.n=2", "-m", "dataset=adult,compas,credit"),
], ids=["cdpg", "position-mmlu", "sweep-adult-compas-credit"])
def test_probes_finish_with_the_metric_names_they_have_under_hf(tmp_path, overrides):
    ours = metric_names(tmp_path, "llamacpp", "model=tiny_qwen3", *overrides)
    theirs = metric_names(tmp_path, "hf", "model=tiny_qwen3", *overrides)
    assert len(ours) == len(theirs) == (3 if "-m" in overrides else 1)
    for names, hf_names in zip(ours, theirs):
        assert names - BACKEND_METRICS - STAGE_METRICS == probe_metric_names(hf_names) and BACKEND_METRICS <= names


def test_the_influence_probe_is_one_line_before_anything_loads(tmp_path):
    result = run_app(tmp_path, "backend=llamacpp", "probe=influence", "dataset=mmlu", env=ENV)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(
        "error: probe 'influence' needs a backend that can score a fixed "
        "target's likelihood (target_nll) and apply a role-visibility"), lines
    assert "backend=llamacpp cannot" in lines[0] and "Backends that can: backend=hf" in lines[0]
    assert LOADING not in result.stderr and not (tmp_path / "mlflow.db").exists()


def test_a_q4km_model_whose_gguf_cannot_be_fetched_is_one_line(tmp_path):
    """The Q4_K_M configs run on llamacpp by default and fetch their one GGUF file; offline and absent, one line."""
    result = run_app(tmp_path, "model=r1_distill_qwen_7b_q4km", "probe=position", "dataset=mmlu", "arm=reason",
                     env={**ENV, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    assert result.returncode == 2, result.stderr
    assert ("error: cannot get 'DeepSeek-R1-Distill-Qwen-7B-Q4_K_M.gguf' "
            "from 'bartowski/DeepSeek-R1-Distill-Qwen-7B-GGUF'" in result.stderr)
