"""Applying a batch of stream changes to the stream's state and every view of it.

It runs inside the caller's transaction. For a keyed stream, one statement turns the batch into
deltas against the stream's state (in a temporary table), then one upsert per view reads them. An
append-only stream has no state to check against: each view's upsert aggregates the batch straight
from its array parameters, and only the columns some view reads are sent.

The caller (the Checkpoint) owns the transaction, so the view updates commit together with the Kafka
offsets they came from, or not at all.
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
from pipelines.cv.catalog import change_streams
from pipelines.cv.catalog.transforms import load_transforms
from pipelines.cv.frontend.combine import is_states_feed
from pipelines.cv.model import StreamDef, ViewDef
from pipelines.cv.sqltext import arrays
from pipelines.cv.views import change_capture, compiler, growth, refs, stream_sql
from pipelines.cv.views import transforms as transform_sql
from pipelines.errors import StreamviewsError
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


class StreamDropped(StreamviewsError):
    """The stream is no longer in the catalog: a batch read before its DROP has nowhere to go."""


class StreamRedefined(StreamviewsError):
    """The batch was decoded for other columns than the stream has now (ALTER STREAM ADD/DROP COLUMN).

    Transient: the batch is rolled back and read again once the runner decodes with the new declaration.
    """

    transient = True


class ViewApplyError(StreamviewsError):
    """One view's maintenance failed: which view, and the error (PostgreSQL's, as `__cause__`)."""

    def __init__(self, view: str, error: Exception) -> None:
        super().__init__(f"view {view}: {describe_error(error)}")
        self.view = view
        self.error = error
        self.__cause__ = error


class TransformApplyError(StreamviewsError):
    """A transform's statement failed: which transform, and PostgreSQL's error (as `__cause__`).

    Not a ViewApplyError: a transform is never quarantined. Its output is a stream others read
    exactly once, so when it cannot run whatever the events (a table gone) isolation holds its
    stream back; an event it fails on (a division by zero) is dead-lettered.
    """

    def __init__(self, transform: str, error: psycopg.Error) -> None:
        super().__init__(f"transform {transform}: {describe_error(error)}")
        self.sqlstate = error.sqlstate
        self.__cause__ = error


def describe_error(error: BaseException) -> str:
    """An error in one line: PostgreSQL's SQLSTATE and primary message, or the Python exception."""
    state = getattr(error, "sqlstate", None)
    if state:
        diag = getattr(error, "diag", None)
        message = (diag.message_primary if diag is not None else None) or str(error)
        return f"SQLSTATE {state}: {message.strip()}"
    return f"{type(error).__name__}: {str(error).strip()}"


@dataclass(frozen=True)
class _ViewStatements:
    """One view's maintenance: reference counts first, then the upsert, then cleanup."""

    view: ViewDef
    before: tuple[sql.Composed, ...]
    apply: sql.Composed
    after: tuple[sql.Composed, ...]
    delete_rows: sql.Composed
    returns_rows: bool  # apply returns (emptied, kept) ctids
    fix_extremes: sql.Composed | None  # min/max over a keyed stream, for the kept rows


@dataclass(frozen=True)
class _Plan:
    """The compiled statements for one stream at one catalog version."""

    version: int
    stream: StreamDef
    views: tuple[catalog.CompiledView, ...]
    to_deltas: sql.Composed | None  # keyed streams; None: the views read the batch itself
    per_view: tuple[_ViewStatements, ...]
    temp_tables: tuple[sql.Composed, ...]
    shipped: tuple[int, ...] = ()  # append-only streams: the columns the views read, by position
    clear_tables: tuple[sql.Composed, ...] = ()  # empty the batch's temporary tables (before a next apply)
    quarantined: frozenset[str] = frozenset()  # views left out (cv.view_failures)
    transforms: tuple[tuple[str, sql.Composed], ...] = ()  # (name, its statement), in name order
    # A rows feed's views whose min/max rely on the upstream's rows only growing (views.growth): a
    # page that breaks that (to_deltas counts it) rebuilds them from the feed's state instead.
    grown: frozenset[str] = frozenset()


