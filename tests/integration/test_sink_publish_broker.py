"""The sinks' publisher against the real broker: what Kafka refuses, and what it must not lose with it."""

from __future__ import annotations

import os

from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

from pipelines.cv.relay.publish import Publisher, producer_config
from pipelines.cv.relay.records import Record
from pipelines.runtime.topics import ensure_topics
from tests.integration.conftest import delete_topics, topic_records, unique


def test_a_record_too_large_for_its_topic_takes_no_good_record_of_its_batch_to_the_dead_letters(kafka, admin):
    # The broker refuses the whole batch of a record larger than the topic allows, and reports each
    # of its records as too large: the small ones produced with it must still reach the topic.
    topic = unique("small_records")
    admin.create_topics([NewTopic(topic, 1, 1, config={"max.message.bytes": "2000"})])[topic].result(30)
    producer = Producer(producer_config(kafka.bootstrap_servers, "test-sinks"))
    page = [
        Record(1, b'{"k": "a"}', b'{"n": 1}', 0.0),
        Record(2, b'{"k": "big"}', os.urandom(5000), 0.0),  # random: lz4 cannot bring it under 2000 bytes
        Record(3, b'{"k": "b"}', b'{"n": 3}', 0.0),
    ]
    try:
        publisher = Publisher(producer, lambda dlq: ensure_topics(kafka.bootstrap_servers, {dlq: 1}))
        dead = publisher.publish("s", "public.v", topic, page)

        assert dead == 1
        assert read_keys(kafka, topic) == [(b'{"k": "a"}', b"1"), (b'{"k": "b"}', b"3")]
        assert read_keys(kafka, f"{topic}.dlq") == [(b'{"k": "big"}', b"2")]
    finally:
        delete_topics([topic, f"{topic}.dlq"])


def read_keys(kafka, topic: str) -> list[tuple[bytes, bytes]]:
    """Every record of `topic`: its key and its position header."""
    return [(m.key(), dict(m.headers())["streamviews.position"]) for m in topic_records(kafka, topic)]
