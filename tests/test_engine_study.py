"""The engine study (`+experiment=engines`): per-engine values, spreads with paired bootstrap intervals, disagreement
flags and changed answers, against hand values, from stored records in a real sqlite MLflow store."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from conftest import REPO
from fairaudit.analysis import engines
from fairaudit.job.client import build_backend
from fairaudit.job.config import Place, read_job
from fairaudit.job.tags import engine_label, engine_params
from fairaudit.probes.counterfactual import CounterfactualProbe
from fairaudit.report import app
from figure_checks import layout_problems
from test_report import Store, report_cfg

# Four pairs under think (t) and nothink (n), sides alpha (a) and alpha' (a'): (answer, P(Yes)) per engine.
# Reference cells: p0 c (a flip think created), p1 a, p2 b (a flip think resolved), p3 a.
REFERENCE = {
    ("p0", "t"): (("Yes", 0.9), ("No", 0.2)), ("p0", "n"): (("Yes", 0.8), ("Yes", 0.7)),
    ("p1", "t"): (("No", 0.3), ("No", 0.35)), ("p1", "n"): (("No", 0.1), ("No", 0.15)),
    ("p2", "t"): (("Yes", 0.62), ("Yes", 0.55)), ("p2", "n"): (("Yes", 0.9), ("No", 0.45)),
    ("p3", "t"): (("No", 0.2), ("No", 0.24)), ("p3", "n"): (("No", 0.2), ("No", 0.3)),
}
OTHER = {**REFERENCE, ("p1", "t"): (("Yes", 0.52), ("No", 0.35))}  # one answer changes: p1 moves from cell a to c
ARMS = {"t": "think", "n": "nothink"}
HEADLINE = ["n_pairs", "cell_c", "delta_d_cf", "p_gap_think"]


def records_of(table: dict) -> pd.DataFrame:
    rows = [{"pair_id": pair, "side": side, "attribute_value": side, "arm": ARMS[arm], "answer": answer, "p_yes": p}
            for (pair, arm), sides in table.items() for side, (answer, p) in zip(("alpha", "alpha_prime"), sides)]
    return pd.DataFrame(rows).sort_values(["arm", "pair_id"], ascending=[False, True]).reset_index(drop=True)


def test_flip_table_counts_changed_answers_and_cells_by_the_references_confidence():
    table = engines.flip_table({"ref": records_of(REFERENCE), "other": records_of(OTHER)}, "ref")
    by_bin = table.set_index("confidence")
    # the reference's 16 records by |P(Yes) - 0.5|: 0.05, 0.05 | 0.2, 0.2, 0.15, 0.12, 0.2 | nine at 0.26 or more
    assert by_bin["n_records"].to_dict() == {"[0, 0.1)": 2, "[0.1, 0.25)": 5, "[0.25, 0.5]": 9, "all": 16}
    assert by_bin["answers_changed"].to_dict() == {"[0, 0.1)": 0, "[0.1, 0.25)": 1, "[0.25, 0.5]": 0, "all": 1}
    # pairs by their least confident reference record: p2 (0.05) | p0, p1, p3 (0.2, 0.15, 0.2) | none
    assert by_bin["n_pairs"].to_dict() == {"[0, 0.1)": 1, "[0.1, 0.25)": 3, "[0.25, 0.5]": 0, "all": 4}
    assert by_bin["cells_changed"].to_dict() == {"[0, 0.1)": 0, "[0.1, 0.25)": 1, "[0.25, 0.5]": 0, "all": 1}
    assert by_bin.loc["all", "answer_change_share"] == 1 / 16
    assert by_bin.loc["[0.1, 0.25)", "cell_change_share"] == 1 / 3
    assert math.isnan(by_bin.loc["[0.25, 0.5]", "cell_change_share"])


def test_an_unparsed_answer_counts_as_a_change_and_drops_its_pair():
    other = {**REFERENCE, ("p3", "n"): ((None, 0.2), ("No", 0.3))}
    table = engines.flip_table({"ref": records_of(REFERENCE), "other": records_of(other)}, "ref")
    table = table.set_index("confidence")
    assert table.loc["all", "answers_changed"] == 1 and table.loc["all", "cells_changed"] == 1  # p3: cell a -> dropped


@pytest.mark.slow
def test_a_spread_that_is_the_same_in_every_resample_has_a_point_interval():
    """Engine B reads P(Yes | alpha) under think 0.1 higher on every pair where it is already the higher side:
    every pair's think gap grows by exactly 0.1, so the spread of p_gap_think is 0.1 in every resample of pairs."""
    reference = records_of(REFERENCE)
    shifted = reference.copy()
    higher = {"p0", "p2"}  # pairs whose alpha side reads higher under think (p1, p3: alpha' higher: shift alpha')
    rows = shifted["arm"] == "think"
    up = rows & (((shifted["side"] == "alpha") & shifted["pair_id"].isin(higher))
                 | ((shifted["side"] == "alpha_prime") & ~shifted["pair_id"].isin(higher)))
    shifted.loc[up, "p_yes"] += 0.1
    intervals = engines.spread_intervals({"a": {"records": reference}, "b": {"records": shifted}},
                                         CounterfactualProbe.point_metrics, ["p_gap_think", "p_gap_nothink", "cell_c"],
                                         n_boot=100, seed=0).set_index("metric")
    assert intervals.loc["p_gap_think", ["spread_ci_low", "spread_ci_high"]].tolist() == pytest.approx([0.1, 0.1])
    assert intervals.loc["p_gap_nothink", ["spread_ci_low", "spread_ci_high"]].tolist() == [0.0, 0.0]
    assert intervals.loc["cell_c", "n_units"] == 4 and intervals.loc["cell_c", "n_boot_used"] == 100


