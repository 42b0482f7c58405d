"""The study report: pooled rows, seed statistics, sign test and curves, from a real sqlite MLflow store."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from fairaudit.analysis import study
from fairaudit.analysis.contingency import contingency
from fairaudit.analysis.gap import p_gap
from fairaudit.analysis.numbers import format_p
from fairaudit.analysis.stats import mcnemar_exact_log10_p, t_interval
from fairaudit.catalog.registry import store_report_settings
from fairaudit.errors import AuditError
from fairaudit.report import app
from fairaudit.tracking.content import finite_metrics
from fairaudit.views import render

CONF = str(Path(__file__).resolve().parents[1] / "conf")
T_975_4 = 2.7764451051977987  # Student t quantile, 0.975, 4 degrees of freedom (scipy.stats.t.ppf(0.975, 4))


# ---------------------------------------------------------------- helpers: records and a real MLflow store


def synthetic_records(seed: int, n_pairs: int, dataset: str = "adult", flip_think: float = 0.3,
                      flip_nothink: float = 0.1, unparsed: float = 0.05) -> pd.DataFrame:
    """Long records (docs/architecture.md) with random answers; pair ids repeat across calls on purpose."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n_pairs):
        pair_id = f"{dataset}-{i}"
        for arm, flip in (("think", flip_think), ("nothink", flip_nothink)):
            base = rng.random() < 0.3
            other = (not base) if rng.random() < flip else base
            for side, yes in (("alpha", base), ("alpha_prime", other)):
                answer = None if rng.random() < unparsed else ("Yes" if yes else "No")
                p_yes = float(np.clip((0.8 if yes else 0.2) + rng.normal(0, 0.1), 0, 1))
                rows.append({"pair_id": pair_id, "side": side, "attribute_value": side, "arm": arm,
                             "answer": answer, "p_yes": p_yes, "trace_tokens": 10 if arm == "think" else 0})
    return pd.DataFrame(rows)


class Store:
    """One experiment of a sqlite MLflow store, its artifacts kept under `root` too."""

    def __init__(self, db: Path, root: Path, experiment: str):
        from mlflow import MlflowClient

        self.root, self.experiment = root, experiment
        self.uri = f"sqlite:///{db}"
        self.client = MlflowClient(self.uri)
        self.experiment_id = self.client.create_experiment(experiment, artifact_location=(root / "artifacts").as_uri())
        self.records: dict[str, pd.DataFrame] = {}

    def sweep(self, **tags: str) -> str:
        """A sweep parent run; tags e.g. study=..., probe=... (fairaudit.study, fairaudit.probe)."""
        tags = {f"fairaudit.{k}": v for k, v in tags.items()}
        return self.client.create_run(self.experiment_id, tags={"fairaudit.kind": "sweep", **tags}).info.run_id

    def job(self, records: pd.DataFrame, parent: str | None = None, status: str = "FINISHED",
            metrics: dict | None = None, params: dict | None = None, **axes) -> str:
        from mlflow.entities import Metric, Param

        tags = {"model": "m", "dataset": "adult", "probe": "counterfactual", "arm": "think", "seed": "0",
                "checkpoint": "base", **{k: str(v) for k, v in axes.items()}, "fairaudit.kind": "job"}
        if parent:
            tags["mlflow.parentRunId"] = parent
        run_id = self.client.create_run(self.experiment_id, tags=tags).info.run_id
        values = metrics if metrics is not None else contingency(records, "think", "nothink", n_boot=0)
        self.client.log_batch(run_id, metrics=[Metric(k, v, 0, 0) for k, v in finite_metrics(values).items()],
                              params=[Param(k, str(v)) for k, v in
                                      {"probe.baseline_arm.name": "nothink", **(params or {})}.items()])
        path = self.root / "records" / run_id / "records.parquet"
        path.parent.mkdir(parents=True)
        records.to_parquet(path)
        self.client.log_artifact(run_id, str(path), "records")  # records/records.parquet, as app.py logs it
        self.client.set_terminated(run_id, status=status)
        self.records[run_id] = records
        return run_id


