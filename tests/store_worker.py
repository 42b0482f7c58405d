"""One of several processes sharing a store: `python tests/store_worker.py URL GO_FILE LOG IDS...`.

Touches GO_FILE.<pid> once its store is open and waits for GO_FILE (so all start at once), asks for a
generation of each prompt id through CachingClient (chunks of $STORE_WORKER_CHUNK, default 2; each model call slow:
$STORE_WORKER_DELAY seconds, default 0.05; claims leased for $STORE_WORKER_LEASE seconds, default the store's), and
writes a JSON log: for every id it computed, when its last store read before that began; for every id it committed,
when the commit had finished; the texts it got, its model calls and how many of them another process had stored
meanwhile (`twice`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from fairaudit.backends import Backend, Completion, GenerationRequest
from fairaudit.store.client import CachingClient
from fairaudit.store.results import Store

DELAY = float(os.environ.get("STORE_WORKER_DELAY", "0.05"))
CHUNK = int(os.environ.get("STORE_WORKER_CHUNK", "2"))
LEASE = os.environ.get("STORE_WORKER_LEASE")


class TimedStore(Store):
    """The store, noting when each read began and when each write was committed."""

    read_started = 0.0
    committed: dict[str, float] = {}

    def get_many(self, keys):
        self.read_started = time.time()
        return super().get_many(keys)

    def put_many(self, kind, model, items, left=0):
        added = super().put_many(kind, model, items, left)
        self.committed.update({key: time.time() for key, _ in items})
        return added


class SlowModel(Backend):
    """Copies the prompt ids, DELAY seconds per item; notes what it computed and the read before it."""

    fingerprint = "slow-copy"
    tokenizer = None

    def __init__(self, store: TimedStore):
        self.store = store
        self.computed: list[tuple[int, float]] = []

    def generate(self, requests):
        out = []
        for r in requests:
            self.computed.append((r.prompt_ids[0], self.store.read_started))
            time.sleep(DELAY)
            out.append(Completion(text=f"copy {r.prompt_ids[0]}", token_ids=r.prompt_ids, finish_reason="stop"))
        return out


def main(url: str, go_file: str, log: str, ids: list[int]) -> None:
    store = TimedStore(url)
    if LEASE:
        store.claims.lease_s = float(LEASE)
    model = SlowModel(store)
    cached = CachingClient(model, store, chunk_size=CHUNK)
    Path(f"{go_file}.{os.getpid()}").touch()  # ready: imported, its store open
    while not Path(go_file).exists():
        time.sleep(0.01)
    texts = [c.text for c in cached.generate([GenerationRequest(prompt_ids=(i,), max_new_tokens=1) for i in ids])]
    Path(log).write_text(json.dumps({"computed": model.computed, "committed": store.committed, "texts": texts,
                                     "model_calls": cached.model_calls, "twice": cached.twice}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], [int(i) for i in sys.argv[4:]])
