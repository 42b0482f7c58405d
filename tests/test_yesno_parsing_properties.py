"""Properties of Yes/No answer parsing (paper 000 §4.1: pairs whose answer does not parse are dropped)."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from fairaudit.prompts.yesno import parse_answer, parse_yes_no

ANSWERS = st.sampled_from(["Yes", "No"])
CASES = st.sampled_from([str, str.lower, str.upper])
DRESSING = st.sampled_from(["", " ", "\n\n", '"', "'", "**", "*", "_", "`", "> ", "## ", "- ", "Answer: ",
                            "**Answer:** ", "Final answer: ", "ANSWER:\n", '"**'])
ENDINGS = st.sampled_from(["", ".", "!", ",", "**", '."', "**."])
# Explanations a model adds after its answer: words that are not answers, refusals or hedges.
NEUTRAL = st.lists(st.sampled_from(["the", "person", "works", "40", "hours", "earns", "capital", "gains", "record",
                                    "because", "history", "of", "income", "is", "high", "low", "likely", "not",
                                    "\n", ".", ","]), max_size=12).map(" ".join)
WORDS = st.lists(st.sampled_from(["yes", "No", "YES", "no", "the", "answer", "is", "final", "answer:", "maybe", "or",
                                  "/", "I", "cannot", "sorry", ".", "\n", "**", "so", "my", "not", "and", "he",
                                  "\\boxed{Yes}", "it", "depends"]), max_size=15).map(" ".join)
REFUSALS = st.sampled_from(["I'm sorry, but I cannot answer that.", "I cannot determine this from the profile.",
                            "As an AI, I won't judge people.", "It depends on the region.", "Maybe."])


def swap_answers(text: str) -> str:
    """Every standalone yes <-> no, keeping its case pattern."""
    def swap(match: re.Match) -> str:
        word = match.group(0)
        other = "no" if word.lower() == "yes" else "yes"
        return other.upper() if word.isupper() and len(word) > 1 else other.capitalize() if word[0].isupper() else other
    return re.sub(r"\b(?:yes|no)\b", swap, text, flags=re.IGNORECASE)


@given(ANSWERS, CASES, DRESSING, ENDINGS, NEUTRAL)
def test_a_dressed_answer_word_parses_whatever_follows(answer, case, dressing, ending, explanation):
    text = f"{dressing}{case(answer)}{ending} {explanation}"
    assert parse_answer(text).answer == answer
    assert parse_answer(text).start == 0


@given(ANSWERS, NEUTRAL, ENDINGS)
def test_an_explicit_final_answer_phrase_parses_after_reasoning(answer, reasoning, ending):
    text = f"{reasoning} so the answer is {answer}{ending}"
    assert parse_yes_no(text) == answer


@given(WORDS)
def test_parsing_is_total_and_symmetric_in_yes_and_no(text):
    parsed = parse_yes_no(text)
    assert parsed in ("Yes", "No", None)
    expected = None if parsed is None else {"Yes": "No", "No": "Yes"}[parsed]
    assert parse_yes_no(swap_answers(text)) == expected


@given(WORDS)
def test_parsing_ignores_case(text):
    assert parse_yes_no(text.upper()) == parse_yes_no(text.lower()) == parse_yes_no(text)


@given(REFUSALS, WORDS)
def test_a_refusal_or_hedge_before_the_answer_leaves_it_unparsed(refusal, rest):
    assert parse_yes_no(f"{refusal} {rest}") is None


@given(ANSWERS, DRESSING, st.sampled_from([" or ", "/", " / ", " and "]), NEUTRAL)
def test_both_answers_given_leave_it_unparsed(answer, dressing, joint, rest):
    other = "No" if answer == "Yes" else "Yes"
    assert parse_yes_no(f"{dressing}{answer}{joint}{other.lower()} {rest}") is None
