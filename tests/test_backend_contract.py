"""The backend contract holds before anything loads: a class without `generate` cannot be built, a constructor that
sets no `fingerprint` or `tokenizer` fails as it returns, and the app refuses such a class (or a missing engine) in
one line; a dry run needs no engine."""

from __future__ import annotations

import textwrap

import pytest

from conftest import ENGINE_BACKENDS, run_app
from fairaudit.backends import Backend, Capabilities
from fairaudit.errors import AuditError
from fairaudit.errors.contracts import require_complete


class NoGenerate(Backend):
    name = "nogenerate"
    capabilities = Capabilities(scores=False, depth_reads=False)

    def __init__(self, model_dir=None, dtype="float32", batch_size=8):
        self.fingerprint, self.tokenizer = "nogenerate-1", None


class NoFingerprint(Backend):
    name = "nofingerprint"

    def __init__(self, model_dir=None, dtype="float32", batch_size=8):
        self.tokenizer = None

    def generate(self, requests):
        return []


ASKS = (r"a backend implements generate\(requests\) and the calls its capabilities promise, and its constructor "
        r"sets fingerprint and tokenizer \(docs/adding\.md\)$")


def test_a_backend_class_without_generate_cannot_be_built():
    """The same one line whether it is built or checked before anything loads (`require_complete`)."""
    line = r"^backend class test_backend_contract\.NoGenerate does not implement generate: " + ASKS
    with pytest.raises(AuditError, match=line):
        NoGenerate()
    with pytest.raises(AuditError, match=line):
        require_complete(NoGenerate)


def test_a_constructor_that_sets_no_fingerprint_fails_as_it_returns():
    with pytest.raises(AuditError, match=r"^backend class test_backend_contract\.NoFingerprint's constructor did not "
                                         r"set fingerprint: " + ASKS):
        NoFingerprint()
    require_complete(NoFingerprint)  # its methods are all there


def test_the_app_refuses_a_backend_class_without_generate_in_one_line_before_anything_loads(tmp_path):
    (tmp_path / "halfdone.py").write_text(textwrap.dedent('''
        from fairaudit.backends import Backend

        class HalfDone(Backend):
            name = "halfdone"

            def __init__(self, model_dir, dtype="float32", batch_size=8):
                raise AssertionError("built")
    '''))
    result = run_app(tmp_path, "backend._target_=halfdone.HalfDone", "model=tiny_qwen3", "dataset.n=1",
                     env={"PYTHONPATH": str(tmp_path)})
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == ["error: backend class halfdone.HalfDone does not implement generate: a backend implements "
                     "generate(requests) and the calls its capabilities promise, and its constructor sets fingerprint "
                     "and tokenizer (docs/adding.md)"], result.stderr[-2000:]
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "store.sqlite").exists()


def test_every_backend_on_an_optional_engine_has_its_tests_folder():
    """conftest.ENGINE_BACKENDS, found by the tests/<backend>/ folders, is every backend with `requires`."""
    from fairaudit.catalog.registry import backend_classes

    assert ENGINE_BACKENDS == {name: cls for name, cls in backend_classes().items() if cls.requires is not None}


def test_a_dry_run_needs_no_engine(tmp_path):
    """Each engine backend's dry run (one sweep) prints its prompts whether or not its engine is installed."""
    result = run_app(tmp_path, "dry_run=true", "model=tiny_qwen3", "dataset.n=1", "-m",
                     f"backend={','.join(sorted(ENGINE_BACKENDS))}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count("dry run: 4 prompts, no model loaded, nothing logged") == len(ENGINE_BACKENDS)
    assert "not installed" not in result.stderr and not (tmp_path / "mlflow.db").exists()
