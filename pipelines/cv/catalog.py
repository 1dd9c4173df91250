"""The catalog of streams and views in PostgreSQL: defining, loading and dropping them.

Defining a view is one transaction that takes the stream's lock exclusively (pipelines hold it shared
while they apply a batch), creates the view's table, backfills it from the stream's current state
(keyed streams) and records it. So a new view on a running system is exact: it misses no batch and
counts none twice. Views over append-only streams have no state to backfill from and start from now.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from pipelines.cv import compiler, general, read_views, view_types
from pipelines.cv.definitions import DefinitionError, StreamDef, ViewDef, parse, split_statements, state_table_name
from pipelines.cv.view_types import ViewTypes
from pipelines.logs import get_logger
from pipelines.settings import ROLE_READER, ROLE_WRITER

log = get_logger("cv.catalog")

# Advisory-lock class for streams: (STREAM_LOCK, hashtext(stream name)).
STREAM_LOCK = 0x4356  # "CV"


@dataclass(frozen=True)
class CompiledView:
    """A view with its types, ready to be maintained."""

    view: ViewDef
    types: ViewTypes


def lock_stream(conn: psycopg.Connection, stream: str, *, shared: bool) -> None:
    """Pipelines apply batches holding the stream's lock shared; (re)definitions hold it exclusively."""
    function = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
    conn.execute(sql.SQL("SELECT {}(%s, hashtext(%s))").format(sql.Identifier(function)), (STREAM_LOCK, stream))


def catalog_version(conn: psycopg.Connection) -> int:
    """Changes whenever a stream or view is defined or dropped."""
    return conn.execute("SELECT version FROM cv.catalog").fetchone()[0]


def load_streams(conn: psycopg.Connection, *, skip_broken: bool = False) -> dict[str, StreamDef]:
    """Every stream, re-parsed from its stored definition.

    With `skip_broken`, a stored definition this release cannot parse any more (say, it predates a
    stricter rule) is logged and left out, so that the other streams keep running.
    """
    streams: dict[str, StreamDef] = {}
    for name, definition in conn.execute("SELECT name, definition FROM cv.streams ORDER BY name"):
        try:
            stream = parse(definition, streams)
        except DefinitionError as e:
            if not skip_broken:
                raise
            log.error("stored stream definition no longer parses; it is not consumed", stream=name, error=str(e))
            continue
        assert isinstance(stream, StreamDef)
        streams[stream.name] = stream
    return streams


def load_views(conn: psycopg.Connection, streams: dict[str, StreamDef], stream: str) -> list[CompiledView]:
    """The views of one stream in name order (the order their rows are locked in)."""
    views = []
    rows = conn.execute("SELECT definition, types FROM cv.views WHERE stream = %s ORDER BY name", (stream,))
    aggregates = general.user_aggregates(conn)
    for definition, types in rows.fetchall():
        view = parse(definition, streams, aggregates)
        assert isinstance(view, ViewDef)
        views.append(CompiledView(view, ViewTypes.from_json(types)))
    return views


def define(conn: psycopg.Connection, statement: str) -> str:
    """Create a stream or continuous view from its statement; idempotent for an identical definition."""
    streams = load_streams(conn)
    definition = parse(statement, streams, general.user_aggregates(conn))
    with conn.transaction():
        if isinstance(definition, StreamDef):
            return _define_stream(conn, definition, streams)
        return _define_view(conn, definition, streams[definition.stream])


def define_file(conn: psycopg.Connection, text: str) -> list[str]:
    """Apply every statement of a definitions file, in order."""
    return [define(conn, statement) for statement in split_statements(text)]


def _bump(conn: psycopg.Connection) -> None:
    conn.execute("UPDATE cv.catalog SET version = version + 1")


def _same_or_conflict(conn: psycopg.Connection, table: str, name: str, definition: str) -> bool:
    row = conn.execute(
        sql.SQL("SELECT definition FROM {} WHERE name = %s").format(sql.Identifier("cv", table)), (name,)
    ).fetchone()
    if row is None:
        return False
    if " ".join(row[0].split()) != " ".join(definition.split()):
        raise DefinitionError(f"{name} already exists with another definition; drop it first")
    return True


def _shape(stream: StreamDef) -> tuple[object, ...]:
    """What a stream's state and views depend on: its columns, key and target. Decoding options may change."""
    return (tuple((c.name, c.type) for c in stream.columns), stream.key, stream.into)


def _check_stream(conn: psycopg.Connection, stream: StreamDef, streams: dict[str, StreamDef]) -> None:
    """What a stream needs from the others: its topic to itself, and a target that can take its rows."""
    other = conn.execute("SELECT name FROM cv.streams WHERE topic = %s AND name <> %s", (stream.topic, stream.name))
    row = other.fetchone()
    if row is not None:
        raise DefinitionError(f"CREATE STREAM {stream.name}: topic {stream.topic!r} is already read by stream {row[0]}")
    if stream.into is None:
        return
    target = streams.get(stream.into)
    if target is None:
        raise DefinitionError(f"CREATE STREAM {stream.name}: into names no stream: {stream.into!r}")
    if target.into is not None:
        raise DefinitionError(
            f"CREATE STREAM {stream.name}: {target.name} itself feeds {target.into}; name that stream instead"
        )
    theirs = [(c.name, c.kind) for c in target.columns]
    ours = [(c.name, c.kind) for c in stream.columns]
    if [kind for _, kind in ours] != [kind for _, kind in theirs]:
        raise DefinitionError(
            f"CREATE STREAM {stream.name}: its columns go into {target.name}'s by position, so their types must "
            f"match: ({', '.join(f'{n} {k}' for n, k in ours)}) vs ({', '.join(f'{n} {k}' for n, k in theirs)})"
        )


