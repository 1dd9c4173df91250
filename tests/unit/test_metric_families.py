"""The metrics' own logic without services: what a committed batch counts, lag, freshness, slots, labels."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from types import SimpleNamespace

import pytest
from prometheus_client import REGISTRY, CollectorRegistry

from pipelines import metrics
from pipelines.runtime.consumer import per_record
from pipelines.runtime.events import InvalidEvent
from pipelines.runtime.testing import (
    MemoryBroker,
    MemoryDatabase,
    MemoryOffsets,
    MemorySink,
    memory_pipeline,
    run_until_caught_up,
)


def value(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


@pytest.fixture
def pipeline() -> str:
    """A pipeline name of its own: the registry is the process's, shared by every test."""
    return f"test-{uuid.uuid4().hex[:8]}"


def test_a_committed_batch_counts_events_per_stream_dead_letters_and_its_size(pipeline):
    m = metrics.PipelineMetrics(pipeline)
    m.name_streams({"cdc.app.likes": "app_likes", "likes": "likes"})

    m.committed(7, {"likes": 4, "cdc.app.likes": 1}, Counter({("likes", "invalid_json"): 2}), {})
    m.committed(3, {"likes": 3, "other": 0}, {}, {})

    assert value("streamviews_events_total", pipeline=pipeline, stream="likes") == 7
    assert value("streamviews_events_total", pipeline=pipeline, stream="app_likes") == 1
    # A topic the pipeline names no stream for is its own stream (the audit writer's `audit`).
    assert value("streamviews_events_total", pipeline=pipeline, stream="other") == 0
    assert value("streamviews_dead_letters_total", pipeline=pipeline, topic="likes", reason="invalid_json") == 2
    assert value("streamviews_batch_size_events_count", pipeline=pipeline) == 2
    assert value("streamviews_batch_size_events_sum", pipeline=pipeline) == 10
    assert value("streamviews_batch_size_events_bucket", pipeline=pipeline, le="1.0") == 0
    assert value("streamviews_batch_size_events_bucket", pipeline=pipeline, le="10.0") == 2


def test_rollbacks_reseeks_and_commit_time(pipeline):
    m = metrics.PipelineMetrics(pipeline)
    m.rolled_back()
    m.reseeked()
    m.reseeked()
    m.commit_seconds(0.02)

    assert value("streamviews_rollbacks_total", pipeline=pipeline) == 1
    assert value("streamviews_reseeks_total", pipeline=pipeline) == 2
    assert value("streamviews_commit_duration_seconds_bucket", pipeline=pipeline, le="0.025") == 1
    assert value("streamviews_commit_duration_seconds_bucket", pipeline=pipeline, le="0.01") == 0


def test_freshness_is_the_age_of_the_newest_event_time_committed_per_stream(pipeline):
    m = metrics.PipelineMetrics(pipeline)
    m.name_streams({"likes": "likes"})
    now_ms = int(time.time() * 1000)
    m.committed(2, {"likes": 2}, {}, {("likes", 0): now_ms - 30_000, ("likes", 1): now_ms - 10_000})
    m.committed(1, {"likes": 1}, {}, {("likes", 0): now_ms - 60_000})  # older: the newest stays

    age = value("streamviews_freshness_seconds", pipeline=pipeline, stream="likes")
    assert 10 <= age < 15

    m.event_times({("ahead", 0): now_ms + 60_000})  # a producer's clock ahead of ours
    assert value("streamviews_freshness_seconds", pipeline=pipeline, stream="ahead") == 0

    m.name_streams({"ahead": "ahead"})  # `likes` dropped from the catalog
    assert value("streamviews_freshness_seconds", pipeline=pipeline, stream="likes") is None


def test_lag_gauges_follow_the_partitions_held(pipeline):
    m = metrics.PipelineMetrics(pipeline)
    m.set_lag({("likes", 0): 5, ("likes", 1): 0})
    assert value("streamviews_consumer_lag_records", pipeline=pipeline, topic="likes", partition="0") == 5

    m.set_lag({("likes", 1): 2})  # partition 0 was revoked

    assert value("streamviews_consumer_lag_records", pipeline=pipeline, topic="likes", partition="0") is None
    assert value("streamviews_consumer_lag_records", pipeline=pipeline, topic="likes", partition="1") == 2


def test_lag_counts_from_the_stored_offset_to_the_cached_high_watermark(pipeline):
    broker, db = MemoryBroker(), MemoryDatabase()
    broker.produce("t", [b"x"] * 120, partition=0)
    broker.produce("t", [b"x"] * 7, partition=1)
    offsets = MemoryOffsets(db, pipeline)
    with db.connect().transaction() as conn:
        offsets.advance(conn, {("t", 0): 100}, {})  # committed by an earlier run
    running = memory_pipeline(broker, db, MemorySink(), topics=["t"], group_id=pipeline, name=pipeline, batch_max=5)

    running.step()  # one poll of 5 records, all from partition 0: partition 1 not fetched yet
    running.settle()
    running.refresh_lag()

    lags = {p: value("streamviews_consumer_lag_records", pipeline=pipeline, topic="t", partition=p) for p in "01"}
    assert lags == {"0": 15, "1": None}  # no watermark known for 1 before its first fetch: not exported

    run_until_caught_up(running)
    running.refresh_lag()

    lags = {p: value("streamviews_consumer_lag_records", pipeline=pipeline, topic="t", partition=p) for p in "01"}
    assert lags == {"0": 0, "1": 0}


