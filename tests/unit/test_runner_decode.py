"""The runner's decoding of a poll: topic by topic, into each target stream; a decoder bug loses no good event.

A real `StreamRunner` over the in-memory doubles (pipelines/runtime/testing/): no Kafka, no PostgreSQL.
"""

from __future__ import annotations

import json

from pipelines.cv.decoding.stream_decoder import StreamDecoder
from pipelines.cv.frontend.statements import NO_SCOPE, parse
from pipelines.cv.model import StreamDef
from pipelines.cv.runner import Source, StreamRunner
from pipelines.runtime.testing import MemoryBroker, MemoryDatabase, MemoryMessage, MemoryOffsets
from pipelines.settings import KafkaSettings, PipelineSettings, PostgresSettings

LIKES = parse(
    "CREATE STREAM likes (oid bigint NOT NULL, uid bigint NOT NULL, ts timestamptz NOT NULL)"
    " WITH (topic = 'likes', key = 'oid, uid', timestamp_column = 'ts')",
    NO_SCOPE,
)
APP_LIKES = parse(
    "CREATE STREAM app_likes (oid bigint NOT NULL, uid bigint NOT NULL, created_at timestamptz NOT NULL)"
    " WITH (topic = 'cdc.app.likes', format = 'debezium', into = 'likes', timestamp_column = 'created_at')",
    NO_SCOPE,
)


def runner(*streams: StreamDef) -> StreamRunner:
    """A real stream runner over the in-memory Kafka and offsets, loaded with these streams as the catalog's."""
    runner = StreamRunner(
        group_id="g",
        kafka=KafkaSettings(),
        postgres=PostgresSettings(),
        settings=PipelineSettings(),
        clients=MemoryBroker(),
        offsets=MemoryOffsets(MemoryDatabase(), "g"),
    )
    runner.load({stream.name: stream for stream in streams}, version=1)
    return runner


def like(oid: int, uid: int) -> MemoryMessage:
    return MemoryMessage("likes", 0, 0, json.dumps({"oid": oid, "uid": uid}).encode())


def row_insert(oid: int, uid: int) -> MemoryMessage:
    return MemoryMessage("cdc.app.likes", 0, 0, json.dumps({"op": "c", "after": {"oid": oid, "uid": uid}}).encode())


def test_a_stream_fed_into_another_joins_its_changes_in_one_batch():
    by_topic = {"likes": [like(1, 2)], "cdc.app.likes": [row_insert(3, 4)]}

    decoded = runner(LIKES, APP_LIKES).decode(by_topic)

    assert decoded.size == 2
    assert decoded.payload["likes"].columns[:2] == [[1, 3], [2, 4]]
    assert decoded.counts == {"likes": 1, "cdc.app.likes": 1}  # events per topic, for the metrics


def test_loading_the_catalog_creates_each_streams_topic_and_its_dead_letter_topic():
    broker = runner(LIKES, APP_LIKES).clients

    assert sorted(broker.topics) == ["cdc.app.likes", "cdc.app.likes.dlq", "likes", "likes.dlq"]


def test_records_of_a_dropped_stream_are_consumed_and_applied_nowhere():
    decoded = runner().decode({"likes": [like(1, 2)]})

    assert decoded.size == 0
    assert decoded.rejected == []


class BrokenBatchDecoder(StreamDecoder):
    def decode_batch(self, records):
        raise RuntimeError("a bug in the fast path")


def test_a_decoder_bug_falls_back_to_record_by_record_and_loses_no_good_event():
    bad = MemoryMessage("likes", 0, 1, b'{"oid": "x", "uid": 2}')
    running = runner(LIKES)
    running.sources["likes"] = Source(LIKES, "likes", BrokenBatchDecoder(LIKES))

    decoded = running.decode({"likes": [like(1, 2), bad, like(5, 6)]})

    assert decoded.payload["likes"].columns[:2] == [[1, 5], [2, 6]]
    assert [(record, error.reason) for record, error in decoded.rejected] == [(bad, "wrong_type")]
