"""Probe `position` on scripted outputs (exact records, metrics, truncation, cache), and end to end on a real model."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest
from jinja2.exceptions import TemplateError

from conftest import DATA_ROOT, run_app
from fairaudit.analysis.numbers import format_number, format_p
from fairaudit.analysis.position_truncation import truncation
from fairaudit.backends import Backend, Completion, GenerationRequest
from fairaudit.cli.main import hoist_multirun_flag
from fairaudit.data.mcq import MCQDataset
from fairaudit.errors import AuditError
from fairaudit.job.config import check_fit
from fairaudit.probes import AuditContext, ModelSpec
from fairaudit.probes.position import PositionProbe, continuation_seed
from fairaudit.prompts.mcq import final_answer, letter_frequency, render_mcq_prompt
from fairaudit.prompts.yesno import Arm, Thinking
from fairaudit.store.client import CachingClient, generation_key
from fairaudit.store.results import Store

SQRT_075 = math.sqrt(0.75)
PROMPTED = Thinking(style="prompted", instruction="answer Yes or No")  # a decision-probe instruction, unused by MCQ
REASON, COT, DIRECT = Arm("reason", True, 200, "mcq"), Arm("cot", False, 200, "mcq"), Arm("direct", False, 16, "mcq")
PAD = "Let me weigh each option carefully against what I know. " * 2


class CharTokenizer:
    """One token per character; a minimal chat template."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids) -> str:
        return "".join(chr(i) for i in ids)

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True, **kwargs) -> str:
        text = "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages) + "<|assistant|>"
        return text + "<think>\n" if kwargs.get("enable_thinking") else text


class ScriptedBackend(Backend):
    """Answers from `script(prompt_text, request) -> (text, finish_reason)`; records every request it serves."""

    fingerprint = "scripted/1"

    def __init__(self, script):
        self.tokenizer = CharTokenizer()
        self.script = script
        self.calls: list[GenerationRequest] = []

    def generate(self, requests):
        self.calls.extend(requests)
        out = []
        for request in requests:
            text, finish = self.script(self.tokenizer.decode(request.prompt_ids), request)
            out.append(Completion(text, tuple(self.tokenizer.encode(text)), finish))
        return out


def trajectory_text(letter: str) -> str:
    """A trajectory that mentions another option first and settles on `letter` at "I think" (its CCP)."""
    other = "D" if letter != "D" else "C"
    return f"Option {other} looks plausible. {PAD}I think {letter}. {PAD}The answer is ({letter})."


def ccp_of(letter: str) -> float:
    text = trajectory_text(letter)
    return (text.index("I think") + len("I think ")) / len(text)


def options_by_content(prompt: str) -> dict[str, str]:
    return {content: letter for letter, content in re.findall(r"^([A-D])\. (.*)$", prompt, flags=re.M)}


def script(prompt: str, request: GenerationRequest) -> tuple[str, str]:
    """q0 always answers position A, q1 always the gold option "gold", q2 the option "third" but fails on one order.

    Continuations from before the CCP switch to A; from after it they keep the answer.
    """
    generated = prompt.split("<|assistant|>", 1)[1].removeprefix("<think>\n")
    if request.temperature > 0:
        if "I think" in generated:
            return f" The answer is ({generated.split('I think ')[1][0]}).", "stop"
        return "I think A. The answer is (A).", "stop"
    assert generated == ""
    letters = options_by_content(prompt)
    if "Q0?" in prompt:
        return trajectory_text("A"), "stop"
    if "Q1?" in prompt:
        return trajectory_text(letters["gold"]), "stop"
    if letters["third"] == "B":  # one permutation of q2: no answer at all
        return "Hmm, this is hard to say without more", "length"
    return trajectory_text(letters["third"]), "stop"


def write_questions(path: Path) -> Path:
    rows = [
        {"question": "Q0?", "options": "A. w\nB. gold\nC. y\nD. z", "answer": "B. gold"},
        {"question": "Q1?", "options": "A. gold\nB. x\nC. y\nD. z", "answer": "A. gold"},
        {"question": "Q2?", "options": "A. w\nB. x\nC. third\nD. gold", "answer": "D. gold"},
    ]
    path.write_text("\n".join(json.dumps(row) for row in rows))
    return path


@pytest.fixture
def dataset(tmp_path) -> MCQDataset:
    return MCQDataset(name="toy", n=None, seed=0, path=str(write_questions(tmp_path / "toy.jsonl")))


