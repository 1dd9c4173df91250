"""Writing a stream with SQL (migration 0030): `INSERT INTO <stream>` and `COPY <stream> FROM STDIN`.

Rows reach the stream's views through its topic, exactly once: a committed INSERT is counted once,
also when the inbox relay dies between its Kafka commit and its PostgreSQL delete; a rolled-back one
is never counted; the stream's defaults, decoding rules and dead letters apply as for any event.
Each test runs its own stream runner and inbox relay, for streams of their own consumer group.
"""

from __future__ import annotations

import json
import subprocess
import sys

import psycopg
import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import NewTopic

from pipelines.cv import catalog
from pipelines.cv.inbox import InboxRelay
from pipelines.settings import InboxSettings, PostgresSettings
from tests.integration.conftest import (
    delete_topics,
    pipeline_env,
    start_runner,
    stop_runner,
    throwaway_views,
    topic_records,
    unique,
    wait_for,
)
from tests.integration.processes import spawn, stop_process


@pytest.fixture(scope="module")
def setup(stack, pg):
    group, schema = unique("it-inbox"), unique("inbox")
    clicks, lines = f"{schema}_clicks", f"{schema}_lines"
    topics = [unique("it-inbox-clicks"), unique("it-inbox-lines")]
    definitions = f"""
        CREATE STREAM {clicks} (url text NOT NULL, ms int DEFAULT 7, ts timestamptz)
            WITH (topic = '{topics[0]}', consumer_group = '{group}', partitions = 2, timestamp_column = 'ts');
        CREATE STREAM {lines} (url text, ms int)
            WITH (topic = '{topics[1]}', format = 'csv', consumer_group = '{group}');
        CREATE CONTINUOUS VIEW {schema}.clicks AS
            SELECT url, count(*) AS n, sum(ms) AS ms, count(ts) AS stamped FROM {clicks} GROUP BY url;
        CREATE CONTINUOUS VIEW {schema}.lines AS SELECT url, count(*) AS n, sum(ms) AS ms FROM {lines} GROUP BY url;
    """
    runner = start_runner(stack, group)
    try:
        with throwaway_views(pg, schema, [clicks, lines], definitions):
            yield {"group": group, "schema": schema, "clicks": clicks, "lines": lines, "topics": topics}
    finally:
        stop_runner(runner)
        delete_topics([*topics, *(f"{t}.dlq" for t in topics)])


def start_relay(stack, group: str) -> subprocess.Popen:
    env = pipeline_env(stack, INBOX_WAKE_S="0.5")
    return spawn([sys.executable, "-m", "pipelines.cv.inbox", "--group", group], env)


def counts(pg, view: str) -> dict[str, tuple[int, int]]:
    with pg("sv_owner") as conn:
        return {url: (int(n), int(ms or 0)) for url, n, ms in conn.execute(f"SELECT url, n, ms FROM {view}")}


def test_insert_select_and_copy_reach_the_view_once_and_a_rollback_never(stack, pg, setup):
    schema, clicks, lines = setup["schema"], setup["clicks"], setup["lines"]
    relay = start_relay(stack, setup["group"])
    try:
        with pg("sv_writer", autocommit=True) as conn:
            conn.execute(f"INSERT INTO {clicks} (url, ms) VALUES ('a', 10), ('b', 20)")
            conn.execute(f"INSERT INTO {clicks} (url) VALUES ('a')")  # ms takes the stream's default, 7
            conn.execute(f"INSERT INTO {clicks} (url, ms) SELECT 'c', i FROM generate_series(1, 1000) AS i")
            with conn.cursor().copy(f"COPY {clicks} (url, ms) FROM STDIN") as copy:
                for i in range(500):
                    copy.write_row(("d", i))
            with conn.transaction(force_rollback=True):
                conn.execute(f"INSERT INTO {clicks} (url, ms) VALUES ('never', 1)")
            conn.execute(f"INSERT INTO {lines} (url, ms) VALUES ('x, with a comma', 5), ('y', NULL)")
        expected = {"a": (2, 17), "b": (1, 20), "c": (1000, 500500), "d": (500, 124750)}
        wait_for(lambda: counts(pg, f"{schema}.clicks") == expected, timeout=60, what="the inserted rows counted")
        wait_for(
            lambda: counts(pg, f"{schema}.lines") == {"x, with a comma": (1, 5), "y": (1, 0)},
            timeout=60,
            what="the csv stream's rows",
        )
        with pg("sv_owner") as conn:
            assert conn.execute("SELECT count(*) FROM cv.stream_inbox WHERE stream = %s", (clicks,)).fetchone()[0] == 0
            # ts, never given, took each record's timestamp (the INSERT's time), as timestamp_column says
            assert conn.execute(f"SELECT sum(n) = sum(stamped) FROM {schema}.clicks").fetchone() == (True,)
    finally:
        stderr = stop_process(relay)
        assert "Traceback" not in stderr, stderr[-3000:]


