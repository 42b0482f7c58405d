"""Paper scale on backend=mock: wall time per stage, peak memory and sizes per record, and how each grows.

    python benchmarks/scale.py                      # the issue's sizes (about an hour on 2 cores)
    python benchmarks/scale.py --sizes 500 5000 --cdpg-sizes 1000 --grid 0
    python benchmarks/scale.py --quick              # a minute: 100 and 400 pairs, a 9-job grid of 100

Every job is `python -m fairaudit backend=mock model=tiny_qwen3 ...` run in its own process, with
timers around the functions of each stage (a stage's own time: the stages it calls are counted apart):
the counterfactual probe at each of --sizes (Adult pairs, traces of --trace tokens drawn lognormal,
budget 1.5x, so about one in eight is cut), its re-run from the store, the cdpg probe at --cdpg-sizes
(K=10, k_list 5/10/20), and `fairaudit report` over a 9-job grid (Adult, COMPAS, Credit x
counterfactual, btm, cdpg) of --grid pairs. Printed: seconds per stage and job, peak RSS, store and
artifact bytes per record, and each stage's growth exponent between sizes (1: linear).
The mock answers instantly, so what is measured is the bookkeeping a real model's job pays besides
its forward passes (benchmarks/hf_steps.py measures the hf backend's own overhead per decoding step).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGES = {  # stage -> functions whose own time it counts ("module:attribute.path")
    "data": ["fairaudit.data.tabular:CounterfactualTabular.pairs"],
    "backend init": ["fairaudit.backends.mock:MockBackend.__init__"],
    "prompts": ["fairaudit.probes.decisions:render_prompts"],
    "tokenize": ["fairaudit.store.client:CachingClient.encode"],
    "keys": ["fairaudit.store.client:call_key"],
    "mock model": ["fairaudit.backends.mock:MockBackend.generate", "fairaudit.backends.mock:MockBackend.choice_probs",
                   "fairaudit.backends.mock:MockBackend.depth_choice_probs"],
    "store reads": ["fairaudit.store.results:Store.get_many"],
    "store writes": ["fairaudit.store.results:Store.put_many"],
    "records": ["fairaudit.probes.decisions:decide", "fairaudit.probes.decisions:_decide_block",
                "fairaudit.probes.decisions:paired_records",
                "fairaudit.probes.cdpg:CDPGProbe.depth_records"],
    "analysis": ["fairaudit.probes.counterfactual:contingency", "fairaudit.probes.counterfactual:paired_metrics",
                 "fairaudit.probes.cdpg:cdpg", "fairaudit.probes.btm:transitions",
                 "fairaudit.probes.cdpg:answer_accounting", "fairaudit.probes.btm:answer_accounting"],
    "figures": ["fairaudit.probes.counterfactual:disparity_shift_figure", "fairaudit.probes.cdpg:cdpg_figures",
                "fairaudit.probes.btm:tpair_heatmap", "fairaudit.probes.btm:group_transition_heatmaps"],
    "mlflow": ["fairaudit.tracking.runs:Tracker.__init__", "fairaudit.tracking.runs:Tracker.start",
               "fairaudit.tracking.content:RunContent.log_config",
               "fairaudit.tracking.content:RunContent.log_result", "fairaudit.tracking.content:RunContent.set_tags",
               "fairaudit.tracking.runs:Tracker.end"],
    "samples": ["fairaudit.tracking.samples:write", "fairaudit.tracking.content:RunContent.log_samples"],
    "report: load": ["fairaudit.report.runs:load_records", "fairaudit.report.runs:select_runs"],
    "report: build": ["fairaudit.report.build:build"],
    "report: write": ["fairaudit.report.app:write", "fairaudit.report.app:log"],
}
SELF: dict[str, float] = defaultdict(float)   # wall seconds per stage
CPU: dict[str, float] = defaultdict(float)    # CPU seconds per stage (the process's, every thread)
STACK: list[list[float]] = []
NAMES: list[str] = []  # the stages now running, innermost last
PEAK: dict[str, float] = defaultdict(float)  # the largest RSS (GB) seen while each stage was innermost


def sample_memory(period: float = 0.1) -> None:
    """Record, every `period` seconds, this process's RSS against the stage running (a daemon thread)."""
    import threading

    page = os.sysconf("SC_PAGE_SIZE")

    def loop() -> None:
        while True:
            rss = int(Path("/proc/self/statm").read_text().split()[1]) * page / 2**30
            stage = NAMES[-1] if NAMES else "other"
            PEAK[stage] = max(PEAK[stage], rss)
            time.sleep(period)

    threading.Thread(target=loop, daemon=True).start()


