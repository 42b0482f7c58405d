"""`python -m fairaudit.report`: a study's cross-run tables and figures from MLflow (config: conf/report.yaml)."""

import sys

import hydra
from omegaconf import DictConfig

from fairaudit import CONF_DIR
from fairaudit.catalog.registry import store_report_settings
from fairaudit.errors import AuditError
from fairaudit.report.studies import study_selection

store_report_settings()  # the probes' report settings (probes.<name>.<key>), before Hydra composes the config


@hydra.main(version_base=None, config_path=CONF_DIR, config_name="report")
def report(cfg: DictConfig) -> None:
    # imported here, once Hydra hands over a config: --help, --cfg and shell completion load no analysis code
    from fairaudit.report import app
    from fairaudit.terminal.task import run_or_exit

    run_or_exit(app.run, cfg)


def main() -> None:
    """The report on the command line's runs; +experiment=NAME, as a run takes it, selects that study's runs."""
    try:
        sys.argv = [sys.argv[0], *study_selection(sys.argv[1:])]
    except AuditError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    report()


if __name__ == "__main__":
    main()
