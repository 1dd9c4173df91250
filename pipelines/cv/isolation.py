"""Isolation: a batch that failed is applied again so that a failure stops only what causes it.

The first attempt of a batch applies every stream in one go, with no savepoints: the common case
pays nothing. When it fails for a reason that is the batch's own (not the database's: see
`pipelines.runtime.checkpoint.is_transient`), the checkpoint rolls back and applies the batch again
with `outcome.isolate` set, and the views sink hands each stream to `StreamIsolation`:

1. The stream is applied under a savepoint of its own: its failure undoes its own changes only.
2. A view whose maintenance fails for a reason no event causes (SQLSTATE class 42: a table, column or
   function gone, a privilege revoked, an operator that does not exist; 0A: not supported) is
   *quarantined*: recorded in `cv.view_failures` with the reason and where its stream stood, left out
   of the stream's maintenance, and the stream is applied again without it.
3. Any other failure is taken to be the records': they are read back from Kafka (the common path
   keeps no message once decoded) and bisected, each half under a savepoint;
   halves that apply are kept, and a record that fails on its own is dead-lettered, its reason
   `view_error` (or `apply_error` for the stream's state) with the view and PostgreSQL's SQLSTATE and
   message. k bad records among n cost O(k log n) attempts, each record is rejected once.
4. A view that rejects more than PIPELINE_POISON_LIMIT records of one batch is itself at fault: it
   is quarantined (step 2) and the records go on to the stream's other views.
5. A failure of the stream itself that no record explains (its state table gone or unwritable) holds
   the stream back: its topics' offsets are not advanced (nothing is lost), `cv.stream_failures`
   says why, and the runner reads the topics again after a back-off.

Quarantined views are retried by the runner's housekeeping (`retry_quarantined`): a view that runs
again over a keyed stream is rebuilt from the stream's state (exact); over an append-only stream it
resumes, and the offsets it missed are recorded in `cv.view_gaps` for status and replays.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import psycopg
from psycopg.types.json import Jsonb

from pipelines.cv import catalog
from pipelines.cv.apply_errors import StreamDropped, ViewApplyError, describe_error
from pipelines.cv.engine import StreamMaintainer, probe_view, rebuild_from_state
from pipelines.errors import StreamviewsError
from pipelines.logs import get_logger
from pipelines.runtime.checkpoint import ApplyOutcome, is_transient
from pipelines.runtime.events import InvalidEvent

if TYPE_CHECKING:
    from pipelines.cv.stream_changes import StreamChanges

log = get_logger("cv.isolation")

# SQLSTATE classes of a view that cannot run whatever its input: syntax or access rule violations
# (undefined table, column or function, insufficient privilege, a datatype mismatch) and features
# not supported. Data exceptions (22), integrity violations (23), program limits (54) and the rest
# depend on the records.
DEFINITION_SQLSTATE_CLASSES = frozenset({"42", "0A"})
MAX_RETRY_S = 600.0
MAX_QUARANTINES_PER_BATCH = 20  # then the stream is held: something quarantining cannot fix


def broken_definition(error: BaseException) -> bool:
    """True when a statement failed because of what it is, not of what it was given."""
    state = getattr(error, "sqlstate", None) or ""
    return state[:2] in DEFINITION_SQLSTATE_CLASSES


class ViewBroken(StreamviewsError):
    """A view of the stream cannot be maintained: it is to be quarantined."""

    def __init__(self, view: str, reason: str, sqlstate: str | None) -> None:
        super().__init__(f"view {view}: {reason}")
        self.view, self.reason, self.sqlstate = view, reason, sqlstate


class StreamBroken(StreamviewsError):
    """The stream's own statements fail whatever its records: it is to be held back."""

    def __init__(self, reason: str, sqlstate: str | None) -> None:
        super().__init__(reason)
        self.reason, self.sqlstate = reason, sqlstate


@dataclass(frozen=True)
class Unit:
    """One record and the changes it makes (one, two for a Debezium update), as parallel columns."""

    message: Any
    ops: list[int]
    columns: list[list[Any]]


