"""Declared streams run by themselves: a stream and a view defined on the running stack start flowing.

The supervised stream runner (`streams`, started by `make up`) watches the catalog; nothing is
restarted in these tests. Events are produced with kafka-python, as an application would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import Consumer
from kafka import KafkaProducer

from pipelines.cv.runner import DEFAULT_GROUP
from stack.configure import client_settings
from stack.supervisor import Supervisor
from tests.integration.conftest import unique, wait_for

STREAMVIEWS = Path(sys.executable).with_name("streamviews")


def streamviews(stack, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """The console script, as a user runs it against this stack (definitions as the owner role)."""
    env = {**os.environ, **client_settings(stack)}
    env.pop("PGUSER", None)
    return subprocess.run(
        [str(STREAMVIEWS), *args], input=stdin, env=env, capture_output=True, text=True, check=False, timeout=120
    )


def define(stack, statements: str) -> None:
    """`streamviews define -` with these statements on standard input; they must all be accepted."""
    defined = streamviews(stack, "define", "-", stdin=statements)
    assert defined.returncode == 0, defined.stderr


@pytest.fixture
def names(stack, pg, admin):
    """A stream and a view name of this test; both dropped afterwards, with their topics."""
    stream = unique("pv")
    created = {"stream": stream, "view": f"public.{stream}_by_url", "topic": stream.replace("_", "-")}
    yield created
    streamviews(stack, "drop", created["view"])
    streamviews(stack, "drop", stream)
    with pg("sv_owner", autocommit=True) as conn:
        conn.execute(
            "DELETE FROM ops.kafka_offsets WHERE group_id = %s AND topic = %s", (DEFAULT_GROUP, created["topic"])
        )
    topics = [t for t in (created["topic"], f"{created['topic']}.dlq") if t in admin.list_topics(timeout=10).topics]
    if topics:
        for future in admin.delete_topics(topics).values():
            future.result(30)


def produce(kafka, topic: str, events: list[bytes]) -> None:
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, linger_ms=5)
    for value in events:
        producer.send(topic, value=value)
    producer.flush(30)
    producer.close()


def view_rows(pg, view: str, columns: str) -> dict:
    """The view's rows by their first column (the group), as tuples of the others."""
    with pg("sv_reader") as conn:
        return {row[0]: row[1:] for row in conn.execute(f"SELECT {columns} FROM {view}")}


def test_a_stream_and_view_defined_on_the_running_stack_fill_from_a_new_topic_without_a_restart(
    stack, kafka, pg, names
):
    runner_pid = Supervisor(stack.paths).processes()["streams"].pid
    stream, view, topic = names["stream"], names["view"], names["topic"]

    define(
        stack,
        f"""
            CREATE STREAM {stream} (url text NOT NULL, uid bigint, latency double precision, ts timestamptz)
                WITH (topic = '{topic}', timestamp_column = 'ts');
            CREATE CONTINUOUS VIEW {view} AS
                SELECT url, count(*) AS views, count(DISTINCT uid) AS visitors, max(latency) AS slowest
                FROM {stream} GROUP BY url;
        """,
    )
    events = [
        json.dumps({"url": f"/p/{i % 3}", "uid": i % 7, "latency": float(i), "ts": "2026-11-23T10:00:00Z"}).encode()
        for i in range(100)
    ]
    produce(kafka, topic, events)

    expected = {f"/p/{u}": (34 if u == 0 else 33, 7, float(max(i for i in range(100) if i % 3 == u))) for u in range(3)}
    wait_for(
        lambda: view_rows(pg, view, "url, views, visitors, slowest") == expected,
        timeout=60,
        what="the new view to fill",
    )
    assert Supervisor(stack.paths).processes()["streams"].pid == runner_pid


