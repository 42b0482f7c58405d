"""`python -m fairaudit.report` on a real sqlite MLflow store: paper 000's other tables and the position-bias paper's.

Paper 000 runs carry the pair-state moves of its own Tables 13 and 14 (see test_paper000_tables),
so the report's tables are checked against what the paper prints; the position-bias runs carry
scripted MCQ records whose metrics are worked out from `analysis.position` directly.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import test_report
from fairaudit.analysis.contingency import contingency
from fairaudit.analysis.position import pbs_wilcoxon, position
from fairaudit.report import app
from fairaudit.tracking.content import finite_metrics
from test_cdpg_analysis import build_depth, build_records
from test_paper000_tables import SPLIT, TABLE_2, TABLE_13_14, integer_moves, pair_records
from test_report import Store, report_cfg

# test_report's fixtures, bound here for pytest: an experiment per test, one sqlite MLflow file per module
mlflow_db, store = test_report.mlflow_db, test_report.store


def log_job(store: Store, parent: str, frames: dict[str, pd.DataFrame], metrics: dict, **tags) -> str:
    """A finished job run with `tags`, `metrics` and each frame as records/<name>.parquet."""
    from mlflow.entities import Metric, Param

    tags = {"arm": "think", "seed": "0", "checkpoint": "base", **tags, "fairaudit.kind": "job",
            "mlflow.parentRunId": parent}
    run_id = store.client.create_run(store.experiment_id, tags=tags).info.run_id
    store.client.log_batch(run_id, metrics=[Metric(k, v, 0, 0) for k, v in finite_metrics(metrics).items()],
                           params=[Param("probe.baseline_arm.name", "nothink")])
    for name, frame in frames.items():
        path = store.root / "records" / run_id / f"{name}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        frame.to_parquet(path)
        store.client.log_artifact(run_id, str(path), "records")
    store.client.set_terminated(run_id)
    return run_id


@pytest.fixture()
def paper000_report(store, tmp_path):
    parent = store.sweep()
    for (model, dataset), table in TABLE_13_14.items():
        records = pair_records(integer_moves(*table), SPLIT)
        log_job(store, parent, {"records": records}, contingency(records, n_boot=0),
                model=model, dataset=dataset, probe="counterfactual")
    records, depth = build_records(), build_depth()
    log_job(store, parent, {"records": records, "depth_records": depth}, {"cdpg_n_pairs": 5},
            model="toy", dataset="adult", probe="cdpg")
    cfg = report_cfg(store, tmp_path / "out", "probes.cdpg.K=2", "probes.cdpg.k_list=[2,4]")
    return app.run(cfg)


@pytest.mark.slow
def test_paper000_tables_and_figures_from_a_sweep(paper000_report):
    result = paper000_report
    names = {s.name for s in result.report.sections}
    assert {"table2", "table3", "table4", "table5", "table6", "table7", "table9", "table12", "table13",
            "marginal_t"} <= names
    assert ({"fig3_cdpg_by_cell", "fig4_anchor_mover", "fig6_k_sensitivity", "disparity_changes"}
            <= set(result.report.figures))
    out = result.out_dir
    # Tables 13 / 14 from the CSV: the published row of QwQ-COMPAS's NN state and its column totals
    table13 = pd.read_csv(out / "table13.csv").set_index(["model", "dataset", "from"])
    assert [round(table13.at[("QwQ", "COMPAS", "NN"), s], 3) for s in SPLIT] == [.445, .484, .016, .054]
    assert [table13.at[("QwQ", "COMPAS", "total"), s] for s in SPLIT] == [2218, 2431, 82, 269]
    # Table 7: Appendix D's layout of the same cells, c:b as printed there
    table7 = pd.read_csv(out / "table7.csv").set_index(["model", "dataset"])
    n, a, b, c, d, _ = TABLE_2[("R1-Distill", "Adult")]
    assert table7.loc[("R1-Distill", "Adult"), ["n_pairs", "cell_a", "cell_b", "cell_c", "cell_d"]].tolist() == [
        n, a, b, c, d]
    assert table7.at[("R1-Distill", "Adult"), "c_b_ratio"] == pytest.approx(c / b)
    # Table 12: exact |b|; Table 3's delta rows; Table 6 from the cdpg run (cell c slope 1.1 at K=2, 0.68 at K=4)
    table12 = pd.read_csv(out / "table12.csv").set_index(["model", "dataset"])
    assert table12.at[("QwQ", "Adult"), "b_actual"] == 152
    table3 = pd.read_csv(out / "table3.csv")
    assert set(table3["A"]) == {"alpha", "alpha_prime", "delta"}
    assert set(table3["model"]) == {"QwQ", "R1-Distill", "toy"}
    table6 = pd.read_csv(out / "table6.csv")
    row = table6[table6["model"] == "toy"].iloc[0]
    assert (row["n_c"], row["slope_k2"], row["slope_k4"]) == (2, pytest.approx(1.1), pytest.approx(0.68))
    marginal = pd.read_csv(out / "marginal_t.csv").set_index("nothink")
    assert marginal["n"].sum() > 2 * sum(TABLE_2[k][0] for k in TABLE_13_14)  # + the toy cell's parsed instances
    md = (out / "report.md").read_text()
    for caption in ("Table 3 (with 10, 11)", "Tables 13, 14", "Table 12: independence-bound check",
                    "Appendix G: pooled marginal T", "Table 6: CDPG segmentation sensitivity", "Table 7"):
        assert caption in md
    assert r"\|c\| ind." in md and "Δ = T^α − T^α′" in md and "figures/fig3_cdpg_by_cell.png" in md


def mcq_records(model: str, arm: str, seed: int, n_questions: int = 12) -> pd.DataFrame:
    """Scripted MCQ records: each question's four permutations, answers drawn toward position A with seed."""
    rng = np.random.default_rng(seed)
    rows = []
    for q in range(n_questions):
        length = 100 * (q + 1)
        for s in range(4):
            gold = (q + s) % 4
            # toward A, else gold, else the option after gold (so PBS is not a function of accuracy)
            draw = rng.random()
            answer = 0 if draw < 0.2 + 0.05 * q else gold if draw < 0.85 else (gold + 1) % 4
            rows.append({"question_id": q, "permutation": s, "gold_position": gold, "answer_position": answer,
                         "answer_source": "cascade", "length_chars": length + s, "arm": arm, "model": model,
                         "ccp": 0.5, "eff_sw": 0.1, "text": "x"})
    return pd.DataFrame(rows)


