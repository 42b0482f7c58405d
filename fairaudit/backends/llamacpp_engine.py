"""llama.cpp's low-level API (llama-cpp-python 0.3.36) behind a KV cache that keeps many sequences for reuse.

One context with a unified KV cache of `n_ctx` cells holds up to `n_seq_max` sequences. A
sequence that extends one still held (a resident: a depth read's prompt + trace, a choice read
after its generation, the shared start of two prompts) copies that prefix's cells
(`llama_memory_seq_cp`, no compute) and feeds only the rest.

Two settings make a read independent of how its tokens were batched and what else the cache
holds, measured on the embedded SmolLM2 (Q4_1): compute passes of at most 32 tokens (n_ubatch;
with larger passes the CPU matmul switches kernels and a logit moved by up to 0.65 between a
sequence fed in one pass and the same sequence fed in parts), flash attention (without it a
logit moved by up to 0.7 when another sequence's cells were merely held). The KV cache is float16,
which flash attention reads on the CPU: a float32 cache gave bit-identical logits but was cast to
float16 at every llama_decode, all cells in use, every layer (94% of the benchmark's CPU time with
32,768 cells). Together: every depth, shared and reused read equalled the sequence fed alone into an
empty cache exactly, as long as each sequence's cells lie in the order of its positions: flash
attention sums a query's cells in cache order, and a token that landed in a freed cell ahead of
its own context moved a logit by up to 0.46. So cells are never freed one sequence at a time:
a sequence evicted for its id is retired to the graveyard sequence (its cells stay, masked from
every other sequence), new tokens always land after every cell in use, and the whole cache is
emptied when a call's tokens would not fit. These hold under backend.numerics=exact; numerics=fast computes in
n_batch-token passes with the extra CPU buffer types, and its reads may differ from cold reads in the last digits.
Imported only when a llamacpp backend loads its model.
"""

from __future__ import annotations

import ctypes
import functools
import os
import subprocess
import sys
import time
from collections import OrderedDict
from pathlib import Path
from typing import Sequence

import llama_cpp as lc
import numpy as np

from fairaudit.errors import AuditError

_QUIET = lc.llama_log_callback(lambda level, text, data: None)  # held for the process: llama.cpp calls it later


# tokens per compute pass under numerics=exact: above 32 rows the CPU matmul takes another path, whose logits differ
UBATCH = 32
PROBE_TIMEOUT_S = 300  # a probe decode that has not finished by then counts as failed
clock = time.perf_counter  # the counters' clock: wall time (benchmarks/engine_efficiency.py sets CPU time)
WAVE_GAIN = 32  # shared tokens beyond the best computed source that are worth ending a wave for (one pass's worth)


class KVFull(Exception):
    """No room in the KV cache for a batch (llama_decode returned 1); the cache is as it was before the call."""