def test_a_value_of_the_wrong_type_fails_the_insert_and_a_broken_rule_is_dead_lettered(stack, pg, kafka, setup):
    clicks, topic = setup["clicks"], setup["topics"][0]
    with pg("sv_writer") as conn, pytest.raises(psycopg.errors.InvalidTextRepresentation):
        conn.execute(f"INSERT INTO {clicks} (url, ms) VALUES ('a', 'not a number')")
    relay = start_relay(stack, setup["group"])
    try:
        with pg("sv_writer", autocommit=True) as conn:
            conn.execute(f"INSERT INTO {clicks} (url, ms) VALUES (NULL, 1)")  # the stream says NOT NULL
        consumer = Consumer(
            {"bootstrap.servers": kafka.bootstrap_servers, "group.id": unique("dlq"), "auto.offset.reset": "earliest"}
        )
        consumer.subscribe([f"{topic}.dlq"])
        try:
            message = wait_for(lambda: _value(consumer), timeout=60, what="the dead letter")
        finally:
            consumer.close()
        assert json.loads(message)["url"] is None
    finally:
        stop_process(relay)


def _value(consumer: Consumer) -> bytes | None:
    message = consumer.poll(0.5)
    return message.value() if message is not None and not message.error() else None


class CrashAfterKafka(Exception):
    """The relay dying between its Kafka commit and its PostgreSQL delete."""


def test_a_relay_dead_between_kafka_commit_and_its_delete_publishes_nothing_twice(
    stack, pg, kafka, secrets_dir, setup, monkeypatch
):
    schema, clicks, group = setup["schema"], setup["clicks"], setup["group"]
    before = counts(pg, f"{schema}.clicks").get("crash", (0, 0))[0]
    with pg("sv_writer", autocommit=True) as conn:
        conn.execute(f"INSERT INTO {clicks} (url, ms) SELECT 'crash', 1 FROM generate_series(1, 300)")
    settings = InboxSettings()
    writer = PostgresSettings(host="127.0.0.1", port=stack.pgport, user="sv_writer", secrets_dir=secrets_dir)

    first = InboxRelay(writer, kafka, settings, partitions=2, group_id=group)
    calls = []

    def crash(conn, page):
        calls.append(page)
        raise CrashAfterKafka

    with psycopg.connect(writer.conninfo(), autocommit=True) as conn:
        first.recover(conn)
        monkeypatch.setattr(first, "_delete", crash)
        with pytest.raises(CrashAfterKafka):
            first.step(conn)
        assert calls, "the page was published to Kafka before the delete"
        assert conn.execute("SELECT count(*) FROM cv.stream_inbox WHERE stream = %s", (clicks,)).fetchone()[0] == 300
        # A new incarnation fences the old one, reads where Kafka stands, and forgets those rows.
        second = InboxRelay(writer, kafka, settings, partitions=2, group_id=group)
        second.recover(conn)
        assert conn.execute("SELECT count(*) FROM cv.stream_inbox WHERE stream = %s", (clicks,)).fetchone()[0] == 0
        assert second.step(conn) == 0
    wait_for(lambda: counts(pg, f"{schema}.clicks").get("crash", (0, 0))[0] == before + 300, timeout=60)
    assert counts(pg, f"{schema}.clicks")["crash"][0] == before + 300


