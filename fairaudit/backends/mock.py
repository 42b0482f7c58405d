"""backend=mock: no model; instant, seeded answers that rehearse a study's bookkeeping at full size (inspect's mockllm).

Every call answers from a fixed function of the token ids it is given, so a re-run, a depth read
and its re-fed prefix agree exactly:
- generate: in a thinking context (the prompt ends in the open think tag, or a `native` model opens
  its own block) a trace ("Okay," then words of a fixed band of tokens) whose length is drawn per
  pair from `trace_tokens`, the close tag and the answer; a trace that reaches max_new_tokens is cut
  there (finish "length", no answer). Elsewhere the answer alone. The answer is the one of `answers`
  with the higher mock probability, so parsed and forced answers agree.
- choice_probs: one logit per answer word (a token's text, stripped and lowercased, so " Yes" and
  "Yes" pool alike): a pair's seeded logit, plus for `answers[0]` a seeded term per trace and the
  side's share of the counterfactual effect: +-(effect + effect_per_1k_tokens * trace tokens / 1000) / 2, and
  with `side_sd` a draw of that spread fixed by the pair, the side and the trace (a fresh one per side and per
  trace read, so the sides of a pair and the arms of a side flip by chance; 0, the default: the sides differ by
  the effect alone); and on every side a preference for `answers[0]` (with answers [A, B, C, D]: for position A)
  that grows with the trace, position_pref + position_pref_per_1k_tokens * trace tokens / 1000 (0, the default).
- depth reads: choice_probs of each cut prefix; target_nll and graph generation: seeded by what the
  target (or the new tokens) may see under the visibility graph. With `influence_nll`, target_nll adds that
  many nats/token when a target block (a content target, after its opening tag) is no longer what graph
  generation writes after what it now sees: a donor swapped into a block it sees plants that NLL shift.

A pair is seeded by its prompt without the words in `protected` and `neutral`, so both sides (and
both arms) share it: with both effects 0 the two sides answer alike. The fingerprint names the mock,
its settings and the tokenizer's folder, never a model's weights, so its results never mix with a
model's in the store. Never a stand-in where a test checks a model's numbers.
"""

from __future__ import annotations

import hashlib
import math
import time
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from fairaudit.backends import (
    Backend,
    Capabilities,
    Completion,
    DepthRequest,
    GenerationRequest,
    GraphGenerationRequest,
    NLLRequest,
)
from fairaudit.backends.common import (
    check_depth_request,
    choice_token_ids,
    completion_from_ids,
    folder_tokenizer,
    pooled_softmax,
    stop_token_ids,
)
from fairaudit.models.locate import model_fingerprint

BACKEND_VERSION = "mock-1"
BAND_SIZE = 512          # words a trace is drawn from
OPENER = "Okay,"         # a trace's first words (stripping the trace leaves its tokens as generated)
DISTRIBUTIONS = ("lognormal", "uniform", "fixed")
THINKING_STYLES = ("native", "prompted", "none")


def _digest(*parts) -> int:
    """A 64-bit hash of int arrays and bytes."""
    h = hashlib.blake2b(digest_size=8)
    for part in parts:
        if isinstance(part, int):
            part = part.to_bytes(8, "little")
        h.update(part if isinstance(part, bytes) else np.asarray(part, dtype=np.int64).tobytes())
    return int.from_bytes(h.digest(), "little")


def _normal(seed: int) -> float:
    """A standard normal draw fixed by a 64-bit seed (Box-Muller on its two halves)."""
    u1, u2 = ((seed & 0xFFFFFFFF) + 0.5) / 2**32, ((seed >> 32) + 0.5) / 2**32
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)


def settings_rules() -> dict:
    """The `backend.*` keys of backend=mock and what each accepts."""
    from fairaudit.errors.rules import integer, list_of, number, one_of, optional, text

    return {"seed": integer(0), "trace_tokens.distribution": one_of(*DISTRIBUTIONS), "trace_tokens.median": number(1),
            "trace_tokens.sigma": number(0), "trace_tokens.low": integer(0), "trace_tokens.high": integer(1),
            "effect": number(), "effect_per_1k_tokens": number(), "base_sd": number(0), "trace_sd": number(0),
            "side_sd": number(0), "influence_nll": number(), "position_pref": number(),
            "position_pref_per_1k_tokens": number(),
            "answers": list_of(text()), "protected": list_of(text(null=True), nonempty=False),
            "neutral": list_of(text(), nonempty=False), "thinking.style": one_of(*THINKING_STYLES),
            "chunk_size": optional(integer(1)), "seconds_per_call": number(0)}


