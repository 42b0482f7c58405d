"""The cdpg probe calibrated on a planted growth of the counterfactual gap along the trace (benchmarks/calibration.py
runs it and prints its table).

The mock (benchmarks/calibration_truth.Plant: `effect` 0.5, `base_sd` 2, `side_sd` 1, `trace_sd` 0, traces of a
fixed TRACE tokens) reads, after the first c tokens of a trace, a side's Yes-minus-No logit L + side * d(c) + e, with
d(c) = effect + effect_per_1k_tokens * (band tokens in those c) / 1000: the thinking gap grows linearly with the
tokens read, from `effect` (nothink, and the trace's start) to effect + thinking_gap (the whole trace). L is the
pair's, shared by its sides, arms and cuts; e is side_sd * N(0, 1), a fresh draw per side and per read (the mock
seeds it by the band tokens read, so each of the K cuts has its own, and the cut at K is the think arm's own read).
So |CDPG_k| = |expit(L + d_k/2 + e1) - expit(L - d_k/2 + e2)|, and a pair's slope (`cdpg.pair_slopes`: OLS on k/K,
k = 1..K) is sum_k w_k |CDPG_k| with w_k = (x_k - mean x) / sum (x - mean x)^2, x_k = k/K. Its cell is fixed by the
nothink read (its own draws) and the think arm's read, the cut at K: so given L the cuts before K are independent
of the cell, and the cut at K is not (a pair of cell c or d flips there).

Truth (quadrature, `cdpg_truth`): E[slope | cell] = E_L[P0(L) (P1(L) sum_{k<K} w_k g_k(L) + w_K H(L))] / P(cell),
P0 and P1 the cell's nothink and think flip probabilities given L, g_k(L) = E|CDPG_k| given L, H(L) its part on the
cell's side of the flip at K; Gauss-Hermite over L, and over e by the factorisation of each flip region (e1 and e2
independent). At thinking_gap 0 d is constant, yet cells c and d are chosen by a flip at the last cut: their |CDPG_K|
is not a typical cut's, so their planted slope is not 0 (the probe's slope is of the cell's pairs as chosen).
`simulated_slopes` draws the same model in numpy (not the mock) for the per-pair slope SD the power needs, and
`drawn_studies` draws 20,000 studies of it (the mock runs hundreds), where the interval's rejections and coverage
have a standard error of 0.3 point.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
from scipy.special import expit
from scipy.stats import norm

from benchmarks.calibration_truth import DEGREE, Plant, abs_gap_given, flip_probability, normal_nodes
from fairaudit.analysis.cdpg import segment_cuts
from fairaudit.analysis.contingency import CELLS
from fairaudit.analysis.stats import t_interval

K = 10
THINKING_GAPS = (0.0, 0.25, 0.5, 1.0)   # added to the sides' logit gap over the whole trace (logit)
FLIPS = {"a": (False, False), "b": (True, False), "c": (False, True), "d": (True, True)}   # (nothink, think) flip


def cut_gaps(plant: Plant, trace: int, opener: int, segments: int = K) -> np.ndarray:
    """d_k, k = 1..K: the sides' logit gap after each cut of a `trace`-token trace whose first `opener` tokens
    (the mock's "Okay,") carry no effect; d_K = effect + thinking_gap."""
    band = np.maximum(np.asarray(segment_cuts(trace, segments)) - opener, 0)
    return plant.effect + plant.thinking_gap * band / (trace - opener)


def slope_weights(segments: int = K) -> np.ndarray:
    """w_k with slope = sum_k w_k y_k, the OLS slope of y on x_k = k/K, k = 1..K."""
    x = np.arange(1, segments + 1) / segments
    return (x - x.mean()) / np.sum((x - x.mean()) ** 2)


def expit_part(mean: np.ndarray, sd: float, above: bool, degree: int = 4 * DEGREE) -> np.ndarray:
    """E[expit(Y) 1{Y >= 0}] (above) or E[expit(Y) 1{Y < 0}] for Y ~ N(mean, sd^2), per mean: Gauss-Legendre on
    the half line cut at 12 SD past the mean (a smooth integrand there)."""
    x, wx = np.polynomial.legendre.leggauss(degree)
    far = np.maximum(mean, 0.0) + 12.0 * sd if above else np.minimum(mean, 0.0) - 12.0 * sd
    a, b = (np.zeros_like(far), far) if above else (far, np.zeros_like(far))
    y = (b - a)[:, None] / 2 * x[None, :] + ((a + b) / 2)[:, None]
    return np.sum((b - a)[:, None] / 2 * wx[None, :] * expit(y) * norm.pdf(y, loc=mean[:, None], scale=sd), axis=1)


def flipped_gap_given(logit: np.ndarray, gap: float, side_sd: float) -> np.ndarray:
    """E[|expit(up) - expit(down)| 1{the sides answer differently}] at each L, up = L + gap/2 + e1 and down =
    L - gap/2 + e2: on {up >= 0 > down} the gap is expit(up) - expit(down), and e1, e2 are independent, so each
    region's part is a product of one-dimensional integrals (and likewise on {down >= 0 > up})."""
    up, down = np.asarray(logit) + gap / 2.0, np.asarray(logit) - gap / 2.0
    p_up, p_down = norm.cdf(up / side_sd), norm.cdf(down / side_sd)   # P(up >= 0), P(down >= 0)
    first = expit_part(up, side_sd, True) * (1 - p_down) - p_up * expit_part(down, side_sd, False)
    second = expit_part(down, side_sd, True) * (1 - p_up) - p_down * expit_part(up, side_sd, False)
    return first + second


def cdpg_truth(plant: Plant, trace: int, opener: int, segments: int = K, degree: int = DEGREE) -> dict:
    """Per cell: its probability (`p_<cell>`) and the planted mean pair slope of |CDPG_k| (`slope_<cell>`)."""
    if plant.trace_sd:
        raise ValueError("cdpg_truth needs trace_sd 0 (the mock draws a trace term per cut, shared by the sides)")
    logit, weight = normal_nodes(plant.base_sd, degree)
    gaps, w = cut_gaps(plant, trace, opener, segments), slope_weights(segments)
    before = sum(w_k * abs_gap_given(logit, d_k, plant.side_sd, degree) for w_k, d_k in zip(w[:-1], gaps[:-1]))
    flips = {False: flip_probability(logit, plant.effect, plant.side_sd),
             True: flip_probability(logit, gaps[-1], plant.side_sd)}
    last = {True: flipped_gap_given(logit, gaps[-1], plant.side_sd)}
    last[False] = abs_gap_given(logit, gaps[-1], plant.side_sd, degree) - last[True]
    out = {}
    for cell, (nothink, think) in FLIPS.items():
        p0 = flips[False] if nothink else 1.0 - flips[False]
        p1 = flips[True] if think else 1.0 - flips[True]
        out[f"p_{cell}"] = float(np.sum(weight * p0 * p1))
        out[f"slope_{cell}"] = float(np.sum(weight * p0 * (p1 * before + w[-1] * last[think]))) / out[f"p_{cell}"]
    return out


def drawn_pairs(plant: Plant, trace: int, opener: int, n: int, rng: np.random.Generator,
                segments: int = K) -> pd.DataFrame:
    """`n` pairs of the module docstring's model drawn in numpy (not through the mock): whether each flips without
    and with thinking, and its slope.  # -> nothink, think, slope"""
    gaps, w = cut_gaps(plant, trace, opener, segments), slope_weights(segments)
    logit = rng.normal(0.0, plant.base_sd, (n, 1))
    e = rng.normal(0.0, plant.side_sd, (2, n, segments + 1))   # column 0: nothink; 1..K: the cuts
    d = np.concatenate([[plant.effect], gaps])
    up, down = logit + d / 2 + e[0], logit - d / 2 + e[1]
    flip = (up >= 0) != (down >= 0)
    slope = np.abs(expit(up[:, 1:]) - expit(down[:, 1:])) @ w
    return pd.DataFrame({"nothink": flip[:, 0], "think": flip[:, -1], "slope": slope})


def in_cell(pairs: pd.DataFrame, cell: str) -> pd.Series:
    nothink, think = FLIPS[cell]
    return (pairs["nothink"] == nothink) & (pairs["think"] == think)


def simulated_slopes(plant: Plant, trace: int, opener: int, draws: int = 2_000_000, seed: int = 0,
                     segments: int = K, block: int = 250_000) -> dict:
    """Per cell, from `draws` pairs of the module docstring's model simulated in numpy: its share (`p_<cell>`), the
    mean (`slope_<cell>`) and SD (`sd_<cell>`) of the pair slopes; each mean's error is about SD / sqrt(pairs)."""
    rng = np.random.default_rng(seed)
    sims = pd.concat([drawn_pairs(plant, trace, opener, min(block, draws - start), rng, segments)
                      for start in range(0, draws, block)], ignore_index=True)
    out = {}
    for cell in CELLS:
        chosen = sims.loc[in_cell(sims, cell), "slope"]
        out |= {f"p_{cell}": len(chosen) / draws, f"slope_{cell}": float(chosen.mean()),
                f"sd_{cell}": float(chosen.std(ddof=1))}
    return out


def drawn_studies(plant: Plant, truth: float, studies: int, pairs: int, seed: int = 1, block: int = 2500) -> dict:
    """Cell c's interval (`stats.t_interval`, the probe's) over `studies` studies of `pairs` pairs drawn by
    `drawn_pairs`: many more studies than the mock runs, at the same model. Of the studies with 2 pairs or more in
    c: the share whose interval excludes 0 (`drawn_excludes_0`) and holds `truth` (`drawn_coverage`)."""
    rng, excludes, holds, reported = np.random.default_rng(seed), 0, 0, 0
    for start in range(0, studies, block):
        count = min(block, studies - start)
        drawn = drawn_pairs(plant, *_trace_and_opener(), count * pairs, rng)
        chosen = drawn[in_cell(drawn, "c")]
        for _, slopes in chosen.groupby(chosen.index // pairs)["slope"]:
            if len(slopes) < 2:
                continue
            low, high = t_interval(slopes.to_numpy())[2:]
            reported += 1
            excludes += bool(low > 0 or high < 0)
            holds += bool(low <= truth <= high)
    return {"drawn_studies": reported, "drawn_excludes_0": excludes / reported, "drawn_coverage": holds / reported}


def mock_cdpg_truth(plant: Plant) -> dict:
    """`cdpg_truth` on the benchmark mock's traces (calibration.TRACE tokens, "Okay," carrying no effect)."""
    return cdpg_truth(plant, *_trace_and_opener())


def cdpg_records(plant: Plant, pairs: pd.DataFrame, seed: int, folder: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the records the probe analyses, its depth records at K) of `pairs` on the mock: `decisions.paired_records`
    (think against nothink) and `CDPGProbe.depth_records` on a `CachingClient`, as `CDPGProbe.run` gathers them."""
    from benchmarks.calibration_common import BLOCK, TRACE, mock_backend
    from fairaudit.probes import AuditContext, ModelSpec
    from fairaudit.probes.cdpg import CDPGProbe
    from fairaudit.probes.decisions import analysed, paired_records
    from fairaudit.prompts.yesno import Arm, Thinking
    from fairaudit.store.client import CachingClient
    from fairaudit.store.results import Store

    backend = mock_backend(plant, seed)
    client = CachingClient(backend, Store(folder / f"calibration-cdpg-{seed}.sqlite"))
    spec = ModelSpec("tiny_qwen3", Thinking(style="native"), {"enable_thinking": True})
    think, nothink = Arm("think", True, TRACE + 24), Arm("nothink", False, 16)
    probe = CDPGProbe({"name": "nothink", "think": False, "max_new_tokens": 16}, K=K, k_list=(K,))
    ids, records, depth = pairs["pair_id"].unique(), [], []
    for start in range(0, len(ids), BLOCK):
        block = pairs[pairs["pair_id"].isin(set(ids[start:start + BLOCK]))]
        ctx = AuditContext(client, backend.tokenizer, spec, SimpleNamespace(name="adult", pairs=lambda b=block: b),
                           think)
        found = paired_records(ctx, nothink)
        depth.append(probe.depth_records(ctx, found))
        records.append(analysed(found))
    return pd.concat(records, ignore_index=True), pd.concat(depth, ignore_index=True)


def study_rows(records: pd.DataFrame, depth: pd.DataFrame, order: np.ndarray, pairs: int) -> pd.DataFrame:
    """One row per study of `pairs` consecutive pairs of `order`: each cell's pairs, slope and 95% interval, by
    `analysis.cdpg` with the probe's defaults (seed 0, identity_atol 1e-4) at K."""
    from fairaudit.analysis.cdpg import cdpg

    study_of = pd.Series(np.arange(len(order)) // pairs, index=order)
    depth_of = dict(iter(depth.groupby(depth["pair_id"].map(study_of), sort=True)))
    rows = []
    for study, chunk in records.groupby(records["pair_id"].map(study_of), sort=True):
        metrics = cdpg(depth_of[study], chunk, "think", "nothink", k_list=(K,), seed=0, K=K,
                       identity_atol=1e-4)["metrics"]
        rows.append({"study": study, **{f"{key}_{cell}": metrics[name.format(cell=cell)] for cell in CELLS
                                         for key, name in (("n", "cdpg_n_{cell}"), ("slope", "cdpg_slope_{cell}"),
                                                           ("low", "cdpg_slope_{cell}_ci_low"),
                                                           ("high", "cdpg_slope_{cell}_ci_high"))}})
    return pd.DataFrame(rows)


def run_gap(thinking_gap: float, studies: int, pairs: int, seed: int) -> pd.DataFrame:
    """Every study of one planted thinking gap (its mock seeded by `seed` and the gap, apart from the
    counterfactual calibration's)."""
    from benchmarks.calibration_common import adult_pairs, quietly

    plant = replace(Plant(), thinking_gap=thinking_gap)
    mock_seed = seed * 1000 + round(thinking_gap * 100) + 500
    chosen = adult_pairs(studies * pairs, mock_seed)
    with tempfile.TemporaryDirectory() as folder:
        records, depth = quietly(cdpg_records)(plant, chosen, mock_seed, Path(folder))
    out = study_rows(records, depth, chosen["pair_id"].unique(), pairs)
    return out.assign(thinking_gap=thinking_gap, pairs=pairs)


def planned_power(truth: dict, sd: float, pairs: int, alpha: float = 0.05) -> float:
    """What `fairaudit plan` predicts for cell c's slope over `pairs` pairs (`CDPGProbe.planned_tests`, the line it
    prints): the t-test at the planted slope and SD of its pair slopes, over cell c's Binomial count at its planted
    share (plan.effect.discordant and c_b_ratio set to the planted cells)."""
    from fairaudit.probes.cdpg import CDPGProbe

    effect = {"cdpg_slope": truth["slope_c"], "cdpg_slope_sd": sd, "discordant": truth["p_b"] + truth["p_c"],
              "c_b_ratio": truth["p_c"] / truth["p_b"]}
    probe = CDPGProbe({"name": "nothink", "think": False, "max_new_tokens": 16}, K=K, k_list=(K,))
    (test,) = probe.planned_tests(None, effect)
    return test.power(pairs, alpha)


def summary(rows: pd.DataFrame, draws: int = 2_000_000, drawn: int = 20_000) -> pd.DataFrame:
    """Per planted gap and cell: the planted slope, the studies reporting an interval (2 pairs or more), the share of
    them whose interval holds the planted slope and the share whose interval excludes 0 (each with its
    Clopper-Pearson interval); the t-test's power (`power.paired_gap_power`) at each study's pairs in the cell, the
    planted mean and the simulated SD of the pair slopes, averaged over studies (`predicted`); and in cell c what the
    plan predicts before any study is drawn (`planned`) and `drawn` studies of as many pairs drawn in numpy
    (`drawn_studies`)."""
    from benchmarks.calibration_common import share
    from fairaudit.analysis.power import paired_gap_power

    out = []
    for gap, group in rows.groupby("thinking_gap", sort=True):
        plant = replace(Plant(), thinking_gap=gap)
        truth = mock_cdpg_truth(plant)
        sd = simulated_slopes(plant, *_trace_and_opener(), draws=draws)
        for cell in CELLS:
            n, low, high = (group[f"{key}_{cell}"].to_numpy(float) for key in ("n", "low", "high"))
            reported = n >= 2
            holds = int(((low <= truth[f"slope_{cell}"]) & (truth[f"slope_{cell}"] <= high))[reported].sum())
            excludes_0 = int(((low > 0) | (high < 0))[reported].sum())
            count = int(reported.sum())
            power = [paired_gap_power(int(m), truth[f"slope_{cell}"], sd[f"sd_{cell}"]) for m in n[reported]]
            out.append({"thinking_gap": gap, "cell": cell, "truth": truth[f"slope_{cell}"], "sd": sd[f"sd_{cell}"],
                        "p_cell": truth[f"p_{cell}"], "pairs": int(group["pairs"].iloc[0]), "studies": len(group),
                        "reported": count, "mean_n": float(n.mean()),
                        "mean_slope": float(group[f"slope_{cell}"].mean()),   # over the studies with the cell
                        **{f"coverage_{k}": v for k, v in (share(holds, count) if count else {}).items()},
                        **{f"excludes_0_{k}": v for k, v in (share(excludes_0, count) if count else {}).items()},
                        "predicted": float(np.mean(power)) if count else math.nan,
                        **(_cell_c(plant, truth, sd["sd_c"], int(group["pairs"].iloc[0]), drawn) if cell == "c"
                           else {})})
    return pd.DataFrame(out)


def _cell_c(plant: Plant, truth: dict, sd: float, pairs: int, drawn: int) -> dict:
    """What the plan predicts for cell c (`planned`) and what `drawn` numpy-drawn studies measure."""
    return {"planned": planned_power(truth, sd, pairs), **drawn_studies(plant, truth["slope_c"], drawn, pairs)}


def _trace_and_opener() -> tuple[int, int]:
    from benchmarks.calibration_common import TRACE, band_tokens

    return TRACE, TRACE - band_tokens()


def pooled_coverage(table: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Each cell's coverage over every planted gap's studies that report its interval."""
    from benchmarks.calibration_common import share

    out = {}
    for cell, group in table.groupby("cell", sort=True):
        count = int(group["reported"].sum())
        hits = int(round((group["coverage_share"].fillna(0.0) * group["reported"]).sum()))
        out[cell] = share(hits, count) if count else {"share": math.nan, "low": math.nan, "high": math.nan}
    return out


def markdown(table: pd.DataFrame) -> str:
    """Cell c's power (interval excludes 0) measured against the plan's and the t-test's at each study's n, and in
    numpy-drawn studies, then every cell's coverage (%)."""
    from benchmarks.calibration_common import pct, percent_interval

    cell_c = table[table["cell"] == "c"]
    lines = ["| thinking gap (logit) | planted slope in c | SD of pair slopes | mean pairs in c | studies | "
             "interval excludes 0 (%) [95% CI] | the plan predicts (%) | measured - planned (points) | "
             "t-test at each study's n_c (%) | interval misses the truth (%) | "
             f"{int(cell_c['drawn_studies'].max()):,} numpy-drawn studies: excludes 0 (%), - planned (points), "
             "misses the truth (%) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in cell_c.itertuples():
        lines.append(f"| {r.thinking_gap:g} | {r.truth:.4f} | {r.sd:.4f} | {r.mean_n:.1f} | {r.reported} | "
                     f"{percent_interval(r.excludes_0_share, r.excludes_0_low, r.excludes_0_high)} | "
                     f"{pct(r.planned)} | {100 * (r.excludes_0_share - r.planned):+.1f} | {pct(r.predicted)} | "
                     f"{pct(1 - r.coverage_share)} | {pct(r.drawn_excludes_0)}, "
                     f"{100 * (r.drawn_excludes_0 - r.planned):+.1f}, {pct(1 - r.drawn_coverage)} |")
    head = " | ".join(f"cell {cell}: truth, mean pairs, coverage" for cell in CELLS)
    lines += ["", f"| thinking gap (logit) | {head} |", "|---" * (len(CELLS) + 1) + "|"]
    for gap, group in table.groupby("thinking_gap", sort=True):
        cells = group.set_index("cell")
        lines.append(f"| {gap:g} | " + " | ".join(
            f"{cells.at[c, 'truth']:.4f}, {cells.at[c, 'mean_n']:.1f}, "
            + percent_interval(*cells.loc[c, ["coverage_share", "coverage_low", "coverage_high"]]) for c in CELLS)
            + " |")
    pooled = pooled_coverage(table)
    lines.append("| all | " + " | ".join(percent_interval(p["share"], p["low"], p["high"]) for p in pooled.values())
                 + " |")
    return "\n".join(lines)
