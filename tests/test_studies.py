"""Named studies (`+experiment=NAME`), the checkpoint axis, and one smoke study end to end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from conftest import run_app
from fairaudit.catalog import registry
from fairaudit.job.config import Place
from fairaudit.job.tags import job_tags

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
STUDIES = registry.names("experiment")


def compose_job(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose("config", overrides=list(overrides), return_hydra_config=True)


def sweep_jobs(params: dict, command_line: tuple[str, ...] = ()) -> list[list[str]]:
    """The jobs Hydra's basic sweeper launches for hydra.sweeper.params plus command-line overrides."""
    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()] + list(command_line))
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


def test_studies_exist():
    assert {"thinking_fairness", "thinking_fairness_bf16", "thinking_fairness_smoke", "seed_sweep"} <= set(STUDIES)


@pytest.mark.slow
@pytest.mark.parametrize("study", STUDIES)
def test_every_job_of_every_study_composes(study):
    cfg = compose_job(f"+experiment={study}")
    jobs = sweep_jobs(OmegaConf.to_container(cfg.hydra.sweeper.params))
    assert jobs
    for job in jobs:
        job_cfg = compose_job(f"+experiment={study}", *job)
        OmegaConf.to_container(job_cfg.model, resolve=True)
        OmegaConf.to_container(job_cfg.dataset, resolve=True)
        assert job_cfg.tracking.experiment == study


@pytest.mark.parametrize("study, suffix", [("thinking_fairness", "_awq"), ("thinking_fairness_bf16", "")])
def test_thinking_fairness_is_paper_000s_grid(study, suffix):
    """§4.1 ran every model at 4-bit AWQ; the bf16 grid is a study of its own."""
    cfg = compose_job(f"+experiment={study}")
    jobs = sweep_jobs(OmegaConf.to_container(cfg.hydra.sweeper.params))
    assert len(jobs) == 27
    assert {j[0] for j in jobs} == {f"model={m}{suffix}" for m in ("qwen3", "qwq", "r1_distill_qwen")}
    assert {j[1] for j in jobs} == {"dataset=adult", "dataset=compas", "dataset=credit"}
    assert {j[2] for j in jobs} == {"probe=counterfactual", "probe=cdpg", "probe=btm"}
    assert cfg.dataset.n == 5000 and cfg.arm.name == "think"


def test_smoke_study_has_the_same_shape_on_embedded_models():
    cfg = compose_job("+experiment=thinking_fairness_smoke")
    jobs = sweep_jobs(OmegaConf.to_container(cfg.hydra.sweeper.params))
    models = {j[0].split("=")[1] for j in jobs}
    probes = {j[2] for j in jobs}
    assert models <= {"tiny_qwen3", "smollm2"} and probes == {"probe=counterfactual", "probe=cdpg", "probe=btm"}
    assert {j[1] for j in jobs} == {"dataset=adult", "dataset=compas", "dataset=credit"}
    assert len(jobs) == len(models) * 3 * len(probes)
    assert cfg.dataset.n <= 10


def test_seed_sweep_is_five_seeds_of_one_cell():
    cfg = compose_job("+experiment=seed_sweep", "model=qwen3", "dataset=compas")
    assert sweep_jobs(OmegaConf.to_container(cfg.hydra.sweeper.params)) == [[f"dataset.seed={s}"] for s in range(5)]
    assert (cfg.model.name, cfg.dataset.name) == ("qwen3", "compas")


def test_command_line_overrides_replace_a_study_axis():
    """-m model=tiny_qwen3 replaces the study's model axis (Hydra's sweeper keys axes by name)."""
    cfg = compose_job("+experiment=thinking_fairness_smoke")
    jobs = sweep_jobs(OmegaConf.to_container(cfg.hydra.sweeper.params), ("model=tiny_qwen3", "probe=counterfactual"))
    assert jobs == [["model=tiny_qwen3", f"dataset={d}", "probe=counterfactual"] for d in ("adult", "compas", "credit")]


