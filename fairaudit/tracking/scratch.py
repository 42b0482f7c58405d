"""Temporary folders a job writes files into before MLflow copies them away (tables, records, sample pages).

Each is named by its process's id, so one a killed job left behind (at paper size hundreds of MB) is known for
a leftover once that process is gone and is removed by the next job that asks for a scratch folder."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

PREFIX = "fairaudit-scratch-"  # then the owning process's id, a dash and tempfile's random part


@contextlib.contextmanager
def scratch() -> Iterator[Path]:
    """A temporary folder of this process, removed on the way out; leftovers of dead processes removed first."""
    for stale in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        pid = stale.name[len(PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not _running(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix=f"{PREFIX}{os.getpid()}-") as folder:
        yield Path(folder)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        pass
    return True
