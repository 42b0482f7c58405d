"""backend=openai against loopback HTTP servers written here: retries, timeouts, fault reports, replicas, the key.

The servers speak the OpenAI wire format the way vLLM does (token-id prompts, `return_token_ids`,
`logprob_token_ids` answered as "token_id:N" keys); answers are scripted per request.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import huggingface_hub
import numpy as np
import pytest
from huggingface_hub.utils import filter_repo_objects

from conftest import run_app
from fairaudit.backends import Capabilities, DepthRequest, GenerationRequest
from fairaudit.backends.openai import OpenAIBackend
from fairaudit.catalog.registry import backend_classes, probe_classes
from fairaudit.errors import AuditError
from fairaudit.models.files import PROMPT_FILES
from fairaudit.models.locate import model_fingerprint, resolve_model_dir, tiny_qwen3_dir
from fairaudit.store.client import CachingClient
from fairaudit.store.results import Store
from model_server import LoopbackServer

pytestmark = pytest.mark.slow  # loopback servers that hang, fail and retry for real: `make test`, not `make test-fast`

KEY = "sk-test-5ecret-never-logged"
HANG = "hang"
MALFORMED = "malformed"


class FakeServer(LoopbackServer):
    """An OpenAI-compatible server on 127.0.0.1 serving model "fake".

    script: what the next POSTs get, in turn (an HTTP status, HANG or MALFORMED); once it is
    used up every POST gets a valid answer, except prompts whose first token is in `failing`
    (HTTP 503 forever). Generations return the prompt's last three tokens then EOS; choice
    reads give token t the log-probability -t/1000.
    """

    def __init__(self, eos: int, script=(), failing=(), hang_s: float = 3.0):
        self.eos, self.script, self.failing, self.hang_s = eos, list(script), set(failing), hang_s
        self.posts: list[dict] = []
        self.auth: set[str] = set()
        super().__init__(self._handler())

    def answer(self, body: dict):
        with self.lock:
            self.posts.append(body)
            step = self.script.pop(0) if self.script else None
        if step is not None:
            return step
        prompt = body.get("prompt") or [1]
        if prompt[0] in self.failing:
            return 503
        if "logprob_token_ids" in body:
            top = {f"token_id:{t}": -t / 1000 for t in body["logprob_token_ids"]}
            return {"choices": [{"text": "", "finish_reason": "length", "logprobs": {"top_logprobs": [top]}}]}
        if "messages" in body:
            return {"choices": [{"message": {"content": "The answer is (B).", "reasoning_content": "hmm"},
                                 "finish_reason": "stop"}]}
        ids = list(prompt[-3:])[: body["max_tokens"]]
        finish = "length" if len(ids) == body["max_tokens"] else "stop"
        return {"choices": [{"text": "", "token_ids": ids + ([self.eos] if finish == "stop" else []),
                             "finish_reason": finish}]}

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status: int, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self):
                server.auth.add(self.headers.get("Authorization", ""))
                self._send(200, json.dumps({"data": [{"id": "fake"}]}).encode())

            def do_POST(self):
                server.auth.add(self.headers.get("Authorization", ""))
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                step = server.answer(body)
                if step == HANG:
                    time.sleep(server.hang_s)
                    return
                if step == MALFORMED:
                    return self._send(200, b'{"choices": [{"tex')
                if isinstance(step, int):
                    return self._send(step, b'{"error": "scripted"}')
                self._send(200, json.dumps(step).encode())

        return Handler


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return tiny_qwen3_dir()


@pytest.fixture(scope="module")
def eos(model_dir) -> int:
    from fairaudit.backends.common import folder_tokenizer

    return folder_tokenizer(str(model_dir)).eos_token_id


@pytest.fixture
def servers(eos):
    started: list[FakeServer] = []

    def start(**kwargs) -> FakeServer:
        started.append(FakeServer(eos, **kwargs))
        return started[-1]

    yield start
    for server in started:
        server.stop()


def backend(model_dir, *urls, **kwargs) -> OpenAIBackend:
    settings = dict(max_concurrency=4, timeout_s=1.0, max_retries=4, retry_backoff_s=0.01) | kwargs
    return OpenAIBackend(model_dir, base_url=list(urls), model="fake", **settings)


def requests(n: int, budget: int = 8) -> list[GenerationRequest]:
    return [GenerationRequest((100 + i, 7, 8, 9), budget) for i in range(n)]


def test_retries_429_500_and_a_hang_then_reports_a_malformed_body(model_dir, servers):
    server = servers(script=[429, 500, HANG, MALFORMED])
    with pytest.raises(AuditError) as failure:
        backend(model_dir, server.url).generate(requests(1))
    message = str(failure.value)
    assert len(server.posts) == 4 and "\n" not in message
    assert message.startswith(f"server {server.url} sent a malformed body to POST /completions")


def test_a_request_that_keeps_failing_names_the_server_and_the_last_status(model_dir, servers):
    server = servers(script=[HANG, 503, 503])
    with pytest.raises(AuditError, match=rf"^server {server.url} answered HTTP 503 to POST /completions "
                                         r"\(gave up after 2 retries\)$"):
        backend(model_dir, server.url, max_retries=2).generate(requests(1))
    assert len(server.posts) == 3


def test_a_hang_on_every_try_is_reported_as_a_timeout(model_dir, servers):
    server = servers(script=[HANG, HANG], hang_s=2.0)
    with pytest.raises(AuditError, match=rf"^server {server.url} gave no answer to POST /completions within 0.5 s"):
        backend(model_dir, server.url, max_retries=1, timeout_s=0.5).generate(requests(1))


def test_client_errors_are_not_retried(model_dir, servers):
    server = servers(script=[401])
    with pytest.raises(AuditError, match=r"answered HTTP 401 to POST /completions"):
        backend(model_dir, server.url).generate(requests(1))
    assert len(server.posts) == 1


def test_generations_after_retries_are_reported_as_hf_reports_them(model_dir, servers):
    server = servers(script=[429, 502])
    out = backend(model_dir, server.url).generate(requests(2) + [GenerationRequest((5, 6, 7, 8), 2)])
    assert [c.token_ids for c in out] == [(7, 8, 9), (7, 8, 9), (6, 7)]  # EOS removed
    assert [c.finish_reason for c in out] == ["stop", "stop", "length"]
    client = backend(model_dir, server.url)
    assert out[0].text == client.tokenizer.decode([7, 8, 9], skip_special_tokens=False)
    greedy = next(body for body in server.posts if body["prompt"] == [100, 7, 8, 9])
    assert greedy["temperature"] == 0.0 and "seed" not in greedy and greedy["return_token_ids"] is True
    sampled = [GenerationRequest((1, 2), 4, temperature=0.7, top_p=0.9, seed=11)]
    client.generate(sampled)
    assert {k: server.posts[-1][k] for k in ("temperature", "top_p", "seed")} == {"temperature": 0.7, "top_p": 0.9,
                                                                                  "seed": 11}


def test_choice_and_depth_reads_pool_log_probabilities_as_hf_pools_logits(model_dir, servers):
    server = servers()
    client = backend(model_dir, server.url)
    choices = [[10, 20], [30]]
    yes = np.logaddexp(-0.010, -0.020)
    expected = np.exp(yes) / (np.exp(yes) + np.exp(-0.030))
    probs = client.choice_probs([(1, 2, 3), (4,)], choices)
    np.testing.assert_allclose(probs[:, 0], [expected, expected], rtol=1e-12)
    assert server.posts[0]["logprob_token_ids"] == [10, 20, 30] and server.posts[0]["max_tokens"] == 1
    depth = client.depth_choice_probs([DepthRequest((1, 2), (3, 4, 5), (6,), cuts=(0, 2, 3))], choices)
    assert depth[0].shape == (3, 2)
    assert sorted(p["prompt"] for p in server.posts[2:]) == [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 6], [1, 2, 6]]


def test_results_received_before_a_failure_are_committed_and_a_rerun_resumes(model_dir, servers, tmp_path):
    server = servers(failing={105})
    store = Store(tmp_path / "store.sqlite")
    cached = CachingClient(backend(model_dir, server.url, max_retries=3, retry_backoff_s=0.2), store, chunk_size=4)
    with pytest.raises(AuditError, match=rf"^server {server.url} answered HTTP 503"):
        cached.generate(requests(8))
    assert store.count("generate") == 7 and cached.model_calls == 7
    server.failing.clear()
    posts_before = len(server.posts)
    resumed = CachingClient(backend(model_dir, server.url), Store(tmp_path / "store.sqlite"), chunk_size=4)
    out = resumed.generate(requests(8))
    assert resumed.model_calls == 1 and len(server.posts) == posts_before + 1 and len(out) == 8
    assert server.posts[-1]["prompt"][0] == 105 and store.count("generate") == 8


def test_requests_spread_over_replicas_and_a_dead_one_is_routed_around(model_dir, servers):
    first, second = servers(), servers()
    client = backend(model_dir, first.url, second.url, max_concurrency=2)
    client.generate(requests(8))
    assert len(first.posts) == 4 and len(second.posts) == 4
    second.stop()
    out = client.generate(requests(6, budget=2))
    assert len(out) == 6 and len(first.posts) == 10
    assert client.replicas.sent[second.url] >= 1  # tried, failed over, then skipped


def test_server_reports_at_start(model_dir, servers):
    server = servers()
    with pytest.raises(AuditError, match=r"does not serve model 'other'; set backend.model to one of \['fake'\]"):
        OpenAIBackend(model_dir, base_url=server.url, model="other")
    assert OpenAIBackend(model_dir, base_url=server.url).model == "fake"  # the only served model
    server.stop()
    with pytest.raises(AuditError, match=rf"^server {server.url} is unreachable"):
        OpenAIBackend(model_dir, base_url=server.url, model="fake")


def test_chat_mode_sends_messages_and_wraps_reasoning_as_the_trace(model_dir, servers):
    server = servers()
    client = OpenAIBackend(model_dir, base_url=server.url, mode="chat", retry_backoff_s=0.01)
    tok = client.tokenizer
    plain = tok.apply_chat_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q?"}],
                                    tokenize=False, add_generation_prompt=True)
    prefilled = tok.apply_chat_template([{"role": "user", "content": "Q2?"}], tokenize=False,
                                        add_generation_prompt=True) + "<think>\n\n</think>\n\nThe"
    out = client.generate([GenerationRequest(tuple(tok.encode(p, add_special_tokens=False)), 16)
                           for p in (plain, prefilled)])
    assert out[0].text == "<think>hmm</think>The answer is (B)." and out[0].finish_reason == "stop"
    bodies = sorted(server.posts, key=lambda b: b["messages"][-1]["role"] == "assistant")  # arrival order varies
    assert bodies[0]["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q?"}]
    assert bodies[1]["messages"][-1] == {"role": "assistant", "content": "<think>\n\n</think>\n\nThe"}
    assert bodies[1]["continue_final_message"] is True and "continue_final_message" not in bodies[0]
    with pytest.raises(AuditError,
                       match="backend=openai cannot read answer scores .* backend.mode=chat serves generation alone"):
        client.choice_probs([(1, 2)], [[3], [4]])
    assert len(server.posts) == 2


def test_the_key_is_sent_but_never_logged_or_stored(model_dir, servers, tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("FAIRAUDIT_TEST_KEY", KEY)
    server = servers(script=[500, 400])
    caplog.set_level(logging.DEBUG)
    client = OpenAIBackend(model_dir, base_url=server.url, model="fake", api_key_env="FAIRAUDIT_TEST_KEY",
                           retry_backoff_s=0.01)
    cached = CachingClient(client, Store(tmp_path / "store.sqlite"))
    with pytest.raises(AuditError) as failure:
        cached.generate(requests(1))
    cached.generate(requests(2))
    assert server.auth == {f"Bearer {KEY}"}
    assert KEY not in str(failure.value) and KEY not in caplog.text and KEY not in client.fingerprint
    assert KEY.encode() not in (tmp_path / "store.sqlite").read_bytes()
    monkeypatch.delenv("FAIRAUDIT_TEST_KEY")
    with pytest.raises(AuditError, match="^backend.api_key_env names 'FAIRAUDIT_TEST_KEY', which is not set"):
        OpenAIBackend(model_dir, base_url=server.url, api_key_env="FAIRAUDIT_TEST_KEY")


def other_backends_that_can(*capabilities: str) -> str:
    """The shipped model backends besides openai that declare every one of `capabilities`, as the refusal lists them."""
    able = [name for name, cls in backend_classes().items() if name != "openai" and not cls.rehearsal
            and all(getattr(cls.capabilities, c) for c in capabilities)]
    return ", ".join(f"backend={name}" for name in able)


def probes_runnable(capabilities: Capabilities) -> str:
    """The shipped probes whose needs `capabilities` cover, as the refusal lists them."""
    return ", ".join(name for name, cls in probe_classes().items()
                     if all(getattr(capabilities, c) for c in cls.needs.capabilities))


def test_unreachable_server_exits_2_before_any_mlflow_run(tmp_path):
    done = run_app(tmp_path, "model=tiny_qwen3", "backend=openai", "backend.base_url=http://127.0.0.1:9/v1",
                   "backend.model=fake", "dataset.n=2")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("error: server http://127.0.0.1:9/v1 is unreachable")
    assert not (tmp_path / "mlflow.db").exists()


def test_chat_mode_refuses_a_probe_needing_scores_before_any_request(tmp_path, servers, model_dir):
    server = servers()
    done = run_app(tmp_path, "model=tiny_qwen3", "backend=openai", f"backend.base_url={server.url}",
                   "backend.mode=chat", "dataset.n=2")
    assert done.returncode == 2 and server.posts == []
    assert done.stderr.strip().splitlines()[-1] == (
        "error: probe 'counterfactual' needs a backend that can read answer scores (choice_probs: P(Yes), forced "
        "answers); backend=openai cannot (backend.mode=chat serves generation alone: use backend.mode=completions "
        f"with a server that takes token ids). Backends that can: {other_backends_that_can('scores')}; probes "
        f"backend=openai runs: {probes_runnable(OpenAIBackend.capabilities_for({'mode': 'chat'}))}")
    assert not (tmp_path / "mlflow.db").exists()


def test_the_influence_probe_is_refused_before_any_request(tmp_path, servers):
    server = servers()
    done = run_app(tmp_path, "model=tiny_qwen3", "backend=openai", f"backend.base_url={server.url}",
                   "probe=influence", "dataset=mmlu", "dataset.n=2")
    assert done.returncode == 2 and server.posts == []
    assert done.stderr.strip().splitlines()[-1] == (
        "error: probe 'influence' needs a backend that can score a fixed target's likelihood (target_nll) and apply "
        "a role-visibility attention graph (graph generation, masked target_nll); backend=openai cannot. Backends "
        f"that can: {other_backends_that_can('target_nll', 'attention_graphs')}; probes backend=openai runs: "
        f"{probes_runnable(OpenAIBackend.capabilities)}")
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.slow
def test_a_whole_audit_through_the_server_keeps_the_key_out_of_mlflow_and_the_store(tmp_path, servers, model_dir):
    from mlflow.tracking import MlflowClient

    server = servers()
    done = run_app(tmp_path, "model=tiny_qwen3", "backend=openai", f"backend.base_url={server.url}",
                   "backend.api_key_env=FAIRAUDIT_TEST_KEY", "dataset.n=2", env={"FAIRAUDIT_TEST_KEY": KEY})
    assert done.returncode == 0, done.stderr[-2000:]
    assert server.auth == {f"Bearer {KEY}"} and KEY not in done.stdout + done.stderr
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs(client.get_experiment_by_name("fairaudit").experiment_id)
    assert run.data.params["backend.api_key_env"] == "FAIRAUDIT_TEST_KEY" and run.data.metrics["model_calls"] > 0
    assert all(KEY not in v for v in [*run.data.params.values(), *run.data.tags.values()])
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path


def test_the_files_a_served_hub_model_fetches_render_the_same_prompts_without_weights(model_dir, servers, tmp_path):
    """PROMPT_FILES, selected as snapshot_download selects them, give the same tokenizer, EOS and fingerprint."""
    from transformers import AutoTokenizer

    names = sorted(p.name for p in model_dir.iterdir() if p.is_file())
    kept = list(filter_repo_objects(names, allow_patterns=PROMPT_FILES))
    assert "model.safetensors" in names and not [n for n in kept if n.endswith((".safetensors", ".bin"))]
    for name in kept:
        shutil.copy(model_dir / name, tmp_path / name)
    messages = [{"role": "user", "content": "Is 7 prime? Answer Yes or No."}]
    full, light = (AutoTokenizer.from_pretrained(str(d)) for d in (model_dir, tmp_path))
    rendered = full.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert light.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == rendered
    assert light.encode(rendered) == full.encode(rendered)
    server = servers()
    assert backend(tmp_path, server.url).stop_ids == backend(model_dir, server.url).stop_ids
    assert backend(tmp_path, server.url).fingerprint == backend(model_dir, server.url).fingerprint
    assert model_fingerprint(tmp_path, weights=False) != model_fingerprint(model_dir)  # weights count elsewhere


def test_a_hub_model_is_fetched_without_weights_only_when_served_elsewhere(monkeypatch, tmp_path):
    asked = []

    def snapshot_download(repo_id, revision=None, allow_patterns=None):  # the hub itself is out of reach here
        asked.append((repo_id, allow_patterns))
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    assert resolve_model_dir("org/served", weights=OpenAIBackend.capabilities.loads_weights) == tmp_path
    resolve_model_dir("org/local")
    assert asked == [("org/served", PROMPT_FILES), ("org/local", None)]