def test_disagreement_flags_sign_and_significance():
    runs = pd.DataFrame({"engine": ["x", "y", "z"], "delta": [0.2, -0.1, 0.05],
                         "gap": [0.3, 0.2, 0.25], "gap_ci_low": [0.1, -0.05, 0.02], "gap_ci_high": [0.5, 0.4, 0.4],
                         "mcnemar_log10_p": [-2.0, -1.5, -1.0], "count": [0.0, 3.0, 1.0]})
    verdict = engines.disagreements(engines.engine_values(runs, ["delta", "gap", "mcnemar_log10_p", "count"]))
    verdict = verdict.set_index("metric")
    assert verdict["spread"].tolist() == pytest.approx([0.3, 0.1, 1.0, 3.0])
    assert verdict["sign_differs"].tolist() == [True, False, False, False]  # a zero count has no sign
    assert verdict["significance_differs"].tolist() == [False, True, True, False]  # p < 0.05: -1.5 yes, -1.0 no
    assert verdict["differs"].tolist() == [True, True, True, False]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """Two engines' runs of one audit under a sweep parent, with their records, in a real sqlite MLflow store."""
    root = tmp_path_factory.mktemp("engines")
    store = Store(root / "mlflow.db", root, "engines")
    parent = store.sweep(study="engines")
    ids = {}
    for engine, table, ci in (("hf float32", REFERENCE, (0.05, 0.4)), ("llamacpp Q4_1", OTHER, (-0.01, 0.45))):
        records = records_of(table)
        metrics = {**CounterfactualProbe.point_metrics({"records": records}),
                   "p_gap_think_ci_low": ci[0], "p_gap_think_ci_high": ci[1]}
        ids[engine] = store.job(records, parent, metrics=metrics, engine=engine, model="smollm2",
                                **{"fairaudit.headline": json.dumps(HEADLINE)})
    result = app.run(report_cfg(store, root / "out", f"select.parent={parent}", "engines.n_boot=100"))
    return store, parent, result, root / "out"


