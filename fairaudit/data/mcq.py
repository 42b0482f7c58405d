"""Four-option MCQ files and their cyclic permutations (position-bias paper, §3.2, §3.5).

Accepted layouts, detected from the first record of a local JSONL, JSON or parquet file:

- lettered (the shared MMLU / OpenBookQA files): `question`, `options` = "A. ...\\nB. ...",
  `answer` = "D. ..." whose first character is the gold letter;
- labelled choices (ARC, OpenBookQA on the hub): `question` (or `question_stem`),
  `choices` = {"text": [...], "label": [...]}, `answerKey`;
- choice list (MMLU on the hub): `question`, `choices` = [...], `answer` = gold index;
- GPQA: `Question`, `Correct Answer`, `Incorrect Answer 1..3` (the hub's .csv files); the
  four options are put in an order fixed by the question text (not by the sampling seed).

Items without exactly four options are dropped, as in the paper. `question_id` is the
item's 0-based row in the file, so ids stay stable across `n` and `seed`.
"""

from __future__ import annotations

import json
import re
import string
import zlib
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from fairaudit.data.files import data_root, verified_file
from fairaudit.errors import AuditError

N_OPTIONS = 4
GPQA_INCORRECT = ("Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")

Item = tuple[str, list[str], int]  # question, options, gold index


def format_options(options: list[str]) -> str:
    """The paper's {options_text}: one "X. option" line per option, lettered from A."""
    return "\n".join(f"{letter}. {option}" for letter, option in zip(string.ascii_uppercase, options))


def split_lettered_options(text: str) -> list[str] | None:
    """Options of an "A. ...\\nB. ..." string (inverse of `format_options`), None if it does not start at "A. ".

    An option may span lines: only a line opening with the next expected letter starts a new option.
    """
    if not text.startswith("A. "):
        return None
    starts = [0]
    for letter in string.ascii_uppercase[1:]:
        at = text.find(f"\n{letter}. ", starts[-1])
        if at < 0:
            break
        starts.append(at + 1)
    ends = [start - 1 for start in starts[1:]] + [len(text)]
    return [text[start + 3 : end] for start, end in zip(starts, ends)]


def _lettered(row: dict) -> Item:
    if not isinstance(row["options"], str):
        raise ValueError(f"options must be one string reading 'A. ...\\nB. ...', not a {type(row['options']).__name__}")
    options = split_lettered_options(row["options"])
    if options is None or not row["answer"] or row["answer"][0] not in string.ascii_uppercase[: len(options)]:
        raise ValueError("options must read 'A. ...\\nB. ...' and answer must start with one of their letters")
    return row["question"], options, string.ascii_uppercase.index(row["answer"][0])


def _labelled_choices(row: dict) -> Item:
    choices = row["choices"]
    labels = [str(label) for label in choices["label"]]
    question = row["question"] if "question" in row else row["question_stem"]
    return question, [str(text) for text in choices["text"]], labels.index(str(row["answerKey"]))


def _choice_list(row: dict) -> Item:
    return row["question"], [str(choice) for choice in row["choices"]], int(row["answer"])


def _gpqa(row: dict) -> Item:
    question = row["Question"].strip()
    answers = [row["Correct Answer"], *(row[key] for key in GPQA_INCORRECT)]
    order = np.random.default_rng(zlib.crc32(question.encode())).permutation(N_OPTIONS)
    return question, [str(answers[i]).strip() for i in order], int(np.argmax(order == 0))


# (name, keys that identify it, converter); the first layout whose keys the record holds wins.
LAYOUTS: tuple[tuple[str, frozenset[str], Callable[[dict], Item]], ...] = (
    ("lettered", frozenset({"question", "options", "answer"}), _lettered),
    ("labelled choices", frozenset({"choices", "answerKey"}), _labelled_choices),
    ("choice list", frozenset({"question", "choices", "answer"}), _choice_list),
    ("gpqa", frozenset({"Question", "Correct Answer", *GPQA_INCORRECT}), _gpqa),
)


