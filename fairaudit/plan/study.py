"""`fairaudit plan`'s command: the grid composed and checked, each job planned (`rehearsal`), then on stdout one table
of the jobs' work and time, one of the time on the documented accelerators, one of the tests' power; the jobs' table
also as CSV where `plan.csv` names a file. Nothing is logged; only a pilot (`plan.pilot`) loads weights and writes to
the store."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import pandas as pd
from omegaconf import OmegaConf

from fairaudit.analysis import power
from fairaudit.analysis.cost import (
    accelerator_seconds,
    format_duration,
    gpu_hours,
    split_jobs_wall,
    whole_jobs_wall,
)
from fairaudit.analysis.numbers import format_number
from fairaudit.catalog import registry
from fairaudit.errors import AuditError
from fairaudit.errors.rules import check_fields, integer, list_of, number, one_of, optional, text
from fairaudit.job.client import build_backend
from fairaudit.job.config import Job
from fairaudit.plan.rehearsal import (
    JobPlan,
    census_key,
    compose,
    engine_key,
    job_work,
    json_key,
    model_at_hand,
    prompt_census,
    read_grid,
    rehearse,
    run_pilot,
)
from fairaudit.plan.speeds import Speeds, load_speeds, save_speeds
from fairaudit.store.results import Store
from fairaudit.terminal.output import console, print_error
from fairaudit.terminal.progress import progress
from fairaudit.terminal.results import print_result, summary_frame_table

CALL_KINDS = ("generate", "choice_probs", "depth_choice_probs", "target_nll")  # the store's kinds of model call
RULES = {"sample": integer(2), "exact_prompts": optional(integer(1)), "pilot": optional(number(0, 1, lo_open=True)),
         "csv": optional(text()), "speeds": optional(text()), "gpus": list_of(integer(1), nonempty=False),
         "load_s": number(0),
         "alpha": number(0, 0.5, lo_open=True), "correction": one_of(*power.CORRECTIONS),
         "family": optional(list_of(text(), nonempty=False)), "power": number(0, 0.999, lo_open=True)}


def effect_in(low: float | None, high: float | None, what: str, high_in: bool = False):
    """A plan.effect value above `low` and below `high` (or at it, `high_in`; None: no bound), `what` it is said in
    the error."""
    def check(value) -> str | None:
        fine = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and \
            (low is None or value > low) and (high is None or value < high or (high_in and value == high))
        return None if fine else f"must be {what}"
    return check


EFFECTS = {  # the shipped probes' effects (a researcher's probe may read keys of its own, unchecked here)
    "c_b_ratio": effect_in(0, None, "a number > 0 (flips created per flip resolved; 1 is no effect)"),
    "discordant": effect_in(0, 1, "a share in (0, 1] (of the pairs, in cell b or c)", high_in=True),
    "p_gap": effect_in(None, None, "a finite number"), "cdpg_slope": effect_in(None, None, "a finite number"),
    **{key: effect_in(0, None, "a number > 0 (a standard deviation)") for key in ("p_gap_sd", "cdpg_slope_sd")},
    "length_rho": effect_in(-1, 1, "a correlation in (-1, 1)"),
    "influence_rate": effect_in(0, 1, "a rate in (0, 1)"),
    "influence_width": effect_in(0, 1, "a width in (0, 1]", high_in=True),
}


def check_plan(settings: dict) -> None:
    """plan.* values of the right kinds, the shipped probes' effects among them (accelerators are read where they
    are used)."""
    check_fields("plan", {key: settings[key] for key in RULES} | {"effect": settings["effect"]},
                 RULES | {f"effect.{key}": check for key, check in EFFECTS.items()})


def open_store(url: str, pilot: bool) -> Store | None:
    """The result store, read to count what it holds; None when a sqlite file is not there (nothing stored) and no
    pilot is to write to it (a plan creates nothing)."""
    sqlite_file = url.removeprefix("sqlite:///") if url.startswith("sqlite:///") or "://" not in url else None
    if sqlite_file is not None and not Path(sqlite_file).exists() and not pilot:
        return None
    return Store(url)


def trace_length(plan_pilot, arm) -> tuple[float, str]:
    """The trace length the rehearsal writes, and where it comes from: a pilot's mean, else the arm's budget less one
    (every trace assumed to finish within it: an upper bound)."""
    if plan_pilot is not None and plan_pilot.trace_tokens:
        cut = "" if plan_pilot.truncated is None else f", {plan_pilot.truncated:.0%} cut by the budget"
        return min(plan_pilot.trace_tokens, arm.max_new_tokens - 1), f"the pilot's mean{cut}"
    return max(arm.max_new_tokens - 1, 1), "budget (upper bound)"


class Planner:
    """Plans the jobs of one grid, sharing across them what they share: each model's tokenizer and fingerprint, each
    prompt set's census, the calls met so far, the store, and this machine's timed speeds."""

    def __init__(self, settings: dict, store: Store | None):
        self.settings, self.store = settings, store
        self.speeds = Speeds(load_speeds(settings["speeds"]))
        self.met: dict = {}
        self.encoded: dict = {}
        self.hands: dict = {}
        self.censuses: dict = {}
        self.rows: dict = {}

    def stored_rows(self, fingerprint: str | None) -> dict[str, int] | None:
        """The store's rows of one model by call kind (None: no store, or the model's files are not here)."""
        if self.store is None or fingerprint is None:
            return None
        if fingerprint not in self.rows:
            self.rows[fingerprint] = {kind: self.store.count(kind, fingerprint) for kind in CALL_KINDS}
        return self.rows[fingerprint]

    def pilots(self, jobs: list) -> dict:
        """Each job's pilot (plan.pilot of its units on the real model, through the store), by its place; each model
        loaded once, for all the jobs that ask it."""
        found, backends = {}, {}
        try:
            with progress("pilot", total=len(jobs)) as advance:
                for num, (job, _) in enumerate(jobs):
                    key = engine_key(job)
                    if key not in backends:
                        backends[key] = build_backend(job, job.source.folder())
                    found[num], timed = run_pilot(job, self.settings["pilot"], backends[key], self.store)
                    self.speeds.add(job, timed)
                    advance(1)
        finally:
            for backend in backends.values():
                backend.close()
        return found

    def plan(self, job, label: str, pilot) -> JobPlan:
        """One job's plan: its model at hand, its prompts' census, its rehearsal, its time here."""
        hand_key = engine_key(job)
        if hand_key not in self.hands:
            self.hands[hand_key] = model_at_hand(job)
        key = census_key(job)
        if key not in self.censuses:
            self.censuses[key] = prompt_census(job, self.hands[hand_key], self.settings["exact_prompts"])
        trace, source = trace_length(pilot, job.arm)
        hand = self.hands[hand_key]
        (tally, scale, units), refused = self.rehearsed(job, hand, trace)
        work = job_work(tally, scale, self.stored_rows(hand.fingerprint), self.speeds.fill(job))
        plan = JobPlan(job, label, hand, units, *self.censuses[key], work, trace, source, pilot, refused=refused)
        plan.seconds_here = self.speeds.seconds_for(job, work)
        plan.time_source = self.speeds.rates(job)[2]
        return plan


    def rehearsed(self, job, hand, trace: float) -> tuple[tuple, str | None]:
        """`rehearse`'s (tally, scale, units), and None; or, where the probe's own checks refused the store's
        results mixed with the rehearsal's stand-in answers (a depth read of the mock's against a stored P(Yes) of
        the model's), the rehearsal again on the stand-in alone, nothing counted as stored, and the check's line."""
        known = set(self.met)
        try:
            return rehearse(job, hand, self.settings["sample"], trace, self.store, self.met, self.encoded), None
        except AuditError as error:
            if self.store is None:
                raise
            for added in set(self.met) - known:  # the mixed answers serve no later job
                del self.met[added]
            alone = rehearse(job, hand, self.settings["sample"], trace, None, {}, self.encoded)
            return alone, str(error).splitlines()[0]


def plan_jobs(jobs: list[Job], labels: list[str], settings: dict) -> list[JobPlan]:
    """Every job planned: pilots first (so their results and timings serve the rest), then each job's census."""
    read_in = list(zip(jobs, labels))
    store = open_store(read_in[0][0].store_url, bool(settings["pilot"]))
    planner = Planner(settings, store)
    try:
        pilots = planner.pilots(read_in) if settings["pilot"] else {}
        save_speeds(settings["speeds"], planner.speeds)
        with progress("plan", total=len(read_in)) as advance:
            plans = []
            for num, (job, label) in enumerate(read_in):
                plans.append(planner.plan(job, label, pilots.get(num)))
                advance(1)
    finally:
        if store is not None:
            store.close()
    return plans


