"""How `samples.html` shows the bbq probe's records: one item per BBQ item, its arms and option orders side by side
(the option chosen and its role, the three options' probabilities, the output and prompt), labelled by whether the
biased option was chosen under every arm, some or none."""

from __future__ import annotations

import pandas as pd

from fairaudit.views.pages import Layout, esc, item

LETTERS = "ABC"


def bias_labels(records: pd.DataFrame) -> pd.Series:
    """Each record's item's label: "biased under every answer", "biased under some", "never biased"."""
    chosen = records["answer_option"].eq(records["biased_option"]).fillna(False).astype(int)
    per_item = chosen.groupby(records["item_id"]).agg(["sum", "size"])
    labels = {i: ("biased under every answer" if r["sum"] == r["size"] else "biased under some" if r["sum"]
                  else "never biased") for i, r in per_item.iterrows()}
    return records["item_id"].map(labels)


def role(row: dict, option) -> str:
    """An original option's role: biased, unknown or other."""
    if option is None or pd.isna(option):
        return "none"
    option = int(option)
    return ("biased" if option == int(row["biased_option"]) else "unknown" if option == int(row["unknown_option"])
            else "other")


def bbq_item(rows: list[dict], group: str) -> str:
    """A BBQ item: its context and question once, then each (arm, option order) as a column."""
    first = rows[0]
    head = "".join(f"<th>arm {esc(r['arm'])}, order {r['permutation']}</th>" for r in rows)
    body = "".join(answer_cell(r) for r in rows)
    about = (f"<p>{esc(first['context'])}<br><b>{esc(first['question'])}</b> ({esc(first['condition'])}, "
             f"{esc(first['polarity'])}; gold: option {int(first['label'])}, biased: option "
             f"{int(first['biased_option'])})</p>")
    return item(group, f"{esc(first['item_id'])}<span class=tag>{esc(group)}</span>",
                f"{about}<table><tr>{head}</tr><tr>{body}</tr></table>")


def answer_cell(row: dict) -> str:
    """One arm and order: the options as shown, the answer (green when correct) with its role, the output."""
    position = row.get("answer_position")
    letter = None if position is None or pd.isna(position) else LETTERS[int(position)]
    option = row.get("answer_option")
    css = "none" if letter is None else "yes" if int(option) == int(row["label"]) else "no"
    shown = "<br>".join(f"{LETTERS[i]}. {esc(text)}" for i, text in enumerate(row.get("shown_options", [])))
    parts = [f"answer <span class={css}>{letter or 'none'}</span> ({role(row, option)}) &middot; "
             f"p biased {row.get('p_biased', float('nan')):.3f}, unknown {row.get('p_unknown', float('nan')):.3f}",
             f"<p>{shown}</p>",
             f"<details open><summary>output</summary><pre>{esc(row.get('text', ''))}</pre></details>",
             f"<details><summary>prompt</summary><pre>{esc(row.get('prompt', ''))}</pre></details>"
             if "prompt" in row else ""]
    return "<td>" + "".join(parts) + "</td>"


ITEMS = Layout("item_id", bias_labels, bbq_item, order=("item_id", "arm", "permutation"))
