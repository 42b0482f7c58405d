"""Backend `openai`: a model behind OpenAI-compatible servers (vLLM replicas, SGLang, TGI, hosted APIs).

`completions` mode serves the whole protocol on token-id prompts rendered locally with the
model's own tokenizer, so records and store keys mean what they mean under `hf`: greedy and
seeded sampling per request, choice reads through vLLM's `logprob_token_ids`, depth reads as
one request per cut (the server's prefix cache shares the prompt). `chat` mode sends the
messages recovered from the rendered prompt to /chat/completions and serves generation alone,
the provider's reasoning field (`reasoning_content`) becoming the think trace.

At most `max_concurrency` requests are in flight, spread round-robin over the replicas;
connection errors, timeouts, 429 and 5xx are retried with exponential backoff and jitter on
the next replica. Results reach `on_result` as they arrive, so the store commits them before
a request that keeps failing ends the run.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import random
import re
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping, Sequence

import httpx
import numpy as np

from fairaudit.backends import (
    Backend,
    Capabilities,
    Completion,
    DepthRequest,
    GenerationRequest,
    missing,
    refuse_graphs,
)
from fairaudit.backends.common import choice_token_ids, completion_from_ids, pooled_softmax, stop_token_ids
from fairaudit.errors import AuditError
from fairaudit.models.locate import model_fingerprint

BACKEND_VERSION = "openai-1"
MODES = ("completions", "chat")
CHAT_ONLY = "backend.mode=chat serves generation alone: use backend.mode=completions with a server that takes token ids"
DOWN_FOR_S = 30.0  # a replica that dropped a connection is skipped this long while others are up
REACH_TIMEOUT_S = 10.0  # a server must answer GET /models within this before a run or sweep opens
CHAT_SHAPES = (("system", "user"), ("user",))  # the conversations probes render, tried in this order

logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request would flood the job log

Job = Callable[[httpx.AsyncClient], Awaitable[Any]]


class Malformed(Exception):
    """A 200 answer whose body is not what the endpoint promises."""


def server_urls(base_url: str | Sequence[str]) -> list[str]:
    """The replicas' base URLs (…/v1), without a trailing slash."""
    urls = [base_url] if isinstance(base_url, str) else list(base_url)
    if not urls or not all(isinstance(u, str) and u.startswith(("http://", "https://")) for u in urls):
        raise AuditError(f"backend.base_url must be an http(s) URL or a list of them; got {base_url!r}")
    return [u.rstrip("/") for u in urls]


def auth_headers(api_key_env: str | None) -> dict[str, str]:
    """The Authorization header from the variable named by `api_key_env` (the key itself is never echoed)."""
    if not api_key_env:
        return {}
    key = os.environ.get(api_key_env)
    if not key:
        raise AuditError(f"backend.api_key_env names {api_key_env!r}, which is not set in the environment")
    return {"Authorization": f"Bearer {key}"}


def served_model(urls: Sequence[str], headers: dict[str, str], model: str | None, timeout_s: float) -> str:
    """The model every replica serves: `model`, or the only one they list when it is None.

    One line naming the first replica that is unreachable or does not serve it.
    """
    for url in urls:
        try:
            response = httpx.get(f"{url}/models", headers=headers, timeout=min(timeout_s, 30.0))
        except httpx.HTTPError as exc:
            raise AuditError(f"server {url} is unreachable: {type(exc).__name__}: {exc}") from None
        if response.status_code != 200:
            raise AuditError(f"server {url} answered HTTP {response.status_code} to GET /models")
        try:
            ids = [entry["id"] for entry in response.json()["data"]]
        except (ValueError, KeyError, TypeError):
            raise AuditError(f"server {url} sent a malformed body to GET /models: {response.text[:120]!r}") from None
        if model is None and len(ids) == 1:
            model = ids[0]
        if model not in ids:
            raise AuditError(f"server {url} does not serve model {model!r}; set backend.model to one of {ids}")
    return model  # type: ignore[return-value]


