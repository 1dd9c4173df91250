"""Operating views from SQL, under PipelineDB's names (migration 0028, issue 26 item 4).

- `pipelinedb.query_stats` / `stream_stats`: what each batch applied, counted in the batch's own
  transaction (a rolled-back batch counts nothing);
- `pipelinedb.truncate_continuous_view`: a view over an append-only stream emptied; over a keyed
  stream refused, in one line;
- `pipelinedb.deactivate` / `activate` of a view: left out, then resumed at once (true, as PipelineDB
  answered, with what was done as a NOTICE); of a stream: its topic no longer read, then read on from
  where it stopped: nothing lost.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import psycopg
import pytest
from confluent_kafka import Producer

from pipelines.cv.engine import StreamMaintainer
from tests.integration.conftest import (
    apply_rows,
    delete_topics,
    start_runner,
    stop_runner,
    throwaway_views,
    unique,
    wait_for,
)

NOW = datetime.now(UTC)


@pytest.fixture(scope="module")
def streams(stack, pg):
    name = unique("ops")
    clicks, likes = f"{name}_clicks", f"{name}_likes"
    definitions = f"""
        CREATE STREAM {clicks} (url text, ms int, ts timestamptz) WITH (topic = '{clicks}');
        CREATE STREAM {likes} (oid bigint, uid bigint) WITH (topic = '{likes}', key = 'oid, uid');
        CREATE CONTINUOUS VIEW {name}.clicks AS SELECT url, count(*) AS n FROM {clicks} GROUP BY url;
        CREATE CONTINUOUS VIEW {name}.slow AS
            SELECT url, count(DISTINCT ms) AS speeds FROM {clicks} WHERE ms > 100 GROUP BY url;
        CREATE CONTINUOUS VIEW {name}.likes AS SELECT oid, count(*) AS n FROM {likes} GROUP BY oid;
    """
    with throwaway_views(pg, name, [clicks, likes], definitions):
        yield {"schema": name, "clicks": clicks, "likes": likes}


def stats(conn: psycopg.Connection, view: str) -> tuple[int, int]:
    return conn.execute("SELECT input_rows, executions FROM pipelinedb.query_stats WHERE name = %s", (view,)).fetchone()


def rows(conn: psycopg.Connection, view: str) -> dict[str, int]:
    return dict(conn.execute(f"SELECT url, n FROM {view}").fetchall())


def test_statistics_count_each_committed_batch_and_nothing_of_a_rolled_back_one(pg, writer, streams):
    schema, clicks = streams["schema"], streams["clicks"]
    view = f"{schema}.clicks"
    before = stats(writer, view)
    apply_rows(writer, clicks, [1, 1, 1], [("a", 150, NOW), ("b", 50, NOW), ("a", 200, NOW)])
    with writer.transaction(force_rollback=True):  # applied, then rolled back
        StreamMaintainer(clicks).apply(writer, [1], [["a"], [1], [NOW]])
    assert stats(writer, view) == (before[0] + 3, before[1] + 1)
    stream = writer.execute(
        "SELECT input_rows, input_batches, deactivated FROM pipelinedb.stream_stats WHERE name = %s", (clicks,)
    ).fetchone()
    assert stream[0] >= 3
    assert stream[1] >= 1
    assert stream[2] is False
    with pg("sv_reader") as reader:  # readers see the statistics of the views they may read
        assert reader.execute("SELECT count(*) FROM pipelinedb.query_stats WHERE name = %s", (view,)).fetchone()[0] == 1


def test_truncating_an_append_only_view_empties_it_and_a_keyed_one_is_refused(pg, writer, streams):
    schema, clicks = streams["schema"], streams["clicks"]
    apply_rows(writer, clicks, [1, 1], [("t", 300, NOW), ("t", 400, NOW)])
    with pg("sv_owner") as owner:
        said = []
        owner.add_notice_handler(lambda notice: said.append(notice.message_primary))
        answer = owner.execute("SELECT pipelinedb.truncate_continuous_view(%s)", (f"{schema}.slow",)).fetchone()
        assert answer == ("",)  # void (psycopg reads its empty text), as PipelineDB's; what it did is a NOTICE
        assert said[0].startswith(f"view {schema}.slow truncated:")
        assert owner.execute(f"SELECT count(*) FROM {schema}.slow").fetchone()[0] == 0
        owner.commit()
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="reads keyed stream"):
            owner.execute("SELECT pipelinedb.truncate_continuous_view(%s)", (f"{schema}.likes",))
        owner.rollback()
    # The distinct values' reference counts went with the rows: the same speeds count once again.
    apply_rows(writer, clicks, [1, 1], [("t", 300, NOW), ("t", 300, NOW)])
    assert dict(writer.execute(f"SELECT url, speeds FROM {schema}.slow").fetchall()) == {"t": 1}
    with pg("sv_reader") as reader, pytest.raises(psycopg.errors.InsufficientPrivilege):
        reader.execute("SELECT pipelinedb.truncate_continuous_view(%s)", (f"{schema}.slow",))


def test_a_deactivated_view_misses_events_until_activated_and_counts_those_after_at_once(pg, writer, streams):
    schema, clicks = streams["schema"], streams["clicks"]
    view = f"{schema}.clicks"
    with pg("sv_owner", autocommit=True) as owner:
        said = []
        owner.add_notice_handler(lambda notice: said.append(notice.message_primary))
        assert owner.execute("SELECT pipelinedb.deactivate(%s)", (view,)).fetchone() == (True,)  # PipelineDB's
        assert owner.execute("SELECT pipelinedb.deactivate(%s)", (view,)).fetchone() == (True,)  # again: the same
        assert "deactivated" in said[0]
    start = rows(writer, view).get("d", 0)
    apply_rows(writer, clicks, [1, 1], [("d", 1, NOW), ("d", 1, NOW)])
    assert rows(writer, view).get("d", 0) == start  # left out
    with pg("sv_owner", autocommit=True) as owner:
        assert "applied to it" in owner.execute("SELECT cv.activate(%s)", (view,)).fetchone()[0]
    apply_rows(writer, clicks, [1], [("d", 1, NOW)])  # the next batch, no sweep in between
    assert rows(writer, view).get("d", 0) == start + 1  # maintained again; the two it missed are a gap
    gaps = writer.execute("SELECT reason FROM cv.view_gaps WHERE view = %s", (view,)).fetchall()
    assert ("deactivated",) in gaps


def test_deactivate_names_what_does_not_exist_in_one_line(pg):
    with pg("sv_owner") as owner, pytest.raises(psycopg.errors.UndefinedObject, match="no stream or continuous view"):
        owner.execute("SELECT pipelinedb.deactivate('no_such_thing')")


def test_a_deactivated_stream_is_not_read_and_activated_reads_on_from_where_it_stopped(stack, pg, kafka, admin):
    group, schema = unique("it-ops"), unique("opsrun")
    stream, topic = f"{schema}_s", unique("it-ops")
    definitions = f"""
        CREATE STREAM {stream} (tag text NOT NULL) WITH (topic = '{topic}', consumer_group = '{group}', partitions = 1);
        CREATE CONTINUOUS VIEW {schema}.counts AS SELECT tag, count(*) AS n FROM {stream} GROUP BY tag;
    """
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "enable.idempotence": True})

    def produce(n: int) -> None:
        for _ in range(n):
            producer.produce(topic, value=json.dumps({"tag": "x"}))
        assert producer.flush(30) == 0

    def counted() -> int:
        with pg("sv_owner") as conn:
            return int(conn.execute(f"SELECT coalesce(sum(n), 0) FROM {schema}.counts").fetchone()[0])

    runner = start_runner(stack, group)
    try:
        with throwaway_views(pg, schema, [stream], definitions):
            wait_for(lambda: topic in admin.list_topics(timeout=10).topics, timeout=30, what="the topic made")
            produce(100)
            wait_for(lambda: counted() == 100, timeout=60, what="the first events")
            with pg("sv_owner", autocommit=True) as owner:
                owner.execute("SELECT pipelinedb.deactivate(%s)", (stream,))
            wait_for(lambda: not _assigned(admin, group, topic), timeout=30, what="the runner to drop the topic")
            produce(50)
            with pg("sv_owner", autocommit=True) as owner:
                assert owner.execute(
                    "SELECT deactivated FROM pipelinedb.stream_stats WHERE name = %s", (stream,)
                ).fetchone() == (True,)
                assert counted() == 100
                owner.execute("SELECT pipelinedb.activate(%s)", (stream,))
            wait_for(lambda: counted() == 150, timeout=60, what="the events produced while it was deactivated")
    finally:
        stop_runner(runner)
        delete_topics([topic, f"{topic}.dlq"])


def _assigned(admin, group: str, topic: str) -> bool:
    """Whether a member of the consumer group holds a partition of the topic now."""
    description = admin.describe_consumer_groups([group])[group].result(timeout=30)
    return any(tp.topic == topic for member in description.members for tp in member.assignment.topic_partitions)
