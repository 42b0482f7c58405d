"""Who a process is and whether it is gone: what a killed process left behind (a RUNNING MLflow run, a claim on
store calls) is taken over by the next process that finds it. The lowest layer: it imports nothing of fairaudit.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path


def stat_fields(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command's name (state first, start time 20th); [] when it cannot be
    read (Linux only)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (Linux), to tell a live pid from a reused one; "" when
    it cannot be read."""
    fields = stat_fields(pid)
    return fields[19] if len(fields) > 19 else ""


def identity() -> tuple[str, str, str]:
    """(host, pid, start time) of this process."""
    pid = os.getpid()
    return socket.gethostname(), str(pid), start_time(pid)


def is_gone(host: str | None, pid: str | None, started: str | None) -> bool:
    """The process (host, pid, start time) no longer runs: same host, and its pid is not running, is a zombie (it
    exited, its parent has not reaped it) or now belongs to another process. A process on another host is never
    called gone: its liveness cannot be seen from here."""
    if host != socket.gethostname() or not pid:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's process
        return is_zombie(int(pid))
    return is_zombie(int(pid)) or (bool(started) and start_time(int(pid)) != started)


def is_zombie(pid: int) -> bool:
    """The process has exited and waits for its parent to reap it (state Z, or X while it is being reaped)."""
    return stat_fields(pid)[:1] in (["Z"], ["X"])


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
