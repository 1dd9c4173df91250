"""Streams in the catalog: created, redefined, altered and dropped, in the caller's transaction.

A stream's row in cv.streams holds its statement; a keyed stream also gets its state table
(`cv.state_<stream>`), which its views are backfilled from. Locks are taken in
pipelines.cv.catalog.locks' order.

ALTER STREAM s SET / RESET (retention, retention_bytes) rewrites the statement's WITH (...): the
runner, reloading the catalog, applies the topic's configs (`topic_configs`, as PostgreSQL reads the
interval and the size).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import psycopg
from psycopg import sql

from pipelines.cv.catalog import stream_inserts
from pipelines.cv.catalog.locks import Outcome, lock_stream_for_change, lock_tables
from pipelines.cv.catalog.stream_columns import change_column
from pipelines.cv.catalog.stream_types import check_input_types
from pipelines.cv.frontend.changes import AlterStream, stream_with_options
from pipelines.cv.frontend.statements import NO_SCOPE, parse
from pipelines.cv.model import DefinitionError, StreamDef
from pipelines.cv.sqltext.types import INPUT
from pipelines.cv.views import stream_sql
from pipelines.logs import get_logger
from pipelines.settings import ROLE_WRITER

log = get_logger("cv.catalog")


def _shape(stream: StreamDef) -> tuple[object, ...]:
    """What a stream's state and views depend on: its columns, key and target. Decoding options may change."""
    return (tuple((c.name, c.type) for c in stream.columns), stream.key, stream.into)


def _check_stream(conn: psycopg.Connection, stream: StreamDef, streams: Mapping[str, StreamDef]) -> None:
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
    # A type PostgreSQL reads (kind input) must be the same type, not just of the same kind.
    theirs = [(c.name, c.type if c.kind == INPUT else c.kind) for c in target.columns]
    ours = [(c.name, c.type if c.kind == INPUT else c.kind) for c in stream.columns]
    if [kind for _, kind in ours] != [kind for _, kind in theirs]:
        raise DefinitionError(
            f"CREATE STREAM {stream.name}: its columns go into {target.name}'s by position, so their types must "
            f"match: ({', '.join(f'{n} {k}' for n, k in ours)}) vs ({', '.join(f'{n} {k}' for n, k in theirs)})"
        )


def topic_configs(conn: psycopg.Connection, stream: StreamDef) -> dict[str, str | None]:
    """The topic configs a stream declares: retention.ms and retention.bytes (None: not declared).

    Raises:
        DefinitionError: PostgreSQL does not read the interval or the size, or it is not positive.
    """
    what = f"stream {stream.name}"
    configs: dict[str, str | None] = {"retention.ms": None, "retention.bytes": None}
    for option, config, cast in (
        ("retention", "retention.ms", "(extract(epoch FROM %s::interval) * 1000)::bigint"),
        ("retention_bytes", "retention.bytes", "pg_size_bytes(%s)"),
    ):
        text = getattr(stream, option)
        if text is None:
            continue
        try:
            with conn.transaction():
                (value,) = conn.execute(f"SELECT {cast}", (text,)).fetchone()
        except psycopg.Error as e:
            message = " ".join((e.diag.message_primary or str(e)).split())
            raise DefinitionError(f"{what}: {option} {text!r} is not read by PostgreSQL: {message}") from e
        if value <= 0:
            raise DefinitionError(f"{what}: {option} must be positive, not {text!r}")
        configs[config] = str(value)
    return configs


def declared_topic_configs(conn: psycopg.Connection, streams: Iterable[StreamDef]) -> dict[str, dict[str, str | None]]:
    """Per topic, the configs its stream declares; a stream whose options no longer read is logged and left out."""
    configs = {}
    for stream in streams:
        if stream.retention is None and stream.retention_bytes is None:
            configs[stream.topic] = {"retention.ms": None, "retention.bytes": None}
            continue
        try:
            configs[stream.topic] = topic_configs(conn, stream)
        except DefinitionError as e:
            log.error("stream's retention not applied", stream=stream.name, error=str(e))
    return configs


