"""Isolation: one bad event, one broken view or one broken stream stops only itself.

Each test runs its own stream runner (`python -m pipelines.cv.runner --group G`) over throwaway
streams declared in that group, so the supervised runner never sees what the test breaks. The
views end exactly as the events that were not dead-lettered dictate, and the other streams of the
group keep flowing meanwhile.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import NewTopic

from tests.integration.conftest import (
    delete_topics,
    pipeline_env,
    start_runner,
    stop_runner,
    throwaway_views,
    unique,
    wait_for,
)


@pytest.fixture
def group():
    return unique("it-isolation")


@pytest.fixture
def runner(stack, group):
    """A runner of the test's group, retrying quarantined views and held streams every second."""
    process = start_runner(stack, group)
    yield process
    stop_runner(process)


def produce(kafka, topic: str, events: list[dict]) -> None:
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "enable.idempotence": True, "linger.ms": 50})
    for event in events:
        producer.produce(topic, value=json.dumps(event))
    assert producer.flush(30) == 0


def dead_letters(kafka, topic: str, expected: int) -> list[dict[str, str]]:
    """The dead letters of a topic (their dlq.* headers), once `expected` of them are there."""
    consumer = Consumer(
        {"bootstrap.servers": kafka.bootstrap_servers, "group.id": unique("dlq"), "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([f"{topic}.dlq"])
    found: list[dict[str, str]] = []

    def read() -> bool:
        for message in consumer.consume(100, 0.5):
            if message.error() is None:
                found.append({k: v.decode() for k, v in message.headers() or [] if k.startswith("dlq.")})
        return len(found) >= expected

    try:
        wait_for(read, timeout=60, what=f"{expected} dead letters on {topic}.dlq")
        consumer.consume(100, 1.0)  # anything more would be a duplicate
    finally:
        consumer.close()
    return found


def rows(pg, query: str) -> dict:
    with pg("sv_owner") as conn:
        return {row[0]: tuple(row[1:]) for row in conn.execute(query)}


def test_events_a_view_cannot_take_are_dead_lettered_naming_the_view_and_the_rest_count(
    pg, kafka, topic_factory, group, runner
):
    metrics, other = topic_factory("it-poison"), topic_factory("it-bystander")
    schema = unique("iso")
    definitions = f"""
        CREATE STREAM {schema}_m (tag text NOT NULL, d double precision, x integer)
            WITH (topic = '{metrics}', consumer_group = '{group}');
        CREATE STREAM {schema}_o (tag text NOT NULL) WITH (topic = '{other}', consumer_group = '{group}');
        CREATE CONTINUOUS VIEW {schema}.sums AS
            SELECT tag, sum(d) AS total, count(*) AS n FROM {schema}_m GROUP BY tag;
        CREATE CONTINUOUS VIEW {schema}.ratios AS
            SELECT tag, count(*) AS n FROM {schema}_m WHERE 100 / x > 1 GROUP BY tag;
        CREATE CONTINUOUS VIEW {schema}.others AS SELECT tag, count(*) AS n FROM {schema}_o GROUP BY tag;
    """
    with throwaway_views(pg, schema, [f"{schema}_m", f"{schema}_o"], definitions):
        good = [{"tag": "a", "d": 1.5, "x": 2} for _ in range(40)]
        # The second 1.7e308 overflows sum(d) (22003); x = 0 divides by zero in ratios' WHERE (22012).
        poison = [{"tag": "big", "d": 1.7e308, "x": 2}, {"tag": "big", "d": 1.7e308, "x": 2}]
        # A 6,000-character group key (random: it must not compress) is more than a btree index row
        # can hold (54000).
        poison.append({"tag": secrets.token_urlsafe(4500), "d": 1.0, "x": 2})
        produce(kafka, metrics, good[:20] + poison + [{"tag": "zero", "d": 1.0, "x": 0}] + good[20:])
        produce(kafka, other, [{"tag": "b"} for _ in range(30)])

        letters = dead_letters(kafka, metrics, expected=3)
        assert len(letters) == 3
        assert {letter["dlq.reason"] for letter in letters} == {"view_error"}
        details = sorted(letter["dlq.detail"] for letter in letters)
        assert details[0].startswith(f"{schema}.ratios: SQLSTATE 22012")
        assert details[1].startswith(f"{schema}.ratios: SQLSTATE 54000")  # ratios comes first, by name
        assert details[2].startswith(f"{schema}.sums: SQLSTATE 22003")

        expected_sums = {"a": (60.0, 40), "big": (1.7e308, 1)}
        wait_for(lambda: rows(pg, f"SELECT tag, total, n FROM {schema}.sums") == expected_sums, timeout=60)
        assert rows(pg, f"SELECT tag, n FROM {schema}.ratios") == {"a": (40,), "big": (1,)}
        wait_for(lambda: rows(pg, f"SELECT tag, n FROM {schema}.others") == {"b": (30,)}, timeout=60)

        # Later batches go the common way again, and nothing was quarantined for two bad records.
        produce(kafka, metrics, good[:5])
        wait_for(lambda: rows(pg, f"SELECT tag, n FROM {schema}.sums")["a"] == (45,), timeout=60)
        with pg("sv_owner") as conn:
            assert (
                conn.execute("SELECT count(*) FROM cv.view_failures WHERE stream = %s", (f"{schema}_m",)).fetchone()[0]
                == 0
            )
            counted = conn.execute(
                "SELECT reason, count FROM ops.dead_letters WHERE group_id = %s AND topic = %s", (group, metrics)
            ).fetchall()
        assert counted == [("view_error", 3)]


def test_an_event_larger_than_a_dead_letter_can_be_is_dead_lettered_without_its_value_and_the_stream_flows(
    pg, kafka, admin, group, runner
):
    # The topic takes records of up to 3 MB; its dead-letter topic, and the producer writing it, 1 MiB.
    topic, schema = unique("it-large"), unique("iso")
    admin.create_topics([NewTopic(topic, 1, 1, config={"max.message.bytes": "3000000"})])[topic].result(30)
    definitions = f"""
        CREATE STREAM {schema}_l (tag text) WITH (topic = '{topic}', consumer_group = '{group}');
        CREATE CONTINUOUS VIEW {schema}.tags AS SELECT tag, count(*) AS n FROM {schema}_l GROUP BY tag;
    """
    try:
        with throwaway_views(pg, schema, [f"{schema}_l"], definitions):
            producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "message.max.bytes": 3_000_000})
            for tag in ("a", "x" * 1_500_000, "b"):  # over the stream's max_event_bytes (64 KiB) and 1 MiB
                producer.produce(topic, value=json.dumps({"tag": tag}))
            assert producer.flush(30) == 0

            [letter] = dead_letters(kafka, topic, expected=1)
            assert letter["dlq.reason"] == "oversized"
            assert letter["dlq.value_bytes"] == "1500011"  # left out; dlq.offset says where it is
            assert letter["dlq.offset"] == "1"
            wait_for(lambda: rows(pg, f"SELECT tag, n FROM {schema}.tags") == {"a": (1,), "b": (1,)}, timeout=60)
            assert runner.poll() is None  # the runner did not die on it
    finally:
        delete_topics([topic, f"{topic}.dlq"])


