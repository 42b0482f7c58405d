"""What a job's run holds, logged to the active MLflow run as it finishes: its resolved config and overrides, its
data set as an input, its metrics (finite ones as MLflow metrics, all in metrics.json), tables, figures and record
frames, its per-sample pages and its verdict; the artifact being written is kept (`writing`), so a full disk's line
can name it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from fairaudit.analysis.degenerate import WARNING
from fairaudit.analysis.undefined import reasons_by_text, why_undefined
from fairaudit.errors.disk import size_of
from fairaudit.errors.secrets import redact
from fairaudit.tracking.retries import logged_despite_a_race
from fairaudit.tracking.scratch import scratch
from fairaudit.tracking.tags import HEADLINE_TAG, MAX_TAG, NOTE_TAG, UNBOUNDED_TAG, UNDEFINED_TAG, WARNINGS_TAG


def finite_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """Metrics MLflow can store as numbers, as they are (a p of 2.2e-46 too); the rest (nan, inf, a p below the
    smallest double, which is NaN beside its `*_log10_p`) live in metrics.json."""
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)}


def unbounded_note(metrics: dict[str, Any]) -> str | None:
    """The note a run carries (tag UNBOUNDED_TAG) for metrics that are infinite, e.g. an interval unbounded above:
    MLflow stores finite numbers only, so they are absent from its metrics and null in metrics.json."""
    names = sorted(k for k, v in metrics.items() if isinstance(v, float) and math.isinf(v))
    if not names:
        return None
    return ", ".join(f"{k}={'+' if metrics[k] > 0 else '-'}inf" for k in names) + " (unbounded; not logged as metrics)"


def json_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """Metrics as strict JSON values: numbers, null for nan/inf (JSON has neither), strings for the rest."""
    def value(v: Any) -> Any:
        if isinstance(v, (int, float)):
            return v if math.isfinite(v) else None
        return str(v)
    return {k: value(v) for k, v in metrics.items()}


class RunContent:
    """The content of the active MLflow run of `mlflow` (the module), logged piece by piece or all at once."""

    def __init__(self, mlflow):
        self.mlflow = mlflow
        self.writing = ("", 0)  # the artifact being logged and its bytes, named when its disk fills

    def log_all(self, config: Mapping, overrides: list[str], dataset: tuple[str, str], result, samples,
                verdict: list[str], title: str, steps: Mapping[str, list[float]]) -> None:
        """Everything a finished job logs: its config and overrides, its data set as an input (`dataset`: its name and
        where it was read), the result's metrics, tables, figures and records (a `ProbeResult`), the per-sample pages
        of its records in the probe's layout (`samples`: a `SampleView`), its verdict, its headline, and metrics by
        step (`steps`)."""
        frame = result.records[samples.frame]
        self.log_config(config, overrides)
        self.log_dataset(frame, *dataset)
        self.log_result(result.metrics, result.tables, result.figures, result.records)
        for name, values in steps.items():
            self.log_steps(name, values)
        self.log_samples(frame, samples.layout, title)
        self.log_verdict(verdict, result.metrics)  # verdict.txt, warnings.txt, the description and warning tags
        self.set_tags({HEADLINE_TAG: json.dumps(result.headline)})

    def log_config(self, settings: Mapping, overrides: list[str]) -> None:
        """The resolved config and the command-line overrides, so the run can be repeated exactly."""
        from omegaconf import OmegaConf

        config = OmegaConf.to_yaml(OmegaConf.create(redact(dict(settings))))
        self.writing = ("config/config.yaml", len(config.encode()))
        self.mlflow.log_text(config, "config/config.yaml")
        self.mlflow.log_text("\n".join(redact(list(overrides))) + "\n", "config/overrides.txt")

    def log_result(self, metrics: dict[str, float], tables: dict[str, pd.DataFrame], figures: dict[str, Any],
                   records: dict[str, pd.DataFrame]) -> None:
        """Metrics, tables (parquet + MLflow table), figures (PNG) and records (parquet)."""
        self.mlflow.log_metrics(finite_metrics(metrics))
        self.mlflow.log_dict(json_metrics(metrics), "metrics.json")
        note = unbounded_note(metrics)
        if note:
            self.mlflow.set_tag(UNBOUNDED_TAG, note[:MAX_TAG])
        with scratch() as tmp:  # one a killed job left is removed
            for name, table in tables.items():
                path = Path(tmp) / f"{name}.parquet"
                table.to_parquet(path)
                self.writing = (f"tables/{path.name}", path.stat().st_size)
                self.mlflow.log_artifact(str(path), "tables")
                self.mlflow.log_table(data=table.reset_index() if _has_named_index(table) else table,
                                      artifact_file=f"tables/{name}.json")
            for name, frame in records.items():
                path = Path(tmp) / f"{name}.parquet"
                frame.to_parquet(path)
                self.writing = (f"records/{path.name}", path.stat().st_size)
                self.mlflow.log_artifact(str(path), "records")
        for name, figure in figures.items():
            self.mlflow.log_figure(figure, f"figures/{name}.png")

    def log_steps(self, name: str, values: list[float]) -> None:
        """One metric's values as its steps 0, 1, ... (e.g. each worker's computed calls)."""
        for step, value in enumerate(values):
            self.mlflow.log_metric(name, value, step=step)

    def set_tags(self, tags: dict[str, str]) -> None:
        self.mlflow.set_tags(redact(tags, by_name=False))

    def log_dataset(self, frame: pd.DataFrame, name: str, source: str) -> None:
        """The job's data set as an MLflow input (the runs table's Dataset column): its sampled rows' digest,
        schema and size, named `name`, its source the file or data root it was read from."""
        import warnings

        import mlflow.data

        with warnings.catch_warnings():  # its schema inference (as it is built and logged) warns about integer
            warnings.simplefilter("ignore")  # columns, which records never null
            dataset = mlflow.data.from_pandas(frame, source=source, name=name)
            logged_despite_a_race(lambda: self.mlflow.log_input(dataset, context="audit"))

    def log_verdict(self, verdict: list[str], metrics: Mapping[str, Any]) -> None:
        """The verdict as verdict.txt and the run's description; its warnings (the lines that start `warning: `) as
        warnings.txt and the WARNINGS_TAG, so every table that shows this run's numbers can show them beside; why
        each undefined metric is n/a as the UNDEFINED_TAG (JSON: reason -> metrics)."""
        warnings = [line[len(WARNING):] for line in verdict if line.startswith(WARNING)]
        texts = {"verdict.txt": "\n".join(verdict) + "\n"}
        tags = {NOTE_TAG: "\n\n".join(verdict)[:MAX_TAG]}
        if warnings:
            texts["warnings.txt"] = "\n".join(warnings) + "\n"
            tags[WARNINGS_TAG] = "\n".join(warnings)[:MAX_TAG]
        undefined = reasons_by_text(why_undefined(metrics))
        if undefined:
            tags[UNDEFINED_TAG] = json.dumps(undefined)[:MAX_TAG]
        self.log_texts(texts)
        self.set_tags(tags)

    def log_texts(self, texts: dict[str, str]) -> None:
        """Text artifacts by file name (e.g. samples.html, samples.jsonl)."""
        for name, text in texts.items():
            self.mlflow.log_text(redact(text), name)

    def log_samples(self, records: pd.DataFrame, layout, title: str) -> None:
        """The per-sample pages and samples.jsonl of `records` in `layout` (a `fairaudit.views.pages.Layout`),
        written to a temporary folder a page at a time and logged as the run's top-level artifacts."""
        from fairaudit.tracking import samples

        with scratch() as tmp:  # one a killed job left is removed
            samples.write(records, layout, title, tmp)
            self.writing = ("the samples pages and samples.jsonl", size_of(tmp))
            self.mlflow.log_artifacts(str(tmp))


def _has_named_index(table: pd.DataFrame) -> bool:
    return any(name is not None for name in table.index.names)


