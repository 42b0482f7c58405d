"""The position probe calibrated on a planted preference for position A that grows with the trace
(benchmarks/calibration.py runs it and prints its tables).

The mock (answers [A, B, C, D], `base_sd` 2, `trace_sd` 0, traces of n ~ Uniform{LOW..HIGH} tokens drawn per prompt)
answers each of a question's four cyclic permutations on its own: each prompt seeds its own letter logits, four
independent N(0, base_sd^2 / 2) draws, and its own trace length, so the permutations are independent and nothing
follows the content. The trace is "Okay," (`opener` tokens) and m = n - opener band words drawn uniformly from the
mock's band; A's logit gains b = position_pref + position_pref_per_1k_tokens x (m + prompt_band) / 1000, the band
tokens read (the MCQ template holds one, " reasoning"; questions whose own words hold more are left out). The
greedy answer is the largest logit, so a permutation answers A with p(m) = E[Phi(Z + b / sigma)^3] (sigma =
base_sd / sqrt 2) and each other letter with (1 - p(m)) / 3. A completion's length in characters is a constant
plus the m band words' lengths, W i.i.d. from the band's word lengths (`word_lengths`).

Truth (exact, `position_truth`): per question the four answers' law is a product over the permutations, so the
moments of PBS and accuracy (an enumeration of the 256 answer vectors) and their covariances with the question's
total band words M (hence with its mean length, a constant plus S / 4, S the M words' characters: E[S | M] = M
mean(W), Var(S | M) = M var(W)) are sums over one permutation's length law; so is the population partial
correlation of length and PBS given accuracy that `fairaudit plan` sizes the test for. PBS per length quartile:
E[PBS | S in the population quartile], from the joint law of (M, A answers) (four convolutions of one
permutation's) and S | M (M convolutions of the word-length law), PBS given k A answers being the mean over the
other answers' uniform spread; ties at a quartile's edge are split as `analysis.position.length_bins` splits them
(by row order, so in proportion). The partial Spearman rho alone is simulated (`planted`).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pandas as pd
from scipy.signal import convolve2d
from scipy.stats import norm

from benchmarks.calibration_truth import normal_nodes
from fairaudit.analysis.position import N_POSITIONS, pbs

LOW, HIGH = 20, 120       # backend.trace_tokens: uniform, low..high tokens ("Okay," included)
QUARTILES = 4


@dataclass(frozen=True)
class PositionPlant:
    """The mock settings a position calibration varies (logits; see the module docstring)."""

    per_1k_tokens: float = 0.0   # backend.position_pref_per_1k_tokens (0: the null, PBS unrelated to length)
    pref: float = 0.0            # backend.position_pref
    base_sd: float = 2.0         # backend.base_sd
    low: int = LOW
    high: int = HIGH


def first_wins(bonus: np.ndarray, base_sd: float) -> np.ndarray:
    """P(answers[0]'s logit, plus `bonus`, beats three others), the four i.i.d. N(0, base_sd^2 / 2):
    E[Phi(Z + bonus / sigma)^3] by Gauss-Hermite over Z."""
    z, w = normal_nodes(1.0)
    sigma = base_sd / np.sqrt(2.0)
    return np.sum(w * norm.cdf(z + np.asarray(bonus, dtype=float)[..., None] / sigma) ** 3, axis=-1)


def band_words(plant: PositionPlant, opener: int) -> np.ndarray:
    """m, the band words of a trace, for each equally likely drawn length low..high."""
    return np.maximum(np.arange(plant.low, plant.high + 1) - opener, 0)


def a_rate(plant: PositionPlant, words: np.ndarray, prompt_band: int) -> np.ndarray:
    """p(m): P(a permutation answers A) after m band words (and the prompt's `prompt_band`)."""
    return first_wins(plant.pref + plant.per_1k_tokens * (words + prompt_band) / 1000.0, plant.base_sd)


def answer_vectors() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every answer of four permutations, permutation s holding the gold at position s: (answers (256, 4), each
    vector's PBS, its accuracy)."""
    answers = np.array(list(itertools.product(range(N_POSITIONS), repeat=N_POSITIONS)))
    shares = np.stack([(answers == slot).mean(axis=1) for slot in range(N_POSITIONS)], axis=1)
    return answers, pbs(shares), (answers == np.arange(N_POSITIONS)).mean(axis=1)


def word_lengths(backend) -> np.ndarray:
    """The law of a band word's length in characters (index: characters) over the mock's band."""
    return np.bincount([len(backend.tokenizer.decode([t])) for t in backend.band]) / len(backend.band)


def moments(plant: PositionPlant, opener: int, prompt_band: int) -> dict[str, float]:
    """E and covariances of M (a question's band words), PBS and accuracy, exact (module docstring)."""
    m = band_words(plant, opener).astype(float)
    p = a_rate(plant, m, prompt_band)
    q, r = p.mean(), (m * p).mean()
    answers, scores, accuracy = answer_vectors()
    chance = np.where(answers == 0, q, (1.0 - q) / 3.0)            # E over m of P(a_s), per vector and s
    weighted = np.where(answers == 0, r, (m.mean() - r) / 3.0)     # E over m of m P(a_s)
    law = chance.prod(axis=1)
    with_m = sum(weighted[:, t] * np.delete(chance, t, axis=1).prod(axis=1) for t in range(N_POSITIONS))
    mean = {"pbs": law @ scores, "accuracy": law @ accuracy, "m": N_POSITIONS * m.mean()}
    return {**{f"mean_{k}": v for k, v in mean.items()},
            "var_m": N_POSITIONS * m.var(), "var_pbs": law @ scores ** 2 - mean["pbs"] ** 2,
            "var_accuracy": law @ accuracy ** 2 - mean["accuracy"] ** 2,
            "cov_pbs_accuracy": law @ (scores * accuracy) - mean["pbs"] * mean["accuracy"],
            "cov_m_pbs": with_m @ scores - mean["m"] * mean["pbs"],
            "cov_m_accuracy": with_m @ accuracy - mean["m"] * mean["accuracy"], "share_a": q}


def partial_rho(cov: np.ndarray) -> float:
    """rho(x, y | z) of a 3 x 3 covariance matrix of (x, y, z)."""
    corr = cov / np.sqrt(np.outer(np.diag(cov), np.diag(cov)))
    rxy, rxz, ryz = corr[0, 1], corr[0, 2], corr[1, 2]
    return float((rxy - rxz * ryz) / np.sqrt((1.0 - rxz ** 2) * (1.0 - ryz ** 2)))


def pbs_given_a(count: int) -> float:
    """E[PBS | `count` of the four answers are A], the others uniform over B, C and D."""
    others = np.array(list(itertools.product(range(1, N_POSITIONS), repeat=N_POSITIONS - count)), dtype=int)
    answers = np.hstack([np.zeros((len(others), count), dtype=int), others.reshape(len(others), -1)])
    shares = np.stack([(answers == slot).mean(axis=1) for slot in range(N_POSITIONS)], axis=1)
    return float(pbs(shares).mean())


def length_and_a_law(plant: PositionPlant, words: np.ndarray, opener: int, prompt_band: int) -> np.ndarray:
    """P(S = s, k A answers) (rows s, columns k = 0..4) over a question's four permutations, S the characters of
    its band words: (M, k) by convolving one permutation's law four times, then S | M, M convolutions of `words`."""
    m = band_words(plant, opener)
    p = a_rate(plant, m, prompt_band)
    one = np.zeros((m.max() + 1, 2))
    np.add.at(one, (m, 1), p / len(m))
    np.add.at(one, (m, 0), (1.0 - p) / len(m))
    joint = one
    for _ in range(N_POSITIONS - 1):
        joint = convolve2d(joint, one)
    out = np.zeros(((len(joint) - 1) * (len(words) - 1) + 1, N_POSITIONS + 1))
    given = np.ones(1)   # the law of S given M, for M = 0, 1, ...
    for row in joint:
        out[:len(given)] += np.outer(given, row)
        given = np.convolve(given, words)
    return out


def quartile_means(law: np.ndarray) -> np.ndarray:
    """E[PBS | S in each population quartile] of `length_and_a_law`'s law, an atom at a quartile's edge split in
    proportion to the share of it each quartile holds."""
    mass = law.sum(axis=1)
    expected = law @ np.array([pbs_given_a(k) for k in range(N_POSITIONS + 1)])   # E[PBS; S = s]
    upper = np.cumsum(mass)
    lower = upper - mass
    held = mass > 0
    out = []
    for q in range(QUARTILES):
        overlap = np.clip(np.minimum(upper, (q + 1) / QUARTILES) - np.maximum(lower, q / QUARTILES), 0.0, None)
        out.append(QUARTILES * np.sum(overlap[held] / mass[held] * expected[held]))
    return np.array(out)


def position_truth(plant: PositionPlant, words: np.ndarray, opener: int, prompt_band: int) -> dict[str, float]:
    """The planted values the position probe measures: E[PBS], E[accuracy], A's share, the partial correlation
    rho(length, PBS | accuracy) over complete questions and E[PBS] per length quartile (pbs_q1..pbs_q4)."""
    mo = moments(plant, opener, prompt_band)
    mean_w = float(np.arange(len(words)) @ words)
    var_w = float(np.arange(len(words)) ** 2 @ words) - mean_w ** 2
    var_s = mean_w ** 2 * mo["var_m"] + var_w * mo["mean_m"]
    cov = np.array([[var_s, mean_w * mo["cov_m_pbs"], mean_w * mo["cov_m_accuracy"]],
                    [mean_w * mo["cov_m_pbs"], mo["var_pbs"], mo["cov_pbs_accuracy"]],
                    [mean_w * mo["cov_m_accuracy"], mo["cov_pbs_accuracy"], mo["var_accuracy"]]])
    quartiles = quartile_means(length_and_a_law(plant, words, opener, prompt_band))
    return {"pbs": mo["mean_pbs"], "accuracy": mo["mean_accuracy"], "answer_share_a": mo["share_a"],
            "partial_rho": partial_rho(cov), **{f"pbs_q{q + 1}": v for q, v in enumerate(quartiles)}}


def simulated_questions(plant: PositionPlant, words: np.ndarray, opener: int, prompt_band: int, questions: int,
                        seed: int) -> pd.DataFrame:
    """`questions` questions of the module docstring's model drawn in numpy (not the mock): four permutations each,
    their letter logits argmax'd, their band words' characters summed (the constant left out); the gold of
    permutation s at position s. # length_chars, pbs, accuracy, share_a"""
    rng = np.random.default_rng(seed)
    m = np.maximum(rng.integers(plant.low, plant.high + 1, (questions, N_POSITIONS)) - opener, 0)
    logits = rng.normal(0.0, plant.base_sd / np.sqrt(2.0), (questions, N_POSITIONS, N_POSITIONS))
    logits[:, :, 0] += plant.pref + plant.per_1k_tokens * (m + prompt_band) / 1000.0
    answers = logits.argmax(axis=2)
    chars = rng.choice(len(words), size=m.sum(), p=words)
    length = np.add.reduceat(chars, np.r_[0, np.cumsum(m.sum(axis=1))[:-1]])
    shares = np.stack([(answers == slot).mean(axis=1) for slot in range(N_POSITIONS)], axis=1)
    return pd.DataFrame({"length_chars": length, "pbs": pbs(shares),
                         "accuracy": (answers == np.arange(N_POSITIONS)).mean(axis=1), "share_a": shares[:, 0]})


@functools.cache
def planted(plant: PositionPlant, prompt_band: int, questions: int = 100_000) -> dict[str, float]:
    """`position_truth` and the population partial Spearman rho (no closed form with PBS's five values and length's
    ties: `simulated_questions` of `questions` questions, seeded; its error about 1 / sqrt(questions), 0.003)."""
    from fairaudit.analysis.stats import partial_correlation

    words, opener = mock_facts()
    found = simulated_questions(plant, words, opener, prompt_band, questions, seed=2026)
    spearman = partial_correlation(found["length_chars"], found["pbs"], found["accuracy"], "spearman")[0]
    return {**position_truth(plant, words, opener, prompt_band), "partial_rho_spearman": spearman}


def simulated_power(plant: PositionPlant, questions: int, studies: int, seed: int = 0, alpha: float = 0.05) -> float:
    """A diagnostic, not the pipeline: the share of `studies` studies of `simulated_questions` whose partial
    correlation test (`stats.partial_correlation`, the probe's) rejects at alpha; its error is the simulation's."""
    from fairaudit.analysis.stats import partial_correlation

    words, opener = mock_facts()
    found = simulated_questions(plant, words, opener, 1, questions * studies, seed)
    study = np.arange(len(found)) // questions
    log10_p = [partial_correlation(g["length_chars"], g["pbs"], g["accuracy"])[2] for _, g in found.groupby(study)]
    return float(np.mean(np.asarray(log10_p) <= np.log10(alpha)))


def simulated_mean_coverage(plant: PositionPlant, questions: int, studies: int, n_boot: int = 1000,
                            seed: int = 0) -> dict[str, tuple[float, float]]:
    """A diagnostic, not the pipeline: over `studies` studies of `simulated_questions`, the share whose interval holds
    E[PBS] (pbs) and each length quartile's (pbs_q1..q4, over the study's quartile of questions), for the t interval
    the probe logs (`stats.clustered_t_interval`) and for a percentile bootstrap of the same questions.
    {name: (t coverage, bootstrap coverage)}"""
    from fairaudit.analysis.stats import clustered_t_interval

    words, opener = mock_facts()
    truth = position_truth(plant, words, opener, 1)
    found = simulated_questions(plant, words, opener, 1, questions * studies, seed)
    values = found["pbs"].to_numpy().reshape(studies, questions)
    by_length = np.argsort(found["length_chars"].to_numpy().reshape(studies, questions), axis=1, kind="stable")
    quartiles = np.array_split(np.take_along_axis(values, by_length, axis=1), QUARTILES, axis=1)
    rng = np.random.default_rng(seed)
    out = {}
    for name, group in {"pbs": values, **{f"pbs_q{q + 1}": part for q, part in enumerate(quartiles)}}.items():
        resamples = rng.integers(0, group.shape[1], (n_boot, group.shape[1]))
        t = np.array([clustered_t_interval(row) for row in group])
        boot = np.array([np.quantile(row[resamples].mean(axis=1), [0.025, 0.975]) for row in group])
        held = [(ends[:, 0] <= truth[name]) & (truth[name] <= ends[:, 1]) for ends in (t, boot)]
        out[name] = (float(held[0].mean()), float(held[1].mean()))
    return out


ARM_TOKENS = HIGH + 8      # the reason arm's budget: every trace closes and answers (none cut)
METRICS = ("n_questions_complete", "pbs", "accuracy", "answer_share_a", "partial_rho_length_pbs",
           "partial_rho_length_pbs_log10_p", "truncated_rate", *(f"pbs_q{q}" for q in range(1, QUARTILES + 1)))
# each interval the probe logs: the key of its planted value (`planted`)
INTERVALS = {"pbs": "pbs", **{f"pbs_q{q}": f"pbs_q{q}" for q in range(1, QUARTILES + 1)},
             "partial_rho_length_pbs": "partial_rho", "accuracy": "accuracy",
             "partial_rho_length_pbs_spearman": "partial_rho_spearman"}


def reason_arm():
    from fairaudit.prompts.yesno import Arm

    return Arm("reason", True, ARM_TOKENS, "mcq")


def position_mock(plant: PositionPlant, seed: int):
    """(backend=mock planting `plant` with answers [A, B, C, D], its client, the tiny model's spec)."""
    from benchmarks.calibration_influence import mock_context

    return mock_context(seed, answers=["A", "B", "C", "D"], base_sd=plant.base_sd, trace_sd=0.0,
                        trace_tokens={"distribution": "uniform", "low": plant.low, "high": plant.high},
                        position_pref=plant.pref, position_pref_per_1k_tokens=plant.per_1k_tokens)


def template_questions(probe, ctx, variants) -> tuple[pd.DataFrame, int]:
    """(The variants of the questions whose four prompts hold no band word but the template's, that count): a
    question's own band words would add to what its traces read."""
    from fairaudit.probes.decisions import encode

    backend = ctx.client.backend
    counts = [int(backend.in_band[np.minimum(encode(ctx.tokenizer, text), backend.size)].sum())
              for text in probe.render(ctx, variants)]
    most = pd.Series(counts, index=variants.index).groupby(variants["question_id"]).transform("max")
    least = min(counts)
    return variants[most == least].reset_index(drop=True), least


def study_rows(probe, ctx, variants: pd.DataFrame, questions: int, first: int) -> list[dict]:
    """One row per study of `questions` consecutive questions of `variants`: the probe's records through
    `PositionProbe.answer`, analysed by `analysis.position.position` (what `PositionProbe.run` logs)."""
    from fairaudit.analysis.position import arm_metric, position

    records, _ = probe.answer(ctx, variants)
    ids = variants["question_id"].drop_duplicates().to_numpy()
    study_of = pd.Series(np.arange(len(ids)) // questions, index=ids)
    rows = []
    for study, chunk in records.groupby(records["question_id"].map(study_of), sort=True):
        metrics = position(chunk)["metrics"]
        metrics["truncated_rate_reason"] = float(chunk["truncated"].mean())
        ends = {f"{name}_ci_{end}": metrics[arm_metric(f"{name}_ci_{end}", "reason")]
                for name in INTERVALS for end in ("low", "high")}
        rows.append({"study": first + study, **{name: metrics[f"{name}_reason"] for name in METRICS}, **ends})
    return rows


def coverage_flags(rows: pd.DataFrame, truth: dict[str, float]) -> pd.DataFrame:
    """`rows` with covers_<interval>, 1.0 where the study's interval holds its planted value (`planted`)
    and 0.0 where not (a NaN interval holds nothing). # rows: <interval>_ci_low, <interval>_ci_high"""
    from benchmarks.calibration_common import covers

    return rows.assign(**{f"covers_{name}": [float(covers(low, high, truth[key])) for low, high in
                                             zip(rows[f"{name}_ci_low"], rows[f"{name}_ci_high"])]
                          for name, key in INTERVALS.items()})


def run_effect(per_1k_tokens: float, studies: int, questions: int, seed: int, root: str | None = None) -> pd.DataFrame:
    """Every study of one planted growth (per 1,000 tokens), a fresh mock (its own seed) each time the distinct
    questions run out."""
    from benchmarks.calibration_common import quietly
    from benchmarks.calibration_influence import mcq_variants
    from fairaudit.probes import AuditContext
    from fairaudit.probes.position import PositionProbe

    plant = PositionPlant(per_1k_tokens=per_1k_tokens)
    probe = PositionProbe(truncation={"enabled": False})
    rows, kept, prompt_band = [], None, 0
    first = 0
    while first < studies:
        mock_seed = seed * 1000 + round(per_1k_tokens * 10) + 700 + 100_000 * (first + 1)
        backend, client, spec = position_mock(plant, mock_seed)
        data = SimpleNamespace(name="mmlu")
        ctx = AuditContext(client, backend.tokenizer, spec, data, reason_arm())
        if kept is None:
            kept, prompt_band = template_questions(probe, ctx, mcq_variants(root))
        ids = kept["question_id"].drop_duplicates().sample(frac=1.0, random_state=mock_seed % 2**32)
        count = min(len(ids) // questions, studies - first)
        chosen = kept.set_index("question_id").loc[ids.iloc[:count * questions]].reset_index()
        rows += quietly(study_rows)(probe, ctx, chosen, questions, first)
        first += count
    truth = planted(plant, prompt_band)
    return coverage_flags(pd.DataFrame(rows), truth).assign(per_1k_tokens=per_1k_tokens, questions=questions,
                                                            prompt_band=prompt_band)


EFFECTS = (0.0, 20.0, 30.0, 40.0)   # position_pref_per_1k_tokens planted (logit per 1,000 band tokens read)
ALPHA = 0.05
POINTS = ("pbs", "answer_share_a", "accuracy", *(f"pbs_q{q}" for q in range(1, QUARTILES + 1)), "partial_rho")


@functools.cache
def mock_facts() -> tuple[np.ndarray, int]:
    """(The law of a band word's characters, the opener's tokens) of the mock on the tiny model's tokenizer."""
    backend = position_mock(PositionPlant(), 0)[0]
    return word_lengths(backend), len(backend.opener_ids)


def summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per planted growth: the plan's predicted power for the partial correlation's test (`PositionProbe.planned_tests`
    at the planted rho) and the measured rejection rate at ALPHA (with its Clopper-Pearson interval); each point
    metric's planted value, its mean over studies and that mean's standard error; each interval's coverage (its
    share of studies holding the planted value, with a Clopper-Pearson interval)."""
    from benchmarks.calibration_common import share
    from fairaudit.probes.position import PositionProbe

    words, opener = mock_facts()
    out = []
    for per_1k, group in rows.groupby("per_1k_tokens", sort=True):
        questions = int(group["questions"].iloc[0])
        if (group["n_questions_complete"] != questions).any():   # the prediction is for `questions` questions
            raise ValueError(f"effect {per_1k}: a study kept fewer than its {questions} questions (an unparsed answer)")
        truth = position_truth(PositionPlant(per_1k_tokens=per_1k), words, opener, int(group["prompt_band"].iloc[0]))
        planned = PositionProbe().planned_tests(reason_arm(), {"length_rho": truth["partial_rho"]})[0]
        rejected = int((group["partial_rho_length_pbs_log10_p"] <= np.log10(ALPHA)).sum())
        row = {"per_1k_tokens": per_1k, "questions": questions, "studies": len(group),
               "predicted": planned.power(questions, ALPHA), **{f"rejected_{k}": v for k, v in
                                                                share(rejected, len(group)).items()}}
        for name in INTERVALS:
            row |= {f"covers_{name}_{k}": v for k, v in share(int(group[f"covers_{name}"].sum()), len(group)).items()}
        found = group.rename(columns={"partial_rho_length_pbs": "partial_rho"})
        for name in POINTS:
            row |= {f"{name}_truth": truth[name], f"{name}_mean": float(found[name].mean()),
                    f"{name}_se": float(found[name].std(ddof=1) / np.sqrt(len(found)))}
        out.append(row)
    return pd.DataFrame(out)


def pooled_coverage(rows: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Each interval's coverage over every study of every planted growth, with its 95% Clopper-Pearson interval."""
    from benchmarks.calibration_common import share

    return {name: share(int(rows[f"covers_{name}"].sum()), len(rows)) for name in INTERVALS}


def markdown(table: pd.DataFrame, pooled: dict[str, dict[str, float]]) -> str:
    """The test's power predicted and measured (size at no growth), then each point metric: planted, measured;
    then each interval's coverage (%) per growth and pooled."""
    from benchmarks.calibration_common import pct, percent_interval

    lines = ["| planted growth (logit / 1k tokens) | planted partial rho | questions | studies | plan predicts (%) | "
             "measured (%) [95% CI] | measured - predicted (points) |", "|---|---|---|---|---|---|---|"]
    for r in table.itertuples():
        lines.append(f"| {r.per_1k_tokens:g} | {r.partial_rho_truth:.4f} | {r.questions} | {r.studies} | "
                     f"{pct(r.predicted)} | {percent_interval(r.rejected_share, r.rejected_low, r.rejected_high)} | "
                     f"{100 * (r.rejected_share - r.predicted):+.1f} |")
    lines += ["", "| planted growth | " + " | ".join(POINTS) + " |", "|---" * (len(POINTS) + 1) + "|"]
    for r in table.to_dict("records"):
        lines.append(f"| {r['per_1k_tokens']:g} | " + " | ".join(
            f"{r[f'{n}_truth']:.4f} / {r[f'{n}_mean']:.4f} ({r[f'{n}_se']:.4f})" for n in POINTS) + " |")
    interval = lambda c: percent_interval(c["share"], c["low"], c["high"])   # noqa: E731
    lines += ["", "| planted growth | studies | " + " | ".join(INTERVALS) + " |", "|---" * (len(INTERVALS) + 2) + "|"]
    for r in table.to_dict("records"):
        lines.append(f"| {r['per_1k_tokens']:g} | {r['studies']} | " + " | ".join(interval(
            {k: r[f"covers_{name}_{k}"] for k in ("share", "low", "high")}) for name in INTERVALS) + " |")
    lines.append(f"| all | {int(table['studies'].sum())} | " + " | ".join(map(interval, pooled.values())) + " |")
    return "\n".join(lines)
