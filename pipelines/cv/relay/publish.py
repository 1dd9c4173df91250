"""Producing a sink's records and waiting for every delivery report: the relay's Kafka side.

The producer is idempotent (`enable.idempotence`, `acks=all`): a record retried inside the producer
is written once and in order. Records are keyed by the group key's JSON, so one group's records go
to one partition in position order (partitioner murmur2_random, the Java clients' own: a Kafka
Streams or ksqlDB consumer partitions the same keys the same way). Each carries the headers
`streamviews.position`, `streamviews.view` and `streamviews.sink`.

A record Kafka refuses for what it is (too large for the topic) goes to `<topic>.dlq` with the
reason in `dlq.*` headers (as a stream's dead letters do, pipelines.runtime.deadletter) and the
sink moves on; a delivery that fails for Kafka's sake (brokers away, a timeout) fails the page,
which is produced again later from the same position.

The broker refuses a whole request's batch when one record of it is too large for the topic, and
reports every record of the batch as too large: the good ones beside the bad one too. So a record
refused in the broker's delivery report is produced again alone, and dead-lettered only if it is
refused alone as well (librdkafka's own size check, which refuses a record at `produce()`, needs no
second try). Produced again too, after them, are the page's later records of the same keys, so
that a key's records still arrive in position order; their first copies, if delivered, stay ahead
of them with the same positions (what at-least-once allows after a crash, docs/results.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from pipelines.cv.relay.records import Record
from pipelines.errors import StreamviewsError
from pipelines.logs import get_logger
from pipelines.runtime.deadletter import RECORD_ERRORS, dead_letter_topic, kept_value

log = get_logger("sinks")

# A full local queue waits for deliveries this long between attempts, this many times.
_QUEUE_FULL_WAIT_S = 1.0
_QUEUE_FULL_ATTEMPTS = 60
# Records produced between two polls of the producer's events while a page is produced.
_POLL_EVERY = 1_000


class DeliveryError(StreamviewsError):
    """Records of a page were not acknowledged; the page is produced again from its start later."""

    transient = True


def producer_config(bootstrap_servers: str, client_id: str) -> dict[str, object]:
    """The relay's producer: idempotent, every replica's acknowledgement, Java's key partitioning."""
    return {
        "bootstrap.servers": bootstrap_servers,
        "client.id": client_id,
        "enable.idempotence": True,
        "acks": "all",
        "partitioner": "murmur2_random",
        "linger.ms": 5,
        "compression.type": "lz4",
        "delivery.timeout.ms": 60_000,
        # Reports for failed deliveries only: a page waits for all of them with flush() anyway, and a
        # Python callback (and a poll) per acknowledged record made a 10,000-record page take 80-275 ms
        # to publish instead of about 50.
        "delivery.report.only.error": True,
        "logger": logging.getLogger("librdkafka"),  # its own lines as structured logs, like the pipelines'
    }


@dataclass
class _Page:
    """Delivery reports of one page: records refused for what they are, and Kafka's own failures.

    One callback for the whole page: a fresh closure per record (to know which record a report is
    about) cost about 1 µs of the 5 that producing a record took, although the producer reports only
    failures. A report names its record by key and value instead (`record_of`), which are unique in
    a page: an upsert page has one record per key, and a changes record's value holds its position.
    """

    records: list[Record] = field(default_factory=list)
    refused: list[tuple[Record, str]] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    _by_content: dict[tuple[bytes | None, bytes | None], list[Record]] | None = field(
        default=None, init=False, repr=False
    )

    def report(self, err: KafkaError | None, msg: Message) -> None:
        """A record's delivery report: refused for what it is (dead-lettered), or Kafka's failure.

        A refused report that names no record of the page fails the page (produced again later)
        rather than raise inside librdkafka's callback.
        """
        if err is None:
            return
        record = self.record_of(msg) if err.code() in RECORD_ERRORS else None
        if record is not None:
            self.refused.append((record, err.str()))
        else:
            self.failed.append(err.str())

    def record_of(self, msg: Message) -> Record | None:
        """The page's record a report is about, by its key and value (the first not yet named, if twins)."""
        if self._by_content is None:
            self._by_content = {}
            for record in self.records:
                self._by_content.setdefault((record.key, record.value), []).append(record)
        twins = self._by_content.get((msg.key(), msg.value()))
        return twins.pop(0) if twins else None

    def dead_letter_report(self, err: KafkaError | None, _msg: Message) -> None:
        """A dead letter's failed delivery: always Kafka's failure (it has no dead-letter topic of its own)."""
        if err is not None:
            self.failed.append(err.str())


