"""How `samples.html` shows the position probe's records: one item per question, its four cyclic
permutations side by side (answer letter, its source, length, output, prompt), labelled by how many
permutations were answered correctly."""

from __future__ import annotations

import pandas as pd

from fairaudit.analysis.position import LETTERS
from fairaudit.views.pages import Layout, esc, item


def question_labels(records: pd.DataFrame) -> pd.Series:
    """Each record's question's count of correct answers, e.g. "3/4 correct"."""
    correct = records["answer_position"].eq(records["gold_position"]).fillna(False).astype(int)
    per_question = correct.groupby(records["question_id"]).agg(["sum", "size"])
    labels = {q: f"{int(r['sum'])}/{int(r['size'])} correct" for q, r in per_question.iterrows()}
    return records["question_id"].map(labels)


def question_item(rows: list[dict], group: str) -> str:
    """A question: its permutations side by side."""
    head = "".join(f"<th>permutation {r['permutation']} (gold {LETTERS[int(r['gold_position'])]})</th>" for r in rows)
    body = "".join(question_cell(r) for r in rows)
    return item(group, f"question {esc(rows[0]['question_id'])}<span class=tag>{esc(group)}</span>"
                f"<span class=tag>arm {esc(rows[0]['arm'])}</span>", f"<table><tr>{head}</tr><tr>{body}</tr></table>")


def question_cell(row: dict) -> str:
    """One permutation: the answer letter (green when correct), its source, length, output and prompt."""
    position = row.get("answer_position")
    letter = None if position is None or pd.isna(position) else LETTERS[int(position)]
    css = "none" if letter is None else "yes" if int(position) == int(row["gold_position"]) else "no"
    parts = [f"answer <span class={css}>{letter or 'none'}</span> ({esc(row.get('answer_source', ''))})"
             f" &middot; {int(row.get('length_chars') or 0)} chars",
             f"<details open><summary>output</summary><pre>{esc(row.get('text', ''))}</pre></details>",
             f"<details><summary>prompt</summary><pre>{esc(row.get('prompt', ''))}</pre></details>"
             if "prompt" in row else ""]
    return "<td>" + "".join(parts) + "</td>"


QUESTIONS = Layout("question_id", question_labels, question_item, order=("question_id", "permutation"))
