"""A stream's first consumption starts where its definition says, once; its topic keeps what the stream declares.

Each test runs its own stream runner (a real subprocess) over streams declared in its consumer
group, on topics holding events produced before the streams existed: an "old" set (Kafka timestamps
ten minutes ago) and a "recent" set (five minutes ago).
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import ConfigResource, NewTopic

from pipelines.cv import catalog
from pipelines.cv.model import DefinitionError
from pipelines.cv.status import runner_status, status_table
from tests.integration.conftest import delete_topics, start_runner, stop_runner, throwaway_views, unique, wait_for
from tests.integration.processes import stop_process

pytestmark = pytest.mark.integration

PARTITIONS = 2


def produce(kafka, topic: str, tag: str, n: int, timestamp_ms: int = 0) -> None:
    """Produce n events {"tag": tag}, spread over the partitions, with this Kafka timestamp (0: now)."""
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "enable.idempotence": True, "linger.ms": 20})
    for i in range(n):
        producer.produce(topic, value=json.dumps({"tag": tag}), partition=i % PARTITIONS, timestamp=timestamp_ms)
    assert producer.flush(30) == 0


def counts(pg, view: str) -> dict[str, int]:
    with pg("sv_owner") as conn:
        return {tag: int(n) for tag, n in conn.execute(f"SELECT tag, n FROM {view}").fetchall()}


def stored_offsets(pg, group: str, topic: str) -> dict[int, int]:
    with pg("sv_owner") as conn:
        rows = conn.execute(
            "SELECT partition, next_offset FROM ops.kafka_offsets WHERE group_id = %s AND topic = %s", (group, topic)
        ).fetchall()
    return dict(rows)


def topic_config(admin, topic: str) -> dict[str, tuple[str, bool]]:
    """The topic's retention configs: (value, set on the topic itself rather than a default)."""
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    entries = admin.describe_configs([resource])[resource].result(30)
    return {
        name: (entries[name].value, not entries[name].is_default)
        for name in ("retention.ms", "retention.bytes")
        if name in entries
    }


@pytest.fixture
def history(admin, kafka):
    """Topics each holding 40 old and 30 recent events; the time between the two sets (ISO 8601)."""
    now_ms = int(time.time() * 1000)
    old_ms, recent_ms = now_ms - 600_000, now_ms - 300_000
    topics: list[str] = []

    def make(name: str) -> str:
        topic = unique(f"it-start-{name}")
        admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])[topic].result(30)
        topics.append(topic)
        produce(kafka, topic, "old", 40, old_ms)
        produce(kafka, topic, "recent", 30, recent_ms)
        return topic

    between = datetime.fromtimestamp((old_ms + recent_ms) / 2000, UTC).isoformat()
    yield make, between
    delete_topics([name for topic in topics for name in (topic, f"{topic}.dlq")])


def test_streams_count_from_the_beginning_the_end_or_a_time_of_a_topic_with_history(stack, pg, kafka, history):
    make, between = history
    group, schema = unique("it-start"), unique("start")
    starts = {"first": "earliest", "last": "latest", "since": between}
    topics = {name: make(name) for name in starts}
    definitions = "".join(
        f"""
        CREATE STREAM {schema}_{name} (tag text NOT NULL)
            WITH (topic = '{topics[name]}', consumer_group = '{group}', start_offset = '{start}');
        CREATE CONTINUOUS VIEW {schema}.{name} AS SELECT tag, count(*) AS n FROM {schema}_{name} GROUP BY tag;
        """
        for name, start in starts.items()
    )
    with throwaway_views(pg, schema, [f"{schema}_{name}" for name in starts], definitions):
        runner = start_runner(stack, group)
        try:
            # latest and the time are stored before anything is consumed: then new events are "after".
            wait_for(lambda: len(stored_offsets(pg, group, topics["last"])) == PARTITIONS, what="latest resolved")
            wait_for(lambda: len(stored_offsets(pg, group, topics["since"])) == PARTITIONS, what="time resolved")
            for topic in topics.values():
                produce(kafka, topic, "new", 20)

            wait_for(lambda: counts(pg, f"{schema}.first") == {"old": 40, "recent": 30, "new": 20}, what="earliest")
            wait_for(lambda: counts(pg, f"{schema}.last") == {"new": 20}, what="latest: only the new events")
            wait_for(lambda: counts(pg, f"{schema}.since") == {"recent": 30, "new": 20}, what="since the time")
        finally:
            log = stop_runner(runner)
    assert "first consumption" in log


@contextmanager
def from_latest(pg, history, name: str) -> Iterator[tuple[str, str, str]]:
    """A stream starting at 'latest' on a topic with history, and a view counting its tags: (group, schema, topic)."""
    make, _ = history
    group, schema = unique(f"it-start-{name}"), unique(f"start{name}")
    topic = make(name)
    definitions = f"""
        CREATE STREAM {schema}_s (tag text NOT NULL)
            WITH (topic = '{topic}', consumer_group = '{group}', start_offset = 'latest');
        CREATE CONTINUOUS VIEW {schema}.counts AS SELECT tag, count(*) AS n FROM {schema}_s GROUP BY tag;
    """
    with throwaway_views(pg, schema, [f"{schema}_s"], definitions):
        yield group, schema, topic