def timed(stage: str, fn):
    """fn, adding its own time (less that of timed functions it calls) to SELF[stage]."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        start, cpu = time.perf_counter(), time.process_time()
        STACK.append([0.0, 0.0])
        NAMES.append(stage)
        try:
            return fn(*args, **kwargs)
        finally:
            NAMES.pop()
            elapsed, used = time.perf_counter() - start, time.process_time() - cpu
            inner = STACK.pop()
            SELF[stage] += elapsed - inner[0]
            CPU[stage] += used - inner[1]
            if STACK:
                STACK[-1][0] += elapsed
                STACK[-1][1] += used
    return wrapper


def install_timers() -> None:
    """Wrap every function STAGES names where it is looked up (a missing one is skipped)."""
    for stage, targets in STAGES.items():
        for target in targets:
            module_name, path = target.split(":")
            owner = importlib.import_module(module_name)
            *parents, name = path.split(".")
            for part in parents:
                owner = getattr(owner, part)
            if hasattr(owner, name):
                setattr(owner, name, timed(stage, getattr(owner, name)))


def child(argv: list[str], out: Path) -> None:
    """Run one fairaudit command in this process under the timers; write its stages, wall time and peak RSS."""
    start = time.perf_counter()
    sys.path.insert(0, str(ROOT))
    install_timers()
    sample_memory()
    from fairaudit.cli.main import main

    code = 0
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code or 0
    wall = time.perf_counter() - start
    stages, cpu = dict(SELF), dict(CPU)
    stages["other"] = wall - sum(stages.values())
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu["other"] = usage.ru_utime + usage.ru_stime - sum(cpu.values())
    out.write_text(json.dumps({"code": code, "wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "stages": stages,
                               "stage_cpu": cpu,
                               "rss_gb": usage.ru_maxrss / 2**20, "peak_by_stage": dict(PEAK)}))


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def job(work: Path, name: str, argv: list[str]) -> dict:
    """One timed command in a fresh process, in `work` (its store, tracking database and artifacts live there)."""
    out = work / f"{name}.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    artifacts_before, store_before = folder_bytes(work / "mlartifacts"), folder_bytes(work / "store")
    load = os.getloadavg()[0]
    done = subprocess.run([sys.executable, __file__, "--child", str(out), "--", *argv], cwd=work, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode or not out.exists() or json.loads(out.read_text())["code"]:
        sys.exit(f"{name} failed:\n{done.stderr[-3000:]}")
    result = json.loads(out.read_text())
    result.update(name=name, load=load, artifact_bytes=folder_bytes(work / "mlartifacts") - artifacts_before,
                  store_bytes=folder_bytes(work / "store") - store_before)
    print(f"  {name}: {result['wall']:.1f} s ({result['cpu']:.1f} s CPU), peak RSS {result['rss_gb']:.2f} GB, "
          f"load {load:.1f}", flush=True)
    return result


def audit(probe: str, n: int, trace: int, dataset: str = "adult", experiment: str = "scale") -> list[str]:
    """The command line of one mock job: n pairs, lognormal traces of median `trace`, a budget of 1.5 x trace."""
    return [f"probe={probe}", f"dataset={dataset}", f"dataset.n={n}", "backend=mock", "model=tiny_qwen3",
            f"model.max_think_tokens={int(1.5 * trace)}", "model.max_context=8192",
            f"backend.trace_tokens.median={trace}", "backend.trace_tokens.sigma=0.35",
            "store.url=store/store.sqlite", f"tracking.experiment={experiment}"]


def records_of(result: dict) -> int:
    """Records a job's n pairs make: 2 sides x 2 arms."""
    return 4 * result["n"]


def sizes_run(work: Path, sizes: list[int], trace: int) -> list[dict]:
    """The counterfactual job at each size (a fresh store and tracking database each) and its re-run from the store."""
    results = []
    for n in sizes:
        folder = work / f"counterfactual-{n}"
        folder.mkdir()
        results.append({**job(folder, f"counterfactual n={n}", audit("counterfactual", n, trace)), "n": n})
        results.append({**job(folder, f"re-run n={n}", audit("counterfactual", n, trace)), "n": n})
        shutil.rmtree(folder)  # 40,000 pairs of 2,000-token traces are gigabytes
    return results


def cdpg_run(work: Path, sizes: list[int], trace: int) -> list[dict]:
    """The cdpg job (its generations first, as in a study, then the depth reads) at each size."""
    results = []
    for n in sizes:
        folder = work / f"cdpg-{n}"
        folder.mkdir()
        job(folder, f"generations n={n}", audit("counterfactual", n, trace))
        results.append({**job(folder, f"cdpg n={n}", audit("cdpg", n, trace)), "n": n})
        shutil.rmtree(folder)
    return results


