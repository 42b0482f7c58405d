"""Arms for Yes/No decisions (paper 000 Appendix E): chat prompts, pre-fills, force-answer suffixes, parsing.

How a model thinks is its `thinking.style`:
- native: the chat template opens the think channel (Qwen3, QwQ, R1-Distill);
- prompted: an instruction asks for reasoning inside the think tags and the assistant turn
  is pre-filled with the open tag (gemma, llama, the embedded SmolLM2; paper Appendix D);
- none: the model does not think; only arms that do not think apply.
The nothink arm pre-fills the assistant turn with a closed empty think block.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fairaudit.errors import AuditError

P_YES_READINGS = ("single", "pooled")   # model.p_yes: how P(Yes) is read (`choice_token_ids`)
THINKING_STYLES = ("native", "prompted", "none")   # model.thinking.style (`Thinking`)
ANSWER_SOURCES = ("parsed", "forced")   # model.answer_source: the answer as parsed, or forced from P(Yes)
YES_SPELLINGS = ("Yes", " Yes", "yes", " yes", "YES", " YES")  # the pooled reading
NO_SPELLINGS = ("No", " No", "no", " no", "NO", " NO")

# Answer parsing: the answer's first word, after what dresses it (whitespace, quotes, markdown, a label) ...
_DRESSING = re.compile(r"""^[\s"'\u201c\u201d\u2018\u2019`*_#>~\[\](){}-]*""")
_LABEL = re.compile(r"^(?:final\s+)?answer\s*[*_]*\s*[:\uff1a]", re.IGNORECASE)
_FIRST_WORD = re.compile(r"^(yes|no)\b", re.IGNORECASE)
# ... or an explicit final-answer phrase anywhere.
_FINAL_PHRASE = re.compile(
    r"(?:\b(?:the|my)\s+(?:final\s+)?answer\s+(?:is|would\s+be|will\s+be)|\bfinal\s+answer\s*[*_]*\s*[:\uff1a])"
    r"""[\s:"'\u201c\u2018`*_]*(yes|no)\b|\\boxed\{\s*(?:\\text\{)?\s*(yes|no)\b""",
    re.IGNORECASE,
)
# An answer given as both, a refusal or a hedge, in the answer's sentence or before it, leaves it unparsed.
_BOTH = re.compile(r"\b(yes|no)\b\s*(?:/|\bor\b|\band\b)\s*(?!\1\b)(?:yes|no)\b", re.IGNORECASE)
_REFUSAL_OR_HEDGE = re.compile(
    r"\b(?:I\s*(?:'m|am)\s+sorry|I\s+apologi[sz]e|I\s+(?:cannot|can\s*not|can't|won't|will\s+not)\b|"
    r"I\s*(?:'m|am)\s+(?:not\s+able|unable)|as\s+an\s+AI|maybe|perhaps|possibly|it\s+depends|depends\s+on|"
    r"not\s+sure|unsure|uncertain|unclear|(?:hard|difficult|impossible)\s+to\s+(?:say|tell|determine|know)|"
    r"(?:cannot|can't|can\s+not)\s+(?:be\s+)?(?:determined?|say|tell|know)|"
    r"(?:not\s+enough|insufficient)\s+(?:information|data|evidence))",
    re.IGNORECASE,
)
_SENTENCE_END = re.compile(r"[.!?\n]")
_SPECIAL_TOKEN = re.compile(r"<\|[^|>]*\|>|<\/?s>|<eos>|<end_of_turn>")


@dataclass(frozen=True)
class Thinking:
    """How a model thinks: its style, its tags and, for prompted thinking, the instruction."""

    style: str = "native"  # native | prompted | none
    open: str = "<think>"
    close: str = "</think>"
    instruction: str = ""


@dataclass(frozen=True)
class Arm:
    """How the model is asked: `think` arms reason before answering; the others answer at once."""

    name: str
    think: bool
    max_new_tokens: int
    family: str = "decision"  # decision (Yes/No pairs) | mcq (multiple choice)


@dataclass(frozen=True)
class Output:
    """A generation split into its thinking trace and the answer text after it."""

    trace: str
    answer_text: str
    closed: bool  # the think block was closed (always True for arms that do not think)


def render_prompt(tokenizer, user_message: str, arm: Arm, thinking: Thinking,
                  template_kwargs: dict | None = None) -> str:
    """The full prompt text the model continues, pre-fill included."""
    content = user_message
    if arm.think and thinking.style == "prompted" and thinking.instruction:
        content = f"{user_message}\n\n{thinking.instruction}"
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True, **(template_kwargs or {})
    )
    return assistant_prefill(text, arm, thinking, empty_block=True)


def assistant_prefill(chat_text: str, arm: Arm, thinking: Thinking, empty_block: bool) -> str:
    """The chat text ending where the model continues.

    Thinking arms: the think block opened (by the template, which may already have done it,
    or pre-filled for prompted models), or left for a native model to open itself. Other arms:
    a closed empty think block when `empty_block`, else the plain assistant turn.
    """
    opened_by_template = thinking.style != "none" and chat_text.endswith(f"{thinking.open}\n")
    base = chat_text[: -len(f"{thinking.open}\n")] if opened_by_template else chat_text
    if thinking.style == "none":
        return base
    if not arm.think:
        return f"{base}{thinking.open}\n\n{thinking.close}\n\n" if empty_block else base
    if opened_by_template or thinking.style == "prompted":
        return f"{base}{thinking.open}\n"
    return base  # the model opens its own think block