def context(tmp_path, dataset, arm=REASON, thinking=PROMPTED):
    inner = ScriptedBackend(script)
    backend = CachingClient(inner, Store(tmp_path / "store.sqlite"), chunk_size=5)
    spec = ModelSpec(name="scripted", thinking=thinking, template_kwargs={})
    return AuditContext(backend, inner.tokenizer, spec, dataset, arm), inner


def probe(**truncation_overrides) -> PositionProbe:
    return PositionProbe(think_instruction="Reason inside {open} and {close}.",
                         truncation={"max_new_tokens": 50, **truncation_overrides})


# --- rendering and answers ------------------------------------------------------------------

def test_prompts_per_arm_and_thinking_style():
    tok = CharTokenizer()
    prompted = render_mcq_prompt(tok, REASON, "Q?", "A. a", PROMPTED, {}, "Reason inside {open} and {close}.")
    assert prompted.endswith("<|assistant|><think>\n")
    assert "give your final answer.\n\nReason inside <think> and </think>.\n<|assistant|>" in prompted
    assert "Yes or No" not in prompted
    assert render_mcq_prompt(tok, COT, "Q?", "A. a", PROMPTED, {}, "Reason.").endswith(
        "give your final answer.\n<|assistant|>")  # Instruct-style CoT: plain chat, no pre-fill
    native = Thinking(style="native")
    assert render_mcq_prompt(tok, REASON, "Q?", "A. a", native, {"enable_thinking": True}).endswith(
        "<|assistant|><think>\n")
    assert render_mcq_prompt(tok, REASON, "Q?", "A. a", native, {}).endswith("<|assistant|>")  # the model opens it
    assert render_mcq_prompt(tok, COT, "Q?", "A. a", native, {"enable_thinking": True}).endswith(
        "<|assistant|><think>\n\n</think>\n\n")
    none = render_mcq_prompt(tok, DIRECT, "Q?", "A. a", Thinking(style="none"), {})
    assert none.startswith("<|system|>You are a helpful assistant. Answer") and none.endswith("A. a\n<|assistant|>")


def test_system_role_is_folded_into_the_user_turn_when_the_template_has_none():
    class NoSystem(CharTokenizer):
        def apply_chat_template(self, messages, **kwargs):
            if messages[0]["role"] == "system":
                raise TemplateError("System role not supported")
            return super().apply_chat_template(messages, **kwargs)

    text = render_mcq_prompt(NoSystem(), DIRECT, "Q?", "A. a", Thinking(style="none"), {})
    assert text.startswith("<|user|>You are a helpful assistant.") and "Do NOT show any work.\n\nQ?\n\nA. a" in text


def test_letter_frequency_fallback():
    assert final_answer("The answer is (C).") == ("C", "cascade")
    assert final_answer("C. Early majority, or B. maybe; I choose C, surely.") == ("C", "fallback")
    assert final_answer("C. Early majority, or B. maybe; I choose C, surely.", fallback=False) == (None, None)
    assert letter_frequency("A. one\nB. two\n") is None and final_answer("no letters here") == (None, None)


# --- the probe on scripted outputs -----------------------------------------------------------

def test_records_and_metrics_of_scripted_answers(tmp_path, dataset):
    ctx, inner = context(tmp_path, dataset)
    result = probe(enabled=False).run(ctx)
    records = result.records["records"]
    assert list(result.records) == ["records"] and "truncation" not in result.figures
    assert records.columns.tolist()[:5] == ["question_id", "permutation", "gold_position", "answer_position",
                                            "answer_source"]
    assert {"length_chars", "arm", "text", "prompt_hash", "truncated", "ccp", "eff_sw"} <= set(records.columns)
    assert records["question_id"].tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert records["gold_position"].tolist() == [1, 2, 3, 0, 0, 1, 2, 3, 3, 0, 1, 2]
    assert records["answer_position"].tolist() == [0, 0, 0, 0, 0, 1, 2, 3, 2, 3, 0, pd.NA]
    assert records["truncated"].tolist() == [False] * 11 + [True]
    assert records["length_chars"].tolist() == [len(t) for t in records["text"]]
    assert records["ccp"].iloc[0] == pytest.approx(ccp_of("A")) and math.isnan(records["ccp"].iloc[11])
    assert (records["arm"] == "reason").all()
    requests = inner.calls[:12]
    assert all(r.temperature == 0.0 and r.max_new_tokens == 200 and r.seed is None for r in requests)
    assert records["prompt_hash"].tolist() == [generation_key("scripted/1", r) for r in requests]
    m = result.metrics
    assert m["n_records_reason"] == 12 and m["n_questions_complete_reason"] == 2
    assert m["extraction_rate_reason"] == 11 / 12 and m["fallback_rate_reason"] == 0.0
    assert m["answered_rate_reason"] == 11 / 12
    assert m["truncated_rate_reason"] == 1 / 12
    assert m["pbs_reason"] == pytest.approx((SQRT_075 + 0.0) / 2)  # q0 always A, q1 always gold; q2 incomplete
    assert m["accuracy_reason"] == pytest.approx(5 / 11)  # q0 once (gold at A), q1 four times, q2 never
    assert m["preferred_position_reason"] == 0
    assert set(result.headline) - set(m) == {f"{name}_reason" for name in (
        "trunc_n_questions", "trunc_n", "trunc_change_rate", "trunc_directional_shift", "trunc_change_rate_before_ccp",
        "trunc_change_rate_after_ccp", "trunc_ccp_chi2_p", "trunc_ccp_perm_p", "trunc_ccp_perm_n_questions")}
    assert set(result.tables) == {"per_question", "pbs_by_length", "position_summary"}
    assert set(result.figures) == {"pbs_by_length", "pbs_length"}


