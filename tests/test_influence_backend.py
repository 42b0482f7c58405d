"""Generation and target NLL under role-visibility graphs on the real embedded models (paper 002)."""

import numpy as np
import pytest

from conftest import SMOLLM2
from fairaudit.backends import Block, GenerationRequest, GraphGenerationRequest, NLLRequest
from fairaudit.errors import AuditError
from fairaudit.models.locate import embedded_model_dir, tiny_qwen3_dir
from fairaudit.probes.influence_transcripts import visibility


@pytest.fixture(scope="module", params=["tiny_qwen3", SMOLLM2])
def backend(request):
    from fairaudit.backends.hf import HFBackend

    return HFBackend({"smollm2": embedded_model_dir, "tiny_qwen3": tiny_qwen3_dir}[request.param](), device="cpu")


def transcript(tok, private="I think it is four because two and two make four."):
    def enc(s):
        return tuple(tok.encode(s, add_special_tokens=False))

    return (Block(enc("Question: what is 2 + 2? A. 3 B. 4")),
            Block(enc("<A_private>" + private + "</A_private>"), "A", "private"),
            Block(enc("<A_public>The answer is B.</A_public>"), "A", "public"),
            Block(enc("<B_private>A says B; two and two is four, so B is right.</B_private>"), "B", "private"),
            Block(enc("<B_public>Agree: B.</B_public>"), "B", "public"))


def donor_of(block: Block, token: int) -> Block:
    """Same length, same tags' first and last tokens, other content."""
    return Block(block.ids[:1] + (token,) * (len(block.ids) - 2) + block.ids[-1:], block.role, block.channel)


def test_graph_rules():
    blocks = (Block((1,)), Block((2,), "A", "private"), Block((3,), "A", "public"), Block((4,), "B", "private"),
              Block((5,), "B", "public"), Block((6,)), Block((7,), "A", "private"))
    assert visibility(blocks, "unmasked") == tuple(tuple(range(i)) for i in range(7))
    assert visibility(blocks, "masked") == ((), (0,), (0, 1), (0, 2), (0, 2, 3), (0, 2, 4), (0, 1, 2, 4, 5))
    # the cut: no public block (the bridge 5 included) sees B's private block
    assert visibility(blocks, "masked", cut_role="B") == ((), (0,), (0, 1), (0, 2), (0, 2), (0, 2, 4), (0, 1, 2, 4, 5))
    assert visibility(blocks, "masked", cut_role="A")[2] == (0,)


def test_tree_packing_shares_leading_blocks_and_masks_like_the_graph():
    import torch

    from fairaudit.backends.graphs import graph_allowed, pack_tree, tree_length

    a, b, c, d = Block((1, 2)), Block((3,), "A", "private"), Block((4,), "A", "private"), Block((5, 6), "B", "private")
    graph = ((), (0,), (0,))
    requests = [NLLRequest((a, b, d), (2,), graph), NLLRequest((a, c, d), (2,), graph)]
    row = pack_tree(requests)
    assert row.ids == [1, 2, 3, 5, 6, 4, 5, 6] and tree_length(requests) == 8
    assert row.positions == [0, 1, 2, 3, 4, 2, 3, 4]
    assert row.paths == [[0, 1, 2, 3, 4], [0, 1, 5, 6, 7]]
    # the second request's d sees a only (not b, not the first copy of d), causally within itself
    assert row.allowed[6].tolist() == [True, True, False, False, False, False, True, False]
    single = pack_tree(requests[:1])
    assert torch.equal(single.allowed, graph_allowed([0, 0, 1, 2, 2], graph))


def test_causal_graph_generation_equals_plain_greedy(backend):
    blocks = transcript(backend.tokenizer)[:4]
    graph = backend.generate([GraphGenerationRequest(blocks, None, 10)])[0]
    plain = backend.generate([GenerationRequest(tuple(t for b in blocks for t in b.ids), 10)])[0]
    assert graph.token_ids == plain.token_ids


@pytest.mark.slow
def test_sampled_graph_generation_equals_plain_sampling_with_its_seed(backend):
    """A sampled block draws from the generator its seed names, as a GenerationRequest does, whatever its batch."""
    blocks = transcript(backend.tokenizer)[:4]
    ids = tuple(t for b in blocks for t in b.ids)
    request = GraphGenerationRequest(blocks, None, 10, (), 0.8, 0.95, 11)
    alone = backend.generate([request])[0]
    batched = backend.generate([GraphGenerationRequest(blocks[:2], None, 6), request,
                                GraphGenerationRequest(blocks, visibility(blocks, "masked"), 10, (), 0.8, 0.95, 12)])
    assert batched[1].token_ids == alone.token_ids
    assert alone.token_ids == backend.generate([GenerationRequest(ids, 10, 0.8, 0.95, 11)])[0].token_ids
    greedy = backend.generate([GraphGenerationRequest(blocks, None, 10)])[0]
    other_seed = backend.generate([GraphGenerationRequest(blocks, None, 10, (), 0.8, 0.95, 12)])[0]
    assert alone.token_ids != greedy.token_ids or alone.token_ids != other_seed.token_ids


