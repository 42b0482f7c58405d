"""Probe `influence` on the real tiny Qwen3 through the store, donor choice, bad input, and end to end on SmolLM2."""

from __future__ import annotations

import os
import sys

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from conftest import DATA_ROOT, run_app
from fairaudit.backends import Block
from fairaudit.data.mcq import MCQDataset
from fairaudit.errors import AuditError
from fairaudit.job.config import model_spec
from fairaudit.models.locate import tiny_qwen3_dir
from fairaudit.probes import AuditContext
from fairaudit.probes.influence import InfluenceProbe
from fairaudit.probes.influence_transcripts import A_PRIVATE, Trace, visibility
from fairaudit.prompts.yesno import Arm
from fairaudit.store.client import CachingClient
from fairaudit.store.results import Store
from warm import run_python

os.environ.setdefault("OMP_NUM_THREADS", "1")


def tiny_context(tmp_path, n=3):
    from fairaudit.backends.hf import HFBackend

    spec = model_spec(OmegaConf.load("conf/model/tiny_qwen3.yaml"))
    backend = CachingClient(HFBackend(tiny_qwen3_dir(), device="cpu"), Store(tmp_path / "store.sqlite"))
    dataset = MCQDataset("mmlu", n, 0, "mmlu/test.jsonl", root=str(DATA_ROOT))
    return AuditContext(backend, backend.tokenizer, spec, dataset, Arm("think", True, 8))


@pytest.mark.slow
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
    # content targets: B's two blocks (A2's for B->A) less their four tags, at most 6 tokens each
    assert (scored["target_tokens"] <= 12).all() and records["skip_reason"].isna().sum() == len(scored)
    assert traces["a2_public_tokens"].gt(0).all() and traces["a_private_truncated"].dtype == bool
    assert result.metrics["truncated_rate_masked"] == traces.query("condition == 'masked'").filter(
        like="_truncated").to_numpy().mean()
    calls = ctx.client.model_calls
    again = tiny_context(tmp_path)
    rerun = probe.run(again)
    assert again.client.model_calls == 0 and calls > 0
    pd.testing.assert_frame_equal(rerun.records["records"], records)


@pytest.mark.slow
def test_greedy_tiny_qwen3_gives_token_identical_blocks_and_every_contrast_is_skipped_as_such(tmp_path):
    """The random tiny Qwen3 repeats one token greedily: every donor would give Delta = 0 by construction."""
    result = InfluenceProbe(max_block_tokens=6, sampling={"temperature": 0.0}).run(tiny_context(tmp_path))
    records = result.records["records"]
    assert (records["skip_reason"] == "identical").all() and records["delta"].isna().all()
    assert result.metrics["skipped_identical_a_to_b_masked"] == result.metrics["skipped_a_to_b_masked"] == 3
    assert result.metrics["n_contrasts_masked"] == 0


def trace(trace_id, length, condition="masked", token=1, truncated=False):
    return Trace(trace_id, trace_id, condition, (Block((0,)), Block((token,) * length, "A", "private")),
                 truncated=(False, truncated))


def test_donors_have_exactly_the_same_length_are_not_identical_or_are_skipped_with_a_reason():
    pool = [trace(0, 5), trace(1, 7), trace(2, 5, token=2), trace(3, 5, "unmasked", token=3), trace(4, 9),
            trace(5, 5), trace(6, 7)]
    probe = InfluenceProbe()
    donor, reason = probe.donors.donor(pool[0], A_PRIVATE, pool)
    assert (donor.trace_id, reason) == (2, None)      # 5 is token-identical to 0, 3 is another graph's
    assert probe.donors.donor(pool[1], A_PRIVATE, pool) == (None, "identical")   # 6 has its very tokens: Delta 0
                                                                                  # by construction
    assert probe.donors.donor(pool[4], A_PRIVATE, pool) == (None, "no_donor")    # no other trace of 9 tokens
    loose, _ = InfluenceProbe(length_match=False).donors.donor(pool[4], A_PRIVATE, pool)
    assert loose.trace_id in {0, 1, 2, 5, 6}                               # any other trace of the same graph
    assert probe.donors.donor(pool[0], A_PRIVATE, pool) == probe.donors.donor(pool[0], A_PRIVATE, pool)  # seeded
    complete = InfluenceProbe(length_match="complete")
    cut = [trace(0, 5, truncated=True), trace(2, 5, token=2), trace(7, 5, token=7, truncated=True)]
    assert complete.donors.donor(cut[0], A_PRIVATE, cut) == (None, "truncated")   # its own block hit the budget
    assert complete.donors.donor(cut[1], A_PRIVATE, cut) == (None, "no_donor")    # both candidates were cut
    assert probe.donors.donor(cut[1], A_PRIVATE, cut)[0].trace_id in {0, 7}       # exact pairs truncated blocks too


