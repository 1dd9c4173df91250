"""Where a consumer group stands in each partition, stored in PostgreSQL: the truth it resumes from, and its fence.

`Checkpoint` (pipelines/runtime/checkpoint.py) owns the transaction; an `OffsetStore` runs the
statements on the group's rows inside it. `PostgresOffsets` is the real one (`ops.kafka_offsets`,
`ops.dead_letters`); `pipelines.runtime.testing.MemoryOffsets` keeps the same rows in memory, and
the same specification (tests/fence_spec.py) runs against both, so the double cannot drift.

The fence (`claim`): two runner generations may hold one partition for a while during a
rebalance, each with a batch starting where it last read. Whoever locks the partition's row first
and finds it at its batch's start commits and moves it; the other then finds it moved (or, for a
partition never committed, claimed) and is `Fenced`, having written nothing.
"""

from __future__ import annotations

from collections import Counter
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

import psycopg

from pipelines.errors import StreamviewsError

TopicPartition = tuple[str, int]


class Fenced(StreamviewsError):
    """Stored offsets moved under us: another consumer owns (or owned) the partition."""


class Connection(Protocol):
    """What the checkpoint asks of a connection itself (psycopg.Connection's members)."""

    @property
    def closed(self) -> bool:
        """True once closed."""
        ...

    @property
    def broken(self) -> bool:
        """True when lost (not closed by us): it is reopened."""
        ...

    def transaction(self) -> AbstractContextManager[Any]:
        """A transaction, or a savepoint inside one; rolled back when its block raises."""
        ...

    def close(self) -> None:
        """Close it."""
        ...


C = TypeVar("C", bound=Connection)