def test_a_committed_batch_stores_each_partitions_last_kafka_timestamp_and_counts_per_topic(pipeline):
    broker, db = MemoryBroker(), MemoryDatabase()
    for topic, partition, ts in [("a", 0, 1_000), ("a", 0, 2_000), ("b", 0, -1), ("a", 1, 5_000), ("a", 0, 3_000)]:
        broker.produce(topic, [b"{}"], partition=partition, timestamp_ms=ts)  # -1: the record carries none
    running = memory_pipeline(broker, db, MemorySink(), topics=["a", "b"], group_id=pipeline, name=pipeline)

    run_until_caught_up(running)

    offsets = MemoryOffsets(db, pipeline)
    assert offsets.stored() == {("a", 0): 3, ("a", 1): 1, ("b", 0): 1}
    with db.connect().transaction() as conn:
        times = offsets.event_times(conn, list(offsets.stored()))
    assert times == {("a", 0): 3.0, ("a", 1): 5.0}  # b's record carries no timestamp
    assert value("streamviews_events_total", pipeline=pipeline, stream="a") == 4
    assert value("streamviews_events_total", pipeline=pipeline, stream="b") == 1


def test_a_per_record_decoder_counts_the_records_of_each_topic():
    def decode(key, value, ts):
        if value == b"bad":
            raise InvalidEvent("invalid_json", "bad")
        return None if value is None else value

    records = [
        SimpleNamespace(
            topic=lambda: "t", partition=lambda: 0, key=lambda: None, value=lambda v=v: v, timestamp=lambda: (1, 0)
        )
        for v in (b"x", b"bad", None, b"y")
    ]
    decoded = per_record(decode)({"t": records, "u": records[:1]})

    assert (decoded.size, decoded.counts) == (3, {"t": 2, "u": 1})
    assert [error.reason for _, error in decoded.rejected] == ["invalid_json"]


def test_the_series_of_a_dropped_stream_and_its_topic_leave_the_endpoint(pipeline):
    m = metrics.PipelineMetrics(pipeline)
    m.name_streams({"clicks": "clicks", "views": "views"})
    m.committed(3, {"clicks": 2, "views": 1}, Counter({("clicks", "malformed_json"): 1}), {})

    m.name_streams({"views": "views"})  # clicks was dropped

    assert value("streamviews_events_total", pipeline=pipeline, stream="clicks") is None
    assert value("streamviews_dead_letters_total", pipeline=pipeline, topic="clicks", reason="malformed_json") is None
    assert value("streamviews_events_total", pipeline=pipeline, stream="views") == 1


def test_quarantined_views_and_held_streams_are_exported_while_they_last():
    registry = CollectorRegistry()
    for family in metrics.RUNNER_FAMILIES.families:
        registry.register(family)

    metrics.set_failures([("public.pv", "page_views")], ["likes"])
    assert (
        registry.get_sample_value("streamviews_view_quarantine_active", {"view": "public.pv", "stream": "page_views"})
        == 1
    )
    assert registry.get_sample_value("streamviews_stream_hold_active", {"stream": "likes"}) == 1

    metrics.set_failures([], [])
    assert (
        registry.get_sample_value("streamviews_view_quarantine_active", {"view": "public.pv", "stream": "page_views"})
        is None
    )
    assert registry.get_sample_value("streamviews_stream_hold_active", {"stream": "likes"}) is None


def test_replication_slots_gone_are_no_longer_exported():
    registry = CollectorRegistry()  # the runner's own families are registered by the runner only
    for family in metrics.RUNNER_FAMILIES.families:
        registry.register(family)

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    metrics.set_replication_slots([("debezium_a", 1024, True), ("new_slot", None, False)])
    assert value("streamviews_replication_slot_lag_bytes", slot="debezium_a") == 1024
    assert value("streamviews_replication_slot_active", slot="new_slot") == 0
    assert value("streamviews_replication_slot_lag_bytes", slot="new_slot") is None

    metrics.set_replication_slots([("new_slot", 10, True)])

    assert value("streamviews_replication_slot_active", slot="debezium_a") is None
    assert value("streamviews_replication_slot_lag_bytes", slot="debezium_a") is None
    assert value("streamviews_replication_slot_active", slot="new_slot") == 1
    assert value("streamviews_replication_slot_lag_bytes", slot="new_slot") == 10


def test_serving_is_off_at_port_0_and_a_taken_port_does_not_stop_the_service():
    import socket

    from pipelines.settings import MetricsSettings

    assert metrics.serve(MetricsSettings(port=0), "test") is False
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert metrics.serve(MetricsSettings(port=taken.getsockname()[1]), "test") is False


def test_families_of_one_service_have_no_samples_in_the_others():
    metrics.PULLER_ROWS_INDEXED.inc(3)
    families = metrics.ServiceFamilies(metrics.PULLER_ROWS_INDEXED, metrics.PULLER_ROWS_BEHIND)

    assert [(m.name, m.samples) for m in families.collect()] == [
        ("streamviews_puller_rows_indexed", []),
        ("streamviews_puller_rows_behind", []),
    ]
    families.owned = True  # in the puller
    samples = {s.name: s.value for m in families.collect() for s in m.samples}
    assert samples["streamviews_puller_rows_indexed_total"] >= 3
    assert "streamviews_puller_rows_behind" in samples


def test_every_family_follows_prometheus_naming():
    families = list(REGISTRY.collect())
    names = {family.name for family in families if family.name.startswith("streamviews_")}
    assert len(names) == 23  # issue 15's contract, issue 23's three, issue 25's sinks' four, the inbox's two
    for name in names:
        assert name == name.lower()
    units = ("_seconds", "_bytes", "_records", "_events", "_behind", "_active", "_changes")
    counters = {family.name for family in families if family.type == "counter"}
    for name in names - counters:
        assert name.endswith(units), name
