"""Where a partition starts when its group has stored nothing for it: the beginning, the end, or a time.

A pipeline is given a start per topic (`Starts`, as data: the stream runner builds it from each
stream's `start_offset`; other pipelines give none and read from the beginning). A start other than
the beginning must be resolved once, and that once must be durable: were the runner to resolve
"latest" at each assignment until its first commit, a crash in between would skip the events
produced meanwhile. So the offsets are resolved from Kafka (the high watermark; offsets-for-times
for a time) and stored in PostgreSQL through the offset store (`OffsetStore.begin`) before anything
is consumed; every later assignment finds them stored, as if a batch had committed there.

Partitions that have no stored offset later (added to the topic, or a topic recreated under the
stream) follow the same rule then: each is a first consumption.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from confluent_kafka import KafkaException, TopicPartition

from pipelines.logs import get_logger
from pipelines.runtime.checkpoint import Checkpoint

log = get_logger("starts")

EARLIEST, LATEST = "earliest", "latest"
# 'earliest' (the default), 'latest', or a time in epoch milliseconds: the first record at or after it.
Start = str | int
TopicPartitionKey = tuple[str, int]


class OffsetsClient(Protocol):
    """What resolving asks of a consumer (confluent_kafka.Consumer's methods of the same names)."""

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int]:
        """(low, high) watermark of the partition, asked of the broker."""
        ...

    def offsets_for_times(self, partitions: list[TopicPartition], timeout: float = -1) -> list[TopicPartition]:
        """Per partition, the first offset whose timestamp is at or after its `offset` (ms); -1: none."""
        ...


def needs_resolving(starts: Mapping[str, Start], topic: str) -> bool:
    """True when the topic starts elsewhere than at its beginning (what librdkafka does by itself)."""
    return starts.get(topic, EARLIEST) != EARLIEST


def resolve(
    consumer: OffsetsClient, partitions: list[TopicPartitionKey], starts: Mapping[str, Start], timeout_s: float
) -> dict[TopicPartitionKey, int]:
    """The offset each partition starts at, as Kafka answers now (raises KafkaException without an answer).

    `latest` is the high watermark (the next record produced); a time is the first record at or
    after it, or the high watermark when there is none yet. Partitions starting at the beginning
    are left out: they need nothing stored.
    """
    offsets: dict[TopicPartitionKey, int] = {}
    by_time = []
    for topic, partition in sorted(partitions):
        start = starts.get(topic, EARLIEST)
        if start == LATEST:
            offsets[(topic, partition)] = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=timeout_s
            )[1]
        elif isinstance(start, int):
            by_time.append(TopicPartition(topic, partition, start))
    if by_time:
        for tp in consumer.offsets_for_times(by_time, timeout=timeout_s):
            if tp.error is not None:
                raise KafkaException(tp.error)
            offset = tp.offset
            if offset < 0:  # no record at or after the time yet: the next one produced
                offset = consumer.get_watermark_offsets(TopicPartition(tp.topic, tp.partition), timeout=timeout_s)[1]
            offsets[(tp.topic, tp.partition)] = offset
    return offsets


def begin(
    consumer: OffsetsClient,
    checkpoint: Checkpoint[Any, Any],
    partitions: list[TopicPartitionKey],
    starts: Mapping[str, Start],
    timeout_s: float = 10.0,
) -> dict[TopicPartitionKey, int]:
    """Resolve the never-committed partitions' starts and store them; returns what is stored for them.

    What is returned may be another consumer's (it resolved first): the stored row wins, always.
    Raises KafkaException (no answer from Kafka) or psycopg.Error: the caller retries.
    """
    resolved = resolve(consumer, [tp for tp in partitions if needs_resolving(starts, tp[0])], starts, timeout_s)
    if not resolved:
        return {}
    stored = checkpoint.begin(resolved)
    log.info(
        "first consumption: partitions start by their topic's rule",
        offsets={f"{t}[{p}]": offset for (t, p), offset in sorted(stored.items())},
        rules={t: starts[t] for t in sorted({t for t, _ in resolved})},
    )
    return stored
