"""Where a topic's first consumption starts (pipelines/runtime/starts.py), over the in-memory doubles.

Nothing stored: the rule's offsets, resolved once and stored before anything is consumed. Stored:
the stored offsets, whatever the rule says. A process killed before its first commit restarts
where the first one resolved, not where the rule would point now.
"""

from __future__ import annotations

import pytest

from pipelines.runtime.testing import (
    Killed,
    MemoryBroker,
    MemoryDatabase,
    MemoryOffsets,
    MemorySink,
    memory_pipeline,
    run_until_caught_up,
)

T0 = 1_795_341_600_000  # the first set's Kafka timestamp (ms)
T1 = T0 + 60_000  # the second set's


@pytest.fixture
def broker() -> MemoryBroker:
    """A topic 'likes' of two partitions holding a, b (at T0) then c (at T1) in partition 0, d (T0) in 1."""
    broker = MemoryBroker()
    broker.create_topic("likes", partitions=2)
    broker.produce("likes", [b"a", b"b"], partition=0, timestamp_ms=T0)
    broker.produce("likes", [b"c"], partition=0, timestamp_ms=T1)
    broker.produce("likes", [b"d"], partition=1, timestamp_ms=T0)
    return broker


@pytest.fixture
def db() -> MemoryDatabase:
    return MemoryDatabase()


def stored(db: MemoryDatabase) -> dict[tuple[str, int], int]:
    return MemoryOffsets(db, "test-group").stored()


def test_earliest_reads_every_retained_record_as_before(broker, db):
    sink = MemorySink()

    run_until_caught_up(memory_pipeline(broker, db, sink, topics=["likes"], starts={"likes": "earliest"}))

    assert sink.rows(db) == [(0, b"a"), (0, b"b"), (0, b"c"), (1, b"d")]
    assert broker.offset_requests == 0  # nothing to resolve: librdkafka starts at the beginning itself


def test_latest_reads_only_what_is_produced_after_the_first_assignment(broker, db):
    sink = MemorySink()
    pipeline = memory_pipeline(broker, db, sink, topics=["likes"], starts={"likes": "latest"})

    run_until_caught_up(pipeline)
    assert stored(db) == {("likes", 0): 3, ("likes", 1): 1}  # stored before anything was consumed
    broker.produce("likes", [b"e"], partition=1)
    run_until_caught_up(pipeline)

    assert sink.rows(db) == [(1, b"e")]


def test_a_time_starts_each_partition_at_its_first_record_at_or_after_it(broker, db):
    sink = MemorySink()

    run_until_caught_up(memory_pipeline(broker, db, sink, topics=["likes"], starts={"likes": T1}))

    # Partition 1 has nothing at or after T1: it starts at its end, the next record produced.
    assert sink.rows(db) == [(0, b"c")]
    assert stored(db) == {("likes", 0): 3, ("likes", 1): 1}


def test_offsets_stored_win_over_the_rule(broker, db):
    first = MemorySink()
    run_until_caught_up(memory_pipeline(broker, db, first, topics=["likes"]))  # earliest: all four
    broker.produce("likes", [b"e"], partition=0)
    again = MemorySink(table="again")

    run_until_caught_up(memory_pipeline(broker, db, again, topics=["likes"], starts={"likes": "latest"}))

    assert again.rows(db) == [(0, b"e")]  # resumed from the stored offsets, not from the end


def test_a_process_killed_before_its_first_commit_restarts_where_the_first_resolved(broker, db):
    sink = MemorySink()
    pipeline = memory_pipeline(broker, db, sink, topics=["likes"], starts={"likes": "latest"})
    pipeline.step()  # assigned: 'latest' resolved and stored
    broker.produce("likes", [b"e"], partition=0)  # after the resolution, before any commit
    db.kill_at_commit()
    with pytest.raises(Killed):
        run_until_caught_up(pipeline)
    broker.produce("likes", [b"f"], partition=1)

    restarted = memory_pipeline(broker, db, sink, topics=["likes"], starts={"likes": "latest"})
    run_until_caught_up(restarted)

    # Not resolved again (which would skip e): the restart starts where the first process did.
    assert sink.rows(db) == [(0, b"e"), (1, b"f")]


def test_a_partition_already_started_by_another_consumer_keeps_its_offset(broker, db):
    offsets = MemoryOffsets(db, "test-group")
    with db.connect().transaction() as conn:
        offsets.begin(conn, {("likes", 0): 1}, {})  # another member resolved partition 0 first
    sink = MemorySink()

    run_until_caught_up(memory_pipeline(broker, db, sink, topics=["likes"], starts={"likes": "latest"}))

    assert sink.rows(db) == [(0, b"b"), (0, b"c")]
    assert stored(db) == {("likes", 0): 3, ("likes", 1): 1}


def test_a_partition_added_to_the_topic_later_starts_by_the_rule_too(broker, db):
    sink = MemorySink()
    run_until_caught_up(memory_pipeline(broker, db, sink, topics=["likes"], starts={"likes": "latest"}))
    broker.produce("likes", [b"x", b"y"], partition=2)  # a new partition, with records before it is assigned

    run_until_caught_up(memory_pipeline(broker, db, sink, topics=["likes"], starts={"likes": "latest"}))

    assert sink.rows(db) == []
    assert stored(db)[("likes", 2)] == 2


def test_a_recreated_topic_with_a_rule_follows_it_again(broker, db):
    sink = MemorySink()
    run_until_caught_up(memory_pipeline(broker, db, sink, topics=["likes"], starts={"likes": "latest"}))
    del broker.topics["likes"]
    broker.create_topic("likes", partitions=2)  # a new id
    broker.produce("likes", [b"old-1", b"old-2"], partition=0)

    pipeline = memory_pipeline(broker, db, sink, topics=["likes"], starts={"likes": "latest"})
    run_until_caught_up(pipeline)
    broker.produce("likes", [b"new"], partition=0)
    run_until_caught_up(pipeline)

    assert sink.rows(db) == [(0, b"new")]
