"""The ctid-block puller: audit tables into Elasticsearch, block by block, without holes or duplicates.

Run: `python -m pipelines.audit.puller` (supervised by `make up`, as the sv_indexer role). It follows
every table of one audit log (AUDIT_SCHEMA) and indexes each row as the document
`<schema>.<table>:<block>:<offset>` (its "line number") into `<AUDIT_INDEX_PREFIX>-YYYY.MM.DD`.

Why no row is ever missed and none is ever indexed twice:

1. **An id names one row forever.** Audit rows are never updated or deleted (retention drops whole
   tables), so a ctid is never reused for another row while the table exists. Indexing a row again
   writes the same document id: re-reading is always safe, and the only danger is skipping.
2. **The writer says where rows can appear.** Each table has one writer (its shard's partition owner,
   serialised by the offset-row lock, pipelines/audit/writer.py). In every batch's own transaction,
   `audit.record_batch` scans the batch's rows from the table's `hi_block` up with a TID range scan and
   raises `hi_block` to the highest block holding one. Heap inserts go to the last block or new ones, so
   a later batch lands at or above `hi_block`, except when the free-space map hands it space below
   (vacuum cleaned the rows of an aborted batch; a relation extended ahead of use): then fewer rows
   than copied are found from `hi_block` up, and the same transaction records a rewind to the lowest
   block the batch used. The ledger (`audit.tables`, `audit.table_rewinds`) commits with the rows.
3. **The puller reads a consistent cut.** In one REPEATABLE READ snapshot it reads the ledger and the
   rows of blocks `[next_block, hi_block]` (TID range scans). Every row committed in those blocks up to
   the ledger's `seq` is in the snapshot; a row committed later lies in `hi_block` or above, or below it
   with a rewind the next read sees. Rows of aborted transactions are never visible: their blocks read
   empty, which makes no hole either, since those rows never existed.
4. **The checkpoint moves only after Elasticsearch acknowledged.** Every bulk item's status is
   checked; transient failures are retried with back-off for as long as it takes (Elasticsearch down
   for a while) and the checkpoint stays put meanwhile. It then advances to the chunk's end, but never
   past `hi_block`: that block may still be filling, so it is read again (same ids) once the writer
   commits more. A rewind moves the checkpoint back before reading. The requests of one pass go out in
   parallel, but a table has at most one chunk per pass, each chunk's checkpoint waits for its own
   request, and the next pass starts only when all have settled. Killed at any point, the puller
   redoes at most the chunks of the pass in flight, with the same ids.

Lag is logged every PIPELINE_REPORT_INTERVAL_S and exported as metrics every METRICS_REFRESH_S
(pipelines/metrics.py): rows written but not yet indexed, and how long the oldest unindexed batch has
waited (as observed by this process, within one poll). Bulk requests are sent by
pipelines/audit/bulk.py, which counts the ones not fully acknowledged. Retention
(pipelines/audit/retention.py) runs in this loop every AUDIT_RETENTION_INTERVAL_S, so it never races a bulk
request for the day it deletes.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path

import psycopg
from elasticsearch import ApiError, Elasticsearch, TransportError
from psycopg import sql

from pipelines import metrics
from pipelines.audit import bulk, elastic, retention
from pipelines.audit.bulk import PullerError, document
from pipelines.errors import StreamviewsError
from pipelines.logs import configure_logging, get_logger
from pipelines.runtime.interpreter import tune_for_batches
from pipelines.settings import (
    AuditSettings,
    ElasticsearchSettings,
    MetricsSettings,
    PipelineSettings,
    PostgresSettings,
)

log = get_logger("ctid_puller")

# A pass that read fewer rows than this sleeps AUDIT_PULL_IDLE_S before the next: a trickle then goes
# out in bulks of hundreds of documents, not in one request per commit.
MIN_PASS_ROWS = 500
# Chunks are gathered into bulk requests of at least this many rows (the last of a pass may be
# smaller): large enough that a trickle over many tables is one request, small enough that a backlog
# is shipped while the next chunks are read.
MIN_BULK_ROWS = 2_000


@dataclass(frozen=True)
class TableState:
    """One table's ledger row (what the writer committed) joined with the puller's checkpoint."""

    table: str
    day: date
    hi_block: int
    seq: int
    rows: int
    committed_at: datetime | None  # the writer's last commit (database clock)
    next_block: int
    pulled_seq: int
    rewind_seq: int
    rows_before: int
    rows_indexed: int


@dataclass(frozen=True)
class Chunk:
    """Rows of blocks [start, end) read in one snapshot, and where the checkpoint goes once indexed."""

    state: TableState
    start: int
    end: int
    rows: list[tuple]
    rewind_seq: int
    rows_before: int  # rows in blocks < start


_STATE_SQL = """
SELECT t.table_name, t.day, t.hi_block, t.seq, t.rows, t.committed_at,
       coalesce(c.next_block, 0), coalesce(c.seq, 0), coalesce(c.rewind_seq, 0),
       coalesce(c.rows_before, 0), coalesce(c.rows_indexed, 0)
  FROM audit.tables t LEFT JOIN audit.pull_checkpoints c USING (table_name)
 WHERE t.log_schema = %s {filter}
 ORDER BY t.day, t.shard
