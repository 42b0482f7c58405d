"""`python -m fairaudit.report`: a study's cross-run tables and figures from MLflow (config: conf/report.yaml)."""

import hydra
from omegaconf import DictConfig

from fairaudit import CONF_DIR
from fairaudit.catalog.registry import store_report_settings
from fairaudit.report import app
from fairaudit.terminal.task import run_or_exit

store_report_settings()  # the probes' report settings (probes.<name>.<key>), before Hydra composes the config


@hydra.main(version_base=None, config_path=CONF_DIR, config_name="report")
def main(cfg: DictConfig) -> None:
    run_or_exit(app.run, cfg)


if __name__ == "__main__":
    main()