def _json_rows(path: Path) -> list[dict]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            pass  # hub exports often write JSON lines under a .json name
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise AuditError(f"{path} line {number} is not valid JSON: {err.msg}") from None
    return rows


def read_rows(path: Path) -> list[dict]:
    """Raw records of a .jsonl, .json, .parquet or .csv file; a file that cannot be read as one is one AuditError
    line naming the file, the line and the problem."""
    if path.suffix not in (".jsonl", ".json", ".parquet", ".csv"):
        raise AuditError(f"{path}: unsupported file type {path.suffix!r}; choices: .jsonl, .json, .parquet, .csv")
    try:
        if path.suffix == ".parquet":
            rows = pd.read_parquet(path).to_dict("records")
        elif path.suffix == ".csv":
            rows = pd.read_csv(path, dtype=str, keep_default_na=False, encoding="utf-8").to_dict("records")
        else:
            rows = _json_rows(path)
    except UnicodeDecodeError:
        raise AuditError(_not_utf8(path)) from None
    except pd.errors.ParserError as error:
        raise AuditError(f"{path}: {_csv_problem(str(error))}") from None
    except (OSError, ValueError) as error:  # pyarrow's ArrowInvalid is a ValueError
        if path.suffix != ".parquet":
            raise
        raise AuditError(f"{path} is not a readable parquet file ({' '.join(str(error).split())})") from None
    if not isinstance(rows, list) or not rows or not all(isinstance(row, dict) for row in rows):
        raise AuditError(f"{path} holds no records (expected one JSON object per question)")
    return rows


def _not_utf8(path: Path) -> str:
    """Where a file stops being UTF-8: its line, and the byte that is not."""
    data = path.read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        return (f"{path} line {line} is not UTF-8 text (byte 0x{data[error.start]:02x}, {error.reason}): save the "
                "file as UTF-8")
    return f"{path} is not UTF-8 text: save it as UTF-8"


def _csv_problem(message: str) -> str:
    """pandas' CSV parser error as a line number and the problem (its rows count the header as row 0)."""
    found = re.search(r"(EOF inside string) starting at row (\d+)", message)
    if found:
        return f"line {int(found[2]) + 1} opens a quoted field that is never closed"
    found = re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", message)
    if found:
        return f"line {found[2]} has {found[3]} fields, the header {found[1]}"
    return " ".join(message.split())


def parse_questions(rows: list[dict], source: str) -> pd.DataFrame:
    """One row per four-option item: question_id, question, options (list), gold_index."""
    converter = next((conv for _, keys, conv in LAYOUTS if keys <= rows[0].keys()), None)
    if converter is None:
        layouts = "; ".join(f"{name}: {sorted(keys)}" for name, keys, _ in LAYOUTS)
        raise AuditError(f"{source}: unknown MCQ layout with keys {sorted(rows[0])}; expected one of {layouts}")
    items = []
    for index, row in enumerate(rows):
        try:
            question, options, gold = converter(row)
        except (KeyError, ValueError, TypeError) as err:
            problem = f"it lacks the key {err.args[0]!r}" if isinstance(err, KeyError) else f"{err}"
            raise AuditError(f"{source} {_place(source, index)}: {problem}") from None
        if not 0 <= gold < len(options):
            raise AuditError(f"{source} record {index}: gold answer index {gold} is outside its {len(options)} options")
        if len(options) == N_OPTIONS:
            items.append({"question_id": index, "question": question, "options": options, "gold_index": gold})
    if not items:
        raise AuditError(f"{source} has no item with exactly {N_OPTIONS} options")
    return pd.DataFrame(items)


def _place(source: str, index: int) -> str:
    """Where record `index` of a file is: its line in a JSON lines file, its row in a table."""
    path = Path(source)
    if path.suffix in (".jsonl", ".json") and path.is_file():
        lines = [n for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1) if line.strip()]
        if len(lines) > index and path.read_text(encoding="utf-8").lstrip()[:1] != "[":
            return f"line {lines[index]}"
    return f"record {index}" if path.suffix != ".csv" else f"row {index + 1} below the header"


