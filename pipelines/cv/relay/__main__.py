"""`python -m pipelines.cv.relay`: the sinks' relay (settings from the environment, docs/configuration.md)."""

from __future__ import annotations

import sys

from confluent_kafka import Producer

from pipelines import metrics
from pipelines.cv.relay.publish import Publisher, producer_config
from pipelines.cv.relay.service import Relay, log
from pipelines.logs import configure_logging
from pipelines.settings import KafkaSettings, MetricsSettings, PipelineSettings, PostgresSettings, SinkSettings

NAME = "sinks"


def main(argv: list[str] | None = None) -> int:
    """Run the relay until SIGTERM or SIGINT."""
    if argv:
        print("usage: python -m pipelines.cv.relay (settings come from the environment)", file=sys.stderr)
        return 2
    configure_logging()
    settings, pipeline, kafka, postgres = SinkSettings(), PipelineSettings(), KafkaSettings(), PostgresSettings()
    metrics_settings = MetricsSettings()
    log.info(
        "settings",
        sinks=settings.describe(),
        kafka=kafka.describe(),
        postgres=postgres.describe(),
        metrics=metrics_settings.describe(),
    )
    metrics.serve(metrics_settings, NAME, metrics.SINK_FAMILIES)
    producer = Producer(producer_config(kafka.bootstrap_servers, f"{kafka.client_id}-{NAME}"))
    try:
        Relay(postgres.conninfo(), Publisher(producer), kafka.bootstrap_servers, settings, pipeline).run()
    finally:
        producer.flush(30)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
