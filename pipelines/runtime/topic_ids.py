"""A topic recreated under its name is read from its beginning, not from the old topic's offsets.

Kafka gives every topic a unique id (KIP-516); the id of the topic a position was stored for is
kept beside it (`ops.kafka_offsets.topic_id`, migration 0019). On partition assignment the pipeline
compares them: a changed id restarts the group's partitions of that topic at 0, or, for a topic with
a start rule (pipelines/runtime/starts.py), forgets them: the new topic's first consumption follows
the rule again.
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
    clients: KafkaClients,
    checkpoint: Checkpoint[Any, Any],
    topics: list[str],
    recreated: Callable[[str], None],
    has_start_rule: Callable[[str], bool] = lambda _topic: False,
) -> None:
    """Restart the group's offsets of each topic whose Kafka id changed; note the ids for new claims.

    `recreated(topic)` is called for each (the pipeline counts it). A topic that `has_start_rule`
    (it starts elsewhere than its beginning) has its rows forgotten instead of restarted at 0. Without
    an answer from Kafka or PostgreSQL the check is skipped (logged): consuming goes on as before.
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
            ruled = has_start_rule(topic)
            reset = checkpoint.forget_topic(topic) if ruled else checkpoint.restart_topic(topic, topic_id)
            recreated(topic)
            log.warning(
                "topic was recreated; "
                + ("its start rule applies again" if ruled else "reading it from its beginning"),
                topic=topic,
                old_ids=sorted(stored[topic]),
                new_id=topic_id,
                partitions_reset=reset,
            )
    checkpoint.record_topic_ids(ids)
