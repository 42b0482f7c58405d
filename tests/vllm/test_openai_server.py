"""backend=openai against real vLLM OpenAI servers on SmolLM2 (127.0.0.1 only; run by `make test-vllm`).

Two servers start once for the module; the replica test kills the second one, so it runs last.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("vllm", reason="the vLLM tests run in the .venv-vllm environment (make test-vllm)")

from mlflow.tracking import MlflowClient

from conftest import run_app
from fairaudit.backends import GenerationRequest
from fairaudit.backends.hf import HFBackend
from fairaudit.backends.openai import OpenAIBackend
from fairaudit.backends.vllm_server import free_port, start_server, stop_server, wait_ready
from fairaudit.models.locate import embedded_model_dir
from fairaudit.prompts.yesno import choice_token_ids
from fairaudit.store.client import CachingClient
from fairaudit.store.results import Store

P_YES_TOLERANCE = 2e-3  # fp32 CPU kernels of vLLM and transformers differ in summation order
P_YES_SAME_ENGINE = 1e-4  # the server and the offline engine run the same vLLM kernels
SMALL = "dataset.n=4"
VLLM_CPU = ("backend=vllm", "backend.enforce_eager=true", "backend.kv_cache_space_gib=1", "backend.max_model_len=2048")


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    """Two vLLM servers on SmolLM2: [(url, process, log path)]; stopped by pid at the end."""
    logs = tmp_path_factory.mktemp("vllm")
    ports = [free_port(), free_port()]
    model_dir = embedded_model_dir()
    started = [(port, start_server(model_dir, port, log=logs / f"{port}.log")) for port in ports]
    try:
        for port, process in started:
            wait_ready(process, port)
        yield [(f"http://127.0.0.1:{port}/v1", process, logs / f"{port}.log") for port, process in started]
    finally:
        for _, process in started:
            stop_server(process)


def records(tmp_path, order: list[str]) -> pd.DataFrame:
    """The records of the one run in tmp_path's MLflow store, sorted by `order`."""
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs(client.get_experiment_by_name("fairaudit").experiment_id)
    frame = pd.read_parquet(client.download_artifacts(run.info.run_id, "records/records.parquet", str(tmp_path)))
    return frame.sort_values(order).reset_index(drop=True)


def test_default_audit_matches_vllm_and_hf(tmp_path, replicas):
    """The default audit at 4 pairs (16 records: each arm and side; the default's 20 pairs took 7 minutes here and
    check the same thing)."""
    url = replicas[0][0]
    served = run_app(tmp_path / "openai", "backend=openai", f"backend.base_url={url}", "backend.max_concurrency=16",
                     SMALL)
    offline = run_app(tmp_path / "vllm", *VLLM_CPU, SMALL)
    local = run_app(tmp_path / "hf", "backend=hf", SMALL)
    for done in (served, offline, local):
        assert done.returncode == 0, done.stderr[-3000:]
    order = ["arm", "pair_id", "side"]
    ours = records(tmp_path / "openai", order)
    for name, bound in (("vllm", P_YES_SAME_ENGINE), ("hf", P_YES_TOLERANCE)):
        theirs = records(tmp_path / name, order)
        assert len(ours) == len(theirs) == 16
        assert (ours["prompt"] == theirs["prompt"]).all()
        same = ours["text"] == theirs["text"]
        gap = (ours["p_yes"] - theirs["p_yes"]).abs()
        print(f"\nopenai vs {name}: {same.sum()}/{len(same)} greedy generations token-identical, "
              f"max |P(Yes) difference| {gap.max():.2e}")
        assert same.all()  # measured: 16/16 against both (80/80 at the default's 20 pairs)
        assert gap.max() <= bound  # measured at 4 pairs: 0 against vllm, 1.4e-6 against hf


def test_choice_reads_equal_hf_on_the_same_prefixes(replicas):
    model_dir = embedded_model_dir()
    served = OpenAIBackend(model_dir, base_url=replicas[0][0])
    local = HFBackend(model_dir, batch_size=4)
    tok = local.tokenizer
    texts = ["Is the sky blue? Answer Yes or No.", "Is 7 even? Answer with one word."]
    prefixes = [tok.encode(tok.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                                   add_generation_prompt=True) + "The answer is",
                           add_special_tokens=False)
                for t in texts]
    choices = choice_token_ids(tok)
    np.testing.assert_allclose(served.choice_probs(prefixes, choices), local.choice_probs(prefixes, choices),
                               atol=P_YES_TOLERANCE)
    request = GenerationRequest(tuple(prefixes[0]), 24, temperature=0.8, top_p=0.9, seed=3)
    again = served.generate([request, request])
    assert again[0] == again[1]  # a seed fixes the sampled continuation


def test_chat_mode_runs_the_position_probe_end_to_end(tmp_path, replicas):
    done = run_app(tmp_path, "backend=openai", f"backend.base_url={replicas[0][0]}", "backend.mode=chat",
                   "probe=position", "dataset=mmlu", "arm=direct", "dataset.n=3")
    assert done.returncode == 0, done.stderr[-3000:]
    frame = records(tmp_path, ["question_id", "permutation"])
    assert len(frame) == 12 and frame["text"].str.len().gt(0).all()
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs(client.get_experiment_by_name("fairaudit").experiment_id)
    assert run.data.metrics["model_calls"] == 12 and "extraction_rate_direct" in run.data.metrics


def test_a_replica_killed_mid_run_loses_nothing_and_computes_nothing_twice(tmp_path, replicas):
    (url_a, _, _), (url_b, process_b, _) = replicas
    model_dir = embedded_model_dir()
    served = OpenAIBackend(model_dir, base_url=[url_a, url_b], max_concurrency=4, retry_backoff_s=0.2)
    backend = CachingClient(served, Store(tmp_path / "store.sqlite"), chunk_size=2)
    tok = backend.tokenizer
    requests = [GenerationRequest(tuple(tok.encode(tok.apply_chat_template(
        [{"role": "user", "content": f"Count from {i} to {i + 30}."}], tokenize=False, add_generation_prompt=True),
        add_special_tokens=False)), 40) for i in range(24)]
    killed_at = []

    def kill_b_once_it_has_answered() -> None:
        while served.replicas.answered[url_b] == 0:
            time.sleep(0.05)
        killed_at.append(backend.model_calls)  # results received so far (sqlite stays in the main thread)
        os.killpg(process_b.pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_b_once_it_has_answered, daemon=True)
    killer.start()
    out = backend.generate(requests)
    killer.join(timeout=60)
    assert killed_at and killed_at[0] < len(requests), "the replica was not killed mid-run"
    answered = served.replicas.answered
    print(f"\nanswered by the replica kept: {answered[url_a]}, by the one killed: {answered[url_b]}")
    assert answered[url_b] >= 1 and answered[url_a] + answered[url_b] == len(requests)  # none answered twice
    assert len(out) == 24 and all(c.token_ids for c in out)
    assert backend.model_calls == 24 and backend.store.count("generate") == 24
    rerun = CachingClient(OpenAIBackend(model_dir, base_url=url_a), Store(tmp_path / "store.sqlite"))
    assert rerun.generate(requests) == out and rerun.model_calls == 0
