"""Locating and verifying the raw data files under the data root."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from fairaudit.errors import AuditError

# sha256 of the canonical files (shared/data/README.md); a copy fetched from the source must match.
CHECKSUMS = {
    "adult/adult.data": "5b00264637dbfec36bdeaab5676b0b309ff9eb788d63554ca0a249491c86603d",
    "adult/adult.test": "a2a9044bc167a35b2361efbabec64e89d69ce82d9790d2980119aac5fd7e9c05",
    "compas/compas-scores-two-years.csv": "c451db85908b2f7fef1d83203bedf6b71ecda0d5af468d82ae62178f91d0cc7d",
    "credit/default_of_credit_card_clients.csv": "ecb457169da805ec7eb8389945c26af68baf2335d5db7c0e26d4b6cef5dd69eb",
    "mmlu/test.jsonl": "b35df20fe0f0d27fb86bb9f4da43d521a2b7781fd234d29cc6b23aeaee774bab",
    "openbookqa/test.jsonl": "b4025dd80264c99aa34e08158bb9aff3c815ad0d38f258ceb0f1f13b3b5d9bc4",
}

SOURCES = {
    "adult": "UCI ML Repository, Adult (doi:10.24432/C5XW20)",
    "compas": "ProPublica compas-analysis repository (compas-scores-two-years.csv)",
    "credit": "UCI ML Repository, Default of Credit Card Clients (doi:10.24432/C55S3H), header renamed to the UCI variable names",
    "mmlu": "Hendrycks et al. 2021 MMLU test split, JSONL with question/options/answer",
    "openbookqa": "Mihaylov et al. 2018 OpenBookQA test split, JSONL with question/options/answer",
}

_verified: set[Path] = set()


def data_root(root: str | os.PathLike | None) -> Path:
    """The configured data root, else $FAIRAUDIT_DATA, else ~/.cache/fairaudit/data."""
    chosen = root or os.environ.get("FAIRAUDIT_DATA") or Path.home() / ".cache" / "fairaudit" / "data"
    return Path(chosen).expanduser().resolve()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verified_file(root: Path, relative: str) -> Path:
    """Path of a raw data file after checking it exists and matches its published checksum."""
    path = root / relative
    expected = CHECKSUMS.get(relative)
    where = SOURCES.get(relative.split("/")[0], "its canonical source")
    if not path.is_file():
        raise AuditError(f"data file {path} is missing (expected sha256 {expected}); get it from {where} and set data.root or FAIRAUDIT_DATA")
    if expected and path not in _verified:
        actual = _sha256(path)
        if actual != expected:
            raise AuditError(f"data file {path} is corrupt: sha256 {actual}, expected {expected}; get it again from {where}")
        _verified.add(path)
    return path