"""
_PENDING = (
    " AND (c.seq IS NULL OR c.seq < t.seq OR EXISTS ("
    "SELECT 1 FROM audit.table_rewinds r WHERE r.table_name = t.table_name AND r.seq > c.rewind_seq))"
)


class CtidPuller:
    """Pulls the tables of one audit log into Elasticsearch; see the module docstring for the guarantees."""

    def __init__(
        self,
        conninfo: str,
        es: Elasticsearch,
        settings: AuditSettings,
        *,
        report_interval_s: float = 10.0,
        heartbeat_file: str = "",
        metrics_refresh_s: float = 5.0,
    ) -> None:
        self.conninfo, self.es, self.settings = conninfo, es, settings
        self.report_interval_s, self.heartbeat_file = report_interval_s, heartbeat_file
        self.metrics_refresh_s = metrics_refresh_s  # how often the backlog gauges are set
        self.running = True
        self._conn: psycopg.Connection | None = None
        # Per table, the writer's (seq, commit time) as seen at each pass, from the oldest unindexed on.
        self._seen: dict[str, deque[tuple[int, datetime]]] = {}
        self.totals = {"documents": 0, "bulks": 0, "retries": 0, "rewinds": 0, "stripped": 0}
        self._totals_lock = threading.Lock()  # the shipper threads count too
        # Bulk requests are sent from these threads (AUDIT_PULL_REQUESTS at once) while this one reads.
        self._shipper = ThreadPoolExecutor(max_workers=settings.pull_requests, thread_name_prefix="bulk")

    @property
    def conn(self) -> psycopg.Connection:
        """The puller's connection (autocommit; reads open their own snapshot), reopened after a failure."""
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.conninfo, autocommit=True)
        return self._conn

    def run(self) -> None:
        """Pull until SIGTERM/SIGINT; back off while PostgreSQL or Elasticsearch is unavailable."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())
        log.info("puller started", schema=self.settings.schema_name, index_prefix=self.settings.index_prefix)
        self._apply_templates()
        failures = 0
        next_report = next_retention = next_lag = time.monotonic()
        try:
            while self.running:
                self._beat()
                try:
                    rows = self.pull_once()
                    now = time.monotonic()
                    if self.settings.retention_interval_s and now >= next_retention:
                        self.run_retention()
                        next_retention = now + self.settings.retention_interval_s
                    if now >= next_report:
                        self.report()
                        next_report = now + self.report_interval_s
                    elif now >= next_lag:
                        self.lag()  # sets the backlog gauges, as report() does
                        next_lag = now + self.metrics_refresh_s
                    failures = 0
                except (psycopg.Error, TransportError, ApiError, StreamviewsError) as e:
                    failures += 1
                    self._count(retries=1)
                    self._close_conn()
                    delay = min(0.5 * 2**failures, self.settings.max_backoff_s)
                    log.warning("pull failed; retrying", error=str(e), retry_in_s=delay)
                    self._sleep(delay)
                    continue
                if rows < MIN_PASS_ROWS:
                    self._sleep(self.settings.pull_idle_s)  # caught up, or nearly: let rows gather
        finally:
            self._shipper.shutdown()
            self._close_conn()
            log.info("puller stopped", **self.totals)

    def _count(self, **deltas: int) -> None:
        with self._totals_lock:
            for key, delta in deltas.items():
                self.totals[key] += delta

    def stop(self) -> None:
        """Finish the requests in flight (or give up a retry wait) and stop."""
        self.running = False

    def pull_once(self) -> int:
        """One pass: one chunk of each table with unindexed rows; returns the rows read.

        One chunk per table and pass, round robin: a table with a backlog does not hold back the rows
        that just arrived in another, and passes stay short, so lag reports and retention come on
        time. Chunks go to Elasticsearch in bulk requests of at least MIN_BULK_ROWS rows (a trickle
        makes one request per pass, not one per table), sent by AUDIT_PULL_REQUESTS threads at once
        while the next chunks are read: Elasticsearch indexes requests in parallel and is not left
        idle while PostgreSQL is read. A table has one chunk per pass, so requests in flight never
        share a row. Each chunk's checkpoint moves only after its own request was acknowledged, and
        the pass waits for every request before it ends, so retention never runs beside one.
        """
        shipped: list[tuple[list[Chunk], Future[None]]] = []
        group: list[Chunk] = []
        with retention.pass_lock(self.conn, self.settings.schema_name):
            try:
                pending = self.tables(pending_only=True)
                self._observe(pending)
                for state in pending:
                    if not self.running:
                        break
                    chunk = self.read_chunk(state.table)
                    if chunk is not None:
                        group.append(chunk)
                    if sum(len(c.rows) for c in group) >= MIN_BULK_ROWS:
                        shipped.append((group, self._shipper.submit(self.index, group)))
                        group = []
                if group and self.running:
                    shipped.append((group, self._shipper.submit(self.index, group)))
                self._settle(shipped)
            finally:
                # Even a failed pass leaves no request in flight once it lets go of the lock.
                wait([future for _, future in shipped])
        return sum(len(chunk.rows) for chunks, _ in shipped for chunk in chunks)

    def _settle(self, shipped: list[tuple[list[Chunk], Future[None]]]) -> None:
        """Advance the checkpoint of every acknowledged chunk, in order; then raise the first failure."""
        failure: BaseException | None = None
        for chunks, future in shipped:
            error = future.exception()
            if error is not None:
                failure = failure or error
                continue
            for chunk in chunks:
                self.advance(chunk)
        if failure is not None:
            raise failure

    def tables(self, *, pending_only: bool = False) -> list[TableState]:
        """The log's tables with their checkpoints (only those with unindexed rows, if asked)."""
        query = _STATE_SQL.format(filter=_PENDING if pending_only else "")
        rows = self.conn.execute(query, (self.settings.schema_name,)).fetchall()
        return [TableState(*row) for row in rows]

    def read_chunk(self, table: str) -> Chunk | None:
        """The next chunk of a table, read in one REPEATABLE READ snapshot; None when caught up or gone."""
        conn = self.conn
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        try:
            with conn.transaction():
                conn.execute("SET TRANSACTION READ ONLY")
                query = _STATE_SQL.format(filter="AND t.table_name = %s")
                row = conn.execute(query, (self.settings.schema_name, table)).fetchone()
                if row is None:
                    return None  # dropped by retention
                state = TableState(*row)
                rewind_block, rewind_seq = conn.execute(
                    "SELECT min(block), max(seq) FROM audit.table_rewinds WHERE table_name = %s AND seq > %s",
                    (table, state.rewind_seq),
                ).fetchone()
                if state.pulled_seq == state.seq and rewind_block is None:
                    return None
                start, rows_before = state.next_block, state.rows_before
                if rewind_block is not None and rewind_block < start:
                    start = rewind_block
                    rows_before = self._count_rows(conn, table, 0, start)
                    self._count(rewinds=1)
                    log.info("rewind", table=table, from_block=state.next_block, to_block=start)
                end = min(start + self.settings.pull_blocks, state.hi_block + 1)
                rows = self._read_rows(conn, table, start, end)
        finally:
            conn.isolation_level = None
        return Chunk(state, start, end, rows, max(state.rewind_seq, rewind_seq or 0), rows_before)

    def index(self, chunks: list[Chunk]) -> None:
        """Bulk-index the chunks' rows; returns only once Elasticsearch acknowledged every document."""
        docs: dict[str, tuple[str, dict]] = {}  # id -> (index, document)
        for chunk in chunks:
            table = chunk.state.table
            index = elastic.index_name(self.settings.index_prefix, chunk.state.day)
            for block, offset, *row in chunk.rows:
                docs[f"{table}:{block}:{offset}"] = (index, document(table, block, offset, row))
        delay = 0.5
        while docs:
            try:
                failed = bulk.send(self.es, docs, self._count)
            except TransportError as e:
                failed, reason = docs, f"{type(e).__name__}: {e}"
            else:
                reason = "some documents were not acknowledged"
            self._count(documents=len(docs) - len(failed), bulks=1)
            metrics.PULLER_ROWS_INDEXED.inc(len(docs) - len(failed))
            docs = failed
            if docs:
                if not self.running:
                    raise PullerError(f"stopping with {len(docs)} documents unacknowledged")
                self._count(retries=1)
                log.warning("bulk not acknowledged; retrying", pending=len(docs), error=reason, retry_in_s=delay)
                self._sleep(delay)
                delay = min(delay * 2, self.settings.max_backoff_s)

    def advance(self, chunk: Chunk) -> bool:
        """Store the checkpoint after the chunk; True when the table is caught up with the snapshot's ledger."""
        state = chunk.state
        at_top = chunk.end > state.hi_block
        last_block = [r for r in chunk.rows if r[0] == state.hi_block] if at_top else []
        full_rows = len(chunk.rows) - len(last_block)
        next_block = state.hi_block if at_top else chunk.end
        rows_before = chunk.rows_before + full_rows
        self.conn.execute(
            "INSERT INTO audit.pull_checkpoints AS c"
            " (table_name, next_block, seq, rewind_seq, rows_before, rows_indexed, synced_commit_at, updated_at)"
            " SELECT %(table)s, %(next_block)s, %(seq)s, %(rewind_seq)s, %(rows_before)s, %(rows_indexed)s,"
            "        t.committed_at, now()"
            "   FROM audit.tables t WHERE t.table_name = %(table)s"
            " ON CONFLICT (table_name) DO UPDATE SET next_block = excluded.next_block, seq = excluded.seq,"
            "   rewind_seq = excluded.rewind_seq, rows_before = excluded.rows_before,"
            "   rows_indexed = excluded.rows_indexed,"
            "   synced_commit_at = CASE WHEN %(at_top)s THEN excluded.synced_commit_at ELSE c.synced_commit_at END,"
            "   updated_at = now()",
            {
                "table": state.table,
                "next_block": next_block,
                "seq": state.seq if at_top else state.pulled_seq,
                "rewind_seq": chunk.rewind_seq,
                "rows_before": rows_before,
                "rows_indexed": rows_before + len(last_block),
                "at_top": at_top,
            },
        )
        return at_top

    def lag(self) -> dict[str, float | int]:
        """Rows written but not yet indexed, and for how long the oldest unindexed batch has waited.

        The wait is measured from that batch's commit as this process observed it (each pass reads
        the ledger, so within one pass); just after a start, the first batch seen is the oldest.
        The backlog gauges of the service's metrics are set to these figures.
        """
        states = self.tables()
        for gone in self._seen.keys() - {s.table for s in states}:
            del self._seen[gone]  # dropped by retention
        now = self._observe(states)
        behind = sum(max(s.rows - s.rows_indexed, 0) for s in states)
        waits = [(now - seen[0][1]).total_seconds() for seen in self._seen.values() if seen]
        seconds = round(max(waits, default=0.0), 3)
        metrics.set_puller_backlog(behind, seconds)
        return {"tables": len(states), "rows_behind": behind, "seconds_behind": seconds}

    def _observe(self, states: list[TableState]) -> datetime:
        """Remember each table's newest batch; forget the batches indexed since. Returns the database's now."""
        for state in states:
            seen = self._seen.setdefault(state.table, deque())
            if state.seq > state.pulled_seq and state.committed_at and (not seen or seen[-1][0] < state.seq):
                seen.append((state.seq, state.committed_at))
            while seen and seen[0][0] <= state.pulled_seq:
                seen.popleft()
        return self.conn.execute("SELECT clock_timestamp()").fetchone()[0]

    def report(self) -> None:
        """Log progress and lag (the service's metrics)."""
        log.info("progress", **self.totals, **self.lag())

    def run_retention(self) -> None:
        """Drop tables past retention and their indices, between chunks (never during a bulk request)."""
        retention.run(self.conn, self.es, self.settings, self.settings.retention_days)

    def _read_rows(self, conn: psycopg.Connection, table: str, start: int, end: int) -> list[tuple]:
        # A TID range scan: only the blocks asked for are read, in physical order.
        query = sql.SQL(
            "SELECT audit.block_of(ctid), (ctid::text::point)[1]::int, ts, uid, content, fields FROM {}"
            " WHERE ctid >= %s::tid AND ctid < %s::tid"
        ).format(_identifier(table))
        return conn.execute(query, (f"({start},0)", f"({end},0)")).fetchall()

    def _count_rows(self, conn: psycopg.Connection, table: str, start: int, end: int) -> int:
        query = sql.SQL("SELECT count(*) FROM {} WHERE ctid >= %s::tid AND ctid < %s::tid").format(_identifier(table))
        return conn.execute(query, (f"({start},0)", f"({end},0)")).fetchone()[0]

    def _apply_templates(self) -> None:
        # Before the first document: a template applies to indices created after it.
        delay = 1.0
        while self.running:
            try:
                elastic.apply_index_templates(self.es)
                return
            except (TransportError, ApiError, elastic.ElasticError) as e:
                log.warning("cannot apply index templates yet; retrying", error=str(e), retry_in_s=delay)
                self._sleep(delay)
                delay = min(delay * 2, self.settings.max_backoff_s)

    def _beat(self) -> None:
        if self.heartbeat_file:
            Path(self.heartbeat_file).touch()

    def _sleep(self, seconds: float) -> None:
        # In short steps, so SIGTERM during a long back-off is honoured promptly.
        deadline = time.monotonic() + seconds
        while self.running and time.monotonic() < deadline:
            self._beat()
            time.sleep(min(0.2, max(deadline - time.monotonic(), 0)))

    def _close_conn(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _identifier(table: str) -> sql.Composable:
    schema, name = table.split(".")
    return sql.Identifier(schema, name)


def main(argv: list[str] | None = None) -> int:
    """Entry point: `python -m pipelines.audit.puller`."""
    if argv:
        print("usage: python -m pipelines.audit.puller (settings come from the environment)", file=sys.stderr)
        return 2
    configure_logging()
    audit, es_settings, postgres = AuditSettings(), ElasticsearchSettings(), PostgresSettings()
    pipeline, metrics_settings = PipelineSettings(), MetricsSettings()
    log.info(
        "settings",
        audit=audit.describe(),
        elasticsearch=es_settings.describe(),
        postgres=postgres.describe(),
        metrics=metrics_settings.describe(),
    )
    metrics.serve(metrics_settings, "ctid_puller", metrics.PULLER_FAMILIES)
    tune_for_batches()
    with elastic.client(es_settings) as es:
        CtidPuller(
            postgres.conninfo(),
            es,
            audit,
            report_interval_s=pipeline.report_interval_s,
            heartbeat_file=pipeline.heartbeat_file,
            metrics_refresh_s=metrics_settings.refresh_s,
        ).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
