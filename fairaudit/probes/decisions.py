"""Yes/No decisions of a model on counterfactual pairs under one arm: the records every pair probe reads."""

from __future__ import annotations

import pandas as pd

from fairaudit.analysis.degenerate import WARNING, decision_warnings
from fairaudit.analysis.gap import p_gap
from fairaudit.analysis.numbers import format_number as num
from fairaudit.analysis.pairs import TEXT_COLUMNS
from fairaudit.analysis.stats import FEW
from fairaudit.analysis.truncation import truncated_by_cell, with_complete
from fairaudit.backends import DepthRequest, GenerationRequest
from fairaudit.errors import AuditError
from fairaudit.errors.rules import MAX_BOOT, MIN_BOOT, arm_rules, check_fields, integer
from fairaudit.probes import AuditContext, Needs, Probe, Prompt, SampleView
from fairaudit.probes.paired_samples import PAIRS
from fairaudit.prompts.yesno import (
    Arm,
    choice_token_ids,
    complies_with_nothink,
    force_answer_suffix,
    parse_yes_no,
    render_prompt,
    split_output,
    think_prompt_prefix,
)

RESAMPLING = {"n_boot": integer(MIN_BOOT, MAX_BOOT), "seed": integer(0, 2**32 - 1)}  # the paired bootstrap's settings
BLOCK = 4096  # rows generated and scored at a time


def encode(tokenizer, text: str) -> tuple[int, ...]:
    """Token ids of a text piece, no special tokens added."""
    return tuple(tokenizer.encode(text, add_special_tokens=False))


def encode_all(ctx: AuditContext, texts: list[str]) -> list[tuple[int, ...]]:
    """`encode` of each text: through the client (batched, kept in the store) when there is one."""
    if ctx.client is None:
        return [encode(ctx.tokenizer, text) for text in texts]
    return ctx.client.encode(texts, label="tokenize")


def answer_parts(ctx: AuditContext, prompt: str, trace: str, arm: Arm) -> DepthRequest:
    """The answer position of one (prompt, trace): `answer_parts_all` of one."""
    return answer_parts_all(ctx, [prompt], [trace], arm)[0]


def answer_parts_all(ctx: AuditContext, prompts: list[str], traces: list[str], arm: Arm) -> list[DepthRequest]:
    """The answer position of each (prompt, trace) as (prompt, trace, suffix) token ids, each part tokenized apart.

    Thinking arms: the prompt with the think block open, the trace, the force-answer suffix.
    Other arms: the prompt (pre-fill included), no trace, the model's answer prefix. CDPG
    cuts the same trace ids, so its full-depth cut reads the same P(Yes) as the arm itself.
    """
    thinking = ctx.model.thinking
    if arm.think:
        heads = [think_prompt_prefix(prompt, thinking) for prompt in prompts]
        suffix = force_answer_suffix(thinking, ctx.model.answer_prefix)
        ids = encode_all(ctx, [*heads, *traces, suffix])
        n = len(prompts)
        return [DepthRequest(ids[i], ids[n + i], ids[-1]) for i in range(n)]
    ids = encode_all(ctx, [*prompts, ctx.model.answer_prefix])
    return [DepthRequest(prompt_ids, (), ids[-1]) for prompt_ids in ids[:-1]]


def answer_choices(ctx: AuditContext) -> tuple[list[int], list[int]]:
    """The Yes and No token ids P(Yes) is read over, by the model's `p_yes` reading."""
    return choice_token_ids(ctx.tokenizer, ctx.model.answer_prefix, ctx.model.p_yes)


def render_prompts(ctx: AuditContext, pairs: pd.DataFrame, arm: Arm) -> list[str]:
    """The full prompt text (pre-fill included) of every row of `pairs` under `arm`."""
    tok = ctx.tokenizer
    return [render_prompt(tok, m, arm, ctx.model.thinking, ctx.model.template_kwargs) for m in pairs["user_message"]]


