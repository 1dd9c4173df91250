"""Prometheus metrics of the long-running services: every family is defined here, once, with its HELP.

Each service (the stream runner, the audit writer, the ctid puller, the sinks' relay) calls `serve()`
at start, which serves `GET /metrics` on METRICS_HOST:METRICS_PORT from prometheus-client's HTTP
server in a daemon thread; the code that knows a figure updates its family through this module. The
registry is the process's default one: a process is one service, named by the `pipeline` label.

The names are a contract: the alert rules and the dashboard (monitoring/) are written against them.

Cheap on the hot path, which carries ~300k events/s: counters and histograms move once per committed
batch, never per event, and the children of labelled families are looked up once and kept (each
`labels()` call takes a lock). Gauges that are read rather than counted (consumer lag, the puller's
backlog, replication slots) are refreshed every METRICS_REFRESH_S by the service's own loop.
Freshness is computed when Prometheus scrapes, from the newest event time committed, so it keeps
growing while nothing arrives: an alert on it should also look at the stream's lag or event rate.
Labels stay few: pipeline, stream, topic, partition, dead-letter reason, slot; never a key or a value.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator, Mapping

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, disable_created_metrics, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pipelines.logs import get_logger
from pipelines.settings import MetricsSettings

log = get_logger("metrics")

# The `_created` series prometheus-client adds to every counter and histogram double the series a
# scrape stores and serve no dashboard; the switch only counts for children created after it.
disable_created_metrics()

EVENTS = Counter(
    "streamviews_events_total",
    "Events applied to PostgreSQL, per stream (counted when their batch commits; dead letters excluded).",
    ("pipeline", "stream"),
)
BATCH_SIZE = Histogram(
    "streamviews_batch_size_events",
    "Records per committed batch (applied and dead-lettered): one poll, at most PIPELINE_BATCH_MAX.",
    ("pipeline",),
    buckets=(1, 10, 100, 1_000, 5_000, 10_000, 25_000, 50_000, 100_000),
)
COMMIT_DURATION = Histogram(
    "streamviews_commit_duration_seconds",
    "Seconds of the PostgreSQL transaction that applies a batch and stores its offsets (committed batches).",
    ("pipeline",),
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
CONSUMER_LAG = Gauge(
    "streamviews_consumer_lag_records",
    "Records behind per assigned partition: the log end offset (high watermark, as the consumer last"
    " fetched it) minus the next offset stored in PostgreSQL for the pipeline's consumer group.",
    ("pipeline", "topic", "partition"),
)
DEAD_LETTERS = Counter(
    "streamviews_dead_letters_total",
    "Records sent to <topic>.dlq, per source topic and reason (counted when their batch commits).",
    ("pipeline", "topic", "reason"),
)
ROLLBACKS = Counter(
    "streamviews_rollbacks_total",
    "Batch transactions rolled back (database error, deadlock, a fence after a rebalance).",
    ("pipeline",),
)
RESEEKS = Counter(
    "streamviews_reseeks_total",
    "Rewinds of the consumer to the offsets stored in PostgreSQL, after a batch was not committed.",
    ("pipeline",),
)
TOPIC_RECREATIONS = Counter(
    "streamviews_topic_recreations_total",
    "Topics found deleted and created again under the same name (their id changed) when partitions were"
    " assigned: the group reads the new topic from its beginning.",
    ("pipeline", "topic"),
)
VIEW_QUARANTINED = Gauge(
    "streamviews_view_quarantine_active",
    "1 while a continuous view is quarantined (cv.view_failures): it is not maintained until it runs again.",
    ("view", "stream"),
    registry=None,
)
STREAM_HELD = Gauge(
    "streamviews_stream_hold_active",
    "1 while the stream runner holds a stream back (cv.stream_failures): its offsets wait, nothing is lost.",
    ("stream",),
    registry=None,
)
SLOT_LAG = Gauge(
    "streamviews_replication_slot_lag_bytes",
    "WAL bytes a logical replication slot still holds back: pg_current_wal_lsn() - confirmed_flush_lsn"
    " (exported by the stream runner, for every logical slot of the cluster).",
    ("slot",),
    registry=None,
)
SLOT_ACTIVE = Gauge(
    "streamviews_replication_slot_active",
    "1 while a client (Debezium) is connected to the logical replication slot, 0 otherwise.",
    ("slot",),
    registry=None,
)
PULLER_ROWS_BEHIND = Gauge(
    "streamviews_puller_rows_behind",
    "Audit rows committed by the writer that the ctid puller has not indexed into Elasticsearch yet.",
    registry=None,
)
PULLER_SECONDS_BEHIND = Gauge(
    "streamviews_puller_seconds_behind",
    "Seconds the oldest unindexed audit batch has waited since its commit (0 when caught up).",
    registry=None,
)
PULLER_ROWS_INDEXED = Counter(
    "streamviews_puller_rows_indexed_total",
    "Audit rows Elasticsearch acknowledged (a row indexed again after a restart counts again).",
    registry=None,
)
BULK_FAILURES = Counter(
    "streamviews_elasticsearch_bulk_failures_total",
    "Bulk requests to Elasticsearch not fully acknowledged, by reason: transport (no answer), api_error"
    " (an HTTP error for the whole request), retryable (items refused for now: 429, 503, ...), refused"
    " (items refused for good, indexed again stripped to their core fields).",
    ("reason",),
    registry=None,
)

SINK_PUBLISHED = Counter(
    "streamviews_sink_changes_published_total",
    "Records a sink published to its topic and Kafka acknowledged (snapshot rows included; a record sent"
    " again after a crash counts again).",
    ("sink",),
    registry=None,
)
SINK_LAG_CHANGES = Gauge(
    "streamviews_sink_lag_changes",
    "Changes of its view a sink has not relayed yet: the view's last position minus the sink's.",
    ("sink",),
    registry=None,
)
SINK_LAG_SECONDS = Gauge(
    "streamviews_sink_lag_seconds",
    "Seconds since the oldest change a sink has not relayed was committed (0 when caught up).",
    ("sink",),
    registry=None,
)
SINK_FAILED = Gauge(
    "streamviews_sink_failure_active",
    "1 while a sink's last attempt failed (its filter raised, Kafka refused): it is tried again later.",
    ("sink",),
    registry=None,
)


class Freshness(Collector):
    """`streamviews_freshness_seconds`: now minus the newest event time committed, per stream.

    The event time is the Kafka timestamp of the last record of each partition in a committed batch
    (the producer's CreateTime unless the topic says LogAppendTime), the same value stored in
    `ops.kafka_offsets.last_event_at`. It is computed at scrape time, so it is never stale.
    """

    def __init__(self) -> None:
        self._newest: dict[tuple[str, str], float] = {}  # (pipeline, stream) -> epoch seconds

    def committed(self, pipeline: str, stream: str, event_time_s: float) -> None:
        """A batch committed events of `stream` up to this event time."""
        key = (pipeline, stream)
        if event_time_s > self._newest.get(key, 0.0):
            self._newest[key] = event_time_s

    def keep(self, pipeline: str, streams: Iterable[str]) -> None:
        """Forget the pipeline's other streams (dropped from the catalog)."""
        keep = set(streams)
        for key in [k for k in self._newest if k[0] == pipeline and k[1] not in keep]:
            del self._newest[key]

    def collect(self) -> Iterator[Metric]:
        """The family as of now (a clock ahead of the producers' reads as 0, never negative)."""
        family = GaugeMetricFamily(
            "streamviews_freshness_seconds",
            "Seconds since the newest event committed to PostgreSQL for the stream was produced: now"
            " minus the Kafka timestamp of the last record committed (grows while the stream is idle).",
            labels=("pipeline", "stream"),
        )
        now = time.time()
        for (pipeline, stream), newest in sorted(self._newest.copy().items()):  # a copy: batches commit meanwhile
            family.add_metric((pipeline, stream), max(now - newest, 0.0))
        yield family


class ServiceFamilies(Collector):
    """Families only one service has: their samples in that service, elsewhere their HELP and TYPE only.

    Otherwise every process would export the puller's unlabelled gauges at 0, say, beside the
    puller's real ones. `serve()` of the owning service sets `owned`.
    """

    def __init__(self, *families: Collector) -> None:
        self.families = families
        self.owned = False

    def collect(self) -> Iterator[Metric]:
        """The families, emptied of their samples unless this process is their service."""
        for family in self.families:
            for metric in family.collect():  # fresh Metric objects at every call
                if not self.owned:
                    metric.samples = []
                yield metric


INBOX_PUBLISHED = Counter(
    "streamviews_inbox_rows_published_total",
    "Rows written to streams with SQL (INSERT, COPY) and published to their topics, per stream.",
    ("stream",),
    registry=None,
)
INBOX_BEHIND = Gauge(
    "streamviews_inbox_rows_behind",
    "Rows in cv.stream_inbox not yet published: committed ones, and those whose transaction is still open.",
    registry=None,
)

FRESHNESS = Freshness()
RUNNER_FAMILIES = ServiceFamilies(SLOT_LAG, SLOT_ACTIVE, VIEW_QUARANTINED, STREAM_HELD)
PULLER_FAMILIES = ServiceFamilies(PULLER_ROWS_BEHIND, PULLER_SECONDS_BEHIND, PULLER_ROWS_INDEXED, BULK_FAILURES)
SINK_FAMILIES = ServiceFamilies(SINK_PUBLISHED, SINK_LAG_CHANGES, SINK_LAG_SECONDS, SINK_FAILED)
INBOX_FAMILIES = ServiceFamilies(INBOX_PUBLISHED, INBOX_BEHIND)
for _collector in (FRESHNESS, RUNNER_FAMILIES, PULLER_FAMILIES, SINK_FAMILIES, INBOX_FAMILIES):
    REGISTRY.register(_collector)


def serve(settings: MetricsSettings, service: str, owned: ServiceFamilies | None = None) -> bool:
    """Serve /metrics in a daemon thread, with the samples of the service's `owned` families.

    Returns False when not served: disabled (port 0), or the port is taken.

    A taken port is logged, not raised: a pipeline without its metrics still moves data, which
    matters more than being watched (the missing scrape target is what Prometheus alerts on).
    """
    if not settings.port:
        log.info("metrics disabled", service=service)
        return False
    if owned is not None:
        owned.owned = True
    try:
        start_http_server(settings.port, addr=settings.host)
    except OSError as e:
        log.error("cannot serve metrics", service=service, host=settings.host, port=settings.port, error=str(e))
        return False
    log.info("metrics served", service=service, url=f"http://{settings.host}:{settings.port}/metrics")
    return True


class PipelineMetrics:
    """One consumer pipeline's families, with their children looked up once.

    `streams` names the stream each topic carries (the stream runner sets it from the catalog);
    a topic missing from it is its own stream (the audit writer's `audit`).
    """

    def __init__(self, pipeline: str) -> None:
        self.pipeline = pipeline
        self.streams: dict[str, str] = {}
        self._batch_size = BATCH_SIZE.labels(pipeline)
        self._commit_duration = COMMIT_DURATION.labels(pipeline)
        self._rollbacks = ROLLBACKS.labels(pipeline)
        self._reseeks = RESEEKS.labels(pipeline)
        self._events: dict[str, Counter] = {}
        self._dead: dict[tuple[str, str], Counter] = {}
        self._lag: dict[tuple[str, int], Gauge] = {}

    def name_streams(self, streams: Mapping[str, str]) -> None:
        """The stream of each topic from now on; the series of the streams and topics gone are dropped."""
        self.streams = dict(streams)
        FRESHNESS.keep(self.pipeline, self.streams.values())
        kept = set(self.streams.values())
        for stream in [s for s in self._events if s not in kept]:
            del self._events[stream]
            EVENTS.remove(self.pipeline, stream)
        for key in [k for k in self._dead if k[0] not in self.streams]:
            del self._dead[key]
            DEAD_LETTERS.remove(self.pipeline, *key)

    def topic_recreated(self, topic: str) -> None:
        """A topic's id changed under the group: it is read again from its beginning."""
        TOPIC_RECREATIONS.labels(self.pipeline, topic).inc()

    def committed(
        self,
        consumed: int,
        events: Mapping[str, int],
        dead_letters: Mapping[tuple[str, str], int],
        newest_ms: Mapping[tuple[str, int], int],
    ) -> None:
        """Count a committed batch.

        Args:
            consumed: Records of the batch, applied and dead-lettered.
            events: Records applied, per topic.
            dead_letters: Records dead-lettered, per (topic, reason).
            newest_ms: The Kafka timestamp (ms) of the last record of each (topic, partition).
        """
        self._batch_size.observe(consumed)
        for topic, n in events.items():
            stream = self.streams.get(topic, topic)
            child = self._events.get(stream)
            if child is None:
                child = self._events[stream] = EVENTS.labels(self.pipeline, stream)
            child.inc(n)
        for key, n in dead_letters.items():
            child = self._dead.get(key)
            if child is None:
                child = self._dead[key] = DEAD_LETTERS.labels(self.pipeline, *key)
            child.inc(n)
        self.event_times(newest_ms)

    def event_times(self, newest_ms: Mapping[tuple[str, int], int]) -> None:
        """Events up to these Kafka timestamps (ms, per (topic, partition)) are committed."""
        for (topic, _), ms in newest_ms.items():
            FRESHNESS.committed(self.pipeline, self.streams.get(topic, topic), ms / 1000)

    def commit_seconds(self, seconds: float) -> None:
        """How long a committed batch's transaction took (called from the committer thread)."""
        self._commit_duration.observe(seconds)

    def rolled_back(self) -> None:
        """A batch's transaction failed and was rolled back."""
        self._rollbacks.inc()

    def reseeked(self) -> None:
        """The consumer went back to the offsets stored in PostgreSQL."""
        self._reseeks.inc()

    def set_lag(self, lags: Mapping[tuple[str, int], int]) -> None:
        """The lag of every partition the pipeline holds now; partitions no longer held are removed."""
        for tp in self._lag.keys() - lags.keys():
            del self._lag[tp]
            CONSUMER_LAG.remove(self.pipeline, tp[0], str(tp[1]))
        for tp, lag in lags.items():
            child = self._lag.get(tp)
            if child is None:
                child = self._lag[tp] = CONSUMER_LAG.labels(self.pipeline, tp[0], str(tp[1]))
            child.set(lag)


def set_replication_slots(slots: Iterable[tuple[str, int | None, bool]]) -> None:
    """Every logical slot as (name, bytes behind or None when it never confirmed, active); others removed."""
    seen = set()
    for slot, lag, active in slots:
        seen.add(slot)
        SLOT_ACTIVE.labels(slot).set(1 if active else 0)
        if lag is not None:
            SLOT_LAG.labels(slot).set(lag)
    for slot in _slots - seen:
        for family in (SLOT_ACTIVE, SLOT_LAG):
            with contextlib.suppress(KeyError):  # a slot that never confirmed has no lag child
                family.remove(slot)
    _slots.clear()
    _slots.update(seen)


_slots: set[str] = set()  # the slots exported by the last refresh


def set_failures(quarantined: Iterable[tuple[str, str]], held: Iterable[str]) -> None:
    """The views quarantined, as (view, stream), and the streams held now; the others are removed."""
    VIEW_QUARANTINED.clear()
    for view, stream in quarantined:
        VIEW_QUARANTINED.labels(view, stream).set(1)
    STREAM_HELD.clear()
    for stream in held:
        STREAM_HELD.labels(stream).set(1)


def set_puller_backlog(rows: int, seconds: float) -> None:
    """The ctid puller's backlog, as `CtidPuller.lag()` measures it."""
    PULLER_ROWS_BEHIND.set(rows)
    PULLER_SECONDS_BEHIND.set(seconds)


def set_sinks(lags: Iterable[tuple[str, int, float, bool]]) -> None:
    """Every sink as (name, changes behind, seconds behind, failed); the series of sinks gone are removed."""
    seen = set()
    for sink, changes, seconds, failed in lags:
        seen.add(sink)
        SINK_LAG_CHANGES.labels(sink).set(changes)
        SINK_LAG_SECONDS.labels(sink).set(seconds)
        SINK_FAILED.labels(sink).set(1 if failed else 0)
    for sink in _sinks - seen:
        for family in (SINK_LAG_CHANGES, SINK_LAG_SECONDS, SINK_FAILED, SINK_PUBLISHED):
            with contextlib.suppress(KeyError):
                family.remove(sink)
    _sinks.clear()
    _sinks.update(seen)


_sinks: set[str] = set()  # the sinks exported by the last refresh
