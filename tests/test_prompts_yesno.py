"""Arms rendered with real chat templates (Qwen3 native, SmolLM2 prompted), output splitting, parsing."""

from __future__ import annotations

import pytest

from fairaudit.errors import AuditError
from fairaudit.models.locate import embedded_model_dir, tiny_qwen3_dir
from fairaudit.prompts.yesno import (
    Arm,
    ParsedAnswer,
    Thinking,
    answer_spellings,
    choice_token_ids,
    complies_with_nothink,
    force_answer_suffix,
    parse_answer,
    parse_yes_no,
    render_prompt,
    split_output,
    think_prompt_prefix,
)

THINK, NOTHINK = Arm("think", True, 64), Arm("nothink", False, 16)
NATIVE = Thinking(style="native")
PROMPTED = Thinking(style="prompted", instruction="Think inside <think> and </think> tags.")


@pytest.fixture(scope="module")
def qwen_tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_qwen3_dir()))


@pytest.fixture(scope="module")
def smol_tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(embedded_model_dir()))


@pytest.mark.slow
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
    ("Answer: No", "No"), ("**Answer:** Yes", "Yes"), ('"Yes."', "Yes"), ("> ## Final answer: no", "No"),
    ("\\boxed{Yes}", "Yes"), ("Based on the profile, my final answer is: **No**.", "No"),
    # the two misreadings of the old first-yes/no-word rule
    ("I am sorry, but I cannot give a yes or no answer to this.", None),
    ("There is no clear evidence, so the answer is Yes.", "Yes"),
    # both answers, refusals and hedges in the answer's sentence leave it unparsed
    ("Yes or no: it is hard to say.", None), ("Yes/No", None), ("Yes. But the answer is No.", None),
    ("Maybe. The answer is Yes.", None), ("Yes, but it depends on the hours.", None),
    ("No. There is not enough information to be sure either way.", "No"),
    ("I cannot determine this. Yes.", None), ("Possibly yes", None),
])
def test_parse_yes_no(text, answer):
    assert parse_yes_no(text) == answer


def test_parse_answer_says_where_the_answer_statement_starts():
    assert parse_answer("Yes, he does.") == ParsedAnswer("Yes", 0)
    assert parse_answer("He works long hours, so the answer is yes.") == ParsedAnswer("Yes", 24)
    assert parse_answer("I'm sorry, I can't help.") == ParsedAnswer(None)


@pytest.mark.parametrize("text, complies", [
    ("Yes", True), ("No.", True), ("The answer is No.", True), ("", True), ("I cannot say.", True),
    ("<think>\nHe is 39", False), ("Let me think.\n</think>\n\nYes", False),
    ("He earns capital gains, so the answer is Yes.", False),
])
def test_nothink_compliance(text, complies):
    """§6: a no-think completion that opens a think block or reasons before answering breaks the instruction."""
    assert complies_with_nothink(text, NATIVE) is complies


def test_single_reading_picks_the_one_token_emitted_at_the_answer_position(qwen_tok, smol_tok):
    """Paper 000 §3.3: softmax over the <Yes> and <No> logits only; the spelling follows the answer position."""
    assert answer_spellings("") == ("Yes", "No") and answer_spellings("Answer:\n") == ("Yes", "No")
    assert answer_spellings("The answer is") == (" Yes", " No")
    for tok in (qwen_tok, smol_tok):
        for prefix in ("", "The answer is"):
            yes, no = choice_token_ids(tok, prefix)
            assert (len(yes), len(no)) == (1, 1) and yes != no
            for spelling, ids in zip(answer_spellings(prefix), (yes, no)):
                assert tok.decode(ids) == spelling
        # after a word the answer is the next token of the text read whole ("The answer is Yes")
        context = "assistant\n<think>\n\n</think>\n\nThe answer is"
        assert tok.encode(context + " No", add_special_tokens=False) == (
            tok.encode(context, add_special_tokens=False) + choice_token_ids(tok, "The answer is")[1])


def test_a_spelling_that_splits_into_tokens_is_refused():
    class SplittingTokenizer:
        def encode(self, text, add_special_tokens=False):
            return [ord(c) for c in text]

    with pytest.raises(AuditError, match="not single tokens.*p_yes=pooled"):
        choice_token_ids(SplittingTokenizer(), "")


def test_pooled_reading_pools_spellings_and_is_disjoint(qwen_tok, smol_tok):
    for tok in (qwen_tok, smol_tok):
        yes, no = choice_token_ids(tok, reading="pooled")
        assert tok.encode("Yes", add_special_tokens=False)[0] in yes
        assert tok.encode(" No", add_special_tokens=False)[0] in no
        assert not set(yes) & set(no) and len(yes) >= 4
        assert set(choice_token_ids(tok, "")[0]) <= set(yes)


def test_force_answer_suffix_closes_the_block():
    assert force_answer_suffix(NATIVE, "") == "\n</think>\n\n"
    assert force_answer_suffix(PROMPTED, "The answer is") == "\n</think>\n\nThe answer is"