def jobs_frame(plans: list[JobPlan], accelerators: dict) -> pd.DataFrame:
    """One row per job: units, prompts and their tokens, calls (asked, served, new), new tokens, time here and on each
    accelerator (seconds)."""
    rows = []
    for plan in plans:
        work = plan.work
        read, made = sum(work.read_tokens.values()), sum(work.generated_tokens.values())
        row = {"job": plan.label, "units": plan.units, "prompts": plan.prompts, "prompt_tokens": plan.prompt_tokens,
               "calls": round(sum(work.asked.values())), "stored_share": work.stored_share(),
               "new_calls": round(sum(work.new.values())), "read_tokens": round(read), "generated_tokens": round(made),
               "depth_reads": round(sum(work.cuts.values())), "trace_tokens": plan.trace_tokens,
               "seconds_here": plan.seconds_here}
        weights = float(plan.job.settings["model"].get("weights_gb") or math.nan)
        row |= {f"seconds_{name}": accelerator_seconds(read, made, speeds, weights)
                for name, speeds in accelerators.items()}
        rows.append(row)
    return pd.DataFrame(rows)


class Rule(NamedTuple):
    """How the report decides a test: its replicates' p combined, then `correction` over `tests` hypotheses at
    `alpha`; `alike`: every hypothesis of the family planned at the same units, effect and replicates
    (`power.decided_power`)."""

    replicates: int
    tests: int
    alpha: float
    correction: str
    alike: bool = True

    def power(self, test, units: int) -> tuple[float, bool]:
        """(power, exact) of `test` at `units` under this rule."""
        return power.decided_power(lambda level: test.power(units, level), self.replicates, self.tests, self.alpha,
                                   self.correction, self.alike)

    def says(self) -> str:
        """The rule in words, for the method column ("" for a lone test at alpha)."""
        if self.tests == 1 and self.replicates == 1:
            return ""
        k = math.ceil(self.replicates / 2)
        seeds = (f"{self.replicates} replicates combined ({format_number(self.replicates / k)} x their "
                 f"{'lower ' if self.replicates % 2 == 0 else ''}median p), " if self.replicates > 1 else "")
        return f"; decided as the report does: {seeds}{self.correction} over {self.tests} hypotheses"


