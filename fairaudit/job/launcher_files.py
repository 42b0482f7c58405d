"""A launcher's own files kept private: submitit's folder (`hydra.launcher.submitit_folder`: each job's pickled
call and config, its result and its logs) is made 0700 before the sweep writes there, and its files 0600, the
result pickle as it is written."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

PRIVATE_FOLDER, PRIVATE_FILE = 0o700, 0o600


class PrivateLauncherFiles(Callback):
    """Hydra callback: the sweep's parent makes submitit's folder 0700; each submitit job makes the files there
    0600 as it starts, and writes its result pickle 0600 (umask 077 once the job's own work is done)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        folder = launcher_folder(config)
        if folder is not None:
            folder.mkdir(mode=PRIVATE_FOLDER, parents=True, exist_ok=True)
            folder.chmod(PRIVATE_FOLDER)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        folder = launcher_folder(config)
        if folder is not None:
            private_files(folder)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if os.environ.get("SUBMITIT_FOLDER"):
            private_files(Path(os.environ["SUBMITIT_FOLDER"]))

    def on_job_end(self, config: DictConfig, **kwargs: Any) -> None:
        if os.environ.get("SUBMITIT_FOLDER"):
            os.umask(0o077)  # submitit pickles the job's result after this, in this process, which then ends


def launcher_folder(config: DictConfig) -> Path | None:
    """The folder above every job's files of a submitit launcher (`<sweep dir>/.submitit` for
    `<sweep dir>/.submitit/%j`); None for a launcher without one."""
    launcher = config.hydra.get("launcher") or {}
    pattern = launcher.get("submitit_folder") if hasattr(launcher, "get") else None
    if not pattern:
        return None
    parts = Path(str(pattern)).parts
    fixed = parts[:next((num for num, part in enumerate(parts) if "%" in part), len(parts))]
    return Path(*fixed) if fixed else None


def private_files(folder: Path) -> None:
    """Every file under `folder` made 0600, every folder 0700 (one that vanished meanwhile is skipped)."""
    for path in [folder, *folder.rglob("*")]:
        try:
            path.chmod(PRIVATE_FOLDER if path.is_dir() else PRIVATE_FILE)
        except OSError:
            continue
