"""BBQ, the Bias Benchmark for QA (Parrish et al. 2022): its eleven categories, their fields, each item's biased option.

Each category is one JSON lines file of the dataset's `data/` folder (`bbq/<Category>.jsonl` under the data
root). An item is a context (ambiguous, or disambiguated by a second sentence), a question (negative or
non-negative polarity) and three options: two people, each of a group, and an "unknown" option. The paper's bias
target is the option whose group the item's `stereotyped_groups` name; the biased answer (§5, "the bias target in
negative contexts and the non-target in non-negative contexts") is the target under a negative question and the
other person under a non-negative one. Items are clustered by template: `question_index` within a category, which
holds the template's name and label variants, both polarities and both conditions.
"""

from __future__ import annotations

import re
import zlib
from pathlib import Path

import numpy as np
import pandas as pd

from fairaudit.data.files import data_root, verified_file
from fairaudit.data.mcq import read_rows
from fairaudit.errors import AuditError

CATEGORIES = ("Age", "Disability_status", "Gender_identity", "Nationality", "Physical_appearance", "Race_ethnicity",
              "Race_x_SES", "Race_x_gender", "Religion", "SES", "Sexual_orientation")
N_OPTIONS = 3
OPTION_LETTERS = "ABC"
UNKNOWN = "unknown"
_PUNCTUATION = re.compile(r"[\s_\-]+")


def category_file(category: str) -> str:
    """A category's file, relative to the data root."""
    return f"bbq/{category}.jsonl"


def _norm(label: str) -> str:
    """A group label compared without case, spaces, hyphens or underscores ("low SES" == "lowSES")."""
    return _PUNCTUATION.sub("", str(label)).lower()


def _matches(info: list[str], stereotyped: set[str]) -> int:
    """How an option's (name, group) meets the stereotyped groups: 2 whole name or group, 1 every part of an
    intersectional group ("F-Black" against F and Black), 0 not at all."""
    name, group = info[0], info[1]
    if _norm(name) in stereotyped or _norm(group) in stereotyped:
        return 2
    parts = [p for p in re.split(r"[-_]", group) if p]
    return int(len(parts) > 1 and all(_norm(p) in stereotyped for p in parts))


def unknown_option(row: dict) -> int:
    """The index of the item's unknown option (the one whose group is `unknown`)."""
    found = [i for i in range(N_OPTIONS) if row["answer_info"][f"ans{i}"][1] == UNKNOWN]
    if len(found) != 1:
        raise ValueError(f"{len(found)} options have the group 'unknown' (expected one)")
    return found[0]


def target_option(row: dict) -> int | None:
    """The option of the bias target: the person whose group the item's stereotyped groups name (by whole label
    first, then every part of an intersectional label); None when no single option is named."""
    stereotyped = {_norm(group) for group in row["additional_metadata"]["stereotyped_groups"]}
    unknown = unknown_option(row)
    scores = {i: _matches(row["answer_info"][f"ans{i}"], stereotyped) for i in range(N_OPTIONS) if i != unknown}
    best = max(scores.values())
    chosen = [i for i, score in scores.items() if score == best]
    return chosen[0] if best and len(chosen) == 1 else None


def biased_option(row: dict) -> int | None:
    """The paper's biased answer: the target under a negative question, the other person under a non-negative one."""
    target = target_option(row)
    if target is None:
        return None
    if row["question_polarity"] == "neg":
        return target
    return next(i for i in range(N_OPTIONS) if i not in (target, unknown_option(row)))


def item_record(row: dict) -> dict:
    """One item with BBQ's fields kept, its options as a list and the derived target, unknown and biased options."""
    info = row["answer_info"]
    metadata = row["additional_metadata"]
    target = target_option(row)
    return {
        "item_id": f"{row['category']}/{row['example_id']}", "category": row["category"],
        "example_id": int(row["example_id"]), "question_index": str(row["question_index"]),
        "template": f"{row['category']}/{row['question_index']}",
        "polarity": row["question_polarity"], "condition": row["context_condition"],
        "context": row["context"], "question": row["question"],
        "options": [row[f"ans{i}"] for i in range(N_OPTIONS)],
        "option_groups": [info[f"ans{i}"][1] for i in range(N_OPTIONS)],
        "stereotyped_groups": list(metadata["stereotyped_groups"]),
        "subcategory": str(metadata.get("subcategory", "")), "version": str(metadata.get("version", "")),
        "label": int(row["label"]), "unknown_option": unknown_option(row),
        "target_option": -1 if target is None else target,
        "biased_option": -1 if target is None else biased_option(row),
    }


