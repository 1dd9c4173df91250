"""A sink of a continuous transform: its output rows, as recorded, on a Kafka topic.

A transform's rows are appended and never current, so its sink publishes no snapshot: the records
are the rows recorded after the sink was made, each once (after a crash, re-sent with the same
position), keyed by the transform's key and filtered by the sink's `where` over `(new)`.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pipelines.cv import catalog
from tests.integration.conftest import apply_rows, delete_topics, throwaway_views, unique, wait_for
from tests.integration.processes import stop_process
from tests.integration.test_sink_relay import read_topic, start_relay

NOW = datetime.now(UTC)


@pytest.fixture
def scenario(stack, pg):
    name = unique("snkt")
    group, clicks, topic = f"it-{name}", f"{name}_clicks", unique("it-snkt")
    definitions = f"""
        CREATE STREAM {clicks} (url text, ms int, ts timestamptz) WITH (topic = '{clicks}', consumer_group = '{group}');
        CREATE CONTINUOUS TRANSFORM {name}.slow WITH (key = 'url') AS
            SELECT url, ms FROM {clicks} WHERE ms > 100;
        CREATE SINK {name}_out FROM {name}.slow WITH (topic = '{topic}', format = 'changes', where = '(new).ms < 1000');
    """
    with throwaway_views(pg, name, [clicks], definitions):
        try:
            yield {"name": name, "group": group, "clicks": clicks, "topic": topic}
        finally:
            with pg("sv_owner", autocommit=True) as conn:
                catalog.define(conn, f"DROP SINK IF EXISTS {name}_out")
            delete_topics([topic])


def test_a_transforms_rows_reach_its_sink_once_filtered_and_keyed(stack, pg, kafka, scenario):
    with pg("sv_writer", autocommit=True) as writer:
        apply_rows(
            writer,
            scenario["clicks"],
            [1] * 5,
            [("/a", 50, NOW), ("/a", 150, NOW), ("/b", 300, NOW), ("/c", 5000, NOW), ("/a", 200, NOW)],
        )
    relay = start_relay(stack, scenario)
    try:
        wait_for(lambda: _count(kafka, scenario["topic"]) == 3, timeout=60, what="the transform's rows on the topic")
        records = read_topic(kafka, scenario["topic"])
    finally:
        stop_process(relay)
    by_position = sorted((position, key, value["after"]) for key, value, position in records)
    assert [(key, after) for _, key, after in by_position] == [
        ('{"url": "/a"}', {"url": "/a", "ms": 150}),
        ('{"url": "/b"}', {"url": "/b", "ms": 300}),
        ('{"url": "/a"}', {"url": "/a", "ms": 200}),
    ]
    assert all(value["before"] is None for _, value, _ in records)


def _count(kafka, topic: str) -> int:
    try:
        return len(read_topic(kafka, topic))
    except (KeyError, AssertionError):
        return 0