def test_rows(plans: list[JobPlan], settings: dict) -> pd.DataFrame:
    """One row per planned test of each job: its power (or an interval's expected width) at the job's units and the
    units each job needs for `plan.power` (or the width wanted). A test of the family (`planned_family`) is sized as
    the report decides it (`Rule`): the hypothesis's replicate jobs (seeds, engines) combined, then the family
    correction over one test per hypothesis and metric; `level` is then Bonferroni's alpha / m, Holm's first step."""
    tests = [(plan, test) for plan in plans
             for test in plan.job.probe.planned_tests(plan.job.arm, settings["effect"],
                                                      plan.pilot.result if plan.pilot else None)]
    in_family = planned_family(plans, settings["family"])
    family = Counter((hypothesis(plan.job), test.metric) for plan, test in tests if test.metric in in_family)
    alike = len({(int(plan.units * test.share), test.effect, family[(hypothesis(plan.job), test.metric)])
                 for plan, test in tests if test.metric in in_family}) <= 1
    rows, known = [], {}  # a family's alike tests are sized once
    for plan, test in tests:
        corrected = test.metric in in_family
        rule = Rule(family[(hypothesis(plan.job), test.metric)], len(family), settings["alpha"],
                    settings["correction"], alike) if corrected else Rule(1, 1, settings["alpha"], "none")
        level = power.family_alpha(settings["alpha"], rule.tests, rule.correction)
        key = (test.name, test.effect, test.method, test.share, plan.units, rule)
        if key not in known:
            known[key] = sized(test, plan.units, rule, settings)
        rows.append({"job": plan.label, "test": test.name, "effect": test.effect, "method": test.method + rule.says(),
                     "level": level, "replicates": rule.replicates, "n": int(plan.units * test.share), **known[key]})
    return pd.DataFrame(rows)