def sample_questions(questions: pd.DataFrame, n: int | None, seed: int, source: str) -> pd.DataFrame:
    """`n` questions drawn without replacement with `seed` (all when n is None), in file order.

    A larger n with the same seed extends a smaller one: the draw is a prefix of one permutation.
    """
    available = len(questions)
    if n is None:
        return questions
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= available:
        raise AuditError(f"dataset.n={n!r} is out of range for {source}: choose 1 <= n <= {available}")
    chosen = np.random.default_rng(seed).permutation(available)[:n]
    return questions.iloc[np.sort(chosen)].reset_index(drop=True)


def cyclic_permutations(questions: pd.DataFrame) -> pd.DataFrame:
    """Four variants per question; permutation s moves every option j to (j + s) mod 4.

    questions: question_id, question, options, gold_index. Returns question_id, permutation,
    gold_position (= (gold_index + s) mod 4), question, options (rotated list), options_text.
    """
    rows = []
    for item in questions.itertuples(index=False):
        for s in range(N_OPTIONS):
            options = [item.options[(j - s) % N_OPTIONS] for j in range(N_OPTIONS)]
            rows.append({
                "question_id": item.question_id,
                "permutation": s,
                "gold_position": (item.gold_index + s) % N_OPTIONS,
                "question": item.question,
                "options": options,
                "options_text": format_options(options),
            })
    return pd.DataFrame(rows)


def resolve_path(path: str | Path, root: str | None = None) -> Path:
    """An absolute path as given; a relative one under the data root, checksum-verified when it is a known file."""
    path = Path(path).expanduser()
    if not path.is_absolute():
        return verified_file(data_root(root), path.as_posix())  # its missing-file error says how to fetch it
    if not path.is_file():
        raise AuditError(f"MCQ file {path} does not exist")
    return path


class MCQDataset:
    """A four-option MCQ file sampled with `seed` and asked in its four cyclic permutations.

    `path` is absolute, or relative to the data root `root` (else $FAIRAUDIT_DATA); files
    that are not shipped (ARC, GPQA) are given by the user, `source` says where to get them.
    n=None takes every question.
    """

    family = "mcq"
    n_null_takes_all = True   # dataset.n=null: every question of the file

    def __init__(self, name: str, n: int | None, seed: int, path: str | None, root: str | None = None,
                 source: str = ""):
        self.name, self.n, self.seed, self.path, self.root, self.source = name, n, seed, path, root, source
        self._questions: pd.DataFrame | None = None

    def check_files(self) -> Path:
        """The file, once checked to exist (and match its checksum where one is known); reads no rows."""
        if not self.path:
            where = f" ({self.source})" if self.source else ""
            raise AuditError(f"dataset {self.name!r} needs dataset.path=<file>: it is not shipped; get it{where}")
        return resolve_path(self.path, self.root)

    def questions(self) -> pd.DataFrame:
        """Every four-option item of the file (read and parsed once)."""
        if self._questions is None:
            resolved = self.check_files()
            self._questions = parse_questions(read_rows(resolved), str(resolved))
        return self._questions

    def check(self) -> None:
        """Raise AuditError for a missing or unreadable file or an out-of-range n, before any model loads."""
        sample_questions(self.questions(), self.n, self.seed, f"dataset {self.name!r}")

    def variants(self) -> pd.DataFrame:
        """The sampled questions in their four cyclic permutations (see `cyclic_permutations`)."""
        return cyclic_permutations(sample_questions(self.questions(), self.n, self.seed, f"dataset {self.name!r}"))

    def messages(self) -> list[tuple[str, str]]:
        """(heading, question and options) of each permutation of each sampled question, before a chat template
        renders them (a dry run shows these when no tokenizer is at hand)."""
        return [(f"question {row.question_id}, permutation {row.permutation}", f"{row.question}\n{row.options_text}")
                for row in self.variants().itertuples(index=False)]