@pytest.mark.slow
def test_the_report_gives_each_engines_value_the_spread_and_its_interval(study):
    store, parent, result, out = study
    table = pd.read_csv(out / "engines.csv")
    gap = table[(table["metric"] == "p_gap_think")].set_index("engine")
    assert gap["value"].to_dict() == pytest.approx({"hf float32": 0.215, "llamacpp Q4_1": 0.245})  # (0.7+.05+.07+.04)/4
    assert gap["spread"].iloc[0] == pytest.approx(0.03)
    delta = table[table["metric"] == "delta_d_cf"].set_index("engine")
    assert delta["value"].to_dict() == pytest.approx({"hf float32": 0.0, "llamacpp Q4_1": 0.25})  # 1/4-1/4; 2/4-1/4
    cells = table[table["metric"] == "cell_c"].iloc[0]
    assert cells["spread"] == 1 and cells["spread_ci_low"] <= 1 <= cells["spread_ci_high"]
    assert bool(gap["significance_differs"].iloc[0]) and not bool(delta["sign_differs"].iloc[0])
    shown = result.report.section("engines").shown.set_index("metric")
    assert shown.loc["p_gap_think", "hf float32"] == "0.215 [0.05, 0.4]"
    assert shown.loc["p_gap_think", "differs"] == "significance"


@pytest.mark.slow
def test_the_spreads_are_logged_on_the_parent_run_and_the_report_run(study):
    store, parent, result, _ = study
    logged = store.client.get_run(parent).data.metrics
    assert logged["engine_spread/smollm2/adult/p_gap_think"] == pytest.approx(0.03)
    assert logged["engine_differs/smollm2/adult/p_gap_think"] == 1.0
    assert "engine_spread/smollm2/adult/cell_c_ci_high" in logged
    report_run = store.client.get_run(result.run_id).data.metrics
    assert report_run["engine_spread/smollm2/adult/delta_d_cf"] == pytest.approx(0.25)


@pytest.mark.slow
def test_the_flip_section_and_the_figure(study):
    _, _, result, out = study
    flips = pd.read_csv(out / "engine_flips.csv")
    row = flips[flips["confidence"] == "all"].iloc[0]
    assert (row["engine"], row["reference"], row["answers_changed"], row["cells_changed"]) == \
        ("llamacpp Q4_1", "hf float32", 1, 1)
    assert (out / "figures" / "engines_0.png").stat().st_size > 0
    assert layout_problems(result.report.figures["engines_0"]) == []
    assert "Engine sensitivity" in (out / "report.md").read_text()


@pytest.mark.slow
def test_one_engine_gives_no_engine_section(tmp_path):
    store = Store(tmp_path / "mlflow.db", tmp_path, "one")
    parent = store.sweep(study="one")
    store.job(records_of(REFERENCE), parent, engine="hf float32", **{"fairaudit.headline": json.dumps(HEADLINE)})
    result = app.run(report_cfg(store, tmp_path / "out", f"select.parent={parent}", "log_to_mlflow=false"))
    assert not any(s.name.startswith("engine") for s in result.report.sections) and not result.report.parent_metrics


def logged_params(backend: str, numerics: str, batch_size: int) -> dict[str, str]:
    return {"engine.backend": backend, "engine.numerics": numerics, "engine.batch_size": str(batch_size)}


def test_within_engine_sets_pair_the_engines_that_differ_in_one_setting_alone():
    runs = pd.DataFrame([{"engine": e, **logged_params(*p)} for e, p in (
        ("hf float32 batch 8", ("hf", "float32", 8)), ("hf float32 batch 1", ("hf", "float32", 1)),
        ("hf bfloat16 batch 8", ("hf", "bfloat16", 8)), ("llamacpp Q4_1", ("llamacpp", "Q4_1", 8)),
        ("llamacpp Q4_1 fast", ("llamacpp", "Q4_1 fast", 8)))])
    assert engines.within_engine_sets(runs) == [
        ("batch_size", "hf float32", ["hf float32 batch 8", "hf float32 batch 1"]),
        ("numerics", "hf batch 8", ["hf float32 batch 8", "hf bfloat16 batch 8"]),
        ("numerics", "llamacpp batch 8", ["llamacpp Q4_1", "llamacpp Q4_1 fast"])]
    assert engines.within_engine_sets(runs.drop(columns="engine.batch_size")) == []  # runs logged before the params


