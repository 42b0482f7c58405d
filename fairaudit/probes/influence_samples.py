"""How `samples.html` shows the influence probe's traces: one item per role-channel transcript (its
validity, block lengths, n-gram overlaps, canary and text), labelled by its visibility graph."""

from __future__ import annotations

from fairaudit.views.pages import Layout, esc, item, three_decimals

FIRST_BLOCKS = ("a_private", "a_public", "b_private", "b_public")


def transcript_item(rows: list[dict], group: str) -> str:
    """A role-channel transcript. # row: trace_id, question_id, condition, valid, *_tokens, ngram_raw,
    ngram_corrected, canary(_reproduced), text"""
    row = rows[0]
    lengths = " &middot; ".join(f"{name} {int(row[f'{name}_tokens'])}" for name in FIRST_BLOCKS)
    facts = (f"{'valid' if row['valid'] else 'invalid'} &middot; tokens: {lengths} &middot; 4-gram overlap raw "
             f"{three_decimals(row['ngram_raw'])}, corrected {three_decimals(row['ngram_corrected'])}")
    if row.get("canary"):
        facts += f" &middot; canary {'reproduced' if row['canary_reproduced'] else 'not reproduced'}"
    return item(group, f"trace {row['trace_id']} &middot; question {esc(row['question_id'])}"
                f"<span class=tag>{esc(group)}</span>", f"<p>{facts}</p><pre>{esc(row['text'])}</pre>")


TRANSCRIPTS = Layout("trace_id", lambda t: t["condition"].astype(str), transcript_item,
                     order=("question_id", "condition"))