def report_cfg(store: Store, out: Path, *overrides: str):
    """The report's config on this store's experiment (select.experiment may be overridden)."""
    store_report_settings()
    with initialize_config_dir(config_dir=CONF, version_base=None):
        return compose("report", overrides=[f"tracking.uri={store.uri}", f"output_dir={out}",
                                                   f"select.experiment={store.experiment}", *overrides])


@pytest.fixture(scope="module")
def mlflow_db(tmp_path_factory) -> Path:
    """One sqlite file per module: creating MLflow's schema takes seconds, an experiment per test does not."""
    return tmp_path_factory.mktemp("mlflow") / "mlflow.db"


@pytest.fixture()
def store(mlflow_db, tmp_path, request) -> Store:
    return Store(mlflow_db, tmp_path, request.node.name)


# ---------------------------------------------------------------- paper 000 tables and the pooled row


GRID_MODELS = ("qwen3", "qwq", "r1_distill_qwen")
GRID_DATASETS = ("adult", "compas", "credit")


@pytest.fixture()
def grid(store) -> tuple[str, list[str]]:
    """A 3 x 3 (model, dataset) sweep with different N per cell, pair ids shared across models."""
    parent = store.sweep()
    ids = []
    for m, model in enumerate(GRID_MODELS):
        for d, dataset in enumerate(GRID_DATASETS):
            records = synthetic_records(10 * m + d, 30 + 7 * m + 3 * d, dataset, flip_think=0.2 + 0.1 * m)
            ids.append(store.job(records, parent, model=model, dataset=dataset))
    # another probe of the same sweep: listed with the source runs, kept out of the paper tables
    store.job(synthetic_records(99, 5), parent, metrics={"n_pairs": 5, "tpair_nn_m": 0.1}, probe="btm")
    return parent, ids


@pytest.mark.slow
def test_pooled_row_is_contingency_of_the_pooled_records(store, grid, tmp_path):
    parent, ids = grid
    result = app.run(report_cfg(store, tmp_path / "out"))

    table2 = pd.read_csv(tmp_path / "out" / "table2.csv")
    assert list(table2["model"][:9]) == [m for m in GRID_MODELS for _ in GRID_DATASETS]
    assert list(table2["dataset"][:9]) == list(GRID_DATASETS) * 3
    assert table2["model"].iloc[-1] == "Pooled (9 cells)" and len(table2) == 10

    pooled_records = pd.concat([store.records[i].assign(pair_id=f"{i}:" + store.records[i]["pair_id"]) for i in ids])
    expected = contingency(pooled_records, "think", "nothink", n_boot=0)
    pooled = table2.iloc[-1]
    for column in study.table2_columns("think", "nothink"):
        assert pooled[column] == pytest.approx(expected[column], nan_ok=True), column
    for name, column in (("table9", "d_cf_think"), ("table9", "delta_d_group"), ("table5", "asym_c"),
                         ("table5", "delta_c")):
        assert pd.read_csv(tmp_path / "out" / f"{name}.csv").iloc[-1][column] == pytest.approx(expected[column])

    # cells add up; ratios do not: the pooled D_cf is not the mean of the rows' D_cf
    rows = table2.iloc[:9]
    for cell in "abcd":
        assert pooled[f"cell_{cell}"] == rows[f"cell_{cell}"].sum()
    assert pooled["d_disp_c_think"] != pytest.approx(rows["d_disp_c_think"].mean(), rel=1e-9)
    # pairs are kept apart per run: pooling on the raw pair ids would merge different runs' pairs
    merged = contingency(pd.concat(store.records[i] for i in ids), "think", "nothink", n_boot=0)
    assert merged["n_pairs"] < expected["n_pairs"]

    # rows are the runs' own logged metrics
    first = contingency(store.records[ids[0]], "think", "nothink", n_boot=0)
    assert rows.iloc[0]["cell_c"] == first["cell_c"]
    assert rows.iloc[0]["mcnemar_log10_p"] == pytest.approx(first["mcnemar_log10_p"])

    md = (tmp_path / "out" / "report.md").read_text()
    assert "| Pooled (9 cells) |" in md and "McNemar p" in md and "## Table 9" in md and "## Table 5" in md
    assert (tmp_path / "out" / "figures" / "disparity_changes.png").stat().st_size > 0

    # the report run in MLflow, linked to its sources
    run = store.client.get_run(result.run_id)
    assert run.data.tags["fairaudit.kind"] == "report"
    assert run.data.tags["fairaudit.source_parent"] == parent
    assert set(ids) < set(run.data.tags["fairaudit.source_runs"].split(",")) and len(result.selection.runs) == 10
    assert run.data.metrics["pooled_cell_c"] == expected["cell_c"]
    assert "| Pooled (9 cells) |" in run.data.tags["mlflow.note.content"]
    artifacts = {a.path for a in store.client.list_artifacts(result.run_id)}
    assert {"report.md", "table2.csv", "table9.csv", "table5.csv", "runs.csv", "figures"} <= artifacts