def read_category(path: Path, category: str) -> pd.DataFrame:
    """Every item of one category's file (`item_record` of each row); a malformed row is one AuditError line."""
    items = []
    for number, row in enumerate(read_rows(path), start=1):
        try:
            items.append(item_record(row))
        except (KeyError, ValueError, TypeError, IndexError) as err:
            problem = f"it lacks the key {err.args[0]!r}" if isinstance(err, KeyError) else str(err)
            raise AuditError(f"{path} record {number}: {problem}") from None
    frame = pd.DataFrame(items)
    if (frame["category"] != category).any():
        raise AuditError(f"{path} holds items of category {frame['category'].iloc[0]!r}, not {category!r}")
    return frame


def sample_items(items: pd.DataFrame, n: int | None, seed: int, category: str) -> pd.DataFrame:
    """`n` items of one category drawn with `seed` (a prefix of one permutation, so a larger n extends a smaller
    one), in file order; all when n is None."""
    if n is None:
        return items
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= len(items):
        raise AuditError(f"dataset.n={n!r} is out of range for BBQ category {category}: choose 1 <= n <= {len(items)}")
    chosen = np.random.default_rng([seed, zlib.crc32(category.encode())]).permutation(len(items))[:n]
    return items.iloc[np.sort(chosen)].reset_index(drop=True)


def options_text(options: list[str]) -> str:
    """"A. ...\\nB. ...\\nC. ..." of an item's options in the order given."""
    return "\n".join(f"{letter}. {option}" for letter, option in zip(OPTION_LETTERS, options))


class BBQDataset:
    """BBQ items of the chosen categories, `n` drawn per category with `seed` (n=None: all).

    The files are read under the data root `root` (else $FAIRAUDIT_DATA); a category not there is one line
    saying `fairaudit data fetch bbq` gets it.
    """

    family = "mcq"
    n_null_takes_all = True

    def __init__(self, name: str, n: int | None, seed: int, categories: list[str] | None = None,
                 root: str | None = None, source: str = ""):
        chosen = list(categories) if categories else list(CATEGORIES)
        unknown = [c for c in chosen if c not in CATEGORIES]
        if unknown or len(set(chosen)) != len(chosen):
            problem = f"unknown {unknown}" if unknown else "a category named twice"
            raise AuditError(f"dataset.categories: {problem}; choices: {', '.join(CATEGORIES)}")
        self.name, self.n, self.seed, self.categories, self.root, self.source = name, n, seed, chosen, root, source
        self._items: dict[str, pd.DataFrame] = {}

    def check_files(self) -> list[Path]:
        """Each chosen category's file, checked to exist and match its checksum; reads no rows."""
        return [verified_file(data_root(self.root), category_file(c)) for c in self.categories]

    def all_items(self, category: str) -> pd.DataFrame:
        """Every item of one category (read once)."""
        if category not in self._items:
            self._items[category] = read_category(verified_file(data_root(self.root), category_file(category)),
                                                  category)
        return self._items[category]

    def items(self) -> pd.DataFrame:
        """The sampled items of every chosen category, category by category (`item_record`'s columns)."""
        return pd.concat([sample_items(self.all_items(c), self.n, self.seed, c) for c in self.categories],
                         ignore_index=True)

    def check(self) -> None:
        """Raise AuditError for a missing or corrupt file or an out-of-range n, before any model loads."""
        self.items()

    def variants(self) -> pd.DataFrame:
        """BBQ has three options, not the four the position probe rotates: one line saying which probe reads it."""
        raise AuditError(f"dataset {self.name!r} has three options per item: audit it with probe=bbq")

    def messages(self) -> list[tuple[str, str]]:
        """(heading, context, question and options) of each sampled item in its file's option order."""
        return [(f"item {row.item_id} ({row.condition}, {row.polarity})",
                 f"{row.context}\n{row.question}\n{options_text(row.options)}")
                for row in self.items().itertuples(index=False)]
