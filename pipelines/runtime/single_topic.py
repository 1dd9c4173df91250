"""A service that consumes one topic into one sink (the audit writer): its declaration and command line.

The stream runner (pipelines/cv/runner.py) builds its pipeline itself, over every declared stream;
a single-topic service declares a `PipelineSpec` and hands it to `main`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic

import psycopg

from pipelines import metrics
from pipelines.logs import configure_logging, get_logger
from pipelines.runtime.checkpoint import P, Sink
from pipelines.runtime.clients import ConfluentClients
from pipelines.runtime.consumer import BatchDecoder, Pipeline
from pipelines.runtime.deadletter import dead_letter_topic
from pipelines.runtime.offsets import PostgresOffsets
from pipelines.settings import KafkaSettings, MetricsSettings, PipelineSettings, PostgresSettings

log = get_logger("consumer")


@dataclass(frozen=True)
class PipelineSpec(Generic[P]):
    """What a single-topic pipeline module declares: its name, default topic, decoder and sink.

    `add_arguments` adds the pipeline's own command-line options; `build` makes its decoder and sink
    from the parsed arguments (at start, so that settings are read in `main`, never at import).
    """

    name: str
    topic: str
    summary: str  # one line for --help
    module: str  # how it is run: python -m <module>
    build: Callable[[argparse.Namespace], tuple[BatchDecoder[P], Sink[psycopg.Connection, P]]]
    add_arguments: Callable[[argparse.ArgumentParser], None] = lambda _parser: None


def main(spec: PipelineSpec[Any], argv: list[str] | None = None) -> int:
    """Command line of a single-topic pipeline: `python -m <module> [--topic T] [--group G] [its options]`."""
    parser = argparse.ArgumentParser(prog=f"python -m {spec.module}", description=spec.summary)
    parser.add_argument("--topic", default=spec.topic, help=f"Kafka topic (default {spec.topic})")
    parser.add_argument("--group", default="", help="consumer group (default PIPELINE_GROUP_ID or streamviews-<name>)")
    spec.add_arguments(parser)
    args = parser.parse_args(argv)
    configure_logging()
    settings, kafka, postgres = PipelineSettings(), KafkaSettings(), PostgresSettings()
    metrics_settings = MetricsSettings()
    group_id = args.group or settings.group_id or f"streamviews-{spec.name}"
    log.info(
        "settings",
        pipeline=spec.name,
        **settings.describe(),
        kafka=kafka.describe(),
        postgres=postgres.describe(),
        metrics=metrics_settings.describe(),
    )
    metrics.serve(metrics_settings, spec.name)
    decode, sink = spec.build(args)
    clients = ConfluentClients(kafka)
    clients.ensure_topics(
        {args.topic: settings.topic_partitions, dead_letter_topic(args.topic): settings.topic_partitions}
    )
    pipeline = Pipeline(
        spec.name,
        decode=decode,
        sink=sink,
        clients=clients,
        offsets=PostgresOffsets(postgres.conninfo(), group_id),
        settings=settings,
        metrics_refresh_s=metrics_settings.refresh_s,
    )
    pipeline.subscribe([args.topic])
    pipeline.run()
    return 0
