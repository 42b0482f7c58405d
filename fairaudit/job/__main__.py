"""The audit as a Hydra app (`python -m fairaudit.job`; the `fairaudit` command runs it once its overrides are checked):
compose model x dataset x probe x arm and run the job, or a sweep's jobs one by one."""

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from fairaudit import CONF_DIR


@hydra.main(version_base=None, config_path=CONF_DIR, config_name="config")
def main(cfg: DictConfig) -> None:
    # imported here, once Hydra hands over a config: --help, --cfg and shell completion load no analysis or model code
    from fairaudit.job.run import run
    from fairaudit.job.sweep import run_sweep_job
    from fairaudit.terminal.task import run_or_exit

    if HydraConfig.get().mode == RunMode.MULTIRUN:
        run_sweep_job(cfg)  # a failing job is recorded and the sweep goes on; the exit code comes at its end
    else:
        run_or_exit(run, cfg)


if __name__ == "__main__":
    from fairaudit.errors.secrets import redact_override_dirname

    redact_override_dirname()  # as the `fairaudit` command does: folders named by overrides show no secret
    main()
