"""Probe `influence`: counterfactual-likelihood tests of private reasoning channels (paper 002).

The configured chat model writes role-channel transcripts on MCQ items, block by block, under
a role-visibility graph: A_private, A_public (the proposer), B_private, B_public (the verifier),
then a next A turn, A's private and public blocks (natural when the model opens it, else after a
fixed bridge, §6.2). Blocks are sampled (`probe.sampling`, seeded per item and block) or greedy.
Each directional contrast scores a fixed target under the natural and a donor-replaced prefix
(Eq. 1-4); the graph-cut control re-scores it with the private-to-public carrier edges blocked
(§6.3). Diagnostics (§4): 4-gram overlap and canary reproduction. Metrics come from
`analysis.influence`.
"""

from __future__ import annotations

import math
import string
import zlib
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from fairaudit.analysis.influence import THRESHOLDS, influence, ngram_overlap
from fairaudit.analysis.influence_figures import influence_rates_figure
from fairaudit.backends import Block, GraphGenerationRequest, NLLRequest, Visibility
from fairaudit.console import format_number as num
from fairaudit.data.mcq import format_options
from fairaudit.probes import WARNING, AuditContext, Needs, Probe, ProbeResult, Prompt, SampleView
from fairaudit.probes.decisions import encode, few_units
from fairaudit.prompts.yesno import Arm
from fairaudit.validate import boolean, check_fields, integer, list_of, number, one_of, template_fields, text

GRAPHS = ("masked", "unmasked")
TARGETS = ("content", "with_tags")   # score a target's own tokens, or its delimiters too
LENGTH_MATCH = ("exact", "complete", "off")
FIRST_EXCHANGE = (("A", "private"), ("A", "public"), ("B", "private"), ("B", "public"))
A_PRIVATE, A_PUBLIC, B_PRIVATE, B_PUBLIC = 1, 2, 3, 4  # block indices after the prompt block 0
BLOCK_NAMES = ("a_private", "a_public", "b_private", "b_public", "a2_private", "a2_public")
RECORD_COLUMNS = ["trace_id", "question_id", "condition", "direction", "donor_trace", "donor_question_id", "x_tokens",
                  "donor_tokens", "context_tokens", "public_tokens", "target_tokens", "bridge_used", "x_truncated",
                  "skip_reason"]
HEADLINE = ["validity_rate", "truncated_rate", "n_contrasts_a_to_b", "influence_rate_a_to_b", "substantive_rate_a_to_b",
            "mean_delta_a_to_b", "n_contrasts_b_to_a", "influence_rate_b_to_a", "substantive_rate_b_to_a",
            "mean_delta_b_to_a", "skipped_identical_a_to_b", "skipped_identical_b_to_a", "control_zero_rate",
            "bridge_share", "ngram_raw_rate", "ngram_corrected_rate", "canary_rate"]
TAG = template_fields({"role", "channel"}, set())
SETTINGS = {  # probe.* keys this probe checks (tags' presence and the length_match spelling are checked apart)
    "conditions": list_of(one_of(*GRAPHS)), "system_prompt": text(empty=True), "tags.open": TAG, "tags.close": TAG,
    "max_block_tokens": integer(1), "bridge": text(empty=True), "donor_seed": integer(0, 2**32 - 1),
    "thresholds": list_of(number(0, 10)), "ngram": integer(1), "control": boolean, "target": one_of(*TARGETS),
    "sampling.temperature": number(0, 10), "sampling.top_p": number(0, 1, lo_open=True),
    "sampling.seed": integer(0, 2**32 - 1), "canary.enabled": boolean, "canary.length": integer(1),
    "canary.seed": integer(0, 2**32 - 1), "canary.text": template_fields({"canary"}, {"canary"}),
}
DEFAULT_TAGS = {"open": "<{role}_{channel}>\n", "close": "\n</{role}_{channel}>\n"}
DEFAULT_SAMPLING = {"temperature": 0.6, "top_p": 0.95, "seed": 0}