class MockBackend(Backend):
    """Seeded answers on the model folder's tokenizer (its weights are never read); see the module docstring."""

    name = "mock"
    rehearsal = True
    capabilities = Capabilities(scores=True, depth_reads=True, target_nll=True, attention_graphs=True,
                                loads_weights=False)

    @classmethod
    def check(cls, settings: Mapping, model: Mapping) -> None:
        """Settings of the right types, and a trace length range that holds a trace."""
        from fairaudit.errors.rules import check_fields

        lengths = dict(settings.get("trace_tokens") or {})
        low, high = lengths.get("low", 1), lengths.get("high", 1)
        extra = [f"backend.trace_tokens.low={low} must not exceed backend.trace_tokens.high={high}"
                 if isinstance(low, int) and isinstance(high, int) and low > high else None]
        check_fields("backend", settings, settings_rules(), extra)

    @classmethod
    def capabilities_for(cls, settings: Mapping):
        from dataclasses import replace

        return replace(cls.capabilities, chunk_size=settings.get("chunk_size"))

    def __init__(self, model_dir: str | Path, dtype: str = "float32", batch_size: int = 8, *, seed: int = 0,
                 trace_tokens: Mapping | None = None, effect: float = 0.5, effect_per_1k_tokens: float = 0.5,
                 base_sd: float = 2.0, trace_sd: float = 1.0, side_sd: float = 0.0, influence_nll: float = 0.0,
                 position_pref: float = 0.0, position_pref_per_1k_tokens: float = 0.0,
                 answers: Sequence[str] = ("Yes", "No"), protected: Sequence[str | None] = (),
                 neutral: Sequence[str] = (), thinking: Mapping | None = None,
                 answer_prefix: str = "", chunk_size: int | None = None, seconds_per_call: float = 0.0):
        lengths = {"distribution": "lognormal", "median": 1500, "sigma": 0.5, "low": 1, "high": 4000,
                   **(trace_tokens or {})}
        thinking = {"style": "native", "open": "<think>", "close": "</think>", **(thinking or {})}
        settings = dict(seed=seed, trace_tokens=lengths, effect=effect, effect_per_1k_tokens=effect_per_1k_tokens,
                        base_sd=base_sd, trace_sd=trace_sd, answers=list(answers), protected=list(protected),
                        neutral=list(neutral), thinking=thinking, answer_prefix=answer_prefix, chunk_size=chunk_size)
        for name, value in (("side_sd", side_sd), ("influence_nll", influence_nll), ("position_pref", position_pref),
                            ("position_pref_per_1k_tokens", position_pref_per_1k_tokens)):
            if value:  # only when set, so a mock without them keeps its fingerprint (and its results in a store)
                settings[name] = value
        self.check(settings, {})
        self.settings = settings
        self.capabilities = self.capabilities_for(settings)
        self.tokenizer = folder_tokenizer(str(model_dir))
        self.stop_ids = stop_token_ids(str(model_dir), self.tokenizer)
        self.eos = min(self.stop_ids)
        digest = hashlib.sha256(repr(sorted(settings.items())).encode()).hexdigest()[:12]
        self.fingerprint = f"{BACKEND_VERSION}/{model_fingerprint(Path(model_dir), weights=False)}/{digest}"
        self._vocabulary(thinking, answer_prefix, [p for p in protected if p], list(neutral))
        self._words: dict[int, tuple[int, bool]] = {}
        self.seconds_per_call = seconds_per_call  # a pace, not an answer: outside the settings the fingerprint reads

    def _pace(self, calls: int) -> None:
        """Take `seconds_per_call` per call, as a model would take its time (answers are the same either way)."""
        if self.seconds_per_call:
            time.sleep(self.seconds_per_call * calls)

    @property
    def batch_invariant(self) -> bool:
        """Every answer is a function of its own request alone."""
        return True

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _ids_of(self, words: Sequence[str], letters: bool = True) -> set[int]:
        """Token ids spelling the words (bare, after a space, lowercased); with `letters`, those with a letter only."""
        ids = {t for w in words for form in (w, " " + w, w.lower(), " " + w.lower()) for t in self._encode(form)}
        return {t for t in ids if not letters or any(c.isalpha() for c in self.tokenizer.decode([t]))}

    def _vocabulary(self, thinking: Mapping, answer_prefix: str, protected: list[str], neutral: list[str]) -> None:
        """Lookup tables over the vocabulary: the trace band, the side markers, the tokens a pair's seed skips."""
        size = len(self.tokenizer)
        self.open_ids = self._encode(f"{thinking['open']}\n")
        self.close_ids = self._encode(f"\n{thinking['close']}\n\n")
        self.opener_ids = self._encode(OPENER)
        structural = {t for text in (thinking["open"], thinking["close"], "\n", "\n\n", OPENER, answer_prefix,
                                     f" {answer_prefix}") for t in self._encode(text)}
        alpha, prime = (self._ids_of(protected[i:i + 1]) for i in range(2)) if len(protected) == 2 else (set(), set())
        skipped = structural | self._ids_of(protected, letters=False) | self._ids_of(neutral, letters=False)
        band = []
        for t in range(min(30000, size // 2), size):
            word = self.tokenizer.decode([t])
            letters = word[1:]
            if (len(word) > 6 and word[0] == " " and letters.isascii() and letters.isalpha() and letters.islower()
                    and t not in skipped and self._encode(word) == [t]):
                band.append(t)
                if len(band) == BAND_SIZE:
                    break
        self.band = np.array(band, dtype=np.int64)

        def table(ids):  # a mask over token ids 0..size (index size: the ids beyond the vocabulary)
            return np.isin(np.arange(size + 1), sorted(ids))

        self.in_band, self.alpha_mark, self.prime_mark = table(band), table(alpha - prime), table(prime - alpha)
        self.seeded = ~table(skipped | set(band))
        self.size = size
        self.answer_ids = [self._encode(a) for a in self.settings["answers"]]
        known = {*band, *self.opener_ids, *self.open_ids, *self.close_ids, *(t for ids in self.answer_ids for t in ids)}
        self.pieces = {t: self.tokenizer.decode([t], skip_special_tokens=False) for t in known}
        self.pieces = {t: piece for t, piece in self.pieces.items() if piece.isascii()}  # whole characters each

    def _decode(self, ids: Sequence[int]) -> str:
        """tokenizer.decode(ids), by joining the pieces of the tokens the mock writes (others: the tokenizer)."""
        try:
            return "".join([self.pieces[t] for t in ids])
        except KeyError:
            return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def _features(self, ids: np.ndarray) -> tuple[int, int, int, float]:
        """(pair seed, trace tokens, trace seed, side: +1/2 alpha, -1/2 alpha', 0 neither) of a token sequence."""
        index = np.minimum(ids, self.size)
        band = self.in_band[index]
        side = 0.5 * (float(self.alpha_mark[index].any()) - float(self.prime_mark[index].any()))
        return _digest(self.settings["seed"], ids[self.seeded[index]]), int(band.sum()), _digest(ids[band]), side

    def _word(self, token: int) -> tuple[int, bool]:
        """(seed of the token's word, whether it is answers[0]) for a choice token."""
        if token not in self._words:
            word = self.tokenizer.decode([token]).strip().lower()
            self._words[token] = (_digest(word.encode()), word == self.settings["answers"][0].strip().lower())
        return self._words[token]

    def _logits(self, ids: np.ndarray, token_ids: Sequence[int]) -> np.ndarray:
        """Mock logits of `token_ids` after the sequence `ids`."""
        s = self.settings
        pair, n, trace, side = self._features(ids)
        shift = (s["trace_sd"] * _normal(_digest(pair, trace)) if n else 0.0)
        shift += side * (s["effect"] + s["effect_per_1k_tokens"] * n / 1000.0)
        shift += s.get("position_pref", 0.0) + s.get("position_pref_per_1k_tokens", 0.0) * n / 1000.0
        if side and s.get("side_sd"):  # seeds 1 and 3: alpha' and alpha, never the trace's own draw
            shift += s["side_sd"] * _normal(_digest(pair, trace, int(2 * side) + 2))
        words = [self._word(t) for t in token_ids]
        return np.array([s["base_sd"] / math.sqrt(2.0) * _normal(_digest(pair, seed)) + (shift if first else 0.0)
                         for seed, first in words])

    def choice_probs(self, prefixes: Sequence[Sequence[int]], choices: Sequence[Sequence[int]]) -> np.ndarray:
        """Softmax over the pooled choices of the mock logits after each prefix (see the protocol)."""
        self._pace(len(prefixes))
        token_ids = choice_token_ids(choices)
        scores = [self._logits(np.fromiter(p, np.int64, len(p)), token_ids) for p in prefixes]
        return pooled_softmax(np.array(scores).reshape(len(prefixes), len(token_ids)), token_ids, choices)

    def depth_choice_probs(self, requests: Sequence[DepthRequest],
                           choices: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """choice_probs of prompt + trace[:cut] + suffix for every cut (the naive re-feed, exactly)."""
        self._pace(len(requests))
        token_ids = choice_token_ids(choices)
        out = []
        for r in requests:
            check_depth_request(r)
            prompt, trace, suffix = (np.asarray(part, dtype=np.int64)
                                     for part in (r.prompt_ids, r.trace_ids, r.suffix_ids))
            scores = np.array([self._logits(np.concatenate([prompt, trace[:cut], suffix]), token_ids)
                               for cut in r.cuts])
            out.append(pooled_softmax(scores.reshape(len(r.cuts), len(token_ids)), token_ids, choices))
        return out

    def generate(self, requests: Sequence[GenerationRequest | GraphGenerationRequest]) -> list[Completion]:
        """A trace and an answer, or the answer alone, per request (see the module docstring); in request order."""
        self._pace(len(requests))
        return [self._graph_completion(r) if isinstance(r, GraphGenerationRequest) else self._completion(r)
                for r in requests]

    def _trace(self, seed: int, request_seed: int) -> list[int]:
        """Trace token ids of a drawn length: the opener, then band words."""
        lengths = self.settings["trace_tokens"]
        rng = np.random.default_rng([seed & 0xFFFFFFFF, seed >> 32, request_seed, self.settings["seed"]])
        if lengths["distribution"] == "uniform":
            n = int(rng.integers(lengths["low"], lengths["high"] + 1))
        elif lengths["distribution"] == "fixed":
            n = int(lengths["median"])
        else:
            n = int(round(lengths["median"] * math.exp(lengths["sigma"] * rng.standard_normal())))
        n = max(n - len(self.opener_ids), 0)
        return self.opener_ids + self.band[rng.integers(0, len(self.band), n)].tolist()

    def _context(self, prompt: Sequence[int]) -> list[int] | None:
        """What opens the trace: [] when the prompt opened the think block, the open tag when a native model
        opens its own, None when it answers at once (no thinking, or a closed empty block)."""
        thinking = self.settings["thinking"]
        if thinking["style"] == "none":
            return None
        tail = self.tokenizer.decode(list(prompt[-16:]), skip_special_tokens=False)
        if tail.rstrip("\n").endswith(thinking["open"]):
            return []
        if thinking["close"] in tail or thinking["style"] != "native":
            return None
        return self.open_ids

    def _completion(self, request: GenerationRequest) -> Completion:
        prompt = np.fromiter(request.prompt_ids, np.int64, len(request.prompt_ids))
        head = self._context(request.prompt_ids)
        pair = self._features(prompt)[0]
        trace = [] if head is None else head + self._trace(pair, (request.seed or 0) if request.temperature > 0 else 0)
        read = np.concatenate([prompt, np.asarray(trace, dtype=np.int64)])
        best = int(np.argmax(self._logits(read, [ids[0] for ids in self.answer_ids])))
        tail = (self.close_ids if head is not None else []) + self.answer_ids[best] + [self.eos]
        return completion_from_ids(self.tokenizer, trace + tail, self.stop_ids, request.max_new_tokens,
                                   decode=self._decode)

    def _visible(self, blocks, visibility, targets: Sequence[int]) -> np.ndarray:
        """Ids of the blocks the target blocks may attend (their own included), in sequence order."""
        seen = set(targets)
        for b in targets:
            seen |= set(range(b)) if visibility is None else set(visibility[b])
        return np.asarray([t for b in sorted(seen) for t in blocks[b].ids], dtype=np.int64)

    def _graph_completion(self, request: GraphGenerationRequest) -> Completion:
        """Band words seeded by what the new tokens may see, then the stop sequence (left out) or EOS."""
        last = len(request.blocks) - 1
        words = self._trace(_digest(self._visible(request.blocks, request.visibility, [last])), 0)
        if request.stop_ids and len(words) <= request.max_new_tokens:
            return Completion(self._decode(words), tuple(words), "stop")
        return completion_from_ids(self.tokenizer, words + [self.eos], self.stop_ids, request.max_new_tokens,
                                   decode=self._decode)

    def target_nll(self, requests: Sequence[NLLRequest]) -> np.ndarray:
        """Seeded nats/token, positive, fixed by the target blocks and what they may see under the graph."""
        self._pace(len(requests))
        values = []
        for r in requests:
            target = [t for b in r.target for t in r.blocks[b].ids]
            visible = self._visible(r.blocks, r.visibility, r.target)
            nll = 2.0 * math.exp(0.25 * _normal(_digest(visible, target)))
            shift = self.settings.get("influence_nll", 0.0)
            values.append(nll + shift if shift and not all(self._written_after(r, b) for b in r.target) else nll)
        return np.array(values, dtype=np.float64)

    def _written_after(self, request: NLLRequest, index: int) -> bool:
        """Whether target block `index` holds what graph generation writes after what its opening tag (the block
        before it, of its role and channel: a content target) now sees; True for a block without one."""
        blocks = request.blocks
        if index == 0 or (blocks[index - 1].role, blocks[index - 1].channel) != (blocks[index].role,
                                                                                   blocks[index].channel):
            return True
        ids = list(blocks[index].ids)
        return ids == self._trace(_digest(self._visible(blocks, request.visibility, [index - 1])), 0)[:len(ids)]