def alter_stream(
    conn: psycopg.Connection, change: AlterStream, streams: Mapping[str, StreamDef]
) -> tuple[Outcome, StreamDef]:
    """ALTER STREAM SET / RESET of its topic's options: its statement rewritten, its state and views untouched.

    ADD COLUMN and DROP COLUMN: pipelines.cv.catalog.stream_columns.
    """
    stored = streams.get(change.name)
    if stored is None:
        raise DefinitionError(f"ALTER STREAM: no stream named {change.name}")
    if change.add_column is not None or change.drop_column is not None:
        return change_column(conn, change, stored, streams)
    definition = stream_with_options(stored.definition, change.set_options, change.reset_options)
    stream = parse(definition, NO_SCOPE)
    assert isinstance(stream, StreamDef)
    topic_configs(conn, stream)
    if (stream.retention, stream.retention_bytes) == (stored.retention, stored.retention_bytes):
        return Outcome(f"stream {stream.name} unchanged", changed=False), stored
    lock_stream_for_change(conn, stream.name, f"ALTER STREAM {stream.name}")
    conn.execute("UPDATE cv.streams SET definition = %s WHERE name = %s", (definition, stream.name))
    log.info("stream altered", stream=stream.name, retention=stream.retention, retention_bytes=stream.retention_bytes)
    declared = [
        f"{o} {v!r}" for o, v in (("retention", stream.retention), ("retention_bytes", stream.retention_bytes)) if v
    ]
    return Outcome(f"stream {stream.name} altered: {', '.join(declared) or 'the broker default retention'}"), stream


def define_stream(conn: psycopg.Connection, stream: StreamDef, streams: Mapping[str, StreamDef]) -> Outcome:
    """CREATE STREAM, in the caller's transaction, against the `streams` defined so far."""
    _check_stream(conn, stream, streams)
    check_input_types(conn, stream)
    topic_configs(conn, stream)
    stored = streams.get(stream.name)
    if stored is not None:
        if " ".join(stored.definition.split()) == " ".join(stream.definition.split()):
            return Outcome(f"stream {stream.name} unchanged", changed=False)
        if _shape(stored) != _shape(stream):
            raise DefinitionError(
                f"stream {stream.name} already exists with other columns, key or target: change its columns with "
                f"ALTER STREAM {stream.name} ADD COLUMN / DROP COLUMN, or drop it (and its views) first"
            )
        # Only how events are read changed (topic, format, checks, ...): the state and views stay.
        conn.execute(
            "UPDATE cv.streams SET topic = %s, definition = %s WHERE name = %s",
            (stream.topic, stream.definition, stream.name),
        )
        stream_inserts.create_relation(conn, stream)
        log.info("stream redefined", stream=stream.name, topic=stream.topic)
        return Outcome(f"stream {stream.name} updated (how its events are read)")
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
    stream_inserts.create_relation(conn, stream)
    log.info("stream defined", stream=stream.name, topic=stream.topic, key=stream.key, into=stream.into)
    return Outcome(f"stream {stream.name} created" + (f" (into {stream.into})" if stream.into else ""))


def drop_stream(conn: psycopg.Connection, name: str, streams: Mapping[str, StreamDef]) -> Outcome:
    """DROP STREAM of a stream that has no views left, and its state, in the caller's transaction."""
    what = f"DROP STREAM {name}"
    if conn.execute("SELECT 1 FROM cv.views WHERE stream = %s", (name,)).fetchone():
        raise DefinitionError(f"stream {name} still has views; drop them first")
    feeders = [s.name for s in streams.values() if s.into == name]
    if feeders:
        raise DefinitionError(f"stream {name} is fed by {', '.join(feeders)}; drop those streams first")
    lock_stream_for_change(conn, name, what)
    lock_tables(conn, what, [stream_sql.state_table_of(name)], holder="a session")
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(stream_sql.state_table_of(name)))
    if unpublished := stream_inserts.drop_stream_rows(conn, name):
        log.warning("rows inserted into the dropped stream were not published", stream=name, rows=unpublished)
    conn.execute("DELETE FROM cv.streams WHERE name = %s", (name,))
    return Outcome(f"stream {name} dropped")