def test_pooled_row_with_no_mlflow():
    """The pure path: study tables from frames alone."""
    records = {f"r{i}": synthetic_records(i, 20) for i in range(3)}
    runs = pd.DataFrame([{"run_id": k, "model": "m", "dataset": f"d{i}", "probe": "counterfactual", "arm": "think",
                          "checkpoint": "base", "seed": "0", **contingency(v, n_boot=0)}
                         for i, (k, v) in enumerate(records.items())])
    pooled = study.pooled_metrics(records, "think", "nothink")
    tables = study.paper_tables(runs, pooled, "think", "nothink", study.cell_axes(runs))
    assert tables["table2"]["model"].iloc[-1] == "Pooled (3 cells)"
    assert tables["table2"]["n_pairs"].iloc[-1] == runs["n_pairs"].sum() == pooled["n_pairs"]
    assert study.cell_axes(runs) == ["model", "dataset"]


def test_published_table2_pooled_row_adds_up():
    """Paper 000 Table 2: the pooled cells are the sums of the nine rows; McNemar p renders as printed."""
    rows = [(4531, 75, 362, 32), (4511, 143, 344, 2), (4867, 23, 105, 1), (4396, 152, 443, 9), (4634, 15, 351, 0),
            (4265, 121, 595, 3), (4255, 77, 646, 21), (1247, 4, 179, 0), (4502, 10, 483, 0)]
    assert [sum(r[i] for r in rows) for i in range(4)] == [37208, 620, 3508, 68]
    assert format_p(mcnemar_exact_log10_p(75, 362)) == "3.7e-46"
    assert format_p(mcnemar_exact_log10_p(4, 179)) == "7.5e-48"
    assert mcnemar_exact_log10_p(620, 3508) == pytest.approx(-485.6048, abs=1e-4)
    assert format_p(mcnemar_exact_log10_p(620, 3508)) == "10^-485.6"  # below the smallest double: from its log10


def test_rendering():
    assert format_p(0.0) == "1"
    assert format_p(math.log10(0.0123)) == "0.0123"
    assert format_p(-2.0) == "0.01"
    assert format_p(math.log10(9.96e-7)) == "1.0e-6"
    fmt = render.display(pd.DataFrame({"cell_c": [362.0], "delta_d_cf": [0.058], "delta_c": [0.002],
                                       "asym_c": [math.nan]}))
    assert fmt.iloc[0].tolist() == ["362", "+0.058", "+0.20", "n/a"]
    md = render.markdown(pd.DataFrame({"model": ["a|b"], "N": ["12"]}))
    assert md.splitlines() == ["| model | N |", "| :--- | ---: |", "| a\\|b | 12 |"]


def gaps_by_hand(records: pd.DataFrame) -> dict[str, float]:
    """Mean |P(Yes | alpha) - P(Yes | alpha')| per arm over a run's pairs (synthetic records score every side)."""
    wide = records.pivot(index=["pair_id", "arm"], columns="side", values="p_yes")
    gap = (wide["alpha"] - wide["alpha_prime"]).abs().groupby(level="arm").mean()
    return {"p_gap_think": gap["think"], "p_gap_nothink": gap["nothink"], "delta_p_gap": gap["think"] - gap["nothink"]}


