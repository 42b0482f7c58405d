"""Hydra's output folder checked before Hydra writes into it (its .hydra/*.yaml, the job's log): a folder that cannot
be created or written, or a disk without room, is one `error:` line and exit code 2, not Hydra's traceback."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from fairaudit.errors.disk import free_bytes, is_enospc, megabytes
from fairaudit.job.preflight import ends_the_command, exit_on

ROOM = 1 << 20  # free bytes an output folder must have: Hydra writes about 20 KB a job, its log grows with the run


class OutputsCallback(Callback):
    """Hydra callback: the run's (or sweep's) output folder is writable and has room, before Hydra writes to it."""

    @ends_the_command
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        exit_on([p for p in [output_problem(folder_of(config, "hydra.run.dir"), "hydra.run.dir")] if p])

    @ends_the_command
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        exit_on([p for p in [output_problem(folder_of(config, "hydra.sweep.dir"), "hydra.sweep.dir")] if p])


def folder_of(config: DictConfig, key: str) -> Path:
    """The folder a Hydra config's `key` names, resolved as Hydra resolves it."""
    HydraConfig.instance().set_config(config)  # its ${now:...} and ${hydra:...} resolve
    return Path(str(OmegaConf.select(config, key))).absolute()


def output_problem(folder: Path, key: str) -> str | None:
    """The one line for `folder` (what `key` names) when it cannot be created, written or has less than ROOM free. The
    folders this check created are removed again, each only while it is empty (Hydra creates them when a job
    starts), so a later refusal leaves none and a run started beside it under the same new parent keeps its own."""
    created: list[Path] = []
    problem = None
    try:
        writable(folder, created)
    except OSError as error:
        problem = (f"{key}: no space left in {folder}: free space there or" if is_enospc(error) else
                   f"{key}: cannot write Hydra's output folder {folder} ({error.strerror or error}):")
    if problem is None and free_bytes(folder) < ROOM:
        problem = f"{key}: no space left in {folder} ({megabytes(free_bytes(folder))} free): free space there or"
    for made in reversed(created):
        with contextlib.suppress(OSError):  # not empty: another run's folder is in it now
            made.rmdir()
    return problem and f"{problem} choose another folder ({key}=/path/to/folder); nothing was run"


def writable(folder: Path, created: list[Path], tries: int = 5) -> None:
    """`folder` created (each folder made here added to `created`) and a block written and synced in it. A parent
    that a check beside this one removed between two steps (it was empty then) is made again."""
    for attempt in range(tries):
        try:
            for path in [*reversed(folder.parents), folder]:
                with contextlib.suppress(FileExistsError):
                    path.mkdir()
                    created.append(path)
            with tempfile.NamedTemporaryFile(dir=folder, prefix=".fairaudit-write-") as probe:
                probe.write(bytes(4096))
                probe.flush()
                os.fsync(probe.fileno())
            return
        except FileNotFoundError:
            if attempt == tries - 1:
                raise
