"""Every interval a probe logs carries its n: each `*_ci_low` metric of every shipped probe has its `*_ci_n` (the
units it resamples) and `*_ci_few` (1.0 below stats.FEW), on a real run of the probe on the tiny Qwen3; and every
metric a shipped probe logs has a declared range (analysis/ranges.py) that holds its value."""

from __future__ import annotations

import os

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from conftest import REPO
from fairaudit.analysis import study
from fairaudit.analysis.ranges import declared_range
from fairaudit.analysis.stats import FEW
from fairaudit.backends.hf import HFBackend
from fairaudit.catalog import registry
from fairaudit.job.config import Place, read_job
from fairaudit.probes import AuditContext
from fairaudit.store.client import CachingClient
from fairaudit.store.results import Store
from fairaudit.tracking.content import finite_metrics, json_metrics

os.environ.setdefault("OMP_NUM_THREADS", "1")
TINY = ["model=tiny_qwen3", "model.max_think_tokens=8"]


def smallest_run(probe: str) -> list[str]:
    """The overrides of the smallest run of a probe that still computes every interval it logs: its config's
    `smallest_run`, which a new probe declares beside its settings."""
    run = registry.meta("probe", probe, "smallest_run")
    assert run is not None, f"{registry.config_file('probe', probe)} declares no smallest_run (docs/adding.md)"
    return list(run)


def probe_result(probe: str, data_root, store: Store):

    GlobalHydra.instance().clear()
    overrides = [f"probe={probe}", *TINY, *smallest_run(probe), f"data.root={data_root}"]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)   # ${hydra:runtime.cwd} resolves; the job's own config is the rest
    cfg = OmegaConf.masked_copy(cfg, [key for key in cfg if key != "hydra"])
    job = read_job(cfg, Place({"probe": probe, "backend": "hf"}, overrides, []))
    client = CachingClient(HFBackend(str(job.source.folder()), batch_size=4), store)
    return job.probe.run(AuditContext(client, client.tokenizer, job.spec, job.dataset, job.arm))


WITH_INTERVALS = {"counterfactual", "btm", "cdpg", "influence", "position"}  # the shipped probes that log intervals
DECLARING = WITH_INTERVALS  # the shipped probes, whose analysis modules declare RANGES


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Store:
    """One store for every probe's run: the paired probes share their generations."""
    return Store(tmp_path_factory.mktemp("intervals") / "store.sqlite")


@pytest.mark.slow
@pytest.mark.parametrize("probe", registry.names("probe"))
def test_every_interval_a_probe_logs_has_its_n_and_its_few_flag(probe, store, data_root):
    metrics = probe_result(probe, data_root, store).metrics
    logged, kept = finite_metrics(metrics), json_metrics(metrics)   # MLflow's metrics and metrics.json
    lows = [name for name in kept if "_ci_low" in name]
    assert bool(lows) or probe not in WITH_INTERVALS, f"{probe} logged no interval"
    for low in lows:
        n, few = low.replace("_ci_low", "_ci_n"), low.replace("_ci_low", "_ci_few")
        assert n in kept and few in kept, f"{probe}: {low} has no {n} / {few}"
        if low in logged:   # a NaN interval (over no unit: every pair cut, `_complete`) has a NaN n beside it
            assert n in logged and logged[few] == float(logged[n] < FEW), (probe, low)
    if probe in DECLARING:   # every metric declares its range (analysis/ranges.py), which holds its value
        undeclared = [name for name in kept if declared_range(name, study.declared()) is None]
        assert not undeclared, f"{probe}: no range declared for {undeclared} (a RANGES table beside their definition)"
        outside = {name: value for name, value in logged.items()
                   if not study.metric_range(name)[0] <= value <= study.metric_range(name)[1]}
        assert not outside, f"{probe}: values outside their declared ranges: {outside}"
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