class Engine:
    """A loaded GGUF model and its context; `feed` and `step` decode, `logits` rows come back as float32 arrays."""

    unified = True  # one pool of cells shared by every sequence: prefixes are shared, not copied

    def __init__(self, gguf: str, n_ctx: int, n_batch: int, n_seq_max: int, n_threads: int, n_gpu_layers: int,
                 n_ubatch: int = UBATCH, extra_bufts: bool = False):
        """`n_ubatch`: tokens per compute pass (UBATCH keeps reads exact); `extra_bufts`: llama.cpp's extra CPU buffer
        types (AMX tiles, repacked weight layouts), which crashed llama_decode on an AMX CPU in a VM (a segmentation
        fault for every quantised file: `extra_bufts_run` probes for it)."""
        lc.llama_log_set(_QUIET, ctypes.c_void_p(0))
        lc.llama_backend_init()
        model_params = lc.llama_model_default_params()
        model_params.n_gpu_layers = n_gpu_layers
        model_params.use_extra_bufts = extra_bufts
        self.model = lc.llama_model_load_from_file(gguf.encode(), model_params)
        if not self.model:
            raise AuditError(f"llama.cpp could not load {gguf!r} (not a GGUF file of an architecture it knows?)")
        params = lc.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = n_ctx, n_batch, n_ubatch, n_seq_max
        params.n_threads = params.n_threads_batch = n_threads
        params.kv_unified = self.unified
        params.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_ENABLED  # reads independent of the other sequences held
        params.type_k = params.type_v = lc.GGML_TYPE_F16  # what flash attention reads: a float32 cache is cast to it
        self.ctx = lc.llama_init_from_model(self.model, params)
        if not self.ctx:
            raise AuditError(f"llama.cpp could not make a context of n_ctx={n_ctx} for {gguf!r}")
        self.memory = lc.llama_get_memory(self.ctx)
        self.n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))
        self.n_ctx, self.n_batch, self.n_seq_max = lc.llama_n_ctx(self.ctx), n_batch, n_seq_max
        self.batch = lc.llama_batch_init(n_batch, 0, n_seq_max)
        # the retired cells' sequence id; cells filled since the cache was emptied
        self.graveyard, self.used = n_seq_max - 1, 0
        self.residents: OrderedDict[int, tuple[int, ...]] = OrderedDict()  # seq id -> tokens held, least recent first
        self.counts = {"asked": 0, "reused": 0, "prefill_tokens": 0, "prefill_s": 0.0,
                       "decode_tokens": 0, "decode_s": 0.0}

    def close(self) -> None:
        lc.llama_batch_free(self.batch)
        lc.llama_free(self.ctx)
        lc.llama_model_free(self.model)

    # --- decoding ------------------------------------------------------------------------

    def _decode(self, items: Sequence[tuple[int, int, Sequence[int], bool]]) -> list[np.ndarray]:
        """One llama_decode of at most n_batch (token, position, sequence ids, want logits) items; logits in item
        order."""
        batch = self.batch
        batch.n_tokens = len(items)
        for i, (token, position, seqs, want) in enumerate(items):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, position, len(seqs), want
            for k, seq in enumerate(seqs):
                batch.seq_id[i][k] = seq
        code = lc.llama_decode(self.ctx, batch)
        if code == 1:
            raise KVFull()
        if code != 0:
            raise RuntimeError(f"llama_decode failed with code {code}")
        self.used += len(items)
        return [np.ctypeslib.as_array(lc.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,)).copy()
                for i, item in enumerate(items) if item[3]]

    def _decode_all(self, items: list) -> list[np.ndarray]:
        """Items in chunks of n_batch (`feed` has made room for them: no cell is freed here)."""
        out: list[np.ndarray] = []
        for start in range(0, len(items), self.n_batch):
            try:
                out += self._decode(items[start:start + self.n_batch])
            except KVFull:
                raise AuditError(f"the llama.cpp KV cache (backend.n_ctx={self.n_ctx} tokens) is full; "
                                 "raise backend.n_ctx") from None
        return out

    def _retire(self, keep: set[int]) -> bool:
        """Free the id of the least recent resident outside `keep`; its cells stay, held by the graveyard sequence."""
        for seq in self.residents:
            if seq not in keep:
                lc.llama_memory_seq_cp(self.memory, seq, self.graveyard, -1, -1)
                lc.llama_memory_seq_rm(self.memory, seq, -1, -1)
                self.residents.pop(seq)
                return True
        return False

    # --- sequences -----------------------------------------------------------------------

    def _source(self, tokens: Sequence[int], exclude: set[int] = frozenset(),
                pending: set[int] = frozenset()) -> tuple[int | None, int]:
        """The resident (not in `exclude`) sharing the longest prefix with `tokens`, and that prefix's length (at
        most len - 1: the last token is always fed, for its logits); (None, 0) when none shares a token. A resident in
        `pending` (gathered into the wave being built, not yet computed) is taken only when it shares more than
        WAVE_GAIN tokens beyond any other: taking it ends the wave, a llama_decode of its own."""
        wanted, best = np.asarray(tokens), {False: (None, 0), True: (None, 0)}
        for seq, held in self.residents.items():
            if seq in exclude:
                continue
            n = min(len(held), len(tokens) - 1)
            differ = np.flatnonzero(np.asarray(held[:n]) != wanted[:n])
            common = int(differ[0]) if len(differ) else n
            if common > best[seq in pending][1]:
                best[seq in pending] = (seq, common)
        return best[True] if best[True][1] > best[False][1] + WAVE_GAIN else best[False]

    def _claim(self, count: int, sources: set[int]) -> list[int]:
        """`count` free sequence ids, evicting the least recent residents that are not `sources`."""
        while len(self.residents) + count > self.graveyard:
            if not self._retire(sources):
                raise AuditError(f"backend.n_seq_max={self.n_seq_max} is too small for {count} sequences at once")
        return [seq for seq in range(self.graveyard) if seq not in self.residents][:count]

    def feed(self, sequences: Sequence[Sequence[int]], steps: int = 0) -> tuple[list[int], list[np.ndarray]]:
        """Hold each sequence under a sequence id of its own; returns the ids and the logits after each one's last
        token.

        Each sequence copies the longest prefix a resident holds (an earlier sequence of the same call included) and
        computes the rest; the new tokens of many sequences go in one llama_decode (`_feed_in_waves`). At most
        (n_seq_max - 1) // 2 sequences: each may need a resident source beside it. `steps`: the tokens `step` will add
        to them; when these and the sequences' new tokens would not fit in the cells left, the cache is emptied first.
        """
        if any(len(s) == 0 for s in sequences):
            raise ValueError("llama.cpp cannot read after an empty sequence")
        start = clock()
        if self.used + steps + sum(len(s) - self._source(s)[1] for s in sequences) > self.n_ctx:
            self.clear()
        sources = {src for src, _ in map(self._source, sequences) if src is not None}
        ids = self._claim(len(sequences), sources)
        rows = self._feed_in_waves(ids, sequences)
        self.counts["prefill_s"] += clock() - start
        return ids, rows

    def _feed_in_waves(self, ids: Sequence[int], sequences: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Sequences in order, their new tokens gathered into waves decoded together (n_batch tokens per
        llama_decode); a sequence that copies its prefix from a sequence of the wave (not yet computed) starts the
        next (`_source`)."""
        rows, wave, items = [], set(), []
        for seq, tokens in zip(ids, sequences):
            src, common = self._source(tokens, pending=wave)
            if src in wave:
                rows += self._decode_all(items)
                wave, items = set(), []
            if src is not None:
                lc.llama_memory_seq_cp(self.memory, src, seq, 0, common)
                self.residents.move_to_end(src)
            items += [(t, p, (seq,), p == len(tokens) - 1) for p, t in enumerate(tokens) if p >= common]
            wave.add(seq)
            self.residents[seq] = list(tokens)
            self.counts["asked"] += len(tokens)
            self.counts["reused"] += common
            self.counts["prefill_tokens"] += len(tokens) - common
        return rows + self._decode_all(items)

    def step(self, seqs: Sequence[int], tokens: Sequence[int]) -> list[np.ndarray]:
        """Feed one token to each sequence at its next position; the logits after it, in order."""
        start = clock()
        rows = self._decode_all([(t, len(self.residents[s]), (s,), True) for s, t in zip(seqs, tokens)])
        for seq, token in zip(seqs, tokens):
            self.residents[seq].append(token)
            self.residents.move_to_end(seq)
        self.counts["decode_tokens"] += len(seqs)
        self.counts["decode_s"] += clock() - start
        return rows

    @property
    def held(self) -> int:
        """Cells in use: those filled since the cache was emptied (cells are never freed one sequence at a time)."""
        return self.used

    def clear(self) -> None:
        """Empty the KV cache: the next sequences are computed from cold."""
        lc.llama_memory_clear(self.memory, True)
        self.residents.clear()
        self.used = 0


class StreamEngine(Engine):
    """One KV stream per sequence id (llama.cpp's `kv_unified = false`): a token's attention visits only its own
    sequence's cells, so its cost does not grow with the cells other sequences hold.

    `n_ctx` is the context's total, `n_ctx / n_seq_max` cells per stream. llama.cpp copies a prefix across
    streams only as the whole stream's buffer (`llama_memory_seq_cp` of a part aborts), so a sequence reuses a
    resident's cells in place: it takes over the resident's stream when it shares at least STEAL of the
    resident's tokens (a choice read after its generation, a depth read after a longer cut of the same trace),
    whose tail beyond the shared prefix is dropped (`llama_memory_seq_rm`), and is computed from cold otherwise.
    A stream holds one sequence, its cells in the order of its positions: no graveyard, no emptying of the cache.
    """

    unified = False
    STEAL = 0.75  # share of a resident's tokens a new sequence must share to take over its stream

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.graveyard = self.n_seq_max  # every id holds a sequence; none keeps retired cells
        self.per_stream = self.n_ctx // self.n_seq_max

    def _evict(self, keep: set[int]) -> int:
        """A free sequence id: the least recent resident outside `keep` is removed (its whole stream freed)."""
        free = [seq for seq in range(self.n_seq_max) if seq not in self.residents]
        if free:
            return free[0]
        for seq in self.residents:
            if seq not in keep:
                lc.llama_memory_seq_rm(self.memory, seq, -1, -1)
                self.residents.pop(seq)
                return seq
        raise AuditError(f"backend.n_seq_max={self.n_seq_max} is too small for this many sequences at once")

    def _stealable(self, tokens: Sequence[int], taken: set[int]) -> tuple[int | None, int]:
        """`_source`, among residents this call has not taken, when the shared prefix is worth the resident's tail."""
        src, common = self._source(tokens, exclude=taken)
        if src is None or common < self.STEAL * len(self.residents[src]):
            return None, 0
        return src, common

    def feed(self, sequences: Sequence[Sequence[int]], steps: int = 0) -> tuple[list[int], list[np.ndarray]]:
        """`Engine.feed` with one stream per sequence: each takes over a resident's stream (see the class) or a free
        one; `steps` (the tokens `step` will add) must fit each stream with its sequence."""
        if any(len(s) == 0 for s in sequences):
            raise ValueError("llama.cpp cannot read after an empty sequence")
        longest = max(len(s) for s in sequences) + (steps // max(1, len(sequences)))
        if longest > self.per_stream:
            raise AuditError(f"a sequence of {longest} tokens exceeds the {self.per_stream} cells of a KV stream "
                             f"(backend.n_ctx={self.n_ctx} / backend.n_seq_max={self.n_seq_max}); raise backend.n_ctx")
        start, ids, rows, taken = clock(), [], [], set()
        for tokens in sequences:
            seq, common = self._stealable(tokens, taken)
            if seq is None:
                seq, common = self._evict(taken), 0
            else:
                lc.llama_memory_seq_rm(self.memory, seq, common, -1)
            taken.add(seq)
            items = [(t, p, (seq,), p == len(tokens) - 1) for p, t in enumerate(tokens) if p >= common]
            rows += self._decode_all(items)
            self.residents[seq] = list(tokens)
            self.residents.move_to_end(seq)
            ids.append(seq)
            self.counts["asked"] += len(tokens)
            self.counts["reused"] += common
            self.counts["prefill_tokens"] += len(items)
        self.counts["prefill_s"] += clock() - start
        return ids, rows

    @property
    def held(self) -> int:
        """Cells in use: every resident's tokens."""
        return sum(map(len, self.residents.values()))


@functools.cache
def extra_bufts_run(gguf: str) -> tuple[bool, str]:
    """Whether llama.cpp's extra CPU buffer types decode this file on this CPU, and if not, why: a probe decode in a
    subprocess, since the failure seen (an AMX CPU in a VM) was a segmentation fault that would end this process."""
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    try:
        done = subprocess.run([sys.executable, "-m", __name__, gguf], env=env, capture_output=True,
                              timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return False, f"a probe decode with them ran past {PROBE_TIMEOUT_S} s"
    if done.returncode == 0:
        return True, ""
    cause = f"signal {-done.returncode}" if done.returncode < 0 else f"exit code {done.returncode}"
    return False, f"a probe decode with them ended in {cause}"


def probe_decode(gguf: str) -> None:
    """Load the file with the extra CPU buffer types and decode 16 tokens: `extra_bufts_run`'s subprocess."""
    engine = Engine(gguf, n_ctx=64, n_batch=32, n_seq_max=2, n_threads=1, n_gpu_layers=0, extra_bufts=True)
    engine.feed([list(range(1, 17))])
    engine.close()


if __name__ == "__main__":
    probe_decode(sys.argv[1])