def planned_family(plans: list[JobPlan], family: list[str] | None) -> set[str]:
    """The metrics whose tests are corrected together: `plan.family`, or (null) the family the report corrects for
    the planned probes (`report.family` of conf/report.yaml, else what each probe declares as its `report.family`)."""
    if family is not None:
        return set(family)
    return set(registry.report_family({plan.job.probe_name for plan in plans})["metrics"])


def hypothesis(job: Job) -> str:
    """The cell a test belongs to as the report counts it (model x dataset x probe x arm x checkpoint): a job's seeds
    and engines repeat one hypothesis, their p-values combined into one test (docs/studies.md, Multiple comparisons)."""
    model = job.settings["model"]
    return json_key([model["name"], model["checkpoint"]["label"], job.dataset.name, job.probe_name, job.arm.name])


def sized(test, units: int, rule: Rule, settings: dict) -> dict:
    """A test's power under `rule` (an interval's width) at `units` and the units that reach `plan.power` (the width
    wanted); `exact` false where the power is a lower bound."""
    n = int(units * test.share)
    if test.power is not None:
        need = power.pairs_for_power(lambda k: rule.power(test, k)[0], settings["power"], smallest=2)
        found, exact = rule.power(test, n)
        return {"power": found, "exact": exact, "width": math.nan,
                "units_needed": math.ceil(need / test.share) if need and test.share else None}
    need = power.first_n(lambda k: test.width(k) <= test.target_width, smallest=2)
    return {"power": math.nan, "exact": True, "width": test.width(n) if n else math.nan,
            "units_needed": math.ceil(need / test.share) if need and test.share else None}


def show(plans: list[JobPlan], frame: pd.DataFrame, tests: pd.DataFrame, accelerators: dict,
         gpus: list[int] = (), load_s: float = 0.0) -> None:
    """The tables on stdout, with what stands in for what under them."""
    print_result(summary_frame_table("plan: the work each job asks of its model", work_table(plans, frame),
                                     notes_of(plans)))
    times = pd.DataFrame([{"accelerator": name, "time (estimate)": format_duration(frame[f"seconds_{name}"].sum()),
                           "source": speeds["source"]} for name, speeds in accelerators.items()])
    print_result(summary_frame_table("plan: the whole grid on one accelerator", times))
    if gpus:
        print_result(summary_frame_table("plan: the grid on several accelerators, jobs whole or split over them "
                                         "(job.workers)", rented_table(frame, accelerators, gpus, load_s)))
    if len(tests):
        print_result(summary_frame_table("plan: each test at the planned units", tests_table(tests)))
    else:
        console.print("plan: no probe of this grid declares a test to size")


def rented_table(frame: pd.DataFrame, accelerators: dict, gpus: list[int], load_s: float) -> pd.DataFrame:
    """Per accelerator and count: the grid's wall time and accelerator-hours with each job whole on one of them (a
    sweep's launcher), and with each job split over all of them (`job.workers`, each worker loading the model once
    per job in `load_s`)."""
    rows = []
    for name in accelerators:
        seconds = frame[f"seconds_{name}"].tolist()
        for count in gpus:
            whole, split = whole_jobs_wall(seconds, count), split_jobs_wall(seconds, count, load_s)
            rows.append({"accelerator": name, "count": count, "wall, jobs whole": format_duration(whole),
                         "hours, jobs whole": format_number(gpu_hours(whole, count)),
                         "wall, jobs split": format_duration(split),
                         "hours, jobs split": format_number(gpu_hours(split, count))})
    return pd.DataFrame(rows)


