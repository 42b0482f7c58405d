"""The checks a sweep makes before its parent run opens, and the callbacks that make them: an error in a callback ends
the command (Hydra alone would warn and run the sweep on, without its checks or its parent run)."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from fairaudit.errors import AuditError
from fairaudit.job.preflight import GridJob, ends_the_command, resolved_part


def grid_job(config: dict) -> GridJob:
    return GridJob(0, [], "job 0", OmegaConf.create(config), {})


def test_a_resolved_part_reads_interpolations_from_outside_its_keys():
    job = grid_job({"model": {"max_context": 8192}, "backend": {"n_ctx": "${model.max_context}", "seed": 1},
                    "dry_run": False})
    assert json.loads(resolved_part(job, "backend", "dry_run")) == {"backend": {"n_ctx": 8192, "seed": 1},
                                                                   "dry_run": False}


def test_jobs_differing_outside_the_keys_share_a_part_unless_it_reads_them():
    small, large = ({"model": {"max_context": n, "path": "m"}, "backend": {"n_ctx": "${model.max_context}"}}
                    for n in (2048, 8192))
    assert resolved_part(grid_job(small), "backend") != resolved_part(grid_job(large), "backend")
    assert resolved_part(grid_job(small), "model.path") == resolved_part(grid_job(large), "model.path")


@pytest.mark.parametrize("raised, code, lines", [
    (KeyError("model.max_context"), 1, None),  # a bug: its traceback, then its line
    (AuditError("tracking.uri: no such folder"), 2, ["error: tracking.uri: no such folder"]),  # bad input: one line
], ids=["a bug", "bad input"])
def test_an_error_in_a_callback_hook_ends_the_command(capsys, raised, code, lines):
    @ends_the_command
    def hook(config):
        raise raised

    with pytest.raises(SystemExit) as stop:
        hook({})
    assert stop.value.code == code
    err = capsys.readouterr().err
    if lines is None:
        assert "Traceback" in err and err.rstrip().splitlines()[-1] == "error: KeyError: 'model.max_context'"
    else:
        assert err.splitlines() == lines and err.endswith("\n")


def test_a_hook_that_exits_or_returns_is_left_as_it_is():
    @ends_the_command
    def refuses(config):
        raise SystemExit(2)

    with pytest.raises(SystemExit) as stop:
        refuses({})
    assert stop.value.code == 2
    assert ends_the_command(lambda config: "opened")({}) == "opened"