def units_of(changes: StreamChanges, fetched: dict[tuple[str, int], list[Any]]) -> list[Unit] | None:
    """The records behind a stream's changes, each decoded again on its own (isolation only).

    `fetched` holds the batch's records read back from Kafka, per partition in offset order; the
    records are taken partition by partition, which keeps each key's changes in order where its
    partition does (and no order across partitions was ever promised). None
    when they do not account for exactly the stream's changes (a record gone from the topic since,
    say): the changes cannot be told apart then, and the stream is held rather than guessed at.
    """
    units = []
    for origin in changes.origins:
        for tp in sorted(tp for tp in fetched if tp[0] == origin.topic):
            for message in fetched[tp]:
                decoded = origin.decoder.decode_each([message], undecodable="undecodable")
                if decoded.ops:  # rejected (a dead letter already) or a tombstone: no change
                    units.append(Unit(message, decoded.ops, decoded.columns))
    return units if sum(len(u.ops) for u in units) == len(changes.ops) else None


def _joined(units: list[Unit]) -> tuple[list[int], list[list[Any]]]:
    """The changes of these records, in their order, as one batch."""
    ops = [op for unit in units for op in unit.ops]
    columns = [[value for unit in units for value in unit.columns[i]] for i in range(len(units[0].columns))]
    return ops, columns


class IsolatingSink(Protocol):
    """What isolation needs of the sink it works for: the live views' (pipelines.cv.sink) or a backfill's."""

    poison_limit: int  # a view rejecting more records of one batch is quarantined
    view_retry_s: float  # a quarantined view's first retry

    def hold_stream(
        self, conn: psycopg.Connection, stream: str, broken: StreamBroken, topics: list[str], outcome: ApplyOutcome
    ) -> None:
        """Step 5: the stream's records cannot be applied at all (the live sink holds its topics back)."""
        ...