def test_a_runner_killed_before_its_first_commit_restarts_where_latest_was_resolved(stack, pg, kafka, history):
    with from_latest(pg, history, "kill") as (group, schema, topic):
        runner = start_runner(stack, group)
        wait_for(lambda: len(stored_offsets(pg, group, topic)) == PARTITIONS, what="latest resolved and stored")
        resolved = stored_offsets(pg, group, topic)
        stop_process(runner, signal.SIGKILL)  # no batch was committed: nothing was produced since
        assert resolved == {p: 35 for p in range(PARTITIONS)}  # 70 events before it, over two partitions

        produce(kafka, topic, "meanwhile", 10)  # while no runner runs: after the start, so counted
        runner = start_runner(stack, group)
        try:
            wait_for(lambda: counts(pg, f"{schema}.counts") == {"meanwhile": 10}, what="the events after the start")
        finally:
            stop_runner(runner)
        assert stored_offsets(pg, group, topic) == {p: 40 for p in range(PARTITIONS)}


def test_a_topic_recreated_under_a_stream_starting_at_latest_follows_the_rule_again(stack, pg, kafka, admin, history):
    with from_latest(pg, history, "recreated") as (group, schema, topic):
        runner = start_runner(stack, group)
        wait_for(lambda: len(stored_offsets(pg, group, topic)) == PARTITIONS, what="latest resolved")
        produce(kafka, topic, "first", 4)
        wait_for(lambda: counts(pg, f"{schema}.counts") == {"first": 4}, what="the first topic's new events")
        stop_runner(runner)

        admin.delete_topics([topic])[topic].result(30)
        wait_for(lambda: topic not in admin.list_topics(timeout=10).topics, timeout=30)
        wait_for(lambda: _created(admin, topic), what="the topic created again (once the broker deleted it)")
        produce(kafka, topic, "before", 6)  # in the new topic before its first consumption: 'latest' skips them

        runner = start_runner(stack, group)
        try:
            wait_for(lambda: stored_offsets(pg, group, topic) == {0: 3, 1: 3}, what="latest resolved again")
            produce(kafka, topic, "after", 2)
            wait_for(lambda: counts(pg, f"{schema}.counts") == {"first": 4, "after": 2}, what="the new topic's")
        finally:
            log = stop_runner(runner)
        assert "its start rule applies again" in log


def _created(admin, topic: str) -> bool:
    try:
        admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])[topic].result(30)
    except Exception:
        return False
    return True


def test_retention_is_set_when_the_topic_is_created_and_changed_by_alter_stream(stack, pg, kafka, admin):
    group, schema = unique("it-retention"), unique("retention")
    stream, topic = f"{schema}_s", unique("it-retention")
    definitions = f"""
        CREATE STREAM {stream} (tag text NOT NULL) WITH (
            topic = '{topic}', consumer_group = '{group}', retention = '2 days', retention_bytes = '1 MB');
        CREATE CONTINUOUS VIEW {schema}.counts AS SELECT tag, count(*) AS n FROM {stream} GROUP BY tag;
    """
    try:
        with throwaway_views(pg, schema, [stream], definitions):
            runner = start_runner(stack, group)
            try:
                wait_for(
                    lambda: (
                        topic in admin.list_topics(timeout=10).topics
                        and topic_config(admin, topic)
                        == {"retention.ms": ("172800000", True), "retention.bytes": ("1048576", True)}
                    ),
                    what="the topic created with its retention",
                )
                with pg("sv_owner", autocommit=True) as conn:
                    assert catalog.define(conn, f"ALTER STREAM {stream} SET (retention = '3 hours');") == [
                        f"stream {stream} altered: retention '3 hours', retention_bytes '1 MB'"
                    ]
                wait_for(lambda: topic_config(admin, topic)["retention.ms"] == ("10800000", True), what="ALTER SET")
                with pg("sv_owner", autocommit=True) as conn:
                    catalog.define(conn, f"ALTER STREAM {stream} RESET (retention_bytes);")
                wait_for(lambda: not topic_config(admin, topic)["retention.bytes"][1], what="RESET: the default again")
                assert topic_config(admin, topic)["retention.ms"] == ("10800000", True)

                before = datetime.now(UTC).replace(microsecond=0)
                produce(kafka, topic, "kept", 4)
                wait_for(lambda: counts(pg, f"{schema}.counts") == {"kept": 4})
                with pg("sv_writer") as conn:
                    [status] = runner_status(conn, admin, kafka, group, [stream])
                # How far back a backfill reaches: the 4 offsets retained, the oldest produced just now.
                assert status.retained == 4
                assert status.oldest_event is not None
                assert before <= status.oldest_event <= datetime.now(UTC)
                assert "retained history" in status_table(group, [status])
            finally:
                stop_runner(runner)
    finally:
        delete_topics([topic, f"{topic}.dlq"])


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ("retention = '3 parsecs'", "retention '3 parsecs' is not read by PostgreSQL"),
        ("retention = '-1 day'", "retention must be positive"),
        ("retention_bytes = 'lots'", "retention_bytes 'lots' is not read by PostgreSQL"),
    ],
)
def test_a_retention_postgresql_does_not_read_is_refused_when_the_stream_is_defined(pg, options, match):
    with pg("sv_owner", autocommit=True) as conn, pytest.raises(DefinitionError, match=match):
        catalog.define(conn, f"CREATE STREAM {unique('bad_retention')} (a bigint) WITH ({options});")


def test_alter_stream_of_a_stream_that_does_not_exist_is_refused(pg):
    with pg("sv_owner", autocommit=True) as conn, pytest.raises(DefinitionError, match="no stream named nope_"):
        catalog.define(conn, f"ALTER STREAM {unique('nope')} SET (retention = '1 day');")
