"""Applying a batch of stream changes to the stream's state and every view of it.

It runs inside the caller's transaction. For a keyed stream, one statement turns the batch into
deltas against the stream's state (in a temporary table), then one upsert per view reads them. An
append-only stream has no state to check against: each view's upsert aggregates the batch straight
from its array parameters, and only the columns some view reads are sent.

The caller (the Checkpoint) owns the transaction, so the view updates commit together with the Kafka
offsets they came from, or not at all. What the batch runs is the stream's plan (pipelines.cv.plans),
compiled again whenever the stream's plan version moves.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

import psycopg
from psycopg import sql

from pipelines.cv import catalog
from pipelines.cv.apply_errors import (
    StreamDropped,
    StreamRedefined,
    TransformApplyError,
    ViewApplyError,
)
from pipelines.cv.model import StreamDef
from pipelines.cv.plans import Plan, ViewStatements, compile_plan, view_statements
from pipelines.cv.sqltext import arrays
from pipelines.cv.views import compiler, stream_sql
from pipelines.logs import get_logger

log = get_logger("cv.engine")


# A keyed stream's views aggregate its deltas from a temporary table without statistics: the
# planner expects 200 groups, picks hash aggregation, and with tens of thousands of groups holding
# large transition states (hll, arrays) the hash table spills to disk in every batch. Sorting the
# batch instead costs little at PIPELINE_BATCH_MAX rows and feeds each upsert in key order, so the
# view's index is walked in order too. Measured on one 50,000-like batch against 20M likes held
# (EXPLAIN ANALYZE of one rolled-back batch): object_likes 11.4 -> 9.0 us a like, hourly 19.5 -> 12.5.
# The statement that turns the batch into deltas runs with it too: its batch keys then look up the
# state's primary key in key order (a sort and a unique) rather than in hash order, so consecutive
# lookups descend into neighbouring pages: 17-20 -> 15-16 us a like on the same kept state.
# It is set within the batch's transaction only (set_config(..., true)) and restored after.
SORTED_AGGREGATION = "SELECT current_setting('enable_hashagg'), set_config('enable_hashagg', 'off', true)"


@dataclass
class StreamMaintainer:
    """Keeps one stream's views up to date, batch by batch."""

    stream_name: str
    backfilling: str | None = None  # a backfill's catch-up: its plan maintains that one view (plans.compile_plan)
    _plan: Plan | None = None
    _plan_created: datetime | None = None  # the stream's created_at when the plan was compiled
    _sessions_ready: set[int] = field(default_factory=set)

    def apply(
        self,
        conn: psycopg.Connection,
        ops: Sequence[int],
        columns: Sequence[Sequence[object]],
        decoded_as: tuple[str, ...] | None = None,
    ) -> int:
        """Apply a batch in the current transaction; returns the number of deltas (real changes).

        `ops` holds +1 (insert) or -1 (delete) per change, `columns` one sequence per stream column,
        all in batch order: for one key, the last change wins.
        `decoded_as`: the column names the batch was decoded for, when known; a batch of other
        columns than the stream's now raises StreamRedefined.
        """
        plan = self._begin(conn)
        stream_columns = plan.stream.columns
        if len(columns) != len(stream_columns) or decoded_as not in (None, plan.stream.column_names):
            raise StreamRedefined(f"stream {self.stream_name}: the batch was decoded for its columns before a change")
        if plan.to_deltas is not None:
            literals = [arrays.ops_literal(ops), *arrays.column_literals(columns, stream_columns)]
            return self._run(conn, plan, literals, [])
        shipped, deltas = _inserts_only(ops, [columns[i] for i in plan.shipped])
        params = arrays.column_literals(shipped, [stream_columns[i] for i in plan.shipped])
        return self._run(conn, plan, None, params, deltas)

    def planned_views(self, conn: psycopg.Connection) -> frozenset[str]:
        """The views a batch applied now would maintain (quarantined ones left out), under the stream's lock."""
        return frozenset(c.view.qualified_name for c in self._begin(conn).views)

    def apply_feed(self, conn: psycopg.Connection, after: int, upto: int) -> int:
        """Apply a feed stream's batch: its upstream view's changes after position `after` up to `upto`.

        The changes are read where they are recorded (cv.view_changes), in the same statement that
        applies them (for a view's rows: pipelines.cv.views.stream_sql.feed_to_deltas): nothing
        travels through Python.
        """
        plan = self._begin(conn)
        if not plan.stream.is_feed:
            raise ValueError(f"stream {self.stream_name} is not fed by a view")
        params: list[object] = [plan.stream.feed_of, after, upto]
        if plan.to_deltas is not None:
            return self._run(conn, plan, params, [])
        return self._run(conn, plan, None, params, upto - after)

    def _begin(self, conn: psycopg.Connection) -> Plan:
        """The stream's lock (shared), its plan, and the session's temporary tables."""
        catalog.lock_stream(conn, self.stream_name, shared=True)
        plan = self._current_plan(conn)
        session = conn.info.backend_pid
        if session not in self._sessions_ready:
            for statement in plan.temp_tables:
                conn.execute(statement)
            self._sessions_ready.add(session)
        return plan

    def _run(
        self,
        conn: psycopg.Connection,
        plan: Plan,
        delta_params: list[object] | None,
        params: list[object],
        deltas: int = 0,
    ) -> int:
        """The batch into deltas (keyed streams: `delta_params`), then each view's maintenance over them."""
        keyed = delta_params is not None
        rebuilt: frozenset[str] = frozenset()
        if keyed:
            previous = conn.execute(SORTED_AGGREGATION).fetchone()[0]
            if plan.stream.is_feed:
                deltas, broken = conn.execute(plan.to_deltas, delta_params).fetchone()
                if broken and plan.grown:
                    rebuilt = self._rebuild_grown(conn, plan, broken)
            else:
                deltas = conn.execute(plan.to_deltas, delta_params).rowcount
        spent: list[tuple[str, float]] = []  # (view, milliseconds), in name order
        if deltas:
            for statements in plan.per_view:
                if statements.view.qualified_name in rebuilt:
                    continue
                started = time.perf_counter()
                try:
                    _maintain(conn, statements, params)
                except psycopg.Error as e:
                    raise ViewApplyError(statements.view.qualified_name, e) from e
                spent.append((statements.view.qualified_name, (time.perf_counter() - started) * 1000))
            # Transforms after the views, in name order: every batch of the stream takes their position
            # rows in this one order, and only such batches take them, before any view's position row
            # at commit (which comes last in every writer's order): two runners cannot deadlock on them.
            for name, statement in plan.transforms:
                try:
                    conn.execute(statement, params)
                except psycopg.Error as e:
                    raise TransformApplyError(name, e) from e
        if keyed:
            conn.execute("SELECT set_config('enable_hashagg', %s, true)", (previous,))
        _count(conn, self.stream_name, deltas, spent)
        return deltas

    def _rebuild_grown(self, conn: psycopg.Connection, plan: Plan, broken: int) -> frozenset[str]:
        """The views that relied on the upstream's rows only growing, rebuilt from the feed's state.

        The state already holds the page's rows (to_deltas wrote them), so the rebuilt views are
        exact as of the page's end: its deltas are not applied to them again.
        """
        for compiled in plan.views:
            if compiled.view.qualified_name in plan.grown:
                try:
                    rebuild_from_state(conn, compiled, plan.stream)
                except psycopg.Error as e:
                    raise ViewApplyError(compiled.view.qualified_name, e) from e
        log.warning(
            "views rebuilt: the rows they read moved back",
            feed=plan.stream.name,
            upstream=plan.stream.feed_of,
            groups=broken,
            views=sorted(plan.grown),
        )
        return plan.grown

    def clear_batch(self, conn: psycopg.Connection) -> None:
        """Empty the batch's temporary tables, so that another apply in this transaction starts clean.

        They are emptied at every commit; a batch applied in parts (isolation) empties them between.
        """
        if self._plan is not None:
            for statement in self._plan.clear_tables:
                conn.execute(statement)

    def forget_sessions(self) -> None:
        """After a rollback: forget the temporary tables and the plan made in the rolled-back transaction.

        The tables are gone with it, and the plan may have seen catalog rows that never committed.
        """
        self._sessions_ready.clear()
        self._plan = None

    def expire(self, conn: psycopg.Connection) -> int:
        """Delete time buckets past each view's retention; returns the rows deleted."""
        catalog.lock_stream(conn, self.stream_name, shared=True)
        plan = self._current_plan(conn)
        deleted = 0
        for compiled in plan.views:
            for statement in compiler.expire(compiled.view, plan.stream):
                deleted += conn.execute(statement).rowcount
        return deleted

    def _current_plan(self, conn: psycopg.Connection) -> Plan:
        # The stream's own version (migration 0018): another stream's definition leaves this plan be.
        # With its creation time: a stream dropped and declared again starts its versions at 0 anew.
        row = conn.execute(
            "SELECT plan_version, created_at FROM cv.streams WHERE name = %s", (self.stream_name,)
        ).fetchone()
        if row is None:
            raise StreamDropped(f"stream {self.stream_name} is not defined (CREATE STREAM ...)")
        if self._plan is None or (self._plan.version, self._plan_created) != (row[0], row[1]):
            self._plan = compile_plan(conn, self.stream_name, row[0], backfilling=self.backfilling)
            self._plan_created = row[1]
            self._sessions_ready.clear()
        return self._plan


