"""The supervised services' Prometheus metrics, read over HTTP as Prometheus reads them.

Events go to a stream declared for this test (the supervised `streams` runner picks it up from the
catalog) and to the stack's own `audit` topic (a few marked events, written and indexed by the
supervised `audit` writer and `ctid_puller`): each service's /metrics must count them and show its
lag back at 0. `make status`'s freshness is read from PostgreSQL, and checked here too.
"""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from datetime import UTC, datetime

import pytest
from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from pipelines.cv import catalog
from pipelines.cv.cli_common import kafka_admin
from pipelines.cv.runner import DEFAULT_GROUP
from pipelines.cv.status import runner_status
from tests.integration.conftest import unique, wait_for

Samples = dict[tuple[str, frozenset], float]
REASON = "malformed_json"  # the dead-letter reason of a record that is not JSON


def scrape(port: int) -> tuple[Samples, set[str]]:
    """A service's samples by (name, labels), and the families it declares (with or without samples)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples: Samples = {}
    families = set()
    for family in text_string_to_metric_families(text):
        families.add(family.name)
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples, families


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def matching(samples: Samples, name: str, **labels: str) -> dict[frozenset, float]:
    """Every sample of `name` whose labels include these."""
    wanted = set(labels.items())
    return {key: v for (n, key), v in samples.items() if n == name and wanted <= key}


@pytest.fixture
def stream(stack, pg, admin):
    """A declared stream (2 partitions) with a view, run by the supervised runner; all dropped after."""
    name = unique("metrics")
    with pg("sv_owner", autocommit=True) as conn:
        catalog.define(
            conn,
            f"CREATE STREAM {name} (url text NOT NULL, uid bigint NOT NULL)"
            f" WITH (topic = '{name}', partitions = 2);"
            f" CREATE CONTINUOUS VIEW public.{name}_by_url AS SELECT url, count(*) AS views FROM {name} GROUP BY url;",
        )
    yield name
    with pg("sv_owner", autocommit=True) as conn:
        catalog.drop(conn, [f"public.{name}_by_url"], "view")
        catalog.drop(conn, [name], "stream")
        conn.execute("DELETE FROM ops.kafka_offsets WHERE group_id = %s AND topic = %s", (DEFAULT_GROUP, name))
        conn.execute("DELETE FROM ops.dead_letters WHERE group_id = %s AND topic = %s", (DEFAULT_GROUP, name))
    topics = [t for t in (name, f"{name}.dlq") if t in admin.list_topics(timeout=10).topics]
    if topics:
        for future in admin.delete_topics(topics).values():
            future.result(30)


def produce(kafka, topic: str, values: list[bytes], partition: int = 0, key: bytes | None = None) -> None:
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "linger.ms": 5})
    for v in values:
        producer.produce(topic, value=v, key=key, partition=partition)
    assert producer.flush(30) == 0


def test_the_stream_runner_counts_events_per_stream_and_its_lag_returns_to_0(stack, kafka, pg, stream):
    port = stack.streams_metrics_port
    # Subscribed: both partitions of the new topic are held (the idle one too) and caught up.
    wait_for(
        lambda: len(matching(scrape(port)[0], "streamviews_consumer_lag_records", topic=stream)) == 2,
        timeout=60,
        what="the runner to hold the new stream's partitions",
    )
    produced_at = time.time()
    events = [json.dumps({"url": f"/p/{i % 3}", "uid": i}).encode() for i in range(50)]
    produce(kafka, stream, [*events, b"not json"], partition=0)  # partition 1 gets nothing

    def counted() -> Samples | None:
        samples, _ = scrape(port)
        lags = matching(samples, "streamviews_consumer_lag_records", pipeline="streams", topic=stream)
        dead = value(samples, "streamviews_dead_letters_total", pipeline="streams", topic=stream, reason=REASON)
        done = (
            value(samples, "streamviews_events_total", pipeline="streams", stream=stream) == 50
            and dead == 1
            and len(lags) == 2
            and set(lags.values()) == {0}
        )
        return samples if done else None

    samples = wait_for(counted, timeout=60, what="50 events counted, 1 dead letter, and the lag back at 0")

    freshness = value(samples, "streamviews_freshness_seconds", pipeline="streams", stream=stream)
    assert freshness is not None
    assert freshness <= time.time() - produced_at + 5  # the events' own age, not the stream's
    assert value(samples, "streamviews_batch_size_events_count", pipeline="streams") >= 1
    assert value(samples, "streamviews_commit_duration_seconds_count", pipeline="streams") >= 1
    assert value(samples, "streamviews_rollbacks_total", pipeline="streams") is not None
    assert value(samples, "streamviews_reseeks_total", pipeline="streams") is not None
    _, families = scrape(port)
    assert {"streamviews_replication_slot_lag_bytes", "streamviews_replication_slot_active"} <= families

    # `make status` shows the same freshness, from PostgreSQL alone.
    with pg("sv_writer") as conn:
        (status,) = runner_status(conn, kafka_admin(kafka), kafka, DEFAULT_GROUP, [stream])
    assert status.lag == 0
    assert status.newest_event is not None
    assert abs(status.newest_event.timestamp() - produced_at) < 30
    assert 0 <= status.freshness_s < 60


def test_the_runner_exports_every_logical_replication_slot(stack, pg):
    slot = f"metrics_{uuid.uuid4().hex[:8]}"
    with pg("postgres", autocommit=True) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    try:
        samples = wait_for(
            lambda: (
                (s := scrape(stack.streams_metrics_port)[0])
                and value(s, "streamviews_replication_slot_active", slot=slot) is not None
                and s
            ),
            timeout=60,
            what="the new slot exported",
        )
        assert value(samples, "streamviews_replication_slot_active", slot=slot) == 0  # nobody reads it
        assert value(samples, "streamviews_replication_slot_lag_bytes", slot=slot) >= 0
    finally:
        with pg("postgres", autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    wait_for(
        lambda: value(scrape(stack.streams_metrics_port)[0], "streamviews_replication_slot_active", slot=slot) is None,
        timeout=60,
        what="the dropped slot no longer exported",
    )


def test_the_audit_writer_and_the_puller_count_audit_events_and_catch_up(stack, kafka):
    writer, puller = stack.audit_metrics_port, stack.ctid_puller_metrics_port

    def events(samples: Samples) -> float:
        return value(samples, "streamviews_events_total", pipeline="audit", stream="audit") or 0.0

    def indexed(samples: Samples) -> float:
        return value(samples, "streamviews_puller_rows_indexed_total") or 0.0

    written_before, indexed_before = events(scrape(writer)[0]), indexed(scrape(puller)[0])
    marker = uuid.uuid4().hex
    now = datetime.now(UTC).isoformat()
    audit = [json.dumps({"uid": 7, "ts": now, "content": f"metrics test {marker} {i}"}).encode() for i in range(5)]
    produce(kafka, "audit", audit, key=b"7")

    def written() -> bool:
        samples, _ = scrape(writer)
        lags = matching(samples, "streamviews_consumer_lag_records", pipeline="audit", topic="audit")
        return events(samples) >= written_before + 5 and bool(lags) and set(lags.values()) == {0}

    wait_for(written, timeout=60, what="the audit writer to count the events and catch up")

    def caught_up() -> bool:
        samples, _ = scrape(puller)
        return (
            indexed(samples) >= indexed_before + 5
            and value(samples, "streamviews_puller_rows_behind") == 0
            and value(samples, "streamviews_puller_seconds_behind") == 0
        )

    wait_for(caught_up, timeout=90, what="the puller to index the rows and report no backlog")
    _, families = scrape(puller)
    assert "streamviews_elasticsearch_bulk_failures" in families  # a counter family: its name without _total
