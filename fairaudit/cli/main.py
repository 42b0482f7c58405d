"""The `fairaudit` command: `list`, `data`, `store` and `report` subcommands; anything else is a Hydra audit run."""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile

from fairaudit.cli.completion import complete
from fairaudit.cli.credentials import into_environment
from fairaudit.cli.hints import command_typo
from fairaudit.cli.listing import list_configs
from fairaudit.cli.overrides import MULTIRUN_FLAGS
from fairaudit.errors import AuditError
from fairaudit.errors.secrets import redact

CONFIG_PRINTS = ("--cfg", "-c", "--info", "-i")  # Hydra's options that print the config and run nothing
HELP = """\
fairaudit: audit reasoning language models for bias that appears, moves or grows inside their thinking.

usage:
  fairaudit [OVERRIDES...] [-m]       run an audit (Hydra): model=... dataset=... probe=... arm=...; -m sweeps
                                      e.g. fairaudit model=qwen3 -m dataset=adult,compas,credit
  fairaudit dry_run=true [OVERRIDES]  print the prompts (and pairs) a run would send, without loading a model
  fairaudit plan [OVERRIDES] [-m]     a run's or study's prompts, tokens, calls, time and tests' power, before any
                                      weights load: plan.effect.*=... names the effects, plan.pilot=0.05 runs a pilot
  fairaudit list                      the models, datasets, probes, arms and studies (+experiment=NAME)
  fairaudit data fetch [NAMES...]     download the data sets into the data root and verify their checksums
  fairaudit data check                per data file: present, checksum, source
  fairaudit store ...                 inspect and maintain the result store (fairaudit store --help)
  fairaudit report [OVERRIDES...]     a study's cross-run tables and figures from MLflow
  fairaudit check backend=NAME        hold a backend (yours too, once installed) to the backend contract

Hydra's own options work on audit runs: --cfg job (print the composed config), --info, --hydra-help,
--shell-completion install=bash (eval "$(fairaudit -sc install=bash)" completes subcommands, their options
and overrides). Each run prints its verdict and metrics, then the mlflow ui command and the run's URL.
"""


PLAN_HELP = """\
usage: fairaudit plan [OVERRIDES...] [-m]
  The run or study the same overrides describe (+experiment=NAME, -m sweeps), planned before any weights load:
  per job its prompts and their tokens, model calls and the store's share of them, new tokens read and generated,
  time on the accelerators of conf/plan/default.yaml (and here, with a pilot), and each probe's tests' power.
  Nothing is logged or written (plan.csv=FILE: the jobs' table also as CSV). Settings (plan.KEY=VALUE):
  plan.effect.*   the effects tests are sized at (c_b_ratio, discordant, p_gap, cdpg_slope, length_rho, ...)
  plan.pilot      e.g. 0.05: run that share of each job on the model first (through the store), project the rest
  plan.correction holm | bh | none; plan.power, plan.alpha, plan.sample, plan.exact_prompts, plan.csv
  docs/studies.md "Plan before you spend" says how each number is counted.
"""


def hoist_multirun_flag(argv: list[str]) -> list[str]:
    """`-m`/`--multirun` moved before the overrides: Hydra 1.3's argparse rejects overrides on
    both sides of it (hydra issue 3053), as in `probe=position -m arm=direct,cot`."""
    flags = [arg for arg in argv[1:] if arg in MULTIRUN_FLAGS]
    return argv[:1] + flags + [arg for arg in argv[1:] if arg not in MULTIRUN_FLAGS]


def data_command(argv: list[str]) -> int:
    from fairaudit.data.fetch import main as data_main

    return data_main(argv)


def store_command(argv: list[str]) -> int:
    """`fairaudit store`: delegated to fairaudit.store.cli, imported only when asked for."""
    from fairaudit.store.cli import main as store_main

    return store_main(argv)


def hydra_command(module: str, argv: list[str], config_name: str = "config") -> int:
    """Run a Hydra app (`python -m <module>`) with `argv` as its command line, once its overrides are
    checked: an unknown option or key is one `error:` line with the nearest names, exit code 2."""
    import importlib

    from fairaudit.cli.overrides import check, sweeps_itself, tracking_database
    from fairaudit.errors.secrets import redact_override_dirname

    problem = check(config_name, argv)
    if problem:
        print(redact(f"error: {problem}"), file=sys.stderr)
        return 2
    if config_name == "config" and not prints_config(argv) and nothing_to_sweep(argv):
        print("note: -m with nothing to sweep: this is a single job (sweep with key=a,b or key=range(0,3), or run "
              "a study: +experiment=NAME)", file=sys.stderr)
    argv = tracking_database((["-m"] if config_name == "config" and sweeps_itself(argv) else []) + argv)
    argv = argv if prints_config(argv) else into_environment(argv)
    redact_override_dirname()
    with scratch_outputs(argv) as argv, redacted_printout(argv):
        sys.argv = hoist_multirun_flag([sys.argv[0]] + argv)
        importlib.import_module(module).main()
    return 0


