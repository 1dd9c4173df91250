"""Creating the topics a pipeline reads and writes, when they are missing.

The broker does not create topics on first use (auto-creation is off: a typo in a producer must not
create a topic), so each pipeline makes sure its input and dead-letter topics exist at start.
"""

from __future__ import annotations

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from pipelines.errors import StreamviewsError
from pipelines.logs import get_logger

log = get_logger("topics")


def ensure_topics(bootstrap_servers: str, partitions: dict[str, int], timeout: float = 30) -> None:
    """Create each missing topic with its partition count; existing topics are left as they are."""
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    existing = admin.list_topics(timeout=timeout).topics
    missing = [
        NewTopic(name, num_partitions=n, replication_factor=-1)
        for name, n in partitions.items()
        if name not in existing
    ]
    if not missing:
        return
    for name, future in admin.create_topics(missing, request_timeout=timeout).items():
        try:
            future.result(timeout)
            log.info("created topic", topic=name, partitions=partitions[name])
        except KafkaException as e:
            if e.args[0].code() != e.args[0].TOPIC_ALREADY_EXISTS:
                raise StreamviewsError(f"topics: cannot create {name}: {e}") from e
