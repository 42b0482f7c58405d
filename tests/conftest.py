"""Shared fixtures: the data root, configs composed with Hydra, subprocess runs of the app."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import warm
from fairaudit.catalog.registry import names, target

REPO = Path(__file__).resolve().parents[1]
DATA_ROOT = Path(os.environ.get("FAIRAUDIT_DATA", REPO.parent / "shared" / "data")).resolve()
# A test parameter on the embedded SmolLM2: its forward passes run in `make test`, not in `make test-fast`, whose
# model tests run on the tiny Qwen3 alone.
SMOLLM2 = pytest.param("smollm2", marks=pytest.mark.slow)
pytest_plugins = ["time_budget", "process_marks"]  # --file-budget and the slowest files; the `process` mark
# The backends that run on an optional engine (`Backend.requires`), each with its own folder tests/<backend>/; found
# by those folders, so that collection imports no other backend (the hf backend imports torch).
# tests/test_backend_contract.py checks that these are every backend with `requires`.
ENGINE_BACKENDS = {folder.name: target("backend", folder.name) for folder in sorted(REPO.joinpath("tests").iterdir())
                   if folder.is_dir() and folder.name in names("backend")}


def probe_metric_names(names) -> set[str]:
    """A run's metric names less hf's own engine figures (its padding shares), which another backend does not log."""
    return {name for name in names if not name.startswith("padding_share_")}

# tests/<backend>/ holds the tests of a backend that runs on an optional engine (`Backend.requires`), run in that
# engine's own venv (`make test-<backend>`); where the engine is absent the folder is not collected.
collect_ignore = [name for name, cls in ENGINE_BACKENDS.items() if not cls.available()]

# The store and tracking database a run finds by default ($FAIRAUDIT_HOME, else the user's cache): never the real
# user's in a test. A run that relies on the defaults puts them under its own folder (`run_app(in_tmp=True)`).
HOME = tempfile.mkdtemp(prefix="fairaudit-test-home-")
os.environ["FAIRAUDIT_HOME"] = HOME


def pytest_sessionfinish(session, exitstatus):
    warm.stop()  # this worker's warm interpreter for `python -m fairaudit` runs (tests/warm.py)
    shutil.rmtree(HOME, ignore_errors=True)


def pytest_configure(config):
    """A mark per engine backend (its tests here and its conformance entry), so `-m <backend>` selects them."""
    for name, cls in ENGINE_BACKENDS.items():
        config.addinivalue_line("markers", f"{name}: needs {cls.requires.label} (skipped or not collected without it)")


def count(path: Path, sql: str) -> int:
    """The number a COUNT query reads from a sqlite database, opened read-only; 0 while it is absent or locked."""
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1) as db:
            return db.execute(sql).fetchone()[0]
    except sqlite3.Error:
        return 0


def model_results(store: Path) -> int:
    """Model results in a sqlite store (its cached tokenizations left out); 0 while it is absent or locked."""
    return count(store, "SELECT COUNT(*) FROM results WHERE kind != 'encode'")


def integrity(path: Path) -> str:
    """sqlite's PRAGMA integrity_check of a database: "ok" when it is whole."""
    with sqlite3.connect(path) as db:
        return db.execute("PRAGMA integrity_check").fetchone()[0]


@pytest.fixture(scope="session")
def pg_server():
    """The cluster suite's one PostgreSQL server on loopback (`make test-cluster`), shared by its modules: every TCP
    login needs a password (`url` carries the superuser's)."""
    from servers import PostgresServer

    server = PostgresServer(auth="scram-sha-256")
    yield server
    server.stop()


def smoke_slice() -> tuple[list[str], int]:
    """The smoke study as the cluster suite sweeps it through each launcher, and its number of jobs: on the tiny
    Qwen3, the study's first probe on each of its data sets (a launcher runs every job the same way, so the study's
    other probes would prove nothing more)."""
    import yaml

    swept = yaml.safe_load((REPO / "experiments" / "thinking_fairness_smoke.yaml").read_text())["hydra"]["sweeper"]
    probe, datasets = swept["params"]["probe"].split(",")[0], swept["params"]["dataset"].split(",")
    return ["+experiment=thinking_fairness_smoke", "hydra.sweeper.params.model=tiny_qwen3",
            f"hydra.sweeper.params.probe={probe}"], len(datasets)


SMOKE, SMOKE_JOBS = smoke_slice()


