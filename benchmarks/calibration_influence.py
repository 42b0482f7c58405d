"""The influence probe calibrated on a planted NLL shift (benchmarks/calibration.py runs it and prints its table).

Per planted shift (backend.influence_nll: 0 and three effects) mocks with their own seeds write and score
transcripts of distinct MMLU questions through the probe's own path (`InfluenceProbe.measure`: the writer, the
donors, the contrast scorer and `analysis.influence`) under the unmasked graph (masked: the target never sees
the source, so Delta = 0 and every rate is 0 by construction). Each study's `items` questions give `items`
contrasts per direction; measured per influence rate (Delta > 0 and > 0.05, A->B and B->A): the share of studies
whose Wilson interval holds the planted rate, against its nominal 0.95 and against the exact coverage of the
Wilson interval at that n and rate, and the mean width against `power.expected_wilson_width` (the plan's
prediction).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd

from benchmarks.calibration_common import quietly
from benchmarks.calibration_truth import influence_rate, wilson_coverage
from fairaudit.analysis.power import expected_wilson_width
from fairaudit.analysis.stats import clopper_pearson

SHIFTS = (0.0, 0.25, 0.5, 1.0)
THRESHOLDS = {"influence": 0.0, "substantive": 0.05}
RATES = [(name, direction) for name in THRESHOLDS for direction in ("a_to_b", "b_to_a")]
BLOCK_TOKENS = 16      # probe.max_block_tokens; the mock writes 12 (a fixed trace), so no block is cut


def mcq_variants(root: str | None = None) -> pd.DataFrame:
    """MMLU's questions in their four cyclic permutations, one question per distinct text (a repeated text would
    repeat its mock draws). # question_id, permutation, gold_position, question, options, options_text"""
    from fairaudit.data.mcq import MCQDataset

    variants = MCQDataset("mmlu", None, 0, "mmlu/test.jsonl", root=root).variants()
    first = variants[variants["permutation"] == 0].drop_duplicates("question")
    return variants[variants["question_id"].isin(set(first["question_id"]))].reset_index(drop=True)


def mcq_items(root: str | None = None) -> pd.DataFrame:
    """MMLU's distinct questions in their original option order (`mcq_variants`' permutation 0)."""
    variants = mcq_variants(root)
    return variants[variants["permutation"] == 0].reset_index(drop=True)


class Uncached:
    """The two calls the influence probe makes of its client, straight to the backend: the store's bookkeeping
    (a payload and a row per request) would cost more than the mock's answers, and is not what is calibrated."""

    def __init__(self, backend):
        self.backend = backend

    def generate(self, requests, label: str = ""):
        return self.backend.generate(requests)

    def target_nll(self, requests, label: str = ""):
        return self.backend.target_nll(requests)


def mock_context(seed: int, **settings):
    """(backend=mock with these settings on the tiny model's tokenizer, its client, the tiny model's spec)."""
    from omegaconf import OmegaConf

    from fairaudit.backends.mock import MockBackend
    from fairaudit.job.config import model_spec
    from fairaudit.models.locate import tiny_qwen3_dir

    backend = MockBackend(tiny_qwen3_dir(), seed=seed, **settings)
    spec = model_spec(OmegaConf.load(Path(__file__).resolve().parents[1] / "conf/model/tiny_qwen3.yaml"))
    return backend, Uncached(backend), spec


def study_metrics(probe, client, tokenizer, spec, items: pd.DataFrame) -> dict[str, float]:
    """The probe's metrics on one study's questions."""
    from fairaudit.probes import AuditContext
    from fairaudit.prompts.yesno import Arm

    data = SimpleNamespace(name="mmlu", variants=lambda: items)
    return probe.measure(AuditContext(client, tokenizer, spec, data, Arm("think", True, 8)))[2]["metrics"]


@quietly
def run_shift(shift: float, studies: int, items: int, seed: int, root: str | None = None) -> pd.DataFrame:
    """One row per study of one planted shift: each rate with its Wilson interval and n."""
    from fairaudit.probes.influence import InfluenceProbe

    questions = mcq_items(root)
    per_mock = len(questions) // items
    probe = InfluenceProbe(conditions=["unmasked"], max_block_tokens=BLOCK_TOKENS, control=False,
                           canary={"enabled": False})
    rows = []
    for first in range(0, studies, per_mock):   # a fresh mock (its own seed) when the questions run out
        mock_seed = seed * 1000 + round(shift * 100) + 100_000 * (first // per_mock)
        backend, client, spec = mock_context(mock_seed, trace_tokens={"distribution": "fixed", "median": 12},
                                             influence_nll=shift)
        order = questions.sample(frac=1.0, random_state=mock_seed % 2**32).reset_index(drop=True)
        for study in range(first, min(first + per_mock, studies)):
            chosen = order.iloc[(study - first) * items:(study - first + 1) * items]
            metrics = study_metrics(probe, client, backend.tokenizer, spec, chosen)
            row = {"study": study, "shift": shift, "items": items}
            for name, direction in RATES:
                key = f"{name}_rate_{direction}_unmasked"
                row |= {key: metrics[key], f"{key}_ci_low": metrics[f"{key}_ci_low"],
                        f"{key}_ci_high": metrics[f"{key}_ci_high"], f"{key}_n": metrics[f"{key}_ci_n"]}
            rows.append(row)
    return pd.DataFrame(rows)


def summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per shift and rate: the planted rate, coverage measured (with its Clopper-Pearson interval) and exact, the
    mean Wilson width measured and predicted."""
    out = []
    for shift, group in rows.groupby("shift", sort=True):
        for name, direction in RATES:
            key = f"{name}_rate_{direction}_unmasked"
            truth, n = influence_rate(shift, THRESHOLDS[name]), group[f"{key}_n"].to_numpy()
            if not (n == n[0]).all():
                raise ValueError(f"{key}: studies of shift {shift} differ in contrasts ({sorted(set(n))})")
            low, high = group[f"{key}_ci_low"].to_numpy(), group[f"{key}_ci_high"].to_numpy()
            hits = int(((low <= truth) & (truth <= high)).sum())
            ci = clopper_pearson(hits, len(group))
            out.append({"shift": shift, "rate": f"{name} {direction.replace('_to_', '->').upper()}",
                        "truth": truth, "contrasts": int(n[0]), "studies": len(group), "coverage": hits / len(group),
                        "coverage_low": ci[0], "coverage_high": ci[1], "exact": wilson_coverage(int(n[0]), truth),
                        "width": float(np.mean(high - low)), "width_predicted": expected_wilson_width(int(n[0]), truth),
                        "mean_rate": float(group[key].mean())})
    return pd.DataFrame(out)


def markdown(table: pd.DataFrame) -> str:
    """A row per shift and rate: truth, coverage measured and exact (%), width measured and predicted."""
    from benchmarks.calibration_common import percent_interval

    lines = ["| planted shift (nats/token) | rate | planted rate | mean measured rate | contrasts | studies | "
             "coverage (%) [95% CI] | Wilson's exact coverage (%) | mean width | predicted width |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in table.itertuples():
        lines.append(f"| {r.shift:g} | {r.rate} | {r.truth:.4f} | {r.mean_rate:.4f} | {r.contrasts} | {r.studies} | "
                     f"{percent_interval(r.coverage, r.coverage_low, r.coverage_high)} | "
                     f"{100 * r.exact:.1f} | {r.width:.4f} | {r.width_predicted:.4f} |")
    return "\n".join(lines)
