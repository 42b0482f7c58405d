"""MCQ loading, layouts, sampling and cyclic permutations (fairaudit.data.mcq)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest

from fairaudit.data.mcq import (
    MCQDataset,
    cyclic_permutations,
    format_options,
    parse_questions,
    read_rows,
    split_lettered_options,
)
from fairaudit.errors import AuditError

DATA = Path(os.environ.get("FAIRAUDIT_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
MMLU, OBQA = DATA / "mmlu" / "test.jsonl", DATA / "openbookqa" / "test.jsonl"


def variants(path, n: int | None = None, seed: int = 0, root: str | None = None, name: str = "test") -> pd.DataFrame:
    """The four cyclic variants of `n` questions of a file, as a run reads them (`MCQDataset.variants`)."""
    return MCQDataset(name, n, seed, str(path), root=root).variants()


@pytest.fixture(scope="module")
def mmlu() -> pd.DataFrame:
    return variants(MMLU)


def test_real_files_load_every_question(mmlu):
    assert mmlu["question_id"].nunique() == 2850 and len(mmlu) == 4 * 2850
    obqa = variants(OBQA)
    # README counts 499 rows with `wc -l`; the last record has no trailing newline, so the file holds 500.
    assert OBQA.read_bytes().count(b"\n") == 499
    assert obqa["question_id"].nunique() == 500


@pytest.mark.parametrize("path", [MMLU, OBQA])
def test_gold_letter_is_valid_and_names_its_option(path):
    rows = read_rows(path)
    questions = parse_questions(rows, str(path))
    assert all(row["answer"][0] in "ABCD" for row in rows)
    for row, item in zip(rows, questions.itertuples()):
        assert item.gold_index == "ABCD".index(row["answer"][0])
        assert item.options[item.gold_index] == row["answer"][3:]


@pytest.mark.parametrize("path", [MMLU, OBQA])
def test_options_round_trip_through_format_options(path):
    rows = read_rows(path)
    assert all(format_options(split_lettered_options(row["options"])) == row["options"] for row in rows)


def test_multi_line_option_stays_whole():
    text = "A. x <- 1\n y <- 2\nB. two\nC. three\nD. four"
    assert split_lettered_options(text) == ["x <- 1\n y <- 2", "two", "three", "four"]
    assert format_options(["p", "q", "r", "s"]) == "A. p\nB. q\nC. r\nD. s"


def test_permutation_s_puts_gold_at_k_plus_s_and_rotates_options():
    questions = pd.DataFrame([{"question_id": 7, "question": "Q?", "options": ["w", "x", "y", "z"], "gold_index": 2}])
    variants = cyclic_permutations(questions)
    assert variants["permutation"].tolist() == [0, 1, 2, 3]
    assert variants["gold_position"].tolist() == [2, 3, 0, 1]
    assert variants["options"].tolist() == [["w", "x", "y", "z"], ["z", "w", "x", "y"], ["y", "z", "w", "x"],
                                            ["x", "y", "z", "w"]]
    assert [opts[gold] for opts, gold in zip(variants["options"], variants["gold_position"])] == ["y"] * 4
    assert variants["options_text"].iloc[1] == "A. z\nB. w\nC. x\nD. y"


def test_real_permutations_keep_the_gold_option(mmlu):
    first = mmlu[mmlu["permutation"] == 0].set_index("question_id")
    for row in mmlu.head(40).itertuples():
        original = first.loc[row.question_id]
        assert row.gold_position == (original.gold_position + row.permutation) % 4
        assert row.options[row.gold_position] == original.options[original.gold_position]
        assert [row.options[(j + row.permutation) % 4] for j in range(4)] == original.options


def test_sampling_is_seeded_nested_and_in_file_order():
    small = variants(OBQA, n=5, seed=3)["question_id"].unique().tolist()
    again = variants(OBQA, n=5, seed=3)["question_id"].unique().tolist()
    large = variants(OBQA, n=50, seed=3)["question_id"].unique().tolist()
    other = variants(OBQA, n=5, seed=4)["question_id"].unique().tolist()
    assert small == again == sorted(small) and len(small) == 5
    assert set(small) <= set(large) and small != other


def test_relative_path_reads_under_the_data_root():
    frame = variants("openbookqa/test.jsonl", n=2, seed=0, root=str(DATA))
    assert frame.equals(variants(OBQA, n=2, seed=0))


@pytest.mark.parametrize("n", [0, 501, 2.5])
def test_bad_n_names_the_data_set_and_limit(n):
    message = rf"dataset.n={n!r} is out of range for dataset 'openbookqa': choose 1 <= n <= 500"
    with pytest.raises(AuditError, match=message):
        variants(OBQA, n=n, name="openbookqa")


def test_missing_file_is_named(tmp_path):
    with pytest.raises(AuditError, match="nowhere.jsonl"):
        variants(tmp_path / "nowhere.jsonl")


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("\n".join(json.dumps(row) for row in rows))
    return path


def test_arc_layout_maps_answer_key_and_drops_non_four_option_items(tmp_path):
    rows = [
        {"question": "Q0", "choices": {"text": ["a", "b", "c", "d"], "label": ["A", "B", "C", "D"]}, "answerKey": "C"},
        {"question": "Q1", "choices": {"text": ["a", "b", "c", "d", "e"], "label": list("ABCDE")}, "answerKey": "E"},
        {"question": "Q2", "choices": {"text": ["p", "q", "r", "s"], "label": ["1", "2", "3", "4"]}, "answerKey": "2"},
    ]
    frame = variants(_write_jsonl(tmp_path / "arc.jsonl", rows))
    first = frame[frame["permutation"] == 0]
    assert first["question_id"].tolist() == [0, 2]
    assert first["gold_position"].tolist() == [2, 1]
    assert first["options"].tolist() == [["a", "b", "c", "d"], ["p", "q", "r", "s"]]


def test_hub_mmlu_parquet_layout(tmp_path):
    path = tmp_path / "mmlu.parquet"
    pd.DataFrame({"question": ["Q0", "Q1"], "choices": [["a", "b", "c", "d"], ["e", "f", "g", "h"]],
                  "answer": [3, 0]}).to_parquet(path)
    first = variants(path).query("permutation == 0")
    assert first["gold_position"].tolist() == [3, 0]
    assert first["options"].iloc[1] == ["e", "f", "g", "h"]


def test_gpqa_layout_order_depends_on_question_not_seed(tmp_path):
    rows = [{"Question": f" Q{i} ", "Correct Answer": f"right{i}", "Incorrect Answer 1": "w1",
             "Incorrect Answer 2": "w2", "Incorrect Answer 3": "w3"} for i in range(6)]
    path = tmp_path / "gpqa.json"
    path.write_text(json.dumps(rows))
    a = variants(path, n=6, seed=0).query("permutation == 0")
    b = variants(path, n=6, seed=9).query("permutation == 0")
    assert a["options"].tolist() == b["options"].tolist()
    assert [opts[g] for opts, g in zip(a["options"], a["gold_position"])] == [f"right{i}" for i in range(6)]
    assert a["question"].iloc[0] == "Q0" and sorted(a["options"].iloc[0]) == ["right0", "w1", "w2", "w3"]
    assert a["gold_position"].nunique() > 1


def test_unknown_layout_lists_the_expected_keys(tmp_path):
    with pytest.raises(AuditError, match=r"unknown MCQ layout with keys \['prompt'\].*answerKey"):
        variants(_write_jsonl(tmp_path / "odd.jsonl", [{"prompt": "x"}]))
