"""Exactly-once into PostgreSQL: a batch's effects and its Kafka offsets commit in one transaction.

Kafka's own committed offsets are not the source of truth: on partition assignment the consumer seeks
to the offsets stored here (`ops.kafka_offsets`). A crash before COMMIT loses the whole batch and it is
consumed again; a crash after COMMIT resumes after it. Either way each event counts once.

A consumer that lost a partition in a rebalance may still be applying a batch for it while the new
owner starts. The offset rows are the fence: each transaction locks them first and checks that they
still hold the position the batch started from; the slower of two writers finds them moved, rolls
back and re-seeks.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

import psycopg

from pipelines.errors import StreamviewsError
from pipelines.logs import get_logger

log = get_logger("checkpoint")

TopicPartition = tuple[str, int]
# One decoded record and the Kafka partition it came from, in batch order (per-record decoders).
Record = tuple[int, Any]


class Fenced(StreamviewsError):
    """Stored offsets moved under us: another consumer owns (or owned) the partition."""


class Sink(Protocol):
    """Where a pipeline's decoded records go: written inside the checkpoint's transaction."""

    def apply(self, conn: psycopg.Connection, payload: Any) -> int:
        """Write one batch's decoded payload (what the pipeline's decoder made); returns the changes made."""
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
    end: dict[TopicPartition, int] = field(default_factory=dict)  # next offset after the batch
    # The Kafka timestamp (ms) of each partition's last record in the batch: how fresh it leaves the views.
    event_ms: dict[TopicPartition, int] = field(default_factory=dict)

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

    def __init__(self, conninfo: str, group_id: str, sink: Sink) -> None:
        self.conninfo = conninfo
        self.group_id = group_id
        self.sink = sink
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
        4. Store the next offsets, and the newest Kafka timestamp committed (freshness).
        5. Add the dead-letter counts.
        6. Commit. On any error roll back, so the batch is applied again after a re-seek or not at all.
        """
        conn = self.conn
        try:
            with conn.transaction():
                self._verify_positions(conn, batch)
                changed = self.sink.apply(conn, batch.payload) if batch.size else 0
                self._store_offsets(conn, batch)
                self._count_dead_letters(conn, batch)
        except BaseException:
            self.sink.reset()
            if conn.broken:
                self._conn = None
            raise
        return changed

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
                "INSERT INTO ops.kafka_offsets (group_id, topic, partition, next_offset)"
                " SELECT %s, *, 0 FROM unnest(%s::text[], %s::int[]) ON CONFLICT DO NOTHING",
                (self.group_id, [t for t, _ in unclaimed], [p for _, p in unclaimed]),
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

    def _store_offsets(self, conn: psycopg.Connection, batch: Batch) -> None:
        parts = sorted(batch.end)
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
                [batch.end[tp] for tp in parts],
                [batch.event_ms.get(tp) for tp in parts],
            ),
        )

    def _count_dead_letters(self, conn: psycopg.Connection, batch: Batch) -> None:
        if not batch.dead_letters:
            return
        keys = sorted(batch.dead_letters)
        conn.execute(
            "INSERT INTO ops.dead_letters (group_id, topic, reason, count)"
            " SELECT %s, * FROM unnest(%s::text[], %s::text[], %s::bigint[])"
            " ON CONFLICT (group_id, topic, reason)"
            " DO UPDATE SET count = ops.dead_letters.count + excluded.count, last_at = now()",
            (self.group_id, [t for t, _ in keys], [r for _, r in keys], [batch.dead_letters[k] for k in keys]),
        )

    def close(self) -> None:
        """Close the connection."""
        if self._conn is not None:
            self._conn.close()
