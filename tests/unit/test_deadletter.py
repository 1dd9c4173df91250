"""Dead letters keep the rejected record as it was, say why in headers, and block the commit until delivered.

The producer is a fake here (this tests our class's logic); delivery through a real Kafka is an
integration test.
"""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException, Message
from structlog.testing import capture_logs

from pipelines.errors import StreamviewsError
from pipelines.runtime.deadletter import (
    DEAD_LETTER_VALUE_MAX,
    DeadLetterError,
    DeadLetters,
    dead_letter_headers,
    dead_letter_topic,
)
from pipelines.runtime.events import InvalidEvent

ERROR = InvalidEvent("unknown_action", "action must be 'like' or 'unlike', got 'love'")


class FakeProducer:
    """Accepts `produce` calls and delivers them on `poll`/`flush`, failing or holding back on request."""

    def __init__(self, *, fail_with: KafkaError | None = None, stuck: int = 0, full_times: int = 0) -> None:
        self.produced: list[dict] = []
        self.polls: list[float] = []
        self._pending: list[tuple] = []
        self._fail_with = fail_with
        self._stuck = stuck
        self._full_times = full_times

    def produce(self, topic, value=None, key=None, headers=None, on_delivery=None):
        if self._full_times:
            self._full_times -= 1
            raise BufferError("Local: Queue full")
        self.produced.append({"topic": topic, "key": key, "value": value, "headers": headers})
        self._pending.append((topic, on_delivery))

    def poll(self, timeout=None):
        self.polls.append(timeout)
        return self._deliver()

    def flush(self, timeout=None):
        self._deliver()
        return self._stuck

    def _deliver(self) -> int:
        delivered, self._pending = self._pending, []
        for topic, on_delivery in delivered:
            on_delivery(self._fail_with, Message(topic=topic))
        return len(delivered)


def rejected_record(**overrides) -> Message:
    fields = {
        "topic": "likes",
        "partition": 3,
        "offset": 1234,
        "key": b"42",
        "value": b'{"oid": 42, "uid": 7, "action": "love"}',
        "headers": [("traceparent", b"00-abc-def-01")],
        "timestamp": (1, 1_795_341_600_123),
    }
    return Message(**{**fields, **overrides})


def test_the_dead_letter_topic_is_the_source_topic_with_a_dlq_suffix():
    assert dead_letter_topic("likes") == "likes.dlq"
    assert dead_letter_topic("follows") == "follows.dlq"


def test_headers_keep_the_originals_first_then_say_why_and_where_from():
    headers = dead_letter_headers(
        pipeline="likes",
        topic="likes",
        partition=3,
        offset=1234,
        timestamp_ms=1_795_341_600_123,
        error=ERROR,
        original=[("traceparent", b"00-abc-def-01"), ("dlq.reason", b"from an earlier life")],
    )

    assert headers == [
        ("traceparent", b"00-abc-def-01"),
        ("dlq.reason", b"from an earlier life"),
        ("dlq.reason", b"unknown_action"),
        ("dlq.detail", b"action must be 'like' or 'unlike', got 'love'"),
        ("dlq.pipeline", b"likes"),
        ("dlq.topic", b"likes"),
        ("dlq.partition", b"3"),
        ("dlq.offset", b"1234"),
        ("dlq.timestamp", b"1795341600123"),
    ]


def test_a_record_without_headers_gets_only_the_dlq_ones():
    headers = dead_letter_headers(
        pipeline="p", topic="t", partition=0, offset=0, timestamp_ms=-1, error=ERROR, original=None
    )

    assert [name for name, _ in headers] == [
        "dlq.reason",
        "dlq.detail",
        "dlq.pipeline",
        "dlq.topic",
        "dlq.partition",
        "dlq.offset",
        "dlq.timestamp",
    ]
    assert all(type(value) is bytes for _, value in headers)


def test_non_ascii_details_are_utf8():
    error = InvalidEvent("unknown_action", "got 'été'")
    headers = dict(
        dead_letter_headers(pipeline="p", topic="t", partition=0, offset=0, timestamp_ms=0, error=error, original=None)
    )

    assert headers["dlq.detail"] == "got 'été'".encode()


def test_a_dead_letter_is_the_record_unchanged_on_the_dlq_topic():
    producer = FakeProducer()
    record = rejected_record()

    DeadLetters(producer, "likes").send(record, ERROR)

    [sent] = producer.produced
    assert sent["topic"] == "likes.dlq"
    assert (sent["key"], sent["value"]) == (record.key(), record.value())
    assert sent["headers"][0] == ("traceparent", b"00-abc-def-01")
    assert ("dlq.reason", b"unknown_action") in sent["headers"]
    assert ("dlq.offset", b"1234") in sent["headers"]