@pytest.mark.slow
def test_table2_shows_the_p_yes_gap_a_warning_points_at_and_each_runs_warnings(store, tmp_path, capsys):
    """No seed axis, so no seed summary: Table 2 itself carries the P(Yes) gap under each arm and its change (rows:
    the runs' metrics; the pooled row: every pair of both runs), and marks the warned run's row."""
    yes = "every answer (24 of 24, think and nothink) is Yes: ...; read the P(Yes) gap instead"
    parent, frames = store.sweep(), {}
    for dataset, n in (("adult", 12), ("compas", 8)):
        records = synthetic_records(len(frames), n, dataset)
        run_id = store.job(records, parent, metrics={**contingency(records, n_boot=0), **p_gap(records, n_boot=0)},
                           dataset=dataset)
        frames[dataset] = gaps_by_hand(records)
        if dataset == "adult":
            store.client.set_tag(run_id, "fairaudit.warnings", yes)
    app.run(report_cfg(store, tmp_path / "out", "log_to_mlflow=false"))
    table2 = pd.read_csv(tmp_path / "out" / "table2.csv").set_index("model")
    pooled = {k: (12 * frames["adult"][k] + 8 * frames["compas"][k]) / 20 for k in frames["adult"]}
    for column in ("p_gap_think", "p_gap_nothink", "delta_p_gap"):
        assert table2[column].tolist() == pytest.approx([frames["adult"][column], frames["compas"][column],
                                                         pooled[column]]), column
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Seed summary" not in md and "- warning: W1 (1 of 2 runs: m adult): " + yes in md
    header, rows = "| model | dataset | warnings | N | a | b | c | d | McNemar p |", [
        line for line in md.splitlines() if line.startswith(("| m |", "| Pooled"))][:3]
    assert header in md and "| P(Yes) gap nothink | P(Yes) gap think | ΔP(Yes) gap |" in md
    assert [row.split(" | ")[2] for row in rows] == ["W1", "", ""]
    assert f"{frames['adult']['p_gap_think']:.3f} | {frames['adult']['delta_p_gap']:+.3f} |" in rows[0]
    terminal = next(line for line in capsys.readouterr().out.splitlines() if "┃ model" in line)
    assert [c.strip() for c in terminal.strip("┃").split("┃")][:4] == ["model", "dataset", "warnings", "N"]


# ---------------------------------------------------------------- seeds, sign test, checkpoints


D_CF = [0.10, 0.12, 0.08, 0.11, 0.09]


def test_seed_statistics_by_hand():
    runs = pd.DataFrame({"model": "m", "dataset": "adult", "seed": [str(s) for s in range(5)], "d_cf_think": D_CF})
    row = study.seed_summary(runs, ["d_cf_think", "absent"], ["model", "dataset"]).iloc[0]
    sd = math.sqrt((0.0 + 0.02 ** 2 + 0.02 ** 2 + 0.01 ** 2 + 0.01 ** 2) / 4)  # ddof = 1
    half = T_975_4 * sd / math.sqrt(5)
    assert (row["n"], row["metric"]) == (5, "d_cf_think")
    assert row["mean"] == pytest.approx(0.10)
    assert row["sd"] == pytest.approx(sd) == pytest.approx(0.015811388)
    assert (row["ci_low"], row["ci_high"]) == (pytest.approx(0.10 - half), pytest.approx(0.10 + half))
    single = t_interval(np.array([0.3]))
    assert single[0] == 0.3 and all(math.isnan(v) for v in single[1:])


@pytest.mark.slow
def test_seed_sweep_report(store, tmp_path):
    parent = store.sweep()
    for seed, d_cf in enumerate(D_CF):
        records = synthetic_records(seed, 12)
        metrics = {**contingency(records, n_boot=0), "d_cf_think": d_cf}
        store.job(records, parent, metrics=metrics, seed=seed)
    app.run(report_cfg(store, tmp_path / "out", "log_to_mlflow=false"))
    seeds = pd.read_csv(tmp_path / "out" / "seeds.csv")
    row = seeds[seeds["metric"] == "d_cf_think"].iloc[0]
    sd = float(np.std(D_CF, ddof=1))
    assert (row["n"], row["mean"], row["sd"]) == (5, pytest.approx(0.1), pytest.approx(sd))
    assert row["ci_high"] - row["mean"] == pytest.approx(T_975_4 * sd / math.sqrt(5))
    assert "seed" not in seeds.columns
    assert "## Seed summary" in (tmp_path / "out" / "report.md").read_text()