def test_kill_9_of_the_relay_while_rows_are_written_loses_and_doubles_nothing(stack, pg, setup):
    schema, clicks = setup["schema"], setup["clicks"]
    before = counts(pg, f"{schema}.clicks").get("kill", (0, 0))[0]
    relay = start_relay(stack, setup["group"])
    try:
        with pg("sv_writer", autocommit=True) as conn:
            for i in range(12):
                conn.execute(f"INSERT INTO {clicks} (url, ms) SELECT 'kill', 1 FROM generate_series(1, 250)")
                if i % 4 == 3:  # kill -9 mid-flight, start again
                    relay.kill()
                    relay.wait(timeout=30)
                    relay = start_relay(stack, setup["group"])
        wait_for(lambda: counts(pg, f"{schema}.clicks").get("kill", (0, 0))[0] == before + 3000, timeout=90)
    finally:
        stop_process(relay)


def test_a_row_too_large_for_its_topic_is_dead_lettered_and_the_rows_beside_it_are_published(
    stack, pg, kafka, admin, setup
):
    # The broker refuses the whole batch of the large row, the rows of its transaction with it.
    topic, stream = unique("it-inbox-small"), f"{setup['schema']}_small"
    admin.create_topics([NewTopic(topic, 1, 1, config={"max.message.bytes": "2000"})])[topic].result(30)
    with pg("sv_owner", autocommit=True) as conn:
        catalog.define(
            conn,
            f"CREATE STREAM {stream} (url text, body text)"
            f" WITH (topic = '{topic}', consumer_group = '{setup['group']}')",
        )
    relay = start_relay(stack, setup["group"])
    try:
        with pg("sv_writer", autocommit=True) as conn:
            with conn.transaction():
                conn.execute(f"INSERT INTO {stream} (url, body) VALUES ('a', 'x')")
                conn.execute(  # 12,800 hex digits: no compression brings them under 2,000 bytes
                    f"INSERT INTO {stream} (url, body)"
                    " SELECT 'big', string_agg(md5(random()::text), '') FROM generate_series(1, 400)"
                )
                conn.execute(f"INSERT INTO {stream} (url, body) VALUES ('b', 'y')")
            conn.execute(f"INSERT INTO {stream} (url, body) VALUES ('after', 'z')")
        wait_for(lambda: len(records_of(kafka, topic)) == 3, timeout=60, what="the rows beside the large one")
        assert [json.loads(value)["url"] for value, _ in records_of(kafka, topic)] == ["a", "b", "after"]
        [(value, headers)] = wait_for(lambda: records_of(kafka, f"{topic}.dlq"), timeout=30, what="the dead letter")
        assert json.loads(value)["url"] == "big"
        assert headers["dlq.reason"] == b"refused"
        assert b"too large" in headers["dlq.detail"]
        with pg("sv_owner") as conn:
            assert conn.execute("SELECT count(*) FROM cv.stream_inbox WHERE stream = %s", (stream,)).fetchone()[0] == 0
    finally:
        stderr = stop_process(relay)
        with pg("sv_owner", autocommit=True) as conn:
            catalog.define(conn, f"DROP STREAM {stream}")
        delete_topics([topic, f"{topic}.dlq"])
    assert "Traceback" not in stderr, stderr[-3000:]


def records_of(kafka, topic: str) -> list[tuple[bytes, dict[str, bytes]]]:
    """The committed records of `topic`, written in the inbox's Kafka transactions: value, headers."""
    return [(m.value(), dict(m.headers() or [])) for m in topic_records(kafka, topic, transactional=True)]
