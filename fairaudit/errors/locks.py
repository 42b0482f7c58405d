"""A sqlite database another process keeps locked, as one line: which file, which process holds it (read from
/proc/locks on Linux), how long fairaudit waited and what to do."""

from __future__ import annotations

import os
from pathlib import Path

from fairaudit.errors import AuditError
from fairaudit.errors.disk import failure_text

LOCK_WAIT_S = 30  # how long a write waits for a lock another process holds before it is one line
LOCKED = ("database is locked", "database table is locked")


def is_locked(error: BaseException | None) -> bool:
    """The error, or one in its chain, is sqlite's "database is locked" (its wait for the lock ran out)."""
    return any(phrase in failure_text(error) for phrase in LOCKED)


def holders(path: Path) -> list[str]:
    """The other processes holding a lock on the database at `path` or its WAL index (`-shm`), writers first, each as
    "pid N (its command line)"; empty where /proc/locks is not there or names none (another host's, over NFS)."""
    inodes = {}
    for file in (Path(path), Path(f"{path}-shm")):
        try:
            inodes[str(file.stat().st_ino)] = file
        except OSError:
            pass
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    found: dict[int, bool] = {}
    for fields in (line.split() for line in lines):
        if len(fields) >= 8 and fields[5].rsplit(":", 1)[-1] in inodes and fields[4].isdigit():
            pid = int(fields[4])
            if pid != os.getpid():
                found[pid] = found.get(pid, False) or fields[3] == "WRITE"
    return [f"pid {pid} ({_command(pid)})" for pid in sorted(found, key=lambda p: (not found[p], p))]


def _command(pid: int) -> str:
    from fairaudit.errors.secrets import redact

    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    except OSError:
        return "gone since"
    line = redact(" ".join(" ".join(arg.decode(errors="replace").split()) for arg in argv))
    return line if len(line) <= 100 else line[:97] + "..."


def locked_error(path: Path, what: str, kept: str) -> AuditError:
    """The one line for `what` (e.g. "the store, store.url") at `path`, locked by another process past the wait."""
    held = holders(path)
    who = f"by {', '.join(held)}" if held else "by another process"
    return AuditError(f"{path} ({what}) stayed locked {who} for {LOCK_WAIT_S} s: let it finish or stop it, "
                      f"then run the same command again; {kept}")