def test_truncation_cuts_one_permutation_of_the_first_questions_with_a_ccp(tmp_path, dataset):
    """§5.3: n questions x 4 offsets x 3 continuations, each question's permutation 0 by default."""
    ctx, inner = context(tmp_path, dataset)
    continuations = probe().run(ctx).records["continuations"]
    assert len(continuations) == 3 * 4 * 3 and set(continuations["permutation"]) == {0}
    assert continuations.groupby("question_id").size().tolist() == [12, 12, 12]
    ctx, inner = context(tmp_path, dataset)
    result = probe(n_questions=2, permutation=2).run(ctx)
    assert result.metrics["trunc_n_questions_reason"] == 2
    assert set(result.records["continuations"]["permutation"]) == {2}
    assert sorted(result.records["continuations"]["question_id"].unique()) == [0, 1]


def test_truncation_continuations_are_exact_and_cached(tmp_path, dataset):
    ctx, inner = context(tmp_path, dataset)
    result = probe(permutation=None).run(ctx)
    records, continuations = result.records["records"], result.records["continuations"]
    # 11 trajectories with a CCP near 0.45: all four offsets fall inside, 3 samples each
    assert len(continuations) == 11 * 4 * 3 and len(inner.calls) == 12 + 132
    assert sorted(continuations["offset"].unique()) == [-0.15, -0.05, 0.05, 0.15]
    assert continuations.groupby(["question_id", "permutation", "offset"]).size().eq(3).all()
    first = continuations.iloc[0]
    original = records.iloc[0]
    assert (first["question_id"], first["permutation"], first["offset"], first["sample"]) == (0, 0, -0.15, 0)
    assert first["position"] == pytest.approx(round(ccp_of("A") - 0.15, 10))
    assert first["cut_char"] == round(first["position"] * len(original["text"]))
    sampled = inner.calls[12:]
    prompt_ids = inner.calls[0].prompt_ids
    assert sampled[0].prompt_ids == prompt_ids + tuple(ord(c) for c in original["text"][: first["cut_char"]])
    assert all(r.temperature == 0.7 and r.top_p == 0.95 and r.max_new_tokens == 50 for r in sampled)
    assert [r.seed for r in sampled] == continuations["seed"].tolist()
    assert continuations["seed"].nunique() == 132
    assert first["seed"] == continuation_seed(0, 0, 0, -0.15, 0)
    assert continuations["prompt_hash"].tolist() == [generation_key("scripted/1", r) for r in sampled]
    # before CCP the continuation switches to A; after it keeps the original answer
    before = continuations["offset"] < 0
    assert (continuations.loc[before, "new_answer_position"] == 0).all()
    assert (continuations.loc[~before, "new_answer_position"].tolist()
            == continuations.loc[~before, "answer_position"].tolist())
    assert (continuations["preferred_position"] == 0).all()
    m = result.metrics
    changed_records = 5  # q1 at permutations 1-3 and q2 at 0-1 answer something other than A
    assert m["trunc_n_continuations_reason"] == 132 and m["trunc_n_reason"] == 132
    assert m["trunc_change_rate_before_ccp_reason"] == pytest.approx(changed_records * 2 * 3 / 66)
    assert m["trunc_change_rate_after_ccp_reason"] == 0.0
    assert m["trunc_change_rate_reason"] == pytest.approx(30 / 132)
    assert m["trunc_directional_shift_reason"] == 1.0  # every change lands on A, the preferred position
    expected = truncation(continuations)["metrics"]
    assert {f"{k}_reason": v for k, v in expected.items() if not math.isnan(v)}.items() <= m.items()
    assert set(result.tables) >= {"truncation_by_position", "truncation_by_offset"} and "truncation" in result.figures
    line = next(text for text in probe(permutation=None).verdict(result) if text.startswith("truncation: "))
    assert (f"exact p = {format_p(m['trunc_ccp_perm_log10_p_reason'])} relabeling cuts within each of "
            f"{format_number(m['trunc_ccp_perm_n_questions_reason'])} questions" in line)
    assert m["trunc_ccp_perm_p_reason"] < 0.01 and m["trunc_ccp_perm_exact_reason"] == 1.0   # 30 changes, all before

    # a second run over the same store makes no model call and gives the same records
    again_ctx, again_inner = context(tmp_path, dataset)
    again = probe(permutation=None).run(again_ctx)
    assert again_inner.calls == [] and again_ctx.client.model_calls == 0
    pd.testing.assert_frame_equal(again.records["records"], records)
    pd.testing.assert_frame_equal(again.records["continuations"], continuations)
    # a new base seed resamples every continuation but not the greedy answers
    reseeded_ctx, reseeded_inner = context(tmp_path, dataset)
    probe(seed=1, permutation=None).run(reseeded_ctx)
    assert len(reseeded_inner.calls) == 132 and all(r.temperature > 0 for r in reseeded_inner.calls)


