"""`fairaudit plan`: what a run or a study would ask of a model and whether its tests can show the effects named,
told before any weights load; nothing is logged.

The same overrides as a run compose the same grid (a study's own sweep, -m), checked as a sweep checks it. Per job:
- its prompts rendered by the model's tokenizer as the dry run renders them: their exact count and tokens (Qwen3's
  tokenizer stands in, said so, where the model's is not here);
- its probe rehearsed on `plan.sample` units against a `CensusClient` (the rehearsal backend answers, the store is
  read): the calls a run makes and their tokens, scaled to the job's units; a call the store or an earlier job of the
  plan holds is served, not counted as work;
- with `plan.pilot`, that share of its units first run on the real model through the store (`pilot`): its trace
  lengths, rates and seconds per token replace the assumed ones;
- its probe's tests (`Probe.planned_tests`) sized at `plan.effect.*` under the report's family correction (`tests`).
"""

from __future__ import annotations

import json
import math
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf

from fairaudit.catalog import registry
from fairaudit.errors import AuditError
from fairaudit.job.client import build_backend
from fairaudit.job.config import Job, Place, read_job
from fairaudit.job.preflight import GridJob, data_line, dataset_key, each_job, one_line, repeats, value_line
from fairaudit.models.files import ModelMissing
from fairaudit.models.locate import hub_cache_only, tiny_qwen3_dir
from fairaudit.probes import AuditContext, ProbeResult
from fairaudit.store.census import CensusClient, Tally
from fairaudit.store.results import Store

REHEARSAL_BOOT = 100  # resamples of a rehearsal's analyses (its results are discarded)
PLAN = "+plan=default"  # the plan's own settings (conf/plan/default.yaml), which a run never has
PLACES = ("plan", "store", "tracking", "hydra", "home", "data", "dry_run")
FAMILIES = {"mcq": ["A", "B", "C", "D"], "decision": ["Yes", "No"]}  # what the rehearsal answers, by data family


@dataclass(frozen=True)
class Hand:
    """What the plan has of a job's model without its weights: the tokenizer that renders its prompts and the folder
    it is read from, the fingerprint a run stores results under when its files are here (else None: nothing stored
    can be matched), and what stands in for a tokenizer that is not here ("" when none does)."""

    tokenizer: Any
    folder: Path
    fingerprint: str | None
    stand_in: str = ""


@dataclass
class Pilot:
    """A pilot run of a job: its result, and the mean trace length and share of traces the budget cut among the grid
    arm's records (None where they have none)."""

    result: ProbeResult
    trace_tokens: float | None
    truncated: float | None


@dataclass
class Work:
    """A job's calls at its full units, by kind: asked, served (by an earlier job of the plan or the store), new, and
    the new calls' tokens (read, generated) and cuts (answers read along traces)."""

    asked: Counter = field(default_factory=Counter)
    served: Counter = field(default_factory=Counter)
    new: Counter = field(default_factory=Counter)
    read_tokens: Counter = field(default_factory=Counter)
    generated_tokens: Counter = field(default_factory=Counter)
    cuts: Counter = field(default_factory=Counter)

    def stored_share(self) -> float:
        """The share of the job's calls that no model computes for it (stored, or asked first by another job)."""
        asked = sum(self.asked.values())
        return sum(self.served.values()) / asked if asked else math.nan


def job_work(tally: Tally, scale: float, stored_rows: Mapping[str, int] | None, fill: float | None) -> Work:
    """The rehearsal's tally at the job's units. What the store holds is the sample's stored share, at most every
    stored row of the model's kind (`stored_rows`): the sample is a prefix of the job's draw, as a pilot's units are,
    so a store that holds a pilot holds the sample whole but not the job. Generated tokens: each generation's budget
    (max_new_tokens) times `fill`, the share of it a pilot's generations wrote, else all of it (an upper bound)."""
    work = Work()
    for kind, asked in tally.asked.items():
        own = tally.own(kind) * scale
        stored = tally.stored[kind] * scale
        if stored_rows is not None:
            stored = min(stored, stored_rows.get(kind, 0))
        work.asked[kind], work.new[kind] = asked * scale, own - stored
        work.served[kind] = work.asked[kind] - work.new[kind]
        per_call = work.new[kind] / tally.own(kind) if tally.own(kind) else 0.0
        work.read_tokens[kind] = tally.read_tokens[kind] * per_call
        work.generated_tokens[kind] = tally.budget_tokens[kind] * (1.0 if fill is None else fill) * per_call
        work.cuts[kind] = tally.cuts[kind] * per_call
    return work


@dataclass
class JobPlan:
    """One job as planned: its units, prompts and tokens, its calls at its units, its pilot if one ran."""

    job: Job
    label: str
    hand: Hand
    units: int
    prompts: int
    prompt_tokens: int
    tokens_exact: bool
    work: Work
    trace_tokens: float
    trace_source: str
    pilot: Pilot | None = None
    seconds_here: float = math.nan
    time_source: str | None = None  # whose rates timed it (`Speeds.rates`); None: none did
    refused: str | None = None  # why its rehearsal counted nothing as stored (Planner.rehearsed); None: it did not


