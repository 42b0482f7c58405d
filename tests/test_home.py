"""One store and one tracking database per user ($FAIRAUDIT_HOME, else the user cache): the same audit started from
another folder reuses every result; `home=.` keeps them in the working folder."""

from __future__ import annotations

import shutil

import pytest

from conftest import model_results, run_app
from fairaudit import home

TINY = ["model=tiny_qwen3", "dataset.n=2", "model.max_think_tokens=4"]


def test_home_is_fairaudit_home_else_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("FAIRAUDIT_HOME", str(tmp_path / "h"))
    assert home() == tmp_path / "h"
    monkeypatch.delenv("FAIRAUDIT_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert home() == tmp_path / ".cache" / "fairaudit"


@pytest.fixture(scope="module")
def first_audit(tmp_path_factory):
    """The audit started from folder `a`, its store and tracking database in the home `home` beside it."""
    root = tmp_path_factory.mktemp("homes")
    (root / "a").mkdir()
    result = run_app(root / "a", *TINY, in_tmp=True, env={"FAIRAUDIT_HOME": str(root / "home")})
    assert result.returncode == 0, result.stderr[-3000:]
    return root


@pytest.mark.slow
def test_the_default_audit_from_two_folders_makes_its_model_calls_once(first_audit):
    from mlflow.tracking import MlflowClient

    (first_audit / "b").mkdir()
    result = run_app(first_audit / "b", *TINY, in_tmp=True, env={"FAIRAUDIT_HOME": str(first_audit / "home")})
    assert result.returncode == 0, result.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{first_audit / 'home' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("fairaudit").experiment_id],
                              order_by=["attributes.start_time ASC"])
    assert [run.data.metrics["model_calls"] for run in runs] == [2 * 2 * 2 * 2, 0]  # pairs x sides x arms x calls
    assert model_results(first_audit / "home" / "store.sqlite") == 2 * 2 * 2 * 2
    assert f"--backend-store-uri sqlite:///{first_audit / 'home' / 'mlflow.db'}" in result.stderr
    for folder in ("a", "b"):  # nothing of the store or tracking in the folders the runs started from
        assert not ({"store.sqlite", "mlflow.db", "mlartifacts", ".fairaudit"}
                    & {p.name for p in (first_audit / folder).iterdir()})
    assert runs[1].data.params["home"] == str(first_audit / "home")  # the run says where its results are


@pytest.mark.slow
def test_home_dot_keeps_the_store_and_the_database_in_the_working_folder(first_audit, tmp_path):
    from mlflow.tracking import MlflowClient

    shutil.copy(first_audit / "home" / "store.sqlite", tmp_path)  # the model's results: this is about places
    result = run_app(tmp_path, *TINY, "home=.", in_tmp=True, env={"FAIRAUDIT_HOME": str(tmp_path / "unused")})
    assert result.returncode == 0, result.stderr[-3000:]
    assert {"store.sqlite", "mlflow.db", "mlartifacts"} <= {p.name for p in tmp_path.iterdir()}
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("fairaudit").experiment_id])
    assert run.data.metrics["model_calls"] == 0  # it read the store in the working folder
    assert not (tmp_path / "unused").exists()