def test_a_view_whose_join_table_is_gone_is_quarantined_while_the_rest_flow_and_its_gap_is_recorded(
    pg, kafka, stack, topic_factory, group, runner
):
    topic = topic_factory("it-quarantine")
    schema = unique("iso")
    stream = f"{schema}_j"
    with pg("sv_owner", autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TABLE {schema}.cats (cat integer PRIMARY KEY, name text NOT NULL)")
        conn.execute(f"INSERT INTO {schema}.cats VALUES (1, 'one'), (2, 'two')")
    definitions = f"""
        CREATE STREAM {stream} (id bigint NOT NULL, cat integer NOT NULL)
            WITH (topic = '{topic}', consumer_group = '{group}');
        CREATE CONTINUOUS VIEW {schema}.by_name AS
            SELECT c.name, count(*) AS n FROM {stream} e JOIN {schema}.cats c ON c.cat = e.cat GROUP BY c.name;
        CREATE CONTINUOUS VIEW {schema}.by_cat AS SELECT cat, count(*) AS n FROM {stream} GROUP BY cat;
    """

    def events(first: int, count: int) -> list[dict]:
        return [{"id": i, "cat": 1 + i % 2} for i in range(first, first + count)]

    with throwaway_views(pg, schema, [stream], definitions, schema_exists=True):
        produce(kafka, topic, events(0, 10))
        wait_for(lambda: rows(pg, f"SELECT name, n FROM {schema}.by_name") == {"one": (5,), "two": (5,)}, timeout=60)

        with pg("sv_owner", autocommit=True) as conn:
            conn.execute(f"ALTER TABLE {schema}.cats RENAME TO cats_away")
        produce(kafka, topic, events(10, 20))
        # The stream's other view goes on; the broken one is quarantined with PostgreSQL's reason.
        wait_for(lambda: rows(pg, f"SELECT cat, n FROM {schema}.by_cat") == {1: (15,), 2: (15,)}, timeout=60)
        failure = rows(pg, f"SELECT view, sqlstate, reason FROM cv.view_failures WHERE stream = '{stream}'")
        assert list(failure) == [f"{schema}.by_name"]
        assert failure[f"{schema}.by_name"][0] == "42P01"
        status = subprocess.run(
            [sys.executable, "-m", "pipelines.cv.cli", "status", "--group", group, stream],
            env=pipeline_env(stack, PGUSER="sv_writer", LOG_LEVEL="WARNING"),
            capture_output=True,
            text=True,
            check=False,
        )
        assert f"{schema}.by_name" in status.stdout, status.stdout + status.stderr
        assert "quarantined" in status.stdout

        # Fixed: the view resumes. Its stream keeps no past events, so the ones it missed are a gap.
        with pg("sv_owner", autocommit=True) as conn:
            conn.execute(f"ALTER TABLE {schema}.cats_away RENAME TO cats")
        wait_for(lambda: not rows(pg, f"SELECT view FROM cv.view_failures WHERE stream = '{stream}'"), timeout=60)
        gaps = rows(pg, f"SELECT view, missed_from, missed_to FROM cv.view_gaps WHERE stream = '{stream}'")
        assert list(gaps) == [f"{schema}.by_name"]
        missed_from, missed_to = gaps[f"{schema}.by_name"]
        assert sum(missed_to[topic].values()) - sum(missed_from.get(topic, {}).values()) == 20
        produce(kafka, topic, events(30, 10))
        wait_for(lambda: rows(pg, f"SELECT name, n FROM {schema}.by_name") == {"one": (10,), "two": (10,)}, timeout=60)


def test_a_quarantined_view_over_a_keyed_stream_resumes_rebuilt_from_the_state_missing_nothing(
    pg, kafka, topic_factory, group, runner
):
    topic = topic_factory("it-rebuild")
    schema = unique("iso")
    stream = f"{schema}_k"
    with pg("sv_owner", autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(
            f"CREATE FUNCTION {schema}.kept_{schema}(c integer) RETURNS boolean"
            " LANGUAGE sql IMMUTABLE AS 'SELECT c > 0'"
        )
    definitions = f"""
        CREATE STREAM {stream} (id bigint NOT NULL, cat integer NOT NULL)
            WITH (topic = '{topic}', key = 'id', consumer_group = '{group}');
        CREATE CONTINUOUS VIEW {schema}.counted AS
            SELECT cat, count(*) AS n FROM {stream} WHERE {schema}.kept_{schema}(cat) GROUP BY cat;
        CREATE CONTINUOUS VIEW {schema}.all_cats AS SELECT cat, count(*) AS n FROM {stream} GROUP BY cat;
    """
    with throwaway_views(pg, schema, [stream], definitions, schema_exists=True):
        produce(kafka, topic, [{"id": i, "cat": i % 3} for i in range(12)])
        wait_for(lambda: rows(pg, f"SELECT cat, n FROM {schema}.counted") == {1: (4,), 2: (4,)}, timeout=60)

        with pg("sv_owner", autocommit=True) as conn:
            conn.execute(f"REVOKE EXECUTE ON FUNCTION {schema}.kept_{schema}(integer) FROM PUBLIC")
        produce(kafka, topic, [{"id": i, "cat": i % 3} for i in range(12, 30)])
        wait_for(
            lambda: rows(pg, f"SELECT cat, n FROM {schema}.all_cats") == {0: (10,), 1: (10,), 2: (10,)}, timeout=60
        )
        assert rows(pg, f"SELECT view, sqlstate FROM cv.view_failures WHERE stream = '{stream}'") == {
            f"{schema}.counted": ("42501",)
        }

        with pg("sv_owner", autocommit=True) as conn:
            conn.execute(f"GRANT EXECUTE ON FUNCTION {schema}.kept_{schema}(integer) TO sv_writer")
        wait_for(
            lambda: rows(pg, f"SELECT cat, n FROM {schema}.counted") == {1: (10,), 2: (10,)},
            timeout=60,
            what="the quarantined view to be rebuilt from the state",
        )
        assert not rows(pg, f"SELECT view FROM cv.view_failures WHERE stream = '{stream}'")
        assert not rows(pg, f"SELECT view FROM cv.view_gaps WHERE stream = '{stream}'")


def test_a_stream_whose_state_cannot_be_written_is_held_without_loss_while_another_flows(
    pg, kafka, topic_factory, group, runner
):
    held_topic, other = topic_factory("it-held"), topic_factory("it-flowing")
    schema = unique("iso")
    held, flowing = f"{schema}_h", f"{schema}_f"
    definitions = f"""
        CREATE STREAM {held} (id bigint NOT NULL) WITH (topic = '{held_topic}', key = 'id', consumer_group = '{group}');
        CREATE STREAM {flowing} (tag text NOT NULL) WITH (topic = '{other}', consumer_group = '{group}');
        CREATE CONTINUOUS VIEW {schema}.held_count AS
            SELECT id % 2 AS parity, count(*) AS n FROM {held} GROUP BY parity;
        CREATE CONTINUOUS VIEW {schema}.flowing AS SELECT tag, count(*) AS n FROM {flowing} GROUP BY tag;
    """
    with throwaway_views(pg, schema, [held, flowing], definitions):
        with pg("sv_owner", autocommit=True) as conn:
            conn.execute(f"REVOKE INSERT ON cv.state_{held} FROM sv_writer")
        produce(kafka, held_topic, [{"id": i} for i in range(25)])
        produce(kafka, other, [{"tag": "t"} for _ in range(10)])
        wait_for(lambda: rows(pg, f"SELECT tag, n FROM {schema}.flowing") == {"t": (10,)}, timeout=60)
        wait_for(
            lambda: rows(pg, f"SELECT stream, sqlstate FROM cv.stream_failures WHERE stream = '{held}'"), timeout=60
        )
        assert rows(pg, f"SELECT stream, sqlstate FROM cv.stream_failures WHERE stream = '{held}'") == {
            held: ("42501",)
        }
        produce(kafka, other, [{"tag": "t"} for _ in range(10)])
        wait_for(lambda: rows(pg, f"SELECT tag, n FROM {schema}.flowing") == {"t": (20,)}, timeout=60)
        assert rows(pg, f"SELECT parity, n FROM {schema}.held_count") == {}

        with pg("sv_owner", autocommit=True) as conn:
            conn.execute(f"GRANT INSERT ON cv.state_{held} TO sv_writer")
        wait_for(lambda: rows(pg, f"SELECT parity, n FROM {schema}.held_count") == {0: (13,), 1: (12,)}, timeout=60)
        wait_for(lambda: not rows(pg, f"SELECT stream FROM cv.stream_failures WHERE stream = '{held}'"), timeout=30)
