"""The runner's decoding of a poll: topic by topic, into each target stream; a decoder bug loses no good event."""

from __future__ import annotations

import json
from dataclasses import dataclass
from types import SimpleNamespace

from pipelines.cv.decoding.stream_decoder import StreamDecoder
from pipelines.cv.definitions import parse
from pipelines.cv.runner import Source, StreamRunner

LIKES = parse(
    "CREATE STREAM likes (oid bigint NOT NULL, uid bigint NOT NULL, ts timestamptz NOT NULL)"
    " WITH (topic = 'likes', key = 'oid, uid', timestamp_column = 'ts')",
    {},
)
APP_LIKES = parse(
    "CREATE STREAM app_likes (oid bigint NOT NULL, uid bigint NOT NULL, created_at timestamptz NOT NULL)"
    " WITH (topic = 'cdc.app.likes', format = 'debezium', into = 'likes', timestamp_column = 'created_at')",
    {},
)


@dataclass
class Record:
    """A Kafka record as the decoders read it."""

    _topic: str
    _value: bytes | None
    _key: bytes | None = None

    def topic(self) -> str:
        return self._topic

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_795_341_600_000)


def runner(*sources: Source) -> SimpleNamespace:
    return SimpleNamespace(sources={source.stream.topic: source for source in sources})


def like(oid: int, uid: int) -> Record:
    return Record("likes", json.dumps({"oid": oid, "uid": uid}).encode())


def row_insert(oid: int, uid: int) -> Record:
    return Record("cdc.app.likes", json.dumps({"op": "c", "after": {"oid": oid, "uid": uid}}).encode())


def test_a_stream_fed_into_another_joins_its_changes_in_one_batch():
    sources = (Source(LIKES, "likes", StreamDecoder(LIKES)), Source(APP_LIKES, "likes", StreamDecoder(APP_LIKES)))
    by_topic = {"likes": [like(1, 2)], "cdc.app.likes": [row_insert(3, 4)]}

    decoded = StreamRunner.decode(runner(*sources), by_topic)

    assert decoded.size == 2
    assert decoded.payload["likes"].columns[:2] == [[1, 3], [2, 4]]
    assert decoded.counts == {"likes": 1, "cdc.app.likes": 1}  # events per topic, for the metrics


def test_records_of_a_dropped_stream_are_consumed_and_applied_nowhere():
    decoded = StreamRunner.decode(runner(), {"likes": [like(1, 2)]})

    assert decoded.size == 0
    assert decoded.rejected == []


class BrokenBatchDecoder(StreamDecoder):
    def decode_batch(self, records):
        raise RuntimeError("a bug in the fast path")


def test_a_decoder_bug_falls_back_to_record_by_record_and_loses_no_good_event():
    bad = Record("likes", b'{"oid": "x", "uid": 2}')
    source = Source(LIKES, "likes", BrokenBatchDecoder(LIKES))

    decoded = StreamRunner.decode(runner(source), {"likes": [like(1, 2), bad, like(5, 6)]})

    assert decoded.payload["likes"].columns[:2] == [[1, 5], [2, 6]]
    assert [(record, error.reason) for record, error in decoded.rejected] == [(bad, "wrong_type")]