def split_output(prompt: str, generated: str, arm: Arm, thinking: Thinking) -> Output:
    """Separate the thinking trace from the answer; a trace without its close tag is `closed=False`."""
    text = _SPECIAL_TOKEN.sub("", generated)
    if not arm.think or thinking.style == "none":
        return Output(trace="", answer_text=text, closed=True)
    if not prompt.endswith(f"{thinking.open}\n"):
        stripped = text.lstrip()
        if stripped.startswith(thinking.open):
            text = stripped[len(thinking.open):]
    trace, sep, answer = text.partition(thinking.close)
    return Output(trace=trace.strip(), answer_text=answer, closed=bool(sep))


@dataclass(frozen=True)
class ParsedAnswer:
    """What an answer text says: `answer` Yes / No (None: unparsed) and where its statement starts."""

    answer: str | None
    start: int = 0  # characters of other text before the answer statement (0: the text opens with it)


def _undress(text: str) -> str:
    """The text without the whitespace, quotes, markdown and `Answer:` label in front of its first word."""
    text = _DRESSING.sub("", text)
    labelled = _LABEL.match(text)
    return _DRESSING.sub("", text[labelled.end():]) if labelled else text


def parse_answer(answer_text: str) -> ParsedAnswer:
    """The Yes/No answer of an answer text, not merely a yes/no word in it.

    The answer is the text's first word (after whitespace, quotes, markdown and an `Answer:`
    label) when that word is Yes or No, else an explicit final-answer phrase ("the answer is
    No", "Final answer: Yes", \\boxed{Yes}). Unparsed (answer None): no such word or phrase;
    answers that disagree (the first word against a phrase, or two phrases); or, in the
    sentence that gives the answer or before it, both answers as alternatives ("Yes or No",
    "yes/no"), a refusal ("I cannot ...", "I'm sorry") or a hedge ("maybe", "it depends",
    "not enough information"). Case is ignored throughout.
    """
    text = _undress(answer_text)
    first = _FIRST_WORD.match(text)
    phrases = list(_FINAL_PHRASE.finditer(text))
    said = {m.group(1).capitalize() for m in ([first] if first else [])}
    said |= {(m.group(1) or m.group(2)).capitalize() for m in phrases}
    if len(said) != 1:
        return ParsedAnswer(None)
    statement = first or phrases[-1]
    start = 0 if first else statement.start()
    end = _SENTENCE_END.search(text, statement.end())
    scope = text[: end.end() if end else len(text)]
    if _BOTH.search(scope) or _REFUSAL_OR_HEDGE.search(scope):
        return ParsedAnswer(None)
    return ParsedAnswer(said.pop(), start)


def parse_yes_no(answer_text: str) -> str | None:
    """`parse_answer(answer_text).answer`: "Yes", "No" or None."""
    return parse_answer(answer_text).answer


def complies_with_nothink(text: str, thinking: Thinking) -> bool:
    """A completion after the pre-filled empty think block respects it (paper 000 §6).

    Non-compliant: it opens (or closes) a think block of its own, or it reasons before its
    answer (the answer comes from a final-answer phrase after other text). An unparsed
    completion without think tags complies; it is dropped as unparsed anyway.
    """
    if thinking.open in text or thinking.close in text:
        return False
    return parse_answer(text).start == 0


def think_prompt_prefix(prompt: str, thinking: Thinking) -> str:
    """The prompt with the think block opened, the context a trace continues."""
    return prompt if prompt.endswith(f"{thinking.open}\n") else f"{prompt}{thinking.open}\n"


def force_answer_suffix(thinking: Thinking, answer_prefix: str) -> str:
    """Closes the think block and opens the answer position (the CDPG suffix of paper 000 §3.3)."""
    return f"\n{thinking.close}\n\n{answer_prefix}"


def answer_spellings(answer_prefix: str = "") -> tuple[str, str]:
    """Yes and No as a model writes them at the answer position: after a word (an answer prefix
    such as "The answer is") with a leading space, else (after a newline, or the chat turn) bare."""
    space = " " if answer_prefix and not answer_prefix[-1].isspace() else ""
    return f"{space}Yes", f"{space}No"


def choice_token_ids(tokenizer, answer_prefix: str = "", reading: str = "single") -> tuple[list[int], list[int]]:
    """Token ids P(Yes) is read over: the softmax runs over [yes ids, no ids], each list pooled by logsumexp.

    single (paper 000 §3.3, the default): the one token of Yes and of No as the model emits
    them after `answer_prefix` (`answer_spellings`), each checked to be a single token.
    pooled: the first token of each of six spellings (Yes, " Yes", yes, " yes", YES, " YES").
    """
    if reading not in P_YES_READINGS:
        raise AuditError(f"model.p_yes {reading!r} is not one of {list(P_YES_READINGS)}")
    if reading == "single":
        pieces = {s: tokenizer.encode(s, add_special_tokens=False) for s in answer_spellings(answer_prefix)}
        split = {s: ids for s, ids in pieces.items() if len(ids) != 1}
        if split:
            raise AuditError(f"{sorted(split)} are not single tokens in this tokenizer ({split}); "
                             f"read P(Yes) over pooled spellings with model.p_yes=pooled")
        yes, no = ([ids[0]] for ids in pieces.values())
        return yes, no

    def first_tokens(spellings):
        return sorted({tokenizer.encode(s, add_special_tokens=False)[0] for s in spellings})

    yes, no = first_tokens(YES_SPELLINGS), first_tokens(NO_SPELLINGS)
    shared = set(yes) & set(no)
    if shared:
        raise ValueError(f"Yes and No spellings share first tokens {sorted(shared)} in this tokenizer")
    return yes, no
