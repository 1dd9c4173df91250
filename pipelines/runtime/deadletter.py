"""Send records that break their contract to a dead-letter topic, with the reason in headers.

A rejected record is kept, not dropped: it goes byte for byte (key, value, headers) to `<topic>.dlq`,
with `dlq.*` headers saying why and where it came from, so it can be inspected and replayed once the
producer is fixed; only a value over DEAD_LETTER_VALUE_MAX is left out (`dlq.value_bytes`). The
pipeline calls `DeadLetters.flush()` before it commits a batch, so a record's offset is never
committed before its dead letter is stored (at-least-once into the dead-letter topic).
"""

from __future__ import annotations

from collections import Counter

import confluent_kafka

from pipelines.errors import StreamviewsError
from pipelines.logs import get_logger
from pipelines.runtime.clients import ProducerClient
from pipelines.runtime.events import InvalidEvent

log = get_logger("deadletter")

# A full local queue is back-pressure from the brokers: wait for deliveries this long, this many times.
_QUEUE_FULL_WAIT_S = 1.0
_QUEUE_FULL_ATTEMPTS = 30


class DeadLetterError(StreamviewsError):
    """Dead letters could not be delivered; the batch that rejected them must not commit."""

    transient = True  # Kafka's, not the batch's: the batch is retried after a back-off


# Errors that say a record itself cannot be written to its topic, whatever the retries (larger than
# the topic or the producer takes): such a record is dead-lettered, the records around it go on.
RECORD_ERRORS = frozenset(
    {
        confluent_kafka.KafkaError.MSG_SIZE_TOO_LARGE,
        confluent_kafka.KafkaError.RECORD_LIST_TOO_LARGE,
        confluent_kafka.KafkaError.INVALID_RECORD,
    }
)
# The largest value a dead letter carries. A larger one is left out (`dlq.value_bytes` says its size;
# the source topic, partition and offset headers point at it while the topic's retention keeps it):
# dead-letter topics have the broker's default limit, 1 MiB, and so has the producer, which would
# refuse it at once, and the pipeline could never write the dead letter nor commit past its record.
DEAD_LETTER_VALUE_MAX = 512 * 1024


def kept_value(value: bytes | None) -> tuple[bytes | None, list[tuple[str, bytes]]]:
    """The value a dead letter carries, and the header that says when the record's was left out."""
    if value is None or len(value) <= DEAD_LETTER_VALUE_MAX:
        return value, []
    return None, [("dlq.value_bytes", str(len(value)).encode())]


def dead_letter_topic(topic: str) -> str:
    """The dead-letter topic of a source topic: `likes` -> `likes.dlq`."""
    return f"{topic}.dlq"


def dead_letter_headers(
    *,
    pipeline: str,
    topic: str,
    partition: int,
    offset: int,
    timestamp_ms: int,
    error: InvalidEvent,
    original: list[tuple[str, bytes]] | None,
) -> list[tuple[str, bytes]]:
    """Headers of a dead letter: the record's own first (kept as they were), then `dlq.*`.

    `dlq.reason`, `dlq.detail`, `dlq.pipeline`, `dlq.topic`, `dlq.partition`, `dlq.offset` and
    `dlq.timestamp` (the source record's, in epoch milliseconds) are UTF-8 text, numbers in decimal.
    """
    fields = (
        ("dlq.reason", error.reason),
        ("dlq.detail", error.detail),
        ("dlq.pipeline", pipeline),
        ("dlq.topic", topic),
        ("dlq.partition", str(partition)),
        ("dlq.offset", str(offset)),
        ("dlq.timestamp", str(timestamp_ms)),
    )
    return [*(original or ()), *((name, text.encode()) for name, text in fields)]


class DeadLetters:
    """Produces rejected records, keeps per-reason counts; flush() must succeed before the batch commits.

    Attributes:
        counts: Dead letters sent by reason since start, for metrics and the shutdown log.
    """

    def __init__(self, producer: ProducerClient, pipeline: str) -> None:
        self._producer = producer
        self._pipeline = pipeline
        self._failures: list[str] = []
        self.counts: Counter[str] = Counter()

    def send(self, message: confluent_kafka.Message, error: InvalidEvent) -> None:
        """Produce one rejected record to its topic's dead-letter topic (asynchronously).

        The key, value and headers are unchanged, so the dead letter can be replayed as it was; the
        key also keeps one object's dead letters on one partition, in order. The dead letter gets its
        own timestamp (now), so that retention counts from when it was rejected.

        Raises:
            DeadLetterError: The producer refused the record.
        """
        topic = message.topic()
        partition = message.partition()
        offset = message.offset()
        _, timestamp_ms = message.timestamp()
        headers = dead_letter_headers(
            pipeline=self._pipeline,
            topic=topic,
            partition=partition,
            offset=offset,
            timestamp_ms=timestamp_ms,
            error=error,
            original=message.headers(),
        )
        log.warning(
            "dead letter",
            reason=error.reason,
            detail=error.detail,
            topic=topic,
            partition=partition,
            offset=offset,
        )
        value, omitted = kept_value(message.value())
        self._produce(dead_letter_topic(topic), message.key(), value, headers + omitted)
        self.counts[error.reason] += 1
        self._producer.poll(0)  # Serve delivery callbacks of earlier dead letters.

    def flush(self, timeout: float = 30) -> None:
        """Wait until every dead letter sent so far is delivered; call it before committing the batch.

        A failure is reported once: after `DeadLetterError` the batch must not commit, and its records
        must be read again (which sends their dead letters again).

        Raises:
            DeadLetterError: A delivery failed, or some dead letters were still undelivered at `timeout`.
        """
        remaining = self._producer.flush(timeout)
        failures, self._failures = self._failures, []
        if failures:
            raise DeadLetterError(f"{len(failures)} dead letters failed, first: {failures[0]}")
        if remaining:
            raise DeadLetterError(f"{remaining} messages still undelivered after {timeout} s")

    def _produce(self, topic: str, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]) -> None:
        for _ in range(_QUEUE_FULL_ATTEMPTS):
            try:
                self._producer.produce(topic, value=value, key=key, headers=headers, on_delivery=self._on_delivery)
                return
            except BufferError:
                self._producer.poll(_QUEUE_FULL_WAIT_S)
            except confluent_kafka.KafkaException as e:
                raise DeadLetterError(f"cannot produce a dead letter to {topic}: {e}") from e
        raise DeadLetterError(f"cannot produce a dead letter to {topic}: the producer queue stayed full")

    def _on_delivery(self, err: confluent_kafka.KafkaError | None, msg: confluent_kafka.Message) -> None:
        if err is not None:
            self._failures.append(f"{msg.topic()}: {err.str()}")
            log.error("dead letter not delivered", topic=msg.topic(), error=err.str(), code=err.name())
