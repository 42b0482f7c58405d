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

YES_SPELLINGS = ("Yes", " Yes", "yes", " yes", "YES", " YES")
NO_SPELLINGS = ("No", " No", "no", " no", "NO", " NO")
_ANSWER_WORD = re.compile(r"\b(yes|no)\b", re.IGNORECASE)
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


def render_prompt(tokenizer, user_message: str, arm: Arm, thinking: Thinking, template_kwargs: dict | None = None) -> str:
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


def parse_yes_no(answer_text: str) -> str | None:
    """The first standalone Yes/No word of the answer text (any case), or None."""
    match = _ANSWER_WORD.search(answer_text)
    return match.group(1).capitalize() if match else None


def think_prompt_prefix(prompt: str, thinking: Thinking) -> str:
    """The prompt with the think block opened, the context a trace continues."""
    return prompt if prompt.endswith(f"{thinking.open}\n") else f"{prompt}{thinking.open}\n"


def force_answer_suffix(thinking: Thinking, answer_prefix: str) -> str:
    """Closes the think block and opens the answer position (the CDPG suffix of paper 000 §3.3)."""
    return f"\n{thinking.close}\n\n{answer_prefix}"


def choice_token_ids(tokenizer) -> tuple[list[int], list[int]]:
    """First token of each spelling of Yes and of No, deduplicated (pooled by logsumexp when scored)."""
    def first_tokens(spellings):
        return sorted({tokenizer.encode(s, add_special_tokens=False)[0] for s in spellings})

    yes, no = first_tokens(YES_SPELLINGS), first_tokens(NO_SPELLINGS)
    shared = set(yes) & set(no)
    if shared:
        raise ValueError(f"Yes and No spellings share first tokens {sorted(shared)} in this tokenizer")
    return yes, no
