"""`dry_run=true`: print the pairs and the exact prompts a run would send, loading the tokenizer but no model."""

from __future__ import annotations

from fairaudit.models import EMBEDDED_SMOLLM2, EMBEDDED_TINY_QWEN3, resolve_model_dir
from fairaudit.probes import ModelSpec
from fairaudit.prompts.mcq import render_mcq_prompt
from fairaudit.prompts.yesno import Arm, render_prompt


def load_tokenizer(source: str, path: str | None, revision: str | None):
    """The model's tokenizer (its chat template renders the prompts); a hub model fetches its tokenizer files only."""
    from transformers import AutoTokenizer

    if path or source in (EMBEDDED_SMOLLM2, EMBEDDED_TINY_QWEN3):
        return AutoTokenizer.from_pretrained(str(resolve_model_dir(source, path, revision)))
    return AutoTokenizer.from_pretrained(source, revision=revision)


def show(tokenizer, dataset, arms: list[Arm], spec: ModelSpec, think_instruction: str = "") -> int:
    """Print every prompt of the run, grouped by pair (or MCQ question) and arm, to stdout; returns the count."""
    if dataset.family == "mcq":
        rows = dataset.variants()
        for row in rows.itertuples(index=False):
            print(f"=== question {row.question_id}, permutation {row.permutation}, gold {'ABCD'[row.gold_position]}")
            for arm in arms:
                _print_prompt(arm.name, render_mcq_prompt(tokenizer, arm, row.question, row.options_text, spec.thinking,
                                                          spec.template_kwargs, think_instruction))
    else:
        rows = dataset.pairs()
        for row in rows.itertuples(index=False):
            print(f"=== pair {row.pair_id}, {row.side}: {row.attribute_value}")
            for arm in arms:
                _print_prompt(arm.name, render_prompt(tokenizer, row.user_message, arm, spec.thinking, spec.template_kwargs))
    return len(rows) * len(arms)


def _print_prompt(arm: str, prompt: str) -> None:
    print(f"--- arm {arm}")
    print(prompt)
    print()

