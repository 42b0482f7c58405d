"""The influence probe's per-transcript records: validity, block lengths and truncation, the 4-gram overlaps
of paper 002 §4.1-4.2, canary reproduction (§4.3), whether the next A turn was natural, and the texts."""

from __future__ import annotations

import pandas as pd

from fairaudit.analysis.influence import BLOCKS, ngram_overlap
from fairaudit.probes import AuditContext
from fairaudit.probes.influence_transcripts import A_PRIVATE, A_PUBLIC, B_PRIVATE, B_PUBLIC, Tags, Trace


def trace_records(ctx: AuditContext, traces: list[Trace], valid: set[int], tags: Tags, ngram: int) -> pd.DataFrame:
    """One row per first-exchange trace: validity, block lengths and truncation, `ngram`-gram overlaps,
    canary reproduction of its canary copy, whether the next A turn was natural, and the texts."""
    tok = ctx.tokenizer
    copies = {(t.question_id, t.condition): t for t in traces if t.canary is not None}
    rows = []
    for t in (t for t in traces if t.canary is None):
        source = tags.content(t.blocks[A_PRIVATE], tok)
        target = tags.content(t.blocks[B_PRIVATE], tok) + tags.content(t.blocks[B_PUBLIC], tok)
        earlier = t.blocks[0].ids + tags.content(t.blocks[A_PUBLIC], tok)
        copy = copies.get((t.question_id, t.condition))
        reproduced = None
        if copy is not None and len(copy.blocks) > B_PUBLIC:
            reproduced = copy.canary in copy.text(tok, B_PRIVATE) + copy.text(tok, B_PUBLIC)
        blocks = dict(zip(BLOCKS, t.generated()))
        rows.append({
            "trace_id": t.trace_id, "question_id": t.question_id, "condition": t.condition,
            "valid": t.trace_id in valid, "natural_a2": t.natural_a2,
            **{f"{name}_tokens": len(t.blocks[i].ids) for name, i in blocks.items()},
            **{f"{name}_truncated": t.is_truncated(i) for name, i in blocks.items()},
            "ngram_raw": ngram_overlap(source, target, ngram),
            "ngram_corrected": ngram_overlap(source, target, ngram, exclude_ids=earlier),
            "canary": None if copy is None else copy.canary, "canary_reproduced": reproduced,
            "text": "".join(tok.decode(list(b.ids)) for b in t.blocks[1:]),
        })
    return pd.DataFrame(rows)