@pytest.mark.slow
def test_content_target_splits_off_the_tags_and_keeps_attention(tmp_path):
    ctx = tiny_context(tmp_path, n=1)
    probe, tok = InfluenceProbe(), ctx.tokenizer
    opening, close = probe.tags.ids("open", "B", "private", tok), probe.tags.ids("close", "B", "private", tok)
    blocks = (Block((1, 2, 3)), Block(opening + (5, 6) + close, "B", "private"), Block((9,), "A", "public"))
    sequence, target = probe.scorer.scored(blocks, (1,), tok)
    assert [b.ids for b in sequence] == [(1, 2, 3), opening, (5, 6), close, (9,)] and target == (2,)
    assert {b.role for b in sequence[1:4]} == {"B"}
    assert InfluenceProbe(target="with_tags").scorer.scored(blocks, (1,), tok) == (blocks, (1,))
    split = probe.scorer.scored(blocks, (1,), tok)[0]
    # the split blocks see what the whole block saw: graph rows of the pieces equal the block's, plus its pieces
    assert visibility(split, "masked")[2] == (0, 1) and visibility(blocks, "masked")[1] == (0,)


def test_sampled_blocks_are_seeded_per_item_and_block_not_per_graph():
    probe = InfluenceProbe(sampling={"seed": 3})
    seed = probe.writer.block_seed
    assert seed(7, "b_private") == seed(7, "b_private") != seed(8, "b_private")
    assert seed(7, "b_private") != InfluenceProbe(sampling={"seed": 4}).writer.block_seed(7, "b_private")
    assert probe.sampling == {"temperature": 0.6, "top_p": 0.95, "seed": 3}


@pytest.mark.parametrize("kwargs,message", [
    ({"conditions": ["masked", "open"]}, r"probe.conditions=\['masked', 'open'\] items must be one of"),
    ({"conditions": []}, "probe.conditions must name at least one graph"),
    ({"tags": {"open": "<{role}>"}}, "probe.tags needs 'open' and 'close'"),
    ({"tags": {"open": "<{who}>", "close": "</{role}>"}}, r"probe.tags.open='<\{who\}>' must use the fields"),
    ({"max_block_tokens": 0}, "probe.max_block_tokens=0 must be an integer in 1..262144"),
    ({"target": "tags"}, r"probe.target='tags' must be one of \['content', 'with_tags'\]"),
    ({"length_match": "loose"}, r"probe.length_match='loose' must be one of \['exact', 'complete', 'off'\]"),
    ({"sampling": {"temperature": -1}}, r"probe.sampling.temperature=-1 must be a number in \[0, 10\]"),
    ({"sampling": {"top_p": 0}}, r"probe.sampling.top_p=0 must be a number in \(0, 1\]"),
    ({"sampling": {"seed": 1.5}}, "probe.sampling.seed=1.5 must be an integer"),
    ({"thresholds": [0, "x"]}, "probe.thresholds"),
])
def test_bad_settings_are_one_clear_error(kwargs, message):
    with pytest.raises(AuditError, match=message):
        InfluenceProbe(**kwargs)


def test_bad_settings_fail_before_the_model_loads(tmp_path):
    result = run_app(tmp_path, "probe=influence", "dataset=mmlu", "dataset.n=2", "probe.target=tags")
    assert result.returncode == 2 and "error: probe.target='tags' must be one of" in result.stderr
    assert "Loading weights" not in result.stderr


def test_bad_input_is_one_error_line_before_the_model_loads(tmp_path):
    result = run_app(tmp_path, "probe=influence", "dataset=adult", "dataset.n=2")
    assert result.returncode == 2
    assert "error: probe 'influence' takes mcq datasets" in result.stderr
    assert "Loading weights" not in result.stderr


