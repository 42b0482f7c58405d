"""Claims on calls: a process about to compute calls holds a lease on their keys in the store's `claims` table, so
that another process asking for the same calls (a second audit of the same grid, a sweep's parallel jobs, many
nodes on one PostgreSQL store) reads them when they land instead of computing them too.

A claim names its owner (host, pid, process start, a token) and expires LEASE_S after it was last renewed; a thread
renews this process's claims every RENEW_S while it holds any. A claim is free for another process once it expires
(a killed process's, after LEASE_S: its host's clock against the reader's), at once when its owner is a process of
this host that is gone (a zombie included), and when its owner releases it: with the results in the same commit
(`Store.put_rows`), or without them when its computation failed. Keys are taken in sorted order, so two PostgreSQL
transactions never wait on each other's rows in a circle.

A live owner whose claims make no progress for a lease (none released, none added: a process stuck, though its
thread renews) has them taken over by a process waiting for them (`Stalls`, `Claims.take_over`), so no wait is
longer than about a lease. A process paused past its lease (SIGSTOP) may find its claims taken when it resumes:
`Claims.lost` says which, so it reads those instead of computing them again.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Iterable, Sequence

import sqlalchemy as sa

from fairaudit.processes import identity, is_gone

LEASE_S = 60.0   # a claim lapses this long after its last renewal (a killed process elsewhere: the others' wait)
BATCH = 500      # keys per statement
CLAIM_BYTES = 200  # about what a claim's row takes in the database

CLAIMS_METADATA = sa.MetaData()
CLAIMS = sa.Table(
    "claims", CLAIMS_METADATA,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("owner", sa.Text, nullable=False),
    sa.Column("expires", sa.Float, nullable=False),
)


def owner_is_gone(owner: str) -> bool:
    """The process an owner string names ("host pid start token") no longer runs on this host."""
    parts = owner.split(" ")
    return len(parts) == 4 and is_gone(*parts[:3])


def owner_name(owner: str) -> str:
    """An owner string as a reader names it: "pid PID on HOST"."""
    host, pid, *_ = owner.split(" ")
    return f"pid {pid} on {host}"


def batches(keys: Sequence[str]) -> Iterable[list[str]]:
    for start in range(0, len(keys), BATCH):
        yield list(keys[start:start + BATCH])


class Claims:
    """This process's claims in one store (`engine`; `insert`: its dialect's insert, which has on_conflict_*)."""

    def __init__(self, engine: sa.Engine, insert):
        self.engine, self._insert = engine, insert
        self.owner = " ".join([*identity(), uuid.uuid4().hex[:8]])
        self.lease_s = LEASE_S
        self.held: set[str] = set()
        self._lock = threading.Lock()
        self._renewing = False
        self._expires = 0.0   # when this process's claims lapse unless renewed
        self._doubt = False   # a renewal came after that, or found a claim taken: `lost` looks

    def take(self, keys: Sequence[str], look_first: bool = False) -> set[str]:
        """Claim `keys`: those no one holds, those whose lease lapsed and those of a gone process of this host.
        Returns those of `keys` this process now holds; the rest are another live process's. `look_first`: read
        who holds them before writing (for keys known to be held by others, so that waiting writes nothing)."""
        wanted = set(keys)
        if not look_first:
            self._upsert(sorted(wanted - self.held))
        rest = sorted(wanted - self.held)
        holders = self.holders(rest) if rest else {}
        gone = {owner for owner, _ in holders.values() if owner_is_gone(owner)}
        now = time.time()
        free = [k for k in rest if k not in holders or holders[k][0] in gone or holders[k][1] < now]
        if free and (look_first or gone):
            self._upsert(free, gone)
        return wanted & self.held

    def holders(self, keys: Sequence[str]) -> dict[str, tuple[str, float]]:
        """key -> (owner, expires) of those of `keys` someone claims."""
        found = {}
        with self.engine.connect() as conn:
            for batch in batches(keys):
                query = sa.select(CLAIMS.c.key, CLAIMS.c.owner, CLAIMS.c.expires).where(CLAIMS.c.key.in_(batch))
                found.update((key, (owner, expires)) for key, owner, expires in conn.execute(query))
        return found

    def _upsert(self, keys: list[str], gone: set[str] = frozenset()) -> None:
        """Insert a claim on each key, or take over one that lapsed (a gone owner's lapse first): one statement, so
        two processes racing for a key never both get it."""
        if not keys:
            return
        now = time.time()
        insert = self._insert(CLAIMS)
        statement = insert.on_conflict_do_update(
            index_elements=["key"], set_={"owner": insert.excluded.owner, "expires": insert.excluded.expires},
            where=CLAIMS.c.expires < now).returning(CLAIMS.c.key)
        taken = set()
        with self.engine.begin() as conn:
            if gone:
                conn.execute(CLAIMS.update().where(CLAIMS.c.owner.in_(sorted(gone))).values(expires=0.0))
            for batch in batches(keys):
                rows = [{"key": key, "owner": self.owner, "expires": now + self.lease_s} for key in batch]
                taken.update(conn.execute(statement, rows).scalars())
        self._hold(taken, now)

    def take_over(self, keys: Sequence[str], owners: set[str]) -> set[str]:
        """Claim those of `keys` that `owners` hold, though their leases run (owners that made no progress for a
        lease); one statement per batch, so a key its owner released meanwhile is not taken. Returns those taken."""
        now, taken = time.time(), set()
        with self.engine.begin() as conn:
            for batch in batches(sorted(keys)):
                statement = (CLAIMS.update().where(CLAIMS.c.key.in_(batch), CLAIMS.c.owner.in_(sorted(owners)))
                             .values(owner=self.owner, expires=now + self.lease_s).returning(CLAIMS.c.key))
                taken.update(conn.execute(statement).scalars())
        self._hold(taken, now)
        return taken

    def _hold(self, taken: set[str], now: float) -> None:
        """Note claims this process took at `now`; its renewing thread runs while it holds any."""
        with self._lock:
            if taken and not self.held:
                self._expires = now + self.lease_s
            self.held |= taken
            start = taken and not self._renewing
            self._renewing = self._renewing or bool(taken)
        if start:
            threading.Thread(target=self._renew, name="fairaudit-claims", daemon=True).start()

    def lost(self, keys: Sequence[str]) -> set[str]:
        """Of `keys` this process claimed, those it no longer holds: none while each renewal came within the lease
        and found every claim still its own; otherwise (a pause past the lease, SIGSTOP or a frozen machine; claims
        taken over from a process that made no progress) its claims are renewed, and those another process took
        meanwhile are given up here."""
        with self._lock:
            doubt = self._doubt or time.time() > self._expires
        if doubt:
            kept = self.renew()
            with self._lock:
                self.held &= kept
                self._doubt = False
        return set(keys) - self.held

    def release(self, keys: Iterable[str], conn: sa.Connection | None = None) -> None:
        """Give up this process's claims on `keys`: in `conn`'s transaction when given (a commit of their results),
        else on its own and best effort, since the store may be what failed (a claim left behind lapses)."""
        mine = sorted(set(keys) & self.held)
        if not mine:
            return
        if conn is not None:
            self._delete(conn, mine)
        else:
            try:
                with self.engine.begin() as own:
                    self._delete(own, mine)
            except sa.exc.SQLAlchemyError:
                return
        with self._lock:
            self.held -= set(mine)

    def release_all(self) -> None:
        """Give up every claim this process holds (its computation stopped or failed)."""
        self.release(list(self.held))

    def _delete(self, conn: sa.Connection, keys: list[str]) -> None:
        mine = CLAIMS.delete().where(CLAIMS.c.owner == self.owner)
        if len(keys) == len(self.held):  # every claim this process holds (keys are among them): no key list to send
            conn.execute(mine)
            return
        for batch in batches(keys):
            conn.execute(mine.where(CLAIMS.c.key.in_(batch)))

    def renew(self) -> set[str]:
        """Every claim of this process expires LEASE_S from now; returns their keys (`lost` learns from a lapse, or
        a claim no longer found, that another process may have taken some)."""
        now = time.time()
        with self.engine.begin() as conn:
            kept = set(conn.execute(CLAIMS.update().where(CLAIMS.c.owner == self.owner)
                                    .values(expires=now + self.lease_s).returning(CLAIMS.c.key)).scalars())
        with self._lock:
            self._doubt = self._doubt or now > self._expires or not self.held <= kept
            self._expires = now + self.lease_s
        return kept

    def _renew(self) -> None:
        """The renewing thread: every quarter lease while this process holds claims, then it ends."""
        while True:
            time.sleep(self.lease_s / 4)
            with self._lock:
                if not self.held:
                    self._renewing = False
                    return
            try:
                self.renew()
            except sa.exc.SQLAlchemyError:  # the store is unreachable for now: the claims may lapse, nothing worse
                pass


class Stalls:
    """The owners of the claims a process waits for, and since when each has made no progress (released or added
    no claim): one that makes none for a lease is stuck, though it may renew (`stuck`)."""

    def __init__(self, claims: Claims):
        self.claims = claims
        self.seen: dict[str, tuple[frozenset, float]] = {}  # owner -> (its claimed keys, since when)

    def stuck(self, keys: Sequence[str]) -> set[str]:
        """The owners holding any of `keys` whose claims have not changed for a lease."""
        owners = sorted({owner for owner, _ in self.claims.holders(keys).values()})
        now, held = time.time(), {owner: set() for owner in owners}
        with self.claims.engine.connect() as conn:
            for batch in batches(owners):
                query = sa.select(CLAIMS.c.key, CLAIMS.c.owner).where(CLAIMS.c.owner.in_(batch))
                for key, owner in conn.execute(query):
                    held[owner].add(key)
        for owner, owned in held.items():
            before = self.seen.get(owner)
            if before is None or before[0] != owned:
                self.seen[owner] = (frozenset(owned), now)
        return {owner for owner in owners if now - self.seen[owner][1] > self.claims.lease_s}
