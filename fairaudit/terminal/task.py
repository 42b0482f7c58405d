"""How a Hydra task ends (`run_or_exit`): bad input is one `error:` line and exit code 2 (its empty output folder
removed), Ctrl-C (SIGTERM, SIGHUP) one line saying what is kept and how to resume; anything else its traceback and
its line."""

from __future__ import annotations

import sys
from typing import Any, Callable

from fairaudit.errors import interrupt
from fairaudit.errors.secrets import redact_hydra_files
from fairaudit.terminal.output import print_failure, print_line, quiet_libraries


def run_or_exit(job: Callable[[Any], object], cfg: Any) -> None:
    """Run a Hydra task; bad input (an AuditError, also inside Hydra's instantiate) becomes one
    `error:` line and exit code 2; Ctrl-C (SIGTERM, SIGHUP) one line saying what is kept and how to resume, exit
    code 128 + the signal. Anything else is a bug: its traceback, then its one `error:` line, exit code 1 (secrets
    hidden in both; the task never raises, so Hydra never prints its own line, which repeats the command line)."""
    quiet_libraries()
    try:
        redact_hydra_files(cfg)
        job(cfg)
    except KeyboardInterrupt as stop:
        print_line(interrupt.message(getattr(stop, "kept", 0)))
        sys.exit(interrupt.exit_code())
    except Exception as error:
        code = print_failure(error)
        if code == 2:
            discard_output_dir()
        sys.exit(code)


def discard_output_dir() -> None:
    """A rejected run's Hydra output folder removed when it holds only Hydra's own files (.hydra/, the job's log),
    with the dated folders above it that this leaves empty, up to the working folder: a typo leaves nothing."""
    import os
    import shutil
    from pathlib import Path

    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return
    hydra_cfg = HydraConfig.get()
    folder, cwd = Path(hydra_cfg.runtime.output_dir), Path(os.getcwd())
    own = {".hydra", f"{hydra_cfg.job.name}.log"}
    if folder == cwd or not folder.is_dir() or any(p.name not in own for p in folder.iterdir()):
        return
    shutil.rmtree(folder)
    for parent in folder.parents:
        if parent == cwd or not parent.is_relative_to(cwd) or any(parent.iterdir()):
            break
        parent.rmdir()