@pytest.mark.slow
def test_the_report_says_which_runs_it_read_and_carries_their_warnings_and_n_a_reasons(store, tmp_path, capsys):
    """Every seed warns "every answer is Yes", one seed also of its traces; asym_c is undefined in every seed: the
    seed summary marks the cell, the console and report.md tell each warning once with its runs and each n/a's
    reason, and the first line on stderr names the sweep the report chose."""
    import json

    yes = "every answer (8 of 8, think and nothink) is Yes: the model answers the same whoever the person is"
    parent = store.sweep()
    store.client.update_run(parent, name="sweep 2026-12-03 11:34 counterfactual dataset.seed=range(3)")
    for seed in range(3):
        records = synthetic_records(seed, 12)
        run_id = store.job(records, parent, metrics=contingency(records, n_boot=0), seed=seed)
        store.client.set_tag(run_id, "fairaudit.warnings", yes + ("\ntraces never closed" if seed == 2 else ""))
        store.client.set_tag(run_id, "fairaudit.undefined", json.dumps({"no pair in cell c": ["asym_c"]}))
    app.run(report_cfg(store, tmp_path / "out", "log_to_mlflow=false", "select.parent=latest"))
    out, err = capsys.readouterr()
    assert err.splitlines()[0] == (f"report on 3 runs of sweep 'sweep 2026-12-03 11:34 counterfactual "
                                   f"dataset.seed=range(3)' ({parent}) in experiment {store.experiment!r}, the "
                                   "latest study (select.parent=latest; select.parent=ID chooses another)")
    cells = ", ".join(f"m adult seed {seed}" for seed in range(3))
    assert f"warning: W1 (3 of 3 runs: {cells}): {yes}" in out.splitlines()
    assert "warning: W2 (1 of 3 runs: m adult seed 2): traces never closed" in out.splitlines()
    assert "n/a: asym_c (3 of 3 runs): no pair in cell c" in out.splitlines()
    seeds = next(line for line in out.splitlines() if "┃ model" in line and "metric" in line)
    assert [c.strip() for c in seeds.strip("┃").split("┃")][:3] == ["model", "dataset", "warnings"]
    assert any("W1, W2" in line and "cell_c" in line for line in out.splitlines())
    report_md = (tmp_path / "out" / "report.md").read_text()
    assert f"- warning: W1 (3 of 3 runs: {cells}): {yes}" in report_md and "## Warnings on the source runs" in report_md
    warned = pd.read_csv(tmp_path / "out" / "warnings.csv")
    assert len(warned) == 4 and set(warned["warning"]) == {yes, "traces never closed"}


def test_sign_test_all_fifteen_cells_one_way():
    cells = pd.DataFrame({"checkpoint": np.repeat(["c1", "c2", "c3"], 5), "seed": list(range(5)) * 3,
                          "a_to_b": np.linspace(0.2, 0.4, 15), "b_to_a": np.linspace(0.02, 0.07, 15)})
    result = study.sign_test(study.sign_comparisons(cells, "a_to_b", "b_to_a"), "greater")
    assert (result["successes"], result["n"]) == (15, 15)
    assert result["p"] == pytest.approx(2.0 ** -15, rel=1e-12)
    assert result["log10_p"] == pytest.approx(-15 * math.log10(2))
    counts = study.sign_counts(study.sign_comparisons(cells, "a_to_b", "b_to_a"), ["checkpoint"])
    assert counts[["successes", "n"]].values.tolist() == [[5, 5]] * 3

    cells.loc[0, "a_to_b"] = cells.loc[0, "b_to_a"]          # a tie, dropped
    cells.loc[1, "a_to_b"] = 0.0                               # one cell the other way
    result = study.sign_test(study.sign_comparisons(cells, "a_to_b", "b_to_a"))
    assert (result["successes"], result["n"], result["n_ties"]) == (13, 14, 1)
    assert result["p"] == pytest.approx(15 / 2 ** 14)         # P(X <= 1), X ~ Bin(14, 1/2)
    against_zero = study.sign_test(study.sign_comparisons(cells.assign(delta=1.0), "delta", 0))
    assert against_zero["successes"] == 15