def grid_run(work: Path, n: int, trace: int) -> list[dict]:
    """Paper 000's grid for one model (3 data sets x 3 probes) of n pairs, then `fairaudit report` over it."""
    folder = work / f"grid-{n}"
    folder.mkdir()
    results = [{**job(folder, f"grid {dataset} {probe}", audit(probe, n, trace, dataset, "grid")), "n": n}
               for dataset in ("adult", "compas", "credit") for probe in ("counterfactual", "btm", "cdpg")]
    report = ["report", "select.experiment=grid", "select.parent=null", f"output_dir={folder / 'report'}"]
    results.append({**job(folder, f"report over 9 jobs of n={n}", report), "n": n})
    shutil.rmtree(folder)
    return results


def stage_table(results: list[dict]) -> str:
    """Seconds per stage (rows) and job (columns), then wall, peak RSS, load and bytes per record."""
    stages = [s for s in [*STAGES, "other"] if any(r["stages"].get(s, 0) > 0.05 for r in results)]
    names = [r["name"] for r in results]
    width = max(14, *(len(n) for n in names))
    lines = ["stage: wall (CPU) s".ljust(20) + "".join(n.rjust(width + 2) for n in names)]
    for stage in stages:
        cells = [f"{r['stages'].get(stage, 0):.1f} ({r['stage_cpu'].get(stage, 0):.1f})" for r in results]
        lines.append(stage.ljust(20) + "".join(c.rjust(width + 2) for c in cells))
    rows = {"wall s": lambda r: f"{r['wall']:.1f}", "CPU s": lambda r: f"{r['cpu']:.1f}",
            "peak RSS GB": lambda r: f"{r['rss_gb']:.2f}",
            "  during": lambda r: max(r["peak_by_stage"], key=r["peak_by_stage"].get, default="-"),
            "load (1 min)": lambda r: f"{r['load']:.1f}",
            "store B/record": lambda r: f"{r['store_bytes'] / records_of(r):,.0f}",
            "artifact B/rec": lambda r: f"{r['artifact_bytes'] / records_of(r):,.0f}"}
    for label, cell in rows.items():
        lines.append(label.ljust(20) + "".join(cell(r).rjust(width + 2) for r in results))
    return "\n".join(lines)


def growth_table(results: list[dict]) -> str:
    """Each stage's growth exponent between successive sizes, from its CPU seconds (what the load does not
    change): log(t2/t1) / log(n2/n1); 1 is linear."""
    if len(results) < 2:
        return ""
    lines = [f"growth exponent of CPU time (1 = linear) of {', '.join(str(r['n']) for r in results)} pairs"]
    for stage in [*STAGES, "other", "total"]:
        values = [r["cpu"] if stage == "total" else r["stage_cpu"].get(stage, 0) for r in results]
        if min(values) <= 0.2:
            continue
        exps = [math.log(b / a) / math.log(r2["n"] / r1["n"])
                for a, b, r1, r2 in zip(values, values[1:], results, results[1:])]
        flag = "  <- faster than linear" if max(exps) > 1.15 else ""
        lines.append(f"  {stage:16s}" + "".join(f"{e:8.2f}" for e in exps) + flag)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[500, 5000, 40000],
                        help="counterfactual job sizes (pairs)")
    parser.add_argument("--cdpg-sizes", type=int, nargs="*", default=[1000, 5000], help="cdpg job sizes (pairs)")
    parser.add_argument("--grid", type=int, default=5000,
                        help="pairs per job of the 9-job grid the report reads; 0: skip")
    parser.add_argument("--trace", type=int, default=2000, help="median trace length in tokens")
    parser.add_argument("--quick", action="store_true", help="100 and 400 pairs, cdpg at 100, a grid of 100")
    parser.add_argument("--work", type=Path, default=None, help="folder for the jobs (default: a temporary one)")
    parser.add_argument("--json", type=Path, default=None, help="also write every job's figures to this file")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.cdpg_sizes, args.grid = [100, 400], [100], 100
    work = args.work or Path(tempfile.mkdtemp(prefix="fairaudit-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"{os.cpu_count()} cores, load {os.getloadavg()}, traces of median {args.trace} tokens, jobs in {work}")
    sections, everything = [], []
    if args.sizes:
        results = sizes_run(work, args.sizes, args.trace)
        everything += results
        first, again = results[0::2], results[1::2]
        sections += ["counterfactual jobs and their re-runs from the store", stage_table(results), growth_table(first),
                     growth_table(again).replace("growth", "re-run growth", 1)]
    if args.cdpg_sizes:
        results = cdpg_run(work, args.cdpg_sizes, args.trace)
        everything += results
        sections += ["cdpg jobs (generations already in the store)", stage_table(results), growth_table(results)]
    if args.grid:
        results = grid_run(work, args.grid, args.trace)
        everything += results
        sections += [f"9-job grid of {args.grid} pairs and the report over it", stage_table(results)]
    print("\n\n".join(s for s in sections if s))
    print(f"\nload average at the end: {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps(everything, indent=1))
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[sys.argv.index("--") + 1:], Path(sys.argv[2]))
    else:
        main()
