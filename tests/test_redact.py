"""Secrets hidden by structure wherever a value can be shown: URLs (user-info, query and fragment parameters,
percent-encoding, unencoded passwords read both ways), settings named like credentials, configs whose names are
never touched, errors, log records, YAML files and the command line a resume line repeats."""

from __future__ import annotations

import logging
import sys

import pytest
from omegaconf import OmegaConf

from fairaudit.errors import AuditError, failure_line
from fairaudit.errors import secrets as redact
from fairaudit.errors.interrupt import command_line
from fairaudit.tracking.runs import config_key, flatten
from fairaudit.tracking.ui import where_lines


@pytest.fixture(autouse=True)
def forget():
    seen = set(redact._SEEN)
    yield
    redact._SEEN.clear()
    redact._SEEN.update(seen)


@pytest.mark.parametrize("url, shown", [
    ("postgresql+psycopg://audit:hunter2@db.lab:5432/store", "postgresql+psycopg://audit:***@db.lab:5432/store"),
    ("postgresql://audit:p%40ss%2Fw@db/x?sslmode=require", "postgresql://audit:***@db/x?sslmode=require"),
    ("http://admin:s3cret@mlflow.lab:5000/", "http://admin:***@mlflow.lab:5000/"),
    ("https://me:tok@host/path", "https://me:***@host/path"),
    ("postgresql://audit@db/store", "postgresql://audit@db/store"),
    ("sqlite:////home/me/mlflow.db", "sqlite:////home/me/mlflow.db"),
    ("/home/me/store.sqlite", "/home/me/store.sqlite"),
    # unencoded: SQLAlchemy reads the password up to the first @, urllib.parse up to the last @ before the path
    ("postgresql://audit:hu@nt@db:5/x", "postgresql://audit:***@db:5/x"),
    ("postgresql://audit:hu/nt@db:5/x", "postgresql://audit:***@db:5/x"),
    # credential-named query and fragment parameters, whatever their case or encoding
    ("postgresql://audit@db/x?password=think&sslmode=require&sslpassword=k3y",
     "postgresql://audit@db/x?password=***&sslmode=require&sslpassword=***"),
    ("https://host/v1?API_KEY=abc&q=1#access_token=zz", "https://host/v1?API_KEY=***&q=1#access_token=***"),
    ("http://h/x?pass%77ord=one&x-amz-signature=two", "http://h/x?pass%77ord=***&x-amz-signature=***"),
    ("http://127.0.0.1:5000/#/experiments/1/runs/ab?workflowType=machine_learning",
     "http://127.0.0.1:5000/#/experiments/1/runs/ab?workflowType=machine_learning"),
])
def test_a_url_is_shown_with_its_secrets_hidden_and_nothing_else_changed(url, shown):
    assert redact.redact(url) == shown


@pytest.mark.parametrize("text, shown", [
    ("store.url=postgresql://a:b@h/x,postgresql://a:c@h/y", "store.url=postgresql://a:***@h/x,postgresql://a:***@h/y"),
    ("store.url=postgresql://a:b@h/x,tracking.uri=postgresql://a:think@h/y",  # Hydra's override_dirname
     "store.url=postgresql://a:***@h/x,tracking.uri=postgresql://a:***@h/y"),
    ("Error executing job with overrides: ['store.url=postgresql://a:think@h/x', 'model=tiny_qwen3']",
     "Error executing job with overrides: ['store.url=postgresql://a:***@h/x', 'model=tiny_qwen3']"),
    (r"#0 : store.url=postgresql\://audit\:x@db", r"#0 : store.url=postgresql\://audit\:***@db"),  # Hydra's escapes
    ("#1 : +backend.api_key=sk-123 dataset.n=2", "#1 : +backend.api_key=*** dataset.n=2"),
    ("host=db password=abc dbname=x", "host=db password=*** dbname=x"),  # a libpq keyword string
    ("sslpassword: k3y", "sslpassword: ***"),
    ("backend.thinking.style=native: think against nothink", "backend.thinking.style=native: think against nothink"),
])
def test_text_is_redacted_by_its_structure_alone(text, shown):
    assert redact.redact(text) == shown


