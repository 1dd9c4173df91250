"""The catch-up of a view's backfill: its stream's retained history into that view alone, then the switch to live.

When a view over an append-only stream is created or rebuilt, the catalog records the partitions
the live runner reads (pipelines/cv/catalog/backfills.py). The live runner leaves the view out of
its batches until the catch-up has caught up with it (pipelines.cv.plans), so the live views pay
nothing for the new view meanwhile. The catch-up reads from its start in each partition (the
earliest retained offset, or Kafka's offsets-for-times of the `backfill` timestamp) and applies it
to the view only (a plan of that one view: compile_plan's `backfilling`), in rounds: each round
reads up to where the live group stood when the round began. When a round leaves it within one
batch (or about a second of its reading) of the live group, or gains too little on it to be worth
chasing (`should_join`), it joins: under the stream's exclusive lock, the switch points are fixed
at the live group's offsets and the runner's next batch is the view's first live one
(`backfills.join`). The last round reads up to the switch points. Every stored aggregate merges in
any order (pipelines/cv/frontend/backfill.py), so that tail applied after the first live batches
gives the same result.

Exactly once, as the live runner: the catch-up is a consumer group of its own (`streamviews-
backfill/<view>/<id>`) whose positions are ops.kafka_offsets rows, and each batch commits through a
`Checkpoint` with them in one PostgreSQL transaction. A round never reads past the live group's
stored offsets, which only grow, so the switch points are never behind the catch-up; the batch that
reaches the switch point in every partition marks the backfill done in that same transaction. A
kill -9 anywhere resumes from the stored positions (before or after the join). A view dropped or
rebuilt meanwhile: its backfill row is gone (or another's), the batch in flight finds that under
the stream's lock, rolls back, and the catch-up moves on.

Where it runs: a child process of the stream runner (`PIPELINE_BACKFILL`; pipelines/cv/backfill_process.py),
niced below the live loop, started while a backfill of the runner's streams waits and stopped with
the runner: a backfill needs no service of its own to deploy and supervise. It keeps out of the
live views' way: its own process (the live loop's interpreter is not shared, and the kernel gives
the live loop the CPU first), its own consumer (assigned partitions, no group membership: the live
group is never rebalanced), bounded batches (`PIPELINE_BACKFILL_BATCH_MAX`), and a pause between
batches (`PIPELINE_BACKFILL_PAUSE_S`) that lets the live loop take the database first.
Records the stream's decoder rejects are skipped: the live runner dead-lettered them already.
One backfill at a time, oldest first; a quarantined view's waits until it is maintained again.
A replay's shadow view (pipelines.cv.catalog.replays) is swapped in by the batch that finishes its catch-up.
Each batch is applied by pipelines/cv/backfill_sink.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import psycopg
from confluent_kafka import Consumer, TopicPartition

from pipelines.cv import catalog
from pipelines.cv.backfill_priority import BackendPriority, NicedOffsets
from pipelines.cv.backfill_sink import BackfillSink, BackfillStopped, HistoryBatch, Partition, Pending
from pipelines.cv.catalog import backfills, replays
from pipelines.cv.catalog.backfills import live_group
from pipelines.cv.catalog.stream_types import PostgresInputCheck
from pipelines.cv.decoding.stream_decoder import StreamDecoder
from pipelines.cv.frontend.backfill import rule_ms
from pipelines.cv.plans import declared_streams
from pipelines.cv.stream_changes import Origin
from pipelines.logs import get_logger
from pipelines.runtime.checkpoint import Batch, Checkpoint
from pipelines.runtime.clients import ConfluentClients, consumer_config
from pipelines.runtime.deadletter import DeadLetters
from pipelines.settings import KafkaSettings, PipelineSettings

log = get_logger("cv.backfill")

BACKFILL_LOCK = 0x62666C6C  # the advisory lock class of backfills ('bfll'), keyed by the backfill's group
# A round before the join lasts at most this long: then the catch-up looks again how far behind the
# live group it is, and whether it still gains on it (`should_join`), also when the history is long.
ROUND_S = 10.0
JOIN_WITHIN_S = 1.0  # the catch-up joins once what is left takes about this long at its own rate
JOIN_GAIN = 10  # ... or once a round gains less than 1/JOIN_GAIN of what it read on the live group


def should_join(behind: int, before: int | None, read: int, batch_max: int, rate: float = 0.0) -> bool:
    """Whether the catch-up, `behind` records short of the live group now, joins it rather than read another round.

    It joins when it would read the rest within one batch or about a second at its last round's
    `rate` (records/s): that tail is read once the live runner keeps the view too, so it is kept
    short. It joins too when the last round, which read `read` records and began `before` behind,
    gained less than a tenth of them: the live stream grows at 90% of the catch-up's pace or more,
    and chasing it would take over ten times as long as reading the rest beside the live runner (or
    forever). Below that it chases: the live views' freshness comes first, the new view is complete
    later.
    """
    if behind <= max(batch_max, rate * JOIN_WITHIN_S):
        return True
    return before is not None and (before - behind) * JOIN_GAIN < read


class Backfiller:
    """Catches up the pending backfills of the streams `runs` accepts, one batch at a time (the runner's child)."""

    def __init__(
        self,
        postgres_conninfo: str,
        kafka: KafkaSettings,
        settings: PipelineSettings,
        runs: Callable[[str], bool] = lambda stream: True,
        priority: BackendPriority | None = None,
    ) -> None:
        self.conninfo, self.kafka, self.settings, self.runs = postgres_conninfo, kafka, settings, runs
        self.sink = BackfillSink(settings.poison_limit, settings.view_retry_s)
        self._dead_letters: DeadLetters | None = None  # to the topics' dead-letter topics, as the live runner's
        self.priority = priority or BackendPriority(settings.backfill_nice)  # its backends too, not only its Python
        self._conn: psycopg.Connection | None = None

    def run(self, stop: threading.Event) -> None:
        """Until `stop`: the oldest pending backfill, or a wait; a failure is logged and retried after the wait."""
        while not stop.is_set():
            try:
                busy = self.step(stop)
            except Exception as e:  # the database or Kafka away: the positions are stored, try again
                log.warning("backfill failed; will retry", error=f"{type(e).__name__}: {str(e).strip()}"[:500])
                self._close()
                busy = False
            if not busy:
                stop.wait(self.settings.backfill_poll_s)
        self._close()

    def step(self, stop: threading.Event) -> bool:
        """Catch up the oldest pending backfill of a stream this runner runs; False when there was none.

        Several runner processes of one group each look: the first to take a backfill's advisory
        lock (session-level, released when its connection ends, kill -9 included) catches it up, the
        others take the next one or wait, instead of fencing each other batch after batch.
        """
        conn = self._connection()
        conn.execute("SELECT cv.forget_backfill_offsets()")  # of backfills dropped or rebuilt
        replays.swap_ready(conn, self.runs)  # any replay whose shadow caught up but was not swapped in
        for pending in self.pending(conn):
            if conn.execute(
                "SELECT pg_try_advisory_lock(%s, hashtext(%s))", (BACKFILL_LOCK, pending.group_id)
            ).fetchone()[0]:
                try:
                    self.catch_up(pending, stop)
                finally:
                    conn.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", (BACKFILL_LOCK, pending.group_id))
                return True
        return False

    def pending(self, conn: psycopg.Connection) -> list[Pending]:
        """The backfills not done whose stream this runner runs and whose view is maintained, oldest first."""
        rows = conn.execute(
            "SELECT b.view, b.stream, b.group_id, b.rule, array_agg(p.topic), array_agg(p.partition),"
            " array_agg(p.switch_offset), b.joined_at IS NOT NULL"
            " FROM cv.backfills AS b JOIN cv.backfill_partitions AS p ON p.view = b.view"
            " WHERE b.done_at IS NULL AND NOT EXISTS (SELECT FROM cv.view_failures AS f WHERE f.view = b.view)"
            " GROUP BY b.view ORDER BY b.id"
        ).fetchall()
        return [
            Pending(
                view,
                stream,
                group_id,
                rule,
                dict(zip(zip(topics, partitions, strict=True), offsets, strict=True)),
                joined,
            )
            for view, stream, group_id, rule, topics, partitions, offsets, joined in rows
            if self.runs(stream)
        ]

    def catch_up(self, backfill: Pending, stop: threading.Event) -> None:
        """Read the history into the view, round after round, until done, stopped or gone; join the live runner.

        Before the join, each round reads up to the live group's stored offsets as they stood when
        it began, for at most ROUND_S; when `should_join` says so, the view joins (`_join`), and
        the last round reads up to its switch points and is done.
        """
        streams = declared_streams(self._connection())
        sources = [s for s in streams.values() if s.name == backfill.stream or s.into == backfill.stream]
        # A type PostgreSQL reads: its refused values are skipped as the live runner dead-lettered them.
        check = PostgresInputCheck(self._connection)
        decoders = {s.topic: StreamDecoder(s, input_check=check) for s in sources}
        live = {(s.topic, live_group(s)) for s in sources}
        clients = ConfluentClients(self.kafka)
        if self._dead_letters is None:
            self._dead_letters = DeadLetters(clients.producer("backfill"), "backfill")
        checkpoint: Checkpoint[psycopg.Connection, HistoryBatch] = Checkpoint(
            NicedOffsets(self.conninfo, backfill.group_id, self.priority),
            self.sink,
            self._dead_letters,
            lambda ranges: clients.read_back("backfill", ranges),  # a batch isolated: its records read again
        )
        consumer = Consumer(consumer_config(self.kafka, "backfill", backfill.group_id))
        committer = ThreadPoolExecutor(1, thread_name_prefix="backfill-commit")
        try:
            target = self._target(backfill, live)
            position = self._starts(consumer, checkpoint, backfill, target)
            log.info("backfill catching up", view=backfill.view, rule=backfill.rule, joined=backfill.joined)
            before: int | None = None
            read, rate = 0, 0.0  # records read by the last round, and how fast
            while not stop.is_set():
                if not backfill.joined:
                    behind = sum(max(0, target[tp] - position[tp]) for tp in target)
                    if should_join(behind, before, read, self.settings.backfill_batch_max, rate):
                        joined = self._join(backfill, live, behind)
                        if joined is None:
                            return  # dropped, rebuilt or quarantined meanwhile
                        backfill, target = joined, self._target(joined, live)
                        position = self._starts(consumer, checkpoint, backfill, target)  # partitions new to it too
                        continue
                    before = behind
                began, offsets = time.monotonic(), sum(position.values())
                until = None if backfill.joined else began + ROUND_S
                if not self._round(
                    consumer, checkpoint, committer, backfill, position, target, decoders, live, stop, until
                ):
                    return
                read = sum(position.values()) - offsets
                rate = read / max(time.monotonic() - began, 1e-3)
                if backfill.joined:
                    return
                target = self._target(backfill, live)
        finally:
            committer.shutdown(wait=True)
            consumer.close()
            checkpoint.close()

    def _target(self, backfill: Pending, live: set[tuple[str, str]]) -> dict[Partition, int]:
        """Where a round reads up to, per partition: the switch points, or (not joined yet) the live group's offsets."""
        if backfill.joined:
            return {tp: offset or 0 for tp, offset in backfill.switch.items()}
        stored = self._stored_live(live)
        return {tp: stored.get(tp, 0) for tp in backfill.switch}

    def _round(
        self,
        consumer: Consumer,
        checkpoint: Checkpoint[psycopg.Connection, HistoryBatch],
        committer: ThreadPoolExecutor,
        backfill: Pending,
        position: dict[Partition, int],
        target: dict[Partition, int],
        decoders: dict[str, StreamDecoder],
        live: set[tuple[str, str]],
        stop: threading.Event,
        until: float | None = None,
    ) -> bool:
        """Read [position, target) of each partition into the view (or until `until`); False when stopped or gone.

        Reading and committing overlap, as in the live pipeline: batch N+1 is read and decoded while N
        commits (the database works, this thread waits on its socket), and handed over only once N
        has committed; N+1 starts where N ends, so a failure of N fails N+1's claim too, and the
        catch-up starts again from the stored positions. A joined backfill's round is its last: the
        batch that reaches the switch points marks it done.
        """
        todo = {tp for tp, offset in position.items() if offset < target[tp]}
        if not todo:
            if backfill.joined:
                self._finish_empty(backfill)
            return True
        consumer.assign([TopicPartition(t, p, position[(t, p)]) for t, p in sorted(todo)])
        consumer.resume([TopicPartition(t, p) for t, p in sorted(todo)])  # paused at the end of a round before
        spent = {"read_s": 0.0, "waited_s": 0.0, "batches": 0, "records": 0}  # for the "done" line
        inflight: tuple[Future[int], Batch[HistoryBatch]] | None = None
        while todo and not stop.is_set() and (until is None or time.monotonic() < until):
            started = time.perf_counter()
            batch = self._read(consumer, backfill, position, target, todo, decoders)
            read = time.perf_counter()
            spent["read_s"] += read - started
            if batch is not None:  # read on from its end, while it commits
                position.update(batch.end)
                finished = [tp for tp in todo if position[tp] >= target[tp]]
                if finished:
                    consumer.pause([TopicPartition(t, p) for t, p in finished])
                    todo.difference_update(finished)
                spent["batches"] += 1
                spent["records"] += len(batch.payload.changes.ops) if batch.payload is not None else 0
            if inflight is not None and not self._committed(inflight, backfill):
                return False
            spent["waited_s"] += time.perf_counter() - read
            inflight = (committer.submit(checkpoint.commit, batch), batch) if batch is not None else None
            if todo:
                self._yield_to_live(consumer, live, stop)
        if inflight is not None and not self._committed(inflight, backfill):
            return False
        if todo and (stop.is_set() or until is None):
            return False  # stopped
        what = "backfill done" if backfill.joined else "backfill round ended"
        log.info(what, view=backfill.view, **{k: round(v, 3) for k, v in spent.items()})
        return True

    def _join(self, backfill: Pending, live: set[tuple[str, str]], behind: int) -> Pending | None:
        """The live runner takes the view in (catalog.backfills.join), under the stream's exclusive lock.

        A live batch in flight holds the lock shared: the join waits for it to commit, and the next
        one waits for the join, a short transaction that reads no record. Returns the backfill as
        it is now, with its switch points; None when it is gone (the view dropped or rebuilt) or
        waits (the view quarantined).
        """
        conn = self._connection()
        with conn.transaction():
            catalog.lock_stream(conn, backfill.stream, shared=False)
            joined = backfills.join(conn, backfill.view, [(group, topic) for topic, group in sorted(live)])
        if joined:
            log.info("backfill joins the live runner", view=backfill.view, behind=behind)
        return next((p for p in self.pending(conn) if p.group_id == backfill.group_id and p.joined), None)

    def _yield_to_live(self, consumer: Consumer, live: set[tuple[str, str]], stop: threading.Event) -> None:
        """Give way to a live runner that has records to read: pause, then wait while it is far behind.

        The live views' freshness comes first: a backfill takes the CPU and the database the live
        batches need. When the live runner has anything to read, the backfill pauses
        PIPELINE_BACKFILL_PAUSE_S, then waits while it is more than PIPELINE_BACKFILL_YIELD_LAG records
        behind on the stream's topics, as long as it moves: one that has not committed for
        PIPELINE_BACKFILL_YIELD_MAX_S (down, or held) does not stop it. An idle live runner costs the
        backfill no pause (a pause a batch took an eighth of a backfill's time on an idle machine).
        """
        behind, committed = self._live_lag(consumer, live)
        if behind == 0:
            return
        stop.wait(self.settings.backfill_pause_s)
        if not self.settings.backfill_yield_lag:
            return
        moved_at, last = time.monotonic(), None
        while not stop.is_set() and time.monotonic() - moved_at < self.settings.backfill_yield_max_s:
            if behind <= self.settings.backfill_yield_lag:
                return
            if committed != last:
                moved_at, last = time.monotonic(), committed
            stop.wait(0.05)
            behind, committed = self._live_lag(consumer, live)

    def _live_lag(self, consumer: Consumer, live: set[tuple[str, str]]) -> tuple[int, int]:
        """The records the live runner has yet to read on the stream's topics, and the offsets it has committed."""
        behind = committed = 0
        for (topic, partition), offset in self._stored_live(live).items():
            high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=5)[1]
            behind += max(0, high - offset)
            committed += offset
        return behind, committed

    def _stored_live(self, live: set[tuple[str, str]]) -> dict[Partition, int]:
        """The live groups' stored next offsets, per partition of the stream's topics."""
        stored: dict[Partition, int] = {}
        for topic, group in live:
            rows = self._connection().execute(
                "SELECT partition, next_offset FROM ops.kafka_offsets WHERE group_id = %s AND topic = %s",
                (group, topic),
            )
            stored.update(((topic, partition), offset) for partition, offset in rows)
        return stored

    @staticmethod
    def _committed(inflight: tuple[Future[int], Batch[HistoryBatch]], backfill: Pending) -> bool:
        """Wait for a batch's commit: True once committed, False when the backfill stopped (raises on failure).

        It stops too when the batch, isolated, quarantined the view: its offsets were held, and the
        history waits for the view to run again.
        """
        future, batch = inflight
        try:
            future.result()
        except BackfillStopped as e:
            log.info("backfill stopped", view=backfill.view, reason=str(e))
            return False
        if batch.held_topics:
            log.warning(
                "backfill waits: its view was quarantined", view=backfill.view, topics=sorted(batch.held_topics)
            )
            return False
        return True

    def _starts(
        self, consumer: Consumer, checkpoint: Checkpoint[Any, Any], backfill: Pending, target: dict[Partition, int]
    ) -> dict[Partition, int]:
        """Each partition's stored position; those never started are resolved by the rule and stored first.

        Never past `target`: the live group has read no further, so the catch-up may not either.
        """
        partitions = sorted(backfill.switch)
        position = checkpoint.stored_offsets(partitions)
        missing = [tp for tp in partitions if tp not in position]
        if missing:
            at = rule_ms(backfill.rule)
            resolved: dict[Partition, int] = {}
            if at is None:
                for t, p in missing:
                    resolved[(t, p)] = consumer.get_watermark_offsets(TopicPartition(t, p), timeout=10)[0]
            else:
                for tp in consumer.offsets_for_times([TopicPartition(t, p, at) for t, p in missing], timeout=10):
                    offset = tp.offset if tp.offset >= 0 else target[(tp.topic, tp.partition)]
                    resolved[(tp.topic, tp.partition)] = offset
            resolved = {tp: min(offset, target[tp]) for tp, offset in resolved.items()}
            position.update(checkpoint.begin(resolved))
        with self._connection().transaction():
            self._connection().execute(
                "UPDATE cv.backfill_partitions AS p SET start_offset = s.o"
                " FROM unnest(%s::text[], %s::int[], %s::bigint[]) AS s (t, n, o)"
                " WHERE p.view = %s AND p.topic = s.t AND p.partition = s.n AND p.start_offset IS NULL",
                ([t for t, _ in position], [p for _, p in position], list(position.values()), backfill.view),
            )
            self._connection().execute(
                "UPDATE cv.backfills SET started_at = now() WHERE group_id = %s AND started_at IS NULL",
                (backfill.group_id,),
            )
        return position

    def _read(
        self,
        consumer: Consumer,
        backfill: Pending,
        position: dict[Partition, int],
        target: dict[Partition, int],
        todo: set[Partition],
        decoders: dict[str, StreamDecoder],
    ) -> Batch[HistoryBatch] | None:
        """One poll of history, cut at the round's targets; None when it brought nothing to commit."""
        messages = consumer.consume(self.settings.backfill_batch_max, timeout=0.5)
        first: dict[Partition, int] = {}
        end: dict[Partition, int] = {}
        by_topic: dict[str, list[Any]] = {}
        payload = HistoryBatch(backfill)
        for message in messages:
            if message.error() is not None:
                continue
            tp = (message.topic(), message.partition())
            if tp not in todo or (tp in end and end[tp] >= target[tp]):
                continue
            offset = message.offset()
            if offset >= target[tp]:  # the round's end in this partition (live from here, once joined)
                first.setdefault(tp, position[tp])
                end[tp] = target[tp]
                continue
            first.setdefault(tp, offset)
            end[tp] = offset + 1
            by_topic.setdefault(tp[0], []).append(message)
        if not messages:
            self._gone_below_target(consumer, target, todo, first, end)
        if not end:
            return None
        size = 0
        for topic, group in by_topic.items():
            decoded = decoders[topic].decode_batch(group)  # rejected ones: dead-lettered by the live runner
            if decoded.ops:
                payload.changes.extend(decoded.ops, decoded.columns, Origin(topic, decoders[topic]))
                size += len(decoded.ops)
        payload.finishing = backfill.joined and all(end.get(tp, position[tp]) >= target[tp] for tp in todo)
        start: dict[Partition, int | None] = {tp: position[tp] for tp in end}
        # A batch with nothing to apply but the end is still handed to the sink (size 1), to mark it done.
        size = size or (1 if payload.finishing else 0)
        return Batch(payload=payload, size=size, start=start, first=first, end=end)

    @staticmethod
    def _gone_below_target(
        consumer: Consumer,
        target: dict[Partition, int],
        todo: set[Partition],
        first: dict[Partition, int],
        end: dict[Partition, int],
    ) -> None:
        """After an empty poll: partitions whose records up to the target were all deleted (retention) are done."""
        for t, p in todo:
            low, _ = consumer.get_watermark_offsets(TopicPartition(t, p), timeout=10)
            if low >= target[(t, p)]:
                first.setdefault((t, p), target[(t, p)])
                end[(t, p)] = target[(t, p)]

    def _finish_empty(self, backfill: Pending) -> None:
        """Nothing to read (the rule starts at the switch point): done at once (a replay swapped in with it)."""
        conn = self._connection()
        with conn.transaction():
            swap = replays.is_shadow(backfill.view)
            catalog.lock_stream(conn, backfill.stream, shared=not swap)
            conn.execute(
                "UPDATE cv.backfills SET done_at = now() WHERE group_id = %s AND done_at IS NULL", (backfill.group_id,)
            )
            if swap:
                replays.swap_in(conn, backfill.view)
        log.info("backfill done: no history before the switch point", view=backfill.view, rule=backfill.rule)

    def _connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = self.priority.connect(self.conninfo, autocommit=True)
        return self._conn

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None
