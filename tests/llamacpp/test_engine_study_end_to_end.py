"""`python -m fairaudit +experiment=engines` as a user runs it (no -m), narrowed to SmolLM2, two pairs and two of its
engines (hf in float32, llama.cpp on the file as it ships: one per backend, which is what the sweep's plumbing needs),
then `fairaudit report`: both engines' runs under one sweep, the engine tables and the spreads on the parent run.
The spreads within one engine (batch size, numerics) are checked on a real store in tests/test_engine_study.py, and
llama.cpp's fast numerics in tests/llamacpp/test_llamacpp_numerics.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from conftest import run_app

pytestmark = [pytest.mark.slow, pytest.mark.llamacpp]
ENV = {"OMP_NUM_THREADS": "1"}


def test_the_engine_study_runs_as_one_sweep_and_reports_every_engine(tmp_path):
    study = run_app(tmp_path, "+experiment=engines", "dataset.n=2", "hydra.sweeper.params.model=smollm2",
                    "+experiment/engines/engine=hf_fp32,llamacpp", env=ENV, timeout=1800)
    assert study.returncode == 0, study.stderr[-3000:]
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("engines")
    jobs = client.search_runs([experiment.experiment_id], "tags.`fairaudit.kind` = 'job'")
    engines = ["hf float32 batch 8", "llamacpp Q4_1"]
    assert sorted(run.data.tags["engine"] for run in jobs) == engines
    invariant = {run.data.tags["engine"]: run.data.params["engine.batch_invariant"] for run in jobs}
    assert invariant["hf float32 batch 8"] == "false" and invariant["llamacpp Q4_1"] == "true"
    assert {run.data.tags["backend"] for run in jobs} == {"hf", "llamacpp"}
    report = subprocess.run([sys.executable, "-m", "fairaudit", "report", f"tracking.uri={uri}",
                             f"output_dir={tmp_path}/report", "engines.n_boot=100"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=600, env={**os.environ, **ENV})
    assert report.returncode == 0, report.stderr[-3000:]
    assert "Engine sensitivity: headline metrics per engine" in report.stdout
    table = pd.read_csv(tmp_path / "report" / "engines.csv")
    gap = table[table["metric"] == "p_gap_think"]
    assert set(gap["engine"]) == set(engines)
    assert gap["spread"].iloc[0] == pytest.approx(gap["value"].max() - gap["value"].min())
    parent = client.search_runs([experiment.experiment_id], "tags.`fairaudit.kind` = 'sweep'")[0]
    assert parent.data.metrics["engine_spread/smollm2/adult/p_gap_think"] == pytest.approx(gap["spread"].iloc[0])
    assert (tmp_path / "report" / "figures" / "engines_0.png").stat().st_size > 0