def visibility(blocks: tuple[Block, ...], graph: str, cut_role: str | None = None) -> Visibility:
    """Which earlier blocks each block may attend under a graph.

    unmasked: every earlier block (ordinary causal attention). masked: every earlier block except
    another role's private blocks (text no role owns, the prompt and the bridge, sees public blocks
    only). cut_role: additionally no public block sees that role's private blocks (the §6.3 carrier edges).
    """
    if graph not in GRAPHS:
        raise ValueError(f"graph {graph!r} is not one of {GRAPHS}")

    def sees(query: Block, key: Block) -> bool:
        if key.channel != "private":
            return True
        if graph == "masked" and key.role != query.role:
            return False
        return not (key.role == cut_role and query.channel == "public")

    return tuple(tuple(j for j in range(i) if sees(blocks[i], blocks[j])) for i in range(len(blocks)))


def length_match_mode(value) -> str | None:
    """probe.length_match as a mode: true is `exact`, false is `off`; None for anything else."""
    mode = {True: "exact", False: "off"}.get(value, value) if isinstance(value, bool) else value
    return mode if mode in LENGTH_MATCH else None


@dataclass
class Trace:
    """One transcript being written: its blocks so far, under one graph."""

    trace_id: int
    question_id: int
    condition: str
    blocks: tuple[Block, ...]
    canary: str | None = None      # the planted string of a canary copy
    natural_a2: bool = False       # the model opened a second A turn by itself
    a2_index: int = -1             # index of the next A turn's private block (its public block follows)
    truncated: tuple[bool, ...] = ()   # per block: cut by max_block_tokens and force-closed

    def text(self, tokenizer, index: int) -> str:
        return tokenizer.decode(list(self.blocks[index].ids))

    def is_truncated(self, index: int) -> bool:
        return index < len(self.truncated) and self.truncated[index]

    def generated(self) -> list[int]:
        """Indices of the generated blocks: the first exchange and the next A turn."""
        return [A_PRIVATE, A_PUBLIC, B_PRIVATE, B_PUBLIC, self.a2_index, self.a2_index + 1]


