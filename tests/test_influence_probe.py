"""Probe `influence` on the real tiny Qwen3 through the store, donor choice, bad input, and end to end on SmolLM2."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from conftest import DATA_ROOT, run_app
from fairaudit.app import model_spec
from fairaudit.backends import Block
from fairaudit.backends.hf import HFBackend
from fairaudit.data.mcq import MCQDataset
from fairaudit.errors import AuditError
from fairaudit.models import tiny_qwen3_dir
from fairaudit.probes import AuditContext
from fairaudit.probes.influence import A_PRIVATE, InfluenceProbe, Trace
from fairaudit.prompts.yesno import Arm
from fairaudit.client import CachingClient
from fairaudit.store import Store
from omegaconf import OmegaConf

os.environ.setdefault("OMP_NUM_THREADS", "1")


def tiny_context(tmp_path, n=3):
    spec = model_spec(OmegaConf.load("conf/model/tiny_qwen3.yaml"))
    backend = CachingClient(HFBackend(tiny_qwen3_dir(), device="cpu"), Store(tmp_path / "store.sqlite"))
    dataset = MCQDataset("mmlu", n, 0, "mmlu/test.jsonl", root=str(DATA_ROOT))
    return AuditContext(backend, backend.tokenizer, spec, dataset, Arm("think", True, 8))


def test_probe_on_tiny_qwen3_records_controls_and_cache(tmp_path):
    probe = InfluenceProbe(max_block_tokens=6)
    ctx = tiny_context(tmp_path)
    result = probe.run(ctx)
    records, traces = result.records["records"], result.records["traces"]
    assert len(traces) == 6 and set(traces["condition"]) == {"masked", "unmasked"}
    assert len(records) == 2 * traces["valid"].sum()  # A->B and B->A per valid trace
    scored = records.dropna(subset=["delta"])
    assert (scored["x_tokens"] == scored["donor_tokens"]).all()
    assert (scored["donor_trace"] != scored["trace_id"]).all()
    masked = scored[scored["condition"] == "masked"]
    assert (masked["control_nll_cf"] == masked["control_nll_nat"]).all() and (masked["control_delta"] == 0.0).all()
    assert result.metrics["control_zero_rate_masked"] == 1.0
    assert result.metrics["control_zero_count_masked"] == len(masked)
    assert np.allclose(scored["delta"], scored["nll_cf"] - scored["nll_nat"])
    assert set(result.tables) == {"influence_rates", "graph_cut_control", "probe_comparison"}
    assert traces["canary"].str.len().eq(8).all()
    calls = ctx.client.model_calls
    again = tiny_context(tmp_path)
    rerun = probe.run(again)
    assert again.client.model_calls == 0 and calls > 0
    pd.testing.assert_frame_equal(rerun.records["records"], records)


def trace(trace_id, length, condition="masked"):
    return Trace(trace_id, trace_id, condition, (Block((0,)), Block((1,) * length, "A", "private")))


def test_donors_have_exactly_the_same_length_or_are_skipped():
    pool = [trace(0, 5), trace(1, 7), trace(2, 5), trace(3, 5, "unmasked"), trace(4, 9)]
    probe = InfluenceProbe()
    assert probe.donor(pool[0], A_PRIVATE, pool).trace_id == 2          # the only other masked trace of 5 tokens
    assert probe.donor(pool[1], A_PRIVATE, pool) is None                # none of 7 tokens: skipped and counted
    loose = InfluenceProbe(length_match=False).donor(pool[1], A_PRIVATE, pool)
    assert loose.trace_id in {0, 2, 4}                                  # any other trace of the same graph
    assert probe.donor(pool[0], A_PRIVATE, pool) is probe.donor(pool[0], A_PRIVATE, pool)  # seeded


@pytest.mark.parametrize("kwargs,message", [
    ({"conditions": ["masked", "open"]}, "probe.conditions"),
    ({"tags": {"open": "<{role}>"}}, "probe.tags"),
    ({"max_block_tokens": 0}, "max_block_tokens"),
])
def test_bad_settings_are_one_clear_error(kwargs, message):
    with pytest.raises(AuditError, match=message):
        InfluenceProbe(**kwargs)


def test_bad_input_is_one_error_line_before_the_model_loads(tmp_path):
    result = run_app(tmp_path, "probe=influence", "dataset=adult", "dataset.n=2")
    assert result.returncode == 2
    assert "error: probe 'influence' takes mcq datasets" in result.stderr
    assert "Loading weights" not in result.stderr


@pytest.mark.paper
def test_smollm2_thirty_traces_end_to_end_unmasked_leaks_more_and_rerun_is_free(tmp_path):
    overrides = ("probe=influence", "dataset=mmlu", "dataset.n=30", "model.batch_size=32")
    first = run_app(tmp_path, *overrides, timeout=7200)
    assert first.returncode == 0, first.stderr[-3000:]
    second = run_app(tmp_path, *overrides, timeout=1800)
    assert second.returncode == 0, second.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("fairaudit").experiment_id], order_by=["start_time ASC"])
    assert [r.info.status for r in runs] == ["FINISHED", "FINISHED"]
    metrics = runs[0].data.metrics
    assert runs[1].data.metrics["model_calls"] == 0 and metrics["model_calls"] > 0
    assert metrics["n_traces_masked"] == metrics["n_traces_unmasked"] == 30
    assert metrics["control_zero_rate_masked"] == 1.0
    assert metrics["influence_rate_a_to_b_unmasked"] > metrics["influence_rate_a_to_b_masked"]
    records = pd.read_parquet(client.download_artifacts(runs[0].info.run_id, "records/records.parquet", str(tmp_path)))
    scored = records.dropna(subset=["delta"])
    assert (scored["x_tokens"] == scored["donor_tokens"]).all()
    assert (scored.loc[scored["condition"] == "masked", "control_delta"] == 0.0).all()
