"""`python -m pipelines.cv.relay`: the sinks' relay (settings from the environment, docs/configuration.md)."""

from __future__ import annotations

import argparse
import sys

from confluent_kafka import Producer

from pipelines import metrics
from pipelines.cv.relay.publish import Publisher, producer_config
from pipelines.cv.relay.service import Relay, log
from pipelines.logs import configure_logging
from pipelines.runtime.interpreter import tune_for_batches
from pipelines.runtime.topics import ensure_topics
from pipelines.settings import KafkaSettings, MetricsSettings, PipelineSettings, PostgresSettings, SinkSettings

NAME = "sinks"


def main(argv: list[str] | None = None) -> int:
    """`python -m pipelines.cv.relay [--group G]`: relay the sinks until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m pipelines.cv.relay", description="Relay sinks to Kafka.")
    parser.add_argument(
        "--group",
        default=None,
        help="relay the sinks of views over streams declared with this consumer_group"
        " (default: those over streams declared without one)",
    )
    args = parser.parse_args(argv)
    configure_logging()
    settings, pipeline, kafka, postgres = SinkSettings(), PipelineSettings(), KafkaSettings(), PostgresSettings()
    metrics_settings = MetricsSettings()
    log.info(
        "settings",
        sinks=settings.describe(),
        group=args.group or "default",
        kafka=kafka.describe(),
        postgres=postgres.describe(),
        metrics=metrics_settings.describe(),
    )
    metrics.serve(metrics_settings, NAME, metrics.SINK_FAMILIES)
    producer = Producer(producer_config(kafka.bootstrap_servers, f"{kafka.client_id}-{NAME}"))

    def ensure_dead_letter_topic(topic: str) -> None:
        ensure_topics(kafka.bootstrap_servers, {topic: pipeline.topic_partitions})

    publisher = Publisher(producer, ensure_dead_letter_topic)
    try:
        tune_for_batches()
        relay = Relay(postgres.conninfo(), publisher, kafka.bootstrap_servers, settings, pipeline, args.group)
        relay.run()
    finally:
        producer.flush(30)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
