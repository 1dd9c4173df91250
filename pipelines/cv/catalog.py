"""The catalog of streams and views in PostgreSQL: loading them, defining and dropping streams.

Every definition change takes the stream's lock exclusively (pipelines hold it shared while they
apply a batch) and bumps the catalog's version, which pipelines compare at every batch. How views
are created, replaced, altered and dropped is in pipelines.cv.views.view_catalog.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

from pipelines.cv import stream_sql
from pipelines.cv.definitions import DefinitionError, StreamDef, ViewDef, parse
from pipelines.cv.statement_text import split_statements
from pipelines.cv.statements import parse_change
from pipelines.cv.views import general
from pipelines.cv.views.view_types import ViewTypes
from pipelines.logs import get_logger
from pipelines.settings import ROLE_WRITER

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
    """Apply one statement: CREATE (idempotent for an identical definition), CREATE OR REPLACE, ALTER or DROP.

    Returns the outcome as a line for people.
    """
    # Imported here: views are defined with this module's locks and loaders.
    from pipelines.cv.views import view_catalog

    change = parse_change(statement)
    streams = load_streams(conn)
    if change is not None:
        with conn.transaction():
            return view_catalog.apply_change(conn, change, streams)
    definition = parse(statement, streams, general.user_aggregates(conn))
    with conn.transaction():
        if isinstance(definition, StreamDef):
            return _define_stream(conn, definition, streams)
        return view_catalog.define_view(conn, definition, streams)


def define_file(conn: psycopg.Connection, text: str) -> list[str]:
    """Apply every statement of a definitions file, in order."""
    return [define(conn, statement) for statement in split_statements(text)]


def bump(conn: psycopg.Connection) -> None:
    """A definition changed: pipelines reload their plans when they see the catalog's version move."""
    conn.execute("UPDATE cv.catalog SET version = version + 1")


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
        bump(conn)
        log.info("stream redefined", stream=stream.name, topic=stream.topic)
        return f"stream {stream.name} updated (how its events are read)"
    conn.execute(
        "INSERT INTO cv.streams (name, topic, definition) VALUES (%s, %s, %s)",
        (stream.name, stream.topic, stream.definition),
    )
    if stream.key is not None:
        conn.execute(stream_sql.create_state_table(stream))
        conn.execute(
            sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO {}").format(
                stream_sql.state_table(stream), sql.Identifier(ROLE_WRITER)
            )
        )
    bump(conn)
    log.info("stream defined", stream=stream.name, topic=stream.topic, key=stream.key, into=stream.into)
    return f"stream {stream.name} created" + (f" (into {stream.into})" if stream.into else "")


def drop_stream(conn: psycopg.Connection, name: str) -> str:
    """Drop a stream that has no views left, and its state."""
    with conn.transaction():
        if conn.execute("SELECT 1 FROM cv.views WHERE stream = %s", (name,)).fetchone():
            raise DefinitionError(f"stream {name} still has views; drop them first")
        feeders = [s.name for s in load_streams(conn).values() if s.into == name]
        if feeders:
            raise DefinitionError(f"stream {name} is fed by {', '.join(feeders)}; drop those streams first")
        lock_stream(conn, name, shared=False)
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(stream_sql.state_table_of(name)))
        if conn.execute("DELETE FROM cv.streams WHERE name = %s", (name,)).rowcount == 0:
            raise DefinitionError(f"no stream named {name}")
        bump(conn)
    return f"stream {name} dropped"
