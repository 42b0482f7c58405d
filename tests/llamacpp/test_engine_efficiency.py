"""benchmarks/engine_efficiency.py at a tiny size (the tiny Qwen3, one pair, K = 2), in process, so it cannot rot
unseen: every stage of each column has an audit rate and a plain rate from the same run, and the table prints them."""

from __future__ import annotations

import argparse
import math

import pytest

from conftest import benchmark

pytestmark = [pytest.mark.llamacpp, pytest.mark.usefixtures("data_root")]


@pytest.fixture(scope="module")
def bench():
    return benchmark("engine_efficiency")


@pytest.fixture(scope="module")
def columns(bench):
    args = argparse.Namespace(pairs=1, K=2)
    return {"llamacpp fast": bench.column("llamacpp", ["model=tiny_qwen3"], args, "fast"),
            "hf": bench.column("hf", ["model=tiny_qwen3"], args)}


def test_every_stage_has_an_audit_and_a_plain_rate(bench, columns):
    for figures in columns.values():
        assert figures["generated"] > 0 and figures["reads"] == 2 * (1 + 2)  # 2 prompts: a choice read, K depth reads
        for side in ("audit", "plain"):
            assert set(figures[side]) == set(bench.STAGES)
            assert all(rate > 0 and math.isfinite(rate) for rate in figures[side].values())


def test_the_table_prints_each_stage_with_its_efficiency(bench, columns, capsys):
    bench.print_table(columns)
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| llamacpp fast |")]
    assert len(rows) == len(bench.STAGES)
    audit, plain = columns["llamacpp fast"]["audit"]["depth reads"], columns["llamacpp fast"]["plain"]["depth reads"]
    assert rows[-1].endswith(f"| {audit / plain:.2f} |")
