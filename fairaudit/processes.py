"""Who a process is and whether it is gone: what a killed process left behind (a RUNNING MLflow run, a claim on
store calls) is taken over by the next process that finds it. The lowest layer: it imports nothing of fairaudit.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path


def start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (Linux), to tell a live pid from a reused one; "" when
    it cannot be read."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def identity() -> tuple[str, str, str]:
    """(host, pid, start time) of this process."""
    pid = os.getpid()
    return socket.gethostname(), str(pid), start_time(pid)


def is_gone(host: str | None, pid: str | None, started: str | None) -> bool:
    """The process (host, pid, start time) no longer runs: same host, and its pid is not running (or now belongs to
    another process). A process on another host is never called gone: its liveness cannot be seen from here."""
    if host != socket.gethostname() or not pid:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return bool(started) and start_time(int(pid)) != started


def parent_of(pid: int) -> int | None:
    """The process's parent pid (Linux), None when it is gone."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def descendants(pid: int) -> list[int]:
    """Every live process started by `pid`, its children's children too (Linux; zombies included until reaped)."""
    parents = {int(entry.name): parent_of(int(entry.name)) for entry in Path("/proc").iterdir() if entry.name.isdigit()}
    found, frontier = [], [pid]
    while frontier:
        frontier = [child for child, parent in parents.items() if parent in frontier]
        found += frontier
    return found
