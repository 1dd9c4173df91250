"""Continuous views in the catalog: created, replaced, altered and dropped, in the caller's transaction.

Every change holds the stream's lock exclusively (pipelines hold it shared while they apply a
batch), so a change on a running system misses no batch and counts none twice:

- CREATE creates the storage and the read view and, over a keyed stream, backfills the storage from
  the stream's current state. Over an append-only stream it records a backfill from the topic's
  retained history (pipelines.cv.catalog.backfills; `WITH (backfill = ...)`), caught up by the runner.
- CREATE OR REPLACE with the same storage (groups, stored aggregates, filter, join and window the
  same: only the outputs computed from them differ) replaces the read view alone. Otherwise it
  rebuilds the view from the keyed stream's state, or over an append-only stream from the topic's
  retained history (refused with backfill = 'none').
- ALTER CONTINUOUS VIEW ... SET (ttl = ...) changes the retention, DROP removes everything the view
  made: its read view, its tables, and the aggregates kept for a user aggregate no other view keeps.

Locks are taken in pipelines.cv.catalog.locks' order: a view's read view first (only readers wait for it,
and it waits for them), then the stream's lock, then its tables, each wait bounded; a reader that
holds the view open delays the change, which then fails naming it, never the stream's ingestion.
"""

from __future__ import annotations

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from pipelines.cv.catalog import backfills, change_streams, store, view_feeds
from pipelines.cv.catalog.locks import Outcome, drop_read_view, lock_stream_for_change, lock_tables
from pipelines.cv.catalog.stream_types import check_groupable
from pipelines.cv.catalog.view_checks import check_ttl, check_units, check_window
from pipelines.cv.frontend.backfill import backfill_rule
from pipelines.cv.frontend.changes import AlterView, with_options
from pipelines.cv.frontend.view_sources import stream_named
from pipelines.cv.model import DefinitionError, Scope, StreamDef, ViewDef, storage_name
from pipelines.cv.views import compiler, extremes, general, read_views, view_types
from pipelines.cv.views.sql_text import CV_SCHEMA
from pipelines.cv.views.view_types import ViewTypes
from pipelines.logs import get_logger
from pipelines.settings import ROLE_READER, ROLE_WRITER

log = get_logger("cv.catalog")


def define_view(conn: psycopg.Connection, view: ViewDef, scope: Scope) -> Outcome:
    """CREATE [OR REPLACE] CONTINUOUS VIEW, in the caller's transaction.

    `scope` is what `view` was read against: the stored definition it replaces is read against it too.
    """
    stream = stream_named(view.stream, scope.streams, scope.views)
    what = f"continuous view {view.qualified_name}"
    if stream.into is not None:
        raise DefinitionError(
            f"{what}: stream {stream.name} feeds {stream.into} and keeps nothing of its own; define the view on "
            f"{stream.into}"
        )
    row = conn.execute("SELECT definition, types FROM cv.views WHERE name = %s", (view.qualified_name,)).fetchone()
    if row is not None and _same_text(row[0], view.definition):
        return Outcome(f"view {view.qualified_name} unchanged", changed=False)
    if row is not None and not view.replace:
        raise DefinitionError(
            f"{view.qualified_name} already exists with another definition; CREATE OR REPLACE CONTINUOUS VIEW "
            "rebuilds it, or drop it first"
        )
    if stream.is_feed:  # a view over a view: no cycle, and its feed stream made (as stored: how its rows grow)
        stream = view_feeds.prepare(conn, view, stream, scope)
    check_ttl(conn, view)
    check_window(conn, view)
    check_units(conn, view, stream)
    types = view_types.resolve(conn, view, stream)
    check_groupable(conn, view, types.groups)
    if row is None:
        lock_stream_for_change(conn, stream.name, what)
        conn.execute(  # first: the view's position row, if it records changes, refers to it
            "INSERT INTO cv.views (name, stream, definition, types) VALUES (%s, %s, %s, %s)",
            (view.qualified_name, stream.name, view.definition, Jsonb(types.to_json())),
        )
        outcome = f"view {view.qualified_name} created; {_create(conn, view, stream, types)}"
    else:
        old = store.stored_view(row[0], row[1], scope)
        shape = view_feeds.shape(conn, view.qualified_name)
        outcome = _replace(conn, old.view, old.types, view, stream, types)
        view_feeds.check_shape_kept(conn, view, shape)
        conn.execute(
            "UPDATE cv.views SET definition = %s, types = %s WHERE name = %s",
            (view.definition, Jsonb(types.to_json()), view.qualified_name),
        )
        view_feeds.follow_growth(conn, view.qualified_name, scope)
        general.drop_unused(conn)
    log.info("view defined", view=view.qualified_name, stream=stream.name, outcome=outcome)
    return Outcome(outcome)