def compose(overrides: list[str]) -> tuple[DictConfig, list[GridJob]]:
    """The plan's config and every job of its grid, composed as a sweep composes them (a single run: one job)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from fairaudit import CONF_DIR

    with initialize_config_dir(CONF_DIR, version_base=None):
        try:
            config = GlobalHydra.instance().config_loader().load_configuration("config", [PLAN, *overrides],
                                                                                RunMode.MULTIRUN)
            HydraConfig.instance().set_config(config)  # ${hydra:runtime.cwd} in store.url resolves
            jobs = grid_jobs_without_plan(config)
        finally:
            GlobalHydra.instance().clear()
    return config, jobs


def grid_jobs_without_plan(config: DictConfig) -> list[GridJob]:
    """The grid's jobs as a dry run reads them (no engine needed to plan), their `plan` node left out."""
    from fairaudit.job.grid import job_label
    from fairaudit.job.preflight import grid_jobs

    jobs = []
    for job in grid_jobs(config):
        own = OmegaConf.masked_copy(job.config, [key for key in job.config if key != "plan"])
        overrides = [o for o in job.overrides if o != PLAN]
        own.dry_run = True
        label = job_label(config.hydra, overrides) or " ".join(o for o in overrides if not placing(o)) or "the run"
        jobs.append(GridJob(job.num, overrides, label, own, job.choices))
    return jobs


def placing(override: str) -> bool:
    """An override that says where things go or how the plan reads, not what the job is (left out of its label)."""
    return override.lstrip("+~").split("=", 1)[0].split(".", 1)[0] in PLACES


def read_grid(jobs: list[GridJob]) -> tuple[list[str], list[Job]]:
    """(problems, jobs): what a sweep's checks refuse before anything loads (values, a job twice, settings and fit,
    the data), each one line; else every job read as a run reads it (`read_job`), jobs that draw the same data set
    sharing it (its rows read once)."""
    problems = each_job(jobs, value_line) or repeats(jobs)
    read_in: dict[int, Job] = {}

    def read(job: GridJob) -> None:
        read_in[job.num] = read_job(job.config, Place(job.choices, job.overrides, [], None, job.num), here=False)
    problems = problems or each_job(jobs, one_line(read)) or each_job(jobs, data_line, dataset_key)
    if problems:
        return problems, []
    datasets: dict[str, Any] = {}
    for job in read_in.values():
        job.dataset = datasets.setdefault(json_key(job.settings["dataset"]), job.dataset)
    return [], [read_in[job.num] for job in jobs]


def model_at_hand(job: Job) -> Hand:
    """The job's tokenizer, from the folder a dry run renders with when it is here (nothing downloaded: a GGUF model's
    tokenizer is in its weights' file), else Qwen3's standing in; and its fingerprint."""
    try:
        with hub_cache_only():
            folder = job.source.folder(weights=False)
        return Hand(job.backend_class.load_tokenizer(folder, job.backend_settings), folder, fingerprint_here(job))
    except (AuditError, OSError, ValueError) as error:
        from fairaudit.backends.common import folder_tokenizer

        folder = tiny_qwen3_dir()
        why = "its files are not here" if isinstance(error, ModelMissing) else " ".join(str(error).split())
        return Hand(folder_tokenizer(str(folder)), folder, None,
                    f"{why} (`fairaudit dry_run=true model={job.settings['model']['name']}` says how to get them): "
                    "Qwen3's tokenizer stands in")


def plan_fingerprint(job: Job) -> str:
    """What keys a model's calls in a plan when its files are not here: its settings under its backend's (so two
    models never share a call, and nothing stored can match)."""
    import hashlib

    return "plan-only/" + hashlib.sha256(engine_key(job).encode()).hexdigest()[:16]


def fingerprint_here(job: Job) -> str | None:
    """The fingerprint a run of the job stores its results under, when its model's files are here already (nothing
    downloaded, no weights loaded: a backend's constructor reads what names the model); None otherwise."""
    try:
        with hub_cache_only():
            backend = build_backend(job, job.source.folder())
    except Exception:  # files not here, an engine not installed here: nothing stored can be matched
        return None
    fingerprint = backend.fingerprint
    backend.close()
    return fingerprint