def test_direct_arm_is_not_truncated(tmp_path, dataset):
    ctx, inner = context(tmp_path, dataset, arm=DIRECT)
    result = probe().run(ctx)
    assert "continuations" not in result.records and len(inner.calls) == 12
    assert "pbs_direct" in result.metrics and "extraction_rate_direct" in result.metrics
    assert all(r.max_new_tokens == 16 for r in inner.calls)


def test_continuation_seeds_are_fixed_and_distinct():
    seeds = {continuation_seed(0, q, s, o, k)
             for q in range(5) for s in range(4) for o in (-0.15, -0.05, 0.05, 0.15) for k in range(3)}
    assert len(seeds) == 5 * 4 * 4 * 3
    assert (continuation_seed(7, 1, 2, 0.05, 1) == continuation_seed(7, 1, 2, 0.05, 1)
            != continuation_seed(8, 1, 2, 0.05, 1))


# --- validation before any model loads -------------------------------------------------------------

def test_arm_and_config_validation():
    assert probe().arms(REASON) == [REASON]
    with pytest.raises(AuditError, match=r"arm 'long' has no MCQ prompt; choices: \['direct', 'cot', 'reason'\]"):
        probe().arms(Arm("long", True, 10, "mcq"))
    assert probe().arms(Arm("think", True, 10, "decision"))  # the family check in app.check_fit names it
    with pytest.raises(AuditError, match="probe.truncation.*offset"):
        PositionProbe(truncation={"offset": [0.1]})
    with pytest.raises(AuditError, match=r"^probe.partial_corr='kendall' must be one of \['pearson', 'spearman'\]$"):
        PositionProbe(partial_corr="kendall")
    with pytest.raises(AuditError, match=r"^probe.truncation.relabelings=10 must be an integer in 100..1000000$"):
        PositionProbe(truncation={"relabelings": 10})
    assert PositionProbe(partial_corr="spearman", truncation={"relabelings": 500}).truncation.relabelings == 500


def test_probe_rejects_a_decision_dataset(tmp_path):
    class Pairs:
        name, family = "adult", "decision"

    with pytest.raises(AuditError, match="probe 'position' takes mcq datasets; dataset 'adult' is a decision dataset"):
        check_fit(probe(), "position", [REASON], Pairs(), ModelSpec("scripted", PROMPTED, {}))


def test_dataset_check(tmp_path, dataset):
    dataset.check()
    assert len(dataset.variants()) == 12
    with pytest.raises(AuditError, match=r"dataset.n=4 is out of range for dataset 'toy': choose 1 <= n <= 3"):
        MCQDataset(name="toy", n=4, seed=0, path=dataset.path).check()
    with pytest.raises(AuditError, match=r"dataset 'arc' needs dataset.path=<file>.*allenai/ai2_arc"):
        MCQDataset(name="arc", n=2, seed=0, path=None, source="allenai/ai2_arc").check()
    with pytest.raises(AuditError, match="nowhere.parquet does not exist"):
        MCQDataset(name="arc", n=2, seed=0, path=str(tmp_path / "nowhere.parquet")).check()
    shipped = MCQDataset(name="mmlu", n=2, seed=0, path="mmlu/test.jsonl", root=str(DATA_ROOT))
    shipped.check()
    assert shipped.variants()["question_id"].nunique() == 2


