"""Locating and verifying the raw data files under the data root."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from fairaudit.errors import AuditError

# sha256 of the canonical files (the CI copy of the data, docs/data.md); a copy fetched from the source must match.
CHECKSUMS = {
    "adult/adult.data": "5b00264637dbfec36bdeaab5676b0b309ff9eb788d63554ca0a249491c86603d",
    "adult/adult.test": "a2a9044bc167a35b2361efbabec64e89d69ce82d9790d2980119aac5fd7e9c05",
    "compas/compas-scores-two-years.csv": "c451db85908b2f7fef1d83203bedf6b71ecda0d5af468d82ae62178f91d0cc7d",
    "credit/default_of_credit_card_clients.csv": "ecb457169da805ec7eb8389945c26af68baf2335d5db7c0e26d4b6cef5dd69eb",
    "mmlu/test.jsonl": "b35df20fe0f0d27fb86bb9f4da43d521a2b7781fd234d29cc6b23aeaee774bab",
    "openbookqa/test.jsonl": "b4025dd80264c99aa34e08158bb9aff3c815ad0d38f258ceb0f1f13b3b5d9bc4",
    "bbq/Age.jsonl": "46e805b3fc2d8cbd26eeb8e8430d98cf7b2dc9c83574ff3674e8ce4f0fca2a60",
    "bbq/Disability_status.jsonl": "375d40d9b71f056150264445ec189b13934998f3f49a1e311aa7578eb3b45e5f",
    "bbq/Nationality.jsonl": "a583e74666aec0341ded8aa3983e7cad694eb24de72c254d28b2df3035720090",
    "bbq/Physical_appearance.jsonl": "e48d7e13508565f4801574e611043470c25c95a0a62af3699cb5ee7cb02608fb",
    "bbq/Religion.jsonl": "cb9555f9f3454a52cd2df85956b59bd7fcca5aa922c8527693b1164d08417616",
    "bbq/Sexual_orientation.jsonl": "2c71036b9e7584fe589c42aef32c1a42bc01b9a5e9b1b8704342630cdb08cefd",
}

# git blob ids (sha1 of "blob <size>\0<content>", `git hash-object`) of BBQ's data files on the main branch of its
# repository: a fetch verifies the five categories the CI copy lacks against them (then records their sha256).
GIT_BLOBS = {
    "bbq/Age.jsonl": "5c5e7586163b869fe029e77e63716f2026e4ae08",
    "bbq/Disability_status.jsonl": "9aedeccaf599299cdfa523531d625ae85ecb9131",
    "bbq/Gender_identity.jsonl": "dc79ceaaa9e7126edc99a200d632899c50274b16",
    "bbq/Nationality.jsonl": "cba9b63d34536cb51a6cbae76b189df3d2a945c0",
    "bbq/Physical_appearance.jsonl": "8cbdf83265459083224e3a2d37809294ff12ad77",
    "bbq/Race_ethnicity.jsonl": "68daf3d692b27a10596772b3b15742b26f0b110e",
    "bbq/Race_x_SES.jsonl": "905cd8a5b8734e2063fe524e69a38f0a71c75907",
    "bbq/Race_x_gender.jsonl": "dd09a905b284690445d36259d675243950fa0bd7",
    "bbq/Religion.jsonl": "44c1940ee22f00891ab4a5526a293691957aeacb",
    "bbq/SES.jsonl": "78d11ffbdb70f501617345e5c697d00045d57c29",
    "bbq/Sexual_orientation.jsonl": "a06351f4dd67ba30632396eeb0c3677c67b7d387",
}

SOURCES = {
    "adult": "UCI ML Repository, Adult (doi:10.24432/C5XW20)",
    "compas": "ProPublica compas-analysis repository (compas-scores-two-years.csv)",
    "credit": "UCI ML Repository, Default of Credit Card Clients (doi:10.24432/C55S3H), "
              "header renamed to the UCI variable names",
    "mmlu": "Hendrycks et al. 2021 MMLU test split, JSONL with question/options/answer",
    "openbookqa": "Mihaylov et al. 2018 OpenBookQA test split, JSONL with question/options/answer",
    "arc": "Clark et al. 2018 ARC-Challenge test split (hub allenai/ai2_arc), JSONL with question/options/answer",
    "gpqa": "Rein et al. 2023 GPQA diamond set (gated hub data set Idavidrein/gpqa), its CSV as published",
    "bbq": "Parrish et al. 2022 BBQ (repository nyu-mll/BBQ, CC BY 4.0), one JSONL file per category",
}

MANIFEST = "FETCHED.json"  # in the data root: sha256 and source of fetched files that have no published checksum

_verified: set[Path] = set()


def data_root(root: str | os.PathLike | None) -> Path:
    """The configured data root, else $FAIRAUDIT_DATA, else ~/.cache/fairaudit/data."""
    chosen = root or os.environ.get("FAIRAUDIT_DATA") or Path.home() / ".cache" / "fairaudit" / "data"
    return Path(chosen).expanduser().resolve()


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def git_blob_id(data: bytes) -> str:
    """The git blob id of a file's bytes: sha1 of "blob <size>\\0" and the bytes (`git hash-object`)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def fetched_checksums(root: Path) -> dict[str, str]:
    """sha256 of the files `fairaudit data fetch` wrote without a published checksum, by relative path."""
    manifest = root / MANIFEST
    entries = json.loads(manifest.read_text()) if manifest.is_file() else {}
    return {relative: entry["sha256"] for relative, entry in entries.items()}


def accepted_checksums(root: Path, relative: str) -> set[str]:
    """The published sha256 of a file (the CI copy) and the one `fairaudit data fetch` recorded for it, where known."""
    return {digest for digest in (CHECKSUMS.get(relative), fetched_checksums(root).get(relative)) if digest}


def verified_file(root: Path, relative: str) -> Path:
    """Path of a raw data file, checked to exist and match its published (or, fetched, its recorded) checksum."""
    path = root / relative
    name = relative.split("/")[0]
    accepted = accepted_checksums(root, relative)
    where = SOURCES.get(name, "its canonical source")
    if not path.is_file() and (root.parent / relative).is_file():
        raise AuditError(f"data root {root} is one level too deep: it is the {name!r} folder itself; point data.root "
                         f"or FAIRAUDIT_DATA at the folder above it, {root.parent}")
    if not path.is_file():
        get = (f"get it with `fairaudit data fetch {name} --root {root}` (from {where}), or" if name in SOURCES
               else "relative paths are read under data.root:")
        raise AuditError(f"data file {path} is missing; {get} point data.root or FAIRAUDIT_DATA at a copy")
    if accepted and path not in _verified:
        actual = sha256_of(path)
        if actual not in accepted:
            raise AuditError(f"data file {path} is corrupt: sha256 {actual}, expected {' or '.join(sorted(accepted))}; "
                             f"get it again with `fairaudit data fetch {name} --root {root}`")
        _verified.add(path)
    return path
