"""The inbox relay: rows written to streams with SQL, published to the streams' topics exactly once.

Run: `python -m pipelines.cv.inbox` (supervised by `make up` as `inbox`), as sv_writer.

`INSERT INTO <stream>` / `COPY <stream> FROM STDIN` append rows to cv.stream_inbox in the writing
transaction (migration 0030, pipelines.cv.catalog.stream_inserts). Each step of the relay:

1. read a page of the inbox's rows of its streams, in (xid, id) order, with the snapshot they were
   read in (`pg_current_snapshot()`, the statement's own);
2. in ONE Kafka transaction, produce each to its stream's topic (encoded as the stream reads its
   events: a JSON object, or a CSV record in column order; the stream's `kafka_key`, or its key
   columns, as the record key; the INSERT's time as the record's timestamp) and, to the progress
   topic PROGRESS_TOPIC, which rows those were: the snapshot, the streams and the page's last row;
3. commit the Kafka transaction, then delete those rows from the inbox (`Page.DELETE`).

Exactly once: a crash between 3's two halves leaves rows that Kafka already holds. At start (and
after being fenced) the relay first calls init_transactions, which aborts whatever transaction an
earlier incarnation left open and fences it off, then reads the last committed record of the
progress topic and deletes the rows it names: those of its streams visible in its snapshot, up to
its last row (`pg_visible_in_snapshot`); exactly the rows that page held, since rows visible in a
snapshot never change and the page was the first of them in (xid, id) order. The stream runner
reads topics read_committed (the client's default), so it sees each row once, or not at all until
its transaction commits. A row goes as soon as its transaction commits: nothing waits for others.

A row Kafka refuses for what it is (larger than the producer or the topic takes) goes to
`<topic>.dlq` in its page's transaction, with `dlq.*` headers, and the rows beside it go on: one
librdkafka refuses at `produce()` is known at once; one the broker refuses fails the whole
transaction (the broker refuses its batch), so that page is published again one row per
transaction, and the row that fails alone is dead-lettered when read next.

A relay serves the streams of one consumer group (`--group G`: those declared with consumer_group
G; by default those declared without), with a transactional id and a progress key of that group's.
DROP STREAM deletes the stream's rows not yet published (pipelines.cv.catalog.stream_inserts).
"""

from __future__ import annotations

import csv
import io
import json
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from pipelines import metrics
from pipelines.cv import catalog
from pipelines.cv.catalog import stream_inserts
from pipelines.cv.model import StreamDef
from pipelines.logs import configure_logging, get_logger
from pipelines.runtime.deadletter import RECORD_ERRORS, dead_letter_topic, kept_value
from pipelines.runtime.interpreter import tune_for_batches
from pipelines.runtime.topics import ensure_topics
from pipelines.settings import InboxSettings, KafkaSettings, MetricsSettings, PipelineSettings, PostgresSettings

log = get_logger("inbox")

PROGRESS_TOPIC = "streamviews.inbox.progress"
CHANNEL = "streamviews_inbox"
# The longest pause after the database or Kafka was lost, between attempts.
MAX_BACKOFF_S = 10.0


@dataclass(frozen=True)
class Page:
    """Which rows of the inbox a Kafka transaction published: what the progress topic records."""

    snapshot: str  # the pg_snapshot they were read in, as text (xmin:xmax:xip,...)
    streams: tuple[str, ...]  # the streams the page was read for
    xid: int  # its last row, in (xid, id) order
    id: int

    # The page's rows: those of its streams visible in its snapshot, up to its last row. Rows visible
    # in a snapshot never change, and the page was the first of them in (xid, id) order.
    DELETE = (
        "DELETE FROM cv.stream_inbox WHERE stream = ANY(%s) AND pg_visible_in_snapshot(xid, %s::pg_snapshot)"
        " AND (xid, id) <= (%s::text::xid8, %s)"
    )

    def delete(self, conn: psycopg.Connection) -> int:
        """Its rows out of the inbox (none left after the first time); how many."""
        return conn.execute(self.DELETE, (list(self.streams), self.snapshot, str(self.xid), self.id)).rowcount

    def encode(self) -> bytes:
        """As the progress topic holds it (the xid as text: JSON readers may lose 64-bit integers)."""
        fields = {"snapshot": self.snapshot, "streams": list(self.streams), "xid": str(self.xid), "id": self.id}
        return json.dumps(fields).encode()

    @classmethod
    def decode(cls, value: bytes) -> Page:
        """Read back from the progress topic."""
        fields = json.loads(value)
        return cls(fields["snapshot"], tuple(fields["streams"]), int(fields["xid"]), int(fields["id"]))


