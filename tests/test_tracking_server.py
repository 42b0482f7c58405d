"""An MLflow server that does not answer at start: one error line before any model loads, single run or sweep."""

from __future__ import annotations

import pytest

from tests.conftest import run_app
from tests.servers import free_port


@pytest.mark.parametrize("sweep", [[], ["-m", "dataset=adult,compas"]], ids=["run", "sweep"])
def test_server_down_at_start_is_one_line_before_any_model_loads(tmp_path, sweep):
    uri = f"http://127.0.0.1:{free_port()}"
    result = run_app(tmp_path, "model=tiny_qwen3", "dataset.n=2", "tracking=server", f"tracking.uri={uri}", *sweep,
                     in_tmp=True)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    port = uri.rsplit(":", 1)[1]
    assert lines == [f"error: tracking.uri={uri!r}: no tracking server answers at 127.0.0.1:{port} "
                     "(Connection refused)"]
    assert not (tmp_path / "store.sqlite").exists()  # the store is opened right before the model: never reached
