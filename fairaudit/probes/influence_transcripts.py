"""The influence probe's transcripts: role-channel blocks written one at a time under a visibility graph.

A transcript is the chat prompt, then A_private, A_public (the proposer), B_private, B_public (the
verifier), then a next A turn, A's private and public blocks (natural when the model opens it, else
after a fixed bridge, paper 002 §6.2). Each block's opening tag is pre-filled and it is generated up
to its closing tag or the block budget; blocks are sampled (seeded per item and block, the same seed
under every graph) or greedy. A canary copy of each transcript plants a random string at the end of
A_private before B writes (§4.3).
"""

from __future__ import annotations

import string
import zlib
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from fairaudit.backends import Block, GraphGenerationRequest, Visibility
from fairaudit.data.mcq import format_options
from fairaudit.probes import AuditContext
from fairaudit.probes.decisions import encode

GRAPHS = ("masked", "unmasked")
FIRST_EXCHANGE = (("A", "private"), ("A", "public"), ("B", "private"), ("B", "public"))
A_PRIVATE, A_PUBLIC, B_PRIVATE, B_PUBLIC = 1, 2, 3, 4  # block indices after the prompt block 0
DEFAULT_TAGS = {"open": "<{role}_{channel}>\n", "close": "\n</{role}_{channel}>\n"}


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
    a2_index: int = -1             # index of the next A turn's private block (its public block follows)
    truncated: tuple[bool, ...] = ()   # per block: cut by max_block_tokens and force-closed

    def text(self, tokenizer, index: int) -> str:
        return tokenizer.decode(list(self.blocks[index].ids))

    def is_truncated(self, index: int) -> bool:
        return index < len(self.truncated) and self.truncated[index]

    def generated(self) -> list[int]:
        """Indices of the generated blocks: the first exchange and the next A turn."""
        return [A_PRIVATE, A_PUBLIC, B_PRIVATE, B_PUBLIC, self.a2_index, self.a2_index + 1]


@dataclass(frozen=True)
class Tags:
    """The block delimiters: formats over {role} (A or B) and {channel} (private or public)."""

    open: str = DEFAULT_TAGS["open"]
    close: str = DEFAULT_TAGS["close"]

    def text(self, kind: str, role: str, channel: str) -> str:
        return getattr(self, kind).format(role=role, channel=channel)

    def ids(self, kind: str, role: str, channel: str, tokenizer) -> tuple[int, ...]:
        """A tag's token ids (kind: open or close)."""
        return encode(tokenizer, self.text(kind, role, channel))

    def content(self, block: Block, tokenizer) -> tuple[int, ...]:
        """A generated block's ids without its opening and closing tags."""
        opening, close = (self.ids(kind, block.role, block.channel, tokenizer) for kind in ("open", "close"))
        return block.ids[len(opening):len(block.ids) - len(close)]

    def valid(self, trace: Trace, tokenizer) -> bool:
        """Every generated block (first exchange and next A turn) holds some content besides its tags."""
        return all(self.content(trace.blocks[i], tokenizer) for i in trace.generated())


@dataclass(frozen=True)
class TranscriptWriter:
    """Writes every item's transcript under each graph, each block batched over all traces."""

    conditions: tuple[str, ...]
    tags: Tags
    system_prompt: str = ""
    max_block_tokens: int = 24
    bridge: str = ""
    sampling: dict = field(default_factory=dict)   # temperature, top_p, seed
    canary: dict = field(default_factory=dict)     # enabled, length, seed, text

    def prompt(self, ctx: AuditContext, question: str, options: list[str]) -> Block:
        """The chat prompt of one item (system prompt, question and options), as block 0."""
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages.append({"role": "user", "content": f"{question}\n\n{format_options(options)}"})
        text = ctx.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                 **ctx.model.template_kwargs)
        return Block(encode(ctx.tokenizer, text))

    def canary_string(self, question_id: int) -> str:
        rng = np.random.default_rng([self.canary["seed"], question_id])
        return "".join(rng.choice(list(string.ascii_uppercase + string.digits), self.canary["length"]))

    def block_seed(self, question_id: int, block: str) -> int:
        """The sampling seed of one block of an item's transcript, the same under every graph and in its canary
        copy (common random numbers: what differs between them is what the block may see)."""
        return zlib.crc32(f"{self.sampling['seed']}/{question_id}/{block}".encode())

    def request(self, trace: Trace, blocks: tuple[Block, ...], budget: int, block: str,
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
                        (self.prompt(ctx, item.question, list(item.options)),), truncated=(False,))
                  for i, item in enumerate(items.itertuples(index=False))
                  for c, condition in enumerate(self.conditions)]
        for role, channel in FIRST_EXCHANGE:
            if (role, channel) == ("B", "private") and self.canary["enabled"]:
                traces += [self.plant(t, tok) for t in list(traces)]
            self.extend(ctx, traces, role, channel)
        self.next_a_turn(ctx, traces)
        return traces

    def plant(self, trace: Trace, tokenizer) -> Trace:
        """The canary copy of a trace: its planted string at the end of A_private's content."""
        canary = self.canary_string(trace.question_id)
        block = trace.blocks[A_PRIVATE]
        close = self.tags.ids("close", "A", "private", tokenizer)
        content = block.ids[:len(block.ids) - len(close)] + encode(tokenizer, self.canary["text"].format(canary=canary))
        planted = replace(block, ids=content + close)
        blocks = trace.blocks[:A_PRIVATE] + (planted,) + trace.blocks[A_PRIVATE + 1:]
        return replace(trace, canary=canary, blocks=blocks)

    def extend(self, ctx: AuditContext, traces: list[Trace], role: str, channel: str, turn: int = 1) -> None:
        """Generate one block (opening tag pre-filled, up to its closing tag) for every trace, under its graph."""
        tok = ctx.tokenizer
        opening, close = self.tags.ids("open", role, channel, tok), self.tags.ids("close", role, channel, tok)
        stop = encode(tok, self.tags.text("close", role, channel).strip())
        name = f"{role.lower()}{turn if turn > 1 else ''}_{channel}"
        requests = [self.request(t, t.blocks + (Block(opening, role, channel),), self.max_block_tokens, name, stop)
                    for t in traces]
        completions = ctx.client.generate(requests, label=f"generate {name}")
        for t, c in zip(traces, completions):
            t.blocks = t.blocks + (Block(opening + c.token_ids + close, role, channel),)
            t.truncated = t.truncated + (c.finish_reason == "length",)

    def next_a_turn(self, ctx: AuditContext, traces: list[Trace]) -> None:
        """§6.2: the next A turn, A's private then public block. Where the model's own continuation opens an
        A block it is natural; elsewhere the fixed bridge is appended first. Canary copies need none."""
        tok = ctx.tokenizer
        firsts = [t for t in traces if t.canary is None]
        opening = self.tags.ids("open", "A", "private", tok)
        checks = [self.request(t, t.blocks + (Block(()),), len(opening), "next") for t in firsts]
        for t, c in zip(firsts, ctx.client.generate(checks, label="continuation check")):
            t.natural_a2 = c.token_ids == opening
            if not t.natural_a2:
                t.blocks = t.blocks + (Block(encode(tok, self.bridge)),)
                t.truncated = t.truncated + (False,)
            t.a2_index = len(t.blocks)
        self.extend(ctx, firsts, "A", "private", turn=2)
        self.extend(ctx, firsts, "A", "public", turn=2)