def encode(stream: StreamDef, payload: str) -> tuple[bytes, bytes | None]:
    """A row (its JSON text, as PostgreSQL wrote it) as the stream reads its events: (value, key).

    The value: the JSON object itself, or a CSV record of the stream's columns in order. The key: the
    `kafka_key` column's value as text (what the stream requires of record keys), else the key
    columns (one key's rows to one partition, in order), else none.
    """
    needs_fields = stream.format == "csv" or stream.kafka_key is not None or stream.key is not None
    row = json.loads(payload) if needs_fields else {}
    if stream.format == "csv":
        out = io.StringIO()
        csv.writer(out, lineterminator="").writerow(_csv_field(row.get(c.name)) for c in stream.columns)
        value = out.getvalue().encode()
    else:
        value = payload.encode()
    if stream.kafka_key is not None:
        field = row.get(stream.kafka_key)
        return value, None if field is None else (field if isinstance(field, str) else json.dumps(field)).encode()
    if stream.key is not None:
        return value, json.dumps([row.get(c) for c in stream.key], separators=(",", ":")).encode()
    return value, None


def _csv_field(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


class InboxRelay:
    """Publishes the inbox to the streams' topics, a Kafka transaction per page; `run()` until stopped."""

    def __init__(
        self,
        postgres: PostgresSettings,
        kafka: KafkaSettings,
        settings: InboxSettings,
        partitions: int,
        group_id: str | None = None,
        heartbeat_file: str = "",
    ) -> None:
        self.conninfo, self.kafka, self.settings = postgres.conninfo(), kafka, settings
        self.partitions = partitions  # of a stream's topic the relay has to create (the runner's default)
        # Like the stream runner, a relay serves the streams of one consumer group: by default those
        # declared without `consumer_group`; with a group, those declared with it (a test's own).
        self.group_id = group_id
        self.transactional_id = settings.transactional_id + (f"-{group_id}" if group_id else "")
        self.progress_key = self.transactional_id.encode()
        self.heartbeat_file = heartbeat_file  # touched every loop: the container's health check
        self.running = True
        self._producer: Producer | None = None
        self._streams: dict[str, StreamDef] = {}
        self._catalog_version: int | None = None
        self._topics: set[str] = set()
        # After a page Kafka refused for one of its records: its rows one per transaction, up to its
        # last row; and the rows refused alone, by (xid, id), with why (dead-lettered when next read).
        self._one_by_one_until: tuple[int, int] | None = None
        self._refused: dict[tuple[int, int], str] = {}

    def stop(self) -> None:
        """Finish the page in hand, then return from run()."""
        self.running = False

    def run(self) -> None:
        """Relay until stopped; a lost database or broker is retried with backoff, nothing skipped."""
        backoff = 0.5
        while self.running:
            try:
                with psycopg.connect(self.conninfo, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self.recover(conn)
                    backoff = 0.5
                    while self.running:
                        if self.heartbeat_file:
                            Path(self.heartbeat_file).touch()
                        if not self.step(conn):
                            self._wait(conn)
            except (psycopg.OperationalError, KafkaException) as e:
                log.warning("relay interrupted; starting again", error=str(e).strip(), retry_in_s=backoff)
                self._producer = None  # init_transactions again: fences and recovers
                time.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)

    def recover(self, conn: psycopg.Connection) -> Page | None:
        """Fence earlier incarnations, then forget the rows Kafka already holds; the last page published."""
        producer = self._transactional_producer()
        self._current_streams(conn)
        page = last_published(self.kafka, self.progress_key)
        if page is not None:
            deleted = page.delete(conn)
            if deleted:
                log.info("rows already published, deleted", rows=deleted, snapshot=page.snapshot, xid=page.xid)
        self._producer = producer
        return page

    def step(self, conn: psycopg.Connection) -> int:
        """One page: produced in one Kafka transaction with what it was, then deleted here. Rows published."""
        if self._producer is None:  # recover before reading: the last page may be in Kafka already
            self.recover(conn)
        streams = self._current_streams(conn)
        rows = conn.execute(
            "SELECT pg_current_snapshot()::text, xid::text::bigint, id, stream, payload::text, inserted_at"
            " FROM cv.stream_inbox WHERE stream = ANY(%s) ORDER BY xid, id LIMIT %s",
            (sorted(streams), 1 if self._one_by_one_until else self.settings.page),
        ).fetchall()
        if not rows:
            self._one_by_one_until = None
            return 0
        page = Page(rows[0][0], tuple(sorted(streams)), rows[-1][1], rows[-1][2])
        producer = self._producer
        assert producer is not None
        published: dict[str, int] = {}
        dead: dict[str, int] = {}  # dead letters per stream topic
        producer.begin_transaction()
        try:
            for _, xid, row_id, name, payload, inserted_at in rows:
                stream = streams[name]
                self._ensure_topic(stream)
                value, key = encode(stream, payload)
                reason = self._refused.pop((xid, row_id), None)
                if reason is None:
                    reason = self._produce(producer, stream, value, key, int(inserted_at.timestamp() * 1000))
                if reason is None:
                    published[name] = published.get(name, 0) + 1
                else:
                    self._dead_letter(producer, stream, value, key, reason)
                    dead[stream.topic] = dead.get(stream.topic, 0) + 1
            producer.produce(PROGRESS_TOPIC, key=self.progress_key, value=page.encode())
            producer.commit_transaction(self.settings.commit_timeout_s)
        except KafkaException as e:
            self._abort(producer, e)
            if not _refused_record(e):
                raise
            self._refused_in(page, rows, e)
            return 0
        self._delete(conn, page)
        if self._one_by_one_until and (page.xid, page.id) >= self._one_by_one_until:
            self._one_by_one_until = None
        for name, n in published.items():
            metrics.INBOX_PUBLISHED.labels(name).inc(n)
        for topic, n in dead.items():
            metrics.DEAD_LETTERS.labels("inbox", topic, "refused").inc(n)
        return len(rows)

    def _produce(self, producer: Producer, stream: StreamDef, value: bytes, key: bytes | None, ts: int) -> str | None:
        """A row to its stream's topic; None, or why librdkafka refused it at once (larger than it sends)."""
        try:
            producer.produce(stream.topic, value=value, key=key, timestamp=ts)
        except KafkaException as e:
            if not _refused_record(e):
                raise
            return e.args[0].str()
        producer.poll(0)
        return None

    def _refused_in(self, page: Page, rows: list[tuple[Any, ...]], error: KafkaException) -> None:
        """The broker refused a record of the page, and with it the rest of its batch: which one is it?

        A page of one row: that row, dead-lettered when read next. A page of several: its rows are
        published again one per transaction, up to its last, to find it.
        """
        if len(rows) == 1:
            self._refused[(page.xid, page.id)] = error.args[0].str()
            log.warning("a row refused by Kafka; dead-lettering it", xid=page.xid, id=page.id)
        else:
            self._one_by_one_until = (page.xid, page.id)
            log.warning("a row of a page refused by Kafka; publishing the page a row at a time", rows=len(rows))

    def _dead_letter(self, producer: Producer, stream: StreamDef, value: bytes, key: bytes | None, reason: str) -> None:
        """A row the stream's topic refuses, to `<topic>.dlq` in the page's transaction: its key and why.

        Its value too while it is under 512 KiB (pipelines.runtime.deadletter.kept_value); the row is
        gone from the inbox once the transaction commits, as a published one is.
        """
        topic = dead_letter_topic(stream.topic)
        self._ensure_topic(stream, topic)
        headers = [("dlq.reason", b"refused"), ("dlq.detail", reason.encode()), ("dlq.topic", stream.topic.encode())]
        kept, omitted = kept_value(value)
        producer.produce(topic, value=kept, key=key, headers=[*headers, ("dlq.pipeline", b"inbox"), *omitted])
        log.warning("row dead-lettered", stream=stream.name, topic=topic, reason=reason, bytes=len(value))

    def _delete(self, conn: psycopg.Connection, page: Page) -> int:
        """The page's rows out of the inbox, once Kafka holds them (a seam the tests cut)."""
        return page.delete(conn)

    def _abort(self, producer: Producer, error: KafkaException) -> None:
        """A failed transaction: aborted when it can be; a fenced or fatal producer is replaced (and recovers)."""
        kafka_error = error.args[0] if error.args else None
        if isinstance(kafka_error, KafkaError) and kafka_error.txn_requires_abort():
            producer.abort_transaction(self.settings.commit_timeout_s)
        self._producer = None

    def _wait(self, conn: psycopg.Connection) -> None:
        """Until a transaction that wrote rows commits (its notification), or INBOX_WAKE_S at most."""
        metrics.INBOX_BEHIND.set(conn.execute("SELECT count(*) FROM cv.stream_inbox").fetchone()[0])
        for _ in conn.notifies(timeout=self.settings.wake_s, stop_after=1):
            pass

    def _current_streams(self, conn: psycopg.Connection) -> dict[str, StreamDef]:
        version = catalog.catalog_version(conn)
        if version != self._catalog_version:
            self._streams = {
                name: stream
                for name, stream in catalog.load_streams(conn, skip_broken=True).items()
                if stream.consumer_group == self.group_id and stream_inserts.writable(stream)
            }
            self._catalog_version = version
        return self._streams

    def _ensure_topic(self, stream: StreamDef, topic: str | None = None) -> None:
        """The stream's topic (or `topic`, its dead-letter one) made sure of once, with the stream's partitions."""
        topic = topic or stream.topic
        if topic not in self._topics:
            ensure_topics(self.kafka.bootstrap_servers, {topic: stream.partitions or self.partitions})
            self._topics.add(topic)

    def _transactional_producer(self) -> Producer:
        ensure_topics(
            self.kafka.bootstrap_servers, {PROGRESS_TOPIC: 1}, {PROGRESS_TOPIC: {"cleanup.policy": "compact"}}
        )
        producer = Producer(
            {
                "bootstrap.servers": self.kafka.bootstrap_servers,
                "client.id": f"{self.kafka.client_id}-inbox",
                "transactional.id": self.transactional_id,
                "linger.ms": 5,
            }
        )
        producer.init_transactions(self.settings.commit_timeout_s)  # fences any earlier incarnation
        return producer


def _refused_record(error: KafkaException) -> bool:
    """True when Kafka refused a record for what it is (too large): the records around it can go on."""
    kafka_error = error.args[0] if error.args else None
    return isinstance(kafka_error, KafkaError) and kafka_error.code() in RECORD_ERRORS


def last_published(kafka: KafkaSettings, key: bytes, timeout: float = 30.0) -> Page | None:
    """The page the relay's last committed Kafka transaction published (None: it never published).

    Read committed, so a transaction aborted or fenced left nothing here; the topic is compacted, so
    its tail holds the latest page, read up to the end (the last stable offset).

    Raises:
        KafkaException: The end was not reached in time: going on without it could publish twice.
    """
    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "group.id": "streamviews-inbox-recovery",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(PROGRESS_TOPIC, 0), timeout=timeout)
        if high <= low:
            return None
        consumer.assign([TopicPartition(PROGRESS_TOPIC, 0, max(low, high - 1000))])
        page = None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                if message.error().code() == KafkaError._PARTITION_EOF:
                    return page
                raise KafkaException(message.error())
            if message.key() == key and message.value():
                page = Page.decode(message.value())
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"{PROGRESS_TOPIC}: its end not reached in {timeout} s"))
    finally:
        consumer.close()


def main(argv: list[str] | None = None) -> int:
    """Entry point: `python -m pipelines.cv.inbox`."""
    args = argv or []
    if args and (len(args) != 2 or args[0] != "--group"):
        print(
            "usage: python -m pipelines.cv.inbox [--group GROUP] (settings come from the environment)", file=sys.stderr
        )
        return 2
    group_id = args[1] if args else None
    configure_logging()
    postgres, kafka, settings, metrics_settings = (
        PostgresSettings(),
        KafkaSettings(),
        InboxSettings(),
        MetricsSettings(),
    )
    log.info("settings", postgres=postgres.describe(), inbox=settings.describe(), metrics=metrics_settings.describe())
    metrics.serve(metrics_settings, "inbox", metrics.INBOX_FAMILIES)
    pipeline = PipelineSettings()
    relay = InboxRelay(postgres, kafka, settings, pipeline.topic_partitions, group_id, pipeline.heartbeat_file)
    signal.signal(signal.SIGTERM, lambda *_: relay.stop())
    signal.signal(signal.SIGINT, lambda *_: relay.stop())
    tune_for_batches()
    relay.run()
    log.info("inbox relay stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