class Publisher:
    """Produces pages of records for sinks; `publish` returns once Kafka acknowledged all of them."""

    def __init__(self, producer: Producer, ensure_topic: Callable[[str], None] | None = None) -> None:
        """`ensure_topic` makes a dead-letter topic exist before its first dead letter (made when needed)."""
        self._producer = producer
        self._ensure_topic = ensure_topic or (lambda _topic: None)

    def publish(self, sink: str, view: str, topic: str, records: Iterable[Record], timeout: float = 60) -> int:
        """Produce `records` to `topic` in order and wait for every delivery; how many were dead-lettered.

        Raises:
            DeliveryError: Some record was neither acknowledged nor dead-lettered (Kafka's failure).
        """
        records = list(records)
        page = _Page(records)
        refused_alone = self._produce_page(sink, view, topic, records, page)
        self._wait(sink, page, timeout)
        if page.refused:  # refused in a batch: its good records with the bad ones
            known = {record.position for record, _ in refused_alone}
            again = [r for r in records if r.position not in known]
            refused_alone += self._one_by_one(sink, view, topic, again, page, timeout)
        page.refused = refused_alone
        if refused_alone:
            self._dead_letter(sink, view, topic, page, timeout)
        return len(refused_alone)

    def _produce_page(
        self, sink: str, view: str, topic: str, records: list[Record], page: _Page
    ) -> list[tuple[Record, str]]:
        """Produce `records`, their reports into `page`; those librdkafka refuses at once, with why."""
        refused: list[tuple[Record, str]] = []
        named = _named(sink, view)
        for index, record in enumerate(records):
            headers = _headers(record.position, named)
            try:
                self._produce(topic, record.key, record.value, headers, page.report)
            except KafkaException as e:
                error = e.args[0]
                if error.code() not in RECORD_ERRORS:
                    raise DeliveryError(f"sink {sink}: cannot produce to {topic}: {error.str()}") from e
                refused.append((record, error.str()))
            if index % _POLL_EVERY == 0:
                self._producer.poll(0)  # serve the producer's events (failed reports) now and then
        return refused

    def _one_by_one(
        self, sink: str, view: str, topic: str, records: list[Record], page: _Page, timeout: float
    ) -> list[tuple[Record, str]]:
        """The records the broker refused in a batch, and the later ones of their keys, each produced alone.

        `records` are the page's, less those librdkafka refused at once (too large, known already).
        Returns those refused alone: the records that are too large themselves.
        """
        first: dict[bytes, int] = {}  # each refused key's first refused position
        for record, _ in page.refused:
            first[record.key] = min(first.get(record.key, record.position), record.position)
        page.refused = []
        again = [r for r in records if r.key in first and r.position >= first[r.key]]
        log.warning("sink records refused in a batch; producing them one by one", sink=sink, records=len(again))
        refused: list[tuple[Record, str]] = []
        for record in again:
            alone = _Page([record])
            refused += self._produce_page(sink, view, topic, [record], alone)
            self._wait(sink, alone, timeout)  # its own request: nothing else is queued
            refused += alone.refused
        return refused

    def _produce(
        self,
        topic: str,
        key: bytes,
        value: bytes | None,
        headers: list[tuple[str, bytes]],
        report: Callable[[KafkaError | None, Message], None],
    ) -> None:
        for _ in range(_QUEUE_FULL_ATTEMPTS):
            try:
                self._producer.produce(topic, value=value, key=key, headers=headers, on_delivery=report)
                return
            except BufferError:
                self._producer.poll(_QUEUE_FULL_WAIT_S)
        raise DeliveryError(f"cannot produce to {topic}: the producer queue stayed full")

    def _wait(self, sink: str, page: _Page, timeout: float) -> None:
        remaining = self._producer.flush(timeout)
        if page.failed:
            raise DeliveryError(f"sink {sink}: {len(page.failed)} records not delivered, first: {page.failed[0]}")
        if remaining:
            raise DeliveryError(f"sink {sink}: {remaining} records still undelivered after {timeout} s")

    def _dead_letter(self, sink: str, view: str, topic: str, page: _Page, timeout: float) -> None:
        """The refused records to `<topic>.dlq`: their key and `dlq.*` headers, the value when it fits."""
        refused, page.refused = page.refused, []
        self._ensure_topic(dead_letter_topic(topic))
        for record, reason in refused:
            log.warning("sink record dead-lettered", sink=sink, topic=topic, position=record.position, reason=reason)
            headers = [
                *_headers(record.position, _named(sink, view)),
                ("dlq.reason", b"refused"),
                ("dlq.detail", reason.encode()),
                ("dlq.topic", topic.encode()),
            ]
            # A value too large for its topic would be for the dead-letter topic too: then only its
            # key and position go (the change itself stays in cv.view_changes while retention keeps it).
            value, omitted = kept_value(record.value)
            self._produce(dead_letter_topic(topic), record.key, value, headers + omitted, page.dead_letter_report)
        self._wait(sink, page, timeout)


def _named(sink: str, view: str) -> tuple[tuple[str, bytes], ...]:
    """The headers that every record of a sink's page carries after its position, made once a page."""
    return ("streamviews.view", view.encode()), ("streamviews.sink", sink.encode())


def _headers(position: int, named: tuple[tuple[str, bytes], ...]) -> list[tuple[str, bytes]]:
    """A record's headers: `streamviews.position`, `streamviews.view`, `streamviews.sink`."""
    return [("streamviews.position", str(position).encode()), *named]
