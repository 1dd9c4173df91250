"""ALTER STREAM s ADD COLUMN / DROP COLUMN: a stream's columns changed while events flow, its views kept.

The statement is rewritten (pipelines.cv.frontend.changes.stream_with_column) and stored; the runner
then decodes with the new declaration: an event without the added field takes its DEFAULT (or
NULL), as every absent field does. A keyed stream's state (`cv.state_<stream>`) gets the column too,
its rows the default; views keep their storage, since none of them reads a column that did not
exist. A batch decoded under the old declaration while the runner had not yet reloaded it is not
applied under the new one: the engine refuses it as transient (`StreamRedefined`), and it is read
again, decoded anew.

What is refused, with the reason: a NOT NULL column without a DEFAULT (events before it have no
value), dropping a column a view or transform reads or the key is made of, streams fed `into`
another or fed by one (their columns match by position), and any change of a column's type.
"""

from __future__ import annotations

from collections.abc import Mapping

import psycopg
from psycopg import sql

from pipelines.cv.catalog import stream_inserts
from pipelines.cv.catalog.locks import Outcome, lock_stream_for_change, lock_tables
from pipelines.cv.catalog.store import load_views
from pipelines.cv.catalog.stream_types import check_input_types
from pipelines.cv.catalog.transforms import load_transforms, writers_of
from pipelines.cv.frontend.changes import AlterStream, stream_with_column
from pipelines.cv.frontend.statements import NO_SCOPE, parse
from pipelines.cv.model import DefinitionError, StreamDef
from pipelines.cv.views import stream_sql
from pipelines.cv.views import transforms as transform_sql
from pipelines.logs import get_logger

log = get_logger("cv.catalog")


def change_column(
    conn: psycopg.Connection, change: AlterStream, stored: StreamDef, streams: Mapping[str, StreamDef]
) -> tuple[Outcome, StreamDef]:
    """ADD COLUMN or DROP COLUMN of `stored`, in the caller's transaction; the outcome and the stream as altered."""
    what = f"ALTER STREAM {stored.name}"
    feeders = sorted(s.name for s in streams.values() if s.into == stored.name)
    if stored.into is not None or feeders:
        other = stored.into or ", ".join(feeders)
        raise DefinitionError(
            f"{what}: its columns match {other}'s by position (into); change both by dropping and defining them"
        )
    if writers := writers_of(conn, stored.name):  # insert_into_stream matched its columns when defined
        raise DefinitionError(
            f"{what}: {', '.join(writers)} write into it by position (insert_into_stream); drop them first"
        )
    if change.drop_column in (stored.key or ()):
        raise DefinitionError(f"{what}: DROP COLUMN {change.drop_column}: it is part of the stream's key")
    try:
        stream = parse(stream_with_column(stored.definition, change.add_column, change.drop_column), NO_SCOPE)
    except DefinitionError as e:
        raise DefinitionError(f"{what}: {str(e).removeprefix(f'CREATE STREAM {stored.name}: ')}") from e
    assert isinstance(stream, StreamDef)
    if change.add_column is not None:
        column = stream.columns[-1]
        if column.not_null and column.default is None:
            raise DefinitionError(
                f"{what}: ADD COLUMN {column.name} NOT NULL needs a DEFAULT: the events before it have no value for it"
            )
        try:
            check_input_types(conn, stream)  # a type PostgreSQL reads: it exists, the same for the runner
        except DefinitionError as e:
            raise DefinitionError(f"{what}: {str(e).removeprefix(f'CREATE STREAM {stored.name}: ')}") from e
        line = f"stream {stored.name} altered: column {column.name} added"
    else:
        column = next(c for c in stored.columns if c.name == change.drop_column)
        _check_unread(conn, stored, column.name, streams, what)
        line = f"stream {stored.name} altered: column {column.name} dropped"
    lock_stream_for_change(conn, stored.name, what)
    if stored.key is not None:
        _alter_state(conn, stored, column.name, column.type if change.add_column else None, column.default, what)
    conn.execute("UPDATE cv.streams SET definition = %s WHERE name = %s", (stream.definition, stored.name))
    stream_inserts.create_relation(conn, stream)
    log.info("stream columns changed", stream=stored.name, columns=list(stream.column_names))
    return Outcome(line), stream


def _check_unread(
    conn: psycopg.Connection, stream: StreamDef, column: str, streams: Mapping[str, StreamDef], what: str
) -> None:
    """A column dropped must be read by no view and no transform of the stream."""
    readers = [
        c.view.qualified_name
        for c in load_views(conn, streams, stream.name)
        if column in stream_sql.referenced_columns(c.view)
    ]
    if stream.key is None:
        readers += [
            t.qualified_name
            for t in load_transforms(conn, streams, stream.name)
            if column in transform_sql.referenced_columns(t)
        ]
    if readers:
        raise DefinitionError(f"{what}: DROP COLUMN {column}: read by {', '.join(readers)}; drop those first")


def _alter_state(
    conn: psycopg.Connection, stream: StreamDef, column: str, added_type: str | None, default: str | None, what: str
) -> None:
    """The keyed stream's state table gets the column (its rows the default, then no default kept), or loses it."""
    table = stream_sql.state_table(stream)
    lock_tables(conn, what, [table], holder="a session")
    name = sql.Identifier(column)
    if added_type is None:
        conn.execute(sql.SQL("ALTER TABLE {} DROP COLUMN {}").format(table, name))
        return
    if default is None:
        conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN {} {}").format(table, name, sql.SQL(added_type)))
        return
    # The rows kept so far came from events without it: they take the default. A constant default is
    # stored once in the catalog (no rewrite of the state, however large); the table keeps no default
    # after, as its rows are the decoder's.
    conn.execute(
        sql.SQL("ALTER TABLE {} ADD COLUMN {} {} DEFAULT {}").format(table, name, sql.SQL(added_type), sql.SQL(default))
    )
    conn.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN {} DROP DEFAULT").format(table, name))
