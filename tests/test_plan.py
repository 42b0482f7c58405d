"""`fairaudit plan`: its counts are a run's (the calls it says a run makes are the calls the run then makes), what the
store holds is served, its tests' power is analysis.power's at the family's level, a pilot runs end to end on the
embedded model, and bad input is one line before anything loads."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from conftest import DATA_ROOT, run_app
from fairaudit.analysis import power
from fairaudit.analysis.cost import accelerator_seconds, format_duration
from fairaudit.plan.speeds import machine
from fairaudit.store.results import Store

TINY = ["model=tiny_qwen3", "dataset.n=6"]


def plan(tmp_path, capsys, *overrides: str, csv: str = "plan.csv") -> tuple[int, str, str]:
    """`fairaudit plan` in this process (its command line checked as the console script checks it), the store and
    tracking database under tmp_path, its CSV there: (exit code, stdout, stderr)."""
    from fairaudit.cli.main import main

    capsys.readouterr()
    code = main(["plan", f"store.url={tmp_path}/store.sqlite", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
                 f"data.root={DATA_ROOT}", f"plan.csv={tmp_path / csv}", *overrides])
    out, err = capsys.readouterr()
    return code, out, err


def planned(tmp_path, capsys, *overrides: str, csv: str = "plan.csv") -> pd.DataFrame:
    code, _, err = plan(tmp_path, capsys, *overrides, csv=csv)
    assert code == 0, err[-3000:]
    return pd.read_csv(tmp_path / csv)


def run_calls(tmp_path, *overrides: str) -> int:
    """The model calls a real run of the job made (its printed model_calls)."""
    done = run_app(tmp_path, *overrides)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if "model_calls" in line)
    return int(line.strip("│ ").split("│")[-1].strip().split()[0])


def test_a_plan_counts_the_calls_a_run_makes_and_then_finds_them_stored(tmp_path, capsys):
    job = ["model=tiny_qwen3", "probe=cdpg", "dataset.n=5", "probe.K=2", "probe.k_list=[2]", "probe.n_boot=100"]
    before = planned(tmp_path, capsys, *job, csv="before.csv")  # generations, answer reads, reads along traces
    assert len(before) == 1 and before["stored_share"][0] == 0.0 and before["units"][0] == 5
    made = run_calls(tmp_path, *job)
    assert before["new_calls"][0] == made > 0 and before["depth_reads"][0] > 0
    after = planned(tmp_path, capsys, *job, csv="after.csv")
    assert after["stored_share"][0] == 1.0 and after["new_calls"][0] == 0 and after["generated_tokens"][0] == 0
    assert after["calls"][0] == before["calls"][0]  # the same calls asked, now all served


def test_a_plan_after_a_run_never_fails_on_what_the_store_holds(tmp_path, capsys):
    """A counterfactual run stores the model's think traces and P(Yes); cdpg's rehearsal reads them beside its
    stand-in's depth reads, which its own check (|CDPG_K| = D_disp) refuses: the plan counts on the stand-in alone."""
    assert run_app(tmp_path, "model=tiny_qwen3", "dataset.n=2").returncode == 0
    code, out, err = plan(tmp_path, capsys, "model=tiny_qwen3", "dataset.n=2", "probe=cdpg")
    assert code == 0, err[-3000:]
    said = " ".join(out.split())
    assert "counted as if nothing were stored, since the probe's checks refused" in said and "|CDPG_K|" in said
    frame = pd.read_csv(tmp_path / "plan.csv")
    assert frame["stored_share"][0] == 0.0 and frame["new_calls"][0] > 0


