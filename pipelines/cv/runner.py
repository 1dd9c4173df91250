"""The stream runner: every declared stream's topic into its state and continuous views, with no code.

Run: `streamviews run` or `python -m pipelines.cv.runner` (supervised by `make up` as `streams`, a
service in docker-compose.yml). One process consumes the topics of all the streams in the catalog
(`cv.streams`) in one consumer group; more processes in the same group share the partitions, and
the offsets stored in PostgreSQL fence them, so N processes give exactly the result of one.

The catalog is watched while the runner works: every `PIPELINE_CATALOG_POLL_S` it compares the
catalog's version (bumped by every definition and drop). When it moved, the runner reloads the
streams, creates missing topics, builds each stream's decoder from its declaration
(pipelines.cv.decoding.stream_decoder) and re-subscribes, so a stream defined on a running system starts flowing
within about a second, and a dropped one stops.

A batch is one poll over all the topics: each topic's messages are decoded by its stream's decoder,
the rows of a stream declared `into` another join that stream's changes, and the sink applies every
stream's changes in one transaction with the offsets of every partition the poll read.

Besides the pipeline's metrics (pipelines/metrics.py), the runner exports the lag of every logical
replication slot of the cluster: the Debezium slots feed its CDC streams, and a slot that stops
advancing holds WAL back on the database the views live on.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

import psycopg
from confluent_kafka import KafkaException, Message

from pipelines import metrics
from pipelines.cv import catalog
from pipelines.cv.backfill_process import BackfillProcess
from pipelines.cv.catalog.stream_types import PostgresInputCheck
from pipelines.cv.catalog.streams import declared_topic_configs
from pipelines.cv.decoding.stream_decoder import StreamDecoder
from pipelines.cv.feeds import ViewFeeds
from pipelines.cv.model import DefinitionError, StreamDef
from pipelines.cv.plans import declared_streams
from pipelines.cv.sink import ViewChanges, ViewSink
from pipelines.cv.stream_changes import Origin, StreamChanges
from pipelines.cv.stream_choice import StreamChoice
from pipelines.errors import StreamviewsError
from pipelines.logs import configure_logging, get_logger
from pipelines.runtime.clients import ConfluentClients, KafkaClients
from pipelines.runtime.consumer import UNDECODABLE, Decoded, Pipeline
from pipelines.runtime.deadletter import dead_letter_topic
from pipelines.runtime.events import InvalidEvent
from pipelines.runtime.offsets import OffsetStore, PostgresOffsets
from pipelines.runtime.topics import TopicConfigs
from pipelines.settings import (
    STREAM_RUNNER_GROUP,
    KafkaSettings,
    MetricsSettings,
    PipelineSettings,
    PostgresSettings,
)

log = get_logger("cv.runner")

NAME = "streams"
DEFAULT_GROUP = STREAM_RUNNER_GROUP
# Every logical slot of the cluster (pg_replication_slots is readable by any role): how many WAL bytes
# it holds back from its consumer's last confirmed position, and whether a consumer is connected.
SLOTS_SQL = (
    "SELECT slot_name, pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint, active"
    " FROM pg_replication_slots WHERE slot_type = 'logical'"
)


@dataclass(frozen=True)
class Source:
    """A topic the runner reads: the stream declaring it, where its rows go, and its decoder."""

    stream: StreamDef
    target: str  # the stream whose state and views take the rows: itself, or the one it feeds `into`
    decoder: StreamDecoder


class StreamRunner:
    """Keeps the pipeline's subscription and decoders in step with the catalog.

    Args:
        group_id: The consumer group; it runs the streams declared with this `consumer_group`.
        default_group: True for the default group (no `--group`): it also runs every stream declared
            without a `consumer_group`.
        only: Run just these streams (and those feeding them); None runs all of the group's.
        metrics_refresh_s: How often the lag gauges are set (the slots' every other time).
        clients: Its Kafka clients (default: confluent-kafka's, from `kafka`).
        offsets: Its group's stored offsets (default: PostgreSQL's, from `postgres`).
    """

    def __init__(
        self,
        *,
        group_id: str,
        kafka: KafkaSettings,
        postgres: PostgresSettings,
        settings: PipelineSettings,
        default_group: bool = True,
        only: frozenset[str] | None = None,
        metrics_refresh_s: float = 5.0,
        clients: KafkaClients | None = None,
        offsets: OffsetStore[psycopg.Connection] | None = None,
    ) -> None:
        self.postgres, self.settings, self.only = postgres, settings, only
        self.kafka = kafka
        self.group_id, self.default_group = group_id, default_group
        self.choice = StreamChoice(group_id, default_group, only)
        self.backfill: BackfillProcess | None = None
        self.clients = clients or ConfluentClients(kafka)
        self.sink = ViewSink(
            group_id,
            poison_limit=settings.poison_limit,
            view_retry_s=settings.view_retry_s,
            changes_retention_s=settings.changes_retention_s,
            feed_dead_letters_retention_s=settings.feed_dead_letters_retention_s,
        )
        self.pipeline: Pipeline[psycopg.Connection, ViewChanges] = Pipeline(
            NAME,
            decode=self.decode,
            sink=self.sink,
            clients=self.clients,
            offsets=offsets or PostgresOffsets(postgres.conninfo(), group_id),
            settings=settings,
            metrics_refresh_s=metrics_refresh_s,
        )
        self.sources: dict[str, Source] = {}  # by topic
        self.topic_configs: TopicConfigs = {}  # the configs this runner set on each topic (a stream's retention)
        self.version: int | None = None
        self._conn: psycopg.Connection | None = None
        # The values of types PostgreSQL reads (kind input) are asked of it as each batch is decoded.
        self.input_check = PostgresInputCheck(self._catalog_connection)
        self._next_check = self._next_slots = self._next_backfill_look = 0.0
        self._slots_refresh_s = 2 * metrics_refresh_s

    def run(self) -> None:
        """Load the catalog, then consume until SIGTERM/SIGINT, reloading whenever the catalog changes.

        Views over views are fed beside the Kafka loop, in a thread of their own (pipelines.cv.feeds):
        their changes come from PostgreSQL, not from a poll, and a chain should not wait for the next
        Kafka batch (nor a Kafka batch for a chain); it works in the database, so the GIL is not what
        it shares. A runner feeds the chains of the streams it consumes (unless PIPELINE_FEEDS=false);
        the reader positions are fenced, so several runners of a group take each page once.
        """
        stop = threading.Event()
        feeds = None
        if self.settings.feeds:
            feeds = threading.Thread(target=self._feeds().run, args=(stop,), name="view-feeds", daemon=True)
            feeds.start()
        if self.settings.backfill:  # new views' history (pipelines.cv.backfill), in a niced process of its own
            self.backfill = BackfillProcess(self.choice, nice=self.settings.backfill_nice)
        try:
            self.pipeline.run(tick=self.tick)
        finally:
            stop.set()
            if self.backfill is not None:
                self.backfill.stop()
            if feeds is not None:
                feeds.join(timeout=10)

    def _feeds(self) -> ViewFeeds:
        return ViewFeeds(
            self.postgres.conninfo(),
            page=self.settings.feed_page,
            poll_s=self.settings.feed_poll_s,
            view_retry_s=self.settings.view_retry_s,
            group_id=self.group_id,
            poison_limit=self.settings.poison_limit,  # as for the stream's own records
            roots=lambda stream: stream in self.sink.streams,  # the chains of the streams this runner consumes
        )

    def tick(self) -> None:
        """Between polls: the catalog, and now and then the replication slots' gauges and the backfill process."""
        self.watch_catalog()
        now = time.monotonic()
        if now >= self._next_slots:
            self._next_slots = now + self._slots_refresh_s
            self.export_slots()
        if self.backfill is not None and now >= self._next_backfill_look:
            self._next_backfill_look = now + self.settings.backfill_poll_s
            self.keep_backfill(self.backfill)

    def keep_backfill(self, backfill: BackfillProcess) -> None:
        """The backfill process running while a backfill of this runner's streams waits, and only then."""
        try:
            waiting = (
                self._catalog_connection()
                .execute("SELECT DISTINCT stream FROM cv.backfills WHERE done_at IS NULL")
                .fetchall()
            )
        except psycopg.Error as e:
            log.warning("cannot read the backfills; will retry", error=str(e).strip())
            self._close()
            return
        backfill.keep(any(stream in self.sink.streams for (stream,) in waiting))

    def export_slots(self) -> None:
        """Set the replication-slot and failure gauges (a failure only logs: the connection is retried)."""
        try:
            conn = self._catalog_connection()
            slots = conn.execute(SLOTS_SQL).fetchall()
            streams = sorted({source.target for source in self.sources.values()})
            quarantined = conn.execute(
                "SELECT view, stream FROM cv.view_failures WHERE stream = ANY(%s)", (streams,)
            ).fetchall()
            held = conn.execute(
                "SELECT stream FROM cv.stream_failures WHERE group_id = %s AND stream = ANY(%s)",
                (self.group_id, streams),
            ).fetchall()
        except psycopg.Error as e:
            log.warning("cannot read the replication slots and failures; will retry", error=str(e).strip())
            self._close()
            return
        metrics.set_replication_slots(slots)
        metrics.set_failures(quarantined, [stream for (stream,) in held])

    def watch_catalog(self) -> None:
        """Reload the streams when the catalog's version moved (checked at most every poll interval)."""
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + self.settings.catalog_poll_s
        try:
            conn = self._catalog_connection()
            version = catalog.catalog_version(conn)
            if version == self.version:
                return
            streams = declared_streams(conn)
            paused = frozenset(name for (name,) in conn.execute("SELECT stream FROM cv.paused_streams"))
        except psycopg.Error as e:
            log.warning("cannot read the catalog; will retry", error=str(e).strip())
            self._close()
            return
        self.load(streams, version, paused)

    def load(self, streams: dict[str, StreamDef], version: int, paused: frozenset[str] = frozenset()) -> None:
        """Decoders and topics for these streams; subscribe to exactly their topics.

        A deactivated stream (`paused`, migration 0028) is not read, nor are the streams feeding it:
        its offsets stay in PostgreSQL, and activating it reads on from there.
        """
        sources = {}
        for stream in streams.values():
            if not self.choice.runs(stream, paused):
                continue
            known = self.sources.get(stream.topic)
            if known is not None and known.stream == stream:
                sources[stream.topic] = known  # unchanged: its decoder is kept, not generated again
                continue
            try:
                decoder = StreamDecoder(stream, input_check=self.input_check)
            except DefinitionError as e:  # defined by an older release, say: skip it, run the others
                log.error("stream cannot be decoded; not consumed", stream=stream.name, error=str(e))
                continue
            sources[stream.topic] = Source(stream, stream.into or stream.name, decoder)
        self._ensure_topics(sources.values())
        self.sources = sources
        self.sink.streams = tuple(sorted({source.target for source in sources.values()}))
        self.pipeline.metrics.name_streams({topic: source.stream.name for topic, source in sources.items()})
        self.version = version
        log.info(
            "catalog loaded",
            catalog_version=version,
            streams={source.stream.name: source.stream.topic for source in sources.values()},
            deactivated=sorted(paused),
        )
        self.pipeline.starts = {topic: source.stream.start_at for topic, source in sources.items()}
        self.pipeline.subscribe(sources)

    def decode(self, by_topic: dict[str, list[Message]]) -> Decoded[ViewChanges]:
        """A poll's messages, topic by topic through each stream's decoder, into changes per target stream."""
        payload: ViewChanges = {}
        rejected: list[tuple[Message, InvalidEvent]] = []
        counts: dict[str, int] = {}
        size = 0
        for topic, group in by_topic.items():
            source = self.sources.get(topic)
            if source is None:
                continue  # the stream was dropped: its records are consumed and applied nowhere
            try:
                decoded = source.decoder.decode_batch(group)
            except Exception:  # a decoder bug: only the records it fails on are lost to the dead letters
                log.exception("batch decoding failed; decoding record by record", stream=source.stream.name)
                decoded = source.decoder.decode_each(group, undecodable=UNDECODABLE)
            if decoded.rejected and self._redeclared(source):
                source = self.sources[topic]  # ALTER STREAM ADD COLUMN, or declared again, since its decoder was built
                decoded = source.decoder.decode_batch(group)
            rejected.extend((group[index], error) for index, error in decoded.rejected)
            # Records, not changes: a Debezium update is one record and two changes (delete, insert).
            records = len(group) - len(decoded.rejected) - decoded.skipped
            if decoded.ops:
                changes = payload.get(source.target)
                if changes is None:
                    changes = payload[source.target] = StreamChanges()
                changes.extend(decoded.ops, decoded.columns, Origin(topic, source.decoder))
                size += records
            counts[topic] = records
        return Decoded(payload, size, rejected, counts)

    def _redeclared(self, source: Source) -> bool:
        """After an event was refused: the stream's stored declaration, if it changed since the decoder was built.

        A field added by ALTER STREAM ADD COLUMN, or a stream dropped and declared again (a column
        now optional, of another type), reaches the topic as soon as the definition commits; the
        catalog is read again between polls only. Asking now, at the cost of one catalog read per
        poll that refused something, keeps such events from the dead letters.
        """
        try:
            conn = self._catalog_connection()
            if catalog.catalog_version(conn) == self.version:
                return False
            stream = declared_streams(conn).get(source.stream.name)
        except psycopg.Error as e:
            log.warning("cannot read the catalog; will retry", error=str(e).strip())
            self._close()
            return False
        if stream is None or stream == source.stream or stream.topic != source.stream.topic:
            return False
        self.sources[stream.topic] = Source(stream, source.target, StreamDecoder(stream, input_check=self.input_check))
        return True

    def _ensure_topics(self, sources: Iterable[Source]) -> None:
        partitions: dict[str, int] = {}
        for source in sources:
            count = source.stream.partitions or self.settings.topic_partitions
            partitions[source.stream.topic] = count
            partitions[dead_letter_topic(source.stream.topic)] = count
        if not partitions:
            return
        configs = self._topic_configs([source.stream for source in sources])
        try:
            self.clients.ensure_topics(partitions, configs)
            self._alter_topic_configs(configs)
        except (StreamviewsError, KafkaException) as e:
            # Subscribing still works: a topic that appears later is picked up by the consumer.
            log.warning("cannot create topics or set their configs; consuming those that exist", error=str(e))

    def _topic_configs(self, streams: list[StreamDef]) -> TopicConfigs:
        """The retention each stream declares, as PostgreSQL reads its interval and size (none: no answer)."""
        if not any(s.retention or s.retention_bytes for s in streams) and not self.topic_configs:
            return {}
        try:
            return declared_topic_configs(self._catalog_connection(), streams)
        except psycopg.Error as e:
            log.warning("cannot read the streams' retention; topics keep theirs", error=str(e).strip())
            return {}

    def _alter_topic_configs(self, configs: TopicConfigs) -> None:
        """Set the configs that changed since this runner last set them; a stream that never declared any is left alone.

        A retention RESET while no runner ran is not seen: the topic keeps what was last set (docs/streams.md).
        """
        changed = {
            topic: config
            for topic, config in configs.items()
            if self.topic_configs.get(topic, {}) != config and (topic in self.topic_configs or any(config.values()))
        }
        if changed:
            self.clients.alter_topic_configs(changed)
        self.topic_configs.update(changed)

    def _catalog_connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.postgres.conninfo(), autocommit=True)
        return self._conn

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None