def _define_stream(conn: psycopg.Connection, stream: StreamDef, streams: dict[str, StreamDef]) -> str:
    _check_stream(conn, stream, streams)
    stored = streams.get(stream.name)
    if stored is not None:
        if " ".join(stored.definition.split()) == " ".join(stream.definition.split()):
            return f"stream {stream.name} unchanged"
        if _shape(stored) != _shape(stream):
            raise DefinitionError(
                f"stream {stream.name} already exists with other columns, key or target; drop it (and its views) first"
            )
        # Only how events are read changed (topic, format, checks, ...): the state and views stay.
        conn.execute(
            "UPDATE cv.streams SET topic = %s, definition = %s WHERE name = %s",
            (stream.topic, stream.definition, stream.name),
        )
        _bump(conn)
        log.info("stream redefined", stream=stream.name, topic=stream.topic)
        return f"stream {stream.name} updated (how its events are read)"
    conn.execute(
        "INSERT INTO cv.streams (name, topic, definition) VALUES (%s, %s, %s)",
        (stream.name, stream.topic, stream.definition),
    )
    if stream.key is not None:
        conn.execute(compiler.create_state_table(stream))
        conn.execute(
            sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO {}").format(
                compiler.state_table(stream), sql.Identifier(ROLE_WRITER)
            )
        )
    _bump(conn)
    log.info("stream defined", stream=stream.name, topic=stream.topic, key=stream.key, into=stream.into)
    return f"stream {stream.name} created" + (f" (into {stream.into})" if stream.into else "")


def _define_view(conn: psycopg.Connection, view: ViewDef, stream: StreamDef) -> str:
    if stream.into is not None:
        raise DefinitionError(
            f"continuous view {view.qualified_name}: stream {stream.name} feeds {stream.into} and keeps nothing of "
            f"its own; define the view on {stream.into}"
        )
    lock_stream(conn, stream.name, shared=False)
    if _same_or_conflict(conn, "views", view.qualified_name, view.definition):
        return f"view {view.qualified_name} unchanged"
    types = view_types.resolve(conn, view, stream)
    for statement in compiler.create_view_tables(view, stream, types):
        conn.execute(statement)
    table = compiler.storage_table(view)
    conn.execute(sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO {}").format(table, sql.Identifier(ROLE_WRITER)))
    if view.join is not None:  # the pipelines read the joined table's rows at ingest
        conn.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(sql.SQL(view.join.table), sql.Identifier(ROLE_WRITER)))
    conn.execute(read_views.create_read_view(view, types))
    readable = read_views.read_view(view)
    conn.execute(
        sql.SQL("GRANT SELECT ON {} TO {}, {}").format(
            readable, sql.Identifier(ROLE_READER), sql.Identifier(ROLE_WRITER)
        )
    )
    if compiler.uses_refs(view, stream):
        conn.execute(
            sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO {}").format(
                compiler.refs_table(view), sql.Identifier(ROLE_WRITER)
            )
        )
    backfilled = "starts from now (append-only stream: no state to backfill from)"
    if stream.key is not None:
        source = compiler.backfill_source(stream)
        if compiler.uses_refs(view, stream):
            conn.execute(compiler.create_transitions_table(view, types))
            conn.execute(compiler.update_refs(view, source), ())
        conn.execute(compiler.apply_deltas(view, stream, source, types.states), ())
        rows = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table)).fetchone()[0]
        backfilled = f"backfilled {rows} groups from the current state of {stream.name}"
    conn.execute(
        "INSERT INTO cv.views (name, stream, definition, types) VALUES (%s, %s, %s, %s)",
        (
            view.qualified_name,
            stream.name,
            view.definition,
            Jsonb(types.to_json()),
        ),
    )
    _bump(conn)
    log.info("view defined", view=view.qualified_name, stream=stream.name, backfill=backfilled)
    return f"view {view.qualified_name} created; {backfilled}"


def drop_view(conn: psycopg.Connection, name: str) -> str:
    """Drop a continuous view, its table and its reference counts."""
    with conn.transaction():
        row = conn.execute("SELECT stream, definition FROM cv.views WHERE name = %s", (name,)).fetchone()
        if row is None:
            raise DefinitionError(f"no continuous view named {name}")
        lock_stream(conn, row[0], shared=False)
        schema, _, view = name.partition(".")
        conn.execute(sql.SQL("DROP VIEW IF EXISTS {}").format(sql.Identifier(schema, view)))
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(compiler.storage_table_of(schema, view)))
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(compiler.refs_table_of(schema, view)))
        conn.execute("DELETE FROM cv.views WHERE name = %s", (name,))
        _bump(conn)
    return f"view {name} dropped"


def drop_stream(conn: psycopg.Connection, name: str) -> str:
    """Drop a stream that has no views left, and its state."""
    with conn.transaction():
        if conn.execute("SELECT 1 FROM cv.views WHERE stream = %s", (name,)).fetchone():
            raise DefinitionError(f"stream {name} still has views; drop them first")
        feeders = [s.name for s in load_streams(conn).values() if s.into == name]
        if feeders:
            raise DefinitionError(f"stream {name} is fed by {', '.join(feeders)}; drop those streams first")
        lock_stream(conn, name, shared=False)
        conn.execute(
            sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(compiler.CV_SCHEMA, state_table_name(name)))
        )
        if conn.execute("DELETE FROM cv.streams WHERE name = %s", (name,)).rowcount == 0:
            raise DefinitionError(f"no stream named {name}")
        _bump(conn)
    return f"stream {name} dropped"
