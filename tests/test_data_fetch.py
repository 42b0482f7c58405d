"""`fairaudit data fetch|check` against a loopback HTTP server standing in for UCI, ProPublica and the hub."""

from __future__ import annotations

import functools
import http.server
import json
import shutil
import threading
from pathlib import Path

import pandas as pd
import pytest

from fairaudit.cli import main as cli
from fairaudit.data.files import CHECKSUMS, sha256_of
from fairaudit.data.mcq import MCQDataset, read_rows, split_lettered_options
from fairaudit.data.tabular import load_credit
from fairaudit.errors import AuditError


def hub_parquet(lettered: Path, out: Path, layout: str) -> None:
    """The shared lettered JSONL as the hub lays it out: OpenBookQA's labelled choices or MMLU's choice list."""
    rows = []
    for row in read_rows(lettered):
        options, gold = split_lettered_options(row["options"]), "ABCD".index(row["answer"][0])
        if layout == "labelled":
            rows.append({"id": str(len(rows)), "question_stem": row["question"],
                         "choices": {"text": options, "label": list("ABCD")}, "answerKey": "ABCD"[gold]})
        else:
            rows.append({"question": row["question"], "subject": "x", "choices": options, "answer": gold})
    out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(out)


def credit_spreadsheet(csv: Path, out: Path) -> None:
    """The credit data as UCI lays out its spreadsheet: a row of X1..X23, Y codes above the variable names.

    Written as .xlsx (pandas writes no .xls); pandas reads either by content, so the fetch path is the same.
    """
    frame = pd.read_csv(csv).round().astype("int64")
    with pd.ExcelWriter(out, engine="openpyxl") as writer:
        codes = ["", *(f"X{i}" for i in range(1, 24)), "Y"]
        pd.DataFrame([codes, list(frame.columns)]).to_excel(writer, index=False, header=False)
        frame.to_excel(writer, index=False, header=False, startrow=2)


