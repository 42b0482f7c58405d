"""Passwords hidden wherever a URL can be shown: URLs rendered, texts scrubbed, errors, log records and files."""

from __future__ import annotations

import logging

import pytest

from fairaudit.errors import AuditError, failure_line
from fairaudit.errors import secrets as redact
from fairaudit.tracking.runs import config_key
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
])
def test_a_url_is_shown_with_its_password_hidden_and_nothing_else_changed(url, shown):
    assert redact.hide_password(url) == shown


def test_a_remembered_password_is_hidden_anywhere_in_any_form():
    redact.remember(["store.url=postgresql+psycopg://audit:p%40ss%2Fw0rd@db/store", "dataset.n=3"])
    assert redact.scrub("FATAL: password p@ss/w0rd rejected; p%40ss%2Fw0rd") == "FATAL: password *** rejected; ***"
    # Hydra's log lines escape the colons
    assert redact.scrub(r"#0 : store.url=postgresql\://audit\:x@db") == r"#0 : store.url=postgresql\://audit\:***@db"


def test_a_short_password_is_hidden_in_urls_only():
    redact.remember(["http://me:ab@host"])
    assert redact.scrub("a table at http://me:ab@host") == "a table at http://me:***@host"


def test_errors_and_their_lines_never_carry_the_password():
    redact.remember(["postgresql://audit:hunter2@db/x"])
    assert "hunter2" not in str(AuditError("cannot open postgresql://audit:hunter2@db/x"))
    assert failure_line(RuntimeError("auth failed for hunter2")) == "RuntimeError: auth failed for ***"


def test_log_records_are_scrubbed_as_they_are_made(caplog):
    redact.remember(["postgresql://audit:hunter2@db/x"])
    redact.scrub_logs()
    with caplog.at_level(logging.INFO):
        logging.getLogger("hydra").info("Launching %s", "store.url=postgresql://audit:hunter2@db/x")
    assert caplog.messages == ["Launching store.url=postgresql://audit:***@db/x"]


def test_a_jobs_key_and_where_lines_do_not_depend_on_or_show_the_password():
    assert config_key({"store": "postgresql://a:one1@db/x"}) == config_key({"store": "postgresql://a:two2@db/x"})
    assert where_lines("http://me:s3cret@mlflow:5000", "1", "abc") == [
        "open: http://me:***@mlflow:5000/#/experiments/1/runs/abc?workflowType=machine_learning"]
    assert "s3cret" not in " ".join(where_lines("postgresql://me:s3cret@db/mlflow", "1"))


def test_a_file_is_rewritten_only_when_it_holds_a_password(tmp_path):
    redact.remember(["postgresql://audit:hunter2@db/x"])
    clean, dirty = tmp_path / "clean.yaml", tmp_path / "dirty.yaml"
    clean.write_text("a: 1\n")
    dirty.write_text("- store.url=postgresql://audit:hunter2@db/x\n")
    before = clean.stat().st_mtime_ns
    for path in (clean, dirty):
        redact.scrub_file(path)
    assert clean.stat().st_mtime_ns == before and dirty.read_text() == "- store.url=postgresql://audit:***@db/x\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clean.yaml", "dirty.yaml"]
