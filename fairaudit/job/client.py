"""The job's model behind its store: the backend built on the model's folder and the caching client every model
call of the run goes through."""

from __future__ import annotations

from pathlib import Path

from fairaudit.backends import Backend
from fairaudit.job.config import Job
from fairaudit.store.client import CachingClient
from fairaudit.store.results import Store


def build_backend(job: Job, model_dir: Path) -> Backend:
    """The job's backend on its model's folder (`job.source.folder()`); the constructor reads only what names the model:
    weights load on the first model call. Under store.batch_keyed a backend that is not batch-invariant stores its
    results under its batch size too (`/batch<N>` after its fingerprint), so each batch size computes its own."""
    backend = job.backend_class(model_dir=str(model_dir), dtype=job.model["dtype"],
                                batch_size=job.model["batch_size"], **job.backend_settings)
    if job.batch_keyed and not backend.batch_invariant:
        backend.fingerprint = f"{backend.fingerprint}/batch{job.model['batch_size']}"
    return backend


def open_client(job: Job) -> tuple[Store, Backend, CachingClient]:
    """The job's store, backend and the client between them: the model's files checked first, then the store opened
    (a database server that refuses: one line before the backend reads the model)."""
    model_dir = job.source.folder()  # its files checked before anything opens
    store = Store(job.store_url)
    backend = build_backend(job, model_dir)
    return store, backend, CachingClient(backend, store, chunk_size=job.model["batch_size"])