@dataclass
class StreamMaintainer:
    """Keeps one stream's views up to date, batch by batch."""

    stream_name: str
    _plan: _Plan | None = None
    _plan_created: datetime | None = None  # the stream's created_at when the plan was compiled
    _sessions_ready: set[int] = field(default_factory=set)

    def apply(
        self,
        conn: psycopg.Connection,
        ops: Sequence[int],
        columns: Sequence[Sequence[object]],
        only: frozenset[str] | None = None,
        decoded_as: tuple[str, ...] | None = None,
    ) -> int:
        """Apply a batch in the current transaction; returns the number of deltas (real changes).

        `ops` holds +1 (insert) or -1 (delete) per change, `columns` one sequence per stream column,
        all in batch order: for one key, the last change wins. `only`: apply it to these views alone,
        no transform (a view's backfill from history, pipelines/cv/backfill.py; append-only streams).
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
        return self._run(conn, plan, None, params, deltas, only)

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

    def _begin(self, conn: psycopg.Connection) -> _Plan:
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
        plan: _Plan,
        delta_params: list[object] | None,
        params: list[object],
        deltas: int = 0,
        only: frozenset[str] | None = None,
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
                if only is not None and statements.view.qualified_name not in only:
                    continue
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
            for name, statement in plan.transforms if only is None else ():
                try:
                    conn.execute(statement, params)
                except psycopg.Error as e:
                    raise TransformApplyError(name, e) from e
        if keyed:
            conn.execute("SELECT set_config('enable_hashagg', %s, true)", (previous,))
        _count(conn, self.stream_name, deltas, spent)
        return deltas

    def _rebuild_grown(self, conn: psycopg.Connection, plan: _Plan, broken: int) -> frozenset[str]:
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

    def _current_plan(self, conn: psycopg.Connection) -> _Plan:
        # The stream's own version (migration 0018): another stream's definition leaves this plan be.
        # With its creation time: a stream dropped and declared again starts its versions at 0 anew.
        row = conn.execute(
            "SELECT plan_version, created_at FROM cv.streams WHERE name = %s", (self.stream_name,)
        ).fetchone()
        if row is None:
            raise StreamDropped(f"stream {self.stream_name} is not defined (CREATE STREAM ...)")
        if self._plan is None or (self._plan.version, self._plan_created) != (row[0], row[1]):
            self._plan = self._compile(conn, row[0])
            self._plan_created = row[1]
            self._sessions_ready.clear()
        return self._plan

    def _compile(self, conn: psycopg.Connection, version: int) -> _Plan:
        streams = declared_streams(conn)
        stream = streams.get(self.stream_name)
        if stream is None:
            raise StreamDropped(f"stream {self.stream_name} is not defined (CREATE STREAM ...)")
        quarantined = frozenset(
            name for (name,) in conn.execute("SELECT view FROM cv.view_failures WHERE stream = %s", (stream.name,))
        )
        loaded = catalog.load_views(conn, streams, stream.name)
        views = tuple(c for c in loaded if c.view.qualified_name not in quarantined)
        shipped: tuple[int, ...] = ()
        if stream.key is None:
            transforms = load_transforms(conn, streams, stream.name)  # append-only streams only (0026)
            read = set().union(
                *(stream_sql.referenced_columns(c.view) for c in views),
                *(transform_sql.referenced_columns(t) for t in transforms),
            )
            shipped = tuple(i for i, c in enumerate(stream.columns) if c.name in read) or (0,)
            source = stream_sql.batch_source(stream, tuple(stream.columns[i].name for i in shipped))
            if stream.feeds_changes:  # output_of: the views read the upstream's changes where they are recorded
                source = stream_sql.changes_source(stream)
            elif stream.feeds_appends:  # a transform's rows, read where they are recorded
                source = stream_sql.appends_source(stream)
            recorded = tuple(
                (t.qualified_name, transform_sql.record(t, stream, tuple(stream.columns[i].name for i in shipped)))
                for t in transforms
            )
            temp_tables = []
            clear_tables = []
        else:
            recorded = ()
            source = stream_sql.delta_table(stream)
            # Made again with each plan: after ADD/DROP COLUMN the session's table has the old columns.
            temp_tables = [sql.SQL("DROP TABLE IF EXISTS {}").format(source), stream_sql.create_delta_table(stream)]
            clear_tables = [sql.SQL("DELETE FROM {}").format(source)]
        per_view = []
        for compiled in views:
            view = compiled.view
            temp_tables += compiler.create_transitions_tables(view, stream, compiled.types)
            clear_tables += [sql.SQL("DELETE FROM {}").format(t) for t in refs.transitions_tables(view, stream)]
            per_view.append(_view_statements(compiled, stream, source))
        log.info(
            "stream plan loaded",
            stream=stream.name,
            plan_version=version,
            views=[c.view.qualified_name for c in views],
            quarantined=sorted(quarantined),
            transforms=[name for name, _ in recorded],
        )
        to_deltas = None
        grown = frozenset(c.view.qualified_name for c in views if growth.grown_extremes(c.view, stream))
        if stream.key is not None:  # a view's rows read as a stream: its changes are already effective
            guarded = growth.guarded_columns([c.view for c in views], stream)
            to_deltas = (
                stream_sql.feed_to_deltas(stream, _states_now(conn, stream), guarded)
                if stream.is_feed
                else stream_sql.batch_to_deltas(stream)
            )
        return _Plan(
            version,
            stream,
            views,
            to_deltas,
            tuple(per_view),
            tuple(temp_tables),
            shipped,
            tuple(clear_tables),
            quarantined,
            recorded,
            grown,
        )


def _states_now(conn: psycopg.Connection, stream: StreamDef) -> sql.Composed | None:
    """A combine() reader's feed: how it reads its upstream's rows with their stored states (None: another feed)."""
    if not is_states_feed(stream):
        return None
    assert stream.feed_of is not None
    upstream = change_streams.source_of(conn, stream.feed_of, catalog.store.scope(conn))
    if upstream is None or upstream.view is None:
        raise StreamDropped(f"stream {stream.name}: the view it reads, {stream.feed_of}, is not defined")
    view, types = upstream.view.view, upstream.view.types
    return change_capture.states_now(stream, view, types, catalog.store.keeps_refs(conn, view))


def declared_streams(conn: psycopg.Connection) -> dict[str, StreamDef]:
    """Every declared stream, parsed once per catalog state for the whole process (catalog.load_streams).

    A stored definition that no longer parses is that stream's problem: it is left out.
    """
    return catalog.load_streams(conn, skip_broken=True)


def _view_statements(compiled: catalog.CompiledView, stream: StreamDef, source: sql.Composable) -> _ViewStatements:
    view = compiled.view
    return _ViewStatements(
        view=view,
        before=(
            *compiler.update_extreme_counts(view, stream, source),
            *compiler.update_all_refs(view, stream, source),
        ),
        apply=compiler.apply_deltas(view, stream, source, compiled.types.states),
        after=tuple(refs.drop_all_dead_refs(view, stream)),
        delete_rows=compiler.delete_rows(view),
        returns_rows=compiler.returns_rows(view, stream),
        fix_extremes=compiler.fix_extremes(view, stream),
    )


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
    _maintain(conn, _view_statements(compiled, stream, source), params)


def rebuild_from_state(conn: psycopg.Connection, compiled: catalog.CompiledView, stream: StreamDef) -> None:
    """Recompute a view over a keyed stream from the stream's state.

    Its storage is emptied, then filled as a new view's is: exact whatever the view missed, since
    the state holds every live row.
    """
    for statement in compiler.reset_storage(compiled.view, stream):
        conn.execute(statement)
    for statement in compiler.backfill_from_state(compiled.view, stream, compiled.types):
        conn.execute(statement, ())


def _maintain(conn: psycopg.Connection, statements: _ViewStatements, params: list[object]) -> None:
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
