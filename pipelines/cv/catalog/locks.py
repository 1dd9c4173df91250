"""The definitions' locks: the order every change of the catalog takes them in, each wait bounded.

Every definition change takes the stream's lock exclusively (pipelines hold it shared while they
apply a batch) and bumps the catalog's version, which pipelines compare at every batch. The changes
themselves are pipelines.cv.catalog.streams (streams) and pipelines.cv.catalog.views (views).

A definition never makes ingestion wait on a reader, and never waits long itself. Every lock it
waits for is bounded by `LOCK_TIMEOUT_MS` (lock_timeout, set for its transaction), and it takes its
locks in an order that keeps pipelines out of its waits:

1. the definitions' own lock (`DEFINITIONS_LOCK`): one definition at a time; pipelines never take it;
2. what only readers use, a view's read view (dropped first: DROP VIEW locks the view alone, not the
   tables it reads), so a reader holding it open delays the definition, not the pipelines;
3. the stream's lock, exclusively: pipelines queue behind this wait, so it is bounded by the
   timeout; a second stream's lock in one transaction is waited for only in name order (the order
   pipelines take them in), otherwise just tried;
4. the tables pipelines write (storage, state): no pipeline holds them once step 3 is done;
5. the catalog's version row, last, without waiting (a runner recording a failed view holds it).

Views that record their changes (migration 0020) add one lock to every writer's transaction, last:
at commit, each such view's row in cv.view_change_positions, views in name order, held until the
commit ends (that is what makes positions commit in order). Once a transaction holds one, it waits
only for later-named views' rows, taken in the same order, so they cannot deadlock; a definition
that writes such a view takes its row at its own commit, after the stream's lock, like a batch.

A lock not had in time raises `DefinitionBlocked` naming what holds it; `changing` runs a change in
a transaction of its own and tries it again after a growing pause (`PIPELINE_DEFINITION_ATTEMPTS` times
in all, 5 by default).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

import psycopg
from psycopg import errors, pq, sql

from pipelines.errors import StreamviewsError
from pipelines.logs import get_logger
from pipelines.settings import PipelineSettings

log = get_logger("cv.catalog")

# Advisory-lock class for streams: (STREAM_LOCK, hashtext(stream name)).
STREAM_LOCK = 0x4356  # "CV"
# The definitions' own advisory lock: (DEFINITIONS_LOCK, 0). Pipelines never take it.
DEFINITIONS_LOCK = 0x4344  # "CD"
# The longest a definition waits for any one lock. Pipelines queue behind a definition that waits for
# their stream's lock, so this bounds how long a definition can hold ingestion up while it waits.
LOCK_TIMEOUT_MS = 1000
# A change blocked by a lock is tried `attempts()` times in all, pausing 0.25 s, 0.5 s, 1 s, ... between.
FIRST_PAUSE_S = 0.25
# The streams this transaction holds exclusively, for step 3 (a transaction-local setting).
_LOCKED_STREAMS = "cv.streams_locked"
# Set 'on' for its transaction by the catalog's own DDL: sql/guards.sql refuses plain DDL on read views and storage.
CATALOG_DDL = "cv.catalog_ddl"

T = TypeVar("T")


class DefinitionBlocked(StreamviewsError):
    """A definition did not get a lock in time; the message names what held it. Trying later may succeed."""


def lock_stream(conn: psycopg.Connection, stream: str, *, shared: bool) -> None:
    """Pipelines apply batches holding the stream's lock shared; (re)definitions hold it exclusively."""
    function = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
    conn.execute(sql.SQL("SELECT {}(%s, hashtext(%s))").format(sql.Identifier(function)), (STREAM_LOCK, stream))


