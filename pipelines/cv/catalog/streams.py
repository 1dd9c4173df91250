"""Streams in the catalog: created, redefined (how their events are read) and dropped, in the caller's transaction.

A stream's row in cv.streams holds its statement; a keyed stream also gets its state table
(`cv.state_<stream>`), which its views are backfilled from. Locks are taken in
pipelines.cv.catalog.locks' order.
"""

from __future__ import annotations

from collections.abc import Mapping

import psycopg
from psycopg import sql

from pipelines.cv.catalog import stream_inserts
from pipelines.cv.catalog.locks import Outcome, lock_stream_for_change, lock_tables
from pipelines.cv.model import DefinitionError, StreamDef
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
    theirs = [(c.name, c.kind) for c in target.columns]
    ours = [(c.name, c.kind) for c in stream.columns]
    if [kind for _, kind in ours] != [kind for _, kind in theirs]:
        raise DefinitionError(
            f"CREATE STREAM {stream.name}: its columns go into {target.name}'s by position, so their types must "
            f"match: ({', '.join(f'{n} {k}' for n, k in ours)}) vs ({', '.join(f'{n} {k}' for n, k in theirs)})"
        )


def define_stream(conn: psycopg.Connection, stream: StreamDef, streams: Mapping[str, StreamDef]) -> Outcome:
    """CREATE STREAM, in the caller's transaction, against the `streams` defined so far."""
    _check_stream(conn, stream, streams)
    stored = streams.get(stream.name)
    if stored is not None:
        if " ".join(stored.definition.split()) == " ".join(stream.definition.split()):
            return Outcome(f"stream {stream.name} unchanged", changed=False)
        if _shape(stored) != _shape(stream):
            raise DefinitionError(
                f"stream {stream.name} already exists with other columns, key or target; drop it (and its views) first"
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