def test_a_tombstone_is_dead_lettered_as_a_tombstone():
    producer = FakeProducer()
    tombstone = rejected_record(value=None, headers=None)

    DeadLetters(producer, "likes").send(tombstone, InvalidEvent("empty", "value is null"))

    assert producer.produced[0]["value"] is None


def test_a_value_too_large_for_a_dead_letter_topic_is_left_out_and_its_size_said():
    # A topic may take records of several MiB; its dead-letter topic and our producer take 1 MiB. Sent
    # whole, the dead letter would be refused, and the batch could never commit past its record.
    producer = FakeProducer()
    huge = rejected_record(value=b"x" * (DEAD_LETTER_VALUE_MAX + 1))

    DeadLetters(producer, "likes").send(huge, InvalidEvent("oversized", "value is 524289 bytes"))

    [sent] = producer.produced
    assert (sent["key"], sent["value"]) == (b"42", None)
    assert ("dlq.value_bytes", b"524289") in sent["headers"]
    assert ("dlq.offset", b"1234") in sent["headers"]  # where the whole record still is


def test_dead_letters_are_counted_by_reason():
    dead_letters = DeadLetters(FakeProducer(), "likes")

    dead_letters.send(rejected_record(), ERROR)
    dead_letters.send(rejected_record(offset=1235), ERROR)
    dead_letters.send(rejected_record(offset=1236), InvalidEvent("key_mismatch", "key b'7' does not match oid 42"))

    assert dead_letters.counts == {"unknown_action": 2, "key_mismatch": 1}


def test_each_dead_letter_is_logged_with_its_reason_and_position_but_not_its_payload():
    with capture_logs() as logs:
        DeadLetters(FakeProducer(), "likes").send(rejected_record(), ERROR)

    assert logs == [
        {
            "event": "dead letter",
            "log_level": "warning",
            "reason": "unknown_action",
            "detail": ERROR.detail,
            "topic": "likes",
            "partition": 3,
            "offset": 1234,
        }
    ]


def test_flush_returns_once_every_dead_letter_is_delivered():
    producer = FakeProducer()
    dead_letters = DeadLetters(producer, "likes")
    dead_letters.send(rejected_record(), ERROR)

    dead_letters.flush(timeout=5)

    assert producer._pending == []


def test_a_failed_delivery_makes_flush_raise_so_the_batch_does_not_commit():
    dead_letters = DeadLetters(FakeProducer(fail_with=KafkaError(KafkaError._MSG_TIMED_OUT)), "likes")

    with capture_logs() as logs:
        dead_letters.send(rejected_record(), ERROR)
        with pytest.raises(DeadLetterError, match=r"1 dead letters failed, first: likes\.dlq: .*timed out"):
            dead_letters.flush()

    assert isinstance(DeadLetterError(), StreamviewsError)
    assert logs[-1] == {
        "event": "dead letter not delivered",
        "log_level": "error",
        "topic": "likes.dlq",
        "error": "Local: Message timed out",
        "code": "_MSG_TIMED_OUT",
    }


def test_a_failure_is_reported_once():
    producer = FakeProducer(fail_with=KafkaError(KafkaError._MSG_TIMED_OUT))
    dead_letters = DeadLetters(producer, "likes")
    dead_letters.send(rejected_record(), ERROR)
    with pytest.raises(DeadLetterError):
        dead_letters.flush()

    dead_letters.flush()


def test_dead_letters_still_queued_at_the_timeout_make_flush_raise():
    dead_letters = DeadLetters(FakeProducer(stuck=2), "likes")

    with pytest.raises(DeadLetterError, match=r"2 messages still undelivered after 0\.5 s"):
        dead_letters.flush(timeout=0.5)


def test_a_full_producer_queue_is_waited_out():
    producer = FakeProducer(full_times=2)

    DeadLetters(producer, "likes").send(rejected_record(), ERROR)

    assert len(producer.produced) == 1
    assert producer.polls[:2] == [1.0, 1.0]


def test_a_producer_that_refuses_the_record_raises_a_dead_letter_error():
    class RefusingProducer(FakeProducer):
        def produce(self, *args, **kwargs):
            raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))

    dead_letters = DeadLetters(RefusingProducer(), "likes")

    with pytest.raises(DeadLetterError, match=r"cannot produce a dead letter to likes\.dlq") as caught:
        dead_letters.send(rejected_record(), ERROR)

    assert isinstance(caught.value.__cause__, KafkaException)
    assert dead_letters.counts == {}
