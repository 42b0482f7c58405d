"""What the calibration studies share (benchmarks/calibration.py and its probes' modules): the mock planting an effect
on Adult's pairs, coverage counts and how a percentage reads, fairaudit's progress bars off while a study runs."""

from __future__ import annotations

import functools
import math

import numpy as np
import pandas as pd

from benchmarks.calibration_truth import Plant
from fairaudit.analysis.stats import clopper_pearson

TRACE = 40                      # fixed trace tokens: "Okay," and band words, the band words carrying the effect
BLOCK = 2000                    # pairs generated at a time (bounds the records' text in memory)


@functools.cache
def band_tokens() -> int:
    """Trace tokens the mock's effect counts: TRACE less its opener ("Okay,"), on the tiny model's tokenizer."""
    from transformers import AutoTokenizer

    from fairaudit.backends.mock import OPENER
    from fairaudit.models.locate import tiny_qwen3_dir

    return TRACE - len(AutoTokenizer.from_pretrained(str(tiny_qwen3_dir())).encode(OPENER, add_special_tokens=False))


def mock_backend(plant: Plant, seed: int):
    """backend=mock planting `plant` on Adult's Male/Female pairs, traces of TRACE tokens."""
    from fairaudit.backends.mock import MockBackend
    from fairaudit.models.locate import tiny_qwen3_dir

    return MockBackend(tiny_qwen3_dir(), seed=seed, trace_tokens={"distribution": "fixed", "median": TRACE},
                       effect=plant.effect, effect_per_1k_tokens=plant.thinking_gap * 1000.0 / band_tokens(),
                       base_sd=plant.base_sd, trace_sd=plant.trace_sd, side_sd=plant.side_sd,
                       protected=["Male", "Female"], neutral=["He", "She", "His", "Her", "Him", "Hers"])


def adult_pairs(count: int, seed: int, root: str | None = None) -> pd.DataFrame:
    """`count` Adult pairs (two rows each, `CounterfactualTabular.pairs`) with distinct texts, drawn with `seed`: a
    repeated text would repeat its mock draws and tie two studies together."""
    from fairaudit.data.tabular import CounterfactualTabular

    def draw(n: int) -> CounterfactualTabular:
        return CounterfactualTabular("adult", n, seed, "sex", "Male", "Female", "Will they earn more than $50K?",
                                     "{description}\nQuestion: {question} Yes or No.", root)

    available = len(draw(1).rows())
    pairs = draw(min(available, math.ceil(1.5 * count) + 50)).pairs()
    text = pairs[pairs["side"] == "alpha"].drop_duplicates("user_message")["pair_id"]
    if len(text) < count:
        raise ValueError(f"Adult holds {len(text)} distinct pairs in the draw, fewer than the {count} asked for")
    return pairs[pairs["pair_id"].isin(set(text.iloc[:count]))].reset_index(drop=True)


def covers(low: float, high: float, truth: float) -> bool:
    """Whether [low, high] holds `truth` (ends included); an interval with a NaN or an infinite low end (the
    bootstrap c/b's [inf, inf] without a b pair) holds nothing."""
    return bool(np.isfinite(low) and not np.isnan(high) and low <= truth <= high)


def share(hits: int, n: int) -> dict[str, float]:
    """A share of n with its 95% Clopper-Pearson interval."""
    low, high = clopper_pearson(hits, n)
    return {"share": hits / n, "low": low, "high": high}


def pct(value: float) -> str:
    """A share in percent, to a tenth of a point."""
    return f"{100 * value:.1f}"


def percent_interval(value: float, low: float, high: float) -> str:
    """A share and its interval in percent: `94.3 [93.0, 95.4]`."""
    return f"{pct(value)} [{pct(low)}, {pct(high)}]"


def quietly(function):
    """`function` with fairaudit's progress bars off while it runs (a bar per block would bury the table), the console
    as it was after (a test calling it in-process keeps its error lines)."""
    @functools.wraps(function)
    def quiet(*args, **kwargs):
        from fairaudit.terminal import progress

        before, progress.console.quiet = progress.console.quiet, True
        try:
            return function(*args, **kwargs)
        finally:
            progress.console.quiet = before
    return quiet
