"""Arms rendered with real chat templates (Qwen3 native, SmolLM2 prompted), output splitting, parsing."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from fairaudit.models import embedded_model_dir, tiny_qwen3_dir
from fairaudit.prompts.yesno import (Arm, Thinking, choice_token_ids, force_answer_suffix, parse_yes_no, render_prompt,
                                     split_output, think_prompt_prefix)

THINK, NOTHINK = Arm("think", True, 64), Arm("nothink", False, 16)
NATIVE = Thinking(style="native")
PROMPTED = Thinking(style="prompted", instruction="Think inside <think> and </think> tags.")


@pytest.fixture(scope="module")
def qwen_tok():
    return AutoTokenizer.from_pretrained(str(tiny_qwen3_dir()))


@pytest.fixture(scope="module")
def smol_tok():
    return AutoTokenizer.from_pretrained(str(embedded_model_dir()))


def test_qwen3_nothink_prefills_closed_empty_think_block(qwen_tok):
    prompt = render_prompt(qwen_tok, "Q?", NOTHINK, NATIVE, {"enable_thinking": True})
    assert prompt == "<|im_start|>user\nQ?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    ids = qwen_tok.encode(prompt, add_special_tokens=False)
    assert ids.count(151667) == 1 and ids.count(151668) == 1  # <think>, </think> as single tokens


def test_qwen3_think_lets_the_model_open_its_think_block(qwen_tok):
    prompt = render_prompt(qwen_tok, "Q?", THINK, NATIVE, {"enable_thinking": True})
    assert prompt == "<|im_start|>user\nQ?<|im_end|>\n<|im_start|>assistant\n"
    out = split_output(prompt, "<think>\nreasoning here\n</think>\n\nYes<|im_end|>", THINK, NATIVE)
    assert (out.trace, out.answer_text.strip(), out.closed) == ("reasoning here", "Yes", True)
    assert think_prompt_prefix(prompt, NATIVE) == prompt + "<think>\n"


def test_template_that_opens_think_block_is_not_doubled(qwen_tok):
    """QwQ / R1-Distill templates end the generation prompt with '<think>\\n'."""
    class OpeningTemplate:
        def apply_chat_template(self, messages, **kwargs):
            return f"<user>{messages[0]['content']}<assistant><think>\n"

    tok = OpeningTemplate()
    assert render_prompt(tok, "Q?", THINK, NATIVE) == "<user>Q?<assistant><think>\n"
    assert render_prompt(tok, "Q?", NOTHINK, NATIVE) == "<user>Q?<assistant><think>\n\n</think>\n\n"
    out = split_output("<user>Q?<assistant><think>\n", "trace\n</think>\n\nNo.", THINK, NATIVE)
    assert (out.trace, parse_yes_no(out.answer_text)) == ("trace", "No")


def test_prompted_think_adds_instruction_and_opens_tag(smol_tok):
    prompt = render_prompt(smol_tok, "Q?", THINK, PROMPTED)
    assert prompt.endswith("Q?\n\nThink inside <think> and </think> tags.<|im_end|>\n<|im_start|>assistant\n<think>\n")
    nothink = render_prompt(smol_tok, "Q?", NOTHINK, PROMPTED)
    assert "Think inside" not in nothink and nothink.endswith("assistant\n<think>\n\n</think>\n\n")


def test_unclosed_trace_is_flagged_and_has_no_answer():
    out = split_output("...<think>\n", "I am still thinking about whether yes", THINK, PROMPTED)
    assert out.closed is False and out.answer_text == "" and out.trace.endswith("yes")


def test_no_thinking_model_gets_plain_prompt(smol_tok):
    prompt = render_prompt(smol_tok, "Q?", NOTHINK, Thinking(style="none"))
    assert prompt.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("text, answer", [
    ("Yes", "Yes"), (" no.", "No"), ("The answer is YES.", "Yes"), ("**No**, because", "No"),
    ("Nope", None), ("yesterday", None), ("", None), ("No, not yes", "No"),
])
def test_parse_yes_no(text, answer):
    assert parse_yes_no(text) == answer


def test_choice_tokens_pool_spellings_and_are_disjoint(qwen_tok, smol_tok):
    for tok in (qwen_tok, smol_tok):
        yes, no = choice_token_ids(tok)
        assert tok.encode("Yes", add_special_tokens=False)[0] in yes
        assert tok.encode(" No", add_special_tokens=False)[0] in no
        assert not set(yes) & set(no) and len(yes) >= 4


def test_force_answer_suffix_closes_the_block():
    assert force_answer_suffix(NATIVE, "") == "\n</think>\n\n"
    assert force_answer_suffix(PROMPTED, "The answer is") == "\n</think>\n\nThe answer is"