@pytest.mark.slow
def test_position_bias_tables_from_a_sweep(store, tmp_path):
    parent = store.sweep()
    frames = {("r1_distill_qwen_7b", "reason"): mcq_records("r1_distill_qwen_7b", "reason", 0),
              ("qwen25_7b_instruct", "cot"): mcq_records("qwen25_7b_instruct", "cot", 1),
              ("qwen25_7b_instruct", "direct"): mcq_records("qwen25_7b_instruct", "direct", 2)}
    for (model, arm), records in frames.items():
        log_job(store, parent, {"records": records}, position(records)["metrics"],
                model=model, dataset="mmlu", probe="position", arm=arm)
    result = app.run(report_cfg(store, tmp_path / "out"))
    out = result.out_dir
    assert {"p001_table1", "p001_table2", "p001_table3", "p001_table4"} <= {s.name for s in result.report.sections}
    assert {"p001_fig2_length_pbs", "p001_fig4_pbs_length_mmlu"} <= set(result.report.figures)
    table2 = pd.read_csv(out / "p001_table2.csv").set_index(["model", "arm"])
    expected = position(frames[("r1_distill_qwen_7b", "reason")])["metrics"]
    assert table2.at[("r1_distill_qwen_7b", "reason"), "pbs"] == pytest.approx(expected["pbs_reason"])
    assert table2.at[("r1_distill_qwen_7b", "reason"), "accuracy"] == pytest.approx(expected["accuracy_reason"])
    table1 = pd.read_csv(out / "p001_table1.csv").set_index(["model", "arm"])
    assert table1.at[("qwen25_7b_instruct", "cot"), "mmlu_rho"] == pytest.approx(
        position(frames[("qwen25_7b_instruct", "cot")])["metrics"]["partial_rho_length_pbs_cot"])
    table4 = pd.read_csv(out / "p001_table4.csv").set_index("comparison")
    for reference in ("cot", "direct"):
        test = pbs_wilcoxon(frames[("r1_distill_qwen_7b", "reason")], frames[("qwen25_7b_instruct", reference)])
        assert table4.at[f"reason > {reference}", "n"] == test["pbs_wilcoxon_n"]
        assert table4.at[f"reason > {reference}", "p"] == pytest.approx(test["pbs_wilcoxon_p"])
    table3 = pd.read_csv(out / "p001_table3.csv")
    assert {"monotonic_k3", "first_violation_k5", "gradient_k10"} <= set(table3.columns)
    md = (out / "report.md").read_text()
    assert "Position bias, Table 2: full per-configuration results" in md and "| n-rec |" in md
    # Table 1 by the configured method (pearson) and by the other one; Table 4 under all three zero methods
    spearman = pd.read_csv(out / "p001_table1_spearman.csv").set_index(["model", "arm"])
    assert spearman.at[("qwen25_7b_instruct", "cot"), "mmlu_rho"] == pytest.approx(position(
        frames[("qwen25_7b_instruct", "cot")])["metrics"]["partial_rho_length_pbs_spearman_cot"])
    for method in ("wilcox", "pratt", "zsplit"):
        test = pbs_wilcoxon(frames[("r1_distill_qwen_7b", "reason")], frames[("qwen25_7b_instruct", "cot")],
                            zero_method=method)
        assert table4.at["reason > cot", f"p_{method}"] == pytest.approx(test["pbs_wilcoxon_p"])
    assert table4.at["reason > cot", "p"] == table4.at["reason > cot", "p_wilcox"]
    assert "Table 1 by the other method (spearman)" in md and "| p pratt |" in md


@pytest.mark.slow
def test_position_report_settings_choose_the_method_and_are_checked(store, tmp_path):
    parent = store.sweep()
    records = mcq_records("r1_distill_qwen_7b", "reason", 0)
    log_job(store, parent, {"records": records}, position(records)["metrics"],
            model="r1_distill_qwen_7b", dataset="mmlu", probe="position", arm="reason")
    result = app.run(report_cfg(store, tmp_path / "out", "probes.position.partial_corr=spearman",
                                "log_to_mlflow=false"))
    table1 = pd.read_csv(result.out_dir / "p001_table1.csv")
    expected = position(records, partial_corr="spearman")["metrics"]["partial_rho_length_pbs_reason"]
    assert table1["mmlu_rho"].iloc[0] == pytest.approx(expected)
    assert "p001_table1_pearson" in {s.name for s in result.report.sections}
    from fairaudit.errors import AuditError
    with pytest.raises(AuditError,
                       match=r"probes.position.zero_method='drop' must be one of \['wilcox', 'pratt', 'zsplit'\]"):
        app.run(report_cfg(store, tmp_path / "out2", "probes.position.zero_method=drop", "log_to_mlflow=false"))