def test_events_breaking_the_declaration_go_to_the_dead_letter_topic_and_the_rest_count(stack, kafka, pg, names):
    stream, view, topic = names["stream"], names["view"], names["topic"]
    define(
        stack,
        f"""
            CREATE STREAM {stream} (
                url text NOT NULL,
                uid bigint NOT NULL CONSTRAINT bad_uid CHECK (uid > 0),
                latency double precision DEFAULT 0
            ) WITH (topic = '{topic}');
            CREATE CONTINUOUS VIEW {view} AS
                SELECT url, count(*) AS views, sum(latency) AS total FROM {stream} GROUP BY url;
        """,
    )
    good = [json.dumps({"url": "/a", "uid": 1, "latency": 2.5}), json.dumps({"url": "/a", "uid": 2})]
    bad = {
        json.dumps({"url": "/a", "uid": "42"}): "wrong_type",  # a string is not a bigint
        json.dumps({"url": "/a", "uid": 0}): "bad_uid",  # the named CHECK is the reason
        json.dumps({"uid": 3}): "missing_field",  # NOT NULL
        json.dumps({"url": "/a", "uid": 4, "referrer": "x"}): "unknown_field",
        "not json": "malformed_json",
    }
    produce(kafka, topic, [value.encode() for value in [good[0], *bad, good[1]]])

    wait_for(
        lambda: view_rows(pg, view, "url, views, total") == {"/a": (2, 2.5)}, timeout=60, what="the good events counted"
    )
    dlq = Consumer(
        {"bootstrap.servers": kafka.bootstrap_servers, "group.id": unique("dlq"), "auto.offset.reset": "earliest"}
    )
    dlq.subscribe([f"{topic}.dlq"])
    reasons: dict[str, str] = {}

    def all_dead_letters_read() -> bool:
        for record in dlq.consume(10, timeout=1):
            if record.error() is None:
                reasons[record.value().decode()] = dict(record.headers())["dlq.reason"].decode()
        return len(reasons) == len(bad)

    try:
        wait_for(all_dead_letters_read, timeout=60, interval=0, what="five dead letters")
    finally:
        dlq.close()
    assert reasons == bad
    with pg("sv_owner") as conn:
        counted = dict(
            conn.execute(
                "SELECT reason, count FROM ops.dead_letters WHERE group_id = %s AND topic = %s", (DEFAULT_GROUP, topic)
            ).fetchall()
        )
    assert counted == dict.fromkeys(bad.values(), 1)


def test_a_csv_stream_is_a_declaration_too(stack, kafka, pg, names):
    stream, view, topic = names["stream"], names["view"], names["topic"]
    assert (
        streamviews(
            stack, "define", f"CREATE STREAM {stream} (url text, n integer) WITH (topic = '{topic}', format = 'csv')"
        ).returncode
        == 0
    )
    assert (
        streamviews(
            stack, "define", f"CREATE CONTINUOUS VIEW {view} AS SELECT url, sum(n) AS n FROM {stream} GROUP BY url"
        ).returncode
        == 0
    )

    produce(kafka, topic, [b"/a,1", b'"/a",2', b"/b,3", b"/b,three"])

    wait_for(lambda: view_rows(pg, view, "url, n") == {"/a": (3,), "/b": (3,)}, timeout=60, what="the csv view")


def test_a_dropped_stream_is_no_longer_consumed(stack, kafka, admin, names):
    stream, topic = names["stream"], names["topic"]
    assert streamviews(stack, "define", f"CREATE STREAM {stream} (url text) WITH (topic = '{topic}')").returncode == 0

    def assigned_topics() -> set[str]:
        group = admin.describe_consumer_groups([DEFAULT_GROUP])[DEFAULT_GROUP].result(10)
        return {tp.topic for member in group.members for tp in member.assignment.topic_partitions}

    wait_for(lambda: topic in assigned_topics(), timeout=60, what="the runner to take the new topic")
    assert streamviews(stack, "drop", stream).returncode == 0
    wait_for(lambda: topic not in assigned_topics(), timeout=60, what="the runner to let the topic go")
