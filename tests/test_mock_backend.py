"""backend=mock rehearses bookkeeping: its two sides answer alike without an effect, its effect shows where it is
set, its traces have the drawn lengths and budgets, and its results never pass for a model's."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest

from fairaudit.backends import Block, GraphGenerationRequest, NLLRequest
from fairaudit.backends.mock import MockBackend
from fairaudit.catalog.registry import backends_with
from fairaudit.data.tabular import CounterfactualTabular
from fairaudit.errors import AuditError
from fairaudit.models.locate import tiny_qwen3_dir
from fairaudit.probes import AuditContext, ModelSpec
from fairaudit.probes.decisions import paired_records
from fairaudit.prompts.yesno import Arm, Thinking
from fairaudit.store.client import CachingClient
from fairaudit.store.results import Store

THINK, NOTHINK = Arm("think", True, 120), Arm("nothink", False, 16)
DATASETS = {"adult": ("sex", "Male", "Female"), "compas": ("race", "White", "Non-White")}


def records(tmp_path, data_root, dataset: str = "adult", n: int = 40, **settings):
    """Paired records (think against nothink, parsed answers) of n pairs on the mock with these settings."""
    attribute, alpha, alpha_prime = DATASETS[dataset]
    backend = MockBackend(tiny_qwen3_dir(), protected=[alpha, alpha_prime], neutral=["He", "She", "His", "Her"],
                          **settings)
    data = CounterfactualTabular(dataset, n, 0, attribute, alpha, alpha_prime, "Will they?",
                                 "{description}\nQuestion: {question} Yes or No.", str(data_root))
    spec = ModelSpec("tiny_qwen3", Thinking(style="native"), {"enable_thinking": True})
    client = CachingClient(backend, Store(tmp_path / f"{dataset}-{n}.sqlite"))  # a folder of its own per call
    return paired_records(AuditContext(client, backend.tokenizer, spec, data, THINK), NOTHINK)


def flips(frame, arm: str) -> int:
    wide = frame[frame["arm"] == arm].pivot(index="pair_id", columns="side", values="answer").fillna("unparsed")
    return int((wide["alpha"] != wide["alpha_prime"]).sum())


@pytest.mark.parametrize("dataset", ["adult", "compas"])
def test_without_an_effect_both_sides_of_every_pair_answer_alike(tmp_path, data_root, dataset):
    frame = records(tmp_path, data_root, dataset, effect=0.0, effect_per_1k_tokens=0.0, trace_tokens={"median": 60})
    assert flips(frame, "think") == flips(frame, "nothink") == 0
    think = frame[frame["arm"] == "think"].pivot(index="pair_id", columns="side", values="p_yes")
    np.testing.assert_array_equal(think["alpha"], think["alpha_prime"])  # the same trace, the same reading
    assert frame["answer"].isin(["Yes", "No"]).mean() > 0.5  # traces that fit the budget close and answer


def test_the_effect_favours_the_alpha_side_and_grows_with_the_trace(tmp_path, data_root):
    frame = records(tmp_path, data_root, effect=3.0, effect_per_1k_tokens=40.0,
                    trace_tokens={"median": 60, "sigma": 0.0})
    gap = frame.pivot_table(index=["pair_id", "arm"], columns="side", values="p_yes")
    assert (gap["alpha"] > gap["alpha_prime"]).all()  # +effect/2 on alpha, -effect/2 on alpha'
    mean_gap = (gap["alpha"] - gap["alpha_prime"]).groupby(level="arm").mean()
    assert mean_gap["think"] > mean_gap["nothink"] > 0.2  # 60 trace tokens add 2.4 to the logit gap
    assert flips(frame, "think") > 0


def test_parsed_answers_agree_with_the_reading_and_traces_have_their_drawn_length(tmp_path, data_root):
    frame = records(tmp_path, data_root, trace_tokens={"distribution": "fixed", "median": 50})
    think = frame[frame["arm"] == "think"]
    assert (think["trace_tokens"] == 50).all() and not think["truncated"].any()
    answered = frame[frame["answer"].notna()]
    assert len(answered) == len(frame)
    assert ((answered["p_yes"] >= 0.5) == (answered["answer"] == "Yes")).all()


def test_a_trace_longer_than_the_budget_is_cut_there_and_left_unanswered(tmp_path, data_root):
    frame = records(tmp_path, data_root, trace_tokens={"median": 120, "sigma": 0.5})
    think = frame[frame["arm"] == "think"]
    cut = think[think["truncated"]]
    assert 0 < len(cut) < len(think)
    assert cut["parsed_answer"].isna().all()  # no answer came within the budget
    assert (think.groupby("pair_id")["truncated"].nunique() == 1).all()  # both sides draw the same length


def test_its_fingerprint_names_its_settings_and_it_is_never_offered_for_a_model():
    base, other = MockBackend(tiny_qwen3_dir()), MockBackend(tiny_qwen3_dir(), effect=1.5)
    assert base.fingerprint.startswith("mock-1/") and base.fingerprint != other.fingerprint
    assert "mock" not in backends_with("scores") and "hf" in backends_with("scores")
    with pytest.raises(AuditError, match=r"backend.trace_tokens.distribution='normal' must be one of"):
        MockBackend(tiny_qwen3_dir(), trace_tokens={"distribution": "normal"})


def test_target_nll_and_graph_generation_follow_what_the_graph_lets_the_target_see():
    backend = MockBackend(tiny_qwen3_dir(), trace_tokens={"median": 12})
    blocks = (Block((1, 2, 3)), Block((4, 5), "A", "private"), Block((6, 7), "B", "public"))
    masked, unmasked = NLLRequest(blocks, (2,), ((), (0,), (0,))), NLLRequest(blocks, (2,), ((), (0,), (0, 1)))
    nll = backend.target_nll([masked, unmasked, masked])
    assert nll.dtype == np.float64 and (nll > 0).all() and nll[0] == nll[2] != nll[1]
    hidden = NLLRequest((blocks[0], Block((9, 9), "A", "private"), blocks[2]), (2,), ((), (0,), (0,)))
    assert backend.target_nll([hidden])[0] == nll[0]  # a block the target cannot see changes nothing
    done = backend.generate([GraphGenerationRequest(blocks, ((), (0,), (0,)), 40, stop_ids=(11,))])[0]
    assert done.finish_reason == "stop" and 0 < len(done.token_ids) <= 40


@pytest.mark.slow
def test_records_made_a_block_at_a_time_equal_those_made_at_once(tmp_path, data_root, monkeypatch):
    from fairaudit.probes import decisions

    whole = records(tmp_path / "whole", data_root, n=30)
    monkeypatch.setattr(decisions, "BLOCK", 7)
    pd.testing.assert_frame_equal(records(tmp_path / "blocks", data_root, n=30), whole)


@pytest.mark.slow
def test_side_sd_draws_each_side_and_each_trace_apart_and_agrees_with_the_parsed_answer(tmp_path, data_root):
    fixed = {"distribution": "fixed", "median": 40}
    frame = records(tmp_path, data_root, n=300, effect=0.0, effect_per_1k_tokens=0.0, trace_sd=0.0, side_sd=1.0,
                    trace_tokens=fixed)
    logits = np.log(frame["p_yes"] / (1 - frame["p_yes"]))
    wide = frame.assign(logit=logits).pivot_table(index="pair_id", columns=["arm", "side"], values="logit")
    for arm in ("think", "nothink"):   # alpha minus alpha': the difference of two draws of sd 1, so sd sqrt(2)
        gap = wide[(arm, "alpha")] - wide[(arm, "alpha_prime")]
        assert abs(gap.mean()) < 0.25 and 1.2 < gap.std() < 1.65 and flips(frame, arm) > 0
    across = wide[("think", "alpha")] - wide[("nothink", "alpha")]  # the same pair logit, two traces, two draws
    assert 1.2 < across.std() < 1.65
    assert ((frame["p_yes"] >= 0.5) == (frame["answer"] == "Yes")).all()
    plain = MockBackend(tiny_qwen3_dir()).fingerprint
    assert MockBackend(tiny_qwen3_dir(), side_sd=0.0).fingerprint == plain != \
        MockBackend(tiny_qwen3_dir(), side_sd=1.0).fingerprint   # unset, a mock keeps its fingerprint


def test_influence_nll_shifts_what_a_swapped_block_can_reach_and_nothing_else():
    """A content target (its opening tag the block before it) written after block 1: the natural sequence keeps its
    NLL, a donor in block 1 adds influence_nll where the target sees block 1 (unmasked) and nothing where it cannot."""
    def nll(shift: float, source: tuple[int, ...], sees_source: bool) -> float:
        backend = MockBackend(tiny_qwen3_dir(), trace_tokens={"distribution": "fixed", "median": 12},
                              influence_nll=shift)
        blocks = (Block((1, 2, 3)), Block(source, "A", "private"), Block((7, 8), "B", "private"))
        graph = ((), (0,), (0, 1) if sees_source else (0,))
        written = backend.generate([GraphGenerationRequest(blocks, graph, 40, stop_ids=(11,))])[0].token_ids
        natural = blocks + (Block(written, "B", "private"),)
        swapped = (blocks[0], Block((5, 6), "A", "private")) + natural[2:]
        full = graph + (graph[2] + (2,),)
        return tuple(backend.target_nll([NLLRequest(seq, (3,), full)])[0] for seq in (natural, swapped))

    for sees in (True, False):
        plain, shifted = nll(0.0, (4, 5), sees), nll(0.75, (4, 5), sees)
        assert shifted[0] == plain[0] and shifted[1] == plain[1] + (0.75 if sees else 0.0)
    assert MockBackend(tiny_qwen3_dir(), influence_nll=0.0).fingerprint == MockBackend(tiny_qwen3_dir()).fingerprint


def test_position_pref_favours_the_first_answer_by_what_the_trace_read_and_nothing_else():
    """answers[0]'s logit gains position_pref + position_pref_per_1k_tokens x band tokens read / 1000 over the same
    mock without them; the other answers' logits stay as they were."""
    letters = dict(answers=["A", "B", "C", "D"], trace_sd=0.0)
    plain, preferring = (MockBackend(tiny_qwen3_dir(), **letters, **pref) for pref in (
        {}, {"position_pref": 0.3, "position_pref_per_1k_tokens": 20.0}))
    prompt = plain.tokenizer.encode("Which is it? A. one B. two C. three D. four", add_special_tokens=False)
    choices = [plain.tokenizer.encode(letter, add_special_tokens=False) for letter in "ABCD"]
    for read in (0, 5, 40):
        ids = prompt + plain.opener_ids + plain.band[:read].tolist()
        before, after = (np.log(b.choice_probs([ids], choices)[0]) for b in (plain, preferring))
        shift = after - before - (after - before)[1]   # log-odds against B: the softmax's normaliser cancels
        np.testing.assert_allclose(shift, [0.3 + 20.0 * read / 1000, 0.0, 0.0, 0.0], atol=1e-12)
    assert MockBackend(tiny_qwen3_dir(), position_pref=0.0, position_pref_per_1k_tokens=0.0).fingerprint == \
        MockBackend(tiny_qwen3_dir()).fingerprint != preferring.fingerprint   # unset, a mock keeps its fingerprint


def test_seconds_per_call_paces_every_kind_of_call_and_changes_no_answer():
    plain, paced = MockBackend(tiny_qwen3_dir()), MockBackend(tiny_qwen3_dir(), seconds_per_call=0.05)
    assert paced.fingerprint == plain.fingerprint  # a pace, not an answer: the store serves both the same results
    blocks = (Block((1, 2, 3)), Block((4, 5), "A", "private"))
    nll = NLLRequest(blocks, (1,), ((), (0,)))
    calls = {"target_nll": lambda b: b.target_nll([nll, nll, nll]),
             "choice_probs": lambda b: b.choice_probs([(1, 2), (3, 4)], [(5,), (6,)])}
    for name, call in calls.items():
        start = time.monotonic()
        answer = call(paced)
        assert time.monotonic() - start >= 0.05 * (3 if name == "target_nll" else 2), name  # each call its share
        np.testing.assert_array_equal(answer, call(plain))
