"""What the stream runner asks of Kafka for its streams' topics: their start rules, and the retention it sets.

A real StreamRunner over the in-memory Kafka (pipelines/runtime/testing/). The retention's interval
and size are read by PostgreSQL (tests/integration/test_start_offsets.py); here the runner is given
them as read, and what it sets on which topic, and when, is checked.
"""

from __future__ import annotations

from pipelines.cv.frontend.statements import NO_SCOPE, parse
from pipelines.cv.runner import StreamRunner
from pipelines.runtime.testing import MemoryBroker, MemoryDatabase, MemoryOffsets
from pipelines.settings import KafkaSettings, PipelineSettings, PostgresSettings


def runner(broker: MemoryBroker) -> StreamRunner:
    return StreamRunner(
        group_id="g",
        kafka=KafkaSettings(),
        postgres=PostgresSettings(),
        settings=PipelineSettings(),
        clients=broker,
        offsets=MemoryOffsets(MemoryDatabase(), "g"),
    )


def test_each_topic_starts_by_its_streams_rule():
    broker = MemoryBroker()
    streams = [
        parse("CREATE STREAM a (x bigint)", NO_SCOPE),
        parse("CREATE STREAM b (x bigint) WITH (start_offset = 'latest')", NO_SCOPE),
        parse("CREATE STREAM c (x bigint) WITH (topic = 't.c', start_offset = '2026-11-26 12:00:00+00')", NO_SCOPE),
    ]
    loaded = runner(broker)
    loaded.load({s.name: s for s in streams}, version=1)

    assert loaded.pipeline.starts == {"a": "earliest", "b": "latest", "t.c": 1_795_694_400_000}


def test_retention_is_set_when_declared_changed_when_it_changes_and_reset_to_the_brokers_default():
    broker = MemoryBroker()
    broker.create_topic("clicks")
    broker.create_topic("other")
    broker.configs["other"] = {"retention.ms": "1000"}  # set by its operator: no stream declares any
    loaded = runner(broker)
    declared = {"retention.ms": "604800000", "retention.bytes": None}

    loaded._alter_topic_configs({"clicks": declared, "other": {"retention.ms": None, "retention.bytes": None}})
    assert broker.configs == {"clicks": {"retention.ms": "604800000"}, "other": {"retention.ms": "1000"}}

    loaded._alter_topic_configs({"clicks": {"retention.ms": "3600000", "retention.bytes": "1048576"}})
    assert broker.configs["clicks"] == {"retention.ms": "3600000", "retention.bytes": "1048576"}

    loaded._alter_topic_configs({"clicks": {"retention.ms": "3600000", "retention.bytes": None}})  # RESET
    assert broker.configs["clicks"] == {"retention.ms": "3600000"}
    assert broker.configs["other"] == {"retention.ms": "1000"}  # never the runner's to change
