"""`python -m fairaudit`: compose model x dataset x probe x arm with Hydra and run the audit."""

import sys

import hydra
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
    run_or_exit(app.run, cfg)


if __name__ == "__main__":
    from fairaudit.cli import main as cli_main

    sys.exit(cli_main())
