"""The Kafka clients a pipeline uses, made by one factory it is given: confluent-kafka's, or a test's.

A pipeline never builds a Kafka client itself: it asks its `KafkaClients` for the consumer of its
group, the producer of its dead letters, a read-back of a failed batch's records, the ids of its
topics and missing topics created. `ConfluentClients` makes them from `KafkaSettings` (what every
service runs); `pipelines.runtime.testing.MemoryBroker` keeps topics in memory for unit tests.

The protocols below name only what the runtime calls, with confluent-kafka's signatures, so its
clients are used as they are on the hot path: no wrapper between a poll and its messages (a test's
messages are duck-typed confluent_kafka.Message objects).
"""

# ruff: noqa: D102 (the protocols repeat confluent-kafka's methods, documented there)
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Literal, Protocol

from confluent_kafka import Consumer, Message, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient

from pipelines.runtime.reread import read_back
from pipelines.runtime.topics import TopicConfigs, alter_topic_configs, ensure_topics
from pipelines.settings import KafkaSettings, PipelineSettings

TopicPartitionKey = tuple[str, int]
# Called with the client and the partitions: confluent-kafka's rebalance callbacks.
RebalanceCallback = Callable[[Any, list[TopicPartition]], None]


class ConsumerClient(Protocol):
    """What a pipeline asks of its consumer (confluent_kafka.Consumer's methods of the same names)."""

    def subscribe(
        self,
        topics: list[str],
        on_assign: RebalanceCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
        on_lost: RebalanceCallback | None = None,
    ) -> None: ...
    def unsubscribe(self) -> None: ...
    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]: ...  # confluent_kafka.Messages
    def assign(self, partitions: list[TopicPartition]) -> None: ...
    def unassign(self) -> None: ...
    def seek(self, partition: TopicPartition) -> None: ...
    def pause(self, partitions: list[TopicPartition]) -> None: ...
    def resume(self, partitions: list[TopicPartition]) -> None: ...
    def commit(self, *, offsets: list[TopicPartition], asynchronous: Literal[True] = ...) -> None: ...
    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int]: ...
    def offsets_for_times(self, partitions: list[TopicPartition], timeout: float = -1) -> list[TopicPartition]: ...
    def close(self) -> None: ...


class ProducerClient(Protocol):
    """What the dead letters ask of their producer (confluent_kafka.Producer's methods)."""

    def produce(
        self,
        topic: str,
        value: str | bytes | None = None,
        key: str | bytes | None = None,
        partition: int = -1,
        callback: Callable[[Any, Message], None] | None = None,
        on_delivery: Callable[[Any, Message], None] | None = None,
        timestamp: int = 0,
        headers: Any = None,
    ) -> None: ...
    def poll(self, timeout: float = -1) -> int: ...
    def flush(self, timeout: float = -1) -> int: ...


class KafkaClients(Protocol):
    """Makes the Kafka clients of a pipeline named `name` (the name goes into their client ids)."""

    def consumer(self, name: str, group_id: str, settings: PipelineSettings) -> ConsumerClient:
        """The consumer of the group: offsets never committed to Kafka's truth, read from PostgreSQL."""
        ...

    def producer(self, name: str) -> ProducerClient:
        """The dead letters' producer (idempotent)."""
        ...

    def read_back(
        self, name: str, ranges: dict[TopicPartitionKey, tuple[int, int]]
    ) -> dict[TopicPartitionKey, list[Any]]:
        """The records of each (topic, partition) in [first, end), in offset order (pipelines/runtime/reread.py)."""
        ...

    def topic_ids(self, topics: list[str]) -> dict[str, str]:
        """Kafka's id of each topic (KIP-516); raises KafkaException without an answer."""
        ...

    def ensure_topics(self, partitions: dict[str, int], configs: TopicConfigs | None = None) -> None:
        """Create each missing topic with its partition count and configs (pipelines/runtime/topics.py)."""
        ...

    def alter_topic_configs(self, configs: TopicConfigs) -> None:
        """Set each topic's named configs (None: back to the broker's default); raises StreamviewsError."""
        ...


