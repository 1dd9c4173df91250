"""A topic recreated under its name is read from its beginning, not from the old topic's offsets.

Kafka gives every topic a unique id (KIP-516); the id of the topic a position was stored for is
kept beside it (`ops.kafka_offsets.topic_id`, migration 0019). On partition assignment the pipeline
compares them: a changed id restarts the group's partitions of that topic at 0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
from confluent_kafka import KafkaException

from pipelines.logs import get_logger
from pipelines.runtime.checkpoint import Checkpoint
from pipelines.runtime.clients import KafkaClients

log = get_logger("topic_ids")


def check_topic_ids(
    clients: KafkaClients, checkpoint: Checkpoint[Any, Any], topics: list[str], recreated: Callable[[str], None]
) -> None:
    """Restart the group's offsets of each topic whose Kafka id changed; note the ids for new claims.

    `recreated(topic)` is called for each (the pipeline counts it). Without an answer from Kafka or
    PostgreSQL the check is skipped (logged): consuming goes on as before it existed.
    """
    try:
        ids = clients.topic_ids(topics)
        stored = checkpoint.stored_topic_ids(topics)
    except (KafkaException, psycopg.Error) as e:
        log.warning("cannot check the topics' ids", topics=topics, error=str(e))
        return
    checkpoint.topic_ids.update(ids)
    for topic, topic_id in ids.items():
        if stored.get(topic, {topic_id}) != {topic_id}:
            reset = checkpoint.restart_topic(topic, topic_id)
            recreated(topic)
            log.warning(
                "topic was recreated; reading it from its beginning",
                topic=topic,
                old_ids=sorted(stored[topic]),
                new_id=topic_id,
                partitions_reset=reset,
            )
    checkpoint.record_topic_ids(ids)
