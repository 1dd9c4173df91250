"""`INSERT INTO <stream>` and `COPY <stream> FROM STDIN`: each stream's writable relation (migration 0030).

A stream gets `streams.<stream>`: a view with the stream's columns (their types and defaults) that
reads nothing, and an INSTEAD OF INSERT trigger that appends each row to cv.stream_inbox in the
inserting transaction. The inbox relay (pipelines.cv.inbox) then publishes it to the stream's topic,
so a row written with SQL is an event like any other: every consumer of the topic sees it, and the
stream's decoding rules (NOT NULL, CHECK, dead letters) apply. PostgreSQL checks the types at the
INSERT, so a value of the wrong type fails the statement, in PostgreSQL's own words.

Streams whose events are not written by applications have none: a stream fed `into` another (its
events are another system's, Debezium's), and `debezium` streams.
"""

from __future__ import annotations

from collections.abc import Iterable

import psycopg
from psycopg import sql

from pipelines.cv.model import StreamDef
from pipelines.settings import ROLE_WRITER

SCHEMA = "streams"


def writable(stream: StreamDef) -> bool:
    """Whether applications may write the stream with SQL: their own events, in json or csv."""
    return stream.into is None and not stream.is_feed and stream.format in ("json", "csv")


def relation(name: str) -> sql.Identifier:
    """The stream's relation, `streams.<stream>`."""
    return sql.Identifier(SCHEMA, name)


def create_relation(conn: psycopg.Connection, stream: StreamDef) -> None:
    """The stream's writable relation, made again for its current declaration (or dropped if it has none)."""
    drop_relation(conn, stream.name)
    if not writable(stream):
        return
    target = relation(stream.name)
    columns = sql.SQL(", ").join(
        sql.SQL("NULL::{} AS {}").format(sql.SQL(column.type), sql.Identifier(column.name)) for column in stream.columns
    )
    conn.execute(sql.SQL("CREATE VIEW {} AS SELECT {} WHERE false").format(target, columns))
    for column in stream.columns:
        if column.default is not None:  # evaluated at the INSERT, as a table's default would be
            conn.execute(
                sql.SQL("ALTER VIEW {} ALTER COLUMN {} SET DEFAULT {}").format(
                    target, sql.Identifier(column.name), sql.SQL(column.default)
                )
            )
    trigger = (
        "CREATE TRIGGER stream_insert INSTEAD OF INSERT ON {} FOR EACH ROW EXECUTE FUNCTION cv.stream_insert({}, {})"
    )
    # A NULL timestamp_column is left out of the event: it takes the record's timestamp (migration 0030).
    timestamp_column = sql.Literal(stream.timestamp_column or "")
    conn.execute(sql.SQL(trigger).format(target, sql.Literal(stream.name), timestamp_column))
    conn.execute(
        sql.SQL("COMMENT ON VIEW {} IS {}").format(
            target, sql.Literal(f"Stream {stream.name}: rows inserted here are produced to topic {stream.topic}.")
        )
    )
    conn.execute(sql.SQL("GRANT INSERT ON {} TO {}").format(target, sql.Identifier(ROLE_WRITER)))


def drop_relation(conn: psycopg.Connection, name: str) -> None:
    """The stream's relation, if it has one (redefinition: rows written and not yet published stay)."""
    conn.execute(sql.SQL("DROP VIEW IF EXISTS {}").format(relation(name)))


def drop_stream_rows(conn: psycopg.Connection, name: str) -> int:
    """DROP STREAM: its relation, and its rows not yet published (no relay serves the stream any more)."""
    drop_relation(conn, name)
    return conn.execute("DELETE FROM cv.stream_inbox WHERE stream = %s", (name,)).rowcount


def ensure_relations(conn: psycopg.Connection, streams: Iterable[StreamDef]) -> list[str]:
    """The relations missing for these streams (declared before migration 0030); the streams given one."""
    made = []
    for stream in streams:
        missing = conn.execute("SELECT to_regclass(%s) IS NULL", (relation(stream.name).as_string(conn),)).fetchone()[0]
        if writable(stream) and missing:
            create_relation(conn, stream)
            made.append(stream.name)
    return made