def probe_view(conn: psycopg.Connection, compiled: catalog.CompiledView, stream: StreamDef) -> None:
    """Run a view's maintenance over an empty batch, which changes nothing.

    It raises what any batch would meet: a table gone, a privilege revoked, a function missing.
    """
    view = compiled.view
    if stream.key is None:
        shipped = tuple(c.name for c in stream.columns)
        source: sql.Composable = stream_sql.batch_source(stream, shipped)
        params: list[object] = ["{}"] * len(shipped)
    else:
        conn.execute(stream_sql.create_delta_table(stream))
        source, params = stream_sql.delta_table(stream), []
    for statement in compiler.create_transitions_tables(view, stream, compiled.types):
        conn.execute(statement)
    _maintain(conn, view_statements(compiled, stream, source), params)


def rebuild_from_state(conn: psycopg.Connection, compiled: catalog.CompiledView, stream: StreamDef) -> None:
    """Recompute a view over a keyed stream from the stream's state.

    Its storage is emptied, then filled as a new view's is: exact whatever the view missed, since
    the state holds every live row.
    """
    for statement in compiler.reset_storage(compiled.view, stream):
        conn.execute(statement)
    for statement in compiler.backfill_from_state(compiled.view, stream, compiled.types):
        conn.execute(statement, ())


