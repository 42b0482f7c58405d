"""llama.cpp's low-level API (llama-cpp-python 0.3.36) behind a prefix-sharing KV cache of many sequences.

One context with a unified KV cache of `n_ctx` cells holds up to `n_seq_max` sequences. A token
may belong to several sequences (llama.cpp's rule: a query of sequence s at position p attends
every cell that holds s at a position <= p), so sequences fed together share the cells of their
common prefix, and a sequence that extends one still held from an earlier call (a resident)
copies that prefix's membership (`llama_memory_seq_cp`, no compute) and feeds only the rest.
Every cell keeps the position it has in its own sequence, so a read from shared or reused cells
is the read of the sequence fed alone. Imported only when a llamacpp backend loads its model.
"""

from __future__ import annotations

import ctypes
import time
from collections import OrderedDict
from typing import Sequence

import llama_cpp as lc
import numpy as np

from fairaudit.errors import AuditError

_QUIET = lc.llama_log_callback(lambda level, text, data: None)  # held for the process: llama.cpp calls it later


class KVFull(Exception):
    """No room in the KV cache for a batch (llama_decode returned 1); the cache is as it was before the call."""


class Engine:
    """A loaded GGUF model and its context; `feed` and `step` decode, `logits` rows come back as float32 arrays."""

    def __init__(self, gguf: str, n_ctx: int, n_batch: int, n_seq_max: int, n_threads: int, n_gpu_layers: int,
                 flash_attn: bool = False):
        lc.llama_log_set(_QUIET, ctypes.c_void_p(0))
        lc.llama_backend_init()
        model_params = lc.llama_model_default_params()
        model_params.n_gpu_layers = n_gpu_layers
        self.model = lc.llama_model_load_from_file(gguf.encode(), model_params)
        if not self.model:
            raise AuditError(f"llama.cpp could not load {gguf!r} (not a GGUF file of an architecture it knows?)")
        params = lc.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = n_ctx, n_batch, n_batch, n_seq_max
        params.n_threads = params.n_threads_batch = n_threads
        params.kv_unified = True  # one pool of cells shared by every sequence: prefixes are shared, not copied
        # Off, as llama-cpp-python's `Llama` has it: the CPU flash-attention kernel sums V in float16 in cell order,
        # so a read would depend on where its cells lie in the cache (up to ~1e-3 in a logit).
        params.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
        self.ctx = lc.llama_init_from_model(self.model, params)
        if not self.ctx:
            raise AuditError(f"llama.cpp could not make a context of n_ctx={n_ctx} for {gguf!r}")
        self.memory = lc.llama_get_memory(self.ctx)
        self.n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))
        self.n_ctx, self.n_batch, self.n_seq_max = lc.llama_n_ctx(self.ctx), n_batch, n_seq_max
        self.batch = lc.llama_batch_init(n_batch, 0, n_seq_max)
        self.residents: OrderedDict[int, tuple[int, ...]] = OrderedDict()  # seq id -> tokens held, least recent first
        self.counts = {"asked": 0, "reused": 0, "prefill_tokens": 0, "prefill_s": 0.0, "decode_tokens": 0, "decode_s": 0.0}

    def close(self) -> None:
        lc.llama_batch_free(self.batch)
        lc.llama_free(self.ctx)
        lc.llama_model_free(self.model)

    # --- decoding ------------------------------------------------------------------------

    def _decode(self, items: Sequence[tuple[int, int, Sequence[int], bool]]) -> list[np.ndarray]:
        """One llama_decode of at most n_batch (token, position, sequence ids, want logits) items; logits in item order."""
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
        return [np.ctypeslib.as_array(lc.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,)).copy()
                for i, item in enumerate(items) if item[3]]

    def _decode_all(self, items: list, keep: set[int]) -> list[np.ndarray]:
        """Items in chunks of n_batch; a chunk without room evicts the least recent residents outside `keep` and retries."""
        out: list[np.ndarray] = []
        for start in range(0, len(items), self.n_batch):
            chunk = items[start:start + self.n_batch]
            while True:
                try:
                    out += self._decode(chunk)
                    break
                except KVFull:
                    if not self._evict_one(keep):
                        raise AuditError(f"the llama.cpp KV cache (backend.n_ctx={self.n_ctx} tokens) cannot hold "
                                         f"{len(keep)} sequences at once; raise backend.n_ctx or lower backend.n_seq_max") from None
        return out

    def _evict_one(self, keep: set[int]) -> bool:
        for seq in self.residents:
            if seq not in keep:
                self.drop(seq)
                return True
        return False

    def drop(self, seq: int) -> None:
        lc.llama_memory_seq_rm(self.memory, seq, -1, -1)
        self.residents.pop(seq, None)

    # --- sequences -----------------------------------------------------------------------

    def _source(self, tokens: Sequence[int]) -> tuple[int | None, int]:
        """The resident sharing the longest prefix with `tokens`, and that prefix's length (at most len - 1:
        the last token is always fed, for its logits); (None, 0) when none shares a token."""
        wanted, best = np.asarray(tokens), (None, 0)
        for seq, held in self.residents.items():
            n = min(len(held), len(tokens) - 1)
            differ = np.flatnonzero(np.asarray(held[:n]) != wanted[:n])
            common = int(differ[0]) if len(differ) else n
            if common > best[1]:
                best = (seq, common)
        return best

    def _claim(self, count: int, sources: set[int]) -> list[int]:
        """`count` free sequence ids, evicting the least recent residents that are not `sources`."""
        while len(self.residents) + count > self.n_seq_max:
            if not self._evict_one(sources):
                raise AuditError(f"backend.n_seq_max={self.n_seq_max} is too small for {count} sequences at once")
        return [seq for seq in range(self.n_seq_max) if seq not in self.residents][:count]

    def feed(self, sequences: Sequence[Sequence[int]]) -> tuple[list[int], list[np.ndarray]]:
        """Hold each sequence under a sequence id of its own; returns the ids and the logits after each one's last token.

        A sequence's prefix held by a resident is copied, not computed; tokens that several of the sequences
        share (same tokens before them, same source) are computed once, as one token of several sequences.
        At most n_seq_max // 2 sequences: each may need a resident source beside it.
        """
        if any(len(s) == 0 for s in sequences):
            raise ValueError("llama.cpp cannot read after an empty sequence")
        start = time.perf_counter()
        sources = [self._source(s) for s in sequences]
        ids = self._claim(len(sequences), {src for src, _ in sources if src is not None})
        for seq, (src, common) in zip(ids, sources):
            if src is not None:
                lc.llama_memory_seq_cp(self.memory, src, seq, 0, common)
                self.residents.move_to_end(src)
        items, last = self._items(sequences, ids, sources)
        order = sorted(range(len(items)), key=lambda i: items[i][1])  # by position: each sequence's tokens in order
        rows = self._decode_all([items[i] for i in order], keep=set(ids))
        row_of = dict(zip([i for i in order if items[i][3]], rows))
        for seq, tokens in zip(ids, sequences):
            self.residents[seq] = list(tokens)
        self.counts["asked"] += sum(map(len, sequences))
        self.counts["reused"] += sum(map(len, sequences)) - len(items)
        self.counts["prefill_tokens"] += len(items)
        self.counts["prefill_s"] += time.perf_counter() - start
        return ids, [row_of[i] for i in last]

    @staticmethod
    def _items(sequences, ids, sources) -> tuple[list[list], list[int]]:
        """Batch items (token, position, sequence ids, want logits) of the tokens to compute, and each sequence's last item."""
        trie: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
        at: dict[tuple[int, int | None, int], int] = {}  # (node, source, copied length) -> item
        items: list[list] = []
        last = []
        for seq, tokens, (src, common) in zip(ids, sequences, sources):
            node = -1
            for position, token in enumerate(tokens):
                node = trie.setdefault((node, token), len(trie))
                if position < common:
                    continue
                key = (node, src, common)
                if key in at:
                    items[at[key]][2].append(seq)
                else:
                    at[key] = len(items)
                    items.append([token, position, [seq], False])
            items[at[key]][3] = True
            last.append(at[key])
        return items, last

    def step(self, seqs: Sequence[int], tokens: Sequence[int]) -> list[np.ndarray]:
        """Feed one token to each sequence at its next position; the logits after it, in order."""
        start = time.perf_counter()
        rows = self._decode_all([(t, len(self.residents[s]), (s,), True) for s, t in zip(seqs, tokens)], keep=set(seqs))
        for seq, token in zip(seqs, tokens):
            self.residents[seq].append(token)
            self.residents.move_to_end(seq)
        self.counts["decode_tokens"] += len(seqs)
        self.counts["decode_s"] += time.perf_counter() - start
        return rows

    def clear(self) -> None:
        """Empty the KV cache: the next sequences are computed from cold."""
        lc.llama_memory_clear(self.memory, True)
        self.residents.clear()
