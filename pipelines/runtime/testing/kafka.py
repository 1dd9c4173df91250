"""In-memory Kafka for unit tests: topics as lists, and the `KafkaClients` that read and write them."""

# ruff: noqa: D102 (the doubles' methods are those of the interfaces they implement, documented there)
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from pipelines.errors import StreamviewsError
from pipelines.runtime.clients import RebalanceCallback
from pipelines.runtime.topics import TopicConfigs
from pipelines.settings import PipelineSettings

TopicPartitionKey = tuple[str, int]


@dataclass
class MemoryMessage:
    """A record in a `MemoryBroker` topic, read as a confluent_kafka.Message is."""

    _topic: str
    _partition: int
    _offset: int
    _value: bytes | None
    _key: bytes | None = None
    _timestamp_ms: int = 1_795_341_600_000
    _headers: list[tuple[str, bytes]] | None = None

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def timestamp(self) -> tuple[int, int]:
        return (0, -1) if self._timestamp_ms < 0 else (1, self._timestamp_ms)

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._headers

    def error(self) -> None:
        return None


class MemoryBroker:
    """Topics as lists of partitions, and the `KafkaClients` that read and write them.

    Its consumers are each alone in their group: a subscription is assigned every partition of the
    topics that exist, at the next `consume` (as librdkafka serves rebalance callbacks in a poll).
    """

    def __init__(self) -> None:
        self.topics: dict[str, list[list[MemoryMessage]]] = {}
        self.ids: dict[str, str] = {}  # Kafka's topic ids (KIP-516)
        self.consumers: list[MemoryConsumer] = []
        self.offset_requests = 0  # offsets-for-times asked (a start rule resolved)
        self.configs: dict[str, dict[str, str]] = {}  # each topic's own configs (retention.ms, say)

    def create_topic(self, topic: str, partitions: int = 1) -> None:
        """Create the topic if it is missing."""
        if topic not in self.topics:
            self.topics[topic] = [[] for _ in range(partitions)]
            self.ids[topic] = f"id-{topic}-{len(self.ids)}"

    def produce(
        self,
        topic: str,
        values: Iterable[bytes | None],
        *,
        partition: int = 0,
        key: bytes | None = None,
        timestamp_ms: int = 1_795_341_600_000,
    ) -> list[MemoryMessage]:
        """Append records to one partition of the topic (created, or given more partitions, when missing).

        `timestamp_ms` is their Kafka timestamp (-1: none).
        """
        self.create_topic(topic, partition + 1)
        partitions = self.topics[topic]
        partitions.extend([] for _ in range(partition + 1 - len(partitions)))  # added, as Kafka can
        log = partitions[partition]
        added = [
            MemoryMessage(topic, partition, len(log) + i, value, key, timestamp_ms) for i, value in enumerate(values)
        ]
        log.extend(added)
        return added

    def messages(self, topic: str) -> list[MemoryMessage]:
        """Every record of the topic, partition by partition (a dead-letter topic's, say)."""
        return [m for log in self.topics.get(topic, []) for m in log]

    # KafkaClients
    def consumer(self, name: str, group_id: str, settings: PipelineSettings) -> MemoryConsumer:
        """A consumer alone in its group."""
        consumer = MemoryConsumer(self)
        self.consumers.append(consumer)
        return consumer

    def producer(self, name: str) -> MemoryProducer:
        """A producer that stores each record at once."""
        return MemoryProducer(self)

    def read_back(
        self, name: str, ranges: dict[TopicPartitionKey, tuple[int, int]]
    ) -> dict[TopicPartitionKey, list[MemoryMessage]]:
        """The records of each partition in [first, end)."""
        return {(t, p): self.topics[t][p][first:end] for (t, p), (first, end) in ranges.items() if end > first}

    def topic_ids(self, topics: list[str]) -> dict[str, str]:
        """The ids of the topics that exist."""
        return {topic: self.ids[topic] for topic in topics if topic in self.ids}

    def ensure_topics(self, partitions: dict[str, int], configs: TopicConfigs | None = None) -> None:
        """Create the missing topics, with their configs."""
        for topic, count in partitions.items():
            if topic not in self.topics:
                self.create_topic(topic, count)
                self.configs[topic] = {k: v for k, v in (configs or {}).get(topic, {}).items() if v is not None}

    def alter_topic_configs(self, configs: TopicConfigs) -> None:
        """Set (None: delete) the named configs of existing topics."""
        for topic, entries in configs.items():
            if topic not in self.topics:
                raise StreamviewsError(f"topics: cannot set the configs of {topic}: no such topic")
            kept = self.configs.setdefault(topic, {})
            for name, value in entries.items():
                if value is None:
                    kept.pop(name, None)
                else:
                    kept[name] = value


