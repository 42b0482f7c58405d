"""Models are checked like data before anything opens: each model of a run or sweep is found here (a local path, the
hub cache) or on the hub by a metadata query, never downloaded; one that cannot be had is one line per model saying
what to run, with its size and whether it needs a GPU, and no MLflow run, output folder or cache entry is made."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from conftest import run_app
from fairaudit.catalog.registry import settings
from fairaudit.job.config import ModelSource
from fairaudit.models.files import PROMPT_FILES, ModelFiles, ModelMissing
from fairaudit.models.locate import hub_snapshot

COMMIT = "0123456789abcdef0123456789abcdef01234567"
QWEN3 = settings("model", "qwen3")


def cached_repo(hub: Path, repo: str, files: dict[str, str]) -> Path:
    """A repository in a hub cache as snapshot_download leaves it (refs/main naming the snapshot's commit)."""
    folder = hub / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(COMMIT)
    snapshot = folder / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    for name, text in files.items():
        (snapshot / name).write_text(text)
    return snapshot


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty hub cache under tmp_path, offline (huggingface_hub reads its constants when imported)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return tmp_path / "hub"


def test_a_model_whole_in_the_hub_cache_passes_and_one_without_its_weights_is_one_line(hub_cache):
    index = json.dumps({"weight_map": {"a": "model-1.safetensors", "b": "model-2.safetensors"}})
    snapshot = cached_repo(hub_cache, "org/whole", {"config.json": "{}", "tokenizer.json": "{}",
                                                    "model.safetensors.index.json": index,
                                                    "model-1.safetensors": "", "model-2.safetensors": ""})
    assert hub_snapshot(ModelFiles("org/whole"), weights=True, fetch=False) is None
    (snapshot / "model-2.safetensors").unlink()  # a shard short, as an interrupted download leaves it
    with pytest.raises(ModelMissing, match="'org/whole': the hub cache holds only part of it"):
        hub_snapshot(ModelFiles("org/whole"), weights=True, fetch=False)
    cached_repo(hub_cache, "org/prompts", {"config.json": "{}", "tokenizer_config.json": "{}"})  # a dry run's fetch
    assert hub_snapshot(ModelFiles("org/prompts"), weights=False, fetch=False) is None
    with pytest.raises(ModelMissing) as missing:
        hub_snapshot(ModelFiles("org/prompts"), weights=True, fetch=False)
    assert "HF_HUB_OFFLINE=1 forbids downloading the rest" in str(missing.value)


def test_a_missing_model_is_one_line_with_its_size_gpu_and_the_command_that_downloads_it(hub_cache):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from conftest import REPO

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose("config", overrides=["model=qwen3", "model.checkpoint=step5"])
    line = ModelSource.composed(cfg).problem()
    assert line == (f"cannot get 'Qwen/Qwen3-32B' at revision step5 (model qwen3: about {QWEN3['weights_gb']} GB, "
                    f"needs a GPU): it is not in the hub cache {hub_cache} and HF_HUB_OFFLINE=1 forbids downloading "
                    "it; download it with `hf download Qwen/Qwen3-32B --revision step5` where the hub is reachable, "
                    "or set model.path to a local copy")
    dry = ModelSource.composed(cfg).problem(weights=False)  # a dry run needs the prompt files alone, and says which
    assert dry.startswith("cannot get the tokenizer and chat template of 'Qwen/Qwen3-32B' at revision step5 "
                          "(model qwen3): ")
    assert dry.endswith(f"--include {' '.join(repr(p) for p in PROMPT_FILES)}` where the hub is reachable, or set "
                        "model.path to a local copy")
    assert not list(hub_cache.parent.glob("hub/models--*"))  # nothing fetched


def test_online_an_unreachable_hub_is_one_line_within_seconds(hub_cache, monkeypatch):
    """Online (HF_HUB_OFFLINE unset), the metadata query to a hub that refuses connections fails at once."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    start = time.monotonic()
    with pytest.raises(ModelMissing, match="'org/absent': the hub did not give it"):
        hub_snapshot(ModelFiles("org/absent"), weights=True, fetch=False)
    assert time.monotonic() - start < 15 and not hub_cache.exists()


OFFLINE = {"HF_HUB_OFFLINE": "1"}


@pytest.mark.parametrize("dry", [False, True], ids=["sweep", "dry-run sweep"])
def test_offline_a_sweep_of_a_model_absent_from_the_hub_cache_is_one_line_and_no_run(tmp_path, dry):
    env = {**OFFLINE, "HF_HOME": str(tmp_path / "hf")}
    start = time.monotonic()
    result = run_app(tmp_path, "model=qwen3", *(["dry_run=true"] if dry else []), "-m", "dataset=adult,compas",
                     env=env, timeout=120)
    elapsed = time.monotonic() - start
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and elapsed < 30, (elapsed, result.stderr[-2000:])
    assert len(lines) <= 3 and lines[0].startswith("error: cannot get "), lines
    assert "(model qwen3" in lines[0] and "hf download Qwen/Qwen3-32B" in lines[0] and "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []  # no MLflow database (so no run), store, sweep folder or hub cache