def _same_text(a: str, b: str) -> bool:
    return " ".join(a.split()) == " ".join(b.split())


def _create(conn: psycopg.Connection, view: ViewDef, stream: StreamDef, types: ViewTypes) -> str:
    """Storage, read view and grants, backfilled from a keyed stream's state; what it starts from."""
    for statement in compiler.create_view_tables(view, stream, types):
        conn.execute(statement)
    storage = compiler.storage_table(view)
    writer = sql.Identifier(ROLE_WRITER)
    write = sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO {}")
    conn.execute(write.format(storage, writer))
    for index in compiler.refs_indexes(view, stream):
        conn.execute(write.format(compiler.refs_table(view, index), writer))
    for index, _ in extremes.counted_extremes(view, stream):
        conn.execute(write.format(extremes.counts_table(view, index), writer))
    if view.join is not None:  # the pipelines read the joined table's rows at ingest
        tables = sql.SQL(", ").join(sql.SQL(t.table) for t in view.join.tables)
        conn.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(tables, writer))
    _create_read_view(conn, view, types)
    change_streams.follow_option(conn, view, types)  # before the backfill, which is then recorded
    if stream.key is None:
        if stream.is_feed:
            return f"starts from now (the changes of {stream.feed_of} from here on)"
        return backfills.record(conn, view, stream)
    for statement in compiler.backfill_from_state(view, stream, types):
        conn.execute(statement, ())
    groups = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(storage)).fetchone()[0]
    return f"backfilled {groups} groups from the current state of {stream.name}"


def _create_read_view(conn: psycopg.Connection, view: ViewDef, types: ViewTypes) -> None:
    conn.execute(read_views.create_read_view(view, types))
    conn.execute(
        sql.SQL("GRANT SELECT ON {} TO {}, {}").format(
            read_views.read_view(view), sql.Identifier(ROLE_READER), sql.Identifier(ROLE_WRITER)
        )
    )


def _storage_of(view: ViewDef, types: ViewTypes) -> tuple[object, ...]:
    """What the storage and its maintenance depend on, but the stored aggregates' names (and the ttl)."""
    return (
        view.stream,
        view.groups,
        view.where_sql,
        view.join,
        view.window,
        types.groups,
        types.distinct_arg,
        types.distinct_more,
        frozenset(_stored_by_meaning(view, types)),
    )


def _stored_by_meaning(view: ViewDef, types: ViewTypes) -> dict[tuple[object, ...], str]:
    """Each stored aggregate's column by what it holds: kind, argument, filter, parameters, type, state."""
    meaning = {}
    for aggregate, type_ in zip(view.aggregates, types.aggregates, strict=True):
        state = types.states.get(aggregate.name)
        key = (aggregate.kind, aggregate.arg_sql, aggregate.filter_sql, aggregate.params, type_, state)
        meaning[key] = aggregate.name
    return meaning


def _rename_stored(
    conn: psycopg.Connection, old: ViewDef, old_types: ViewTypes, view: ViewDef, types: ViewTypes
) -> None:
    """Give the storage's columns the names the new definition calls the same aggregates by."""
    before, after = _stored_by_meaning(old, old_types), _stored_by_meaning(view, types)
    renames = [(before[key], after[key]) for key in before if before[key] != after[key]]
    storage = compiler.storage_table(view)
    rename = sql.SQL("ALTER TABLE {} RENAME COLUMN {} TO {}")
    for i, (name, _) in enumerate(renames):  # through temporary names: a new name may be an old one's
        conn.execute(rename.format(storage, sql.Identifier(name), sql.Identifier(f"_cv_renaming_{i}")))
    for i, (_, name) in enumerate(renames):
        conn.execute(rename.format(storage, sql.Identifier(f"_cv_renaming_{i}"), sql.Identifier(name)))


def _replace(
    conn: psycopg.Connection, old: ViewDef, old_types: ViewTypes, view: ViewDef, stream: StreamDef, types: ViewTypes
) -> str:
    name = view.qualified_name
    what = f"continuous view {name}"
    same_storage = _storage_of(old, old_types) == _storage_of(view, types)
    if not same_storage and stream.key is None and backfill_rule(view.options, stream, view.aggregates) is None:
        raise DefinitionError(
            f"{what}: cannot rebuild it without a backfill from {stream.name}'s retained history (backfill = 'none', "
            "an order-dependent aggregate, or a view over a view); keep the groups, aggregates, filter, join and "
            "window (then only the read view changes), or drop the view and create it again to start from now"
        )
    if old.stream != view.stream:
        raise DefinitionError(f"{what}: it reads {old.stream}; drop it to read another stream")
    _take_view(conn, what, view.schema, view.name, stream.name)
    if same_storage:
        _rename_stored(conn, old, old_types, view, types)
        _create_read_view(conn, view, types)
        change_streams.follow_option(conn, view, types)
        return f"view {name} replaced; its storage is unchanged (only what is computed from it changed)"
    change_streams.record_removal(conn, old)
    drop_view_relations(conn, view.schema, view.name)
    return f"view {name} rebuilt; {_create(conn, view, stream, types)}"