class Replicas:
    """HTTP to a set of replicas: round-robin, a bounded number in flight, retries with backoff and jitter."""

    def __init__(self, urls: Sequence[str], headers: dict[str, str], max_concurrency: int, timeout_s: float,
                 max_retries: int, retry_backoff_s: float):
        if max_concurrency < 1 or max_retries < 0 or timeout_s <= 0:
            raise AuditError("backend.max_concurrency must be >= 1, max_retries >= 0 and timeout_s > 0")
        self.urls, self.headers = list(urls), headers
        self.max_concurrency, self.timeout_s = max_concurrency, timeout_s
        self.max_retries, self.retry_backoff_s = max_retries, retry_backoff_s
        self.down_until = {url: 0.0 for url in self.urls}
        self.sent = {url: 0 for url in self.urls}  # requests sent to each replica (retries included)
        self.answered = {url: 0 for url in self.urls}  # well-formed answers from each replica
        self._turn = itertools.count()

    def run(self, jobs: Sequence[Job], on_result: Callable[[int, Any], None]) -> None:
        """Run the jobs concurrently; on_result(i, result) as each finishes; the first failure raises."""
        if jobs:
            asyncio.run(self._run_all(jobs, on_result))

    async def _run_all(self, jobs: Sequence[Job], on_result: Callable[[int, Any], None]) -> None:
        self._slots = asyncio.Semaphore(self.max_concurrency)
        limits = httpx.Limits(max_connections=self.max_concurrency, max_keepalive_connections=self.max_concurrency)
        async with httpx.AsyncClient(headers=self.headers, timeout=self.timeout_s, limits=limits) as client:
            async def one(i: int, job: Job) -> None:
                on_result(i, await job(client))

            try:
                async with asyncio.TaskGroup() as group:
                    for i, job in enumerate(jobs):
                        group.create_task(one(i, job))
            except BaseExceptionGroup as failed:  # the first failure cancelled the rest; report it alone
                raise failed.exceptions[0] from None

    def _pick(self) -> str:
        """The next replica in turn, skipping those recently down unless all are."""
        now = time.monotonic()
        up = [u for u in self.urls if self.down_until[u] <= now] or self.urls
        return up[next(self._turn) % len(up)]

    def _backoff(self, attempt: int) -> float:
        """Exponential backoff with full jitter around its mean."""
        return self.retry_backoff_s * 2 ** (attempt - 1) * random.uniform(0.5, 1.5)

    async def post(self, client: httpx.AsyncClient, path: str, body: dict, parse: Callable[[dict], Any]) -> Any:
        """POST `body` to `path` on some replica and parse the answer; retried on transient failures.

        A request that keeps failing, any other HTTP error and a malformed body end in one
        AuditError line naming the server and the status.
        """
        failure = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                await asyncio.sleep(self._backoff(attempt))
            url = self._pick()
            self.sent[url] += 1
            try:
                async with self._slots:
                    response = await client.post(url + path, json=body)
            except httpx.TimeoutException:
                failure = f"server {url} gave no answer to POST {path} within {self.timeout_s:g} s"
                self.down_until[url] = time.monotonic() + DOWN_FOR_S
                continue
            except httpx.TransportError as exc:
                failure = f"server {url} failed on POST {path}: {type(exc).__name__}: {exc}"
                self.down_until[url] = time.monotonic() + DOWN_FOR_S
                continue
            status = response.status_code
            if status == 429 or status >= 500:
                failure = f"server {url} answered HTTP {status} to POST {path}"
                continue
            if status != 200:
                raise AuditError(f"server {url} answered HTTP {status} to POST {path}: {response.text[:200]!r}")
            try:
                result = parse(response.json())
            except (ValueError, KeyError, IndexError, TypeError, Malformed) as exc:
                raise AuditError(f"server {url} sent a malformed body to POST {path} ({type(exc).__name__}: {exc}): "
                                 f"{response.text[:120]!r}") from None
            self.answered[url] += 1
            return result
        raise AuditError(f"{failure} (gave up after {self.max_retries} retries)")


def chat_pattern(tokenizer, roles: Sequence[str]) -> re.Pattern:
    """A regex matching a prompt rendered from messages of these roles: one group per content, then the pre-fill."""
    marks = [{"role": role, "content": f"\x00{i}\x00"} for i, role in enumerate(roles)]
    rendered = tokenizer.apply_chat_template(marks, tokenize=False, add_generation_prompt=True)
    literal = re.split(r"\x00\d+\x00", rendered)
    return re.compile("(.*?)".join(re.escape(part) for part in literal) + "(.*)", re.DOTALL)


def chat_patterns(tokenizer) -> list[tuple[tuple[str, ...], re.Pattern]]:
    """The patterns of every conversation shape the model's chat template renders (some refuse a system turn)."""
    from jinja2.exceptions import TemplateError

    patterns = []
    for roles in CHAT_SHAPES:
        try:
            patterns.append((roles, chat_pattern(tokenizer, roles)))
        except TemplateError:
            continue
    return patterns