def prompt_census(job: Job, hand: Hand, most: int | None) -> tuple[int, int, bool]:
    """(prompts, their tokens, exact): the prompts the probe sends first over all the job's units, rendered as the dry
    run renders them and tokenized; with more than `most` prompts, those of a prefix of the units' draw (itself a
    random draw) holding about `most`, scaled to all (exact False)."""
    from fairaudit.backends.common import encode_texts

    def census(dataset) -> tuple[int, int]:
        prompts = job.probe.prompts(AuditContext(None, hand.tokenizer, job.spec, dataset, job.arm))
        return len(prompts), sum(map(len, encode_texts(hand.tokenizer, [p.text for p in prompts])))

    units = job_units(job)
    first = sample_dataset(job, 2)
    per_unit = len(first.messages()) / (first.n or 2)
    if most is None or units * per_unit <= most:
        return (*census(job.dataset), True)
    part = sample_dataset(job, max(2, int(most / per_unit)))
    prompts, tokens = census(part)
    return round(prompts * units / part.n), round(tokens * units / part.n), False


def job_units(job: Job) -> int:
    """The units (pairs, questions, traces) the job draws: dataset.n, or every question of a file (n null)."""
    if job.dataset.n is not None:
        return job.dataset.n
    return len(job.dataset.messages()) // max(1, len(sample_dataset(job, 1).messages()))


def census_key(job: Job) -> str:
    """Jobs that send the same first prompts share a census: model, data set, and the probe's prompts and arms."""
    arms = [vars(arm) for arm in job.probe.arms(job.arm)]
    parts = [job.settings["model"], job.settings["dataset"], type(job.probe).prompts.__qualname__, arms]
    return json_key(parts)


def json_key(value) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def engine_key(job: Job) -> str:
    """The job's model under its backend and settings: what its tokenizer, fingerprint and speed belong to."""
    return json_key([job.backend_name, job.backend_settings, job.settings["model"]])


def rehearsal_backend(job: Job, hand: Hand, trace_tokens: float):
    """The registry's rehearsal backend (no model) on the job's tokenizer, writing traces of `trace_tokens` tokens."""
    rehearsal = next(cls for cls in registry.backend_classes().values() if cls.rehearsal)
    length = max(1, int(round(trace_tokens)))
    dataset, model = job.settings["dataset"], job.settings["model"]
    return rehearsal(hand.folder, trace_tokens={"distribution": "fixed", "median": length, "low": 1, "high": length},
                     answers=FAMILIES[job.probe.needs.family], thinking=model["thinking"],
                     protected=[dataset.get("alpha"), dataset.get("alpha_prime")], answer_prefix=model["answer_prefix"])


def sample_dataset(job: Job, units: int):
    """The job's data set drawn with `units` units: a prefix of its own draw (`n` larger draws extend smaller ones),
    sharing the rows it read (a copy with another `n`); the data set itself when it draws no more."""
    import copy

    if job.dataset.n is not None and units >= job.dataset.n:
        return job.dataset
    job.dataset.check()  # reads its rows once, before the copy shares them
    small = copy.copy(job.dataset)
    small.n = units
    return small


def rehearse(job: Job, hand: Hand, sample: int, trace_tokens: float, store: Store | None, met: dict,
             encoded: dict) -> tuple[Tally, float, int]:
    """The job's probe run on `sample` units against a `CensusClient` (`met` and `encoded` shared by the plan's jobs):
    its tally, the factor from the sample to the job's units, and the job's units. Its analyses resample
    `REHEARSAL_BOOT` times (a probe's calls never depend on its `n_boot`)."""
    import matplotlib.pyplot as plt

    small, units = sample_dataset(job, sample), job_units(job)
    client = CensusClient(rehearsal_backend(job, hand, trace_tokens), store, hand.fingerprint or plan_fingerprint(job),
                          met, looks_up=hand.fingerprint is not None, encoded=encoded)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the rehearsal's answers are the mock's: their statistics mean nothing
        rehearsal_probe(job).run(AuditContext(client, hand.tokenizer, job.spec, small, job.arm))
    plt.close("all")
    return client.tally, units / small.n, units


def rehearsal_probe(job: Job):
    """The job's probe, resampling REHEARSAL_BOOT times where it resamples at all."""
    from fairaudit.job.config import build_probe

    settings = job.settings["probe"]
    return build_probe({**settings, "n_boot": REHEARSAL_BOOT}) if "n_boot" in settings else job.probe


def run_pilot(job: Job, share: float, backend, store: Store):
    """`share` of the job's units (at least 2) run on its model's `backend` through the store: what it measured of
    trace lengths and rates (a `Pilot`), and its `TimedClient`, whose timings `speeds.Speeds.add` pools."""
    from fairaudit.store.census import TimedClient

    dataset = sample_dataset(job, max(2, math.ceil(share * job_units(job))))
    client = TimedClient(backend, store, chunk_size=job.model["batch_size"])
    result = job.probe.run(AuditContext(client, backend.tokenizer, job.spec, dataset, job.arm))
    records = result.records[job.probe.samples.frame]
    mine = records[records["arm"] == job.arm.name] if "arm" in records else records
    measured = {column: float(mine[column].mean()) if column in mine and len(mine) else None
                for column in ("trace_tokens", "truncated")}
    return Pilot(result, measured["trace_tokens"], measured["truncated"]), client