# Engine C reads p0's think P(Yes | alpha) 0.6, not 0.9: p0's think gap 0.4, not 0.7, its answers unchanged.
THIRD = {**REFERENCE, ("p0", "t"): (("Yes", 0.6), ("No", 0.2))}


@pytest.fixture(scope="module")
def batch_study(tmp_path_factory):
    """hf float32 at batch 8 and 1 (one answer apart) and llama.cpp, with their engine.* params, as runs log them."""
    root = tmp_path_factory.mktemp("batches")
    store = Store(root / "mlflow.db", root, "batches")
    parent = store.sweep(study="engines")
    for engine, table, params in (("hf float32 batch 8", REFERENCE, ("hf", "float32", 8)),
                                  ("hf float32 batch 1", OTHER, ("hf", "float32", 1)),
                                  ("llamacpp Q4_1", THIRD, ("llamacpp", "Q4_1", 8))):
        records = records_of(table)
        store.job(records, parent, metrics=CounterfactualProbe.point_metrics({"records": records}),
                  params=logged_params(*params), engine=engine, model="smollm2",
                  **{"fairaudit.headline": json.dumps(HEADLINE)})
    result = app.run(report_cfg(store, root / "out", f"select.parent={parent}", "engines.n_boot=20"))
    return store, parent, result, root / "out"


@pytest.mark.slow
def test_the_batch_size_spread_is_over_the_two_batch_sizes_alone(batch_study):
    store, parent, result, out = batch_study
    within = pd.read_csv(out / "engines_within.csv")
    assert within[["axis", "shared"]].drop_duplicates().values.tolist() == [["batch_size", "hf float32"]]
    gap = within[within["metric"] == "p_gap_think"].iloc[0]
    # think gaps per pair: batch 8 (0.7, 0.05, 0.07, 0.04), batch 1 p1 reads 0.52: |0.52 - 0.35| = 0.17 -> spread 0.12/4
    assert gap["spread"] == pytest.approx(0.03)
    assert gap["answers_changed"] == "hf float32 batch 1: 1/16"
    every = pd.read_csv(out / "engines.csv")
    # over all three engines: 0.245 (batch 1) - 0.14 (llama.cpp: p0's gap 0.4, (0.4+.05+.07+.04)/4)
    assert every[every["metric"] == "p_gap_think"]["spread"].iloc[0] == pytest.approx(0.105)
    logged = store.client.get_run(parent).data.metrics
    assert logged["engine_within/smollm2/adult/batch_size/hf_float32/p_gap_think"] == pytest.approx(0.03)


def built_backend(data_root, *overrides: str):
    """The backend a run of these overrides builds (no weights loaded), and its batch size."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose("config", overrides=["model=tiny_qwen3", f"data.root={data_root}", *overrides],
                      return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    job = read_job(OmegaConf.masked_copy(cfg, [key for key in cfg if key != "hydra"]), Place({}, list(overrides), []))
    return build_backend(job, job.source.folder()), job.model["batch_size"]


@pytest.mark.slow
def test_batch_keyed_stores_a_batch_dependent_engine_under_its_batch_size(data_root):
    plain, size = built_backend(data_root, "model.batch_size=4")
    keyed, _ = built_backend(data_root, "model.batch_size=4", "store.batch_keyed=true")
    assert keyed.fingerprint == f"{plain.fingerprint}/batch4" and not plain.fingerprint.endswith("/batch4")
    assert engine_label(keyed, size) == "hf float32 batch 4"
    assert engine_params(keyed, size) == {"engine.backend": "hf", "engine.numerics": "float32",
                                          "engine.batch_size": "4", "engine.batch_invariant": "false"}
    mock, size = built_backend(data_root, "backend=mock", "store.batch_keyed=true")  # batch-invariant: no batch key
    assert not mock.fingerprint.endswith(f"/batch{size}") and engine_label(mock, size) == "mock"
