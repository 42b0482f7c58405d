"""Which run follows which: the process that owns a run (so a later one can tell it died), runs of a job (or sweep)
a killed process left RUNNING closed KILLED by the next, ended runs superseded by a finished re-run, and the parent
run a sweep's jobs are children of."""

from __future__ import annotations

from pathlib import Path

from fairaudit.processes import identity, is_gone
from fairaudit.tracking.tags import KEY_TAG, PARENT_ID_FILE, PROCESS_TAGS, SUPERSEDED_TAG


def process_tags() -> dict[str, str]:
    """Which process owns a run, so a later run can tell that it died without closing it."""
    return dict(zip(PROCESS_TAGS, identity()))


def owner_is_dead(tags: dict[str, str]) -> bool:
    """The run's process is gone (`processes.is_gone`); runs owned by another host are left alone."""
    return is_gone(*(tags.get(name) for name in PROCESS_TAGS))


def close_stale_runs(client, experiment: str, key: str, successor: str) -> list[str]:
    """Runs of the same job (or sweep) left RUNNING by a dead process: closed KILLED, linked to `successor`."""
    stale = [run for run in client.search_runs([experiment],
                                               f"tags.`{KEY_TAG}` = '{key}' AND attributes.status = 'RUNNING'")
             if run.info.run_id != successor and owner_is_dead(run.data.tags)]
    for run in stale:
        client.set_tag(run.info.run_id, SUPERSEDED_TAG, successor)
        client.set_terminated(run.info.run_id, status="KILLED")
    return [run.info.run_id for run in stale]


def supersede_ended(client, experiment: str, key: str, successor: str) -> None:
    """Earlier ended runs (FINISHED or FAILED) of the job that `successor` just finished are marked
    replaced by it; the report skips them."""
    for run in client.search_runs([experiment], f"tags.`{KEY_TAG}` = '{key}' AND attributes.status != 'RUNNING'"):
        if run.info.run_id != successor and SUPERSEDED_TAG not in run.data.tags:
            client.set_tag(run.info.run_id, SUPERSEDED_TAG, successor)


def parent_run_id(sweep_dir: str | Path) -> str | None:
    """The sweep's parent run, written by SweepCallback when the multirun started."""
    path = Path(sweep_dir) / PARENT_ID_FILE
    return path.read_text().strip() if path.exists() else None
