"""The experiment's jobs view (`ui.jobs_view_state`), saved again whenever a job finishes, so the page every run
and sweep prints opens readable: each job's whole name, the grid's axes and the headline metrics of the newest run
of each probe as columns."""

from __future__ import annotations

import json

from fairaudit.tracking import tags as t
from fairaudit.tracking.sweeps import shown_metrics
from fairaudit.tracking.ui import JOBS_VIEW, jobs_view_state, save_view_state

SHOWN_AXES = ("model", "dataset", "probe", "arm")  # always columns; seed and checkpoint where the jobs vary them
MAX_METRICS = 12   # metric columns
RECENT = 200       # the newest job runs the columns are chosen from


def refresh_jobs_view(client, experiment_id: str) -> str:
    """The experiment's jobs view saved from its newest job runs; returns its key."""
    runs = client.search_runs([experiment_id], f"tags.`{t.KIND_TAG}` = 'job'", max_results=RECENT,
                              order_by=["attributes.start_time DESC"])
    axes = [*SHOWN_AXES, *(a for a in t.AXIS_TAGS if a not in SHOWN_AXES
                           and len({run.data.tags.get(a) for run in runs}) > 1)]
    metrics, probes = [], set()
    for run in runs:  # the newest run of each probe names its headline metrics
        probe = run.data.tags.get("probe")
        if probe not in probes:
            probes.add(probe)
            metrics += [m for m in shown_metrics(json.loads(run.data.tags.get(t.HEADLINE_TAG, "[]")))
                        if m not in metrics]
    longest = max((len(run.info.run_name or "") for run in runs), default=0)
    state = jobs_view_state(axes, metrics[:MAX_METRICS], longest)
    return save_view_state(client, experiment_id, JOBS_VIEW, "fairaudit: every job, side by side", state)
