"""A chain of views over views through a real runner and Kafka, across kill -9: exactly once end to end.

The runner (`python -m pipelines.cv.runner --group G`, its own consumer group) applies the likes
from Kafka to the first level and, in its feeds thread (pipelines.cv.feeds), each level's changes to
the next. Killed with SIGKILL mid-stream and started again, it ends with every level equal to
PostgreSQL's aggregates over the raw events: a Kafka batch and its offsets, a feed's page and its
reader position, each commit together.
"""

from __future__ import annotations

import signal

import pytest

from tests.integration.conftest import as_stream_table, start_runner, stop_runner, throwaway_views, unique, wait_for
from tests.integration.processes import stop_process
from tests.integration.test_pipeline_recovery import PARTITIONS, committed, high_watermarks, produce_likes

BUCKETS = "SELECT oid % 20 AS bucket, count(*) AS n, count(DISTINCT uid) AS fans FROM {src} GROUP BY 1"
GROUPS = (
    "SELECT bucket % 4 AS g, sum(n) AS n, max(n) AS top, min(fans) AS low, count(*) AS buckets FROM {src} GROUP BY 1"
)
TOTAL = "SELECT g % 2 AS half, sum(n) AS n, max(top) AS top, sum(buckets) AS buckets FROM {src} GROUP BY 1"


@pytest.fixture
def scenario(pg, kafka, topic_factory, stack):
    topic = topic_factory("it-vov", partitions=PARTITIONS)
    name, group = topic.replace("-", "_"), unique("it-group")
    definitions = f"""
        CREATE STREAM {name} (oid bigint, uid bigint, ts timestamptz) WITH (
            topic = '{topic}', key = 'oid, uid', kafka_key = 'oid', timestamp_column = 'ts',
            action_field = 'action', insert_actions = 'like', delete_actions = 'unlike',
            consumer_group = '{group}');
        CREATE CONTINUOUS VIEW {name}.buckets AS {BUCKETS.format(src=name)};
        CREATE CONTINUOUS VIEW {name}.groups AS {GROUPS.format(src=f"{name}.buckets")};
        CREATE CONTINUOUS VIEW {name}.total AS {TOTAL.format(src=f"{name}.groups")};
    """
    with throwaway_views(pg, name, [name], definitions):
        yield {"topic": topic, "stream": name, "group": group}


def caught_up(conn, schema: str) -> bool:
    """Every feed of the chain has taken its upstream's last change."""
    rows = conn.execute(
        "SELECT r.position = p.last FROM cv.change_readers AS r JOIN cv.view_change_positions AS p ON p.view = r.view"
        " WHERE r.view LIKE %s",
        (f"{schema}.%",),
    ).fetchall()
    return len(rows) == 2 and all(done for (done,) in rows)


def test_a_chain_fed_by_a_runner_killed_mid_stream_equals_the_raw_events_aggregates(pg, kafka, stack, scenario):
    events = produce_likes(kafka, scenario["topic"], 20_000, seed=7)
    schema = scenario["stream"]
    runner = start_runner(stack, scenario["group"], PIPELINE_BATCH_MAX="200", PIPELINE_FEED_PAGE="50")
    with pg("sv_owner", autocommit=True) as conn:
        wait_for(lambda: sum(committed(pg, scenario).values()) > 3_000, what="a first part applied")
        wait_for(
            lambda: (
                conn.execute(
                    "SELECT count(*) FROM cv.change_readers WHERE view LIKE %s AND position > 0", (f"{schema}.%",)
                ).fetchone()[0]
                == 2
            ),
            what="both feeds moving",
        )
        stop_process(runner, signal.SIGKILL, timeout=30)
        runner = start_runner(stack, scenario["group"], PIPELINE_BATCH_MAX="200", PIPELINE_FEED_PAGE="50")
        try:
            marks = {p: end for p, end in high_watermarks(kafka, scenario["topic"]).items() if end}  # with events
            wait_for(lambda: committed(pg, scenario) == marks, timeout=180, what="every event applied")
            wait_for(lambda: caught_up(conn, schema), timeout=120, what="the feeds caught up")
        finally:
            stop_runner(runner)
        live = set()
        for op, oid, uid in events:  # one key always lands in one partition: its order is kept
            (live.add if op == 1 else live.discard)((oid, uid))
        with conn.transaction(force_rollback=True):
            as_stream_table(conn, "raw", "oid bigint, uid bigint, ts timestamptz", [(o, u, None) for o, u in live])
            buckets = f"({BUCKETS.format(src='raw')}) AS b"
            groups = f"({GROUPS.format(src=buckets)}) AS g"
            expected = {
                "buckets": conn.execute(f"SELECT * FROM {buckets} ORDER BY 1").fetchall(),
                "groups": conn.execute(f"SELECT * FROM {groups} ORDER BY 1").fetchall(),
                "total": conn.execute(f"SELECT * FROM ({TOTAL.format(src=groups)}) AS t ORDER BY 1").fetchall(),
            }
        for level, rows in expected.items():
            assert conn.execute(f"SELECT * FROM {schema}.{level} ORDER BY 1").fetchall() == rows, level