def changing(conn: psycopg.Connection, what: str, change: Callable[[], T]) -> T:
    """Run a definition change in a transaction of its own, tried again while locks block it.

    Inside the caller's transaction (a savepoint here) it is tried once, and DefinitionBlocked goes to
    the caller: a retry must start the whole transaction again, which only its owner can do.

    Raises:
        DefinitionBlocked: Still blocked after `attempts()` tries; the message names what held the lock.
    """
    owner = conn.info.transaction_status == pq.TransactionStatus.IDLE
    tries = attempts() if owner else 1
    for attempt in range(1, tries + 1):
        try:
            with conn.transaction():
                return change()
        except DefinitionBlocked as e:
            blocked = e
        except (errors.LockNotAvailable, errors.DeadlockDetected) as e:  # a wait no step foresaw
            blocked = DefinitionBlocked(f"{what}: {' '.join((e.diag.message_primary or str(e)).split())}")
            blocked.__cause__ = e
        if not owner:
            raise blocked
        if attempt == tries:
            times = f"{tries} times" if tries > 1 else "once"
            raise DefinitionBlocked(f"{blocked} (tried {times}); retry later") from blocked
        pause = FIRST_PAUSE_S * 2 ** (attempt - 1)
        log.info("definition blocked; trying again", reason=str(blocked), attempt=attempt, pause_s=pause)
        time.sleep(pause)
    raise AssertionError("unreachable")


def attempts() -> int:
    """How many times a blocked definition is tried: PIPELINE_DEFINITION_ATTEMPTS, read at each definition."""
    return PipelineSettings().definition_attempts


def begin_change(conn: psycopg.Connection, what: str) -> None:
    """Step 1 of every definition change: bound its lock waits, and wait for any other definition to end.

    It also marks the transaction as the catalog's own DDL (`CATALOG_DDL`), which sql/guards.sql's
    event triggers let drop and rename read views and storage; plain DDL may not.
    """
    conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{LOCK_TIMEOUT_MS}ms",))
    mark_catalog_ddl(conn)
    _take(conn, what, "another definition is being applied", _advisory(DEFINITIONS_LOCK, sql.Literal(0)))


def mark_catalog_ddl(conn: psycopg.Connection) -> None:
    """Say, for the rest of the transaction, that its DDL is the catalog's (sql/guards.sql lets it through)."""
    conn.execute("SELECT set_config(%s, 'on', true)", (CATALOG_DDL,))


def lock_stream_for_change(conn: psycopg.Connection, stream: str, what: str) -> None:
    """Step 3: the stream's lock, exclusively, waiting at most the lock timeout (pipelines queue behind).

    Pipelines take their streams' locks in name order; so does a transaction that changes several
    streams, or else it only tries (no wait at all): a wait out of that order could deadlock a pipeline.
    """
    setting = conn.execute("SELECT current_setting(%s, true)", (_LOCKED_STREAMS,)).fetchone()[0]
    held = [name for name in (setting or "").split(",") if name]
    if stream in held:
        return
    lock = _advisory(STREAM_LOCK, sql.SQL("hashtext({})").format(sql.Literal(stream)))
    _take(conn, what, f"the pipelines of stream {stream} hold it", lock, wait=all(other < stream for other in held))
    conn.execute("SELECT set_config(%s, %s, true)", (_LOCKED_STREAMS, ",".join([*held, stream])))


def lock_tables(conn: psycopg.Connection, what: str, tables: list[sql.Identifier], holder: str = "a reader") -> None:
    """Step 4: ACCESS EXCLUSIVE on each of these tables that exists, waiting at most the lock timeout."""
    for table in tables:
        name = _existing(conn, table)
        if name is not None:
            statement = sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(table)
            _take(conn, what, f"{holder} holds {name} open", _relation(statement, name))


def drop_read_view(conn: psycopg.Connection, what: str, view: sql.Identifier) -> None:
    """Step 2: drop a read view, waiting at most the lock timeout for its readers (pipelines never read it).

    DROP VIEW locks the view alone; LOCK TABLE on a view would lock the tables it reads too, the
    storage pipelines write, and so make them wait for the reader as well.
    """
    name = _existing(conn, view)
    if name is not None:
        _take(conn, what, f"a reader holds {name} open", _relation(sql.SQL("DROP VIEW {}").format(view), name))