class StreamIsolation:
    """One stream's changes applied in isolation (steps 1 to 5 of the module's docstring)."""

    def __init__(
        self,
        conn: psycopg.Connection,
        maintainer: StreamMaintainer,
        changes: StreamChanges,
        outcome: ApplyOutcome,
        sink: IsolatingSink,
    ) -> None:
        self.conn, self.maintainer, self.changes, self.outcome, self.sink = conn, maintainer, changes, outcome, sink
        self.stream = maintainer.stream_name
        self._rejected: list[tuple[Any, InvalidEvent]] = []
        self._per_view: Counter[str] = Counter()

    def apply(self) -> int:
        """Apply what can be applied; quarantine, reject or hold the rest. Returns the changes made."""
        units: list[Unit] | None = None
        for _ in range(MAX_QUARANTINES_PER_BATCH):
            self._rejected, self._per_view = [], Counter()
            try:
                with self.conn.transaction():
                    try:
                        changed = self._whole()
                    except _Bisect:
                        if units is None:
                            units = self._units()
                        changed = self._bisect(units)
            except ViewBroken as e:
                self.maintainer.forget_sessions()
                quarantine(self.conn, e, self.changes.topics, self.outcome, self.sink.view_retry_s)
                continue  # the stream again, without the view
            except StreamBroken as e:
                self.maintainer.forget_sessions()
                self.sink.hold_stream(self.conn, self.stream, e, self.changes.topics, self.outcome)
                return 0
            self.outcome.rejected.extend(self._rejected)
            return changed
        reason = f"stream {self.stream}: its views kept failing after {MAX_QUARANTINES_PER_BATCH} quarantines"
        self.sink.hold_stream(self.conn, self.stream, StreamBroken(reason, None), self.changes.topics, self.outcome)
        return 0

    def _whole(self) -> int:
        """The stream's changes at once (a savepoint of their own, so a failure undoes only them)."""
        try:
            with self.conn.transaction():
                return self.maintainer.apply(self.conn, self.changes.ops, self.changes.columns)
        except StreamDropped:
            raise  # its records have nowhere to go: the sink skips them
        except Exception as e:
            self.maintainer.forget_sessions()
            self._classify(e)
            raise _Bisect from e

    def _units(self) -> list[Unit]:
        """The stream's records, read back from Kafka and decoded one by one."""
        topics = set(self.changes.topics)
        ranges = {tp: span for tp, span in self.outcome.ranges.items() if tp[0] in topics}
        if self.outcome.fetch is None:
            raise StreamBroken(f"stream {self.stream}: its records cannot be read again to tell them apart", None)
        units = units_of(self.changes, self.outcome.fetch(ranges))
        if units is None:
            raise StreamBroken(f"stream {self.stream}: its records read again do not make the same changes", None)
        return units

    def _bisect(self, units: list[Unit]) -> int:
        try:
            with self.conn.transaction():
                ops, columns = _joined(units)
                changed = self.maintainer.apply(self.conn, ops, columns)
                self.maintainer.clear_batch(self.conn)
                return changed
        except StreamDropped:
            raise
        except Exception as e:
            self.maintainer.forget_sessions()
            self._classify(e)
            if len(units) > 1:
                middle = len(units) // 2
                return self._bisect(units[:middle]) + self._bisect(units[middle:])
            self._reject(units[0], e)
            return 0

    def _classify(self, error: Exception) -> None:
        """Raise what a failure says of the stream or a view; return when it may be the records'."""
        if is_transient(error):
            raise error
        if isinstance(error, ViewApplyError):
            if broken_definition(error.error):
                raise ViewBroken(error.view, describe_error(error.error), error.error.sqlstate) from error
        elif broken_definition(error):
            raise StreamBroken(f"stream {self.stream}: {describe_error(error)}", error.sqlstate) from error

    def _reject(self, unit: Unit, error: Exception) -> None:
        if isinstance(error, ViewApplyError):
            self._per_view[error.view] += 1
            if self._per_view[error.view] > self.sink.poison_limit:
                raise ViewBroken(
                    error.view,
                    f"rejected over {self.sink.poison_limit} records of one batch, the last with "
                    f"{describe_error(error.error)}",
                    error.error.sqlstate,
                )
            rejection = InvalidEvent("view_error", f"{error.view}: {describe_error(error.error)}")
        else:
            rejection = InvalidEvent("apply_error", f"stream {self.stream}: {describe_error(error)}")
        log.warning(
            "record rejected while applying",
            stream=self.stream,
            topic=unit.message.topic(),
            partition=unit.message.partition(),
            offset=unit.message.offset(),
            reason=rejection.reason,
            detail=rejection.detail,
        )
        self._rejected.append((unit.message, rejection))


class _Bisect(Exception):  # a signal between two methods, never seen outside
    """The stream's changes failed as a whole in a way records may explain: bisect them."""


def positions(conn: psycopg.Connection, group_id: str, topics: list[str]) -> dict[str, dict[str, int]]:
    """Where the group stands in these topics, as stored (in this transaction: the batch's start)."""
    rows = conn.execute(
        "SELECT topic, partition, next_offset FROM ops.kafka_offsets WHERE group_id = %s AND topic = ANY(%s)",
        (group_id, topics),
    ).fetchall()
    stored: dict[str, dict[str, int]] = {}
    for topic, partition, offset in rows:
        stored.setdefault(topic, {})[str(partition)] = offset
    return stored


def quarantine(
    conn: psycopg.Connection, broken: ViewBroken, topics: list[str], outcome: ApplyOutcome, retry_s: float
) -> None:
    """Record the view as failed, in the batch's transaction; its stream's plan version moves with it."""
    recorded = conn.execute(
        "SELECT cv.quarantine_view(%s, %s, %s, %s, make_interval(secs => %s))",
        (broken.view, broken.sqlstate, broken.reason, Jsonb(positions(conn, outcome.group_id, topics)), retry_s),
    ).fetchone()[0]
    log.error("view quarantined", view=broken.view, reason=broken.reason, recorded=recorded)