def work_table(plans: list[JobPlan], frame: pd.DataFrame) -> pd.DataFrame:
    """The jobs' work as shown, a total row under it (prompts that jobs share counted once; time here n/a unless a
    pilot, this plan's or a saved one, timed every job's model)."""
    columns = ["job", "units", "prompts", "prompt_tokens", "calls", "stored_share", "new_calls", "read_tokens",
               "generated_tokens", "depth_reads", "seconds_here"]
    shown = frame[columns].copy()
    firsts = ~pd.Series([census_key(plan.job) for plan in plans]).duplicated().to_numpy()
    total = {column: shown[column].sum(skipna=column != "seconds_here") for column in columns[1:]
             if column != "stored_share"}
    total |= {"prompts": shown["prompts"][firsts].sum(), "prompt_tokens": shown["prompt_tokens"][firsts].sum()}
    shown = pd.concat([shown, pd.DataFrame([{"job": "total", **total}])], ignore_index=True)
    shown["seconds_here"] = [format_duration(t) if t == t else "n/a: run a pilot" for t in shown["seconds_here"]]
    return shown.rename(columns={"seconds_here": "time here"})


def tests_table(tests: pd.DataFrame) -> pd.DataFrame:
    """The tests as shown: power, or an interval's expected width, as one column."""
    shown = tests.copy()
    shown["power"] = [f"width {format_number(w)}" if math.isnan(p) else format_number(p) if exact
                      else f"at least {format_number(p)}" for p, w, exact in zip(shown["power"], shown["width"],
                                                                                   shown["exact"])]
    return shown[["job", "test", "effect", "level", "replicates", "n", "power", "units_needed", "method"]]


def notes_of(plans: list[JobPlan]) -> list[str]:
    """What stands in for what: tokenizers not here, prompt tokens counted on a part, trace lengths assumed."""
    notes = sorted({f"{plan.job.settings['model']['name']}: {plan.hand.stand_in}" for plan in plans
                    if plan.hand.stand_in})
    if not all(plan.tokens_exact for plan in plans):
        notes.append("prompt tokens: a job with over plan.exact_prompts prompts counted on a random part of its units, "
                     "scaled")
    thinking = [plan for plan in plans if plan.job.arm.think and plan.job.arm in plan.job.arms]
    notes += sorted({f"{plan.job.settings['model']['name']}, arm {plan.job.arm.name}: traces of "
                     f"{plan.trace_tokens:.0f} tokens ({plan.trace_source})" for plan in thinking})
    if any(plan.pilot is None for plan in plans):
        notes.append("generated tokens: each generation's whole budget (max_new_tokens), an upper bound")
    notes += sorted({f"{plan.job.settings['model']['name']} on {plan.job.backend_name}: time here at the rates "
                     f"{plan.time_source} timed" for plan in plans if plan.time_source and plan.pilot is None})
    notes += [f"{plan.label or 'the job'}: counted as if nothing were stored, since the probe's checks refused "
              f"the store's results beside the rehearsal's stand-in answers ({plan.refused})"
              for plan in plans if plan.refused]
    if any(plan.time_source is None for plan in plans):
        notes.append("time here: n/a for a model no pilot has timed on this machine (plan.pilot=0.05 runs a share of "
                     "each job on the model, times it, and saves its rates to plan.speeds for later plans)")
    return notes


def main(overrides: list[str]) -> int:
    """Plan the grid `overrides` compose; 2 with one error line for bad input (nothing loaded)."""
    try:
        config, jobs = compose(overrides)
        settings = OmegaConf.to_container(config.plan, resolve=True)
        check_plan(settings)
        problems, read_in = read_grid(jobs)
        for line in problems:
            print_error(line)
        if problems:
            return 2
        plans = plan_jobs(read_in, [job.label for job in jobs], settings)
    except AuditError as error:
        print_error(str(error))
        return 2
    accelerators = {name: dict(speeds) for name, speeds in settings["accelerators"].items()}
    frame, tests = jobs_frame(plans, accelerators), test_rows(plans, settings)
    show(plans, frame, tests, accelerators, settings["gpus"], settings["load_s"])
    if settings["csv"]:
        frame.to_csv(settings["csv"], index=False)
        console.print(f"plan: {len(frame)} jobs written to {settings['csv']}")
    return 0
