"""Probe `cdpg` on the tiny Qwen3 with pre-filled thinking traces, and end to end from the command line."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pytest

from conftest import run_app
from fairaudit.analysis.cdpg import segment_cuts
from fairaudit.backends import Completion, GenerationRequest
from fairaudit.data.tabular import CounterfactualTabular
from fairaudit.models.locate import tiny_qwen3_dir
from fairaudit.probes import AuditContext, ModelSpec
from fairaudit.probes.cdpg import CDPGProbe
from fairaudit.probes.decisions import encode, render_prompts
from fairaudit.prompts.yesno import Arm, Thinking
from fairaudit.store.client import CachingClient, completion_json
from fairaudit.store.results import Store, call_key

THINK = Arm("think", True, 64)
NOTHINK = {"name": "nothink", "think": False, "max_new_tokens": 16}
TRACES = [
    "The person works long hours in a skilled job, so income is probably high. Yes seems likely overall.",
    "Education is modest and the hours are short. Most such workers earn less than fifty thousand, so no.",
    "Short.",
]


@pytest.fixture(scope="module")
def context(tmp_path_factory, data_root):
    from fairaudit.backends.hf import HFBackend

    store = Store(tmp_path_factory.mktemp("cdpg") / "store.sqlite")
    backend = CachingClient(HFBackend(tiny_qwen3_dir(), batch_size=4), store)
    dataset = CounterfactualTabular("adult", 3, 0, "sex", "Male", "Female",
                                    "Does this person earn more than $50K per year?",
                                    "{description}\nQuestion: {question} Answer with a single word: Yes or No.",
                                    str(data_root))
    spec = ModelSpec("tiny_qwen3", Thinking(style="native"), {"enable_thinking": True}, answer_source="forced")
    ctx = AuditContext(backend, backend.tokenizer, spec, dataset, THINK)
    prefill_think_traces(ctx)
    return ctx


def prefill_think_traces(ctx: AuditContext) -> None:
    """Store a written trace as the think arm's generation of each prompt (the tiny model's own are junk)."""
    pairs = ctx.dataset.pairs()
    items = []
    for i, prompt in enumerate(render_prompts(ctx, pairs, THINK)):
        request = GenerationRequest(encode(ctx.tokenizer, prompt), THINK.max_new_tokens)
        text = f"<think>\n{TRACES[i % len(TRACES)]}\n</think>\n\n{'Yes' if i % 2 else 'No'}"
        completion = Completion(text=text, token_ids=encode(ctx.tokenizer, text), finish_reason="stop")
        items.append((call_key("generate", ctx.client.fingerprint, asdict(request)), completion_json(completion)))
    ctx.client.store.put_many("generate", ctx.client.fingerprint, items)


@pytest.mark.slow
def test_depth_records_cut_each_trace_into_equal_token_segments(context):
    probe = CDPGProbe(NOTHINK, K=4, k_list=(2, 4, 8))
    result = probe.run(context)
    depth, records = result.records["depth_records"], result.records["records"]
    think = records[records["arm"] == "think"].set_index(["pair_id", "side"])
    assert len(depth) == 6 * (2 + 4 + 8)
    for (pair_id, side, K), rows in depth.groupby(["pair_id", "side", "K"]):
        n_tokens = think.loc[(pair_id, side), "trace_tokens"]
        assert rows.sort_values("k")["cut"].tolist() == segment_cuts(n_tokens, K)
        # the full-depth read is the think arm's own P(Yes), through the packed pass
        assert rows.loc[rows["k"] == K, "p_yes_k"].item() == pytest.approx(think.loc[(pair_id, side), "p_yes"],
                                                                            abs=1e-4)
    # coarser K reuse the finest K's reads at the shared cuts
    fine = depth[depth["K"] == 8].set_index(["pair_id", "side", "cut"])["p_yes_k"]
    coarse = depth[depth["K"] == 2].set_index(["pair_id", "side", "cut"])["p_yes_k"]
    np.testing.assert_allclose(coarse.to_numpy(), fine.groupby(level=[0, 1, 2]).first().loc[coarse.index].to_numpy())
    assert result.metrics["cdpg_n_pairs"] == 3
    assert set(result.figures) == {"cdpg_by_cell", "cdpg_anchor_mover", "cdpg_k_sensitivity"}
    assert sum(result.metrics[f"cdpg_n_{cell}"] for cell in "abcd") == 3


@pytest.mark.slow
def test_second_run_reads_depths_from_the_store(context):
    probe = CDPGProbe(NOTHINK, K=4, k_list=(2, 4, 8))
    probe.run(context)  # the store filled, here or by the test before it (which test-fast leaves out)
    before = context.client.model_calls
    probe.run(context)
    assert context.client.model_calls == before


def test_cdpg_refuses_an_arm_that_does_not_think():
    from fairaudit.errors import AuditError

    with pytest.raises(AuditError, match="cuts thinking traces; arm 'nothink' does not think"):
        CDPGProbe(NOTHINK).arms(Arm("nothink", False, 16))


@pytest.mark.long  # two three-job sweeps: most of a minute
def test_cdpg_sweep_after_counterfactual_adds_only_depth_reads(tmp_path):
    from mlflow.tracking import MlflowClient

    base = ("model=tiny_qwen3", "dataset.n=4", "model.max_think_tokens=12")
    assert run_app(tmp_path, *base, "-m", "dataset=adult,compas,credit").returncode == 0
    result = run_app(tmp_path, *base, "probe=cdpg", "-m", "dataset=adult,compas,credit")
    assert result.returncode == 0, result.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("fairaudit").experiment_id], "tags.probe = 'cdpg'")
    assert sorted(r.data.tags["dataset"] for r in runs) == ["adult", "compas", "credit"]
    for run in runs:
        assert "cdpg_slope_c" in run.data.metrics or "cdpg_slope_a" in run.data.metrics
        assert run.data.metrics["model_calls"] == 8  # one packed depth read per think trace, no generation
        tables = {a.path for a in client.list_artifacts(run.info.run_id, "tables")}
        assert "tables/cdpg_by_cell.parquet" in tables
        figures = {a.path for a in client.list_artifacts(run.info.run_id, "figures")}
        assert len(figures) == 3
        assert "records/depth_records.parquet" in {a.path for a in client.list_artifacts(run.info.run_id, "records")}
