"""benchmarks/backends.py at a tiny size, in process, so it cannot rot unseen: the backend's own calls on main's API,
same-work mode (a second backend reads the first one's traces), and the table's figures and ratios."""

from __future__ import annotations

import pytest

from conftest import benchmark

pytestmark = pytest.mark.usefixtures("data_root")


@pytest.fixture(scope="module")
def bench():
    return benchmark("backends")


@pytest.fixture(scope="module")
def columns(bench):
    """hf generates and reads its own traces at temperature 1.0; a second column then reads those (same work) after
    generating greedily (other traces: its own generation is timed, the traces it reads are the first column's)."""
    cfg = bench.compose_config("hf", ["model=tiny_qwen3"], 1, 6)
    hf = bench.run_backend(cfg, K=2, temperature=1.0)
    shared = [bench.DepthRequest(*x) for x in hf["parts"]]
    return {"hf": hf, "second": bench.run_backend(cfg, K=2, temperature=0.0, shared=shared)}


@pytest.mark.slow
def test_each_phase_is_timed_and_counted(columns):
    hf = columns["hf"]
    assert hf["generations"] == 2 and 0 < hf["generated_tokens"] <= 12
    assert hf["depth_reads"] == 2 * 2  # K cuts per trace
    assert hf["prefill_tok_s"] == pytest.approx(hf["prompt_tokens"] / hf["prefill_s"])
    assert hf["all_s"] == pytest.approx(hf["generate_s"] + hf["choice_s"] + hf["depth_s"])
    assert hf["decode_tok_s"] == pytest.approx(hf["generated_tokens"] / (hf["generate_s"] - hf["prefill_s"]))


@pytest.mark.slow
def test_same_work_reads_the_first_backends_traces(columns):
    hf, mock = columns["hf"], columns["second"]
    assert mock["parts"] == hf["parts"] and mock["read_tokens"] == hf["read_tokens"]
    generation = mock["prefill_s"] + mock["read_tokens"] / mock["decode_tok_s"]
    assert mock["all_same_s"] == pytest.approx(generation + mock["choice_s"] + mock["depth_s"])
    assert mock["depth_share_same"] == pytest.approx(mock["depth_s"] / generation)


@pytest.mark.slow
def test_the_table_prints_every_figure_and_the_ratios_to_hf(bench, columns, capsys):
    bench.print_table(columns, "tiny")
    printed = capsys.readouterr().out
    assert all(key in printed for key in ("generate_tok_s", "decode_tok_s", "all_same_s", "depth_share_same"))
    (line,) = bench.ratio_lines(columns)
    hf, mock = columns["hf"], columns["second"]
    assert line.startswith("second / hf: ") and f"same work {hf['all_same_s'] / mock['all_same_s']:.2f}" in line
    assert f"decode_tok_s {mock['decode_tok_s'] / hf['decode_tok_s']:.2f}" in line


@pytest.mark.slow
def test_long_traces_run_to_their_budget(bench):
    figures = bench.run_backend(bench.compose_config("hf", ["model=tiny_qwen3"], 1, 6), K=2, temperature=0.0,
                                trace_tokens=16)
    assert figures["generated_tokens"] == 2 * 16
