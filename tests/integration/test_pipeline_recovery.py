"""Exactly once across crashes and workers: the views end as the raw events dictate.

A stream runner killed with SIGKILL mid-stream and restarted, or several runners sharing a consumer
group, end with exactly the views the raw events dictate.

These tests run their own runner processes (`python -m pipelines.cv.runner --streams S --group G`)
on a throwaway topic, stream and views, with small batches so a kill lands between many commits.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
from collections import defaultdict

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.integration.conftest import pipeline_env, throwaway_views, unique, wait_for
from tests.integration.processes import spawn, stop_process

PARTITIONS = 4


@pytest.fixture
def scenario(pg, kafka, topic_factory, stack):
    """A topic with 4 partitions, a keyed stream on it and two views, dropped afterwards."""
    topic = topic_factory("it-likes", partitions=PARTITIONS)
    name, group = topic.replace("-", "_"), unique("it-group")
    # Its own consumer group: the supervised runner leaves the stream to the test's runners.
    definitions = f"""
        CREATE STREAM {name} (oid bigint, uid bigint, ts timestamptz) WITH (
            topic = '{topic}', key = 'oid, uid', kafka_key = 'oid', timestamp_column = 'ts',
            action_field = 'action', insert_actions = 'like', delete_actions = 'unlike',
            consumer_group = '{group}');
        CREATE CONTINUOUS VIEW {name}.objects AS
            SELECT oid, count(*) AS n, array_agg(DISTINCT uid) AS likers FROM {name} GROUP BY oid;
        CREATE CONTINUOUS VIEW {name}.users AS
            SELECT uid, array_agg(DISTINCT oid) AS liked FROM {name} GROUP BY uid;
    """
    with throwaway_views(pg, name, [name], definitions):
        yield {"topic": topic, "stream": name, "group": group}


def produce_likes(kafka, topic: str, count: int, seed: int) -> list[tuple[int, int, int]]:
    """Random likes and unlikes over a small id space (many duplicates); returns (op, oid, uid) in order."""
    rng = random.Random(seed)
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "linger.ms": 20, "enable.idempotence": True})
    events = []
    for _ in range(count):
        oid, uid = rng.randint(1, 300), rng.randint(1, 200)
        op = 1 if rng.random() < 0.7 else -1
        events.append((op, oid, uid))
        value = {"oid": oid, "uid": uid, "action": "like" if op == 1 else "unlike"}
        producer.produce(topic, key=str(oid), value=json.dumps(value))
        producer.poll(0)
    assert producer.flush(60) == 0
    return events


def expected_views(events):
    """Set semantics in production order (one key always lands in one partition, so order is kept)."""
    pairs = set()
    for op, oid, uid in events:
        (pairs.add if op == 1 else pairs.discard)((oid, uid))
    objects, users = defaultdict(list), defaultdict(list)
    for oid, uid in pairs:
        objects[oid].append(uid)
        users[uid].append(oid)
    return ({oid: (len(u), sorted(u)) for oid, u in objects.items()}, {uid: sorted(o) for uid, o in users.items()})


def actual_views(conn, stream):
    objects = {
        oid: (n, sorted(likers)) for oid, n, likers in conn.execute(f"SELECT oid, n, likers FROM {stream}.objects")
    }
    users = {uid: sorted(liked) for uid, liked in conn.execute(f"SELECT uid, liked FROM {stream}.users")}
    return objects, users


def start_pipeline(stack, scenario, batch_max: int = 200) -> subprocess.Popen:
    env = pipeline_env(stack, PIPELINE_BATCH_MAX=str(batch_max), PIPELINE_BATCH_WAIT_MS="20")
    streams, group = scenario["stream"], scenario["group"]
    return spawn([sys.executable, "-m", "pipelines.cv.runner", "--streams", streams, "--group", group], env)


def high_watermarks(kafka, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": unique("watermarks")})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(PARTITIONS)}
    finally:
        consumer.close()


def caught_up(pg, scenario, ends: dict[int, int]) -> bool:
    """Every partition's offset in PostgreSQL is at its end; a partition no event went to has no offset row.

    (An unkeyed producer fills one partition per batch, so a partition may get nothing at all.)
    """
    offsets = committed(pg, scenario)
    return all(offsets.get(partition, 0) == end for partition, end in ends.items())


def committed(pg, scenario) -> dict[int, int]:
    with pg("sv_owner") as conn:
        return dict(
            conn.execute(
                "SELECT partition, next_offset FROM ops.kafka_offsets WHERE group_id = %s AND topic = %s",
                (scenario["group"], scenario["topic"]),
            ).fetchall()
        )


def test_a_pipeline_killed_mid_stream_and_restarted_loses_nothing_and_counts_nothing_twice(pg, kafka, stack, scenario):
    events = produce_likes(kafka, scenario["topic"], 20_000, seed=1)
    ends = high_watermarks(kafka, scenario["topic"])
    first = start_pipeline(stack, scenario)
    wait_for(lambda: sum(committed(pg, scenario).values()) > 2_000, timeout=120, interval=0.05, what="progress")

    stop_process(first, signal.SIGKILL)  # no chance to finish its batch or leave the group
    assert sum(committed(pg, scenario).values()) < sum(ends.values()), "killed too late to prove anything"
    second = start_pipeline(stack, scenario)
    try:
        wait_for(lambda: caught_up(pg, scenario, ends), timeout=180, what="the restarted pipeline to catch up")
    finally:
        stop_process(second)

    with pg("sv_reader") as conn:
        assert actual_views(conn, scenario["stream"]) == expected_views(events)


def test_two_workers_in_one_group_produce_the_same_views_as_one_without_deadlocks(pg, kafka, stack, scenario):
    events = produce_likes(kafka, scenario["topic"], 20_000, seed=2)
    ends = high_watermarks(kafka, scenario["topic"])
    workers = [start_pipeline(stack, scenario), start_pipeline(stack, scenario)]
    try:
        wait_for(lambda: caught_up(pg, scenario, ends), timeout=180, what="two workers to consume everything")
    finally:
        logs = [stop_process(worker) for worker in workers]

    with pg("sv_reader") as conn:
        assert actual_views(conn, scenario["stream"]) == expected_views(events)
    assert not any("deadlock detected" in log for log in logs)


def test_a_worker_joining_mid_stream_takes_over_partitions_without_double_counting(pg, kafka, stack, scenario):
    events = produce_likes(kafka, scenario["topic"], 20_000, seed=3)
    ends = high_watermarks(kafka, scenario["topic"])
    first = start_pipeline(stack, scenario)
    wait_for(lambda: sum(committed(pg, scenario).values()) > 2_000, timeout=120, interval=0.05, what="progress")
    second = start_pipeline(stack, scenario)  # a rebalance moves partitions while batches are in flight
    try:
        wait_for(lambda: caught_up(pg, scenario, ends), timeout=180, what="both workers to finish")
    finally:
        stop_process(first)
        stop_process(second)

    with pg("sv_reader") as conn:
        assert actual_views(conn, scenario["stream"]) == expected_views(events)
