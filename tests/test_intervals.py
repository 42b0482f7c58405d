"""Every interval a probe logs carries its n: each `*_ci_low` metric of every shipped probe has its `*_ci_n` (the
units it resamples) and `*_ci_few` (1.0 below stats.FEW), on a real run of the probe on the tiny Qwen3."""

from __future__ import annotations

import os

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from conftest import REPO
from fairaudit.app import model_dir_for, prepare
from fairaudit.backends.hf import HFBackend
from fairaudit.client import CachingClient
from fairaudit.probes import AuditContext
from fairaudit.registry import names
from fairaudit.stats import FEW
from fairaudit.store import Store
from fairaudit.tracking import finite_metrics, json_metrics

os.environ.setdefault("OMP_NUM_THREADS", "1")
TINY = ["model=tiny_qwen3", "model.max_think_tokens=8"]
RUNS = {  # the smallest run of each probe that still computes every interval it logs
    "counterfactual": ["dataset.n=3"],
    "btm": ["dataset.n=3"],
    "cdpg": ["dataset.n=3", "probe.K=2", "probe.k_list=[2]", "probe.n_boot=100"],
    "position": ["dataset=mmlu", "arm=cot", "dataset.n=2", "arm.max_new_tokens=8"],
    "influence": ["dataset=mmlu", "dataset.n=2", "probe.max_block_tokens=4"],
}


def probe_result(probe: str, data_root, store: Store):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose("config", overrides=[f"probe={probe}", *TINY, *RUNS[probe], f"data.root={data_root}"],
                      return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)   # the choices prepare reads; the job's own config is the rest
    cfg = OmegaConf.masked_copy(cfg, [key for key in cfg if key != "hydra"])
    job = prepare(cfg)
    client = CachingClient(HFBackend(str(model_dir_for(cfg)), batch_size=4), store)
    return job.probe.run(AuditContext(client, client.tokenizer, job.spec, job.dataset, job.arm))


@pytest.mark.slow
def test_every_interval_every_probe_logs_has_its_n_and_its_few_flag(tmp_path, data_root):
    assert set(RUNS) == set(names("probe")), "a new probe needs its smallest run here"
    store = Store(tmp_path / "store.sqlite")  # the paired probes share their generations
    with_intervals = []
    for probe in RUNS:
        metrics = probe_result(probe, data_root, store).metrics
        logged, kept = finite_metrics(metrics), json_metrics(metrics)   # MLflow's metrics and metrics.json
        lows = [name for name in kept if "_ci_low" in name]
        with_intervals += [probe] if lows else []
        for low in lows:
            n, few = low.replace("_ci_low", "_ci_n"), low.replace("_ci_low", "_ci_few")
            assert n in kept and few in kept, f"{probe}: {low} has no {n} / {few}"
            if low in logged:   # a NaN interval (over no unit: every pair cut, `_complete`) has a NaN n beside it
                assert n in logged and logged[few] == float(logged[n] < FEW), (probe, low)
        if probe in ("counterfactual", "btm", "cdpg"):
            assert logged["p_gap_think_ci_n"] == logged["delta_p_gap_ci_n"] == metrics["n_pairs_scored"] == 3
        if probe == "counterfactual":
            assert logged["delta_d_cf_ci_n"] == metrics["n_pairs"]
            assert logged["c_b_ratio_ci_n"] == logged["c_b_ratio_exact_ci_n"] == metrics["cell_b"] + metrics["cell_c"]
        if probe == "cdpg":
            assert all(logged[f"cdpg_slope_{c}_ci_n"] == logged[f"cdpg_slope_{c}_from0_ci_n"] == metrics[f"cdpg_n_{c}"]
                       for c in "abcd")
        if probe == "influence":
            assert all(logged[f"influence_rate_{d}_{g}_ci_n"] == metrics[f"n_contrasts_{d}_{g}"]
                       for d in ("a_to_b", "b_to_a") for g in ("masked", "unmasked")
                       if f"n_contrasts_{d}_{g}" in metrics)
    assert set(with_intervals) == {"counterfactual", "btm", "cdpg", "influence"}   # position logs no interval
