"""How far the two readings of P(Yes) differ on the embedded model: paper 000 §3.3's single Yes / No token
against pooled spellings.

    python benchmarks/p_yes_readings.py [--n 50] [--dataset adult] [--model smollm2] [--store PATH]

Generates the think and nothink arms once (through a temporary store) and reads P(Yes) at each
answer position under both readings; prints the per-row differences and what they do to the
forced answers and to the counterfactual metrics.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from fairaudit.analysis import contingency
from fairaudit.job.config import ModelSource, model_spec
from fairaudit.probes import AuditContext
from fairaudit.probes.decisions import paired_records
from fairaudit.prompts.yesno import Arm
from fairaudit.store.client import CachingClient
from fairaudit.store.results import Store

CONF = Path(__file__).resolve().parents[1] / "conf"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50)
    parser.add_argument("--dataset", default="adult")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--store", default=None, help="a store file to keep the generations in (default: temporary)")
    args = parser.parse_args()
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose("config", overrides=[f"model={args.model}", f"dataset={args.dataset}", f"dataset.n={args.n}"])
    dataset = instantiate(cfg.dataset)
    inner = ModelSource.composed(cfg).backend()
    arm = Arm(**OmegaConf.to_container(cfg.arm, resolve=True))
    baseline = Arm(**OmegaConf.to_container(cfg.probe.baseline_arm, resolve=True))
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(args.store or Path(tmp) / "store.sqlite"))
        backend = CachingClient(inner, store, chunk_size=cfg.model.batch_size)
        spec = model_spec(cfg.model)
        readings = {}
        for reading in ("single", "pooled"):
            ctx = AuditContext(backend, backend.tokenizer,
                               dataclasses.replace(spec, p_yes=reading, answer_source="forced"), dataset, arm)
            readings[reading] = paired_records(ctx, baseline)
    single, pooled = readings["single"], readings["pooled"]
    diff = (single["p_yes"] - pooled["p_yes"]).abs()
    rows = []
    for name, part in single.groupby("arm"):
        d = diff[part.index]
        rows.append({"arm": name, "rows": len(part), "mean_abs_diff": d.mean(), "median_abs_diff": d.median(),
                     "max_abs_diff": d.max(),
                     "pearson_r": np.corrcoef(part["p_yes"], pooled.loc[part.index, "p_yes"])[0, 1],
                     "forced_answer_changes": int((part["answer"] != pooled.loc[part.index, "answer"]).sum())})
    print(pd.DataFrame(rows).to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    names = ["cell_a", "cell_b", "cell_c", "cell_d", "d_disp_c_think", "d_disp_b_nothink", "d_cf_think", "d_cf_nothink"]
    metrics = {r: contingency(frame, arm.name, baseline.name, n_boot=0) for r, frame in readings.items()}
    print(pd.DataFrame({r: [m[k] for k in names] for r, m in metrics.items()}, index=names)
          .to_string(float_format=lambda v: f"{v:.4g}"))


if __name__ == "__main__":
    main()
