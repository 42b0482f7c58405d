"""The one validation step: every typed value checked on the composed config, before any run or model."""

from __future__ import annotations

import socket
import sqlite3

import pytest
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import open_dict

from fairaudit.catalog import registry
from fairaudit.errors import AuditError, input_error_line
from fairaudit.job.checks import value_problems
from fairaudit.job.config import build_probe, check_settings
from test_configs import composed


def job_config(*overrides: str):
    """The config a job receives: composed, without the hydra node (which stays set for ${hydra:...})."""
    cfg = composed(*overrides)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


def problem(tmp_path, *overrides: str) -> str | None:
    """The one line of the settings checks (global values, the backend's, the probe's) for the config with
    the overrides (places under tmp_path), or None."""
    cfg = job_config(f"store.url={tmp_path}/store.sqlite", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", *overrides)
    try:
        check_settings(cfg)
    except AuditError as error:
        assert "\n" not in str(error)
        return str(error)
    return None


@pytest.mark.parametrize("overrides", [
    (), ("model=tiny_qwen3",), ("model=qwen3",), ("probe=cdpg",), ("probe=btm",),
    ("probe=position", "dataset=mmlu", "arm=reason"), ("dataset=compas", "dataset.seed=7", "probe.n_boot=100"),
    ("model.checkpoint=step100",), ("dataset=mmlu", "probe=position", "arm=direct", "dataset.n=null"),
])
def test_shipped_configs_pass(tmp_path, overrides):
    assert problem(tmp_path, *overrides) is None


@pytest.mark.parametrize("overrides, message", [
    (["dataset.n=1.5"], "dataset.n=1.5 must be an integer"),
    (["dataset.n=abc"], "dataset.n='abc' must be an integer"),
    (["dataset.n=null"], "dataset.n=None must be an integer"),
    (["dataset.n=true"], "dataset.n=True must be an integer"),
    (["dataset.seed=-1"], "dataset.seed=-1 must be an integer in 0..4294967295"),
    (["model.batch_size=0"], "model.batch_size=0 must be an integer >= 1"),
    (["model.max_think_tokens=-1"],
     "model.max_think_tokens=-1 must be an integer in 1..8191 (below model.max_context)"),
    (["model.max_think_tokens=1e8"], "model.max_think_tokens=100000000.0 must be an integer in 1..8191"),
    (["model.max_think_tokens=100000000"], "model.max_think_tokens=100000000 must be an integer in 1..8191"),
    (["model=tiny_qwen3", "model.max_think_tokens=4096"], "must be an integer in 1..4095 (below model.max_context)"),
    (["arm.max_new_tokens=0"], "arm.max_new_tokens=0 must be an integer in 1..8191"),
    (["probe.n_boot=0"], "probe.n_boot=0 must be an integer in 100..100000"),
    (["probe=cdpg", "probe.K=0"], "probe.K=0 must be an integer in 1..100"),
    (["probe=cdpg", "probe.k_list=[5,0]"], "probe.k_list=[5, 0] items must be an integer in 1..100"),
    (["probe=position", "dataset=mmlu", "arm=direct", "probe.truncation.top_p=0"],
     "probe.truncation.top_p=0 must be a number in (0, 1]"),
    (["model.answer_source=guess"], "model.answer_source='guess' must be one of ['parsed', 'forced']"),
    (["model.thinking.style=loud"], "model.thinking.style='loud' must be one of"),
    (["model.p_yes=both"], "model.p_yes='both' must be one of ['single', 'pooled']"),
    (["probe.baseline_arm.think=maybe"], "probe.baseline_arm.think='maybe' must be true or false"),
    (["probe.baseline_arm.max_new_tokens=0"], "probe.baseline_arm.max_new_tokens=0 must be an integer in 1..8191"),
    (["model.dtype=int8"], "model.dtype='int8' is not supported by the hf backend"),
    (["backend.device=tpu"], "backend.device='tpu' must be one of auto, cpu, cuda, cuda:N, mps"),
    (["tracking.experiment="], "tracking.experiment='' must be a non-empty string"),
    (["tracking.experiment=' '"], "tracking.experiment=' ' must be a non-empty string"),
    (["dataset.user_template='{who} {question}'"], "dataset.user_template="),
    (["tracking.uri=foo://bar"], "tracking.uri='foo://bar': unsupported scheme 'foo'"),
    (["store.url=/proc/x/s.sqlite"], "store.url: cannot write /proc/x/s.sqlite"),
    (["tracking.uri=sqlite:////proc/x/mlflow.db"], "tracking.uri: cannot write /proc/x/mlflow.db"),
])
def test_bad_value_is_one_line_naming_it(tmp_path, overrides, message):
    found = problem(tmp_path, *overrides)
    assert found is not None and message in found, found


def test_every_problem_is_reported_in_the_same_line(tmp_path):
    found = problem(tmp_path, "dataset.n=1.5", "model.batch_size=0")
    assert "dataset.n=1.5" in found and "model.batch_size=0" in found


def test_cuda_is_refused_where_there_is_none(tmp_path):
    import torch

    if torch.cuda.is_available():
        assert problem(tmp_path, f"backend.device=cuda:{torch.cuda.device_count()}") is not None
    else:
        assert ("backend.device='cuda' is not available: this machine has 0 CUDA device(s)"
                in problem(tmp_path, "backend.device=cuda"))


def test_damaged_store_and_tracking_files_are_refused(tmp_path):
    (tmp_path / "store.sqlite").write_bytes(b"not a database, " * 512)
    assert "store.url: " in problem(tmp_path) and "is not a readable sqlite database" in problem(tmp_path)
    (tmp_path / "store.sqlite").unlink()
    sqlite3.connect(tmp_path / "store.sqlite").execute("CREATE TABLE t (x)").connection.commit()
    (tmp_path / "mlflow.db").write_bytes(b"\x00garbage" * 1000)
    assert problem(tmp_path).startswith("tracking.uri: ")


def test_unreachable_tracking_server_is_refused_in_seconds(tmp_path):
    with socket.socket() as sock:  # a free port: nothing listens there once the socket closes
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    found = problem(tmp_path, f"tracking.uri=http://127.0.0.1:{port}")
    assert found.startswith(f"tracking.uri='http://127.0.0.1:{port}': no tracking server answers at 127.0.0.1:{port}")


def test_reachable_tracking_server_passes(tmp_path):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert problem(tmp_path, f"tracking.uri=http://127.0.0.1:{server.getsockname()[1]}") is None


def test_hydra_instantiation_wrapper_is_unwrapped_to_one_line(tmp_path):
    cfg = composed("probe=cdpg", "probe.K=0")
    with pytest.raises(InstantiationException) as wrapped:
        instantiate({k: v for k, v in cfg.probe.items() if k not in registry.META["probe"]}, _convert_="all")
    assert input_error_line(wrapped.value) == "probe.K=0 must be an integer in 1..100"
    with pytest.raises(AuditError, match="^probe.K=0 must be an integer in 1..100$"):
        build_probe(cfg.probe)  # the app's own build surfaces the probe's AuditError as itself
    cfg = composed("+probe.unknown=1")
    with pytest.raises(InstantiationException) as refused:
        build_probe(cfg.probe)
    line = input_error_line(refused.value)
    assert line.startswith("TypeError: ") and "unknown" in line and "\n" not in line
    assert input_error_line(RuntimeError("a bug")) is None


@pytest.mark.parametrize("model", registry.names("model"))
def test_every_shipped_model_config_passes_the_value_rules(model):
    """A budget at or past a model's context, say, would stop every run of that config at validation."""
    assert value_problems(job_config(f"model={model}")) == []
