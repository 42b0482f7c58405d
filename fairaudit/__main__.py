"""`python -m fairaudit`: compose model x dataset x probe x arm with Hydra and run the audit."""

import sys

import hydra
from omegaconf import DictConfig

from fairaudit import app
from fairaudit.console import console
from fairaudit.errors import AuditError


@hydra.main(version_base=None, config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    try:
        app.run(cfg)
    except AuditError as error:
        console.print(f"[bold red]error:[/bold red] {error}", highlight=False, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