@pytest.mark.paper
def test_smollm2_thirty_traces_end_to_end_unmasked_leaks_more_and_rerun_is_free(tmp_path):
    from mlflow.tracking import MlflowClient

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
    for c in ("masked", "unmasked"):
        assert 0.0 <= metrics[f"truncated_rate_{c}"] <= 1.0 and f"substantive_rate_a_to_b_{c}_ci_low" in metrics
        assert metrics[f"skipped_a_to_b_{c}"] == sum(metrics[f"skipped_{r}_a_to_b_{c}"]
                                                     for r in ("no_donor", "identical", "truncated"))
    params = runs[0].data.params
    assert (params["probe.target"], params["probe.sampling.temperature"],
            params["probe.sampling.seed"]) == ("content", "0.6", "0")
    records = pd.read_parquet(client.download_artifacts(runs[0].info.run_id, "records/records.parquet", str(tmp_path)))
    scored = records.dropna(subset=["delta"])
    assert (scored["x_tokens"] == scored["donor_tokens"]).all() and scored["skip_reason"].isna().all()
    assert (scored["delta"] != 0.0).all()   # token-identical donors are skipped, not scored as "no influence"
    assert (scored.loc[scored["condition"] == "masked", "control_delta"] == 0.0).all()


def test_private_channel_preset_is_section_6s_and_the_smoke_study_its_miniature():
    from test_studies import compose_job, sweep_jobs

    cfg = compose_job("+experiment=private_channel")
    assert (cfg.probe.max_block_tokens, cfg.probe.length_match, cfg.probe.target) == (512, "complete", "content")
    assert cfg.probe.sampling.temperature > 0 and cfg.dataset.n == 500
    jobs = sweep_jobs(OmegaConf.to_container(cfg.hydra.sweeper.params))
    assert jobs == [[f"dataset.seed={s}"] for s in range(5)]
    seeded = compose_job("+experiment=private_channel", "dataset.seed=3")
    assert seeded.probe.sampling.seed == 3          # the grid's seed seeds the sampling, not only the items
    smoke = compose_job("+experiment=private_channel_smoke")
    assert smoke.model.name == "tiny_qwen3" and smoke.dataset.n <= 8
    assert len(sweep_jobs(OmegaConf.to_container(smoke.hydra.sweeper.params))) == 4


@pytest.mark.slow
@pytest.mark.long
def test_private_channel_smoke_study_then_report_shows_tables_1_to_5_at_both_thresholds(tmp_path, data_root):
    """`python -m fairaudit +experiment=private_channel_smoke -m`, then `python -m fairaudit.report` on it."""
    study = run_app(tmp_path, "+experiment=private_channel_smoke", "-m", timeout=1800)
    assert study.returncode == 0, study.stderr[-3000:]
    uri, out = f"sqlite:///{tmp_path}/mlflow.db", tmp_path / "report"
    report = run_python(
        [sys.executable, "-m", "fairaudit.report", f"tracking.uri={uri}", f"select.sweep_dir={tmp_path / 'multirun'}",
         f"output_dir={out}"], cwd=tmp_path, env={**os.environ, "FAIRAUDIT_DATA": str(data_root)}, timeout=600)
    assert report.returncode == 0, report.stderr[-3000:]
    md = (out / "report.md").read_text()
    for title in ("Table 1: probe comparison (%), at both thresholds", "Table 2: length-matched validation (masked)",
                  "Table 3: rates at Δ_NLL > 0.05, then at the other threshold", "Table 4: graph-cut control",
                  "Table 5: seed-level statistics", "Paper 002 diagnostics"):
        assert title in md
    assert "| Counterfactual influence (Δ > 0) |" in md and "| Counterfactual influence (Δ > 0.05) |" in md
    assert "probe.target=content" in md and "figures/influence_fig4_checkpoints.png" in md
    table3 = pd.read_csv(out / "influence_table3.csv")
    assert set(table3["threshold"]) == {"Δ_NLL > 0.05", "Δ_NLL > 0"}
    assert set(table3["checkpoint"]) == {"step1", "step2"}
    assert (table3["n_a_to_b"] == 8).all()   # two seeds x 4 traces pooled per checkpoint
    diagnostics = pd.read_csv(out / "influence_diagnostics.csv").set_index("metric")
    assert (diagnostics.loc["Control natural NLL, min", "masked"]
            <= diagnostics.loc["Control natural NLL, max", "masked"])
    assert (out / "figures" / "influence_fig4_checkpoints.png").stat().st_size > 0
