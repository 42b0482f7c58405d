"""`fairaudit data fetch|check`: get the data sets from their canonical sources into the data root, and verify them.

Each data set lists the files its loader reads, where each comes from and how it is converted
(credit's .xls to CSV; hub MCQ parquet to the loader's lettered JSONL). Source hosts can be
redirected, e.g. to a mirror: FAIRAUDIT_UCI_URL, FAIRAUDIT_PROPUBLICA_URL, FAIRAUDIT_BBQ_URL and HF_ENDPOINT.
A file with a published checksum (files.CHECKSUMS) must match it, and one with a published git blob id
(files.GIT_BLOBS: BBQ's categories) must match that. Where there is none, or it
is of a different rendering of the source (MMLU: a subset; credit: a spreadsheet export), fetch
records the file's sha256 and source in the data root's FETCHED.json manifest, which the loaders
and `data check` then hold the file to.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import pandas as pd

from fairaudit.data.bbq import CATEGORIES, category_file
from fairaudit.data.files import CHECKSUMS, GIT_BLOBS, MANIFEST, accepted_checksums, data_root, git_blob_id, sha256_of
from fairaudit.data.mcq import format_options, parse_questions
from fairaudit.errors import OneLineParser
from fairaudit.prompts.mcq import LETTERS

UCI = ("FAIRAUDIT_UCI_URL", "https://archive.ics.uci.edu/ml/machine-learning-databases")
PROPUBLICA = ("FAIRAUDIT_PROPUBLICA_URL", "https://raw.githubusercontent.com/propublica/compas-analysis/master")
HUB = ("HF_ENDPOINT", "https://huggingface.co")
BBQ = ("FAIRAUDIT_BBQ_URL", "https://raw.githubusercontent.com/nyu-mll/BBQ/main")


def base_url(host: tuple[str, str]) -> str:
    """A source host's base URL, unless its environment variable redirects it."""
    return os.environ.get(host[0], host[1]).rstrip("/")


def as_is(raw: bytes) -> bytes:
    return raw


def credit_csv(raw: bytes) -> bytes:
    """UCI's .xls (a row of X1..X23 codes above the variable names) as a CSV with the variable names as header
    (CRLF line ends, like the published copy)."""
    frame = pd.read_excel(io.BytesIO(raw), header=1)  # reading .xls needs the xlrd package (the `data` extra)
    return frame.to_csv(index=False, lineterminator="\r\n").encode()


def lettered_jsonl(raw: bytes) -> bytes:
    """A hub MCQ split (parquet, any layout the loader knows) as lettered JSONL: question, options, answer."""
    rows = pd.read_parquet(io.BytesIO(raw)).to_dict("records")
    items = parse_questions([{k: _plain(v) for k, v in row.items()} for row in rows], "hub parquet")
    lines = [json.dumps({"question": item.question, "options": format_options(item.options),
                         "answer": f"{LETTERS[item.gold_index]}. {item.options[item.gold_index]}"})
             for item in items.itertuples(index=False)]
    return "\n".join(lines).encode()