def test_a_sign_test_p_below_the_smallest_double_is_nan_and_lives_in_its_log10():
    cells = pd.DataFrame({"delta": np.ones(1100)})   # 1100 cells one way: p = 2^-1100 = 10^-331.1, no double
    result = study.sign_test(study.sign_comparisons(cells, "delta", 0))
    assert result["log10_p"] == pytest.approx(-1100 * math.log10(2)) and math.isnan(result["p"])   # was 0.0
    assert study.sign_test(study.sign_comparisons(cells.iloc[:1000], "delta", 0))["p"] == pytest.approx(2.0 ** -1000)


@pytest.mark.slow
def test_checkpoint_sweep_report(store, tmp_path):
    """3 checkpoints x 5 seeds in one sweep: seed summaries per checkpoint, sign test 15/15, a curve figure."""
    parent = store.sweep()
    for checkpoint, level in (("step1000", 0.3), ("step200", 0.1), ("step30", 0.05)):
        for seed in range(5):
            records = synthetic_records(seed, 10)
            metrics = {**contingency(records, n_boot=0), "d_cf_think": level + 0.01 * seed, "d_cf_nothink": 0.01}
            store.job(records, parent, metrics=metrics, seed=seed, checkpoint=checkpoint)
    result = app.run(report_cfg(store, tmp_path / "out"))
    out = tmp_path / "out"
    assert (out / "figures" / "checkpoint_d_cf_think.png").stat().st_size > 0
    curve = pd.read_csv(out / "checkpoint_curves.csv")
    d_cf = curve[curve["metric"] == "d_cf_think"]
    assert d_cf["checkpoint"].tolist() == ["step30", "step200", "step1000"]      # natural order, not text order
    assert d_cf["mean"].tolist() == pytest.approx([0.07, 0.12, 0.32])
    assert d_cf["n"].tolist() == [5, 5, 5]
    sign = pd.read_csv(out / "sign_test.csv", keep_default_na=False)
    assert sign["successes"].tolist() == [5, 5, 5, 15] and sign["n"].tolist() == [5, 5, 5, 15]
    run = store.client.get_run(result.run_id)
    assert run.data.metrics["sign_test_log10_p"] == pytest.approx(-15 * math.log10(2))
    seeds = pd.read_csv(out / "seeds.csv")
    assert set(seeds["checkpoint"]) == {"step30", "step200", "step1000"}

    explicit = app.run(report_cfg(store, tmp_path / "out2", "log_to_mlflow=false",
                                  "curves.order=[step1000,step200,step30]"))
    table = explicit.report.section("checkpoint_curves").table
    assert table[table["metric"] == "d_cf_think"]["checkpoint"].tolist() == ["step1000", "step200", "step30"]


def test_natural_order():
    assert study.ordered_values(["step10", "step2", "base", "step1"]) == ["base", "step1", "step2", "step10"]
    assert study.ordered_values(["b", "a", "c"], explicit=["c", "a"]) == ["c", "a", "b"]


# ---------------------------------------------------------------- selection


@pytest.mark.slow
def test_selection_latest_sweep_tags_and_status(store, tmp_path):
    old = store.sweep()
    store.job(synthetic_records(0, 8), old, model="old")
    new = store.sweep()
    kept = [store.job(synthetic_records(i, 8), new, model=f"m{i}") for i in range(2)]
    failed = store.job(synthetic_records(9, 8), new, model="m9", status="FAILED")

    latest = app.run(report_cfg(store, tmp_path / "a", "log_to_mlflow=false"))
    assert latest.selection.parent == new
    assert set(latest.selection.runs["run_id"]) == set(kept)
    assert latest.selection.left_out["run_id"].tolist() == [failed]
    assert "Left out: 1 FAILED" in (tmp_path / "a" / "report.md").read_text()

    by_parent = app.run(report_cfg(store, tmp_path / "b", "log_to_mlflow=false", f"select.parent={old}"))
    assert by_parent.selection.runs["model"].tolist() == ["old"]

    by_tag = app.run(report_cfg(store, tmp_path / "c", "log_to_mlflow=false", "select.parent=null",
                                "select.tags.model=m1"))
    assert by_tag.selection.runs["run_id"].tolist() == [kept[1]]

    everything = app.run(report_cfg(store, tmp_path / "d", "log_to_mlflow=false", "select.parent=null",
                                    "select.status=null"))
    assert len(everything.selection.runs) == 4
    assert everything.report.section("table2").table["model"].iloc[-1] == "Pooled (4 cells)"

    sweep_dir = tmp_path / "multirun"
    sweep_dir.mkdir()
    (sweep_dir / "mlflow_parent_run_id").write_text(old)
    by_dir = app.run(report_cfg(store, tmp_path / "e", "log_to_mlflow=false", f"select.sweep_dir={sweep_dir}"))
    assert by_dir.selection.parent == old


