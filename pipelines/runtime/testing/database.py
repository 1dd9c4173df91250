"""An in-memory database for unit tests: the offsets' store and the sink's tables, with transactions."""

# ruff: noqa: D102 (the doubles' methods are those of the interfaces they implement, documented there)
from __future__ import annotations

import copy
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pipelines.runtime.offsets import TopicPartition as TopicPartitionKey
from pipelines.runtime.offsets import check_positions


class Killed(BaseException):
    """The process died here: nothing catches it, nothing after it runs."""


class MemoryDatabase:
    """Tables as dicts and lists; a transaction is a snapshot, restored when its block raises.

    One transaction at a time (a lock held from its start to its end): as coarse as locking every
    row, which is what makes two checkpoints' races deterministic here. `kill_at_commit` makes the
    next commit die before it reaches the database.
    """

    def __init__(self) -> None:
        self.tables: dict[str, Any] = {"kafka_offsets": {}, "dead_letters": Counter()}
        self.lock = threading.RLock()
        self.waiting: set[MemoryConnection] = set()  # connections whose transaction waits for the lock
        self._kill_at_commit = False

    def connect(self) -> MemoryConnection:
        """A new connection."""
        return MemoryConnection(self)

    def kill_at_commit(self) -> None:
        """The next outermost transaction to end is lost, and `Killed` raised, as a process killed before COMMIT."""
        self._kill_at_commit = True


class MemoryConnection:
    """A connection to a `MemoryDatabase` (the checkpoint's and the sink's `conn`)."""

    def __init__(self, db: MemoryDatabase) -> None:
        self.db = db
        self.closed = self.broken = False
        self._depth = 0

    @contextmanager
    def transaction(self) -> Iterator[MemoryConnection]:
        """A transaction (a savepoint when nested): rolled back when its block raises."""
        if not self.db.lock.acquire(blocking=False):
            self.db.waiting.add(self)
            self.db.lock.acquire()
            self.db.waiting.discard(self)
        try:
            snapshot = copy.deepcopy(self.db.tables)
            self._depth += 1
            try:
                yield self
                if self._depth == 1 and self.db._kill_at_commit:
                    self.db._kill_at_commit = False
                    raise Killed("killed between apply and commit")
            except BaseException:
                self.db.tables = snapshot
                raise
            finally:
                self._depth -= 1
        finally:
            self.db.lock.release()

    @property
    def waiting(self) -> bool:
        """True while its transaction waits for another's to end (PostgreSQL's pg_blocking_pids)."""
        return self in self.db.waiting

    @property
    def tables(self) -> dict[str, Any]:
        """The database's tables (read and written inside a transaction)."""
        return self.db.tables

    def close(self) -> None:
        self.closed = True


class MemoryOffsets:
    """An `OffsetStore` in a `MemoryDatabase`: the rules of `PostgresOffsets` over dicts."""

    def __init__(self, db: MemoryDatabase, group_id: str = "test-group") -> None:
        self.db, self.group_id = db, group_id

    def connect(self) -> MemoryConnection:
        return self.db.connect()

    def _rows(self, conn: MemoryConnection) -> dict[TopicPartitionKey, dict[str, Any]]:
        return conn.tables["kafka_offsets"].setdefault(self.group_id, {})

    def read(self, conn: MemoryConnection, partitions: list[TopicPartitionKey]) -> dict[TopicPartitionKey, int]:
        rows = self._rows(conn)
        return {tp: rows[tp]["next_offset"] for tp in partitions if tp in rows}

    def claim(
        self, conn: MemoryConnection, start: dict[TopicPartitionKey, int | None], topic_ids: dict[str, str]
    ) -> None:
        rows = self._rows(conn)  # locked: the database runs one transaction at a time
        stored: dict[TopicPartitionKey, int | None] = {tp: rows[tp]["next_offset"] for tp in start if tp in rows}
        for tp in sorted(start):
            if start[tp] is None and tp not in stored:  # never committed: claim it
                rows[tp] = {"next_offset": 0, "topic_id": topic_ids.get(tp[0]), "last_event_ms": None}
                stored[tp] = None
        check_positions(start, stored)

    def advance(
        self, conn: MemoryConnection, end: dict[TopicPartitionKey, int], event_ms: dict[TopicPartitionKey, int]
    ) -> None:
        rows = self._rows(conn)
        for tp, offset in end.items():
            row = rows.setdefault(tp, {"next_offset": 0, "topic_id": None, "last_event_ms": None})
            row["next_offset"] = offset
            if tp in event_ms:
                row["last_event_ms"] = max(event_ms[tp], row["last_event_ms"] or event_ms[tp])

    def count_dead_letters(self, conn: MemoryConnection, counts: Counter[tuple[str, str]]) -> None:
        for (topic, reason), n in counts.items():
            conn.tables["dead_letters"][(self.group_id, topic, reason)] += n

    def event_times(
        self, conn: MemoryConnection, partitions: list[TopicPartitionKey]
    ) -> dict[TopicPartitionKey, float]:
        rows = self._rows(conn)
        return {
            tp: rows[tp]["last_event_ms"] / 1000
            for tp in partitions
            if tp in rows and rows[tp]["last_event_ms"] is not None
        }

    def topic_ids(self, conn: MemoryConnection, topics: list[str]) -> dict[str, set[str]]:
        stored: dict[str, set[str]] = {}
        for (topic, _), row in self._rows(conn).items():
            if topic in topics and row["topic_id"] is not None:
                stored.setdefault(topic, set()).add(row["topic_id"])
        return stored

    def restart_topic(self, conn: MemoryConnection, topic: str, topic_id: str) -> int:
        rows = [row for (t, _), row in self._rows(conn).items() if t == topic]
        for row in rows:
            row.update(next_offset=0, topic_id=topic_id)
        return len(rows)

    def forget_topic(self, conn: MemoryConnection, topic: str) -> int:
        rows = self._rows(conn)
        forgotten = [tp for tp in rows if tp[0] == topic]
        for tp in forgotten:
            del rows[tp]
        return len(forgotten)

    def begin(self, conn: MemoryConnection, offsets: dict[TopicPartitionKey, int], topic_ids: dict[str, str]) -> None:
        rows = self._rows(conn)
        for tp, offset in sorted(offsets.items()):
            rows.setdefault(tp, {"next_offset": offset, "topic_id": topic_ids.get(tp[0]), "last_event_ms": None})

    def record_topic_ids(self, conn: MemoryConnection, ids: dict[str, str]) -> None:
        for (topic, _), row in self._rows(conn).items():
            if topic in ids and row["topic_id"] is None:
                row["topic_id"] = ids[topic]

    def stored(self) -> dict[TopicPartitionKey, int]:
        """Every committed position of the group (for a test's assertions)."""
        with self.db.lock:
            return {
                tp: row["next_offset"] for tp, row in self.db.tables["kafka_offsets"].get(self.group_id, {}).items()
            }
