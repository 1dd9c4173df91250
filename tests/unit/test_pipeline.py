"""The pipeline's guarantees, specified over the in-memory doubles (pipelines/runtime/testing/).

A real `Pipeline` and `Checkpoint` run here; only Kafka and PostgreSQL are doubles of the runtime's
own interfaces. The same guarantees are exercised for real, with kill -9 and several processes, by
tests/integration/test_pipeline_recovery.py; the fence's rules by tests/fence_spec.py on both.
"""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from pipelines.runtime.consumer import per_record
from pipelines.runtime.events import InvalidEvent
from pipelines.runtime.testing import (
    Killed,
    MemoryBroker,
    MemoryDatabase,
    MemoryOffsets,
    MemorySink,
    memory_pipeline,
    run_until_caught_up,
)


@pytest.fixture
def broker() -> MemoryBroker:
    broker = MemoryBroker()
    broker.create_topic("likes", partitions=2)
    return broker


@pytest.fixture
def db() -> MemoryDatabase:
    return MemoryDatabase()


def words_only(key, value, timestamp_ms):
    """A record decoder: a value that is not one word breaks its contract (dead-lettered)."""
    if not value.isalpha():
        raise InvalidEvent("invalid_json", f"not a word: {value!r}")
    return value


def test_every_record_is_applied_once_with_its_partitions_next_offset(broker, db):
    broker.produce("likes", [b"a", b"b"], partition=0)
    broker.produce("likes", [b"c"], partition=1)
    sink = MemorySink()

    run_until_caught_up(memory_pipeline(broker, db, sink, topics=["likes"]))

    assert sink.rows(db) == [(0, b"a"), (0, b"b"), (1, b"c")]
    assert MemoryOffsets(db, "test-group").stored() == {("likes", 0): 2, ("likes", 1): 1}


def test_a_batch_that_fails_halfway_through_its_apply_is_rolled_back_and_read_again(broker, db):
    broker.produce("likes", [b"a", b"b", b"c"], partition=0)
    sink = MemorySink()
    sink.fail_at(2)  # a and b written, then the connection is lost
    pipeline = memory_pipeline(broker, db, sink, topics=["likes"])

    run_until_caught_up(pipeline)

    assert sink.rows(db) == [(0, b"a"), (0, b"b"), (0, b"c")]  # the first attempt's a and b are gone
    assert sink.applies == 2
    assert pipeline.totals == {"batches": 1, "records": 3, "changes": 3, "retries": 1}


def test_a_process_killed_between_apply_and_commit_loses_the_batch_and_its_restart_applies_it_once(broker, db):
    broker.produce("likes", [b"a", b"b"], partition=0)
    sink = MemorySink()
    run_until_caught_up(memory_pipeline(broker, db, sink, topics=["likes"]))
    broker.produce("likes", [b"c", b"d"], partition=0)
    broker.produce("likes", [b"e"], partition=1)

    db.kill_at_commit()
    with pytest.raises(Killed):
        run_until_caught_up(memory_pipeline(broker, db, sink, topics=["likes"]))
    assert sink.rows(db) == [(0, b"a"), (0, b"b")]  # applied, never committed

    run_until_caught_up(memory_pipeline(broker, db, sink, topics=["likes"]))  # the restarted process

    assert sink.rows(db) == [(0, b"a"), (0, b"b"), (0, b"c"), (0, b"d"), (1, b"e")]


def test_a_record_the_sink_cannot_apply_is_dead_lettered_and_the_rest_of_its_batch_committed(broker, db):
    broker.produce("likes", [b"a", b"poison", b"b"], partition=0)
    sink = MemorySink(poison=lambda record: record == b"poison")
    pipeline = memory_pipeline(broker, db, sink, topics=["likes"])

    run_until_caught_up(pipeline)

    assert sink.rows(db) == [(0, b"a"), (0, b"b")]
    [dead_letter] = broker.messages("likes.dlq")
    assert dead_letter.value() == b"poison"
    assert ("dlq.reason", b"view_error") in dead_letter.headers()
    assert db.tables["dead_letters"] == {("test-group", "likes", "view_error"): 1}
    assert pipeline.totals["retries"] == 1  # the batch's first attempt failed


def test_a_record_that_breaks_its_contract_is_dead_lettered_and_never_reaches_the_sink(broker, db):
    broker.produce("likes", [b"a", b"42", b"b"], partition=0)
    sink = MemorySink()

    run_until_caught_up(memory_pipeline(broker, db, sink, topics=["likes"], decode=per_record(words_only)))

    assert sink.rows(db) == [(0, b"a"), (0, b"b")]
    assert [m.value() for m in broker.messages("likes.dlq")] == [b"42"]
    assert db.tables["dead_letters"] == {("test-group", "likes", "invalid_json"): 1}


def test_a_dead_letter_kafka_will_not_take_now_makes_the_poll_read_again_not_the_process_die(broker, db):
    class RefusingTwice:
        """The dead-letter producer: its first two produce() calls are refused, as librdkafka refuses."""

        def __init__(self, producer) -> None:
            self.producer, self.refusals = producer, 2

        def produce(self, *args, **kwargs):
            if self.refusals:
                self.refusals -= 1
                raise KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT))
            return self.producer.produce(*args, **kwargs)

        def __getattr__(self, name):
            return getattr(self.producer, name)

    broker.produce("likes", [b"a", b"42", b"b"], partition=0)
    sink = MemorySink()
    pipeline = memory_pipeline(broker, db, sink, topics=["likes"], decode=per_record(words_only))
    pipeline.dead_letters._producer = RefusingTwice(pipeline.dead_letters._producer)

    run_until_caught_up(pipeline)

    assert sink.rows(db) == [(0, b"a"), (0, b"b")]
    assert [m.value() for m in broker.messages("likes.dlq")] == [b"42"]
    assert pipeline.totals["retries"] == 2


def test_a_restarted_pipeline_starts_where_the_database_says(broker, db):
    broker.produce("likes", [b"a", b"b"], partition=0)
    sink = MemorySink()
    run_until_caught_up(memory_pipeline(broker, db, sink, topics=["likes"]))
    broker.produce("likes", [b"c"], partition=0)

    restarted = memory_pipeline(broker, db, sink, topics=["likes"])
    run_until_caught_up(restarted)

    assert sink.rows(db) == [(0, b"a"), (0, b"b"), (0, b"c")]
    assert restarted.totals["records"] == 1


def test_the_older_of_two_generations_holding_a_partition_is_fenced_and_rereads_from_the_stored_offset(broker, db):
    old_sink, new_sink = MemorySink(table="views", label="old"), MemorySink(table="views", label="new")
    old = memory_pipeline(broker, db, old_sink, topics=["likes"])
    new = memory_pipeline(broker, db, new_sink, topics=["likes"])
    old.step()  # both are assigned the partitions (a rebalance in progress) before anything committed
    new.step()
    broker.produce("likes", [b"a", b"b", b"c"], partition=0)

    new.step()  # the new owner reads a, b, c and commits them
    assert new.settle()
    old.step()  # the old one read the same records from the same position
    assert not old.settle()  # fenced: rolled back, re-seeked to the stored offset

    assert old_sink.rows(db) == [("new", 0, b"a"), ("new", 0, b"b"), ("new", 0, b"c")]
    assert old.positions[("likes", 0)] == 3
    assert old.totals["retries"] == 1
