"""Kafka for the benchmarks: a source that produces events, and the bare consumer every pipeline is compared with.

- `EventSource`: produces events to one topic until stopped, a count or a duration, optionally at a
  fixed rate; delivery errors are counted and reported (`SourceReport`), never raised;
- `bare_consumer_rate`: reading a topic and doing nothing else, the ceiling of any Kafka pipeline.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, Producer, TopicPartition

from loadgen.common.errors import BenchmarkError
from loadgen.common.throwaway import unique_name
from pipelines.settings import KafkaSettings

# Producer tuned for throughput while keeping the pipelines' delivery guarantees (acks from all
# replicas, idempotent retries): small linger and large batches let lz4 compress many events at once.
PRODUCER_CONFIG: dict[str, Any] = {
    "linger.ms": 5,
    "batch.size": 1_048_576,
    "compression.type": "lz4",
    "acks": "all",
    "enable.idempotence": True,
    # Success reports cost a Python callback per message; only failures need one.
    "delivery.report.only.error": True,
}


# A paced source sleeps at least this long at a time and then catches up in a burst.
PACING_TICK_S = 0.01


@dataclass(frozen=True)
class SourceReport:
    """What one run of a source did."""

    produced: int
    errors: int  # delivery failures, including messages still queued when the final flush gave up
    first_error: str | None
    seconds: float

    @property
    def delivered(self) -> int:
        """Messages acknowledged by the broker."""
        return self.produced - self.errors

    @property
    def rate(self) -> float:
        """Acknowledged messages per second, flush included."""
        return self.delivered / self.seconds if self.seconds > 0 else 0.0


class Sender:
    """A producer of one topic: delivery failures counted (never raised per message), a full queue waited out.

    The one producer of the benchmarks' backlogs, steady loads and markers. It connects and checks the
    topic at once: the broker never auto-creates one, so every message would otherwise fail one by one.
    """

    def __init__(self, topic: str, kafka: KafkaSettings, *, client: str = "loadgen", **config: Any) -> None:
        self.topic, self.errors, self.first_error = topic, 0, None
        self.producer = Producer(
            {
                "bootstrap.servers": kafka.bootstrap_servers,
                "client.id": f"{kafka.client_id}-{client}",
                "on_delivery": self._on_delivery,
                **PRODUCER_CONFIG,
                **config,
            }
        )
        metadata = self.producer.list_topics(topic, timeout=10).topics[topic]
        if metadata.error is not None:
            raise BenchmarkError(f"producer: topic {topic!r}: {metadata.error.str()}")

    def _on_delivery(self, error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            self.errors += 1
            self.first_error = self.first_error or str(error)

    def send(self, key: bytes | None, value: bytes, partition: int = -1) -> None:
        """Queue one message (-1: the default partitioner), letting librdkafka send while its queue is full."""
        while True:
            try:
                self.producer.produce(self.topic, value, key, partition=partition)
                return
            except BufferError:
                self.producer.poll(0.05)

    def flush(self, timeout: float = 60.0) -> int:
        """Send everything queued; what was not sent counts as failed. The failures so far."""
        unsent = self.producer.flush(timeout)
        if unsent:
            self.errors += unsent
            self.first_error = self.first_error or f"{unsent} messages still queued after {timeout:g}s flush"
        return self.errors

    def check(self) -> None:
        """Raise when any message failed: a backlog with holes measures nothing."""
        if self.errors:
            raise BenchmarkError(f"producer: {self.errors} delivery errors on {self.topic}, first: {self.first_error}")


class EventSource:
    """Produces events to one topic until stopped, a count or a duration; optionally at a fixed rate.

    Modelled on Quix Streams' `Source`: `run()` loops while `running`, `stop()` (e.g. from a signal
    handler) ends the loop at the next event, and the producer is flushed on the way out. Delivery
    failures are counted, never raised, so a long run reports how many were lost.
    """

    def __init__(
        self,
        topic: str,
        events: Iterable[Any],
        encode: Callable[[Any], tuple[bytes, bytes]],
        *,
        kafka: KafkaSettings | None = None,
        rate: float = 0.0,
        count: int = 0,
        duration: float = 0.0,
    ):
        self.topic, self._events, self._encode = topic, iter(events), encode
        self._kafka = kafka or KafkaSettings()
        self._rate, self._count, self._duration = rate, count, duration
        self.running = False

    def stop(self) -> None:
        """Ask the loop to end after the current event; safe from a signal handler."""
        self.running = False

    def run(self) -> SourceReport:
        """Produce until a bound is reached or `stop()`; then flush and report (elapsed time includes the flush)."""
        sender = Sender(self.topic, self._kafka)  # connected before the clock starts: a rate is a steady state
        interval = 1.0 / self._rate if self._rate > 0 else 0.0
        started = time.monotonic()
        deadline = started + self._duration if self._duration > 0 else math.inf
        produced = 0
        self.running = True
        try:
            while self.running and (self._count == 0 or produced < self._count):
                if interval:
                    # Pace against the start, not the previous event, so pauses do not accumulate; sleep
                    # in ticks of PACING_TICK_S, not per event (thousands of wake-ups a second would cost
                    # this process, and Kafka's small batches, more than the events themselves).
                    delay = started + produced * interval - time.monotonic()
                    if delay > 0:
                        sender.producer.poll(0)
                        time.sleep(max(delay, PACING_TICK_S))
                if (interval or (produced & 1023) == 0) and time.monotonic() >= deadline:
                    break
                # Drawn only now, so `ts` is the production time (what freshness is measured from).
                event = next(self._events, None)
                if event is None:
                    break
                sender.send(*self._encode(event))
                produced += 1
                if produced & 1023 == 0:
                    sender.producer.poll(0)
        finally:
            self.running = False
            sender.flush()
        return SourceReport(produced, sender.errors, sender.first_error, time.monotonic() - started)


def produce_all(
    topic: str, events: Sequence[Any], encode: Callable[[Any], tuple[bytes, bytes]], kafka: KafkaSettings
) -> float:
    """Produce every event as fast as the broker takes them: the backlog a drain then works off; its msgs/s.

    Raises:
        BenchmarkError: a delivery failed.
    """
    report = EventSource(topic, events, encode, kafka=kafka, count=len(events)).run()
    if report.errors:
        raise BenchmarkError(f"producer: {report.errors} delivery errors, first: {report.first_error}")
    return report.rate


def bare_consumer_rate(
    topic: str,
    count: int,
    *,
    kafka: KafkaSettings | None = None,
    timeout: float = 120.0,
    decode: bool | Callable[[bytes], object] = False,
) -> float:
    """Messages/s of a consumer reading `count` messages of `topic` from the beginning, doing nothing else.

    Partitions are assigned, not subscribed, so no group rebalance is timed, and the connection and
    metadata are set up before the clock starts at `assign()`. Every message is counted from there:
    starting at the first batch instead would miss what librdkafka prefetches meanwhile (most of a
    small topic). Each message's `.value()` is read; with `decode`, each value also goes through
    `orjson.loads` (what any pipeline does first), or through `decode` itself when it is a function
    (e.g. a msgspec decoder).

    Raises:
        BenchmarkError: fewer than `count` messages arrived within `timeout`, or a message carried an error.
    """
    kafka = kafka or KafkaSettings()
    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "client.id": f"{kafka.client_id}-bench",
            "group.id": unique_name("bench-consumer", "-"),
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            # As the pipelines: without it librdkafka idles up to 1 s each time its queue fills,
            # which measured a 400,000-message read at a third of the rate of a 200,000 one.
            "fetch.queue.backoff.ms": 10,
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        deadline = time.monotonic() + timeout
        received = 0
        parse = orjson.loads if decode is True else decode or None
        started = time.perf_counter()
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        while received < count and time.monotonic() < deadline:
            batch = consumer.consume(num_messages=10000, timeout=1.0)
            for message in batch:
                if message.error() is not None:
                    raise BenchmarkError(f"bare consumer: {topic}: {message.error()}")
                value = message.value()
                if parse is not None:
                    parse(value)
            received += len(batch)
        elapsed = time.perf_counter() - started
    finally:
        consumer.close()
    if received < count:
        raise BenchmarkError(f"bare consumer: {topic}: {received} of {count} messages in {timeout}s")
    return received / elapsed