def _maintain(conn: psycopg.Connection, statements: ViewStatements, params: list[object]) -> None:
    """One view's statements over the batch: reference counts, the upsert, emptied rows, extremes."""
    for statement in statements.before:
        conn.execute(statement, params)
    cursor = conn.execute(statements.apply, params)
    if statements.returns_rows:
        emptied, kept = cursor.fetchone()
        if emptied:
            conn.execute(statements.delete_rows, (emptied,))
        if kept and statements.fix_extremes is not None:
            conn.execute(statements.fix_extremes, (kept,))
    for statement in statements.after:
        conn.execute(statement, ())


# Who counts in cv.view_stats and cv.stream_stats (migration 0028): one row per process and session
# (`<host>:<pid>:<backend pid>`), so that two writers (runners, or a runner's threads: its feeds,
# its backfills) never wait on each other's statistics row while they hold other locks.
RUNNER_ID = f"{socket.gethostname()}:{os.getpid()}"
_COUNT = sql.SQL(
    "WITH spent AS (SELECT * FROM unnest(%(views)s::text[], %(ms)s::float8[]) AS t(view, ms)),"
    " views AS (INSERT INTO cv.view_stats AS s (view, runner, executions, input_rows, exec_ms, last_update)"
    "  SELECT view, %(runner)s, 1, %(deltas)s, ms, now() FROM spent"
    "  ON CONFLICT (view, runner) DO UPDATE SET executions = s.executions + 1,"
    "   input_rows = s.input_rows + excluded.input_rows, exec_ms = s.exec_ms + excluded.exec_ms,"
    "   last_update = excluded.last_update)"
    " INSERT INTO cv.stream_stats AS s (stream, runner, input_batches, input_rows, last_update)"
    " VALUES (%(stream)s, %(runner)s, 1, %(rows)s, now())"
    " ON CONFLICT (stream, runner) DO UPDATE SET input_batches = s.input_batches + 1,"
    "  input_rows = s.input_rows + excluded.input_rows, last_update = excluded.last_update"
)


def _count(conn: psycopg.Connection, stream: str, deltas: int, spent: list[tuple[str, float]]) -> None:
    """The batch in the statistics PipelineDB users read in SQL (pipelinedb.query_stats, stream_stats).

    In the batch's own transaction: a batch rolled back counts nothing. One statement per stream.
    The rows counted are the batch's changes that took effect (for a keyed stream, after netting
    against its state): what the views read.
    """
    conn.execute(
        _COUNT,
        {
            "views": [view for view, _ in spent],
            "ms": [ms for _, ms in spent],
            "runner": f"{RUNNER_ID}:{conn.info.backend_pid}",
            "deltas": deltas,
            "stream": stream,
            "rows": deltas,
        },
    )


def _inserts_only(ops: Sequence[int], columns: list[Sequence[object]]) -> tuple[list[Sequence[object]], int]:
    """An append-only stream's batch: a delete has no row to take away, so it is dropped."""
    if -1 not in ops:  # a scan in C; deletes are rare on append-only streams
        return columns, len(ops)
    keep = [i for i, op in enumerate(ops) if op == 1]
    return [[c[i] for i in keep] for c in columns], len(keep)