def decide(ctx: AuditContext, pairs: pd.DataFrame, arm: Arm) -> pd.DataFrame:
    """Generate and score every row of `pairs` under `arm`; returns the records (docs/architecture.md).

    pairs: pair_id, side, attribute_value, user_message. Each row gets the parsed answer,
    P(Yes) from the Yes/No softmax at the answer position, the exact prompt, the trace and its length.
    `compliant` (null under thinking arms) is False for a completion that opens a think block
    or reasons before answering; under `answer_source: parsed` its answer is dropped (None),
    like an unparsed one. `truncated`: the generation hit the arm's token budget. Rows go BLOCK at
    a time, so the token ids in flight stay bounded whatever the data set's size.
    """
    if len(pairs) <= BLOCK:
        return _decide_block(ctx, pairs, arm, arm.name)
    count = -(-len(pairs) // BLOCK)
    return pd.concat([_decide_block(ctx, pairs.iloc[i * BLOCK:(i + 1) * BLOCK], arm, f"{arm.name} {i + 1}/{count}")
                      for i in range(count)], ignore_index=True)


def _decide_block(ctx: AuditContext, pairs: pd.DataFrame, arm: Arm, label: str) -> pd.DataFrame:
    """`decide` of one block of rows; `label` names it in the progress bars."""
    prompts = render_prompts(ctx, pairs, arm)
    requests = [GenerationRequest(ids, arm.max_new_tokens) for ids in encode_all(ctx, prompts)]
    completions = ctx.client.generate(requests, label=f"generate {label}")
    texts, keys = [c.text for c in completions], [c.key for c in completions]
    truncated = [c.finish_reason == "length" for c in completions]
    del requests, completions  # their token ids: gigabytes at paper scale
    outputs = [split_output(p, text, arm, ctx.model.thinking) for p, text in zip(prompts, texts)]
    parts = answer_parts_all(ctx, prompts, [o.trace for o in outputs], arm)
    trace_tokens = [len(part.trace_ids) for part in parts]
    prefixes = [part.prompt_ids + part.trace_ids + part.suffix_ids for part in parts]
    del parts
    p_yes = ctx.client.choice_probs(prefixes, answer_choices(ctx), label=f"score {label}")[:, 0]
    del prefixes
    parsed = [parse_yes_no(o.answer_text) if o.closed else None for o in outputs]
    compliant = [None if arm.think else complies_with_nothink(o.answer_text, ctx.model.thinking) for o in outputs]
    kept = [None if ok is False else answer for answer, ok in zip(parsed, compliant)]
    forced = ["Yes" if p >= 0.5 else "No" for p in p_yes]
    return pd.DataFrame({
        "model": ctx.model.name,
        "dataset": ctx.dataset.name,
        "pair_id": pairs["pair_id"].to_numpy(),
        "side": pairs["side"].to_numpy(),
        "attribute_value": pairs["attribute_value"].to_numpy(),
        "arm": arm.name,
        "answer": forced if ctx.model.answer_source == "forced" else kept,
        "parsed_answer": parsed,
        "compliant": pd.array(compliant, dtype="boolean"),
        "p_yes": p_yes,
        "trace_tokens": trace_tokens,
        "think_closed": [o.closed for o in outputs],
        "truncated": truncated,
        "prompt_hash": keys,
        "prompt": prompts,
        "trace": [o.trace for o in outputs],
        "text": texts,
    })


class PairedProbe(Probe):
    """Base of probes comparing the grid's arm (treatment) with the probe's `baseline_arm` on pairs."""

    needs = Needs("decision", ("scores",))  # every record carries P(Yes)
    samples = SampleView("records", PAIRS)

    def __init__(self, baseline_arm: dict):
        check_fields("probe.baseline_arm", baseline_arm, arm_rules())  # its budget's bound is validate's (any depth)
        self.baseline = Arm(**baseline_arm)

    def arms(self, arm: Arm) -> list[Arm]:
        """The grid's arm (treatment) and the baseline arm; the two must differ (an arm against itself shows
        nothing: its records would be one arm's twice)."""
        if arm.name == self.baseline.name:
            other = "nothink" if self.baseline.think else "think"
            raise AuditError(f"arm={arm.name} is also the probe's baseline (probe.baseline_arm.name={arm.name}): an "
                             f"arm compared with itself shows nothing; audit another arm against it (arm={other}) "
                             f"or choose another baseline (arm@probe.baseline_arm={other})")
        return [arm, self.baseline]

    def prompts(self, ctx: AuditContext) -> list[Prompt]:
        """Every pair's two sides under each arm, pair by pair."""
        pairs = ctx.dataset.pairs()
        by_arm = {arm.name: render_prompts(ctx, pairs, arm) for arm in self.arms(ctx.arm)}
        return [Prompt(f"pair {row.pair_id}, {row.side}: {row.attribute_value}", f"arm {arm}", texts[i])
                for i, row in enumerate(pairs.itertuples(index=False)) for arm, texts in by_arm.items()]


def check_resampling(n_boot: int, seed: int) -> None:
    """probe.n_boot and probe.seed of a probe with bootstrap intervals: one error line listing both problems."""
    check_fields("probe", {"n_boot": n_boot, "seed": seed}, RESAMPLING)


def paired_records(ctx: AuditContext, baseline: Arm) -> pd.DataFrame:
    """Records of the grid's arm (treatment) and the probe's baseline arm on the dataset's pairs."""
    pairs = ctx.dataset.pairs()
    return pd.concat([decide(ctx, pairs, ctx.arm), decide(ctx, pairs, baseline)], ignore_index=True)


def arm_names(records: pd.DataFrame) -> tuple[str, str]:
    """(treatment, baseline) of paired records: `paired_records` puts the treatment's rows first."""
    arms = list(dict.fromkeys(records["arm"]))
    return arms[0], arms[-1]


def sides(records: pd.DataFrame) -> tuple[str, str]:
    """The protected values on the alpha and alpha' sides, e.g. ("Male", "Female")."""
    values = records.drop_duplicates("side").set_index("side")["attribute_value"]
    return str(values.get("alpha", "alpha")), str(values.get("alpha_prime", "alpha'"))


def pairs_phrase(records: pd.DataFrame, counted: float | None = None) -> str:
    """e.g. "20 Male/Female adult pairs" (", 12 of them answered on both sides of both arms" when fewer count)."""
    total = records["pair_id"].nunique()
    alpha, alpha_prime = sides(records)
    phrase = f"{total} {alpha}/{alpha_prime} {records['dataset'].iloc[0]} pairs"
    if counted is not None and counted < total:
        phrase += f" ({num(counted)} of them answered on both sides of both arms)"
    return phrase


def interval(metrics: dict[str, float], name: str) -> str:
    """e.g. "0.0072 [0.0068, 0.0076]": a metric and its `_ci_low` / `_ci_high`."""
    return f"{num(metrics[name])} [{num(metrics[name + '_ci_low'])}, {num(metrics[name + '_ci_high'])}]"


def few_units(metrics: dict[str, float], name: str, units: str = "pairs", what: str = "a rough interval") -> str:
    """", fewer than 10 pairs: a rough interval" where metric `name`'s interval has its `_ci_few` flag (its
    `_ci_n` under stats.FEW units, where it covers far less than 95%), else ""."""
    return f", fewer than {FEW} {units}: {what}" if metrics.get(f"{name}_ci_few") == 1.0 else ""


def gap_sentence(metrics: dict[str, float], records: pd.DataFrame, treatment: str, baseline: str) -> str:
    """The P(Yes) gap per arm with its interval, and which side P(Yes) favours."""
    alpha, alpha_prime = sides(records)
    favoured = {}
    for arm in (treatment, baseline):
        diff = metrics[f"p_diff_{arm}"]
        if diff == diff and diff != 0:
            favoured.setdefault(alpha if diff > 0 else alpha_prime, []).append(arm)
    lean = "; ".join(f"P(Yes) is higher for {side} on average under "
                     f"{' and '.join(arms) if len(arms) < 2 else 'both arms'}" for side, arms in favoured.items())
    rough = few_units(metrics, "delta_p_gap", what="rough intervals")
    return (f"P(Yes) gap, mean |P(Yes | {alpha}) - P(Yes | {alpha_prime})| over {num(metrics['n_pairs_scored'])} pairs "
            f"(95% paired bootstrap{rough}): {treatment} {interval(metrics, f'p_gap_{treatment}')}, {baseline} "
            f"{interval(metrics, f'p_gap_{baseline}')}; difference {interval(metrics, 'delta_p_gap')}"
            + (f"; {lean}" if lean else ""))


def warnings_of(records: pd.DataFrame, treatment: str, baseline: str) -> list[str]:
    """The degenerate-result lines of paired records, each prefixed as a verdict warning."""
    return [WARNING + line for line in decision_warnings(records, (treatment, baseline))]


def analysed(records: pd.DataFrame) -> pd.DataFrame:
    """The records without their text columns (TEXT_COLUMNS): what analysis reads, without copying gigabytes."""
    return records.drop(columns=[c for c in TEXT_COLUMNS if c in records])


def paired_metrics(metrics_of, records: pd.DataFrame, treatment: str, baseline: str,
                   metrics: dict[str, float] | None = None, n_boot: int = 2000, seed: int = 0) -> dict[str, float]:
    """metrics_of(records) over every pair (or `metrics`, already computed), each with the P(Yes) gap of
    `analysis.gap` (n_boot resamples from `seed`), and, each as `<name>_complete`, over the pairs none of whose
    traces the token budget cut, with those cut per contingency cell (`analysis.truncation`).
    metrics_of: analysed records -> flat metrics."""
    slim = analysed(records)

    def with_gap(found: dict[str, float], rows: pd.DataFrame) -> dict[str, float]:
        return found | p_gap(rows, treatment, baseline, n_boot, seed)

    given = None if metrics is None else with_gap(metrics, slim)
    return (with_complete(lambda rows: with_gap(metrics_of(rows), rows), slim, given)
            | truncated_by_cell(slim, treatment, baseline))