def main(argv: list[str] | None = None) -> int:
    """`python -m pipelines.cv.runner [--group G] [--streams a,b]`: run the declared streams."""
    parser = argparse.ArgumentParser(
        prog="streamviews run", description="Consume every declared stream's topic into its continuous views."
    )
    parser.add_argument("--group", default="", help=f"consumer group (default PIPELINE_GROUP_ID or {DEFAULT_GROUP})")
    parser.add_argument(
        "--streams", default="", help="comma-separated streams to run, and those feeding them (default: all)"
    )
    args = parser.parse_args(argv)
    configure_logging()
    settings, kafka, postgres = PipelineSettings(), KafkaSettings(), PostgresSettings()
    metrics_settings = MetricsSettings()
    group_id = args.group or settings.group_id or DEFAULT_GROUP
    only = frozenset(name.strip() for name in args.streams.split(",") if name.strip()) or None
    log.info(
        "settings",
        pipeline=NAME,
        **{**settings.describe(), "group_id": group_id},
        streams=sorted(only) if only else "all",
        kafka=kafka.describe(),
        postgres=postgres.describe(),
        metrics=metrics_settings.describe(),
    )
    metrics.serve(metrics_settings, NAME, metrics.RUNNER_FAMILIES)
    StreamRunner(
        group_id=group_id,
        kafka=kafka,
        postgres=postgres,
        settings=settings,
        default_group=not args.group,
        only=only,
        metrics_refresh_s=metrics_settings.refresh_s,
    ).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