def consumer_config(
    kafka: KafkaSettings, name: str, group_id: str, settings: PipelineSettings | None = None
) -> dict[str, Any]:
    """The pipelines' consumer: offsets from PostgreSQL only, fuller fetches, no idle backoff.

    With `settings`: its session timeout, and static membership when it has an instance id (a
    restarted pipeline is back at work as soon as it has started, not after the session timeout).
    """
    config = {
        "bootstrap.servers": kafka.bootstrap_servers,
        "client.id": f"{kafka.client_id}-{name}",
        "group.id": group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "partition.assignment.strategy": "range",
        # Fetch in batches of at least 64 KiB (or after 50 ms): under a steady trickle, fewer,
        # fuller fetches cost the broker far less CPU than one response per new record.
        "fetch.min.bytes": 65_536,
        "fetch.wait.max.ms": 50,
        # When its local queue passes queued.min.messages or queued.max.messages.kbytes,
        # librdkafka postpones the partition's next fetch by this long; at the default, 1 s, a
        # consumer that empties the queue sooner sits idle for the rest. Re-checks are cheap.
        "fetch.queue.backoff.ms": 10,
        # A topic subscribed while it was still being created is "not available" until librdkafka next
        # refreshes its metadata: every 5 minutes by default, so a new stream could wait that long.
        "topic.metadata.refresh.interval.ms": 5_000,
        "logger": logging.getLogger("librdkafka"),
    }
    if settings is not None:
        config["session.timeout.ms"] = settings.session_timeout_ms
        config["heartbeat.interval.ms"] = settings.session_timeout_ms // 4
        if settings.group_instance_id:
            config["group.instance.id"] = f"{settings.group_instance_id}-{name}"
    return config


class ConfluentClients:
    """confluent-kafka's clients for the brokers of `KafkaSettings`: what the services run with."""

    def __init__(self, kafka: KafkaSettings) -> None:
        self.kafka = kafka

    def consumer(self, name: str, group_id: str, settings: PipelineSettings) -> Consumer:
        """A confluent_kafka.Consumer of `consumer_config`."""
        return Consumer(consumer_config(self.kafka, name, group_id, settings))

    def producer(self, name: str) -> Producer:
        """An idempotent producer that batches for 5 ms (`name` is not used: as before, no client id)."""
        return Producer(
            {
                "bootstrap.servers": self.kafka.bootstrap_servers,
                "enable.idempotence": True,
                "linger.ms": 5,
                "logger": logging.getLogger("librdkafka"),
            }
        )

    def read_back(
        self, name: str, ranges: dict[TopicPartitionKey, tuple[int, int]]
    ) -> dict[TopicPartitionKey, list[Message]]:
        """Read with a consumer of its own (it runs in the committer thread, apart from the pipeline's)."""
        return read_back(self.kafka.bootstrap_servers, f"{self.kafka.client_id}-{name}-isolation", ranges)

    def topic_ids(self, topics: list[str]) -> dict[str, str]:
        """Asked of the brokers with an admin client (10 s at most)."""
        admin = AdminClient(
            {"bootstrap.servers": self.kafka.bootstrap_servers, "logger": logging.getLogger("librdkafka")}
        )
        described = admin.describe_topics(TopicCollection(topics), request_timeout=10)
        return {topic: str(future.result(10).topic_id) for topic, future in described.items()}

    def ensure_topics(self, partitions: dict[str, int], configs: TopicConfigs | None = None) -> None:
        """See `pipelines.runtime.topics.ensure_topics`."""
        ensure_topics(self.kafka.bootstrap_servers, partitions, configs)

    def alter_topic_configs(self, configs: TopicConfigs) -> None:
        """See `pipelines.runtime.topics.alter_topic_configs`."""
        alter_topic_configs(self.kafka.bootstrap_servers, configs)
