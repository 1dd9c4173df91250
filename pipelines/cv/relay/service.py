"""The sinks' relay: each sink's view changes, read from PostgreSQL, published to its Kafka topic.

Run: `python -m pipelines.cv.relay` (supervised by `make up` as `sinks`, a service in
docker-compose.yml), as sv_writer: it reads cv.view_changes and the views' storage like any
reader, and needs no REPLICATION and no logical decoding (the security boundary of the views'
database, docs/security.md).

For each sink (cv.sinks, in name order), one page at a time:

1. read the changes after the sink's position (cv.change_readers), filtered by its `where`, shaped
   by its format (pipelines.cv.relay.records), in position order;
2. produce them with the idempotent producer and wait for every delivery report
   (pipelines.cv.relay.publish); a record Kafka refuses for what it is goes to `<topic>.dlq`;
3. in one PostgreSQL transaction, advance the sink's position to the page's last, fenced
   (`... WHERE position = <the page's start>`): of two relays, one advances, the other finds the
   position moved and reads again from there.

At least once: killed between 2 and 3, the relay produces the page again at its next start, the
same records with the same positions in the same order (docs/results.md, "Delivery guarantee").

A sink's first run publishes its view's rows instead (its snapshot): the rows and the view's last
position are read in one REPEATABLE READ transaction (they commit together), the rows produced, and
then the position set to that last one with `snapshot_done`, in one transaction. Changes between
the sink's creation and its snapshot are in the snapshot already.

Which relay relays a sink: the sinks of views over streams declared without a `consumer_group`
belong to the default relay (the supervised one); `--group G` relays those over streams declared
with `consumer_group = 'G'`, as a runner of group G runs those streams (a test's own relay, say).
Within one group, a relay relays a sink while it holds the sink's session advisory lock
(SINK_LOCK, hashtext(name)): several relays share the sinks, each sink relayed by one at a time,
and a relay that dies (its connection gone) leaves its sinks to the others at their next pass.

The relay wakes on `NOTIFY streamviews_changes` (migration 0020), and every SINK_WAKE_S in case a
notification was lost. A sink whose page fails (its filter raises on some change, Kafka refuses
the topic) is marked failed in cv.sinks (`streamviews status` shows it) and tried again after
SINK_RETRY_S; the other sinks go on. Lag per sink is exported as metrics (pipelines/metrics.py).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import psycopg
from confluent_kafka import KafkaException

from pipelines import metrics
from pipelines.cv.catalog import store
from pipelines.cv.catalog.sinks import SinkState, sink_states
from pipelines.cv.frontend.sinks import reader_name
from pipelines.cv.relay.publish import Publisher
from pipelines.cv.relay.records import page_query, records, snapshot_query
from pipelines.cv.status import sink_lag_s
from pipelines.cv.subscribe import CHANNEL, names_view
from pipelines.errors import StreamviewsError
from pipelines.logs import get_logger
from pipelines.runtime.topics import ensure_topics
from pipelines.settings import PipelineSettings, SinkSettings

log = get_logger("sinks")

# The longest pause after the database was lost, between attempts to connect again.
MAX_BACKOFF_S = 10.0
# Advisory-lock class of sinks: (SINK_LOCK, hashtext(sink name)), held by the relay relaying it.
SINK_LOCK = 0x5349  # "SI"


class Relay:
    """Every sink's changes to its topic, a page at a time; `run()` until SIGTERM or SIGINT."""

    def __init__(
        self,
        conninfo: str,
        publisher: Publisher,
        bootstrap_servers: str,
        settings: SinkSettings,
        pipeline: PipelineSettings,
        group: str | None = None,
    ) -> None:
        self.conninfo, self.publisher, self.bootstrap_servers = conninfo, publisher, bootstrap_servers
        self.settings, self.pipeline, self.group = settings, pipeline, group
        self._owned: set[str] = set()  # sinks whose advisory lock this relay's connection holds
        self.running = True
        self._retry_at: dict[str, float] = {}  # failed sinks: when to try them again (monotonic)
        self._topics: set[str] = set()  # topics made sure of since start
        self._published: dict[str, int] = {}  # records acknowledged per sink since the last report
        self._views: set[str] = set()  # the views of this relay's sinks (the notifications that wake it)
        # Upsert sinks' views as compiled, with the catalog row they were compiled from.
        self._compiled: dict[str, tuple[object, store.CompiledView]] = {}
        self._reported = time.monotonic()

    def stop(self) -> None:
        """Finish the page in hand, then return from run()."""
        self.running = False

    def run(self) -> None:
        """Relay until stopped, connecting again (with back-off) when the database goes away."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())
        delay = 0.5
        while self.running:
            try:
                with (
                    psycopg.connect(self.conninfo, autocommit=True) as listener,
                    psycopg.connect(self.conninfo, prepare_threshold=None) as conn,
                ):
                    listener.execute(f"LISTEN {CHANNEL}")
                    self._owned.clear()  # a new connection holds no lock yet
                    delay = 0.5
                    while self.running:
                        busy = self.relay_once(conn)
                        self._beat()
                        if not busy:
                            self._wait(listener)
            except psycopg.OperationalError as e:
                log.warning("database unavailable; connecting again", error=str(e).strip(), retry_in_s=delay)
                self._sleep(delay)
                delay = min(delay * 2, MAX_BACKOFF_S)
        log.info("relay stopped")

    def relay_once(self, conn: psycopg.Connection) -> bool:
        """One page (or snapshot) of every sink that is due; True when some sink has more to relay now."""
        states = self._mine(conn, sink_states(conn))
        conn.rollback()
        self._views = {s.view for s in states}
        metrics.set_sinks((s.name, s.lag_changes, sink_lag_s(s), s.failed_at is not None) for s in states)
        busy = False
        for state in states:
            if not self.running:
                break
            if self._retry_at.get(state.name, 0.0) > time.monotonic():
                continue
            try:
                busy = self._relay_sink(conn, state) or busy
            except (psycopg.Error, KafkaException, StreamviewsError) as e:
                if conn.broken:
                    raise
                conn.rollback()
                self._fail(conn, state, e)
                continue
            self._retry_at.pop(state.name, None)
            if state.failed_at is not None:
                with conn.transaction():
                    conn.execute("UPDATE cv.sinks SET failed_at = NULL, error = NULL WHERE name = %s", (state.name,))
                log.info("sink runs again", sink=state.name)
        self._report()
        return busy

    def _mine(self, conn: psycopg.Connection, states: list[SinkState]) -> list[SinkState]:
        """The sinks of this relay's group whose lock it holds (taken now when free); others' locks let go."""
        streams = store.load_streams(conn, skip_broken=True)
        mine = []
        for state in states:
            stream = streams.get(state.stream or "")
            if (stream.consumer_group if stream is not None else None) != self.group:
                continue
            if state.name not in self._owned:
                taken = conn.execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))", (SINK_LOCK, state.name))
                if not taken.fetchone()[0]:
                    continue  # another relay of the group relays it
                self._owned.add(state.name)
                log.info("sink taken", sink=state.name, view=state.view, topic=state.topic)
            mine.append(state)
        for gone in self._owned - {s.name for s in states}:  # dropped
            conn.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", (SINK_LOCK, gone))
            self._owned.discard(gone)
        return mine

    def _relay_sink(self, conn: psycopg.Connection, state: SinkState) -> bool:
        """The sink's snapshot, or its next page; True when it has more to relay now."""
        self._ensure_topic(state)
        if not state.snapshot_done:
            self._snapshot(conn, state)
            return True
        compiled = self._compiled_view(conn, state) if state.format == "upsert" else None
        query = page_query(state, compiled.view, compiled.types) if compiled else page_query(state)
        rows = conn.execute(query, {"view": state.view, "after": state.position, "page": self.settings.page}).fetchall()
        conn.rollback()
        if not rows:
            return False
        batch, end = records(rows)
        assert end is not None
        dead = self.publisher.publish(state.name, state.view, state.topic, batch)
        self._count(state.name, len(batch) - dead)
        self._advance(conn, state, end)
        return end - state.position >= self.settings.page

    def _compiled_view(self, conn: psycopg.Connection, state: SinkState) -> store.CompiledView | None:
        """The sink's view as compiled from the catalog now (None for a transform), compiled again when redefined."""
        row = conn.execute("SELECT definition, types FROM cv.views WHERE name = %s", (state.view,)).fetchone()
        if row is None:
            return None
        cached = self._compiled.get(state.view)
        if cached is None or cached[0] != row:
            cached = self._compiled[state.view] = (row, store.stored_view(row[0], row[1], store.scope(conn)))
        return cached[1]

    def _snapshot(self, conn: psycopg.Connection, state: SinkState) -> None:
        """The view's rows and its last position, in one snapshot, published; then the position set there."""
        compiled = self._compiled_view(conn, state)
        conn.rollback()
        if compiled is None:  # a change stream that is not a view's: nothing to snapshot
            self._advance(conn, state, state.position, snapshot=True)
            return
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        published = 0
        try:
            (last,) = conn.execute(
                "SELECT last FROM cv.view_change_positions WHERE view = %s", (state.view,)
            ).fetchone()
            with conn.cursor(name=f"snapshot_{state.name}") as cursor:
                cursor.execute(snapshot_query(state, compiled.view, compiled.types), {"view": state.view, "last": last})
                while rows := cursor.fetchmany(self.settings.page):
                    batch, _ = records(rows)
                    published += len(batch) - self.publisher.publish(state.name, state.view, state.topic, batch)
            conn.rollback()
        finally:
            conn.isolation_level = None
        self._count(state.name, published)
        self._advance(conn, state, last, snapshot=True)
        log.info("sink snapshot published", sink=state.name, view=state.view, rows=published, position=last)

    def _advance(self, conn: psycopg.Connection, state: SinkState, end: int, *, snapshot: bool = False) -> None:
        """The sink's position to `end` (and its snapshot done), unless another relay moved it first."""
        with conn.transaction():
            moved = conn.execute(
                "UPDATE cv.change_readers SET position = %s, taken_at = now()"
                " WHERE view = %s AND reader = %s AND position = %s",
                (end, state.view, reader_name(state.name), state.position),
            ).rowcount
            if moved and snapshot:
                conn.execute("UPDATE cv.sinks SET snapshot_done = true WHERE name = %s", (state.name,))
        if not moved:
            log.warning("sink position moved by another relay; reading again", sink=state.name, expected=state.position)

    def _ensure_topic(self, state: SinkState) -> None:
        """The sink's topic, created when missing (compacted for upsert); its `.dlq` waits for a dead letter."""
        if state.topic in self._topics:
            return
        partitions = state.partitions or self.pipeline.topic_partitions
        configs = {state.topic: {"cleanup.policy": "compact"}} if state.format == "upsert" else {}
        ensure_topics(self.bootstrap_servers, {state.topic: partitions}, configs=configs)
        self._topics.add(state.topic)

    def _fail(self, conn: psycopg.Connection, state: SinkState, error: Exception) -> None:
        """Mark the sink failed (status shows why) and try it again after SINK_RETRY_S; others go on."""
        message = " ".join(str(getattr(getattr(error, "diag", None), "message_primary", None) or error).split())
        log.error("sink failed; tried again later", sink=state.name, error=message, retry_in_s=self.settings.retry_s)
        self._retry_at[state.name] = time.monotonic() + self.settings.retry_s
        self._topics.discard(state.topic)  # deleted under the sink, say: made again at the next try
        with conn.transaction():
            conn.execute("UPDATE cv.sinks SET failed_at = now(), error = %s WHERE name = %s", (message, state.name))

    def _count(self, sink: str, n: int) -> None:
        if n:
            metrics.SINK_PUBLISHED.labels(sink).inc(n)
            self._published[sink] = self._published.get(sink, 0) + n

    def _report(self) -> None:
        if time.monotonic() - self._reported < self.pipeline.report_interval_s:
            return
        self._reported = time.monotonic()
        if self._published:
            log.info("sinks published", records=dict(sorted(self._published.items())))
            self._published.clear()

    def _wait(self, listener: psycopg.Connection) -> None:
        """Until a notification names a view of its sinks (or may), SINK_WAKE_S passed, or the relay is stopped.

        Other views' commits do not wake it. A payload that names no view (`{"views": null}`, what
        CREATE SINK sends) wakes it, so it takes a new sink at once.
        """
        deadline = time.monotonic() + self.settings.wake_s
        while self.running and (left := deadline - time.monotonic()) > 0:
            for notify in listener.notifies(timeout=min(left, 1.0), stop_after=1):
                # With no sinks yet, only a payload that names no view wakes it ("" is no view's name).
                if any(names_view(notify.payload, view) for view in self._views or {""}):
                    return

    def _beat(self) -> None:
        if self.pipeline.heartbeat_file:
            Path(self.pipeline.heartbeat_file).touch()

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self.running and time.monotonic() < deadline:
            time.sleep(max(0.0, min(0.2, deadline - time.monotonic())))
