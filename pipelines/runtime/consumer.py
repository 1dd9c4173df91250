"""The pipeline runner: consume topics in batches, decode, and commit each batch through a Checkpoint.

One poll is one batch: `consume()` returns up to `PIPELINE_BATCH_MAX` records within
`PIPELINE_BATCH_WAIT_MS`, so batches grow with load and stay small (fresh) when it is light. Bad
records go to the dead-letter topic and never stop the pipeline. Any failure to commit (database
down, a deadlock, a fence) rolls the batch back and re-seeks every partition to the offsets stored in
PostgreSQL, so the same records are consumed again.

A pipeline reads one topic (the audit writer) or many (the stream runner, which re-subscribes when
streams are defined or dropped). Decoding is the pipeline's `BatchDecoder`: it gets a poll's valid
messages at once, so a stream's decoder can decode them in one call, and returns the payload its sink
applies and the messages it rejected.

Decoding and committing overlap: a committer thread commits batch N (the database works, this
process waits on its socket) while the main thread consumes and decodes batch N+1, whose start is
N's end. N+1 is handed over only once N has committed; if N fails, N+1 is dropped with it and both
are consumed again after the re-seek. At most one batch is in flight, so commits stay in order.

A pipeline builds no client itself: it is given its Kafka clients (`KafkaClients`,
pipelines/runtime/clients.py) and its group's offsets store (`OffsetStore`,
pipelines/runtime/offsets.py). Services give it confluent-kafka's and PostgreSQL's; unit tests the
in-memory doubles of pipelines/runtime/testing/, and drive it `step()` by step.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Generic, Protocol, TypeVar

import psycopg
from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, Message, TopicPartition

from pipelines import metrics
from pipelines.errors import StreamviewsError
from pipelines.logs import get_logger
from pipelines.runtime.checkpoint import Batch, Checkpoint, Fenced, P, Sink, partition_lag
from pipelines.runtime.clients import ConsumerClient, KafkaClients
from pipelines.runtime.deadletter import DeadLetterError, DeadLetters
from pipelines.runtime.events import InvalidEvent
from pipelines.runtime.interpreter import tune_for_batches
from pipelines.runtime.offsets import C, OffsetStore
from pipelines.runtime.starts import Start, begin, needs_resolving
from pipelines.runtime.topic_ids import check_topic_ids
from pipelines.settings import PipelineSettings

log = get_logger("consumer")

# A record decoder turns (key, value, Kafka timestamp in ms) into one record for the sink, None for a
# record that carries nothing to apply (a tombstone), or raises InvalidEvent.
T = TypeVar("T")
RecordDecoder = Callable[[bytes | None, bytes | None, int], T | None]
# The dead-letter reason for a record whose decoder failed unexpectedly (a bug, not bad input).
UNDECODABLE = "undecodable"


@dataclass
class Decoded(Generic[P]):
    """What a batch decoder made of a poll's messages."""

    payload: P | None  # what the sink's apply() takes (None: nothing to apply)
    size: int  # records in the payload
    rejected: list[tuple[Message, InvalidEvent]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)  # records in the payload per topic (for metrics)


class BatchDecoder(Protocol[P]):
    """Decodes a poll's valid messages for the sink, given by topic (each topic's in poll order)."""

    def __call__(self, by_topic: dict[str, list[Message]]) -> Decoded[P]:
        """Decode; a message that breaks its contract is returned in `rejected`, never raised."""
        ...


def per_record(decode: RecordDecoder[T]) -> BatchDecoder[list[tuple[int, T]]]:
    """A batch decoder calling `decode` for each message; the payload is a list of `Record`s."""

    def decode_batch(by_topic: dict[str, list[Message]]) -> Decoded[list[tuple[int, T]]]:
        records: list[tuple[int, T]] = []
        rejected: list[tuple[Message, InvalidEvent]] = []
        counts: dict[str, int] = {}
        for topic, messages in by_topic.items():
            before = len(records)
            for message in messages:
                try:
                    record = decode(message.key(), message.value(), message.timestamp()[1])
                except InvalidEvent as e:
                    rejected.append((message, e))
                    continue
                except Exception as e:  # a decoder bug must not crash-loop on one record
                    log.exception("decoder failed", topic=message.topic(), offset=message.offset())
                    rejected.append((message, InvalidEvent(UNDECODABLE, f"{type(e).__name__}: {e}")))
                    continue
                if record is not None:
                    records.append((message.partition(), record))
            counts[topic] = len(records) - before
        return Decoded(records, len(records), rejected, counts)

    return decode_batch