def _take_view(conn: psycopg.Connection, what: str, schema: str, view: str, stream: str) -> None:
    """Steps 2 to 4 (pipelines.cv.catalog.locks) before an existing view changes.

    Its read view is dropped (waiting only for readers), then its stream's lock and its tables are taken.
    """
    drop_read_view(conn, what, sql.Identifier(schema, view))
    lock_stream_for_change(conn, stream, what)
    lock_tables(conn, what, view_tables(conn, schema, view))


def alter_view(conn: psycopg.Connection, change: AlterView, scope: Scope) -> Outcome:
    """Change a view's options (ttl): its definition is rewritten with them, its storage kept."""
    row = conn.execute("SELECT definition, types FROM cv.views WHERE name = %s", (change.name,)).fetchone()
    if row is None:
        raise DefinitionError(f"ALTER CONTINUOUS VIEW: no continuous view named {change.name}")
    old = store.stored_view(row[0], row[1], scope)
    options = {k: v for k, v in old.view.options.items() if k not in change.reset_options} | change.set_options
    view = store.stored_view(with_options(row[0], options), row[1], scope).view
    check_ttl(conn, view)
    lock_stream_for_change(conn, old.view.stream, f"ALTER CONTINUOUS VIEW {change.name}")
    if view.ttl and view.bucket and not _has_index_on(conn, view):
        conn.execute(
            sql.SQL("CREATE INDEX ON {} ({})").format(compiler.storage_table(view), sql.Identifier(view.bucket.name))
        )
    conn.execute("UPDATE cv.views SET definition = %s WHERE name = %s", (view.definition, change.name))
    change_streams.follow_option(conn, view, old.types)
    view_feeds.follow_growth(conn, change.name, scope)  # a ttl deletes rows: readers may not rely on growth
    log.info("view altered", view=change.name, ttl=view.ttl, changes=view.records_changes)
    ttl = f"ttl {view.ttl!r}" if view.ttl else "no ttl"
    return Outcome(f"view {change.name} altered: {ttl}" + (", changes recorded" if view.records_changes else ""))


def _has_index_on(conn: psycopg.Connection, view: ViewDef) -> bool:
    """True when the storage has an index leading with the time bucket (what expiry deletes by)."""
    assert view.bucket is not None
    return bool(
        conn.execute(
            "SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]"
            " WHERE i.indrelid = %s::regclass AND a.attname = %s",
            (compiler.storage_table(view).as_string(conn), view.bucket.name),
        ).fetchone()
    )


def drop_view(conn: psycopg.Connection, name: str, stream: str, scope: Scope) -> Outcome:
    """DROP CONTINUOUS VIEW of view `name` over `stream`: its read view, its tables, the aggregates only it kept."""
    what = f"DROP CONTINUOUS VIEW {name}"
    if over := view_feeds.views_over(conn, name):
        raise DefinitionError(f"{what}: {', '.join(over)} read it; drop them first")
    if taking := change_streams.readers(conn, name):
        raise DefinitionError(f"{what}: {', '.join(taking)} read its changes; drop them first")
    schema, _, view = name.partition(".")
    _take_view(conn, what, schema, view, stream)
    drop_view_relations(conn, schema, view)
    conn.execute("DELETE FROM cv.views WHERE name = %s", (name,))
    general.drop_unused(conn)
    feed = view_feeds.drop_if_unused(conn, stream, scope)
    return Outcome(f"view {name} dropped" + (f" (and {feed}, which only it read)" if feed else ""))


def view_tables(conn: psycopg.Connection, schema: str, view: str) -> list[sql.Identifier]:
    """A view's tables that exist: its storage, reference counts (`__refs`, `__refs2`...), min/max value counts."""
    names = conn.execute(  # min/max value counts: <storage>__m<i>
        "SELECT relname FROM pg_class WHERE relnamespace = %s::regnamespace AND relkind = 'r' AND relname ~ %s"
        " ORDER BY relname",
        (CV_SCHEMA, f"^{storage_name(schema, view)}(__refs[0-9]*|__m[0-9]+)?$"),
    ).fetchall()
    return [sql.Identifier(CV_SCHEMA, table) for (table,) in names]


def drop_view_relations(conn: psycopg.Connection, schema: str, view: str) -> None:
    """The read view and the tables of a view, if they exist."""
    conn.execute(sql.SQL("DROP VIEW IF EXISTS {}").format(sql.Identifier(schema, view)))
    for table in view_tables(conn, schema, view):
        conn.execute(sql.SQL("DROP TABLE {}").format(table))
