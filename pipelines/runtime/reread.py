"""Records of a batch read back from Kafka: how isolation tells a failed batch's records apart.

The common path keeps no message once it is decoded: confluent_kafka Messages are tracked by
Python's garbage collector, and keeping a batch's worth of them until it committed made its full
collections pause the runner. Isolation, which is rare, reads them again instead, with a consumer
of its own (it runs in the committer thread and must not touch the pipeline's consumer).
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import Consumer, Message, TopicPartition

from pipelines.errors import StreamviewsError

TopicPartitionKey = tuple[str, int]


class RecordsNotFetched(StreamviewsError):
    """Isolation could not read a failed batch's records back from Kafka: the batch is retried."""

    transient = True


def read_back(
    bootstrap_servers: str, client_id: str, ranges: dict[TopicPartitionKey, tuple[int, int]], timeout_s: float = 60.0
) -> dict[TopicPartitionKey, list[Message]]:
    """The records of each (topic, partition) in [first, end), in offset order.

    Raises:
        RecordsNotFetched: Kafka did not return them within `timeout_s` (the batch is retried).
    """
    wanted = {tp: (first, end) for tp, (first, end) in ranges.items() if end > first}
    found: dict[TopicPartitionKey, list[Message]] = {tp: [] for tp in wanted}
    if not wanted:
        return found
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "client.id": client_id,
            "group.id": client_id,  # never joined nor committed: partitions are assigned
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "logger": logging.getLogger("librdkafka"),
        }
    )
    try:
        consumer.assign([TopicPartition(t, p, first) for (t, p), (first, _) in sorted(wanted.items())])
        pending, deadline = set(wanted), time.monotonic() + timeout_s
        while pending:
            if time.monotonic() > deadline:
                raise RecordsNotFetched(f"isolation: records of {sorted(pending)} not read back in {timeout_s} s")
            for message in consumer.consume(1000, 0.5):
                tp = (message.topic(), message.partition())
                if message.error() is not None or tp not in pending:
                    continue
                if message.offset() < wanted[tp][1]:
                    found[tp].append(message)
                if message.offset() >= wanted[tp][1] - 1:
                    pending.discard(tp)
                    consumer.pause([TopicPartition(*tp)])
    finally:
        consumer.close()
    return found
