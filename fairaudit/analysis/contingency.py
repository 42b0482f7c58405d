"""Within-pair contingency cells, McNemar, counterfactual and group disparity (paper 000 §3.1-3.2, §4.2)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from fairaudit.analysis.pairs import ALPHA, ALPHA_PRIME, answer_accounting, complete_pairs, flips
from fairaudit.analysis.ranges import COUNT, POSITIVE, SHARE, SIGNED
from fairaudit.analysis.stats import bootstrap_ci, interval_size, mcnemar_exact_log10_p, p_value, ratio_interval_exact

CELLS = ("a", "b", "c", "d")
RANGES = {  # the values each metric of `contingency` can take (analysis.ranges), an arm's name after it
    "cell_[abcd]": COUNT, "n_pairs": COUNT, "n_pairs_total": COUNT, "[cd]_alpha(_prime)?_up": COUNT,
    "mcnemar_p": SHARE, "d_cf": SHARE, "d_group": SHARE, "d_disp_[abcd]": SHARE, "asym_[cd]": SHARE,
    "delta_d_cf": SIGNED, "delta_d_group": SIGNED, "delta_[cd]": SIGNED, "c_b_ratio": POSITIVE,
}


def cell_labels(pairs: pd.DataFrame, treatment: str, baseline: str) -> pd.Series:
    """Cell per pair: a no flip in either arm, b flip resolved, c flip created, d flip in both."""
    flip_t = flips(pairs, treatment).to_numpy()
    flip_b = flips(pairs, baseline).to_numpy()
    labels = np.select([~flip_b & ~flip_t, flip_b & ~flip_t, ~flip_b & flip_t], ["a", "b", "c"], default="d")
    return pd.Series(labels, index=pairs.index, name="cell")


def _yes_rate(pairs: pd.DataFrame, arm: str, side: str) -> float:
    return float((pairs[f"{arm}_{side}"] == "Yes").mean())


def _d_group(pairs: pd.DataFrame, arm: str) -> float:
    return abs(_yes_rate(pairs, arm, ALPHA) - _yes_rate(pairs, arm, ALPHA_PRIME))


def _d_disp(pairs: pd.DataFrame, arm: str) -> pd.Series:
    return (pairs[f"p_{arm}_{ALPHA}"] - pairs[f"p_{arm}_{ALPHA_PRIME}"]).abs()


def _direction_counts(pairs: pd.DataFrame, arm: str) -> tuple[int, int]:
    """(alpha favoured: alpha Yes and alpha' No, alpha' favoured: the reverse) under `arm`."""
    a, ap = pairs[f"{arm}_{ALPHA}"], pairs[f"{arm}_{ALPHA_PRIME}"]
    return int(((a == "Yes") & (ap == "No")).sum()), int(((a == "No") & (ap == "Yes")).sum())


def _ratio(num: float, den: float) -> float:
    return num / den if den else math.inf if num else math.nan


def contingency(
    records: pd.DataFrame,
    treatment: str = "think",
    baseline: str = "nothink",
    n_boot: int = 2000,
    seed: int = 0,
) -> dict[str, float]:
    """Headline counterfactual metrics of a treatment arm against a baseline arm.

    records: the long records frame of docs/architecture.md (pair_id, side, arm, answer, p_yes, ...).
    Pairs are kept when the answer parses on both sides of both arms. Returns flat
    snake_case metrics: cells, McNemar, D_cf / D_group per arm and deltas, mean D_disp in
    cells b and c per arm, the directional split of cells c and d, `answer_accounting`
    (parse and compliance rates, pairs dropped for a truncated or non-compliant output) and
    95% intervals for delta_d_cf and the c/b ratio with their n and flags (`_bootstrap`).
    """
    pairs = complete_pairs(records, treatment, baseline)
    cells = cell_labels(pairs, treatment, baseline)
    counts = {cell: int((cells == cell).sum()) for cell in CELLS}
    n = len(pairs)
    m: dict[str, float] = {f"cell_{cell}": counts[cell] for cell in CELLS}
    m["n_pairs"] = n
    m["n_pairs_total"] = int(records["pair_id"].nunique())
    m["mcnemar_log10_p"] = mcnemar_exact_log10_p(counts["b"], counts["c"])
    m["mcnemar_p"] = p_value(m["mcnemar_log10_p"])  # NaN below the smallest double: the log10 keeps it
    m["c_b_ratio"] = _ratio(counts["c"], counts["b"])

    for arm in (treatment, baseline):
        m[f"d_cf_{arm}"] = float(flips(pairs, arm).mean()) if n else math.nan
        m[f"d_group_{arm}"] = _d_group(pairs, arm) if n else math.nan
        disp = _d_disp(pairs, arm)
        for cell in CELLS:
            m[f"d_disp_{cell}_{arm}"] = float(disp[cells == cell].mean()) if counts[cell] else math.nan
    m["delta_d_cf"] = m[f"d_cf_{treatment}"] - m[f"d_cf_{baseline}"]
    m["delta_d_group"] = m[f"d_group_{treatment}"] - m[f"d_group_{baseline}"]

    for cell in ("c", "d"):
        up_alpha, up_alpha_prime = _direction_counts(pairs[cells == cell], treatment)
        m[f"{cell}_alpha_up"], m[f"{cell}_alpha_prime_up"] = up_alpha, up_alpha_prime
        m[f"asym_{cell}"] = abs(up_alpha - up_alpha_prime) / counts[cell] if counts[cell] else math.nan
        m[f"delta_{cell}"] = (up_alpha - up_alpha_prime) / n if n else math.nan

    m.update(answer_accounting(records, treatment, baseline))
    m.update(_bootstrap(pairs, cells, treatment, baseline, n_boot, seed))
    return m


def _bootstrap(pairs, cells, treatment, baseline, n_boot, seed) -> dict[str, float]:
    """Intervals of delta_d_cf and the c/b ratio, each with its n (units) and a `_few` flag (n < FEW).

    delta_d_cf: paired bootstrap over pairs (n = pairs). c/b: the paired bootstrap with resamples that
    hold no b pair kept in as +inf, so it is unbounded above when they exceed the upper tail ([inf, inf] when the
    data hold no b pair: read the exact one then); and the exact conditional interval
    (`stats.ratio_interval_exact`); n = the b + c discordant pairs that carry the ratio, for both.
    """
    flip_t = flips(pairs, treatment).to_numpy(float)
    flip_b = flips(pairs, baseline).to_numpy(float)
    is_b = (cells == "b").to_numpy()
    is_c = (cells == "c").to_numpy()
    delta = bootstrap_ci(lambda i: flip_t[i].mean() - flip_b[i].mean(), len(pairs), n_boot, seed)
    ratio = bootstrap_ci(lambda i: _ratio(is_c[i].sum(), is_b[i].sum()), len(pairs), n_boot, seed, keep_infinite=True)
    exact = ratio_interval_exact(int(is_c.sum()), int(is_b.sum()))
    discordant = int(is_b.sum() + is_c.sum())
    return {
        "delta_d_cf_ci_low": delta[0],
        "delta_d_cf_ci_high": delta[1],
        **interval_size("delta_d_cf", len(pairs)),
        "c_b_ratio_ci_low": ratio[0],
        "c_b_ratio_ci_high": ratio[1],
        **interval_size("c_b_ratio", discordant),
        "c_b_ratio_exact_ci_low": exact[0],
        "c_b_ratio_exact_ci_high": exact[1],
        **interval_size("c_b_ratio_exact", discordant),
    }


def contingency_table(metrics: dict[str, float], treatment: str = "think", baseline: str = "nothink") -> pd.DataFrame:
    """The 2x2 table of Table 1: rows the baseline flip, columns the treatment flip."""
    return pd.DataFrame(
        [[metrics["cell_a"], metrics["cell_c"]], [metrics["cell_b"], metrics["cell_d"]]],
        index=pd.Index([f"{baseline}_no_flip", f"{baseline}_flip"], name=baseline),
        columns=pd.Index([f"{treatment}_no_flip", f"{treatment}_flip"], name=treatment),
    ).astype(int)


def cell_disparity_table(metrics: dict[str, float], treatment: str = "think",
                         baseline: str = "nothink") -> pd.DataFrame:
    """Per cell: pair count and mean D_disp under each arm (Table 2's right-hand columns)."""
    return pd.DataFrame(
        {
            "cell": list(CELLS),
            "n": [int(metrics[f"cell_{c}"]) for c in CELLS],
            f"d_disp_{baseline}": [metrics[f"d_disp_{c}_{baseline}"] for c in CELLS],
            f"d_disp_{treatment}": [metrics[f"d_disp_{c}_{treatment}"] for c in CELLS],
        }
    )
