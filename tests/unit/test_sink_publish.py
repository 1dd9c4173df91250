"""The relay's Kafka side without Kafka: every record acknowledged or dead-lettered, or the page fails.

A fake producer stands for librdkafka: it records what was produced and calls each delivery callback
with the error the test chose for that record when flushed (the real producer reports failures only).
"""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from pipelines.cv.relay.publish import DeliveryError, Publisher, producer_config
from pipelines.cv.relay.records import Record, records


class DeliveredMessage:
    """What a delivery report carries of its record, as confluent_kafka.Message does: key and value."""

    def __init__(self, key: bytes, value: bytes | None) -> None:
        self._key, self._value = key, value

    def key(self) -> bytes:
        return self._key

    def value(self) -> bytes | None:
        return self._value


class FakeProducer:
    """produce() queues, flush() delivers; `refuse` maps a key to the error its delivery reports.

    As the broker does, a record of a `poison` key makes its whole batch refused as too large: the
    records flushed together, or each `batch_size` of them in queue order.
    """

    def __init__(
        self,
        refuse: dict[bytes, int] | None = None,
        too_large: frozenset[bytes] = frozenset(),
        poison: frozenset[bytes] = frozenset(),
        batch_size: int = 1_000_000,
    ) -> None:
        self.refuse, self.too_large, self.poison, self.batch_size = refuse or {}, too_large, poison, batch_size
        self.queued: list[tuple] = []
        self.delivered: list[tuple[str, bytes, bytes | None, dict[str, bytes]]] = []

    def produce(self, topic, value=None, key=None, headers=None, on_delivery=None):
        if key in self.too_large and not topic.endswith(".dlq"):
            raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
        self.queued.append((topic, key, value, headers, on_delivery))

    def poll(self, _timeout=0):
        return 0

    def flush(self, _timeout=0):
        refused_batches: set[int] = set()
        for index, (topic, key, *_) in enumerate(self.queued):
            if key in self.poison and not topic.endswith(".dlq"):
                refused_batches.add(index // self.batch_size)
        for index, (topic, key, value, headers, on_delivery) in enumerate(self.queued):
            code = None if topic.endswith(".dlq") else self.refuse.get(key)
            if index // self.batch_size in refused_batches and not topic.endswith(".dlq"):
                code = KafkaError.MSG_SIZE_TOO_LARGE
            if code is None:
                self.delivered.append((topic, key, value, dict(headers)))
            on_delivery(None if code is None else KafkaError(code), DeliveredMessage(key, value))
        self.queued.clear()
        return 0


def record(position: int, key: str, value: str | None = "{}") -> Record:
    return Record(position, key.encode(), None if value is None else value.encode(), 0.0)


def test_records_are_produced_in_order_with_their_position_view_and_sink_headers():
    producer = FakeProducer()
    dead = Publisher(producer).publish("s", "public.v", "t", [record(1, "a"), record(2, "b", None)])
    assert dead == 0
    assert [(t, k, v) for t, k, v, _ in producer.delivered] == [("t", b"a", b"{}"), ("t", b"b", None)]
    assert producer.delivered[1][3] == {
        "streamviews.position": b"2",
        "streamviews.view": b"public.v",
        "streamviews.sink": b"s",
    }


def test_a_record_kafka_refuses_for_what_it_is_goes_to_the_dead_letter_topic_with_the_reason():
    producer = FakeProducer(refuse={b"big": KafkaError.MSG_SIZE_TOO_LARGE}, too_large=frozenset({b"huge"}))
    dead = Publisher(producer).publish("s", "public.v", "t", [record(1, "big"), record(2, "huge"), record(3, "ok")])
    assert dead == 2
    letters = [(k, h["dlq.reason"], h["streamviews.position"]) for t, k, _, h in producer.delivered if t == "t.dlq"]
    assert sorted(letters) == [(b"big", b"refused", b"1"), (b"huge", b"refused", b"2")]
    assert [k for t, k, _, _ in producer.delivered if t == "t"] == [b"ok"]


def test_good_records_refused_with_a_bad_one_in_its_batch_are_delivered_and_only_the_bad_one_dead_lettered():
    producer = FakeProducer(poison=frozenset({b"big"}))
    dead = Publisher(producer).publish("s", "public.v", "t", [record(1, "a"), record(2, "big"), record(3, "b")])
    assert dead == 1
    assert [(k, h["streamviews.position"]) for t, k, _, h in producer.delivered if t == "t.dlq"] == [(b"big", b"2")]
    assert [k for t, k, _, _ in producer.delivered if t == "t"] == [b"a", b"b"]


def test_after_a_refused_batch_each_key_still_ends_with_its_last_record():
    # Batches of two: (big, a@2) refused, (a@3, b@4) delivered. a@2 is produced again, and a@3 after it.
    producer = FakeProducer(poison=frozenset({b"big"}), batch_size=2)
    page = [record(1, "big"), record(2, "a"), record(3, "a"), record(4, "b")]
    dead = Publisher(producer).publish("s", "public.v", "t", page)
    assert dead == 1
    on_topic = [(k, int(h["streamviews.position"])) for t, k, _, h in producer.delivered if t == "t"]
    assert on_topic == [(b"a", 3), (b"b", 4), (b"a", 2), (b"a", 3)]  # a's last record is its last change
    assert [k for t, k, _, _ in producer.delivered if t == "t.dlq"] == [b"big"]


def test_a_delivery_kafka_fails_for_its_own_sake_fails_the_page():
    producer = FakeProducer(refuse={b"b": KafkaError._MSG_TIMED_OUT})
    with pytest.raises(DeliveryError, match="1 records not delivered"):
        Publisher(producer).publish("s", "public.v", "t", [record(1, "a"), record(2, "b")])


def test_a_refused_report_that_names_no_record_of_the_page_fails_the_page_instead_of_raising_in_the_callback():
    class ReportsOtherBytes(FakeProducer):
        def produce(self, topic, value=None, key=None, headers=None, on_delivery=None):
            super().produce(topic, b"not what was produced", key, headers, on_delivery)

    producer = ReportsOtherBytes(refuse={b"big": KafkaError.MSG_SIZE_TOO_LARGE})
    with pytest.raises(DeliveryError, match="1 records not delivered"):
        Publisher(producer).publish("s", "public.v", "t", [record(1, "big"), record(2, "ok")])


def test_the_page_rows_give_the_records_that_passed_and_the_last_position_read():
    rows = [
        (4, True, '{"k": 1}', '{"n": 1}', 1.0),
        (5, False, '{"k": 2}', None, 1.0),
        (6, False, '{"k": 3}', None, 2.0),
    ]
    published, last = records(rows)
    assert [(r.position, r.key) for r in published] == [(4, b'{"k": 1}')]
    assert last == 6
    assert records([]) == ([], None)


def test_the_producer_is_idempotent_waits_for_every_replica_and_partitions_as_java_does():
    config = producer_config("k:9092", "streamviews-sinks")
    assert (config["enable.idempotence"], config["acks"], config["partitioner"]) == (True, "all", "murmur2_random")
    assert config["delivery.report.only.error"] is True  # a page waits for every record with flush()
