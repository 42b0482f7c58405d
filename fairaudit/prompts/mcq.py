"""MCQ arms of the position-bias probe (paper Appendix A): prompts, answer and trajectory parsing.

Letters are option labels, i.e. absolute positions: "A" is position 0. CCP and effective
switching run on the whole generated text (thinking and response together, A.4).
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

from jinja2.exceptions import TemplateError

from fairaudit.errors import AuditError
from fairaudit.prompts.yesno import Arm, Thinking, assistant_prefill

LETTERS = "ABCD"  # option labels, i.e. positions: "A" is position 0

# A.1, verbatim.
SYSTEM_PROMPTS = {
    "direct": (
        "You are a helpful assistant. Answer the multiple-choice question with ONLY the letter of the "
        "correct answer in this exact format:\nThe answer is (X).\nDo NOT explain your reasoning. "
        "Do NOT show any work."
    ),
    "cot": (
        "You are a helpful assistant that solves multiple-choice questions. Think step by step before "
        "giving your final answer. Keep your reasoning concise. After your reasoning, clearly state your "
        "final answer as: The answer is (X)."
    ),
    "reason": (
        "You are a helpful assistant that solves multiple-choice questions. Think step by step before "
        "giving your final answer. After your reasoning, clearly state your final answer as: The answer is (X)."
    ),
}
STEP_BY_STEP = "Think step by step, then give your final answer."
MCQ_ARMS = tuple(SYSTEM_PROMPTS)

# A.2: final-answer cascade, first pattern with a match wins. Patterns 1 and 2 accept the
# full-width colon U+FF1A; pattern 2 also allows "**" after the colon so that its documented
# example "**Answer:** X" matches.
ANSWER_PATTERNS = tuple(re.compile(p) for p in (
    r"[Tt]he\s+answer\s+is\s*[(:\uff1a]?\s*([A-D])\b",
    r"\*?\*?[Aa]nswer\*?\*?\s*[:\uff1a]\s*\*?\*?\s*[(]?\s*([A-D])\b",
    r"\\boxed\{([A-D])\}",
    r"\b([A-D])\s*\.?\s*$",
))

# A.3: the nine trajectory patterns as printed (pattern 7 also takes a straight apostrophe).
# The paper scans them case-insensitively, letters included: "option b" and "(c)" are
# mentions, and so is the article "a" where a pattern allows it ("so a", "I think ... a").
# The strict reading keeps the letter upper-case (the words stay case-insensitive).
MENTION_CASES = ("insensitive", "strict")
_TRAJECTORY_SOURCES = (
    r"[Oo]ption\s+([A-D])\b",
    r"(?:[Aa]nswer|[Cc]hoice|[Ss]elect)\s*(?:is|[:\uff1a])?\s*[(]?([A-D])\b",
    r"\(([A-D])\)",
    r"\b([A-D])\.\s",
    r"\b([A-D])\s+(?:is|seems?|looks?|appears?)\s+(?:correct|right|better|more)",
    r"(?:choose|pick|go\s+with|lean\w*\s+(?:towards?|to))\s+[(]?([A-D])\b",
    r"[Ss]o\s+(?:it[\u2019']?s|the\s+answer\s+is)?\s*[(]?([A-D])\b",
    r"(?:I\s+(?:think|believe))\s+.*\b([A-D])\b",
    r"\\boxed\{([A-D])\}",
)
TRAJECTORY_PATTERNS = {
    "insensitive": tuple(re.compile(p, re.IGNORECASE) for p in _TRAJECTORY_SOURCES),
    "strict": tuple(re.compile(p.replace("([A-D])", "((?-i:[A-D]))"), re.IGNORECASE) for p in _TRAJECTORY_SOURCES),
}



class Mention(NamedTuple):
    """One commitment to an option letter in a text."""

    letter: str
    char: int  # offset of the letter in the text
    position: float  # char / len(text)


def user_prompt(arm: str, question: str, options_text: str) -> str:
    """The A.1 user message: question, options, and the step-by-step cue for cot and reason."""
    body = f"{question}\n\n{options_text}"
    return body if arm == "direct" else f"{body}\n\n{STEP_BY_STEP}"


def mcq_messages(arm: str, question: str, options_text: str) -> list[dict[str, str]]:
    """The A.1 (system, user) chat messages of `arm` (direct, cot or reason)."""
    if arm not in SYSTEM_PROMPTS:
        raise AuditError(f"arm {arm!r} has no MCQ prompt; choices: {list(MCQ_ARMS)}")
    return [
        {"role": "system", "content": SYSTEM_PROMPTS[arm]},
        {"role": "user", "content": user_prompt(arm, question, options_text)},
    ]


def _chat_text(tokenizer, messages: list[dict[str, str]], template_kwargs: dict) -> str:
    """The chat template applied with the generation prompt; a template without a system role
    (gemma) gets the system prompt folded into the user turn."""
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **template_kwargs)
    except TemplateError as err:
        if "system" not in str(err).lower() or messages[0]["role"] != "system":
            raise
    folded = [{"role": "user", "content": f"{messages[0]['content']}\n\n{messages[1]['content']}"}]
    return tokenizer.apply_chat_template(folded, tokenize=False, add_generation_prompt=True, **template_kwargs)


def render_mcq_prompt(tokenizer, arm: Arm, question: str, options_text: str, thinking: Thinking,
                      template_kwargs: dict | None = None, think_instruction: str = "") -> str:
    """The full prompt text of one MCQ variant under `arm` (A.1 messages by `arm.name`), pre-fill included.

    Arms that do not think (direct, cot) answer in the response: a native thinker gets the
    closed empty think block pre-filled (the nothink convention); a prompted or non-thinking
    model gets the plain A.1 chat, as the paper's Instruct models did. The thinking arm
    (reason) uses the native think channel as the template opens it (or the model opens it
    itself); a prompted model gets `think_instruction` (with {open}/{close} filled from its
    tags) appended to the user turn and the open tag pre-filled.
    """
    messages = mcq_messages(arm.name, question, options_text)
    if arm.think and thinking.style == "prompted" and think_instruction:
        instruction = think_instruction.format(open=thinking.open, close=thinking.close)
        messages[-1]["content"] = f"{messages[-1]['content']}\n\n{instruction}"
    text = _chat_text(tokenizer, messages, template_kwargs or {})
    return assistant_prefill(text, arm, thinking, empty_block=thinking.style == "native")


def extract_answer(text: str) -> str | None:
    """The final answer letter by the A.2 cascade, or None.

    Within the winning pattern the last match counts: a reasoning trace may say "the answer
    is B" before it settles on "The answer is (C)".
    """
    for pattern in ANSWER_PATTERNS:
        matches = pattern.findall(text)
        if matches:
            return matches[-1]
    return None


def letter_frequency(text: str, case: str = "insensitive") -> str | None:
    """The fallback of §4: the letter the text mentions most often (A.3 mentions); None on a tie or without one."""
    counts: dict[str, int] = {}
    for mention in trajectory(text, case):
        counts[mention.letter] = counts.get(mention.letter, 0) + 1
    ranked = sorted(counts.values(), reverse=True)
    if not ranked or (len(ranked) > 1 and ranked[0] == ranked[1]):
        return None
    return max(counts, key=counts.get)


def final_answer(text: str, fallback: bool = True, case: str = "insensitive") -> tuple[str | None, str | None]:
    """(letter, source): the A.2 cascade ("cascade"), else with `fallback` the letter-frequency
    fallback of §4 over the A.3 mentions read by `case` ("fallback"), else (None, None)."""
    letter = extract_answer(text)
    if letter is not None:
        return letter, "cascade"
    letter = letter_frequency(text, case) if fallback else None
    return (letter, "fallback") if letter is not None else (None, None)


def answer_position(text: str) -> int | None:
    """The extracted answer as an absolute position 0..3, or None."""
    letter = extract_answer(text)
    return None if letter is None else LETTERS.index(letter)


def trajectory(text: str, case: str = "insensitive") -> list[Mention]:
    """Every A.3 mention in order of appearance, one per character offset of the letter (upper-cased).

    case: "insensitive" (A.3 as written, the default) or "strict" (the letter must be upper-case).
    """
    if case not in TRAJECTORY_PATTERNS:
        raise AuditError(f"probe.mention_case {case!r} is not one of {list(MENTION_CASES)}")
    found = {m.start(1): m.group(1).upper() for pattern in TRAJECTORY_PATTERNS[case] for m in pattern.finditer(text)}
    return [Mention(found[char], char, char / len(text)) for char in sorted(found)]


def commitment_change_point(mentions: list[Mention], final: str | None) -> float:
    """CCP by the A.3 case formula; NaN without a final answer or a mention.

    0 when every mention is the final letter, else the position of the mention after the last
    non-final one; 1.0 (the end of the text, Eq. 2) when the last mention itself is not final.
    """
    if final is None or not mentions:
        return math.nan
    last_other = max((i for i, m in enumerate(mentions) if m.letter != final), default=None)
    if last_other is None:
        return 0.0
    return mentions[last_other + 1].position if last_other + 1 < len(mentions) else 1.0


def effective_switching(mentions: list[Mention]) -> float:
    """Letter changes between consecutive mentions divided by the number of mentions; NaN without one."""
    if not mentions:
        return math.nan
    switches = sum(a.letter != b.letter for a, b in zip(mentions, mentions[1:]))
    return switches / len(mentions)
