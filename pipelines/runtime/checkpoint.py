"""Exactly-once into PostgreSQL: a batch's effects and its Kafka offsets commit in one transaction.

Kafka's own committed offsets are not the source of truth: on partition assignment the consumer seeks
to the offsets stored here (`ops.kafka_offsets`, through an `OffsetStore`: pipelines/runtime/offsets.py).
A crash before COMMIT loses the whole batch and it is consumed again; a crash after COMMIT resumes
after it. Either way each event counts once.

A consumer that lost a partition in a rebalance may still be applying a batch for it while the new
owner starts. The offset rows are the fence: each transaction locks them first and checks that they
still hold the position the batch started from (`OffsetStore.claim`); the slower of two writers finds
them moved, rolls back and re-seeks.

A batch that fails for a reason other than the database's availability (a value a view cannot take,
a view that cannot run) is not retried as it was: it is applied again at once in *isolation*, where
the sink confines the failure to the records, views or streams that cause it (see `Sink.apply`).
What the sink rejects there is dead-lettered before the transaction commits, and the partitions of
the topics it holds back keep their stored offsets, so nothing is lost either way.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import psycopg

from pipelines.errors import StreamviewsError
from pipelines.logs import get_logger
from pipelines.runtime.events import InvalidEvent
from pipelines.runtime.offsets import C, Connection, Fenced, OffsetStore, TopicPartition

log = get_logger("checkpoint")

# One decoded record and the Kafka partition it came from, in batch order (per-record decoders).
Record = tuple[int, Any]
# A batch's payload: what a pipeline's decoder makes and its sink applies (the two agree on its type).
P = TypeVar("P")
P_contra = TypeVar("P_contra", contravariant=True)
C_contra = TypeVar("C_contra", bound=Connection, contravariant=True)

__all__ = ["ApplyOutcome", "Batch", "Checkpoint", "Fenced", "Record", "Sink", "is_transient", "partition_lag"]


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


class Sink(Protocol[C_contra, P_contra]):
    """Where a pipeline's decoded records go: written inside the checkpoint's transaction.

    Typed by its connection (psycopg's, or the in-memory double's) and its payload: a `Pipeline`
    takes a decoder and a sink of the same payload type.
    """

    def apply(self, conn: C_contra, payload: P_contra, outcome: ApplyOutcome) -> int:
        """Write one batch's decoded payload (what the pipeline's decoder made); returns the changes made.

        With `outcome.isolate` a sink that can confine failures does so and reports them in `outcome`;
        one that cannot raises as on the first attempt.
        """
        ...

    def reset(self) -> None:
        """Forget per-session state (temporary tables, caches) after a rollback or a new connection."""
        ...

    def housekeeping(self, conn: C_contra) -> None:
        """Periodic upkeep inside its own transaction (e.g. retention of time buckets)."""
        ...


@dataclass
class Batch(Generic[P]):
    """What one poll produced: the decoded payload, dead-letter counts, and the offsets it spans."""

    payload: P | None = None  # what the sink's apply() takes, made by the pipeline's decoder
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


class Checkpoint(Generic[C, P]):
    """Owns the transaction that applies a batch and stores its offsets (in `offsets`, the group's store)."""

    def __init__(
        self,
        offsets: OffsetStore[C],
        sink: Sink[C, P],
        dead_letters: DeadLetterSender | None = None,
        fetch: RecordFetcher | None = None,
    ) -> None:
        self.offsets = offsets
        self.group_id = offsets.group_id
        self.sink = sink
        self.dead_letters = dead_letters
        self.fetch = fetch
        # Kafka's id of each topic being consumed, stored with the offsets it claims (migration 0019).
        self.topic_ids: dict[str, str] = {}
        self._conn: C | None = None

    @property
    def conn(self) -> C:
        """The checkpoint's connection, reopened after a failure."""
        if self._conn is None or self._conn.closed:
            self._conn = self.offsets.connect()
            self.sink.reset()
        return self._conn

    def stored_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        """Next offsets stored for this group; partitions never committed are absent."""
        with self.conn.transaction():
            return self.offsets.read(self.conn, partitions)

    def stored_topic_ids(self, topics: list[str]) -> dict[str, set[str]]:
        """The topic ids the group's offsets were stored for, per topic (ids not known are left out)."""
        with self.conn.transaction():
            return self.offsets.topic_ids(self.conn, topics)

    def restart_topic(self, topic: str, topic_id: str) -> int:
        """The topic was recreated: its partitions start again from 0, under its new id; returns rows reset."""
        with self.conn.transaction():
            return self.offsets.restart_topic(self.conn, topic, topic_id)

    def forget_topic(self, topic: str) -> int:
        """The topic was recreated and starts by a rule: its rows are deleted; returns how many."""
        with self.conn.transaction():
            return self.offsets.forget_topic(self.conn, topic)

    def begin(self, offsets: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """Store where never-committed partitions start; returns what is stored for them now (ours, or a rival's)."""
        with self.conn.transaction():
            self.offsets.begin(self.conn, offsets, self.topic_ids)
            return self.offsets.read(self.conn, list(offsets))

    def record_topic_ids(self, ids: dict[str, str]) -> None:
        """Note the ids of topics whose offsets were stored before ids were kept."""
        with self.conn.transaction():
            self.offsets.record_topic_ids(self.conn, ids)

    def stored_event_times(self, partitions: list[TopicPartition]) -> dict[TopicPartition, float]:
        """The newest Kafka timestamp committed per partition, in epoch seconds (absent: none yet)."""
        with self.conn.transaction():
            return self.offsets.event_times(self.conn, partitions)

    def commit(self, batch: Batch[P]) -> int:
        """Apply the batch and store its offsets atomically; returns the changes the sink made.

        1. Begin a transaction.
        2. Lock the batch's offset rows in (topic, partition) order and check each still holds the
           position the batch started from (`OffsetStore.claim`); otherwise raise Fenced (nothing was
           written).
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

    def _attempt(self, batch: Batch[P], outcome: ApplyOutcome) -> int:
        conn = self.conn
        try:
            with conn.transaction():
                self.offsets.claim(conn, batch.start, self.topic_ids)
                payload = batch.payload
                changed = self.sink.apply(conn, payload, outcome) if batch.size and payload is not None else 0
                # A held topic's records are read again, its bad ones dead-lettered again then: count them then.
                held = outcome.held_topics
                dead_letters = Counter({k: n for k, n in batch.dead_letters.items() if k[0] not in held})
                if outcome.rejected:
                    self._send_dead_letters(outcome.rejected, dead_letters)
                end = {tp: o for tp, o in batch.end.items() if tp[0] not in held}
                self.offsets.advance(conn, end, batch.event_ms)
                self.offsets.count_dead_letters(conn, dead_letters)
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

    def close(self) -> None:
        """Close the connection."""
        if self._conn is not None:
            self._conn.close()