class MemoryConsumer:
    """A `ConsumerClient` over a `MemoryBroker`: reads partition by partition, in (topic, partition) order."""

    def __init__(self, broker: MemoryBroker) -> None:
        self.broker = broker
        self.positions: dict[TopicPartitionKey, int] = {}  # assigned partitions: the next offset to read
        self.paused: set[TopicPartitionKey] = set()
        self.fetched: set[TopicPartitionKey] = set()  # read at least once: their watermarks are known
        self.committed: dict[TopicPartitionKey, int] = {}  # Kafka's committed offsets (informative only)
        self.closed = False
        self._topics: list[str] = []
        self._callbacks: tuple[RebalanceCallback | None, RebalanceCallback | None] = (None, None)
        self._rebalance = False

    def subscribe(
        self,
        topics: list[str],
        on_assign: RebalanceCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
        on_lost: RebalanceCallback | None = None,
    ) -> None:
        """Subscribe; the partitions are handed out again at the next `consume`."""
        self._topics, self._callbacks, self._rebalance = list(topics), (on_assign, on_revoke), True

    def unsubscribe(self) -> None:
        """Leave: the assignment is revoked now."""
        self.revoke()
        self._topics = []

    def revoke(self) -> None:
        """Take every partition away (as a rebalance does), calling the revoke callback first."""
        on_revoke = self._callbacks[1]
        if self.positions and on_revoke is not None:
            on_revoke(self, [TopicPartition(t, p) for t, p in sorted(self.positions)])
        self.positions.clear()

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[MemoryMessage]:
        """Up to `num_messages` records: each assigned, unpaused partition's next ones in turn."""
        if self._rebalance:
            self._rebalance = False
            self.revoke()
            partitions = [
                TopicPartition(t, p) for t in sorted(self._topics) for p in range(len(self.broker.topics.get(t, [])))
            ]
            on_assign = self._callbacks[0]
            if on_assign is not None:
                on_assign(self, partitions)
            else:
                self.assign(partitions)
        polled: list[MemoryMessage] = []
        for tp in sorted(self.positions):
            if tp in self.paused or len(polled) >= num_messages:
                continue
            self.fetched.add(tp)
            log = self.broker.topics[tp[0]][tp[1]]
            taken = log[self.positions[tp] : self.positions[tp] + num_messages - len(polled)]
            self.positions[tp] += len(taken)
            polled.extend(taken)
        return polled

    def assign(self, partitions: list[TopicPartition]) -> None:
        """Read these partitions from their offsets (OFFSET_BEGINNING: 0)."""
        for tp in partitions:
            self.positions[(tp.topic, tp.partition)] = max(tp.offset, 0) if tp.offset != OFFSET_BEGINNING else 0

    def unassign(self) -> None:
        self.positions.clear()

    def seek(self, partition: TopicPartition) -> None:
        self.assign([partition])

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.paused.update((tp.topic, tp.partition) for tp in partitions)

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.paused.difference_update((tp.topic, tp.partition) for tp in partitions)

    def commit(self, *, offsets: list[TopicPartition], asynchronous: Literal[True] = True) -> None:
        self.committed.update({(tp.topic, tp.partition): tp.offset for tp in offsets})

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int]:
        """Cached, as librdkafka's cache: unknown (-1001) until the partition was first fetched; else the broker's."""
        tp = (partition.topic, partition.partition)
        if cached and tp not in self.fetched:
            return -1001, -1001
        return 0, len(self.broker.topics[tp[0]][tp[1]])

    def offsets_for_times(self, partitions: list[TopicPartition], timeout: float = -1) -> list[TopicPartition]:
        """Each partition's first record at or after its `offset` (ms), as Kafka's ListOffsets; -1: none."""
        self.broker.offset_requests += 1
        found = []
        for tp in partitions:
            log = self.broker.topics[tp.topic][tp.partition]
            offset = next((m.offset() for m in log if m._timestamp_ms >= tp.offset), -1)
            found.append(TopicPartition(tp.topic, tp.partition, offset))
        return found

    def close(self) -> None:
        self.closed = True
        self.positions.clear()

    @property
    def caught_up(self) -> bool:
        """Every assigned, unpaused partition read to its end, and no rebalance pending."""
        return not self._rebalance and all(
            offset >= len(self.broker.topics[t][p]) for (t, p), offset in self.positions.items()
        )


class MemoryProducer:
    """A `ProducerClient` storing each record in its `MemoryBroker` topic at once; delivery never fails."""

    def __init__(self, broker: MemoryBroker) -> None:
        self.broker = broker
        self._delivered: list[tuple[Callable[[Any, Any], None] | None, MemoryMessage]] = []

    def produce(
        self,
        topic: str,
        value: str | bytes | None = None,
        key: str | bytes | None = None,
        partition: int = -1,
        callback: Callable[[Any, Any], None] | None = None,
        on_delivery: Callable[[Any, Any], None] | None = None,
        timestamp: int = 0,
        headers: Any = None,
    ) -> None:
        as_bytes = [v.encode() if isinstance(v, str) else v for v in (value, key)]
        [message] = self.broker.produce(topic, [as_bytes[0]], partition=max(partition, 0), key=as_bytes[1])
        message._headers = headers
        self._delivered.append((on_delivery or callback, message))

    def poll(self, timeout: float = -1) -> int:
        delivered, self._delivered = self._delivered, []
        for on_delivery, message in delivered:
            if on_delivery is not None:
                on_delivery(None, message)
        return len(delivered)

    def flush(self, timeout: float = -1) -> int:
        self.poll()
        return 0
