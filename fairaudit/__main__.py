"""`python -m fairaudit`: compose model x dataset x probe x arm with Hydra and run the audit."""

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from fairaudit import CONF_DIR, app
from fairaudit.console import run_or_exit


@hydra.main(version_base=None, config_path=CONF_DIR, config_name="config")
def main(cfg: DictConfig) -> None:
    if HydraConfig.get().mode == RunMode.MULTIRUN:
        app.run_sweep_job(cfg)  # a failing job is recorded and the sweep goes on; the exit code comes at its end
    else:
        run_or_exit(app.run, cfg)


if __name__ == "__main__":
    from fairaudit.cli import main as cli_main

    sys.exit(cli_main())
