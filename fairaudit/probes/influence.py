"""Probe `influence`: counterfactual-likelihood tests of private reasoning channels (paper 002).

The configured chat model writes role-channel transcripts on MCQ items, block by block, under
a role-visibility graph: A_private, A_public (the proposer), B_private, B_public (the verifier),
then a next A turn (natural when the model opens one, else after a fixed bridge, §6.2). Each
directional contrast scores a fixed target under the natural and a donor-replaced prefix
(Eq. 1-4); the graph-cut control re-scores it with the private-to-public carrier edges blocked
(§6.3). Diagnostics (§4): 4-gram overlap and canary reproduction. Metrics come from
`analysis.influence`.
"""

from __future__ import annotations

import math
import string
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from fairaudit.analysis.influence import THRESHOLDS, influence, ngram_overlap
from fairaudit.analysis.influence_figures import influence_rates_figure
from fairaudit.backends import Block, GraphGenerationRequest, NLLRequest, Visibility
from fairaudit.console import format_number as num
from fairaudit.data.mcq import format_options
from fairaudit.errors import AuditError
from fairaudit.probes import WARNING, AuditContext, Needs, Probe, ProbeResult, Prompt, SampleView
from fairaudit.probes.decisions import encode
from fairaudit.prompts.yesno import Arm

GRAPHS = ("masked", "unmasked")
FIRST_EXCHANGE = (("A", "private"), ("A", "public"), ("B", "private"), ("B", "public"))
A_PRIVATE, A_PUBLIC, B_PRIVATE, B_PUBLIC = 1, 2, 3, 4  # block indices after the prompt block 0
RECORD_COLUMNS = ["trace_id", "question_id", "condition", "direction", "donor_trace", "donor_question_id", "x_tokens",
                  "donor_tokens", "context_tokens", "public_tokens", "target_tokens", "bridge_used"]
HEADLINE = ["validity_rate", "n_contrasts_a_to_b", "influence_rate_a_to_b", "substantive_rate_a_to_b",
            "mean_delta_a_to_b", "n_contrasts_b_to_a", "influence_rate_b_to_a", "substantive_rate_b_to_a",
            "mean_delta_b_to_a", "control_zero_rate", "bridge_share", "ngram_raw_rate", "ngram_corrected_rate",
            "canary_rate"]


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


@dataclass
class Trace:
    """One transcript being written: its blocks so far, under one graph."""

    trace_id: int
    question_id: int
    condition: str
    blocks: tuple[Block, ...]
    canary: str | None = None      # the planted string of a canary copy
    natural_a2: bool = False       # the model opened a second A turn by itself
    a2_index: int = -1             # index of the next-A block (target of B->A), -1 before it exists

    def text(self, tokenizer, index: int) -> str:
        return tokenizer.decode(list(self.blocks[index].ids))


