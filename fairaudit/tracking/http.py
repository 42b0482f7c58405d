"""An MLflow tracking server over HTTP, bounded: each request waits TIMEOUT_S for an answer and is retried RETRIES
times (MLflow's own defaults wait minutes per request); while it retries, one line says so; a run closed after a
failure tries once, so a server that is gone costs seconds, not the retries again."""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Iterator

from fairaudit.errors.secrets import redact
from fairaudit.terminal.output import warn

TIMEOUT_S = 10  # MLFLOW_HTTP_REQUEST_TIMEOUT: the longest one request waits for an answer
RETRIES = 4  # MLFLOW_HTTP_REQUEST_MAX_RETRIES
BACKOFF = 1  # MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR: pauses of 1, 2, 4, 8 s between tries
JITTER = 0.5  # MLFLOW_HTTP_REQUEST_BACKOFF_JITTER: at most this much added to each pause
CLOSE_TIMEOUT_S = 5  # the one try to close a run after a failure
SETTINGS = {"MLFLOW_HTTP_REQUEST_TIMEOUT": TIMEOUT_S, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": RETRIES,
            "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": BACKOFF, "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": JITTER}


def is_http(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def setting(name: str) -> float:
    """One of SETTINGS as this process has it (a user's own value kept)."""
    return float(os.environ.get(name, SETTINGS[name]))


def retry_window_s() -> float:
    """The pauses between a refused request's tries: how long a restarting server has to come back."""
    retries = int(setting("MLFLOW_HTTP_REQUEST_MAX_RETRIES"))
    backoff, jitter = setting("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"), setting("MLFLOW_HTTP_REQUEST_BACKOFF_JITTER")
    return sum(backoff * 2 ** n + jitter for n in range(retries))


def request_bound_s() -> float:
    """The longest one request can take before it fails: every try timing out, and the pauses between them."""
    return (setting("MLFLOW_HTTP_REQUEST_MAX_RETRIES") + 1) * setting("MLFLOW_HTTP_REQUEST_TIMEOUT") \
        + retry_window_s()


def bound_requests(uri: str) -> None:
    """MLflow's HTTP requests to the server at `uri` bounded (SETTINGS; a user's own values kept), and its retries
    reported as one line while they go on."""
    if not is_http(uri):
        return
    for name, value in SETTINGS.items():
        os.environ.setdefault(name, str(value))
    logger = logging.getLogger("urllib3.connectionpool")
    if not any(isinstance(f, RetryLine) for f in logger.filters):
        logger.addFilter(RetryLine(uri))


class RetryLine(logging.Filter):
    """urllib3's "Retrying (...)" warnings, one per try, replaced by one line saying what is waited for."""

    def __init__(self, uri: str):
        super().__init__()
        self.uri, self.said = uri, False

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.getMessage().startswith("Retrying"):
            return True
        if not self.said:
            self.said = True
            warn(f"tracking.uri {redact(self.uri)} does not answer; trying again for up to {retry_window_s():.0f} s "
                 "(a server restarting), then the run stops with one line")
        return False


@contextlib.contextmanager
def one_try(uri: str) -> Iterator[None]:
    """MLflow's requests to an HTTP server made once, waiting CLOSE_TIMEOUT_S (closing a run after a failure)."""
    if not is_http(uri):
        yield
        return
    saved = {name: os.environ.get(name) for name in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT")}
    os.environ.update({"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": str(CLOSE_TIMEOUT_S)})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
