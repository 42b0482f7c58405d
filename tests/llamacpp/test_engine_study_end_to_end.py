"""`python -m fairaudit +experiment=engines` as a user runs it (no -m), narrowed to SmolLM2 and two pairs, then
`fairaudit report`: five engines' runs under one sweep (a batch-size and a numerics axis within hf and llama.cpp),
the engine tables, the spreads within one engine, and the spreads on the parent run."""

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
    study = run_app(tmp_path, "+experiment=engines", "dataset.n=2", "hydra.sweeper.params.model=smollm2", env=ENV,
                    timeout=1800)
    assert study.returncode == 0, study.stderr[-3000:]
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("engines")
    jobs = client.search_runs([experiment.experiment_id], "tags.`fairaudit.kind` = 'job'")
    engines = ["hf bfloat16 batch 1", "hf bfloat16 batch 8", "hf float32 batch 8", "llamacpp Q4_1",
               "llamacpp Q4_1 fast batch 8"]
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
    within = pd.read_csv(tmp_path / "report" / "engines_within.csv")
    assert within[["axis", "shared"]].drop_duplicates().values.tolist() == [
        ["batch_size", "hf bfloat16"], ["numerics", "hf batch 8"], ["numerics", "llamacpp batch 8"]]
    batch = within[(within["axis"] == "batch_size") & (within["metric"] == "p_gap_think")]
    pair = gap.set_index("engine")["value"][["hf bfloat16 batch 8", "hf bfloat16 batch 1"]]
    assert batch["spread"].iloc[0] == pytest.approx(pair.max() - pair.min())