def test_a_config_keeps_its_names_whatever_the_password():
    config = {"backend": {"thinking": {"style": "native"}, "api_key": "sk-1", "api_key_env": "OPENAI_KEY"},
              "store": {"url": "postgresql://audit:think@db/x?token=think"}, "arm": {"name": "think"}}
    assert redact.redact(config) == {
        "backend": {"thinking": {"style": "native"}, "api_key": "***", "api_key_env": "OPENAI_KEY"},
        "store": {"url": "postgresql://audit:***@db/x?token=***"}, "arm": {"name": "think"}}
    assert list(redact.redact(flatten(config))) == list(flatten(config))  # param names as they are
    tags = {"fairaudit.key": "0123", "fairaudit.overrides": '["store.url=postgresql://a:think@db/x"]'}
    assert redact.redact(tags, by_name=False) == {"fairaudit.key": "0123",
                                                  "fairaudit.overrides": '["store.url=postgresql://a:***@db/x"]'}


def test_a_strong_password_seen_is_hidden_anywhere_a_word_never():
    redact.remember(["store.url=postgresql+psycopg://audit:p%40ss%2Fw0rd@db/store", "dataset.n=3",
                     "tracking.uri=postgresql://audit:think@db/t", "+backend.token=s3cret-t0ken"])
    assert redact._SEEN == {"p%40ss%2Fw0rd", "p@ss/w0rd", "s3cret-t0ken"}
    assert redact.redact("FATAL: password p@ss/w0rd rejected; p%40ss%2Fw0rd; s3cret-t0ken") == \
        "FATAL: password *** rejected; ***; ***"
    assert redact.redact("think against nothink; xp@ss/w0rd") == "think against nothink; xp@ss/w0rd"


def test_a_configs_strings_and_credential_values_are_remembered():
    redact.remember_config(OmegaConf.create({"backend": {"api_key": "sk-abcdef12"}, "n": 3, "arm": "think"}))
    assert redact._SEEN == {"sk-abcdef12"}


def test_errors_and_their_lines_never_carry_the_password():
    redact.remember(["postgresql://audit:hunter22@db/x"])
    assert "hunter22" not in str(AuditError("cannot open postgresql://audit:hunter22@db/x"))
    assert failure_line(RuntimeError("auth failed for hunter22")) == "RuntimeError: auth failed for ***"


def test_log_records_are_redacted_as_they_are_made(caplog):
    redact.redact_logs()
    with caplog.at_level(logging.INFO):
        logging.getLogger("hydra").info("Launching %s", "store.url=postgresql://audit:think@db/x")
    assert caplog.messages == ["Launching store.url=postgresql://audit:***@db/x"]


def test_the_resume_line_repeats_the_command_with_its_secrets_hidden(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["fairaudit", "store.url=postgresql://audit:think@db/x?password=think",
                                      "backend.thinking.style=native", "+backend.api_key=sk 1"])
    assert command_line() == ("fairaudit 'store.url=postgresql://audit:***@db/x?password=***' "
                              "backend.thinking.style=native '+backend.api_key=***'")


def test_a_jobs_key_and_where_lines_do_not_depend_on_or_show_the_password():
    assert config_key({"store": "postgresql://a:one1@db/x"}) == config_key({"store": "postgresql://a:two2@db/x"})
    assert where_lines("http://me:s3cret@mlflow:5000", "1", "abc") == [
        "open: http://me:***@mlflow:5000/#/experiments/1/runs/abc?workflowType=machine_learning",
        "every job of the experiment, side by side: http://me:***@mlflow:5000/#/experiments/1/runs?"
        "workflowType=machine_learning&viewStateShareKey=fairaudit-jobs"]
    assert "s3cret" not in " ".join(where_lines("postgresql://me:s3cret@db/mlflow", "1"))


def test_a_yaml_file_is_rewritten_by_structure_only_when_it_holds_a_secret(tmp_path):
    clean, dirty = tmp_path / "clean.yaml", tmp_path / "dirty.yaml"
    clean.write_text("backend:\n  thinking:\n    style: native\n")
    dirty.write_text("- store.url=postgresql://audit:think@db/x\n- backend.thinking.style=native\n")
    before = clean.stat().st_mtime_ns
    for path in (clean, dirty):
        redact.redact_yaml_file(path)
    assert clean.stat().st_mtime_ns == before
    assert OmegaConf.to_container(OmegaConf.load(dirty)) == ["store.url=postgresql://audit:***@db/x",
                                                           "backend.thinking.style=native"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clean.yaml", "dirty.yaml"]
