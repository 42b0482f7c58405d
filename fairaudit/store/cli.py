"""`fairaudit store verify|export|import` (or `python -m fairaudit.store`): check a store, move results between
stores.

    verify [--store URL]          every value: checksum, parses, probability rows sum to 1
    export FILE [--store URL]     the store's sound results into a local sqlite file
    import FILE [--store URL]     a local sqlite file's sound results into the store

URL is an SQLAlchemy URL or a sqlite file path (default, as `store.url`'s: $FAIRAUDIT_STORE_URL, else
$FAIRAUDIT_HOME/store.sqlite).
A key already present in the destination keeps its value. Exit 0, or 1 when damage was found.
"""

from __future__ import annotations

import argparse
import os
from collections import Counter
from pathlib import Path

import sqlalchemy as sa

from fairaudit import home
from fairaudit.errors import AuditError, OneLineParser
from fairaudit.errors.locks import holders, is_locked, locked_error
from fairaudit.errors.secrets import ENVIRONMENT, redact
from fairaudit.store.results import Store, damage
from fairaudit.terminal.output import print_error, warn


def sound_rows(store: Store, damaged: Counter):
    """The store's rows that pass every check; each damaged one is one warning line and counted."""
    for row in store.rows():
        problem = damage(row.key, row.kind, row.value, row.checksum)
        if problem:
            warn(f"store value {row.key[:16]} ({row.kind}, {row.model}) {problem}")
            damaged[row.kind] += 1
        else:
            yield row


def verify(store: Store) -> Counter:
    """Check every value; returns the damaged count per kind."""
    damaged: Counter = Counter()
    sound = Counter(row.kind for row in sound_rows(store, damaged))
    for kind in sorted(set(sound) | set(damaged)):
        print(f"{kind}: {sound[kind]} sound, {damaged[kind]} damaged")
    return damaged


def copy(source: Store, destination: Store, batch: int = 1000) -> Counter:
    """Every sound row of `source` into `destination`; returns counts of copied, present and damaged rows."""
    counts: Counter = Counter()
    damaged: Counter = Counter()
    pending: list[dict] = []

    def flush() -> None:
        added = destination.put_rows(pending)
        counts["copied"] += added
        counts["already present"] += len(pending) - added
        pending.clear()

    for row in sound_rows(source, damaged):
        pending.append(row._asdict())
        if len(pending) == batch:
            flush()
    flush()
    counts["damaged, skipped"] = sum(damaged.values())
    print(", ".join(f"{n} {what}" for what, n in counts.items())
          + f": {redact(source.url)} -> {redact(destination.url)}")
    return counts


def existing(location: str) -> str:
    """A store to read from: a sqlite path must name an existing file (a URL is checked on connecting)."""
    if "://" not in location and not Path(location).is_file():
        raise AuditError(f"{location}: no such store file")
    return location


def parser() -> argparse.ArgumentParser:
    """The command line of `fairaudit store` (also read by tab completion)."""
    parser = OneLineParser(prog="fairaudit store", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, help_text in [("verify", "check every stored value"),
                            ("export", "copy the store's results into a local sqlite file"),
                            ("import", "copy a local sqlite file's results into the store")]:
        sub = commands.add_parser(name, help=help_text)
        if name != "verify":
            sub.add_argument("file", help="the local sqlite file")
        sub.add_argument("--store", default=os.environ.get(ENVIRONMENT["store.url"]) or str(home() / "store.sqlite"),
                         help="SQLAlchemy URL or sqlite path (default, as store.url's: $FAIRAUDIT_STORE_URL, else "
                              "$FAIRAUDIT_HOME/store.sqlite)")
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    return parser().parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        store = Store(args.store if args.command == "import" else existing(args.store))
        if args.command == "verify":
            return 1 if verify(store) else 0
        local = Store(existing(args.file) if args.command == "import" else args.file)
        source, destination = (store, local) if args.command == "export" else (local, store)
        return 1 if copy(source, destination)["damaged, skipped"] else 0
    except AuditError as error:
        print_error(str(error))
        return 2
    except sa.exc.OperationalError as error:
        if not is_locked(error):
            raise
        print_error(str(locked_store([args.store, getattr(args, "file", "")])))
        return 2


def locked_store(locations: list[str]) -> AuditError:
    """The one line for a sqlite store another process kept locked past the wait: the one it holds (else the
    first)."""
    paths = [Path(place.split(":///", 1)[-1]) for place in locations if place.startswith("sqlite:///") or
             (place and "://" not in place)]
    held = [path for path in paths if holders(path)] or paths
    return locked_error(held[0], "a store", "every batch copied so far is committed whole; the same command copies "
                                            "the rest")