@pytest.mark.parametrize("overrides, path, revision", [
    (["model.checkpoint.label=step2000"], None, None),
    (["model.checkpoint.label=step2000", "model.checkpoint.path=/ckpts/run7/${model.checkpoint.label}"],
     "/ckpts/run7/step2000", None),
    (["model.checkpoint.label=step2000", "model.checkpoint.revision=${model.checkpoint.label}"], None, "step2000"),
    (["model.checkpoint.label=step2000", "model.checkpoint.revision=${.label}"], None, "step2000"),
])
def test_checkpoint_axis(overrides, path, revision):
    """A checkpoint sweep is `-m model.checkpoint.label=a,b,c` plus a path or revision that follows the label."""
    cfg = compose_job("model=qwen3", *overrides)
    checkpoint = OmegaConf.to_container(cfg.model.checkpoint, resolve=True)
    assert checkpoint == {"label": "step2000", "path": path, "revision": revision}
    settings = {key: OmegaConf.to_container(cfg[key], resolve=True) for key in ("model", "dataset", "arm", "backend")}
    assert job_tags(settings, Place({"probe": "counterfactual"}, [], []))["checkpoint"] == "step2000"
    sweep = OverridesParser.create().parse_overrides(["model.checkpoint.label=step1000,step2000,step4000"])[0]
    assert list(sweep.sweep_string_iterator()) == ["step1000", "step2000", "step4000"]


@pytest.mark.slow
@pytest.mark.long
def test_smoke_study_then_report_end_to_end(tmp_path, data_root):
    """`python -m fairaudit +experiment=thinking_fairness_smoke -m`, then `python -m fairaudit.report` on that sweep."""
    study = run_app(tmp_path, "+experiment=thinking_fairness_smoke", "-m", "model=tiny_qwen3", "probe=counterfactual",
                    "dataset.n=2")
    sweep = tmp_path / "multirun"
    assert study.returncode == 0, study.stderr[-3000:]
    assert (sweep / "mlflow_parent_run_id").exists(), study.stderr[-3000:]

    uri, out = f"sqlite:///{tmp_path}/mlflow.db", tmp_path / "report"
    report = subprocess.run(
        [sys.executable, "-m", "fairaudit.report", f"tracking.uri={uri}", f"select.sweep_dir={sweep}",
         f"output_dir={out}"],
        cwd=tmp_path, env={**os.environ, "FAIRAUDIT_DATA": str(data_root)}, capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr[-3000:]
    terminal = report.stdout + report.stderr
    assert "Pooled (3 cells)" in terminal and "McNemar p" in terminal

    table2 = pd.read_csv(out / "table2.csv")
    assert table2["dataset"].tolist()[:3] == ["adult", "compas", "credit"]
    assert table2["model"].tolist() == ["tiny_qwen3"] * 3 + ["Pooled (3 cells)"]
    assert table2["n_pairs"].iloc[-1] == table2["n_pairs"].iloc[:3].sum()
    assert "mcnemar_log10_p" in table2
    assert "| Pooled (3 cells) |" in (out / "report.md").read_text()

    from mlflow import MlflowClient

    client = MlflowClient(uri)
    parent = (sweep / "mlflow_parent_run_id").read_text().strip()
    experiment = client.get_run(parent).info.experiment_id
    reports = client.search_runs([experiment], "tags.`fairaudit.kind` = 'report'")
    assert len(reports) == 1 and reports[0].data.tags["fairaudit.source_parent"] == parent
    assert len(reports[0].data.tags["fairaudit.source_runs"].split(",")) == 3
    assert "table2.csv" in {a.path for a in client.list_artifacts(reports[0].info.run_id)}


@pytest.mark.slow
def test_position_bias_is_the_papers_matched_pairs_modes_and_benchmarks():
    """§3.1: each reasoning model in reasoning mode, each Instruct model direct and CoT; §3.5 sizes; §4: Q4_K_M in
    llama.cpp, an 8192-token context."""
    cfg = compose_job("+experiment=position_bias")
    jobs = sweep_jobs(OmegaConf.to_container(cfg.hydra.sweeper.params))
    assert len(jobs) == 18
    cells = set()
    for job in jobs:
        job_cfg = compose_job("+experiment=position_bias", *job)
        cells.add((job_cfg.model.name, job_cfg.arm.name, job_cfg.dataset.name, job_cfg.dataset.n))
        assert job_cfg.probe._target_.endswith("PositionProbe")
        assert (job_cfg.model.max_context, job_cfg.model.max_think_tokens) == (8192, 7680)
        assert job_cfg.model.gguf_file.endswith("Q4_K_M.gguf")
        assert job_cfg.backend._target_.endswith("LlamaCppBackend")  # §3: llama-cpp-python on the GGUF files
    pairs = {(m, a) for m, a, _, _ in cells}
    assert pairs == {("r1_distill_qwen_7b_q4km", "reason"), ("qwen25_7b_instruct_q4km", "direct"),
                     ("qwen25_7b_instruct_q4km", "cot"), ("r1_distill_llama_8b_q4km", "reason"),
                     ("llama31_8b_q4km", "direct"), ("llama31_8b_q4km", "cot")}
    assert {(d, n) for _, _, d, n in cells} == {("mmlu", 1000), ("arc", 496), ("gpqa", 198)}