@pytest.mark.slow
def test_by_default_the_latest_studys_runs_of_every_probe(store, tmp_path, capsys):
    """A counterfactual sweep, then a btm sweep of the same grid: both are reported (Table 2 is not lost), the
    newest sweep of each probe, not an older study's. Tables the selection cannot fill are one line each."""
    other = store.sweep(study="s0", probe="counterfactual")
    store.job(synthetic_records(5, 8), other, model="old")
    stale = store.sweep(study="s1", probe="counterfactual")
    store.job(synthetic_records(6, 8), stale, model="stale")
    counterfactual = store.sweep(study="s1", probe="counterfactual")
    kept = store.job(synthetic_records(0, 8), counterfactual)
    btm = store.sweep(study="s1", probe="btm")
    btm_run = store.job(synthetic_records(1, 8), btm, metrics={"n_pairs": 8, "tpair_nn_m": 0.1}, probe="btm")
    capsys.readouterr()
    result = app.run(report_cfg(store, tmp_path / "a", "log_to_mlflow=false"))
    assert result.selection.parents == [btm, counterfactual]
    assert set(result.selection.runs["run_id"]) == {kept, btm_run}
    assert result.report.section("table2").table["n_pairs"].iloc[0] > 0
    out, err = capsys.readouterr()
    assert "Table 2: contingency cells" in out  # tables on stdout
    assert "not in this report: Table 6 and Figs. 3, 4, 6: no cdpg runs" in err

    alone = app.run(report_cfg(store, tmp_path / "b", "log_to_mlflow=false", f"select.parent={btm}"))
    assert alone.report.missing[0].startswith("Tables 2, 9, 5, 7: no counterfactual runs among the 1 selected")
    assert "select.parent=null select.tags.probe=counterfactual" in alone.report.missing[0]
    assert "not in this report: Tables 2, 9, 5, 7" in capsys.readouterr().err
    assert "Not in this report: Tables 2, 9, 5, 7" in (tmp_path / "b" / "report.md").read_text()


@pytest.mark.slow
def test_selection_errors(store, tmp_path):
    with pytest.raises(AuditError, match="no sweep run"):
        app.run(report_cfg(store, tmp_path / "a"))
    with pytest.raises(AuditError, match=f"no MLflow experiment 'nope'.*{store.experiment}"):
        app.run(report_cfg(store, tmp_path / "a", "select.experiment=nope"))
    with pytest.raises(AuditError, match="not a fairaudit multirun"):
        app.run(report_cfg(store, tmp_path / "a", f"select.sweep_dir={tmp_path}"))
    with pytest.raises(AuditError, match="unsupported scheme 'foo'"):
        app.run(report_cfg(store, tmp_path / "a", "tracking.uri=foo://bar"))
    parent = store.sweep()
    store.job(synthetic_records(0, 8), parent)
    with pytest.raises(AuditError, match="no job runs match"):
        app.run(report_cfg(store, tmp_path / "a", "select.tags.model=absent"))


@pytest.mark.slow
def test_mixed_arms_are_not_pooled(store, tmp_path):
    parent = store.sweep()
    store.job(synthetic_records(0, 8), parent)
    records = synthetic_records(1, 8).replace({"arm": {"think": "cot"}})
    store.job(records, parent, metrics=contingency(records, "cot", "nothink", n_boot=0), arm="cot")
    with pytest.raises(AuditError, match="different arms.*select.tags.arm"):
        app.run(report_cfg(store, tmp_path / "a"))
    ok = app.run(report_cfg(store, tmp_path / "b", "select.tags.arm=cot", "log_to_mlflow=false"))
    assert "D_cf cot" in ok.report.section("table9").shown.columns