def chat_messages(patterns: Sequence[tuple[tuple[str, ...], re.Pattern]], prompt: str) -> list[dict[str, str]]:
    """The chat messages a rendered prompt came from; a pre-fill becomes a final partial assistant message."""
    for roles, pattern in patterns:
        match = pattern.fullmatch(prompt)
        if match:
            *contents, prefill = match.groups()
            messages = [{"role": r, "content": c} for r, c in zip(roles, contents)]
            return messages + ([{"role": "assistant", "content": prefill}] if prefill else [])
    raise AuditError("backend.mode=chat cannot recover chat messages from a prompt the chat template did not render "
                     f"as (system, user) or (user): {prompt[:80]!r}")


class OpenAIBackend(Backend):
    """A model served over the OpenAI API; the tokenizer is local, the weights are the server's.

    `dtype` and `batch_size` (given to every backend) are the server's business here. Calls stream:
    each result reaches `on_result` as it arrives. A hub model resolves to its config, tokenizer
    and chat template only (no weights).
    """

    name = "openai"
    capabilities = Capabilities(scores=True, depth_reads=True, streaming=True, loads_weights=False)

    @classmethod
    def capabilities_for(cls, settings) -> Capabilities:
        """mode=chat serves generation alone: no answer scores, no depth reads."""
        if settings.get("mode", "completions") == "chat":
            return replace(cls.capabilities, scores=False, depth_reads=False, limits=CHAT_ONLY)
        return cls.capabilities

    @classmethod
    def reach(cls, settings: Mapping) -> None:
        """Every replica answers GET /models within REACH_TIMEOUT_S and serves `backend.model` (one line if not)."""
        served_model(server_urls(settings["base_url"]), auth_headers(settings.get("api_key_env")),
                     settings.get("model"), min(float(settings.get("timeout_s", REACH_TIMEOUT_S)), REACH_TIMEOUT_S))

    @classmethod
    def load_tokenizer(cls, model_dir: str | Path, settings: Mapping):
        """`backend.tokenizer` (a local folder or hub id) when set, else the model folder's own; loaded once per
        process (`common.folder_tokenizer`: the backend encodes, decodes and renders with it, and changes nothing)."""
        from fairaudit.backends.common import folder_tokenizer

        return folder_tokenizer(settings.get("tokenizer") or str(model_dir))

    def __init__(self, model_dir: str | Path, base_url: str | Sequence[str], model: str | None = None,
                 api_key_env: str | None = None, mode: str = "completions", tokenizer: str | None = None,
                 max_concurrency: int = 8, timeout_s: float = 300.0, max_retries: int = 5,
                 retry_backoff_s: float = 1.0, think_tags: Sequence[str] = ("<think>", "</think>"),
                 dtype: str | None = None, batch_size: int | None = None):
        if mode not in MODES:
            raise AuditError(f"backend.mode {mode!r} is not one of {list(MODES)}")
        urls = server_urls(base_url)
        headers = auth_headers(api_key_env)
        self.mode, self.think_tags = mode, tuple(think_tags)
        self.capabilities = self.capabilities_for({"mode": mode})
        self.tokenizer = self.load_tokenizer(model_dir, {"tokenizer": tokenizer})
        self.stop_ids = stop_token_ids(str(model_dir), self.tokenizer)
        self.model = served_model(urls, headers, model, timeout_s)
        self.replicas = Replicas(urls, headers, max_concurrency, timeout_s, max_retries, retry_backoff_s)
        self.fingerprint = f"{model_fingerprint(Path(model_dir), weights=False)}/{BACKEND_VERSION}/{mode}/{self.model}"
        self._chat_patterns = chat_patterns(self.tokenizer) if mode == "chat" else []

    def _gather(self, jobs: Sequence[Job], on_result: Callable[[int, Any], None] | None) -> list:
        results: list = [None] * len(jobs)

        def keep(i: int, result: Any) -> None:
            results[i] = result
            if on_result is not None:
                on_result(i, result)

        self.replicas.run(jobs, keep)
        return results

    def _refuse_scores(self, capability: str) -> None:
        if not self.capabilities.has(capability):
            raise missing(self, capability, hint=self.capabilities.limits)

    def generate(self, requests: Sequence[GenerationRequest], on_result=None) -> list[Completion]:
        """Continue each prompt (greedy, or seeded nucleus sampling); results in request order."""
        refuse_graphs(self, requests)
        one = self._chat_completion if self.mode == "chat" else self._completion
        return self._gather([partial(one, request=r) for r in requests], on_result)

    def choice_probs(self, prefixes: Sequence[Sequence[int]], choices: Sequence[Sequence[int]],
                     on_result=None) -> np.ndarray:
        """Softmax over the pooled choices at the position after each prefix (see the protocol)."""
        self._refuse_scores("scores")
        rows = self._gather([partial(self._choice_read, prefix=p, choices=choices) for p in prefixes], on_result)
        return np.array(rows, dtype=np.float64).reshape(len(prefixes), len(choices))

    def depth_choice_probs(self, requests: Sequence[DepthRequest], choices: Sequence[Sequence[int]],
                           on_result=None) -> list[np.ndarray]:
        """choice_probs at every cut, one request per cut: the naive re-feed, shared by the server's prefix cache."""
        self._refuse_scores("depth_reads")
        return self._gather([partial(self._depth_read, request=r, choices=choices) for r in requests], on_result)

    async def _depth_read(self, client: httpx.AsyncClient, request: DepthRequest, choices) -> np.ndarray:
        prefixes = [request.prompt_ids + request.trace_ids[:cut] + request.suffix_ids for cut in request.cuts]
        rows = await asyncio.gather(*[self._choice_read(client, prefix=p, choices=choices) for p in prefixes])
        return np.array(rows, dtype=np.float64).reshape(len(prefixes), len(choices))

    async def _choice_read(self, client: httpx.AsyncClient, prefix: Sequence[int], choices) -> np.ndarray:
        token_ids = choice_token_ids(choices)
        body = {"model": self.model, "prompt": list(prefix), "max_tokens": 1, "temperature": 0.0,
                "logprobs": len(token_ids), "logprob_token_ids": token_ids, "return_tokens_as_token_ids": True}

        def parse(answer: dict) -> np.ndarray:
            top = answer["choices"][0]["logprobs"]["top_logprobs"][0]
            logprobs = {int(key.removeprefix("token_id:")): value for key, value in top.items()}
            absent = [t for t in token_ids if t not in logprobs]
            if absent:
                raise Malformed(f"no log-probability for token ids {absent} (does the server take logprob_token_ids?)")
            return pooled_softmax(np.array([logprobs[t] for t in token_ids]), token_ids, choices)[0]

        return await self.replicas.post(client, "/completions", body, parse)

    def _sampling(self, request: GenerationRequest) -> dict:
        body = {"model": self.model, "max_tokens": request.max_new_tokens, "temperature": request.temperature}
        if request.temperature > 0.0:  # as hf: nucleus sampling from a generator seeded by the request
            body.update(top_p=request.top_p, seed=request.seed or 0)
        return body

    async def _completion(self, client: httpx.AsyncClient, request: GenerationRequest) -> Completion:
        body = {**self._sampling(request), "prompt": list(request.prompt_ids), "return_token_ids": True}

        def parse(answer: dict) -> Completion:
            choice = answer["choices"][0]
            ids = list(choice["token_ids"]) if choice.get("token_ids") is not None else self.tokenizer.encode(
                choice["text"], add_special_tokens=False)
            return self._as_completion(ids, choice["finish_reason"])

        return await self.replicas.post(client, "/completions", body, parse)

    def _as_completion(self, new_ids: list[int], finish_reason: str) -> Completion:
        """As `hf` reports it: EOS and what follows removed, "stop" when EOS ended it, else "length"."""
        if finish_reason not in ("stop", "length"):
            raise Malformed(f"finish_reason {finish_reason!r}")
        return completion_from_ids(self.tokenizer, new_ids, self.stop_ids, len(new_ids),
                                   engine_stopped=finish_reason == "stop")

    async def _chat_completion(self, client: httpx.AsyncClient, request: GenerationRequest) -> Completion:
        prompt = self.tokenizer.decode(list(request.prompt_ids), skip_special_tokens=False)
        messages = chat_messages(self._chat_patterns, prompt)
        body = {**self._sampling(request), "messages": messages}
        if messages[-1]["role"] == "assistant":  # the pre-fill: continued, not answered (vLLM, SGLang)
            body.update(continue_final_message=True, add_generation_prompt=False)

        def parse(answer: dict) -> Completion:
            choice = answer["choices"][0]
            message = choice["message"]
            reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
            content = message.get("content") or ""
            text = f"{self.think_tags[0]}{reasoning}{self.think_tags[1]}{content}" if reasoning else content
            if choice["finish_reason"] not in ("stop", "length"):
                raise Malformed(f"finish_reason {choice['finish_reason']!r}")
            return Completion(text=text, token_ids=tuple(self.tokenizer.encode(text, add_special_tokens=False)),
                              finish_reason=choice["finish_reason"])

        return await self.replicas.post(client, "/chat/completions", body, parse)