@pytest.fixture(scope="module")
def mirror(tmp_path_factory, data_root):
    """(site folder, source URLs) of a loopback server: faithful copies, one corrupt file (adult.test), MCQ parquet
    on the hub path, no ARC (404)."""
    site = tmp_path_factory.mktemp("site")
    (site / "uci" / "adult").mkdir(parents=True)
    shutil.copy(data_root / "adult" / "adult.data", site / "uci" / "adult" / "adult.data")
    (site / "uci" / "adult" / "adult.test").write_bytes((data_root / "adult" / "adult.test").read_bytes()[:-100])
    (site / "propublica").mkdir()
    shutil.copy(data_root / "compas" / "compas-scores-two-years.csv", site / "propublica")
    hub = site / "hf" / "datasets"
    hub_parquet(data_root / "openbookqa" / "test.jsonl",
                hub / "allenai" / "openbookqa" / "resolve" / "main" / "main" / "test-00000-of-00001.parquet",
                "labelled")
    hub_parquet(data_root / "mmlu" / "test.jsonl",
                hub / "cais" / "mmlu" / "resolve" / "main" / "all" / "test-00000-of-00001.parquet", "choice list")
    handler = functools.partial(QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    yield site, {"FAIRAUDIT_UCI_URL": f"{base}/uci", "FAIRAUDIT_PROPUBLICA_URL": f"{base}/propublica",
                 "HF_ENDPOINT": f"{base}/hf"}
    server.shutdown()
    server.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def fetched(tmp_path, mirror, monkeypatch):
    for name, url in mirror[1].items():
        monkeypatch.setenv(name, url)
    return tmp_path / "data"


def test_fetch_writes_verified_files_and_refuses_a_corrupt_one(fetched, capsys):
    assert cli.main(["data", "fetch", "adult", "compas", "--root", str(fetched)]) == 1
    err = capsys.readouterr().err
    assert sha256_of(fetched / "adult" / "adult.data") == CHECKSUMS["adult/adult.data"]
    assert (sha256_of(fetched / "compas" / "compas-scores-two-years.csv")
            == CHECKSUMS["compas/compas-scores-two-years.csv"])
    assert not (fetched / "adult" / "adult.test").exists()  # the corrupt download was not written
    (line,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert ("adult/adult.test would have sha256" in line and CHECKSUMS["adult/adult.test"] in line
            and "not written" in line)


def test_hub_parquet_converts_to_the_published_openbookqa_file(fetched):
    assert cli.main(["data", "fetch", "openbookqa", "--root", str(fetched)]) == 0
    assert sha256_of(fetched / "openbookqa" / "test.jsonl") == CHECKSUMS["openbookqa/test.jsonl"]
    assert not (fetched / "FETCHED.json").exists()  # a published checksum needs no record


def test_mmlu_without_a_published_checksum_is_recorded_and_then_enforced(fetched):
    assert cli.main(["data", "fetch", "mmlu", "--root", str(fetched)]) == 0
    record = json.loads((fetched / "FETCHED.json").read_text())["mmlu/test.jsonl"]
    assert record["sha256"] == sha256_of(fetched / "mmlu" / "test.jsonl") and "/cais/mmlu/" in record["source"]
    dataset = MCQDataset(name="mmlu", n=3, seed=0, path="mmlu/test.jsonl", root=str(fetched))
    dataset.check()
    assert len(dataset.variants()) == 12
    tampered = fetched.parent / "tampered"
    shutil.copytree(fetched, tampered)
    (tampered / "mmlu" / "test.jsonl").write_text('{"question": "q", "options": "A. a\\nB. b\\nC. c\\nD. d", '
                                                  '"answer": "A. a"}')
    with pytest.raises(AuditError, match="is corrupt: .*fairaudit data fetch mmlu"):
        MCQDataset(name="mmlu", n=1, seed=0, path="mmlu/test.jsonl", root=str(tampered)).check()


@pytest.mark.slow
@pytest.mark.long  # writing 30,000 spreadsheet rows takes a while
def test_credit_spreadsheet_converts_to_the_rows_of_the_published_csv(mirror, fetched, data_root):
    (mirror[0] / "uci" / "00350").mkdir()
    credit_spreadsheet(data_root / "credit" / "default_of_credit_card_clients.csv",
                       mirror[0] / "uci" / "00350" / "default of credit card clients.xls")
    assert cli.main(["data", "fetch", "credit", "--root", str(fetched)]) == 0
    assert "credit/default_of_credit_card_clients.csv" in json.loads((fetched / "FETCHED.json").read_text())
    pd.testing.assert_frame_equal(load_credit(fetched), load_credit(data_root))


def test_a_404_is_one_error_line(fetched, capsys):
    assert cli.main(["data", "fetch", "arc", "--root", str(fetched)]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: arc: http://127.0.0.1:") and line.endswith("HTTP 404 File not found")


def test_check_says_per_file_present_checksum_and_source(fetched, capsys):
    cli.main(["data", "fetch", "compas", "--root", str(fetched)])
    (fetched / "adult").mkdir(parents=True)
    (fetched / "adult" / "adult.data").write_text("not adult\n")
    capsys.readouterr()
    assert cli.main(["data", "check", "adult", "compas", "--root", str(fetched)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"data root {fetched.resolve()}"
    status = {line.split()[0]: line.split()[1:] for line in lines[1:]}
    assert status["adult/adult.data"][0] == "corrupt" and status["adult/adult.test"][0] == "missing"
    assert status["compas/compas-scores-two-years.csv"][0] == "ok"
    assert status["compas/compas-scores-two-years.csv"][1].endswith("/propublica/compas-scores-two-years.csv")


def test_unknown_name_is_refused(fetched, capsys):
    with pytest.raises(SystemExit):
        cli.main(["data", "fetch", "imagenet"])
    assert "unknown data set(s) ['imagenet']" in capsys.readouterr().err


def test_check_exits_0_when_every_set_is_verified_or_documented_as_not_shipped(data_root, capsys):
    """The shipped copy lacks arc and gpqa, which are documented as not shipped: 0. Named and absent: 1."""
    assert cli.main(["data", "check", "--root", str(data_root)]) == 0
    out = capsys.readouterr().out.splitlines()
    status = {line.split()[0]: line.split()[1] for line in out[1:] if not line.startswith("note: ")}
    assert status["arc/test.jsonl"] == "not" and status["adult/adult.data"] == "ok"  # "not shipped"
    assert status["mmlu/test.jsonl"] == "ok," and out[-1] == (  # "ok, subset", then what it is a subset of
        "note: mmlu/test.jsonl is the project's test copy, a subset: 2,850 of the 14,042 questions of the MMLU test "
        "split; `fairaudit data fetch mmlu` replaces it with the whole file from its source")
    assert cli.main(["data", "check", "arc", "--root", str(data_root)]) == 1
    assert "`fairaudit data fetch --missing arc` gets them" in capsys.readouterr().err


def test_check_of_an_empty_root_exits_1_and_says_both_ways_out(tmp_path, capsys):
    assert cli.main(["data", "check", "--root", str(tmp_path)]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "`fairaudit data fetch --missing` gets them" in line and "FAIRAUDIT_DATA or data.root" in line


def test_fetch_missing_fetches_only_what_is_absent(fetched, capsys):
    assert cli.main(["data", "fetch", "compas", "--root", str(fetched)]) == 0
    capsys.readouterr()
    assert cli.main(["data", "fetch", "--missing", "compas", "--root", str(fetched)]) == 0
    assert capsys.readouterr().err == ""  # present and verified: nothing fetched
