"""A stream's maintenance plan: every statement a batch of it runs, compiled from the catalog once per version.

A plan follows the stream's own version (cv.streams.plan_version, migration 0018): a definition,
drop or quarantine that touches the stream moves it, and the engine (pipelines.cv.engine) compiles
the plan again. For a keyed stream, the plan turns the batch into deltas first (against the state,
or for a view read as a stream, against the feed's state: pipelines.cv.views.stream_sql); for an
append-only one, each view reads the batch's arrays. Then one set of statements per view, in name order.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

from pipelines.cv import catalog
from pipelines.cv.apply_errors import StreamDropped
from pipelines.cv.catalog import change_streams
from pipelines.cv.catalog.transforms import load_transforms
from pipelines.cv.frontend.combine import is_states_feed
from pipelines.cv.model import StreamDef, ViewDef
from pipelines.cv.views import change_capture, compiler, growth, refs, stream_sql
from pipelines.cv.views import transforms as transform_sql
from pipelines.logs import get_logger

log = get_logger("cv.engine")


@dataclass(frozen=True)
class ViewStatements:
    """One view's maintenance: reference counts first, then the upsert, then cleanup."""

    view: ViewDef
    before: tuple[sql.Composed, ...]
    apply: sql.Composed
    after: tuple[sql.Composed, ...]
    delete_rows: sql.Composed
    returns_rows: bool  # apply returns (emptied, kept) ctids
    fix_extremes: sql.Composed | None  # min/max over a keyed stream, for the kept rows


@dataclass(frozen=True)
class Plan:
    """The compiled statements for one stream at one catalog version."""

    version: int
    stream: StreamDef
    views: tuple[catalog.CompiledView, ...]
    to_deltas: sql.Composed | None  # keyed streams; None: the views read the batch itself
    per_view: tuple[ViewStatements, ...]
    temp_tables: tuple[sql.Composed, ...]
    shipped: tuple[int, ...] = ()  # append-only streams: the columns the views read, by position
    clear_tables: tuple[sql.Composed, ...] = ()  # empty the batch's temporary tables (before a next apply)
    quarantined: frozenset[str] = frozenset()  # views left out (cv.view_failures)
    transforms: tuple[tuple[str, sql.Composed], ...] = ()  # (name, its statement), in name order
    # A rows feed's views whose min/max rely on the upstream's rows only growing (views.growth): a
    # page that breaks that (to_deltas counts it) rebuilds them from the feed's state instead.
    grown: frozenset[str] = frozenset()


def compile_plan(conn: psycopg.Connection, stream_name: str, version: int, *, backfilling: str | None = None) -> Plan:
    """The plan of stream `stream_name` at its plan version `version`: its views' statements, compiled once.

    The views a backfill still catches up on alone (not joined to the live runner yet, migration
    0050) are left out, as quarantined ones are. `backfilling`: the plan of that backfill's
    catch-up instead, which maintains that one view (unless quarantined) and runs no transform.
    """
    streams = declared_streams(conn)
    stream = streams.get(stream_name)
    if stream is None:
        raise StreamDropped(f"stream {stream_name} is not defined (CREATE STREAM ...)")
    quarantined = frozenset(
        name for (name,) in conn.execute("SELECT view FROM cv.view_failures WHERE stream = %s", (stream.name,))
    )
    loaded = catalog.load_views(conn, streams, stream.name)
    alone: frozenset[str] = frozenset()  # backfills catching up before the live runner takes their views in
    if backfilling is None:
        alone = frozenset(
            name
            for (name,) in conn.execute(
                "SELECT view FROM cv.backfills WHERE stream = %s AND joined_at IS NULL AND done_at IS NULL",
                (stream.name,),
            )
        )
        left_out = quarantined | alone
    else:  # every view but that one
        left_out = quarantined | {c.view.qualified_name for c in loaded if c.view.qualified_name != backfilling}
    views = tuple(c for c in loaded if c.view.qualified_name not in left_out)
    shipped: tuple[int, ...] = ()
    if stream.key is None:
        transforms = load_transforms(conn, streams, stream.name) if backfilling is None else []  # append-only (0026)
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
        per_view.append(view_statements(compiled, stream, source))
    log.info(
        "stream plan loaded",
        stream=stream.name,
        plan_version=version,
        views=[c.view.qualified_name for c in views],
        quarantined=sorted(quarantined),
        catching_up_alone=sorted(alone),
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
    return Plan(
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


def view_statements(compiled: catalog.CompiledView, stream: StreamDef, source: sql.Composable) -> ViewStatements:
    """One view's statements over the batch in `source`: what `engine._maintain` runs, in order."""
    view = compiled.view
    return ViewStatements(
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