def _plain(value):
    """parquet's numpy arrays (choices lists and dicts of lists) as plain Python lists."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class Download:
    """One file a loader reads: where it is fetched from and how the raw bytes become it."""

    target: str  # relative to the data root
    host: tuple[str, str]
    path: str  # under the host's base URL
    convert: Callable[[bytes], bytes] = as_is
    token: bool = False  # send HF_TOKEN (gated hub data sets)
    published: bool = True  # False: the published checksum is of a CI subset, not of what the source serves
    subset: str = ""  # what the copy with the published checksum holds when it is a subset of the source

    def url(self) -> str:
        return f"{base_url(self.host)}/{self.path}"


def hub(repo: str, file: str) -> str:
    return f"datasets/{repo}/resolve/main/{file}"


DATASETS: dict[str, tuple[Download, ...]] = {
    "adult": (Download("adult/adult.data", UCI, "adult/adult.data"),
              Download("adult/adult.test", UCI, "adult/adult.test")),
    "compas": (Download("compas/compas-scores-two-years.csv", PROPUBLICA, "compas-scores-two-years.csv"),),
    "credit": (Download("credit/default_of_credit_card_clients.csv", UCI,
                        "00350/default%20of%20credit%20card%20clients.xls", credit_csv, published=False),),
    # published=False: the CI copy is a spreadsheet's CSV export that writes some amounts as 5.00E+05; the
    # loader reads both copies into the same rows, but not byte for byte the same file
    "mmlu": (Download("mmlu/test.jsonl", HUB, hub("cais/mmlu", "all/test-00000-of-00001.parquet"), lettered_jsonl,
                      published=False, subset="2,850 of the 14,042 questions of the MMLU test split"),),
    "openbookqa": (Download("openbookqa/test.jsonl", HUB, hub("allenai/openbookqa", "main/test-00000-of-00001.parquet"),
                            lettered_jsonl),),
    "arc": (Download("arc/test.jsonl", HUB, hub("allenai/ai2_arc", "ARC-Challenge/test-00000-of-00001.parquet"),
                     lettered_jsonl),),
    "gpqa": (Download("gpqa/gpqa_diamond.csv", HUB, hub("Idavidrein/gpqa", "gpqa_diamond.csv"), token=True),),
    "bbq": tuple(Download(category_file(c), BBQ, f"data/{c}.jsonl") for c in CATEGORIES),
}


class FetchError(Exception):
    """A download or conversion that failed; the message is one line for the user. `offline`: the host
    could not be reached at all (no network, a proxy, a firewall)."""

    def __init__(self, message: str, offline: bool = False):
        super().__init__(message)
        self.offline = offline


def download(item: Download) -> bytes:
    request = urllib.request.Request(item.url(), headers={"User-Agent": "fairaudit"})
    if item.token and os.environ.get("HF_TOKEN"):
        request.add_header("Authorization", f"Bearer {os.environ['HF_TOKEN']}")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.read()
    except urllib.error.HTTPError as err:
        hint = (" (a gated data set: accept its terms on the hub and set HF_TOKEN)"
                if item.token and err.code in (401, 403) else "")
        raise FetchError(f"{item.url()}: HTTP {err.code} {err.reason}{hint}") from None
    except (urllib.error.URLError, OSError) as err:
        raise FetchError(f"{item.url()}: {getattr(err, 'reason', err)}", offline=True) from None


def fetch(item: Download, root: Path) -> str:
    """Download, convert, verify and write one file; returns its sha256. The file is replaced only once it verifies."""
    try:
        data = item.convert(download(item))
    except FetchError:
        raise
    except Exception as err:  # a converter meets whatever the source serves
        raise FetchError(f"{item.url()}: cannot convert to {item.target}: {err.__class__.__name__}: {err}") from None
    digest = hashlib.sha256(data).hexdigest()
    blob = GIT_BLOBS.get(item.target)
    if blob and git_blob_id(data) != blob:
        raise FetchError(f"{item.url()}: {item.target} would have git blob id {git_blob_id(data)}, expected {blob}; "
                         "not written")
    expected = CHECKSUMS.get(item.target) if item.published else None
    if expected and digest != expected:
        raise FetchError(f"{item.url()}: {item.target} would have sha256 {digest}, expected {expected}; not written")
    path = root / item.target
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".part")
    partial.write_bytes(data)
    partial.replace(path)
    if not expected:
        record_fetch(root, item, digest)
    return digest


def record_fetch(root: Path, item: Download, digest: str) -> None:
    """Note a file without a published checksum in FETCHED.json: its sha256, source and date."""
    manifest = root / MANIFEST
    entries = json.loads(manifest.read_text()) if manifest.exists() else {}
    entries[item.target] = {"sha256": digest, "source": item.url(),
                            "fetched": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    manifest.write_text(json.dumps(entries, indent=2, sort_keys=True) + "\n")


def file_status(root: Path, item: Download) -> str:
    """One word for a file: ok, missing or corrupt (against its published or recorded checksum), or unverified."""
    path = root / item.target
    if not path.is_file():
        return "missing"
    accepted = accepted_checksums(root, item.target)
    if not accepted:
        return "unverified"
    return "ok" if sha256_of(path) in accepted else "corrupt"


def offline_hint(root: Path) -> str:
    """The way out without a network."""
    return (f"offline, copy the files into {root} (the layout `fairaudit data check` lists) or point FAIRAUDIT_DATA "
            "or data.root at a folder that has them (docs/data.md)")


def fetch_command(names: list[str], root: Path, missing_only: bool = False) -> int:
    """Fetch every file of `names` (with `missing_only`, those not already present and verified)."""
    failures, unreachable = 0, 0
    for name in names:
        for item in DATASETS[name]:
            if missing_only and file_status(root, item) in ("ok", "unverified"):
                continue
            try:
                digest = fetch(item, root)
            except FetchError as err:
                failures, unreachable = failures + 1, unreachable + err.offline
                print(f"error: {name}: {err}", file=sys.stderr)
            else:
                print(f"{item.target}  sha256 {digest[:12]}  from {item.url()}", file=sys.stderr)
    if unreachable:
        print(f"{unreachable} file(s) could not be reached; {offline_hint(root)}", file=sys.stderr)
    return 1 if failures else 0


def shipped(item: Download) -> bool:
    """A file of the shipped copy (it has a published checksum); ARC, GPQA and five BBQ categories are not shipped."""
    return item.target in CHECKSUMS


def check_command(names: list[str], root: Path, named: bool = True) -> int:
    """One line per file: ok, ok, subset (the project's test copy of part of the source, said of what below the
    table), missing, corrupt, unverified (present, no checksum known) or not shipped (absent, and documented as
    a set the user supplies). Exit 1 on a corrupt file or a missing one of a shipped or
    named set, else 0."""
    rows, subsets = [], []
    for name in names:
        for item in DATASETS[name]:
            status = file_status(root, item)
            if status == "missing" and not named and not shipped(item):
                status = "not shipped"
            if status == "ok" and item.subset and sha256_of(root / item.target) == CHECKSUMS.get(item.target):
                status = "ok, subset"
                subsets.append(f"note: {item.target} is the project's test copy, a subset: {item.subset}; "
                               f"`fairaudit data fetch {name}` replaces it with the whole file from its source")
            rows.append((item.target, status, item.url()))
    width = max(len(target) for target, _, _ in rows)
    print(f"data root {root}")
    for target, status, url in rows:
        print(f"{target:<{width}}  {status:<11}  {url}")
    for line in subsets:
        print(line)
    bad = [target for target, status, _ in rows if status in ("missing", "corrupt")]
    if bad:
        fetch = " ".join(["fairaudit data fetch --missing", *(names if named else [])])
        print(f"{len(bad)} file(s) missing or corrupt: `{fetch}` gets them; {offline_hint(root)}", file=sys.stderr)
    return 1 if bad else 0


def parser() -> argparse.ArgumentParser:
    """The command line of `fairaudit data` (also read by tab completion)."""
    parser = OneLineParser(prog="fairaudit data", description="Get and verify the data sets the loaders read.")
    parser.add_argument("action", choices=["fetch", "check"])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"data sets (default: all): {', '.join(DATASETS)}")
    parser.add_argument("--root", help="data root (default: $FAIRAUDIT_DATA, else ~/.cache/fairaudit/data)")
    parser.add_argument("--missing", action="store_true", help="fetch: only the files that are absent or corrupt")
    return parser


def main(argv: list[str]) -> int:
    """`fairaudit data {fetch,check} [NAMES...] [--root DIR] [--missing]`."""
    command = parser()
    args = command.parse_intermixed_args(argv)
    unknown = sorted(set(args.names) - set(DATASETS))
    if unknown:
        command.error(f"unknown data set(s) {unknown}; choices: {', '.join(DATASETS)}")
    names = args.names or list(DATASETS)
    root = data_root(args.root)
    if args.action == "fetch":
        return fetch_command(names, root, args.missing)
    return check_command(names, root, named=bool(args.names))