class Pipeline(Generic[C, P]):
    """Consumes topics into one sink, exactly once.

    Args:
        name: The pipeline's name, in its logs, metrics and Kafka client ids.
        decode: Makes a poll's payload; `sink` applies it (both of payload type P).
        clients: Makes its Kafka clients (`ConfluentClients(KafkaSettings())` in a service; a test's
            `pipelines.runtime.testing.MemoryBroker`).
        offsets: The group's stored offsets, the truth it resumes from and its fence
            (`PostgresOffsets` in a service; `pipelines.runtime.testing.MemoryOffsets` in a test).
    """

    def __init__(
        self,
        name: str,
        *,
        decode: BatchDecoder[P],
        sink: Sink[C, P],
        clients: KafkaClients,
        offsets: OffsetStore[C],
        settings: PipelineSettings,
        metrics_refresh_s: float = 5.0,
    ) -> None:
        self.name, self.group_id = name, offsets.group_id
        self.decode, self.sink = decode, sink
        self.clients, self.settings = clients, settings
        self.consumer: ConsumerClient = clients.consumer(name, self.group_id, settings)
        self.dead_letters = DeadLetters(clients.producer(name), name)
        self.checkpoint = Checkpoint(offsets, sink, self.dead_letters, self.fetch_records)
        self.topics: tuple[str, ...] = ()
        # Where each topic's partitions start when nothing is stored for them (pipelines/runtime/starts.py).
        self.starts: dict[str, Start] = {}
        # Topics the sink held back (it could not apply their records), with when to read them again.
        self.held: dict[str, float] = {}
        self._hold_failures: dict[str, int] = {}
        # Where each assigned (topic, partition) will stand in PostgreSQL once the batches decoded so
        # far have committed (None: never committed); reset from PostgreSQL by a rewind.
        self.positions: dict[tuple[str, int], int | None] = {}
        # Where each assigned partition stands in PostgreSQL as far as this process knows (committed
        # batches only): the consumer lag is measured from here.
        self.stored: dict[tuple[str, int], int | None] = {}
        self.metrics = metrics.PipelineMetrics(name)
        self._metrics_refresh_s = metrics_refresh_s  # METRICS_REFRESH_S: how often the lag gauges are set
        self._committer = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{name}-commit")
        self._inflight: tuple[Batch[P], Future[int]] | None = None
        self.running = True
        self.sleep: Callable[[float], None] = time.sleep  # back-offs (a test records them instead)
        # When the loop's periodic duties are next due (monotonic seconds; 0: at the first step).
        self._next_housekeeping = self._next_beat = self._next_lag = 0.0
        self._next_report = time.monotonic() + settings.report_interval_s
        self.totals = {"batches": 0, "records": 0, "changes": 0, "retries": 0}
        self._failures = 0  # consecutive failed commits

    def subscribe(self, topics: Iterable[str]) -> None:
        """Consume these topics from now on (a rebalance hands the group's partitions out again)."""
        topics = tuple(sorted(set(topics)))
        if topics == self.topics:
            return
        self.settle()
        self.topics = topics
        if topics:
            self.consumer.subscribe(
                list(topics), on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_revoke
            )
        else:
            self.consumer.unsubscribe()
            self.positions.clear()
            self.stored.clear()
        log.info("subscribed", pipeline=self.name, topics=list(topics))

    def run(self, tick: Callable[[], None] | None = None) -> None:
        """Consume until SIGTERM/SIGINT, then finish the current batch and leave the group.

        `tick` runs between polls (at least every `PIPELINE_BATCH_WAIT_MS`): the stream runner
        watches the catalog there and re-subscribes.
        """
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())
        tune_for_batches()  # GIL hand-offs and garbage collection for batches (pipelines.runtime.interpreter)
        log.info("pipeline started", pipeline=self.name, sink=str(self.sink), group_id=self.group_id)
        try:
            while self.running:
                self.step(tick)
        finally:
            self.close()

    def step(self, tick: Callable[[], None] | None = None) -> None:
        """One turn of the loop: one poll, decoded and handed to the committer, then the duties due."""
        if tick is not None:
            tick()
        if self.held:
            self._release_held()
        if self.topics:
            messages = self.consumer.consume(self.settings.batch_max, self.settings.batch_wait_ms / 1000)
        else:
            messages = []
            time.sleep(self.settings.batch_wait_ms / 1000)
        if messages:
            self._process(messages)
        elif self._inflight is not None:
            self.settle()
        now = time.monotonic()
        if now >= self._next_housekeeping:
            self.settle()
            self._housekeeping()
            self._next_housekeeping = now + self.settings.expire_interval_s
        if self.settings.heartbeat_file and now >= self._next_beat:
            Path(self.settings.heartbeat_file).touch()
            self._next_beat = now + 1
        if now >= self._next_lag:
            self.refresh_lag()
            self._next_lag = now + self._metrics_refresh_s
        if now >= self._next_report:
            log.info("progress", pipeline=self.name, **self.totals, dead_letters=dict(self.dead_letters.counts))
            self._next_report = now + self.settings.report_interval_s

    def close(self) -> None:
        """Wait for the batch in flight, leave the group and close the connections."""
        self.settle(rewind=False)
        self._committer.shutdown()
        self.consumer.close()
        self.checkpoint.close()
        log.info("pipeline stopped", pipeline=self.name, **self.totals)

    def stop(self) -> None:
        """Ask the loop to end after the current batch."""
        self.running = False

    def _process(self, messages: list[Message]) -> None:
        try:
            batch = self._decode(messages)
        except DeadLetterError as e:  # Kafka would not take a dead letter now: the poll is read again later
            self._decode_failed(e)
            return
        if not batch.end:
            return
        if self.settle():
            self._inflight = (batch, self._committer.submit(self._commit, batch))
        # else: the batch in flight failed and everything was re-seeked; this one started where that
        # one ended, so it is dropped and consumed again.

    def _decode_failed(self, error: DeadLetterError) -> None:
        """As for a batch that did not commit: back off, then re-seek every partition to the stored offsets."""
        self.settle(rewind=False)
        self.totals["retries"] += 1
        self._failures += 1
        delay = self._backoff_s()
        log.warning(
            "dead letters not produced; re-seeking to stored offsets",
            pipeline=self.name,
            error=str(error),
            retry_in_s=delay,
        )
        self.sleep(delay)
        self._rewind()

    def _backoff_s(self) -> float:
        """The wait after the latest of `_failures` failures in a row: doubling from 0.5 s, at most 30 s."""
        return min(0.25 * 2**self._failures, 30.0)

    def _commit(self, batch: Batch[P]) -> int:
        """In the committer thread: dead letters reach Kafka before the batch's offsets commit."""
        self.dead_letters.flush()
        started = time.perf_counter()
        changed = self.checkpoint.commit(batch)
        self.metrics.commit_seconds(time.perf_counter() - started)
        return changed

    def settle(self, *, rewind: bool = True) -> bool:
        """Wait for the batch in flight, if any; True if it committed (or there was none).

        On failure, back off and (with `rewind`) re-seek every partition to PostgreSQL's offsets.
        """
        if self._inflight is None:
            return True
        batch, future = self._inflight
        self._inflight = None
        try:
            changed = future.result()
        except (Fenced, psycopg.Error, StreamviewsError) as e:
            self.totals["retries"] += 1
            self._failures += 1
            self.metrics.rolled_back()
            # A fence resolves at once; anything else backs off, so a persistent fault does not spin.
            delay = 0.0 if isinstance(e, Fenced) else self._backoff_s()
            log.warning(
                "batch not committed; re-seeking to stored offsets",
                pipeline=self.name,
                error=str(e),
                records=batch.consumed,
                retry_in_s=delay,
            )
            if rewind:
                self.sleep(delay)
                self._rewind()
            return False
        self._failures = 0
        if batch.isolated:  # its first attempt was rolled back
            self.totals["retries"] += 1
            self.metrics.rolled_back()
        self.totals["batches"] += 1
        self.totals["records"] += batch.consumed
        self.totals["changes"] += changed
        self.metrics.committed(batch.consumed, batch.counts, batch.dead_letters, batch.event_ms)
        for topic in batch.counts.keys() - batch.held_topics:  # applied again: its back-off starts over
            self._hold_failures.pop(topic, None)
        if batch.held_topics:
            self._hold(batch.held_topics)
        for tp, offset in batch.end.items():
            if tp in self.stored:
                self.stored[tp] = offset
        # Kafka's committed offsets only inform lag tooling; PostgreSQL's are the truth.
        offsets = [TopicPartition(t, p, o) for (t, p), o in batch.end.items() if (t, p) in self.positions]
        if offsets:
            self.consumer.commit(offsets=offsets, asynchronous=True)
        if batch.held_topics and rewind:
            # The held partitions were not advanced, and the batch decoded meanwhile starts where this
            # one ended: go back to what PostgreSQL holds (that batch is dropped and read again).
            self._rewind()
            return False
        return True

    def _hold(self, topics: set[str]) -> None:
        """Pause the partitions of topics the sink could not apply, for a back-off that doubles."""
        now = time.monotonic()
        for topic in topics:
            failures = self._hold_failures[topic] = self._hold_failures.get(topic, 0) + 1
            delay = min(self.settings.hold_retry_s * 2 ** (failures - 1), 600.0)
            self.held[topic] = now + delay
            log.warning("topic held back; its offsets wait", pipeline=self.name, topic=topic, retry_in_s=delay)
        self.consumer.pause([TopicPartition(t, p) for t, p in self.positions if t in topics])

    def _release_held(self) -> None:
        """Resume the held topics whose back-off is over (they are read again from their stored offsets)."""
        now = time.monotonic()
        due = {topic for topic, at in self.held.items() if at <= now}
        if not due:
            return
        for topic in due:
            del self.held[topic]
        self.consumer.resume([TopicPartition(t, p) for t, p in self.positions if t in due])
        log.info("held topics read again", pipeline=self.name, topics=sorted(due))

    def _decode(self, messages: list[Message]) -> Batch[P]:
        # This loop runs for every message, so it does as little as it can per message: a poll holds
        # runs of messages of one partition, and the partition's bookkeeping (is it still ours, where
        # did the batch start, where does it end) is done once per run, not once per message.
        batch: Batch[P] = Batch()
        positions = self.positions
        by_topic: dict[str, list[Message]] = {}
        run: list[Message] | None = None  # where the current run's messages go; None: a revoked partition
        topic = partition = None
        last: Message | None = None  # the last message kept of the current run
        ends: dict[tuple[str, int], Message] = {}  # each partition's last message kept
        for message in messages:
            if message.error() is not None:
                if message.error().code() != KafkaError._PARTITION_EOF:
                    log.warning("consumer error", error=str(message.error()))
                continue
            if message.partition() != partition or message.topic() != topic:
                if last is not None:
                    ends[(topic, partition)] = last
                topic, partition, last = message.topic(), message.partition(), None
                tp = (topic, partition)
                if tp in positions:  # else: revoked while this poll was in flight
                    batch.start.setdefault(tp, positions[tp])
                    batch.first.setdefault(tp, message.offset())
                    run = by_topic.setdefault(topic, [])
                else:
                    run = None
            if run is not None:
                run.append(message)
                last = message
        if last is not None:
            ends[(topic, partition)] = last
        if by_topic:
            try:
                decoded = self.decode(by_topic)
            except Exception as e:  # a decoder bug: dead-letter the poll rather than crash-loop on it
                log.exception("batch decoder failed", pipeline=self.name)
                error = InvalidEvent(UNDECODABLE, f"{type(e).__name__}: {e}")
                decoded = Decoded[P](None, 0, [(m, error) for group in by_topic.values() for m in group])
            batch.payload, batch.size, batch.counts = decoded.payload, decoded.size, decoded.counts
            for message, error in decoded.rejected:
                self.dead_letters.send(message, error)
                batch.dead_letters[(message.topic(), error.reason)] += 1
        for tp, message in ends.items():
            batch.end[tp] = positions[tp] = message.offset() + 1  # where the next batch starts, once committed
            ms = message.timestamp()[1]
            if ms >= 0:  # -1: the record carries no timestamp
                batch.event_ms[tp] = ms
        return batch

    def _on_assign(self, consumer: ConsumerClient, partitions: list[TopicPartition]) -> None:
        self.settle(rewind=False)
        topics = sorted({tp.topic for tp in partitions})
        ruled = partial(needs_resolving, self.starts)
        check_topic_ids(self.clients, self.checkpoint, topics, self.metrics.topic_recreated, ruled)
        stored = self._stored_offsets([(tp.topic, tp.partition) for tp in partitions])
        first = [(tp.topic, tp.partition) for tp in partitions if (tp.topic, tp.partition) not in stored]
        if any(ruled(topic) for topic, _ in first):  # stored before anything is consumed: a restart starts there too
            stored.update(self._retried(lambda: begin(consumer, self.checkpoint, first, self.starts)))
        for tp in partitions:
            key = (tp.topic, tp.partition)
            tp.offset = stored.get(key, OFFSET_BEGINNING)
            self.positions[key] = self.stored[key] = stored.get(key)
        consumer.assign(partitions)
        self._seed_freshness(list(stored))
        log.info(
            "partitions assigned",
            pipeline=self.name,
            offsets={
                f"{tp.topic}[{tp.partition}]": stored.get((tp.topic, tp.partition), "beginning") for tp in partitions
            },
        )

    def fetch_records(self, ranges: dict[tuple[str, int], tuple[int, int]]) -> dict[tuple[str, int], list[Message]]:
        """A failed batch's records read back for isolation (pipelines/runtime/reread.py)."""
        return self.clients.read_back(self.name, ranges)

    def _on_revoke(self, consumer: ConsumerClient, partitions: list[TopicPartition]) -> None:
        # Let the batch in flight finish first: the partitions' next owner then starts after it.
        self.settle(rewind=False)
        for tp in partitions:
            self.positions.pop((tp.topic, tp.partition), None)
            self.stored.pop((tp.topic, tp.partition), None)
        consumer.unassign()
        log.info(
            "partitions revoked", pipeline=self.name, partitions=[f"{tp.topic}[{tp.partition}]" for tp in partitions]
        )

    def _stored_offsets(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """Offsets from PostgreSQL, retried until it answers: without them we must not consume."""
        return self._retried(lambda: self.checkpoint.stored_offsets(partitions))

    def _retried(self, read: Callable[[], dict[tuple[str, int], int]]) -> dict[tuple[str, int], int]:
        """Stored (or first) offsets, retried until PostgreSQL and Kafka answer."""
        delay = 0.5
        while True:
            try:
                return read()
            except (psycopg.Error, KafkaException) as e:
                log.warning("cannot read stored offsets; retrying", error=str(e), retry_in_s=delay)
                self.sleep(delay)
                delay = min(delay * 2, 10)

    def _rewind(self) -> None:
        """Seek every assigned partition back to the offsets stored in PostgreSQL."""
        partitions = sorted(self.positions)
        if not partitions:
            return
        stored = self._stored_offsets(partitions)
        self.metrics.reseeked()
        for tp in partitions:
            self.positions[tp] = self.stored[tp] = stored.get(tp)
            self.consumer.seek(TopicPartition(tp[0], tp[1], stored.get(tp, OFFSET_BEGINNING)))

    def refresh_lag(self) -> None:
        """The consumer-lag gauges: each held partition's high watermark minus its stored offset.

        The watermarks are the ones librdkafka keeps from its fetch responses (`cached=True`, no
        request to the broker); every fetch of a partition carries both, even one that returns no
        records, so an idle partition that was caught up reads 0. Before the first response they
        are -1001: no high watermark, no gauge.
        """
        lags = {}
        for tp, stored in self.stored.items():
            low, high = self.consumer.get_watermark_offsets(TopicPartition(*tp), cached=True)
            if high >= 0:  # else: no fetch response yet
                lags[tp] = partition_lag(max(low, 0), high, stored)
        self.metrics.set_lag(lags)

    def _seed_freshness(self, partitions: list[tuple[str, int]]) -> None:
        """After an assignment, freshness as stored with the offsets (so an idle stream has it too)."""
        try:
            times = self.checkpoint.stored_event_times(partitions) if partitions else {}
        except psycopg.Error as e:  # a metric only: the next committed batch sets it
            log.warning("cannot read stored event times", pipeline=self.name, error=str(e))
            return
        self.metrics.event_times({tp: int(seconds * 1000) for tp, seconds in times.items()})

    def _housekeeping(self) -> None:
        try:
            self.checkpoint.housekeeping()
        except (psycopg.Error, StreamviewsError) as e:
            log.warning("housekeeping failed; will retry", pipeline=self.name, error=str(e))
