"""Nothing lost silently as topics come and go: new streams flow at once, a recreated topic is read whole.

Each test runs its own stream runner over streams declared in its consumer group.
"""

from __future__ import annotations

import json
import time

from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

from pipelines.cv import catalog
from tests.integration.conftest import delete_topics, start_runner, stop_runner, throwaway_views, unique, wait_for


def produce(kafka, topic: str, values: list[dict]) -> None:
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "enable.idempotence": True, "linger.ms": 20})
    for value in values:
        producer.produce(topic, value=json.dumps(value))
    assert producer.flush(30) == 0


def count(pg, view: str) -> int:
    with pg("sv_owner") as conn:
        row = conn.execute(f"SELECT sum(n) FROM {view}").fetchone()
    return int(row[0] or 0)


def test_streams_defined_one_after_another_on_a_running_runner_are_each_consumed_within_seconds(stack, pg, kafka):
    group, schema = unique("it-lifecycle"), unique("life")
    runner = start_runner(stack, group)
    streams = [f"{schema}_s{i}" for i in range(6)]
    topics = [unique(f"it-new{i}") for i in range(6)]
    try:
        with throwaway_views(pg, schema, streams, ""):
            waited = []
            for stream, topic in zip(streams, topics, strict=True):
                with pg("sv_owner", autocommit=True) as conn:
                    catalog.define(
                        conn,
                        f"CREATE STREAM {stream} (tag text NOT NULL)"
                        f" WITH (topic = '{topic}', consumer_group = '{group}', partitions = 1)",
                    )
                    catalog.define(
                        conn,
                        f"CREATE CONTINUOUS VIEW {schema}.{stream} AS"
                        f" SELECT tag, count(*) AS n FROM {stream} GROUP BY tag",
                    )
                started = time.monotonic()
                produce(kafka, topic, [{"tag": "x"}])  # the producer creates nothing: the runner made the topic
                wait_for(lambda s=stream: count(pg, f"{schema}.{s}") == 1, timeout=30, what=f"{stream} to be consumed")
                waited.append(time.monotonic() - started)
            print(f"seconds from definition to the first event counted: {[round(w, 1) for w in waited]}")
    finally:
        stop_runner(runner)
        delete_topics([*topics, *(f"{t}.dlq" for t in topics)])


def test_a_topic_recreated_while_the_runner_was_stopped_is_read_from_its_beginning(stack, pg, kafka, admin):
    group, schema = unique("it-lifecycle"), unique("life")
    stream, topic = f"{schema}_r", unique("it-recreated")
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(30)
    definitions = f"""
        CREATE STREAM {stream} (tag text NOT NULL) WITH (topic = '{topic}', consumer_group = '{group}');
        CREATE CONTINUOUS VIEW {schema}.counts AS SELECT tag, count(*) AS n FROM {stream} GROUP BY tag;
    """
    try:
        with throwaway_views(pg, schema, [stream], definitions):
            runner = start_runner(stack, group)
            produce(kafka, topic, [{"tag": "old"}] * 300)
            wait_for(lambda: count(pg, f"{schema}.counts") == 300, timeout=60)
            stop_runner(runner)

            admin.delete_topics([topic])[topic].result(30)
            wait_for(lambda: topic not in admin.list_topics(timeout=10).topics, timeout=30)
            wait_for(
                lambda: _created(admin, topic),
                timeout=60,
                what="the topic to be created again (the broker finishes deleting it first)",
            )
            produce(kafka, topic, [{"tag": "new"}] * 150)  # fewer than the offsets stored for the old topic

            runner = start_runner(stack, group)
            wait_for(lambda: count(pg, f"{schema}.counts") == 450, timeout=60, what="all 150 new events counted")
            log = stop_runner(runner)
            assert "topic was recreated" in log
    finally:
        delete_topics([topic, f"{topic}.dlq"])


def _created(admin, topic: str) -> bool:
    try:
        admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(30)
    except Exception:
        return False
    return True
