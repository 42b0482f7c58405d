"""A full disk as one line: which folder is full, what fairaudit was writing there, how much space is free and how
much the failed write needed, and that what was committed is kept (the same command resumes once there is room)."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from fairaudit.errors import AuditError

FULL = ("database or disk is full", "no space left on device", "could not extend file", "disk quota exceeded")


def is_full(error: BaseException | None) -> bool:
    """The error, or one it was raised from or while handling, says the disk (or quota) is full."""
    return any(map(is_enospc, chain_of(error))) or any(phrase in failure_text(error) for phrase in FULL)


def chain_of(error: BaseException | None) -> list[BaseException]:
    """An error and those it was raised from or while handling (at most 20), as a traceback shows them: one raised
    `from None` (an AuditError that said it all) hides what it was handling."""
    found: list[BaseException] = []
    while error is not None and len(found) < 20:
        found.append(error)
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    return found


def failure_text(error: BaseException | None) -> str:
    """The messages of an error's chain, lowercased."""
    return " | ".join(str(e).lower() for e in chain_of(error))


def free_bytes(path: Path) -> int:
    """Free bytes on the filesystem holding `path` (or its nearest existing folder)."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def size_of(path: Path) -> int:
    """Bytes of a file, or of every file under a folder."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def megabytes(count: int) -> str:
    return f"{count / 1e6:,.1f} MB" if count >= 100_000 else f"{count / 1e3:,.1f} KB"


def full_error(folder: Path, what: str, need: str, kept: str) -> AuditError:
    """The one line: `folder` is full while writing `what`; `need` says how much that write needed."""
    return AuditError(f"no space left in {folder} ({what}): {megabytes(free_bytes(folder))} free, {need}; {kept}: "
                      "free space there (or point it elsewhere) and run the same command to resume")


def is_enospc(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)


def folder_of(uri: str) -> Path | None:
    """The local folder an artifact or file URI names, else None (a server's)."""
    if uri.startswith("file://"):
        return Path(uri[len("file://"):])
    return Path(uri) if "://" not in uri else None



def artifacts_full(error: BaseException, artifact_uri: str, writing: tuple[str, int]) -> AuditError | None:
    """The one line for a run whose artifact folder (or the temporary folder its files are written to first)
    filled mid-run; `writing`: what was being logged and its bytes. None for any other error."""
    import tempfile

    folder = folder_of(artifact_uri)
    if folder is None or not any(map(is_enospc, chain_of(error))):
        return None
    kept = "the results are in the store"
    if free_bytes(Path(tempfile.gettempdir())) < free_bytes(folder):
        return full_error(Path(tempfile.gettempdir()), "the temporary folder (TMPDIR) the run's files are written "
                          "to first", "room needed for the run's samples pages", kept)
    what, size = writing
    return full_error(folder, f"the run's artifacts{': ' + what if what else ''}",
                      f"{megabytes(size)} needed for it" if size else "room needed for them", kept)
