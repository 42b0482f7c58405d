"""`python -m fairaudit.report`: a study's cross-run tables and figures from MLflow (config: conf/report.yaml)."""

import sys

import hydra
from omegaconf import DictConfig

from fairaudit.console import console
from fairaudit.errors import AuditError
from fairaudit.report import app


@hydra.main(version_base=None, config_path="../../conf", config_name="report")
def main(cfg: DictConfig) -> None:
    try:
        app.run(cfg)
    except AuditError as error:
        console.print(f"[bold red]error:[/bold red] {error}", highlight=False, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
