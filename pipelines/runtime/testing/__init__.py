"""In-memory doubles of the runtime's seams, for unit tests: topics, the offsets' database, a sink.

Bytewax's `bytewax.testing` is the model. A test builds a real `Pipeline` (pipelines/runtime/consumer.py)
over a `MemoryBroker` (its `KafkaClients`) and a `MemoryDatabase`'s `MemoryOffsets` (its `OffsetStore`),
produces records partition by partition, runs it with `run_until_caught_up`, and reads what the
`MemorySink` committed. Nothing here doubles Kafka's or PostgreSQL's wire protocol: the doubles
implement the runtime's own interfaces, and what they promise is checked against the real ones by
the specifications run on both (tests/fence_spec.py against PostgreSQL in
tests/integration/test_fence_postgresql.py).

Failures are injected where they happen in production:
- `MemorySink.fail_at(n)` loses the connection in the middle of a batch's apply (n records
  written): the transaction rolls back, the pipeline re-seeks and reads the batch again;
- `MemorySink.poison` names records it cannot apply: the batch is applied again in isolation, where
  they are dead-lettered and the rest committed;
- `MemoryDatabase.kill_at_commit()` kills the "process" between apply and commit: `Killed` (a
  BaseException, like a SIGKILL nothing handles) leaves the runner, the transaction is lost, and a
  new `Pipeline` over the same broker and database is the restarted process.

Example:
    broker, db = MemoryBroker(), MemoryDatabase()
    broker.produce("likes", [b"a", b"b"], partition=0)
    sink = MemorySink()
    pipeline = memory_pipeline(broker, db, sink, topics=["likes"])
    run_until_caught_up(pipeline)
    assert sink.rows(db) == [(0, b"a"), (0, b"b")]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from pipelines.runtime.checkpoint import ApplyOutcome
from pipelines.runtime.consumer import BatchDecoder, Pipeline, per_record
from pipelines.runtime.events import InvalidEvent
from pipelines.runtime.starts import Start
from pipelines.runtime.testing.database import Killed, MemoryConnection, MemoryDatabase, MemoryOffsets
from pipelines.runtime.testing.kafka import MemoryBroker, MemoryConsumer, MemoryMessage
from pipelines.settings import PipelineSettings

# The payload of a `MemorySink`: each record's value with its partition, as `per_record` makes it.
Rows = list[tuple[int, Any]]


@dataclass
class MemorySink:
    """A `Sink` appending each record (partition, value) to a table of the `MemoryDatabase`, in the batch's transaction.

    Attributes:
        table: Where it writes (two sinks of one database write apart with two names).
        label: Written beside each record: which generation of a runner wrote it.
        poison: Records it cannot apply (a view's error, say): it raises on them, and in isolation
            rejects them (they are dead-lettered) and applies the rest.
        applies: Calls of `apply` so far, committed or not.
    """

    table: str = "sink"
    label: str = ""
    poison: Callable[[Any], bool] = lambda _record: False
    applies: int = 0
    _fail_at: int | None = None
    _resets: int = field(default=0, repr=False)

    def fail_at(self, written: int) -> None:
        """The next apply loses its connection after writing `written` records of its batch.

        A transient failure (the database's, not the batch's): the transaction rolls back, and the
        pipeline re-seeks to the stored offsets and reads the batch again.
        """
        self._fail_at = written

    def apply(self, conn: MemoryConnection, payload: Rows, outcome: ApplyOutcome) -> int:
        """Append the records; see the attributes for the failures it is told to make."""
        self.applies += 1
        table = conn.tables.setdefault(self.table, [])
        if outcome.isolate and outcome.fetch is not None:
            return self._isolated(table, outcome)
        for index, (partition, record) in enumerate(payload):
            if index == self._fail_at:
                self._fail_at = None
                raise psycopg.OperationalError(f"sink {self.table}: connection lost after {index} records")
            if self.poison(record):
                raise ValueError(f"sink {self.table}: cannot apply {record!r}")
            table.append((self.label, partition, record) if self.label else (partition, record))
        return len(payload)

    def _isolated(self, table: list[Any], outcome: ApplyOutcome) -> int:
        """The batch's records read back, the poisonous ones rejected with reason `view_error`."""
        assert outcome.fetch is not None
        applied = 0
        for (_, partition), messages in sorted(outcome.fetch(outcome.ranges).items()):
            for message in messages:
                record = message.value()
                if self.poison(record):
                    outcome.rejected.append((message, InvalidEvent("view_error", f"cannot apply {record!r}")))
                    continue
                table.append((self.label, partition, record) if self.label else (partition, record))
                applied += 1
        return applied

    def reset(self) -> None:
        """Count the resets (after each rollback or new connection)."""
        self._resets += 1

    def housekeeping(self, conn: MemoryConnection) -> None:
        """Nothing periodic."""

    def rows(self, db: MemoryDatabase) -> list[Any]:
        """What it committed, in order."""
        with db.lock:
            return list(db.tables.get(self.table, []))


def identity(key: bytes | None, value: bytes | None, timestamp_ms: int) -> bytes | None:
    """A record decoder keeping the value as it is (None: a tombstone, applied nowhere)."""
    return value


def memory_pipeline(
    broker: MemoryBroker,
    db: MemoryDatabase,
    sink: MemorySink,
    *,
    topics: list[str],
    group_id: str = "test-group",
    name: str = "",
    decode: BatchDecoder[Rows] | None = None,
    batch_max: int = 100,
    starts: dict[str, Start] | None = None,
) -> Pipeline[MemoryConnection, Rows]:
    """A real `Pipeline` over the doubles, subscribed to `topics` (one runner process: build another to restart).

    Its name (in its metrics) is `name`, by default `memory-<group_id>`; it decodes with `decode`, by
    default each record's value as it is; `starts` are its topics' start rules (default: earliest).
    """
    settings = PipelineSettings(batch_max=batch_max, batch_wait_ms=1, report_interval_s=3600, expire_interval_s=3600)
    pipeline: Pipeline[MemoryConnection, Rows] = Pipeline(
        name or f"memory-{group_id}",
        decode=decode or per_record(identity),
        sink=sink,
        clients=broker,
        offsets=MemoryOffsets(db, group_id),
        settings=settings,
    )
    pipeline.sleep = lambda _seconds: None  # its back-offs are not waited out
    pipeline.starts = dict(starts or {})
    pipeline.subscribe(topics)
    return pipeline


def run_until_caught_up(pipeline: Pipeline[Any, Any], max_steps: int = 1000) -> None:
    """Step the pipeline until every record of its partitions is read and committed (or `Killed` escapes)."""
    consumer = pipeline.consumer
    assert isinstance(consumer, MemoryConsumer), "run_until_caught_up steps a pipeline over a MemoryBroker"
    for _ in range(max_steps):
        pipeline.step()
        # A failed commit re-seeks: then there is more to read.
        if consumer.caught_up and pipeline.settle() and consumer.caught_up:
            return
    raise AssertionError(f"{pipeline.name} did not catch up in {max_steps} steps")


__all__ = [
    "Killed",
    "MemoryBroker",
    "MemoryConnection",
    "MemoryDatabase",
    "MemoryMessage",
    "MemoryOffsets",
    "MemorySink",
    "memory_pipeline",
    "run_until_caught_up",
]