def test_gpqa_csv(tmp_path):
    columns = ["Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3"]
    path = tmp_path / "gpqa_diamond.csv"
    pd.DataFrame([[f"Q{i}", "right", "w1", "w2", "w3"] for i in range(3)], columns=columns).to_csv(path, index=False)
    variants = MCQDataset(name="gpqa", n=3, seed=0, path=str(path)).variants()
    assert len(variants) == 12
    assert all(opts[g] == "right" for opts, g in zip(variants["options"], variants["gold_position"]))


def test_multirun_flag_may_sit_between_overrides():
    argv = ["fairaudit", "probe=position", "dataset=mmlu", "-m", "arm=direct,cot", "dataset.n=8"]
    assert hoist_multirun_flag(argv) == ["fairaudit", "-m", "probe=position", "dataset=mmlu", "arm=direct,cot",
                                         "dataset.n=8"]
    assert hoist_multirun_flag(["fairaudit", "--cfg", "job", "arm=cot"]) == ["fairaudit", "--cfg", "job", "arm=cot"]


def test_missing_arc_path_is_one_line_from_the_cli(tmp_path):
    proc = run_app(tmp_path, "probe=position", "dataset=arc", "arm=direct", "model=tiny_qwen3", timeout=120)
    assert proc.returncode == 2
    assert "dataset 'arc' needs dataset.path=<file>" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "mlflow.db").exists()  # nothing logged: it failed before the run opened


# --- end to end -------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_gguf_model_that_cannot_be_fetched_is_one_line(tmp_path):
    """Q4_K_M configs fetch one GGUF file from the hub; offline and absent from the cache, that is one error line
    (under backend=hf, which converts it; tests/llamacpp covers the default, backend=llamacpp)."""
    result = run_app(tmp_path, "model=r1_distill_qwen_7b_q4km", "backend=hf", "probe=position", "dataset=mmlu",
                     "arm=reason", env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    assert result.returncode == 2, result.stderr
    assert ("error: cannot get 'DeepSeek-R1-Distill-Qwen-7B-Q4_K_M.gguf' "
            "from 'bartowski/DeepSeek-R1-Distill-Qwen-7B-GGUF'" in result.stderr)


def test_position_sweep_end_to_end(tmp_path):
    """Three arms on two MMLU questions with the tiny Qwen3 (junk outputs: we check the plumbing, not the values)."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    # the command shape: overrides on both sides of -m
    proc = run_app(tmp_path, "probe=position", "dataset=mmlu", "model=tiny_qwen3", "-m", "arm=direct,cot,reason",
                   "dataset.n=2", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("fairaudit")
    runs = client.search_runs([experiment.experiment_id], "tags.`fairaudit.kind` = 'job'")
    assert sorted(run.data.tags["arm"] for run in runs) == ["cot", "direct", "reason"]
    parents = {run.data.tags.get("mlflow.parentRunId") for run in runs}
    assert len(parents) == 1 and None not in parents  # children of one sweep run
    for run in runs:
        arm = run.data.tags["arm"]
        assert (run.info.status == "FINISHED" and run.data.tags["dataset"] == "mmlu"
                and run.data.tags["probe"] == "position")
        metrics = run.data.metrics
        assert metrics[f"n_records_{arm}"] == 8 and 0.0 <= metrics[f"extraction_rate_{arm}"] <= 1.0
        assert metrics["model_calls"] >= 8
        artifacts = {a.path for folder in ("records", "tables", "figures")
                     for a in client.list_artifacts(run.info.run_id, folder)}
        assert {"records/records.parquet", "tables/position_summary.parquet", "tables/per_question.parquet",
                "tables/pbs_by_length.parquet", "figures/pbs_by_length.png"} <= artifacts
        logged = json.loads(Path(client.download_artifacts(run.info.run_id, "metrics.json",
                                                           str(tmp_path / arm))).read_text())
        assert {f"pbs_{arm}", f"accuracy_{arm}", f"ccp_{arm}"} <= logged.keys()
        records = pd.read_parquet(client.download_artifacts(run.info.run_id, "records/records.parquet",
                                                            str(tmp_path / arm)))
        assert len(records) == 8 and set(records["permutation"]) == {0, 1, 2, 3}
        if arm != "direct":
            assert f"trunc_n_continuations_{arm}" in logged
            assert {"tables/truncation_by_position.parquet", "figures/truncation.png"} <= artifacts
