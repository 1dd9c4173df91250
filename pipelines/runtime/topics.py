"""Creating the topics a pipeline reads and writes, when they are missing, and keeping their declared configs.

The broker does not create topics on first use (auto-creation is off: a typo in a producer must not
create a topic), so each pipeline makes sure its input and dead-letter topics exist at start. A
topic may be given configs (a stream's retention: `retention.ms`, `retention.bytes`): set when it is
created, and changed later with `alter_topic_configs` (a None value returns to the broker's default).
"""

from __future__ import annotations

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic

from pipelines.errors import StreamviewsError
from pipelines.logs import get_logger

log = get_logger("topics")

# Per topic, config name -> value; None: the broker's default (the topic's own setting deleted).
TopicConfigs = dict[str, dict[str, str | None]]


def ensure_topics(
    bootstrap_servers: str, partitions: dict[str, int], configs: TopicConfigs | None = None, timeout: float = 30
) -> None:
    """Create each missing topic with its partition count and configs; existing topics are left as they are."""
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    existing = admin.list_topics(timeout=timeout).topics
    configs = configs or {}
    missing = [
        NewTopic(
            name,
            num_partitions=n,
            replication_factor=-1,
            config={k: v for k, v in configs.get(name, {}).items() if v is not None},
        )
        for name, n in partitions.items()
        if name not in existing
    ]
    if not missing:
        return
    for name, future in admin.create_topics(missing, request_timeout=timeout).items():
        try:
            future.result(timeout)
            log.info("created topic", topic=name, partitions=partitions[name], configs=configs.get(name, {}))
        except KafkaException as e:
            if e.args[0].code() != e.args[0].TOPIC_ALREADY_EXISTS:
                raise StreamviewsError(f"topics: cannot create {name}: {e}") from e


def alter_topic_configs(bootstrap_servers: str, configs: TopicConfigs, timeout: float = 30) -> None:
    """Set (or, for None, delete) each topic's configs named, leaving its other configs as they are.

    Raises:
        StreamviewsError: The brokers refused or did not answer (a missing topic, say).
    """
    resources = [
        ConfigResource(
            ConfigResource.Type.TOPIC,
            topic,
            incremental_configs=[
                ConfigEntry(
                    name,
                    value,
                    incremental_operation=AlterConfigOpType.DELETE if value is None else AlterConfigOpType.SET,
                )
                for name, value in sorted(entries.items())
            ],
        )
        for topic, entries in sorted(configs.items())
        if entries
    ]
    if not resources:
        return
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    for resource, future in admin.incremental_alter_configs(resources, request_timeout=timeout).items():
        try:
            future.result(timeout)
        except KafkaException as e:
            raise StreamviewsError(f"topics: cannot set the configs of {resource.name}: {e}") from e
        log.info("topic configs set", topic=resource.name, configs=configs[resource.name])