def test_masked_generation_with_cache_equals_naive_recompute(backend):
    import torch

    from fairaudit.backends.graphs import graph_allowed
    from fairaudit.backends.packing import additive_mask

    tok = backend.tokenizer
    blocks = transcript(tok)[:3] + (Block(tuple(tok.encode("<B_private>", add_special_tokens=False)), "B", "private"),)
    graph = visibility(blocks, "masked")
    other = transcript(tok, "Not sure.")[:2] + (Block(blocks[3].ids, "B", "private"),)
    cached = backend.generate([GraphGenerationRequest(blocks, graph, 8),
                               GraphGenerationRequest(other, visibility(other, "masked"), 8)])[0].token_ids
    ids, block_of = [t for b in blocks for t in b.ids], [i for i, b in enumerate(blocks) for _ in b.ids]
    model = backend.model
    for _ in range(len(cached)):
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([ids]), position_ids=torch.arange(len(ids))[None],
                           attention_mask=additive_mask(graph_allowed(block_of, graph)[None], model.dtype)).logits
        ids.append(int(logits[0, -1].argmax()))
        block_of.append(3)
    assert tuple(ids[-len(cached):]) == cached


def test_packed_nll_equals_separate_passes_and_a_plain_causal_forward(backend):
    import torch

    blocks = transcript(backend.tokenizer)
    swapped = blocks[:1] + (donor_of(blocks[1], blocks[3].ids[3]),) + blocks[2:]
    masked = visibility(blocks, "masked")
    requests = [NLLRequest(blocks, (3, 4), masked), NLLRequest(swapped, (3, 4), masked), NLLRequest(blocks, (3, 4))]
    packed = backend.target_nll(requests)
    alone = np.array([backend.target_nll([r])[0] for r in requests])
    np.testing.assert_allclose(packed, alone, atol=1e-5, rtol=0)
    sequence = [t for b in blocks for t in b.ids]
    with torch.inference_mode():
        logp = backend.model(input_ids=torch.tensor([sequence])).logits[0].double().log_softmax(-1)
    start = len(sequence) - len(blocks[3].ids) - len(blocks[4].ids)
    manual = -np.mean([float(logp[i - 1, sequence[i]]) for i in range(start, len(sequence))])
    assert packed[2] == pytest.approx(manual, abs=1e-5)
    assert packed[0] != packed[2]  # the mask changes what B's tokens condition on


def test_graph_cut_control_is_bit_identical_and_the_uncut_graph_is_not(backend):
    blocks = transcript(backend.tokenizer)
    swapped = blocks[:1] + (donor_of(blocks[1], blocks[3].ids[3]),) + blocks[2:]
    cut, masked = visibility(blocks, "masked", cut_role="A"), visibility(blocks, "masked")
    nll = backend.target_nll([NLLRequest(blocks, (3, 4), cut, False), NLLRequest(swapped, (3, 4), cut, False),
                              NLLRequest(blocks, (3, 4), masked, False), NLLRequest(swapped, (3, 4), masked, False)])
    assert nll[0] == nll[1]           # ==, never isclose
    assert nll[2] != nll[3]           # through A_public's hidden states the private block still reaches B


def test_graphs_are_refused_where_the_mask_cannot_be_applied(backend):
    blocks = transcript(backend.tokenizer)
    config = backend.model.config
    config.sliding_window = 4
    try:
        with pytest.raises(AuditError, match="cannot apply a visibility graph"):
            backend.target_nll([NLLRequest(blocks, (3,), visibility(blocks, "masked"))])
    finally:
        config.sliding_window = None
    with pytest.raises(ValueError, match="target blocks"):
        backend.target_nll([NLLRequest(blocks, (7,))])


def test_a_block_split_into_pieces_scores_as_the_whole_block(backend):
    """probe.target=content splits a target block into tag, content, tag of one role and channel: the graph gives
    the pieces the attention the block had, so scoring every piece equals scoring the block (up to packing)."""
    blocks = transcript(backend.tokenizer)
    split = blocks[:3] + tuple(Block(part, "B", "private") for part in
                               (blocks[3].ids[:3], blocks[3].ids[3:-3], blocks[3].ids[-3:])) + blocks[4:]
    masked = visibility(blocks, "masked")
    whole = backend.target_nll([NLLRequest(blocks, (3,), masked, False)])[0]
    pieces = backend.target_nll([NLLRequest(split, (3, 4, 5), visibility(split, "masked"), False)])[0]
    content = backend.target_nll([NLLRequest(split, (4,), visibility(split, "masked"), False)])[0]
    assert pieces == pytest.approx(whole, abs=1e-5) and content != pytest.approx(whole, abs=1e-5)