def hold(conn: psycopg.Connection, stream: str, broken: StreamBroken, topics: list[str], outcome: ApplyOutcome) -> None:
    """Hold the stream back: its topics' offsets wait, and `cv.stream_failures` says why."""
    outcome.held_topics.update(topics)
    conn.execute(
        "INSERT INTO cv.stream_failures (stream, group_id, sqlstate, reason) VALUES (%s, %s, %s, %s)"
        " ON CONFLICT (stream) DO UPDATE SET sqlstate = excluded.sqlstate, reason = excluded.reason,"
        " last_at = now(), attempts = cv.stream_failures.attempts + 1",
        (stream, outcome.group_id, broken.sqlstate, broken.reason[:1000]),
    )
    log.error("stream held back; its offsets wait", stream=stream, topics=topics, reason=broken.reason)


def held_streams(conn: psycopg.Connection, group_id: str) -> set[str]:
    """The streams the group holds back, as recorded."""
    rows = conn.execute("SELECT stream FROM cv.stream_failures WHERE group_id = %s", (group_id,)).fetchall()
    return {stream for (stream,) in rows}


def release_stream(conn: psycopg.Connection, stream: str) -> None:
    """A held stream applied again: its failure is over."""
    conn.execute("DELETE FROM cv.stream_failures WHERE stream = %s", (stream,))
    log.info("held stream applies again", stream=stream)


_CATCHING_UP_ALONE = "SELECT 1 FROM cv.backfills WHERE view = %s AND joined_at IS NULL AND done_at IS NULL"


def retry_quarantined(conn: psycopg.Connection, streams: tuple[str, ...], group_id: str, retry_s: float) -> None:
    """Try the quarantined views of these streams whose retry is due; resume those that run.

    Each under a savepoint, holding its stream's lock exclusively (no batch of it runs meanwhile):
    the view's maintenance is run over an empty batch; when it passes, a view over a keyed stream
    is rebuilt from the state, one over an append-only stream records the offsets it missed (none
    for a backfill's view before its join: the live runner was not keeping it anyway).
    """
    if not streams:
        return
    due = conn.execute(
        "SELECT f.view, f.stream, f.attempts, s.topic FROM cv.view_failures AS f JOIN cv.streams AS s"
        " ON s.name = f.stream WHERE f.retry_at <= now() AND f.stream = ANY(%s) ORDER BY f.stream, f.view",
        (list(streams),),
    ).fetchall()
    for view, stream_name, attempts, topic in due:
        try:
            with conn.transaction():
                catalog.lock_stream(conn, stream_name, shared=False)
                if not conn.execute("SELECT 1 FROM cv.view_failures WHERE view = %s", (view,)).fetchone():
                    continue  # another runner of the group resumed it while this one waited for the lock
                streams_now = catalog.load_streams(conn, skip_broken=True)
                stream = streams_now[stream_name]
                views = catalog.load_views(conn, streams_now, stream_name)
                compiled = next(c for c in views if c.view.qualified_name == view)
                probe_view(conn, compiled, stream)
                if stream.key is not None:
                    rebuild_from_state(conn, compiled, stream)
                    missed_to = None
                elif conn.execute(_CATCHING_UP_ALONE, (view,)).fetchone():
                    missed_to = None  # a backfill's before its join: its catch-up reads on from where it stood
                else:
                    topics = [topic, *(s.topic for s in streams_now.values() if s.into == stream_name)]
                    missed_to = Jsonb(positions(conn, group_id, topics))
                conn.execute("SELECT cv.resume_view(%s, %s)", (view, missed_to))
        except Exception as e:
            if is_transient(e):
                raise
            delay = min(retry_s * 2 ** (attempts + 1), MAX_RETRY_S)
            conn.execute(
                "SELECT cv.retry_view_later(%s, %s, %s, make_interval(secs => %s))",
                (view, getattr(e, "sqlstate", None), describe_error(e), delay),
            )
            log.warning("quarantined view still fails", view=view, error=describe_error(e), retry_in_s=delay)
            continue
        log.info("quarantined view resumed", view=view, rebuilt=missed_to is None)
