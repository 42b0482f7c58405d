"""What a plan's work costs in time: token counts and throughputs in, seconds out, and durations as people read them.

Pure arithmetic. An accelerator's time is an estimate read off published throughputs of one reference model
(`plan.accelerators`): generated tokens at its decode rate plus read tokens at its prefill rate, both scaled by the
reference model's weight size over this model's (a large batch's step reads the weights once, so throughput falls
about as they grow). It says how many hours a study is, within a factor of about two, not which engine to pick.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

UNITS = ((86400.0, "d"), (3600.0, "h"), (60.0, "min"), (1.0, "s"))


def accelerator_seconds(read_tokens: float, generated_tokens: float, speeds: Mapping[str, float],
                        weights_gb: float) -> float:
    """Seconds one accelerator of `speeds` (decode, prefill: tokens/s of a reference_gb model) needs for the work."""
    scale = max(float(weights_gb), 1e-9) / float(speeds["reference_gb"])
    return scale * (generated_tokens / float(speeds["decode"]) + read_tokens / float(speeds["prefill"]))


def per_unit_seconds(seconds: float, units: float) -> float:
    """Seconds one unit took, NaN without units."""
    return seconds / units if units else math.nan


def format_duration(seconds: float) -> str:
    """e.g. "2 h 05 min", "14 min 10 s", "3.2 s", "< 0.1 s" (never a 0.0 s that is not 0); n/a for NaN."""
    if seconds is None or math.isnan(seconds):
        return "n/a"
    if 0 < seconds < 0.05:
        return "< 0.1 s"
    if seconds < 59.95:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    for (size, name), (smaller, label) in zip(UNITS, UNITS[1:]):
        if whole >= size:
            return f"{int(whole // size)} {name} {int(whole % size // smaller):02d} {label}"
    return f"{whole} s"


def whole_jobs_wall(seconds: Sequence[float], gpus: int) -> float:
    """Wall time of jobs that each run whole on one of `gpus` accelerators, longest first onto the one free
    soonest (the time a sweep's launcher takes when it starts a job wherever one is free)."""
    ends = [0.0] * max(int(gpus), 1)
    for job in sorted(seconds, reverse=True):
        ends[ends.index(min(ends))] += job
    return max(ends)


def split_jobs_wall(seconds: Sequence[float], gpus: int, load_seconds: float = 0.0) -> float:
    """Wall time of the same jobs with each split over every accelerator (`job.workers`): their work shared evenly,
    each worker paying `load_seconds` (loading the model) per job."""
    return sum(seconds) / max(int(gpus), 1) + load_seconds * len(seconds)


def gpu_hours(wall_seconds: float, gpus: int) -> float:
    """What renting `gpus` accelerators for `wall_seconds` costs in accelerator-hours (idle ones included)."""
    return wall_seconds * max(int(gpus), 1) / 3600.0