class OffsetStore(Protocol[C]):
    """The stored positions of one consumer group (`group_id`); every call runs inside the caller's transaction."""

    group_id: str

    def connect(self) -> C:
        """A new connection to where the offsets (and the sink's tables) are."""
        ...

    def read(self, conn: C, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        """Next offsets stored; partitions never committed are absent."""
        ...

    def claim(self, conn: C, start: dict[TopicPartition, int | None], topic_ids: dict[str, str]) -> None:
        """The fence: lock the partitions' rows (in order) and check each holds the batch's `start`.

        A partition never committed (`start` None) is claimed by inserting its row (at 0, with its
        topic's id). Raises Fenced when a row moved or another claimant came first; then nothing of
        the batch may be written, and the caller rolls back.
        """
        ...

    def advance(self, conn: C, end: dict[TopicPartition, int], event_ms: dict[TopicPartition, int]) -> None:
        """Store the next offsets, and the newest Kafka timestamp committed per partition (freshness)."""
        ...

    def count_dead_letters(self, conn: C, counts: Counter[tuple[str, str]]) -> None:
        """Add dead letters per (topic, reason)."""
        ...

    def event_times(self, conn: C, partitions: list[TopicPartition]) -> dict[TopicPartition, float]:
        """The newest Kafka timestamp committed per partition, in epoch seconds (absent: none yet)."""
        ...

    def topic_ids(self, conn: C, topics: list[str]) -> dict[str, set[str]]:
        """The topic ids the offsets were stored for, per topic (ids not known are left out)."""
        ...

    def restart_topic(self, conn: C, topic: str, topic_id: str) -> int:
        """The topic was recreated: its partitions start again from 0 under its new id; returns rows reset."""
        ...

    def forget_topic(self, conn: C, topic: str) -> int:
        """The topic was recreated and has a start rule (pipelines/runtime/starts.py): delete its rows, say how many.

        Its partitions are then never committed, and resolved again; a batch of the old topic still
        in flight finds its row gone and is Fenced.
        """
        ...

    def begin(self, conn: C, offsets: dict[TopicPartition, int], topic_ids: dict[str, str]) -> None:
        """Store where partitions never committed start (resolved by their start rule), with their topics' ids.

        A partition that has a row already keeps it (another consumer resolved it first, or committed).
        """
        ...

    def record_topic_ids(self, conn: C, ids: dict[str, str]) -> None:
        """Note the ids of topics whose offsets were stored before ids were kept."""
        ...


class PostgresOffsets:
    """The group's rows of `ops.kafka_offsets` and `ops.dead_letters` (migrations 0001, 0019)."""

    def __init__(self, conninfo: str, group_id: str) -> None:
        self.conninfo, self.group_id = conninfo, group_id

    def connect(self) -> psycopg.Connection:
        """A new connection of the pipeline's role."""
        return psycopg.connect(self.conninfo)

    def read(self, conn: psycopg.Connection, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        """See `OffsetStore.read`."""
        rows = conn.execute(
            "SELECT topic, partition, next_offset FROM ops.kafka_offsets"
            " WHERE group_id = %s AND (topic, partition) IN (SELECT * FROM unnest(%s::text[], %s::int[]))",
            (self.group_id, [t for t, _ in partitions], [p for _, p in partitions]),
        ).fetchall()
        return {(topic, partition): offset for topic, partition, offset in rows}

    def claim(
        self, conn: psycopg.Connection, start: dict[TopicPartition, int | None], topic_ids: dict[str, str]
    ) -> None:
        """See `OffsetStore.claim`: the rows are locked FOR UPDATE, so a second writer waits for the first."""
        parts = sorted(start)
        rows = conn.execute(
            "SELECT topic, partition, next_offset FROM ops.kafka_offsets"
            " WHERE group_id = %s AND (topic, partition) IN (SELECT * FROM unnest(%s::text[], %s::int[]))"
            " ORDER BY topic, partition FOR UPDATE",
            (self.group_id, [t for t, _ in parts], [p for _, p in parts]),
        ).fetchall()
        stored = {(topic, partition): offset for topic, partition, offset in rows}
        # A partition never committed: claim its row. A concurrent claimant waits for our commit and
        # then finds the row taken, which fences it like a moved offset would.
        unclaimed = [tp for tp in parts if start[tp] is None and tp not in stored]
        if unclaimed:
            claimed = self._insert(conn, dict.fromkeys(unclaimed, 0), topic_ids)
            if claimed != len(unclaimed):
                raise Fenced(f"checkpoint: another consumer started {unclaimed} first")
            stored.update(dict.fromkeys(unclaimed))
        check_positions(start, stored)

    def advance(
        self, conn: psycopg.Connection, end: dict[TopicPartition, int], event_ms: dict[TopicPartition, int]
    ) -> None:
        """See `OffsetStore.advance`."""
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

    def count_dead_letters(self, conn: psycopg.Connection, counts: Counter[tuple[str, str]]) -> None:
        """See `OffsetStore.count_dead_letters`."""
        if not counts:
            return
        keys = sorted(counts)
        conn.execute(
            "INSERT INTO ops.dead_letters (group_id, topic, reason, count)"
            " SELECT %s, * FROM unnest(%s::text[], %s::text[], %s::bigint[])"
            " ON CONFLICT (group_id, topic, reason)"
            " DO UPDATE SET count = ops.dead_letters.count + excluded.count, last_at = now()",
            (self.group_id, [t for t, _ in keys], [r for _, r in keys], [counts[k] for k in keys]),
        )

    def event_times(self, conn: psycopg.Connection, partitions: list[TopicPartition]) -> dict[TopicPartition, float]:
        """See `OffsetStore.event_times`."""
        rows = conn.execute(
            "SELECT topic, partition, extract(epoch FROM last_event_at)::float8 FROM ops.kafka_offsets"
            " WHERE group_id = %s AND last_event_at IS NOT NULL"
            " AND (topic, partition) IN (SELECT * FROM unnest(%s::text[], %s::int[]))",
            (self.group_id, [t for t, _ in partitions], [p for _, p in partitions]),
        ).fetchall()
        return {(topic, partition): seconds for topic, partition, seconds in rows}

    def topic_ids(self, conn: psycopg.Connection, topics: list[str]) -> dict[str, set[str]]:
        """See `OffsetStore.topic_ids`."""
        rows = conn.execute(
            "SELECT DISTINCT topic, topic_id FROM ops.kafka_offsets"
            " WHERE group_id = %s AND topic = ANY(%s) AND topic_id IS NOT NULL",
            (self.group_id, topics),
        ).fetchall()
        stored: dict[str, set[str]] = {}
        for topic, topic_id in rows:
            stored.setdefault(topic, set()).add(topic_id)
        return stored

    def restart_topic(self, conn: psycopg.Connection, topic: str, topic_id: str) -> int:
        """See `OffsetStore.restart_topic`."""
        return conn.execute(
            "UPDATE ops.kafka_offsets SET next_offset = 0, topic_id = %s, updated_at = now()"
            " WHERE group_id = %s AND topic = %s",
            (topic_id, self.group_id, topic),
        ).rowcount

    def forget_topic(self, conn: psycopg.Connection, topic: str) -> int:
        """See `OffsetStore.forget_topic`."""
        return conn.execute(
            "DELETE FROM ops.kafka_offsets WHERE group_id = %s AND topic = %s", (self.group_id, topic)
        ).rowcount

    def begin(self, conn: psycopg.Connection, offsets: dict[TopicPartition, int], topic_ids: dict[str, str]) -> None:
        """See `OffsetStore.begin`."""
        if offsets:
            self._insert(conn, offsets, topic_ids)

    def _insert(self, conn: psycopg.Connection, offsets: dict[TopicPartition, int], topic_ids: dict[str, str]) -> int:
        """Rows for partitions that have none, at these offsets, with their topics' ids; returns how many."""
        parts = sorted(offsets)
        return conn.execute(
            "INSERT INTO ops.kafka_offsets (group_id, topic, partition, next_offset, topic_id)"
            " SELECT %s, t, p, o, i FROM unnest(%s::text[], %s::int[], %s::bigint[], %s::text[]) AS u (t, p, o, i)"
            " ON CONFLICT DO NOTHING",
            (
                self.group_id,
                [t for t, _ in parts],
                [p for _, p in parts],
                [offsets[tp] for tp in parts],
                [topic_ids.get(t) for t, _ in parts],
            ),
        ).rowcount

    def record_topic_ids(self, conn: psycopg.Connection, ids: dict[str, str]) -> None:
        """See `OffsetStore.record_topic_ids`."""
        conn.execute(
            "UPDATE ops.kafka_offsets AS o SET topic_id = i.id FROM unnest(%s::text[], %s::text[]) AS i (topic, id)"
            " WHERE o.group_id = %s AND o.topic = i.topic AND o.topic_id IS NULL",
            (list(ids), list(ids.values()), self.group_id),
        )


def check_positions(start: dict[TopicPartition, int | None], stored: dict[TopicPartition, int | None]) -> None:
    """The fence's rule once the rows are locked (every store's): each partition is where the batch starts."""
    for tp in sorted(start):
        if stored.get(tp) != start[tp]:
            raise Fenced(
                f"checkpoint: {tp[0]}[{tp[1]}] is at {stored.get(tp)} in PostgreSQL, this batch starts at "
                f"{start[tp]}: another consumer moved it"
            )
