"""The influence probe's contrasts: a donor for each trace's source block, the swap, and the target's NLL.

Each directional contrast scores a fixed target under the natural prefix and under the prefix with the
source block replaced by a donor's (paper 002 Eq. 1-4); the graph-cut control re-scores both with the
private-to-public carrier edges blocked (§6.3). A->B: source A_private, target B_private + B_public.
B->A: source B_private, target the next A turn (its private + public blocks).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from fairaudit.backends import Block, NLLRequest
from fairaudit.probes import AuditContext
from fairaudit.probes.influence_transcripts import A_PRIVATE, B_PRIVATE, B_PUBLIC, Tags, Trace, visibility

RECORD_COLUMNS = ["trace_id", "question_id", "condition", "direction", "donor_trace", "donor_question_id", "x_tokens",
                  "donor_tokens", "context_tokens", "public_tokens", "target_tokens", "bridge_used", "x_truncated",
                  "skip_reason"]


@dataclass(frozen=True)
class Donors:
    """Draws the donor of a trace's block among the other traces of its graph (`length_match`: exact, complete
    or off), seeded by `seed`, the trace and the block."""

    length_match: str = "exact"
    seed: int = 0

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
        return distinct[np.random.default_rng([self.seed, trace.trace_id, index]).integers(len(distinct))], None


@dataclass(frozen=True)
class ContrastScorer:
    """Scores every trace's contrasts: `target` content (the target's own tokens) or with_tags, with the
    graph-cut control when `control`."""

    tags: Tags
    donors: Donors
    target: str = "content"
    control: bool = True

    def scored(self, blocks: tuple[Block, ...], target: tuple[int, ...],
               tokenizer) -> tuple[tuple[Block, ...], tuple[int, ...]]:
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
            n_open, n_close = (len(self.tags.ids(k, block.role, block.channel, tokenizer)) for k in ("open", "close"))
            parts = (block.ids[:n_open], block.ids[n_open:len(block.ids) - n_close],
                     block.ids[len(block.ids) - n_close:])
            for part, is_content in zip(parts, (False, True, False)):
                if part:
                    scored += [len(out)] if is_content else []
                    out.append(Block(part, block.role, block.channel))
        return tuple(out), tuple(scored)

    def contrasts(self, ctx: AuditContext, traces: list[Trace]) -> pd.DataFrame:
        """One row per (trace, direction): natural and counterfactual target NLL, delta, and the graph-cut control.

        A->B: X = A_private, target = B_private + B_public. B->A: X = B_private, target = the next A turn
        (its private + public blocks). Targets are scored as `target` says.
        """
        rows, primary, control = [], [], []
        for t in traces:
            for direction, x, target, blocks in (
                    ("a_to_b", A_PRIVATE, (B_PRIVATE, B_PUBLIC), t.blocks[:B_PUBLIC + 1]),
                    ("b_to_a", B_PRIVATE, (t.a2_index, t.a2_index + 1), t.blocks[:t.a2_index + 2])):
                donor, reason = self.donors.donor(t, x, traces)
                sequence, scored = self.scored(blocks, target, ctx.tokenizer)
                rows.append(_row(t, direction, x, target, blocks, sequence, scored, donor, reason))
                if donor is None:
                    continue
                swapped = sequence[:x] + (donor.blocks[x],) + sequence[x + 1:]
                graph = visibility(sequence, t.condition)
                primary += [NLLRequest(sequence, scored, graph), NLLRequest(swapped, scored, graph)]
                if self.control:
                    cut = visibility(sequence, t.condition, cut_role=blocks[x].role)
                    control += [NLLRequest(sequence, scored, cut, shared_prefix=False),
                                NLLRequest(swapped, scored, cut, shared_prefix=False)]
        return _scores(ctx, pd.DataFrame(rows, columns=RECORD_COLUMNS), primary, control)


def _row(t: Trace, direction: str, x: int, target: tuple[int, ...], blocks: tuple[Block, ...],
         sequence: tuple[Block, ...], scored: tuple[int, ...], donor: Trace | None, reason: str | None) -> dict:
    """A contrast's record before scoring: the trace, the donor (or why none), the token counts around X."""
    return {"trace_id": t.trace_id, "question_id": t.question_id, "condition": t.condition,
            "direction": direction, "donor_trace": None if donor is None else donor.trace_id,
            "donor_question_id": None if donor is None else donor.question_id,
            "x_tokens": len(blocks[x].ids), "donor_tokens": None if donor is None else len(donor.blocks[x].ids),
            "context_tokens": sum(len(b.ids) for b in blocks[:x]),
            "public_tokens": sum(len(b.ids) for b in blocks[x + 1:target[0]]),
            "target_tokens": sum(len(sequence[i].ids) for i in scored),
            "bridge_used": direction == "b_to_a" and not t.natural_a2,
            "x_truncated": t.is_truncated(x), "skip_reason": reason}


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
