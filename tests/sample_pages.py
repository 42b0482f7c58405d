"""Shared by the samples tests: written sample pages read back, and a small set of paired records."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from fairaudit.tracking import samples
from fairaudit.views.pages import Layout


def artifacts(records: pd.DataFrame, layout: Layout, title: str, folder: Path | None = None) -> dict[str, str]:
    """{file relative to the run's artifacts: text} of the written samples."""
    import tempfile

    folder = folder or Path(tempfile.mkdtemp())
    paths = samples.write(records, layout, title, folder)
    return {p.relative_to(folder).as_posix(): p.read_text() for p in paths}


def decision_records() -> pd.DataFrame:
    """Three pairs: p1 flips under think only (cell c), p2 flips under both (d), p3 has an unparsed answer."""
    answers = {  # (pair, arm) -> (alpha answer, alpha' answer)
        ("p1", "think"): ("Yes", "No"), ("p1", "nothink"): ("No", "No"),
        ("p2", "think"): ("Yes", "No"), ("p2", "nothink"): ("No", "Yes"),
        ("p3", "think"): (None, "No"), ("p3", "nothink"): ("Yes", "Yes"),
    }
    rows = []
    for (pair, arm), sides in answers.items():
        for side, value, answer in zip(("alpha", "alpha_prime"), ("Male", "Female"), sides):
            rows.append({"pair_id": pair, "side": side, "attribute_value": value, "arm": arm, "answer": answer,
                         "p_yes": 0.75 if answer == "Yes" else float("nan") if answer is None else 0.25,
                         "trace_tokens": 3 if arm == "think" else 0,
                         "prompt": f"This person is a {value} <b>{pair}</b>",
                         "trace": f"thinking about {pair} {value}" if arm == "think" else "",
                         "text": f"{answer}"})
    return pd.DataFrame(rows)
