"""What store claims cost one process alone and save two that ask for the same calls at once.

    python benchmarks/claims.py [--calls 400] [--delay 0.01] [--chunks 1,8,64] [--store URL]

A model whose every call takes --delay seconds (a sleep: no CPU, so two processes do not slow each other down)
is asked for the same --calls calls through CachingClient, chunk by chunk: first by one process alone on an empty
store, then by two processes started together on another empty store (sqlite files in a temporary folder, or
databases a --store URL's server holds: each run drops and recreates the tables of the URL's database).

Per chunk size it prints: alone_s, the lone process's wall time, and overhead, alone_s over the model's own time
(calls x delay: 1.0 would be a free store); pair_s, the wall time until both of the pair are done; calls, the
model calls each of the pair made (they add up to --calls when no call is computed twice); and speedup,
alone_s / pair_s (2.0: the pair split the work evenly and waited for nothing).
"""

from __future__ import annotations

import argparse
import multiprocessing
import tempfile
import time
from pathlib import Path

from fairaudit.backends import Backend, Completion, GenerationRequest
from fairaudit.store.client import CachingClient
from fairaudit.store.results import Store


class SleepingModel(Backend):
    """Copies each prompt, `delay` seconds a call."""

    tokenizer = None
    fingerprint = "sleeping-copy"

    def __init__(self, delay: float):
        self.delay = delay

    def generate(self, requests):
        time.sleep(self.delay * len(requests))
        return [Completion(text=f"copy {r.prompt_ids[0]}", token_ids=r.prompt_ids, finish_reason="stop")
                for r in requests]


def ask(url: str, calls: int, delay: float, chunk: int, start, results) -> None:
    """One process: wait for `start`, ask for every call, report (model calls, seconds, whether the texts are right)."""
    client = CachingClient(SleepingModel(delay), Store(url), chunk_size=chunk)
    start.wait()
    began = time.perf_counter()
    texts = [c.text for c in client.generate([GenerationRequest(prompt_ids=(i,), max_new_tokens=1)
                                              for i in range(calls)], label=f"chunk {chunk}")]
    results.put((client.model_calls, time.perf_counter() - began, texts == [f"copy {i}" for i in range(calls)]))


def at_once(url: str, processes: int, calls: int, delay: float, chunk: int) -> tuple[list[int], float]:
    """`processes` forked processes asking for the same calls at once: each one's model calls, and the wall time
    until the last is done."""
    context = multiprocessing.get_context("fork")
    start, results = context.Event(), context.Queue()
    workers = [context.Process(target=ask, args=(url, calls, delay, chunk, start, results)) for _ in range(processes)]
    for worker in workers:
        worker.start()
    time.sleep(0.5)  # every one of them has opened the store
    start.set()
    done = [results.get(timeout=3600) for _ in workers]
    for worker in workers:
        worker.join()
    assert all(right for _, _, right in done), "a process got a wrong result"
    return [n for n, _, _ in done], max(seconds for _, seconds, _ in done)


def fresh_store(base: str | None, folder: Path, name: str) -> str:
    """An empty store: a sqlite file in `folder`, or `base`'s database with its tables dropped."""
    if base is None:
        return f"sqlite:///{folder}/{name}.sqlite"
    store = Store(base)
    with store.engine.begin() as conn:
        for table in ("results", "claims"):
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")
    store.close()
    return base


def measure(calls: int, delay: float, chunk: int, base: str | None = None) -> dict:
    """One row of the table (see the module docstring)."""
    with tempfile.TemporaryDirectory(prefix="fairaudit-claims-") as tmp:
        alone_url = fresh_store(base, Path(tmp), "alone")
        (alone,), alone_s = at_once(alone_url, 1, calls, delay, chunk)
        pair_url = fresh_store(base, Path(tmp), "pair")
        Store(pair_url).close()  # its tables exist before the race
        pair, pair_s = at_once(pair_url, 2, calls, delay, chunk)
    return {"chunk": chunk, "alone_s": alone_s, "overhead": alone_s / (calls * delay), "alone_calls": alone,
            "pair_s": pair_s, "calls": pair, "speedup": alone_s / pair_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--delay", type=float, default=0.01)
    parser.add_argument("--chunks", default="1,8,64")
    parser.add_argument("--store", default=None, help="a database URL (default: sqlite files in a temporary folder)")
    args = parser.parse_args()
    rows = [measure(args.calls, args.delay, int(chunk), args.store) for chunk in args.chunks.split(",")]
    print(f"{args.calls} calls of {args.delay * 1000:g} ms each on {args.store or 'sqlite'}")
    print("| chunk | alone_s | overhead | pair_s | calls | speedup |\n|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['chunk']} | {row['alone_s']:.2f} | {row['overhead']:.2f} | {row['pair_s']:.2f} | "
              f"{' + '.join(map(str, row['calls']))} | {row['speedup']:.2f} |")


if __name__ == "__main__":
    main()