@pytest.mark.slow
def test_prompt_tokens_are_the_dry_runs_prompts_rendered_and_tokenized(tmp_path, capsys):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from fairaudit import CONF_DIR
    from fairaudit.backends.common import encode_texts
    from fairaudit.job.config import Place, read_job
    from fairaudit.probes import AuditContext

    frame = planned(tmp_path, capsys, *TINY)
    GlobalHydra.instance().clear()
    with initialize_config_dir(CONF_DIR, version_base=None):
        cfg = compose("config", overrides=[*TINY, f"data.root={DATA_ROOT}", "dry_run=true"], return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    job = read_job(OmegaConf.masked_copy(cfg, [key for key in cfg if key != "hydra"]), Place({}, [], []), here=False)
    tokenizer = job.backend_class.load_tokenizer(job.source.folder(weights=False), job.backend_settings)
    prompts = job.probe.prompts(AuditContext(None, tokenizer, job.spec, job.dataset, job.arm))
    assert frame["prompts"][0] == len(prompts) == 6 * 2 * 2
    assert frame["prompt_tokens"][0] == sum(map(len, encode_texts(tokenizer, [p.text for p in prompts])))


@pytest.mark.slow
def test_a_grid_counts_shared_calls_once_and_sizes_mcnemar_at_the_familys_level(tmp_path, capsys):
    frame = planned(tmp_path, capsys, "model=tiny_qwen3", "dataset.n=4", "-m", "dataset=adult,compas",
                    "probe=counterfactual,btm", "plan.effect.c_b_ratio=3")
    by_job = frame.set_index("job")
    for dataset in ("adult", "compas"):  # btm asks what counterfactual asked: nothing new
        assert by_job.loc[f"dataset={dataset} probe=btm", "new_calls"] == 0
        assert by_job.loc[f"dataset={dataset} probe=counterfactual", "new_calls"] > 0
    _, out, _ = plan(tmp_path, capsys, "model=tiny_qwen3", "dataset.n=4", "-m", "dataset=adult,compas",
                     "probe=counterfactual", "plan.effect.c_b_ratio=3", "plan.csv=null")
    p_b, p_c = power.cells_at_ratio(0.1, 3.0)
    level = power.family_alpha(0.05, 2, "holm")  # two McNemar tests in the report's family: Holm's first step

    def holm(n: int) -> float:  # each as Holm decides it over the two (exact sum)
        return power.decided_power(lambda at: power.mcnemar_power(n, p_b, p_c, at), 1, 2, 0.05, "holm")[0]

    need = power.pairs_for_power(holm, 0.8, smallest=2)
    rows = [" ".join(line.split()) for line in out.splitlines() if "McNemar" in line]
    assert len(rows) == 2 and all(f"{level:.4g}" in row and f"{need}" in row for row in rows), rows
    assert holm(need) >= 0.8 > power.mcnemar_power(need, p_b, p_c, level)   # Holm's second step counts


@pytest.mark.slow
def test_a_pilot_runs_a_share_of_the_units_on_the_model_and_the_plan_uses_what_it_measured(tmp_path, capsys):
    frame = planned(tmp_path, capsys, *TINY, "plan.pilot=0.5")
    store = Store(tmp_path / "store.sqlite")
    try:
        assert store.count("generate") == 3 * 2 * 2  # half the six pairs, both sides, both arms
    finally:
        store.close()
    assert frame["stored_share"][0] == pytest.approx(0.5)
    assert frame["new_calls"][0] == frame["calls"][0] / 2
    assert frame["seconds_here"][0] > 0 and math.isfinite(frame["seconds_here"][0])
    assert frame["trace_tokens"][0] <= 24  # the tiny model's think budget; measured, not assumed


@pytest.mark.slow
def test_a_plan_without_a_pilot_is_timed_at_the_rates_an_earlier_pilot_saved(tmp_path, capsys):
    speeds = tmp_path / "speeds.json"
    piloted = planned(tmp_path, capsys, *TINY, "plan.pilot=0.5", f"plan.speeds={speeds}", csv="pilot.csv")
    (saved,) = json.loads(speeds.read_text())[machine()].values()  # one model under one backend
    assert set(saved["work"]) == {"generate", "choice_probs"} and all(v > 0 for v in saved["seconds"].values())
    code, out, _ = plan(tmp_path, capsys, *TINY, f"plan.speeds={speeds}", csv="later.csv")
    later = pd.read_csv(tmp_path / "later.csv")
    assert code == 0 and "at the rates a pilot of" in " ".join(out.split())
    # the same new work (the pilot's half is stored either way) at the same saved rates: the same time
    assert later["new_calls"][0] == piloted["new_calls"][0]
    assert later["seconds_here"][0] == pytest.approx(piloted["seconds_here"][0]) and later["seconds_here"][0] > 0
    elsewhere = planned(tmp_path, capsys, *TINY, f"plan.speeds={tmp_path / 'none.json'}", csv="elsewhere.csv")
    assert math.isnan(elsewhere["seconds_here"][0])  # no pilot saved there: n/a, never a guess


@pytest.mark.parametrize("override, says", [
    ("plan.sample=1", "plan.sample"),
    ("plan.correction=bonferroni", "plan.correction"),
    ("plan.pilot=2", "plan.pilot"),
    ("plan.effct.c_b_ratio=2", "plan.effect"),
    ("plan.effect.discordant=2", "plan.effect.discordant=2 must be a share in (0, 1]"),
    ("plan.effect.c_b_ratio=-1", "plan.effect.c_b_ratio=-1 must be a number > 0"),
    ("plan.effect.c_b_ratio=0", "plan.effect.c_b_ratio=0 must be a number > 0"),
])
def test_bad_plan_settings_are_one_line_before_anything_loads(tmp_path, capsys, override, says):
    code, _, err = plan(tmp_path, capsys, *TINY, override)
    assert code == 2, err[-2000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and says in errors[0], err[-2000:]
    assert not (tmp_path / "plan.csv").exists() and not (tmp_path / "store.sqlite").exists()


@pytest.mark.slow
def test_a_plan_writes_no_file_unasked_and_no_zero_time(tmp_path, capsys, monkeypatch):
    from fairaudit.cli.main import main

    monkeypatch.chdir(tmp_path)
    assert main(["plan", *TINY, f"store.url={tmp_path}/store.sqlite", f"data.root={DATA_ROOT}",
                 f"plan.speeds={tmp_path / 'none.json'}"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert not (tmp_path / "plan.csv").exists() and not (tmp_path / "store.sqlite").exists()
    assert "n/a: run a pilot" in out and "plan.pilot=0.05 runs a share" in out
    assert "0.0 s" not in out and "< 0.1 s" in out   # the tiny model's accelerator estimates


def test_plan_help_names_its_settings(capsys):
    from fairaudit.cli.main import main

    assert main(["plan", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: fairaudit plan") and "plan.pilot" in out and "plan.effect" in out


def test_accelerator_time_is_tokens_over_the_published_rates_scaled_by_weights():
    speeds = {"decode": 1000.0, "prefill": 10000.0, "reference_gb": 7.0}
    assert accelerator_seconds(20000, 3000, speeds, 14.0) == pytest.approx(2 * (3.0 + 2.0))
    assert format_duration(3 * 86400 + 5 * 3600 + 59) == "3 d 05 h"
    assert format_duration(3599.6) == "1 h 00 min" and format_duration(75) == "1 min 15 s"
    assert format_duration(math.nan) == "n/a" and format_duration(2.25) == "2.2 s"
    assert format_duration(0.004) == "< 0.1 s" and format_duration(0.0) == "0.0 s"


def test_correlation_power_meets_cohens_table():
    # Cohen (1988) Table 3.4.1: r = 0.3 needs 85 units, r = 0.1 needs 783, at alpha 0.05 two-sided and 80% power
    assert power.correlation_units_for_power(0.3) == 85
    assert abs(power.correlation_units_for_power(0.1) - 783) <= 2
    assert power.correlation_power(85, 0.3) == pytest.approx(0.80, abs=0.01)
    assert power.correlation_power(3, 0.3) == 0.0 and power.correlation_units_for_power(0.0) is None


def test_paired_power_stays_a_number_far_in_the_tail():
    assert power.paired_gap_power(5000, 0.01, 0.05) == pytest.approx(1.0)
    assert power.paired_gap_power(5000, -0.01, 0.05) == pytest.approx(1.0)


@pytest.mark.long
@pytest.mark.parametrize("study, jobs, tests", [
    (["+experiment=thinking_fairness"], 27, 27),            # 9 x (McNemar, gap) + 9 cdpg slopes; btm has none
    (["+experiment=position_bias", "+experiment/position_bias/bench=mmlu"], 6, 6),  # ARC, GPQA are not shipped
    (["+experiment=private_channel"], 5, 10),                # two graphs' influence intervals per seed
])
def test_each_papers_study_plans_without_weights(tmp_path, capsys, study, jobs, tests):
    code, out, err = plan(tmp_path, capsys, *study)
    assert code == 0, err[-3000:]
    frame = pd.read_csv(tmp_path / "plan.csv")
    assert len(frame) == jobs and (frame["new_calls"] > 0).any() and (frame["generated_tokens"] > 0).any()
    assert frame[[c for c in frame if c.startswith("seconds_") and c != "seconds_here"]].notna().all().all()
    methods = ("│ exact", "│ t-test", "│ Fisher z")  # the tests table's last column
    power_rows = [line for line in out.splitlines() if any(method in line for method in methods)]
    assert len(power_rows) == tests, out[-3000:]


def test_the_cdpg_slope_is_sized_as_the_t_test_its_interval_is_over_cell_cs_binomial_count():
    """A pilot's t interval gives back the SD of its pair slopes exactly; the power averages the t-test's over the
    cell's count m ~ Binomial(pairs, share), the share a pilot's 12 of 80 pairs."""
    from fairaudit.analysis.stats import t_interval
    from fairaudit.probes import ProbeResult
    from fairaudit.probes.cdpg import CDPGProbe

    slopes = [0.4, -0.1, 0.3, 0.0, 0.9, 0.2, 0.1, 0.5, -0.2, 0.3, 0.6, 0.0]
    mean, sd, low, high = t_interval(slopes)
    pilot = ProbeResult(metrics={"cdpg_n_c": 12, "cdpg_n_pairs": 80, "cdpg_slope_c_ci_low": low,
                                 "cdpg_slope_c_ci_high": high, "cdpg_slope_c_ci_n": 12})
    effect = {"cdpg_slope": 0.1, "cdpg_slope_sd": 0.5, "discordant": 0.1, "c_b_ratio": 2.0}
    probe = CDPGProbe({"name": "nothink", "think": False, "max_new_tokens": 16})
    (test,) = probe.planned_tests(None, effect, pilot)
    assert test.method == "t-test (its t interval)" and f"SD {sd:.4g}" in test.effect
    assert test.power(80, 0.05) == pytest.approx(power.cell_gap_power(80, 12 / 80, 0.1, sd))
    (assumed,) = probe.planned_tests(None, effect)   # cell c's share at discordant 0.1 and c/b = 2: 1/15
    assert assumed.power(5000, 0.05) == pytest.approx(power.cell_gap_power(5000, 0.1 * 2 / 3, 0.1, 0.5))