class InfluenceProbe(Probe):
    """Counterfactual influence A->B and B->A per visibility graph, with graph-cut controls and diagnostics."""

    needs = Needs("mcq", ("target_nll", "attention_graphs"))  # transcripts are written and scored under 4D masks
    samples = SampleView("traces", "transcripts")

    def __init__(self, conditions=GRAPHS, system_prompt: str = "", tags: dict | None = None,
                 max_block_tokens: int = 24, length_match: bool = True, bridge: str = "", donor_seed: int = 0,
                 thresholds=THRESHOLDS, ngram: int = 4, control: bool = True, canary: dict | None = None):
        unknown = [c for c in conditions if c not in GRAPHS]
        if unknown or not conditions:
            raise AuditError(f"probe.conditions {list(conditions)} must name graphs among {list(GRAPHS)}")
        tags = dict(tags or {"open": "<{role}_{channel}>\n", "close": "\n</{role}_{channel}>\n"})
        try:
            [tags[k].format(role="A", channel="private") for k in ("open", "close")]
        except (KeyError, IndexError) as err:
            raise AuditError(f"probe.tags needs 'open' and 'close' formats with {{role}} and {{channel}}: {err!r}") from None
        if max_block_tokens < 1:
            raise AuditError(f"probe.max_block_tokens={max_block_tokens} must be at least 1")
        self.conditions, self.system_prompt, self.tags = tuple(conditions), system_prompt, tags
        self.max_block_tokens, self.length_match, self.bridge = max_block_tokens, length_match, bridge
        self.donor_seed, self.thresholds, self.ngram, self.control = donor_seed, tuple(thresholds), ngram, control
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
                f"{num(g(f'influence_rate_{d}_{c}_ci_high'))}], by more than 0.05 nats/token "
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

    def write(self, ctx: AuditContext, items: pd.DataFrame) -> list[Trace]:
        """Every transcript, block by block, each block batched over all traces (and their canary copies).

        Canary copies branch off before B writes: the planted string is appended to A_private's text,
        A_public is held fixed (as the counterfactual test holds public tokens), B's blocks are regenerated.
        """
        tok = ctx.tokenizer
        traces = [Trace(len(self.conditions) * i + c, int(item.question_id), condition,
                        (self._prompt(ctx, item.question, list(item.options)),))
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

    def _extend(self, ctx: AuditContext, traces: list[Trace], role: str, channel: str) -> None:
        """Generate one block (opening tag pre-filled, up to its closing tag) for every trace, under its graph."""
        tok = ctx.tokenizer
        opening, close = self._tag("open", role, channel, tok), self._tag("close", role, channel, tok)
        requests = []
        for t in traces:
            blocks = t.blocks + (Block(opening, role, channel),)
            requests.append(GraphGenerationRequest(blocks, visibility(blocks, t.condition), self.max_block_tokens,
                                                   encode(tok, self.tags["close"].format(role=role, channel=channel).strip())))
        completions = ctx.client.generate(requests, label=f"generate {role}_{channel}")
        for t, c in zip(traces, completions):
            t.blocks = t.blocks + (Block(opening + c.token_ids + close, role, channel),)

    def _next_a_turn(self, ctx: AuditContext, traces: list[Trace]) -> None:
        """§6.2: the next A-attributed block. Where the model's own continuation opens an A block it is
        natural; elsewhere the fixed bridge is appended first. Canary copies need none."""
        tok = ctx.tokenizer
        firsts = [t for t in traces if t.canary is None]
        opening = self._tag("open", "A", "private", tok)
        probes = [GraphGenerationRequest(t.blocks + (Block(()),), visibility(t.blocks + (Block(()),), t.condition),
                                         len(opening)) for t in firsts]
        for t, c in zip(firsts, ctx.client.generate(probes, label="continuation check")):
            t.natural_a2 = c.token_ids == opening
            if not t.natural_a2:
                t.blocks = t.blocks + (Block(encode(tok, self.bridge)),)
        self._extend(ctx, firsts, "A", "private")
        for t in firsts:
            t.a2_index = len(t.blocks) - 1

    def content(self, block: Block, tokenizer) -> tuple[int, ...]:
        """A generated block's ids without its opening and closing tags."""
        opening = self._tag("open", block.role, block.channel, tokenizer)
        close = self._tag("close", block.role, block.channel, tokenizer)
        return block.ids[len(opening):len(block.ids) - len(close)]

    def valid(self, trace: Trace, tokenizer) -> bool:
        """Every generated block (first exchange and next A turn) holds some content besides its tags."""
        generated = [trace.blocks[i] for i in range(A_PRIVATE, B_PUBLIC + 1)] + [trace.blocks[trace.a2_index]]
        return all(self.content(b, tokenizer) for b in generated)

    # --- contrasts -------------------------------------------------------------------------

    def donor(self, trace: Trace, index: int, pool: list[Trace]) -> Trace | None:
        """A donor for block `index`: another trace of the same graph whose block has exactly as many
        tokens (any other trace when length_match is off); drawn with the donor seed, None when none."""
        length = len(trace.blocks[index].ids)
        candidates = [p for p in pool if p.trace_id != trace.trace_id and p.condition == trace.condition
                      and (not self.length_match or len(p.blocks[index].ids) == length)]
        if not candidates:
            return None
        return candidates[np.random.default_rng([self.donor_seed, trace.trace_id, index]).integers(len(candidates))]

    def contrasts(self, ctx: AuditContext, traces: list[Trace]) -> pd.DataFrame:
        """One row per (trace, direction): natural and counterfactual target NLL, delta, and the graph-cut control.

        A->B: X = A_private, target = B_private + B_public. B->A: X = B_private, target = the next A block.
        """
        rows, primary, control = [], [], []
        for t in traces:
            for direction, x, target, blocks in (
                    ("a_to_b", A_PRIVATE, (B_PRIVATE, B_PUBLIC), t.blocks[:B_PUBLIC + 1]),
                    ("b_to_a", B_PRIVATE, (t.a2_index,), t.blocks)):
                donor = self.donor(t, x, traces)
                row = {"trace_id": t.trace_id, "question_id": t.question_id, "condition": t.condition,
                       "direction": direction, "donor_trace": None if donor is None else donor.trace_id,
                       "donor_question_id": None if donor is None else donor.question_id,
                       "x_tokens": len(blocks[x].ids), "donor_tokens": None if donor is None else len(donor.blocks[x].ids),
                       "context_tokens": sum(len(b.ids) for b in blocks[:x]),
                       "public_tokens": sum(len(b.ids) for b in blocks[x + 1:target[0]]),
                       "target_tokens": sum(len(blocks[i].ids) for i in target),
                       "bridge_used": direction == "b_to_a" and not t.natural_a2}
                rows.append(row)
                if donor is None:
                    continue
                swapped = blocks[:x] + (donor.blocks[x],) + blocks[x + 1:]
                graph = visibility(blocks, t.condition)
                primary += [NLLRequest(blocks, target, graph), NLLRequest(swapped, target, graph)]
                if self.control:
                    cut = visibility(blocks, t.condition, cut_role=blocks[x].role)
                    control += [NLLRequest(blocks, target, cut, shared_prefix=False),
                                NLLRequest(swapped, target, cut, shared_prefix=False)]
        out = pd.DataFrame(rows, columns=RECORD_COLUMNS)
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
        """One row per first-exchange trace: validity, block lengths, 4-gram overlaps (§4.1-4.2), canary
        reproduction of its canary copy (§4.3), whether the next A turn was natural, and the texts."""
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
            rows.append({
                "trace_id": t.trace_id, "question_id": t.question_id, "condition": t.condition,
                "valid": t.trace_id in valid, "natural_a2": t.natural_a2,
                **{f"{name}_tokens": len(t.blocks[i].ids) for name, i in
                   (("a_private", A_PRIVATE), ("a_public", A_PUBLIC), ("b_private", B_PRIVATE), ("b_public", B_PUBLIC))},
                "ngram_raw": ngram_overlap(source, target, self.ngram),
                "ngram_corrected": ngram_overlap(source, target, self.ngram, exclude_ids=earlier),
                "canary": None if copy is None else copy.canary, "canary_reproduced": reproduced,
                "text": "".join(tok.decode(list(b.ids)) for b in t.blocks[1:]),
            })
        return pd.DataFrame(rows)
