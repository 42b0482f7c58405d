"""`fairaudit report +experiment=NAME`: the study's runs, found where a run of that study logs them (the MLflow
experiment its `tracking.experiment` names), so a report takes a study the way a run does."""

from __future__ import annotations

from fairaudit.catalog import registry
from fairaudit.errors import AuditError

STUDY = "+experiment="


def study_selection(argv: list[str]) -> list[str]:
    """`argv` with `+experiment=NAME` (a shipped or outside study) read as `select.experiment=<the MLflow experiment
    its runs log to>`: the study's `tracking.experiment`, or a `tracking.experiment=` given beside it, as in a run.
    A name no config root holds is left for the override check, which names the nearest."""
    studies = [arg for arg in argv if arg.startswith(STUDY) and arg[len(STUDY):] in registry.names("experiment")]
    if not studies:
        return argv
    if len(studies) > 1 or any(arg.startswith("select.experiment=") for arg in argv):
        raise AuditError(f"{' and '.join([*studies, *(a for a in argv if a.startswith('select.experiment='))])}: "
                         "a report reads one study; give +experiment=NAME alone (or select.experiment=[A,B] for "
                         "several MLflow experiments)")
    (study,) = studies
    experiment = next((arg.split("=", 1)[1] for arg in argv if arg.startswith("tracking.experiment=")), None)
    experiment = experiment or study_experiment(study[len(STUDY):])
    return [f"select.experiment={experiment}" if arg == study else arg for arg in argv]


def study_experiment(name: str) -> str:
    """The MLflow experiment a study's runs log to (its `tracking.experiment`); one line when it names none."""
    experiment = (registry.settings("experiment", name).get("tracking") or {}).get("experiment")
    if not isinstance(experiment, str) or "${" in experiment:
        raise AuditError(f"+experiment={name}: the study names no MLflow experiment of its own (tracking.experiment), "
                         "so its runs cannot be told from others' by it; report its sweep with "
                         "select.sweep_dir=multirun/... or select.parent=RUN_ID (the id its sweep printed)")
    return experiment


def study_logging_to(experiment: str) -> str | None:
    """The study whose runs log to MLflow experiment `experiment` (its `tracking.experiment`), if one does."""
    for name in registry.names("experiment"):
        logged = (registry.settings("experiment", name).get("tracking") or {}).get("experiment")
        if logged == experiment:
            return name
    return None
