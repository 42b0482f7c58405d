"""`python -m fairaudit`: compose model x dataset x probe x arm with Hydra and run the audit."""

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from fairaudit import CONF_DIR, app
from fairaudit.console import run_or_exit

MULTIRUN_FLAGS = ("-m", "--multirun")


def hoist_multirun_flag(argv: list[str]) -> list[str]:
    """`-m`/`--multirun` moved before the overrides: Hydra 1.3's argparse rejects overrides on
    both sides of it (hydra issue 3053), as in `probe=position -m arm=direct,cot`."""
    flags = [arg for arg in argv[1:] if arg in MULTIRUN_FLAGS]
    return argv[:1] + flags + [arg for arg in argv[1:] if arg not in MULTIRUN_FLAGS]


@hydra.main(version_base=None, config_path=CONF_DIR, config_name="config")
def main(cfg: DictConfig) -> None:
    if HydraConfig.get().mode == RunMode.MULTIRUN:
        app.run_sweep_job(cfg)  # a failing job is recorded and the sweep goes on; the exit code comes at its end
    else:
        run_or_exit(app.run, cfg)


if __name__ == "__main__":
    from fairaudit.cli import main as cli_main

    sys.exit(cli_main())