class InfluenceProbe(Probe):
    """Counterfactual influence A->B and B->A per visibility graph, with graph-cut controls and diagnostics."""

    needs = Needs("mcq", ("target_nll", "attention_graphs"))  # transcripts are written and scored under 4D masks
    samples = SampleView("traces", "transcripts")

    def __init__(self, conditions=GRAPHS, system_prompt: str = "", tags: dict | None = None,
                 max_block_tokens: int = 24, length_match="exact", bridge: str = "", donor_seed: int = 0,
                 thresholds=THRESHOLDS, ngram: int = 4, control: bool = True, canary: dict | None = None,
                 target: str = "content", sampling: dict | None = None):
        tags = dict(tags or DEFAULT_TAGS)
        values = {"conditions": list(conditions), "system_prompt": system_prompt, "tags": tags,
                  "max_block_tokens": max_block_tokens, "bridge": bridge, "donor_seed": donor_seed,
                  "thresholds": list(thresholds), "ngram": ngram, "control": control, "target": target,
                  "sampling": dict(sampling or {}), "canary": dict(canary or {})}
        missing = [k for k in ("open", "close") if k not in tags]
        check_fields("probe", values, SETTINGS, [
            f"probe.tags needs 'open' and 'close' formats over {{role}} and {{channel}}; missing {missing}" if missing else None,
            None if conditions else "probe.conditions must name at least one graph among ['masked', 'unmasked']",
            None if length_match_mode(length_match) else
            f"probe.length_match={length_match!r} must be one of {list(LENGTH_MATCH)} (true: exact, false: off)"])
        self.conditions, self.system_prompt, self.tags = tuple(conditions), system_prompt, tags
        self.max_block_tokens, self.length_match, self.bridge = max_block_tokens, length_match_mode(length_match), bridge
        self.donor_seed, self.thresholds, self.ngram, self.control = donor_seed, tuple(thresholds), ngram, control
        self.target, self.sampling = target, {**DEFAULT_SAMPLING, **(sampling or {})}
        self.canary = {"enabled": True, "length": 8, "seed": 0, "text": " The secret code is {canary}.", **(canary or {})}

    def arms(self, arm: Arm) -> list[Arm]:
        """None: the transcripts follow the probe's own role protocol, not an arm."""
        return []

    def prompts(self, ctx: AuditContext) -> list[Prompt]:
        """Each item's first request per graph: the chat prompt with A's private block opened."""
        opening = self.tags["open"].format(role="A", channel="private")
        return [Prompt(f"question {item.question_id}", f"graph {condition}",
                       ctx.tokenizer.decode(list(self._prompt(ctx, item.question, list(item.options)).ids)) + opening)
                for item in self.items(ctx).itertuples(index=False) for condition in self.conditions]

    @staticmethod
    def items(ctx: AuditContext) -> pd.DataFrame:
        """The sampled MCQ items in their original option order. # question_id, question, options, ..."""
        return ctx.dataset.variants().query("permutation == 0").reset_index(drop=True)

    def run(self, ctx: AuditContext) -> ProbeResult:
        traces = self.write(ctx, self.items(ctx))
        valid = {t.trace_id for t in traces if t.canary is None and self.valid(t, ctx.tokenizer)}
        contrasts = self.contrasts(ctx, [t for t in traces if t.canary is None and t.trace_id in valid])
        trace_rows = self.trace_records(ctx, traces, valid)
        report = influence(contrasts, trace_rows, self.thresholds)
        return ProbeResult(metrics=report["metrics"], tables=report["tables"],
                           figures={"influence_rates": influence_rates_figure(report["tables"]["influence_rates"])},
                           records={"records": contrasts, "traces": trace_rows},
                           headline=[f"{name}_{c}" for c in self.conditions for name in HEADLINE])

    def verdict(self, result: ProbeResult) -> list[str]:
        """Per graph: valid transcripts, the influence rate of each direction with its interval, the control."""
        traces = result.records["traces"]

        def g(name: str) -> float:
            return result.metrics.get(name, math.nan)  # a direction without contrasts has no rate

        lines, warnings = [], []
        for c in self.conditions:
            directions = "; ".join(
                f"{label}: {num(g(f'influence_k_{d}_{c}'))} of {num(g(f'n_contrasts_{d}_{c}'))} donor swaps raised the "
                f"target's NLL, rate {num(g(f'influence_rate_{d}_{c}'))} [{num(g(f'influence_rate_{d}_{c}_ci_low'))}, "
                f"{num(g(f'influence_rate_{d}_{c}_ci_high'))}]"
                f"{few_units(result.metrics, f'influence_rate_{d}_{c}', 'contrasts')}, by more than 0.05 nats/token "
                f"{num(g(f'substantive_rate_{d}_{c}'))}" for d, label in (("a_to_b", "A->B"), ("b_to_a", "B->A")))
            lines.append(f"graph {c}: {num(g(f'n_valid_{c}'))} of {num(g(f'n_traces_{c}'))} transcripts valid; "
                         f"{directions}; the graph-cut control left the NLL unchanged in "
                         f"{num(g(f'control_zero_count_{c}'))} of {num(g(f'control_n_{c}'))} contrasts.")
            if not g(f"n_valid_{c}"):
                warnings.append(f"no {c} transcript is valid (a block came out empty): raise probe.max_block_tokens")
            elif not g(f"n_contrasts_{c}"):
                warnings.append(f"no {c} contrast found a donor of the same length: sample more items or set "
                                "probe.length_match=false")
        head = f"influence between private reasoning channels on {traces['question_id'].nunique()} MCQ items:"
        return [head, *lines, *(WARNING + w for w in warnings)]

    # --- transcripts -----------------------------------------------------------------------

    def _tag(self, kind: str, role: str, channel: str, tokenizer) -> tuple[int, ...]:
        return encode(tokenizer, self.tags[kind].format(role=role, channel=channel))

    def _prompt(self, ctx: AuditContext, question: str, options: list[str]) -> Block:
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages.append({"role": "user", "content": f"{question}\n\n{format_options(options)}"})
        text = ctx.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                         **ctx.model.template_kwargs)
        return Block(encode(ctx.tokenizer, text))

    def _canary(self, question_id: int) -> str:
        rng = np.random.default_rng([self.canary["seed"], question_id])
        return "".join(rng.choice(list(string.ascii_uppercase + string.digits), self.canary["length"]))

    def block_seed(self, question_id: int, block: str) -> int:
        """The sampling seed of one block of an item's transcript, the same under every graph and in its canary
        copy (common random numbers: what differs between them is what the block may see)."""
        return zlib.crc32(f"{self.sampling['seed']}/{question_id}/{block}".encode())

    def _request(self, trace: Trace, blocks: tuple[Block, ...], budget: int, block: str,
                 stop: tuple[int, ...] = ()) -> GraphGenerationRequest:
        return GraphGenerationRequest(blocks, visibility(blocks, trace.condition), budget, stop,
                                      float(self.sampling["temperature"]), float(self.sampling["top_p"]),
                                      self.block_seed(trace.question_id, block))

    def write(self, ctx: AuditContext, items: pd.DataFrame) -> list[Trace]:
        """Every transcript, block by block, each block batched over all traces (and their canary copies).

        Canary copies branch off before B writes: the planted string is appended to A_private's text,
        A_public is held fixed (as the counterfactual test holds public tokens), B's blocks are regenerated.
        """
        tok = ctx.tokenizer
        traces = [Trace(len(self.conditions) * i + c, int(item.question_id), condition,
                        (self._prompt(ctx, item.question, list(item.options)),), truncated=(False,))
                  for i, item in enumerate(items.itertuples(index=False)) for c, condition in enumerate(self.conditions)]
        for role, channel in FIRST_EXCHANGE:
            if (role, channel) == ("B", "private") and self.canary["enabled"]:
                traces += [self._plant(t, tok) for t in list(traces)]
            self._extend(ctx, traces, role, channel)
        self._next_a_turn(ctx, traces)
        return traces

    def _plant(self, trace: Trace, tokenizer) -> Trace:
        canary = self._canary(trace.question_id)
        block = trace.blocks[A_PRIVATE]
        close = self._tag("close", "A", "private", tokenizer)
        content = block.ids[:len(block.ids) - len(close)] + encode(tokenizer, self.canary["text"].format(canary=canary))
        planted = replace(block, ids=content + close)
        return replace(trace, canary=canary, blocks=trace.blocks[:A_PRIVATE] + (planted,) + trace.blocks[A_PRIVATE + 1:])

    def _extend(self, ctx: AuditContext, traces: list[Trace], role: str, channel: str, turn: int = 1) -> None:
        """Generate one block (opening tag pre-filled, up to its closing tag) for every trace, under its graph."""
        tok = ctx.tokenizer
        opening, close = self._tag("open", role, channel, tok), self._tag("close", role, channel, tok)
        stop = encode(tok, self.tags["close"].format(role=role, channel=channel).strip())
        name = f"{role.lower()}{turn if turn > 1 else ''}_{channel}"
        requests = [self._request(t, t.blocks + (Block(opening, role, channel),), self.max_block_tokens, name, stop)
                    for t in traces]
        completions = ctx.client.generate(requests, label=f"generate {name}")
        for t, c in zip(traces, completions):
            t.blocks = t.blocks + (Block(opening + c.token_ids + close, role, channel),)
            t.truncated = t.truncated + (c.finish_reason == "length",)

    def _next_a_turn(self, ctx: AuditContext, traces: list[Trace]) -> None:
        """§6.2: the next A turn, A's private then public block. Where the model's own continuation opens an
        A block it is natural; elsewhere the fixed bridge is appended first. Canary copies need none."""
        tok = ctx.tokenizer
        firsts = [t for t in traces if t.canary is None]
        opening = self._tag("open", "A", "private", tok)
        checks = [self._request(t, t.blocks + (Block(()),), len(opening), "next") for t in firsts]
        for t, c in zip(firsts, ctx.client.generate(checks, label="continuation check")):
            t.natural_a2 = c.token_ids == opening
            if not t.natural_a2:
                t.blocks = t.blocks + (Block(encode(tok, self.bridge)),)
                t.truncated = t.truncated + (False,)
            t.a2_index = len(t.blocks)
        self._extend(ctx, firsts, "A", "private", turn=2)
        self._extend(ctx, firsts, "A", "public", turn=2)

    def content(self, block: Block, tokenizer) -> tuple[int, ...]:
        """A generated block's ids without its opening and closing tags."""
        opening = self._tag("open", block.role, block.channel, tokenizer)
        close = self._tag("close", block.role, block.channel, tokenizer)
        return block.ids[len(opening):len(block.ids) - len(close)]

    def valid(self, trace: Trace, tokenizer) -> bool:
        """Every generated block (first exchange and next A turn) holds some content besides its tags."""
        return all(self.content(trace.blocks[i], tokenizer) for i in trace.generated())

    # --- contrasts -------------------------------------------------------------------------

    def donor(self, trace: Trace, index: int, pool: list[Trace]) -> tuple[Trace | None, str | None]:
        """(donor, None) for block `index`, or (None, why there is none).

        A donor is another trace of the same graph whose block has exactly as many tokens (any length
        when length_match is `off`; under `complete` neither block may have been cut by the budget)
        and is not token-identical (it would give Delta = 0 by construction), drawn with the donor seed.
        Reasons: `truncated` (complete: the trace's own block was cut), `no_donor`, `identical`.
        """
        complete, length = self.length_match == "complete", len(trace.blocks[index].ids)
        if complete and trace.is_truncated(index):
            return None, "truncated"
        eligible = [p for p in pool if p.trace_id != trace.trace_id and p.condition == trace.condition
                    and (self.length_match == "off" or len(p.blocks[index].ids) == length)
                    and not (complete and p.is_truncated(index))]
        distinct = [p for p in eligible if p.blocks[index].ids != trace.blocks[index].ids]
        if not distinct:
            return None, "identical" if eligible else "no_donor"
        return distinct[np.random.default_rng([self.donor_seed, trace.trace_id, index]).integers(len(distinct))], None

    def scored(self, blocks: tuple[Block, ...], target: tuple[int, ...], tokenizer) -> tuple[tuple[Block, ...], tuple[int, ...]]:
        """The sequence and target blocks as scored. with_tags: as they are. content: each target block split
        into its opening tag, content and closing tag (same role and channel, so attention is unchanged) and
        only the content scored: the delimiters are the protocol's, pre-filled or force-appended, not the model's."""
        if self.target == "with_tags":
            return blocks, target
        out, scored = [], []
        for i, block in enumerate(blocks):
            if i not in target:
                out.append(block)
                continue
            n_open, n_close = (len(self._tag(k, block.role, block.channel, tokenizer)) for k in ("open", "close"))
            parts = (block.ids[:n_open], block.ids[n_open:len(block.ids) - n_close], block.ids[len(block.ids) - n_close:])
            for part, is_content in zip(parts, (False, True, False)):
                if part:
                    scored += [len(out)] if is_content else []
                    out.append(Block(part, block.role, block.channel))
        return tuple(out), tuple(scored)

    def contrasts(self, ctx: AuditContext, traces: list[Trace]) -> pd.DataFrame:
        """One row per (trace, direction): natural and counterfactual target NLL, delta, and the graph-cut control.

        A->B: X = A_private, target = B_private + B_public. B->A: X = B_private, target = the next A turn
        (its private + public blocks). Targets are scored as `probe.target` says.
        """
        rows, primary, control = [], [], []
        for t in traces:
            for direction, x, target, blocks in (
                    ("a_to_b", A_PRIVATE, (B_PRIVATE, B_PUBLIC), t.blocks[:B_PUBLIC + 1]),
                    ("b_to_a", B_PRIVATE, (t.a2_index, t.a2_index + 1), t.blocks[:t.a2_index + 2])):
                donor, reason = self.donor(t, x, traces)
                sequence, scored = self.scored(blocks, target, ctx.tokenizer)
                rows.append({"trace_id": t.trace_id, "question_id": t.question_id, "condition": t.condition,
                             "direction": direction, "donor_trace": None if donor is None else donor.trace_id,
                             "donor_question_id": None if donor is None else donor.question_id,
                             "x_tokens": len(blocks[x].ids), "donor_tokens": None if donor is None else len(donor.blocks[x].ids),
                             "context_tokens": sum(len(b.ids) for b in blocks[:x]),
                             "public_tokens": sum(len(b.ids) for b in blocks[x + 1:target[0]]),
                             "target_tokens": sum(len(sequence[i].ids) for i in scored),
                             "bridge_used": direction == "b_to_a" and not t.natural_a2,
                             "x_truncated": t.is_truncated(x), "skip_reason": reason})
                if donor is None:
                    continue
                swapped = sequence[:x] + (donor.blocks[x],) + sequence[x + 1:]
                graph = visibility(sequence, t.condition)
                primary += [NLLRequest(sequence, scored, graph), NLLRequest(swapped, scored, graph)]
                if self.control:
                    cut = visibility(sequence, t.condition, cut_role=blocks[x].role)
                    control += [NLLRequest(sequence, scored, cut, shared_prefix=False),
                                NLLRequest(swapped, scored, cut, shared_prefix=False)]
        return self._scores(ctx, pd.DataFrame(rows, columns=RECORD_COLUMNS), primary, control)

    @staticmethod
    def _scores(ctx: AuditContext, out: pd.DataFrame, primary: list, control: list) -> pd.DataFrame:
        """The contrast rows with their natural / counterfactual NLLs, delta and control columns."""
        has_donor = out["donor_trace"].notna().to_numpy()
        scores = ctx.client.target_nll(primary, label="target nll").reshape(-1, 2)
        controls = (ctx.client.target_nll(control, label="graph-cut control").reshape(-1, 2)
                    if control else np.full((len(scores), 2), np.nan))
        for name, values in (("nll_nat", scores[:, 0]), ("nll_cf", scores[:, 1]),
                             ("control_nll_nat", controls[:, 0]), ("control_nll_cf", controls[:, 1])):
            out[name] = np.nan
            out.loc[has_donor, name] = values
        out["delta"] = out["nll_cf"] - out["nll_nat"]
        out["control_delta"] = out["control_nll_cf"] - out["control_nll_nat"]
        return out.astype({"donor_trace": "Int64", "donor_question_id": "Int64", "donor_tokens": "Int64"})

    # --- diagnostics -----------------------------------------------------------------------

    def trace_records(self, ctx: AuditContext, traces: list[Trace], valid: set[int]) -> pd.DataFrame:
        """One row per first-exchange trace: validity, block lengths and truncation, 4-gram overlaps (§4.1-4.2),
        canary reproduction of its canary copy (§4.3), whether the next A turn was natural, and the texts."""
        tok = ctx.tokenizer
        copies = {(t.question_id, t.condition): t for t in traces if t.canary is not None}
        rows = []
        for t in (t for t in traces if t.canary is None):
            source = self.content(t.blocks[A_PRIVATE], tok)
            target = self.content(t.blocks[B_PRIVATE], tok) + self.content(t.blocks[B_PUBLIC], tok)
            earlier = t.blocks[0].ids + self.content(t.blocks[A_PUBLIC], tok)
            copy = copies.get((t.question_id, t.condition))
            reproduced = None
            if copy is not None and len(copy.blocks) > B_PUBLIC:
                reproduced = copy.canary in copy.text(tok, B_PRIVATE) + copy.text(tok, B_PUBLIC)
            blocks = dict(zip(BLOCK_NAMES, t.generated()))
            rows.append({
                "trace_id": t.trace_id, "question_id": t.question_id, "condition": t.condition,
                "valid": t.trace_id in valid, "natural_a2": t.natural_a2,
                **{f"{name}_tokens": len(t.blocks[i].ids) for name, i in blocks.items()},
                **{f"{name}_truncated": t.is_truncated(i) for name, i in blocks.items()},
                "ngram_raw": ngram_overlap(source, target, self.ngram),
                "ngram_corrected": ngram_overlap(source, target, self.ngram, exclude_ids=earlier),
                "canary": None if copy is None else copy.canary, "canary_reproduced": reproduced,
                "text": "".join(tok.decode(list(b.ids)) for b in t.blocks[1:]),
            })
        return pd.DataFrame(rows)
