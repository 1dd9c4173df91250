"""Exactly-once into PostgreSQL: a batch's effects and its Kafka offsets commit in one transaction.

Kafka's own committed offsets are not the source of truth: on partition assignment the consumer seeks
to the offsets stored here (`ops.kafka_offsets`). A crash before COMMIT loses the whole batch and it is
consumed again; a crash after COMMIT resumes after it. Either way each event counts once.

A consumer that lost a partition in a rebalance may still be applying a batch for it while the new
owner starts. The offset rows are the fence: each transaction locks them first and checks that they
still hold the position the batch started from; the slower of two writers finds them moved, rolls
back and re-seeks.

A batch that fails for a reason other than the database's availability (a value a view cannot take,
a view that cannot run) is not retried as it was: it is applied again at once in *isolation*, where
the sink confines the failure to the records, views or streams that cause it (see `Sink.apply`).
What the sink rejects there is dead-lettered before the transaction commits, and the partitions of
the topics it holds back keep their stored offsets, so nothing is lost either way.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

import psycopg

from pipelines.errors import StreamviewsError
from pipelines.logs import get_logger
from pipelines.runtime.events import InvalidEvent

log = get_logger("checkpoint")

TopicPartition = tuple[str, int]
# One decoded record and the Kafka partition it came from, in batch order (per-record decoders).
Record = tuple[int, Any]


class Fenced(StreamviewsError):
    """Stored offsets moved under us: another consumer owns (or owned) the partition."""


class DeadLetterSender(Protocol):
    """Where rejected records go (pipelines.runtime.deadletter.DeadLetters)."""

    def send(self, message: Any, error: InvalidEvent) -> None:
        """Produce one rejected record to its dead-letter topic."""
        ...

    def flush(self) -> None:
        """Wait until Kafka stored every dead letter sent; raise if one failed."""
        ...


# SQLSTATE classes of failures that say nothing about the batch: the database is unavailable or out
# of resources, the transaction lost a race (deadlock, serialization), a statement was cancelled.
# The whole batch is retried after a back-off, as it is; anything else is isolated.
TRANSIENT_SQLSTATE_CLASSES = frozenset({"08", "40", "53", "57", "58"})
TRANSIENT_SQLSTATES = frozenset({"55P03", "55006"})  # lock_not_available, object_in_use


def is_transient(error: BaseException) -> bool:
    """True when a failure is the database's, not the batch's: retrying the same batch later may pass."""
    while isinstance(error, StreamviewsError) and isinstance(error.__cause__, psycopg.Error):
        error = error.__cause__  # a failure the sink wrapped to say where it happened
    if isinstance(error, Fenced):
        return True
    if isinstance(error, psycopg.Error):
        state = error.sqlstate
        if not state:  # raised by the client: the connection is gone, or a bug of ours
            return isinstance(error, psycopg.OperationalError | psycopg.InterfaceError)
        # By SQLSTATE, not class: psycopg calls program limits (54, an index row too long) operational.
        return state[:2] in TRANSIENT_SQLSTATE_CLASSES or state in TRANSIENT_SQLSTATES
    if isinstance(error, StreamviewsError) and getattr(error, "transient", False):
        return True  # e.g. dead letters that Kafka did not store
    return not isinstance(error, Exception)  # KeyboardInterrupt, SystemExit: never isolated


@dataclass
class ApplyOutcome:
    """What a sink reports of a batch besides its changes, when it applies it in isolation.

    Attributes:
        isolate: True on the second attempt of a batch that failed: the sink confines each failure
            to what causes it (records, a view, a stream) instead of raising.
        rejected: Records it could not apply, with why: dead-lettered before the batch commits.
        held_topics: Topics whose records it could not apply at all: their partitions keep their
            stored offsets (they are read again later), the rest of the batch commits.
        start: The stored position of each partition the batch read (for the sink's records of where
            a failure began).
        group_id: The consumer group committing the batch.
        ranges: The offsets the batch read, [first, end) per partition.
        fetch: Reads those records from Kafka again (`RecordFetcher`): isolation tells records apart
            by them, so the common path keeps none of the messages it decoded.
    """

    isolate: bool = False
    rejected: list[tuple[Any, InvalidEvent]] = field(default_factory=list)
    held_topics: set[str] = field(default_factory=set)
    start: dict[tuple[str, int], int | None] = field(default_factory=dict)
    group_id: str = ""
    ranges: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    fetch: RecordFetcher | None = None


class RecordFetcher(Protocol):
    """Reads records from Kafka again: for each (topic, partition), those in [first, end), in offset order."""

    def __call__(self, ranges: dict[tuple[str, int], tuple[int, int]]) -> dict[tuple[str, int], list[Any]]:
        """The records of the ranges (confluent_kafka Messages)."""
        ...


class Sink(Protocol):
    """Where a pipeline's decoded records go: written inside the checkpoint's transaction."""

    def apply(self, conn: psycopg.Connection, payload: Any, outcome: ApplyOutcome) -> int:
        """Write one batch's decoded payload (what the pipeline's decoder made); returns the changes made.

        With `outcome.isolate` a sink that can confine failures does so and reports them in `outcome`;
        one that cannot raises as on the first attempt.
        """
        ...

    def reset(self) -> None:
        """Forget per-session state (temporary tables, caches) after a rollback or a new connection."""
        ...

    def housekeeping(self, conn: psycopg.Connection) -> None:
        """Periodic upkeep inside its own transaction (e.g. retention of time buckets)."""
        ...


@dataclass
class Batch:
    """What one poll produced: the decoded payload, dead-letter counts, and the offsets it spans."""

    payload: Any = None  # what the sink's apply() takes, made by the pipeline's decoder
    size: int = 0  # records in the payload
    dead_letters: Counter[tuple[str, str]] = field(default_factory=Counter)  # (topic, reason) -> n
    counts: dict[str, int] = field(default_factory=dict)  # records in the payload, per topic
    start: dict[TopicPartition, int | None] = field(default_factory=dict)  # stored position expected
    first: dict[TopicPartition, int] = field(default_factory=dict)  # offset of the batch's first record
    end: dict[TopicPartition, int] = field(default_factory=dict)  # next offset after the batch
    # The Kafka timestamp (ms) of each partition's last record in the batch: how fresh it leaves the views.
    event_ms: dict[TopicPartition, int] = field(default_factory=dict)
    # Set by a commit in isolation (its first attempt was rolled back): the topics the sink held back
    # (their partitions were not advanced).
    isolated: bool = False
    held_topics: set[str] = field(default_factory=set)

    @property
    def consumed(self) -> int:
        """Records consumed that carried something: valid or dead-lettered (tombstones are not counted)."""
        return self.size + sum(self.dead_letters.values())


def partition_lag(low: int, high: int, next_offset: int | None) -> int:
    """Records a group has still to read in a partition: from its next offset (or the low watermark) to the high one.

    Records below the low watermark are gone (retention), so they never count.
    """
    start = low if next_offset is None else max(next_offset, low)
    return max(0, high - start)


class Checkpoint:
    """Owns the transaction that applies a batch and stores its offsets."""

    def __init__(
        self,
        conninfo: str,
        group_id: str,
        sink: Sink,
        dead_letters: DeadLetterSender | None = None,
        fetch: RecordFetcher | None = None,
    ) -> None:
        self.conninfo = conninfo
        self.group_id = group_id
        self.sink = sink
        self.dead_letters = dead_letters
        self.fetch = fetch
        # Kafka's id of each topic being consumed, stored with the offsets it claims (migration 0019).
        self.topic_ids: dict[str, str] = {}
        self._conn: psycopg.Connection | None = None

    @property
    def conn(self) -> psycopg.Connection:
        """The checkpoint's connection, reopened after a failure."""
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.conninfo)
            self.sink.reset()
        return self._conn

    def stored_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        """Next offsets stored for this group; partitions never committed are absent."""
        with self.conn.transaction():
            rows = self.conn.execute(
                "SELECT topic, partition, next_offset FROM ops.kafka_offsets"
                " WHERE group_id = %s AND (topic, partition) IN (SELECT * FROM unnest(%s::text[], %s::int[]))",
                (self.group_id, [t for t, _ in partitions], [p for _, p in partitions]),
            ).fetchall()
        return {(topic, partition): offset for topic, partition, offset in rows}

    def stored_topic_ids(self, topics: list[str]) -> dict[str, set[str]]:
        """The topic ids the group's offsets were stored for, per topic (ids not known are left out)."""
        with self.conn.transaction():
            rows = self.conn.execute(
                "SELECT DISTINCT topic, topic_id FROM ops.kafka_offsets"
                " WHERE group_id = %s AND topic = ANY(%s) AND topic_id IS NOT NULL",
                (self.group_id, topics),
            ).fetchall()
        stored: dict[str, set[str]] = {}
        for topic, topic_id in rows:
            stored.setdefault(topic, set()).add(topic_id)
        return stored

    def restart_topic(self, topic: str, topic_id: str) -> int:
        """The topic was recreated: its partitions start again from 0, under its new id; returns rows reset."""
        with self.conn.transaction():
            return self.conn.execute(
                "UPDATE ops.kafka_offsets SET next_offset = 0, topic_id = %s, updated_at = now()"
                " WHERE group_id = %s AND topic = %s",
                (topic_id, self.group_id, topic),
            ).rowcount

    def record_topic_ids(self, ids: dict[str, str]) -> None:
        """Note the ids of topics whose offsets were stored before ids were kept."""
        with self.conn.transaction():
            self.conn.execute(
                "UPDATE ops.kafka_offsets AS o SET topic_id = i.id FROM unnest(%s::text[], %s::text[]) AS i (topic, id)"
                " WHERE o.group_id = %s AND o.topic = i.topic AND o.topic_id IS NULL",
                (list(ids), list(ids.values()), self.group_id),
            )

    def stored_event_times(self, partitions: list[TopicPartition]) -> dict[TopicPartition, float]:
        """The newest Kafka timestamp committed per partition, in epoch seconds (absent: none yet)."""
        with self.conn.transaction():
            rows = self.conn.execute(
                "SELECT topic, partition, extract(epoch FROM last_event_at)::float8 FROM ops.kafka_offsets"
                " WHERE group_id = %s AND last_event_at IS NOT NULL"
                " AND (topic, partition) IN (SELECT * FROM unnest(%s::text[], %s::int[]))",
                (self.group_id, [t for t, _ in partitions], [p for _, p in partitions]),
            ).fetchall()
        return {(topic, partition): seconds for topic, partition, seconds in rows}

    def commit(self, batch: Batch) -> int:
        """Apply the batch and store its offsets atomically; returns the changes the sink made.

        1. Begin a transaction.
        2. Lock the batch's offset rows in (topic, partition) order and check each still holds the
           position the batch started from; otherwise raise Fenced (nothing was written).
        3. Hand the records to the sink (views, audit tables), which writes them in this transaction.
        4. In isolation (below), dead-letter the records the sink rejected, and wait for Kafka to
           store them; leave out the partitions of the topics it held back.
        5. Store the next offsets, and the newest Kafka timestamp committed (freshness).
        6. Add the dead-letter counts.
        7. Commit. On any error roll back. A transient error (`is_transient`: the database, a race, a
           fence) is raised: the batch is applied again after a re-seek. Any other error is the
           batch's: it is applied again at once, in isolation, from step 1.
        """
        try:
            return self._attempt(batch, ApplyOutcome())
        except Exception as e:
            if is_transient(e):
                raise
            log.warning(
                "batch failed; applying it again in isolation",
                error=f"{type(e).__name__}: {str(e).strip()}"[:500],
                records=batch.size,
            )
        ranges = {tp: (first, batch.end[tp]) for tp, first in batch.first.items() if tp in batch.end}
        outcome = ApplyOutcome(
            isolate=True, start=dict(batch.start), group_id=self.group_id, ranges=ranges, fetch=self.fetch
        )
        return self._attempt(batch, outcome)

    def _attempt(self, batch: Batch, outcome: ApplyOutcome) -> int:
        conn = self.conn
        try:
            with conn.transaction():
                self._verify_positions(conn, batch)
                changed = self.sink.apply(conn, batch.payload, outcome) if batch.size else 0
                # A held topic's records are read again, its bad ones dead-lettered again then: count them then.
                held = outcome.held_topics
                dead_letters = Counter({k: n for k, n in batch.dead_letters.items() if k[0] not in held})
                if outcome.rejected:
                    self._send_dead_letters(outcome.rejected, dead_letters)
                end = {tp: o for tp, o in batch.end.items() if tp[0] not in held}
                self._store_offsets(conn, end, batch.event_ms)
                self._count_dead_letters(conn, dead_letters)
        except BaseException:
            self.sink.reset()
            if conn.broken:
                self._conn = None
            raise
        if outcome.isolate:
            batch.isolated = True
            batch.dead_letters = dead_letters
            batch.size -= len(outcome.rejected)
            for message, _ in outcome.rejected:
                topic = message.topic()
                if topic in batch.counts:
                    batch.counts[topic] -= 1
            batch.held_topics = set(outcome.held_topics)
            batch.end = end
            for topic in outcome.held_topics:  # read again later: not counted now
                batch.size -= batch.counts.pop(topic, 0)
            batch.event_ms = {tp: ms for tp, ms in batch.event_ms.items() if tp[0] not in outcome.held_topics}
        return changed

    def _send_dead_letters(self, rejected: list[tuple[Any, InvalidEvent]], counts: Counter[tuple[str, str]]) -> None:
        """Records the sink rejected, to their dead-letter topics, stored by Kafka before the commit."""
        if self.dead_letters is None:
            raise StreamviewsError("checkpoint: the sink rejected records and there is no dead-letter producer")
        for message, error in rejected:
            self.dead_letters.send(message, error)
            counts[(message.topic(), error.reason)] += 1
        self.dead_letters.flush()

    def housekeeping(self) -> None:
        """The sink's periodic upkeep, in a transaction of its own."""
        conn = self.conn
        try:
            with conn.transaction():
                self.sink.housekeeping(conn)
        except BaseException:
            self.sink.reset()
            if conn.broken:
                self._conn = None
            raise

    def _verify_positions(self, conn: psycopg.Connection, batch: Batch) -> None:
        parts = sorted(batch.start)
        rows = conn.execute(
            "SELECT topic, partition, next_offset FROM ops.kafka_offsets"
            " WHERE group_id = %s AND (topic, partition) IN (SELECT * FROM unnest(%s::text[], %s::int[]))"
            " ORDER BY topic, partition FOR UPDATE",
            (self.group_id, [t for t, _ in parts], [p for _, p in parts]),
        ).fetchall()
        stored = {(topic, partition): offset for topic, partition, offset in rows}
        # A partition never committed: claim its row. A concurrent claimant waits for our commit and
        # then finds the row taken, which fences it like a moved offset would.
        unclaimed = [tp for tp in parts if batch.start[tp] is None and tp not in stored]
        if unclaimed:
            claimed = conn.execute(
                "INSERT INTO ops.kafka_offsets (group_id, topic, partition, next_offset, topic_id)"
                " SELECT %s, t, p, 0, i FROM unnest(%s::text[], %s::int[], %s::text[]) AS u (t, p, i)"
                " ON CONFLICT DO NOTHING",
                (
                    self.group_id,
                    [t for t, _ in unclaimed],
                    [p for _, p in unclaimed],
                    [self.topic_ids.get(t) for t, _ in unclaimed],
                ),
            ).rowcount
            if claimed != len(unclaimed):
                raise Fenced(f"checkpoint: another consumer started {unclaimed} first")
            stored.update(dict.fromkeys(unclaimed))
        for tp in parts:
            if stored.get(tp) != batch.start[tp]:
                raise Fenced(
                    f"checkpoint: {tp[0]}[{tp[1]}] is at {stored.get(tp)} in PostgreSQL, this batch starts at "
                    f"{batch.start[tp]}: another consumer moved it"
                )

    def _store_offsets(
        self, conn: psycopg.Connection, end: dict[TopicPartition, int], event_ms: dict[TopicPartition, int]
    ) -> None:
        parts = sorted(end)
        if not parts:
            return
        conn.execute(
            "INSERT INTO ops.kafka_offsets (group_id, topic, partition, next_offset, last_event_at)"
            " SELECT %s, t, p, o, to_timestamp(ms / 1000.0)"
            " FROM unnest(%s::text[], %s::int[], %s::bigint[], %s::bigint[]) AS u (t, p, o, ms)"
            " ON CONFLICT (group_id, topic, partition)"
            " DO UPDATE SET next_offset = excluded.next_offset, updated_at = now(),"
            " last_event_at = greatest(ops.kafka_offsets.last_event_at, excluded.last_event_at)",
            (
                self.group_id,
                [t for t, _ in parts],
                [p for _, p in parts],
                [end[tp] for tp in parts],
                [event_ms.get(tp) for tp in parts],
            ),
        )

    def _count_dead_letters(self, conn: psycopg.Connection, dead_letters: Counter[tuple[str, str]]) -> None:
        if not dead_letters:
            return
        keys = sorted(dead_letters)
        conn.execute(
            "INSERT INTO ops.dead_letters (group_id, topic, reason, count)"
            " SELECT %s, * FROM unnest(%s::text[], %s::text[], %s::bigint[])"
            " ON CONFLICT (group_id, topic, reason)"
            " DO UPDATE SET count = ops.dead_letters.count + excluded.count, last_at = now()",
            (self.group_id, [t for t, _ in keys], [r for _, r in keys], [dead_letters[k] for k in keys]),
        )

    def close(self) -> None:
        """Close the connection."""
        if self._conn is not None:
            self._conn.close()