@pytest.fixture(scope="session")
def local_smoke(tmp_path_factory) -> Path:
    """The cluster suite's reference: `SMOKE` swept locally, with its own store and tracking database in the folder
    returned, so a sweep elsewhere (SLURM, Ray) is compared with it."""
    folder = tmp_path_factory.mktemp("local-smoke")
    local = run_app(folder, *SMOKE, "-m", in_tmp=True, timeout=1800)
    assert local.returncode == 0, local.stderr[-3000:]
    return folder


@pytest.fixture(scope="session")
def data_root() -> Path:
    if not (DATA_ROOT / "adult" / "adult.data").exists():
        pytest.fail(f"test data not found under {DATA_ROOT}; set FAIRAUDIT_DATA")
    return DATA_ROOT


@pytest.fixture(scope="module")
def default_audit(data_root):
    """(model spec, dataset, [arm, baseline arm]) of the default audit (smollm2, adult, counterfactual: think vs
    nothink, dataset.n=20), for the backends' agreement tests."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from fairaudit.job.config import model_spec
    from fairaudit.prompts.yesno import Arm

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose("config", overrides=["dataset.n=20", f"data.root={data_root}"])
    arm = Arm(**OmegaConf.to_container(cfg.arm, resolve=True))
    baseline = Arm(**OmegaConf.to_container(cfg.probe.baseline_arm, resolve=True))
    return model_spec(cfg.model), instantiate(cfg.dataset), [arm, baseline]


def cache_without_schema(tmp_path: Path) -> dict[str, str]:
    """The environment of a user cache holding no empty tracking database yet (its models linked from the real
    cache), so that a first start builds MLflow's schema: for the tests that start or kill one then."""
    from fairaudit.models.locate import tiny_qwen3_dir
    from fairaudit.places import cache_root

    tiny_qwen3_dir()
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "models").symlink_to(cache_root() / "models")
    return {"FAIRAUDIT_CACHE": str(cache)}


def model_copy(source: Path, folder: Path, broken: str | None = None) -> Path:
    """`folder`: a copy of the model folder `source` (its weights linked), the file named `broken` cut to half."""
    folder.mkdir()
    for item in source.iterdir():
        if item.name == broken:
            (folder / item.name).write_bytes(item.read_bytes()[:item.stat().st_size // 2])
        elif item.suffix == ".safetensors":
            (folder / item.name).symlink_to(item)
        else:
            shutil.copy(item, folder / item.name)
    return folder


def cut_short_model(folder: Path) -> Path:
    """A copy of the tiny Qwen3 whose weights file is cut short (as an interrupted download leaves it): every
    check before a sweep opens passes, and loading it fails in the job."""
    from fairaudit.models.locate import tiny_qwen3_dir

    return model_copy(tiny_qwen3_dir(), folder / "cut-short-model", "model.safetensors")


def building_tracking_db(folder: Path) -> bool:
    """A tracking database in `folder`, or the user cache's empty one (cache_without_schema), is being built."""
    return bool(list(folder.glob(".mlflow.db.building-*")) or list(folder.glob("cache/mlflow-schemas/.*.building-*")))


def benchmark(name: str):
    """benchmarks/<name>.py imported as a module (the benchmarks are scripts, not a package), for its tiny run."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_app(tmp_path: Path, *overrides: str, module: str = "fairaudit", timeout: int = 600,
            env: dict[str, str] | None = None, in_tmp: bool = False) -> subprocess.CompletedProcess:
    """`python -m fairaudit` in a subprocess with its store, MLflow db and Hydra output under tmp_path.

    in_tmp: start it from tmp_path with the default store, tracking URI and output folders, FAIRAUDIT_HOME (where
    the store and the tracking database go by default) being tmp_path unless `env` names another.
    """
    home = {"FAIRAUDIT_HOME": str(tmp_path)} if in_tmp else {}
    env = {**os.environ, "FAIRAUDIT_DATA": str(DATA_ROOT), "PYTHONUNBUFFERED": "1", **home, **(env or {})}
    places = [] if in_tmp else [
        f"store.url={tmp_path}/store.sqlite",
        f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
        f"hydra.run.dir={tmp_path}/outputs",
        f"hydra.sweep.dir={tmp_path}/multirun",
    ]
    args = [sys.executable, "-m", module, *places, *overrides]
    return warm.run_python(args, cwd=tmp_path if in_tmp else REPO, env=env, timeout=timeout)