def _existing(conn: psycopg.Connection, relation: sql.Identifier) -> str | None:
    """The relation's schema-qualified name (quoted only where needed), or None if there is none."""
    row = conn.execute(
        "SELECT format('%%I.%%I', n.nspname, c.relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE c.oid = to_regclass(%s)",
        (relation.as_string(conn),),
    ).fetchone()
    return row[0] if row else None


class Outcome(NamedTuple):
    """What one statement did: a line for people, and whether the catalog changed (then step 5 follows)."""

    line: str
    changed: bool = True


def bump(conn: psycopg.Connection) -> None:
    """Step 5, once per transaction that changed the catalog: pipelines reload their plans when the version moves.

    Without waiting: a runner that records a failed view changes the version in its batch's
    transaction, which may itself wait for a stream this definition holds.
    """
    statement = sql.SQL("SELECT version FROM cv.catalog FOR UPDATE NOWAIT")
    _take(conn, "cv.catalog", "a stream runner is changing the version", _relation(statement, "cv.catalog", "Row"))
    conn.execute("UPDATE cv.catalog SET version = version + 1")


@dataclass(frozen=True)
class _Lock:
    """A statement that takes a lock, and the condition on pg_locks (as `l`) that finds who else holds it."""

    statement: sql.Composable
    holders: sql.Composable
    attempt: sql.Composable | None = None  # takes it only if free: returns whether it did


def _relation(statement: sql.Composable, name: str, modes: str = "") -> _Lock:
    """A lock on a relation; `modes`: only holders in modes starting so (e.g. "Row": row locks' table locks)."""
    held = sql.SQL(
        "l.locktype = 'relation' AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        " AND l.relation = to_regclass({}) AND l.mode LIKE {}"
    ).format(sql.Literal(name), sql.Literal(f"{modes}%"))
    return _Lock(statement, held)


def _advisory(lock_class: int, key: sql.Composable) -> _Lock:
    held = sql.SQL(
        "l.locktype = 'advisory' AND l.classid = {}::oid"
        " AND l.objid = ({}::bigint & 4294967295)::oid AND l.objsubid = 2"
    ).format(sql.Literal(lock_class), key)
    return _Lock(
        sql.SQL("SELECT pg_advisory_xact_lock({}, {})").format(sql.Literal(lock_class), key),
        held,
        sql.SQL("SELECT pg_try_advisory_xact_lock({}, {})").format(sql.Literal(lock_class), key),
    )


def _take(conn: psycopg.Connection, what: str, reason: str, lock: _Lock, *, wait: bool = True) -> None:
    """Take a lock, waiting at most the lock timeout (or not at all); DefinitionBlocked naming its holders if not."""
    try:
        with conn.transaction():  # a savepoint: after a timeout, the transaction can still ask who held the lock
            if wait or lock.attempt is None:
                conn.execute(lock.statement)
                return
            if conn.execute(lock.attempt).fetchone()[0]:
                return
    except errors.LockNotAvailable as e:
        raise DefinitionBlocked(f"{what}: {reason}{_holders(conn, lock)}") from e
    raise DefinitionBlocked(f"{what}: {reason}{_holders(conn, lock)}")


def _holders(conn: psycopg.Connection, lock: _Lock) -> str:
    """` (pid 123, sv_reader, psql, in a transaction for 14 s)`: the sessions holding a lock, if still there."""
    rows = conn.execute(
        sql.SQL(
            "SELECT DISTINCT a.pid, a.usename, a.application_name, extract(epoch FROM now() - a.xact_start)::bigint"
            " FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
            " WHERE l.granted AND l.pid <> pg_backend_pid() AND {} ORDER BY 4 DESC NULLS LAST, 1 LIMIT 3"
        ).format(lock.holders)
    ).fetchall()
    sessions = []
    for pid, user, application, age in rows:
        parts = [
            f"pid {pid}",
            user or "",
            application or "",
            f"in a transaction for {age} s" if age is not None else "",
        ]
        sessions.append(", ".join(p for p in parts if p))
    return f" ({'; '.join(sessions)})" if sessions else ""