def nothing_to_sweep(argv: list[str]) -> bool:
    """`-m` with no list, range or sweeping study among the overrides: Hydra runs it as one job."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from fairaudit.cli.overrides import sweeps_itself

    if not any(a in MULTIRUN_FLAGS for a in argv):
        return False
    args = [a for a in argv if not a.startswith("-")]
    swept = any(o.is_sweep_override() or o.key_or_group.startswith("hydra.sweeper.params")
                for o in OverridesParser.create().parse_overrides(args))
    return not swept and not sweeps_itself(args)


def version() -> str:
    """fairaudit's version, then the Hydra it runs on."""
    import hydra

    from fairaudit import __version__

    return f"fairaudit {__version__} (Hydra {hydra.__version__})"


def prints_config(argv: list[str]) -> bool:
    """The command prints its config and runs nothing (--cfg job, --info): nothing written, no credential moved."""
    return any(arg in CONFIG_PRINTS or arg.startswith(("--cfg=", "--info=")) for arg in argv)


@contextlib.contextmanager
def redacted_printout(argv: list[str]):
    """Hydra's --cfg and --info print the composed config themselves: what they print passes through `redact`."""
    if not prints_config(argv):
        yield
        return
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            yield
    finally:
        sys.stdout.write(redact(printed.getvalue()))


@contextlib.contextmanager
def scratch_outputs(argv: list[str]):
    """A dry run's Hydra output folders in a temporary folder, removed when it ends: a dry run writes nothing."""
    from fairaudit.cli.overrides import dry_run_asked

    if not dry_run_asked(argv):
        yield argv
        return
    with tempfile.TemporaryDirectory(prefix="fairaudit-dry-run-") as tmp:
        kept = [a for a in argv if not a.startswith(("hydra.run.dir=", "hydra.sweep.dir="))]
        yield [*kept, f"hydra.run.dir={tmp}/run", f"hydra.sweep.dir={tmp}/sweep"]


def plan_command(argv: list[str]) -> int:
    """`fairaudit plan`: its overrides checked as a run's are, then the grid planned (`fairaudit.plan.study`)."""
    from fairaudit.cli.overrides import check
    from fairaudit.plan.rehearsal import PLAN
    from fairaudit.plan.study import main as plan_main

    if any(arg in ("-h", "--help") for arg in argv):
        print(PLAN_HELP, end="")
        return 0
    problem = check("config", [PLAN, *argv])
    if problem:
        print(redact(f"error: {problem}"), file=sys.stderr)
        return 2
    return plan_main(into_environment([arg for arg in argv if arg not in MULTIRUN_FLAGS]))


def report_command(argv: list[str]) -> int:
    """`fairaudit report`: a study named as a run names it (+experiment=NAME) read as where its runs are."""
    from fairaudit.report.studies import study_selection

    return hydra_command("fairaudit.report.__main__", study_selection(argv), "report")


def check_command(argv: list[str]) -> int:
    """`fairaudit check backend=NAME`: the backend held to the contract's checks (`fairaudit.conformance`)."""
    from fairaudit.conformance.command import main as check_main

    return check_main(argv)


COMMANDS = {"list": list_configs, "data": data_command, "store": store_command, "plan": plan_command,
            "report": report_command, "check": check_command}


def dispatch(argv: list[str]) -> int:
    """A subcommand, or else a Hydra audit run (a word near a subcommand's name: one line naming it)."""
    if argv and argv[0] in COMMANDS:
        return COMMANDS[argv[0]](argv[1:])
    typo = command_typo(argv[0], list(COMMANDS)) if argv else None
    if typo:
        print(f"error: {typo}", file=sys.stderr)
        return 2
    return hydra_command("fairaudit.job.__main__", argv)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `fairaudit` console script."""
    from fairaudit.errors import interrupt
    from fairaudit.errors.secrets import redact_logs, remember, remember_environment

    argv = sys.argv[1:] if argv is None else argv
    remember(argv)  # hidden in whatever this process prints or logs, as the environment's credentials are
    remember_environment()
    redact_logs()
    if argv and argv[0] in ("-h", "--help", "help"):
        print(HELP, end="")
        return 0
    if argv and argv[0] in ("--version", "-V"):
        print(version())
        return 0
    if argv[:2] in (["-sc", "query=bash"], ["--shell-completion", "query=bash"]):
        return complete(argv, list(COMMANDS))
    interrupt.arm()
    try:
        return dispatch(argv)
    except AuditError as error:  # a setting outside the overrides, e.g. a $FAIRAUDIT_PATH folder that is gone
        print(redact(f"error: {error}"), file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # outside a run (a run says what it kept itself), e.g. a parallel sweep's launcher
        interrupt.settle()  # a parallel sweep's jobs all ended, its runs closed KILLED
        print(interrupt.message(None), file=sys.stderr)
        return interrupt.exit_code()


if __name__ == "__main__":
    sys.exit(main())
