"""Kafka is real: records round-trip through the broker with both Python clients users will have."""

from __future__ import annotations

import json

from confluent_kafka import Consumer, Producer
from kafka import KafkaConsumer, KafkaProducer

from pipelines.settings import KafkaSettings
from tests.integration.conftest import unique


def consume_all(kafka: KafkaSettings, topic: str, count: int, timeout: float = 30) -> list:
    """Read `count` records from the beginning of `topic` with a fresh consumer group."""
    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "group.id": unique("test-group"),
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    records = []
    try:
        while len(records) < count:
            batch = consumer.consume(num_messages=count - len(records), timeout=timeout)
            assert batch, f"no records from {topic} within {timeout}s ({len(records)}/{count} so far)"
            for record in batch:
                assert record.error() is None, record.error()
                records.append(record)
    finally:
        consumer.close()
    return records


def test_confluent_producer_and_consumer_round_trip_keys_values_and_headers(kafka, topic_factory):
    topic = topic_factory("roundtrip", partitions=3)
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "enable.idempotence": True})
    sent = {f"key-{i}": json.dumps({"n": i}) for i in range(100)}
    for key, value in sent.items():
        producer.produce(topic, key=key, value=value, headers={"origin": b"test"})
    assert producer.flush(30) == 0

    records = consume_all(kafka, topic, len(sent))

    assert {r.key().decode(): r.value().decode() for r in records} == sent
    assert all(dict(r.headers())["origin"] == b"test" for r in records)


def test_an_application_producing_with_kafka_python_works_unchanged(kafka, topic_factory):
    topic = topic_factory("kafka-python")
    producer = KafkaProducer(
        bootstrap_servers=kafka.bootstrap_servers,
        key_serializer=str.encode,
        value_serializer=lambda v: json.dumps(v).encode(),
    )
    for oid in range(1, 51):
        producer.send(topic, key=str(oid), value={"oid": oid, "uid": 7, "action": "like"})
    producer.flush(30)
    producer.close()

    records = consume_all(kafka, topic, 50)

    assert sorted(json.loads(r.value())["oid"] for r in records) == list(range(1, 51))
    assert {r.key() for r in records} == {str(oid).encode() for oid in range(1, 51)}


def test_kafka_python_consumer_reads_what_the_pipelines_client_produced(kafka, topic_factory):
    topic = topic_factory("to-kafka-python")
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for i in range(20):
        producer.produce(topic, key=str(i), value=f"v{i}")
    assert producer.flush(30) == 0

    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=kafka.bootstrap_servers,
        group_id=unique("kp-group"),
        auto_offset_reset="earliest",
        consumer_timeout_ms=30_000,
    )
    values = set()
    for record in consumer:
        values.add(record.value.decode())
        if len(values) == 20:
            break
    consumer.close()

    assert values == {f"v{i}" for i in range(20)}
