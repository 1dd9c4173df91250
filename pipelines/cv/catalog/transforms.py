"""Continuous transforms in the catalog: created and dropped in the caller's transaction (migration 0026).

A transform is a row of cv.transforms (its statement and its output columns' types), a position row
in cv.view_change_positions (its change stream, recorded by the engine: pipelines.cv.views.transforms)
and a read view `schema.name` over its recorded output. It keeps no state, so it starts from now,
whatever the stream: there is nothing to backfill from an append-only stream. A transform over
another transform's output reads that output's feed stream, made by the first view or transform
that reads it and dropped with the last (pipelines.cv.catalog.view_feeds).

Locks follow pipelines.cv.catalog.locks: the read view first (DROP), then the stream's lock, which
no batch of the stream holds meanwhile.
"""

from __future__ import annotations

from collections.abc import Mapping

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from pipelines.cv.catalog import change_streams, store, stream_inserts, view_feeds
from pipelines.cv.catalog.locks import Outcome, drop_read_view, lock_stream_for_change
from pipelines.cv.frontend.transforms import DropTransform, parse_transform, writes_into
from pipelines.cv.frontend.view_sources import stream_named
from pipelines.cv.model import DefinitionError, Scope, StreamDef, TransformDef
from pipelines.cv.views import transforms as transform_sql
from pipelines.logs import get_logger
from pipelines.settings import ROLE_READER, ROLE_WRITER

log = get_logger("cv.catalog")
_PROBE = sql.Identifier("pg_temp", "cv_transform_probe")


def define_transform(conn: psycopg.Connection, transform: TransformDef, scope: Scope) -> Outcome:
    """CREATE CONTINUOUS TRANSFORM, in the caller's transaction: catalog row, position row, read view."""
    name = transform.qualified_name
    what = f"continuous transform {name}"
    row = conn.execute("SELECT definition FROM cv.transforms WHERE name = %s", (name,)).fetchone()
    if row is not None:
        if " ".join(row[0].split()) == " ".join(transform.definition.split()):
            return Outcome(f"transform {name} unchanged", changed=False)
        raise DefinitionError(f"{name} already exists with another definition; drop it first")
    if conn.execute("SELECT 1 FROM cv.views WHERE name = %s", (name,)).fetchone():
        raise DefinitionError(f"{what}: {name} is a continuous view; a transform needs a name of its own")
    taken = conn.execute(
        "SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = %s",
        (transform.schema, transform.name),
    ).fetchone()
    if taken:
        raise DefinitionError(f"{what}: a relation named {name} exists; a transform's read view takes that name")
    stream = stream_named(transform.stream, scope.streams, scope.views)
    if stream.is_feed:  # another transform's output, fed from its recorded rows
        view_feeds.ensure(conn, stream, scope, what)
    lock_stream_for_change(conn, stream.name, what)
    columns = output_types(conn, transform, stream)
    if transform.into is not None:
        _check_into(conn, transform, scope.streams[transform.into[0]], columns, what)
    conn.execute(
        "INSERT INTO cv.transforms (name, stream, definition, columns) VALUES (%s, %s, %s, %s)",
        (name, stream.name, transform.definition, Jsonb(columns)),
    )
    conn.execute("INSERT INTO cv.view_change_positions (view) VALUES (%s)", (name,))
    conn.execute(transform_sql.read_view(transform, columns), ())
    conn.execute(
        sql.SQL("GRANT SELECT ON {} TO {}, {}").format(
            sql.Identifier(transform.schema, transform.name), sql.Identifier(ROLE_READER), sql.Identifier(ROLE_WRITER)
        )
    )
    if transform.join is not None:  # the pipelines read the joined table's rows at ingest
        tables = sql.SQL(", ").join(sql.SQL(t.table) for t in transform.join.tables)
        grant = sql.SQL("GRANT SELECT ON {} TO {}").format(tables, sql.Identifier(ROLE_WRITER))
        conn.execute(grant)
    log.info("transform defined", transform=name, stream=stream.name, columns=[c for c, _ in columns])
    return Outcome(f"transform {name} created; starts from now (its output: change stream {name})")


def output_types(conn: psycopg.Connection, transform: TransformDef, stream: StreamDef) -> list[tuple[str, str]]:
    """(name, type) of each output column, as PostgreSQL resolves the SELECT over the stream's columns.

    Running it over no event also checks what only PostgreSQL knows: the joined table and its
    columns, the functions and operators called.
    """
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(_PROBE))
    conn.execute(transform_sql.probe(transform, stream, _PROBE), ())
    rows = conn.execute(
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
        " WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        (_PROBE.as_string(conn),),
    ).fetchall()
    conn.execute(sql.SQL("DROP TABLE {}").format(_PROBE))
    return [(column, "text" if type_ == "unknown" else type_) for column, type_ in rows]


def drop_transforms(conn: psycopg.Connection, change: DropTransform) -> Outcome:
    """DROP CONTINUOUS TRANSFORM: the read view, the catalog row, and with it its change stream (0026)."""
    lines = []
    for name in change.names:
        what = f"DROP CONTINUOUS TRANSFORM {name}"
        row = conn.execute("SELECT stream FROM cv.transforms WHERE name = %s", (name,)).fetchone()
        if row is None:
            if not change.if_exists:
                raise DefinitionError(f"no continuous transform named {name}")
            lines.append(f"transform {name} does not exist; skipped")
            continue
        if taking := change_streams.readers(conn, name):
            raise DefinitionError(f"{what}: {', '.join(taking)} read its changes; drop them first")
        schema, _, relation = name.partition(".")
        drop_read_view(conn, what, sql.Identifier(schema, relation))
        lock_stream_for_change(conn, row[0], what)
        conn.execute("DELETE FROM cv.transforms WHERE name = %s", (name,))  # its positions and changes too
        view_feeds.drop_if_unused(conn, row[0], store.scope(conn))  # the output it read, if nothing else does
        log.info("transform dropped", transform=name)
        lines.append(f"transform {name} dropped")
    return Outcome("; ".join(lines), changed=any(line.endswith("dropped") for line in lines))


def _check_into(
    conn: psycopg.Connection, transform: TransformDef, target: StreamDef, columns: list[tuple[str, str]], what: str
) -> None:
    """insert_into_stream: a stream written with SQL, whose columns have the outputs' types, in order."""
    if not stream_inserts.writable(target):
        raise DefinitionError(f"{what}: insert_into_stream({target.name!r}): {target.name} is not written with SQL")
    assert transform.into is not None
    declared = {c.name: c.type for c in target.columns}
    pairs = [(t, declared[c]) for (_, t), c in zip(columns, transform.into[1], strict=True)]
    same = conn.execute(
        "SELECT bool_and(to_regtype(o) = to_regtype(s)) FROM unnest(%s::text[], %s::text[]) AS p(o, s)",
        ([o for o, _ in pairs], [t for _, t in pairs]),
    ).fetchone()[0]
    if not same:
        wanted = ", ".join(f"{c} {declared[c]}" for c in transform.into[1])
        given = ", ".join(f"{n} {t}" for n, t in columns)
        raise DefinitionError(
            f"{what}: {target.name} must have the same columns as the transform: ({wanted}), not ({given})"
        )


def transforms_of(conn: psycopg.Connection, stream: str) -> list[str]:
    """The names of the transforms reading `stream` or writing into it (insert_into_stream), in name order."""
    rows = conn.execute("SELECT name, stream FROM cv.transforms ORDER BY name").fetchall()
    return sorted({name for name, reads in rows if reads == stream} | set(writers_of(conn, stream)))


def writers_of(conn: psycopg.Connection, stream: str) -> list[str]:
    """The names of the transforms writing into `stream` (insert_into_stream), in name order."""
    rows = conn.execute(
        "SELECT name, definition FROM cv.transforms WHERE definition ~* 'insert_into_stream' ORDER BY name"
    ).fetchall()
    return [name for name, definition in rows if writes_into(definition) == stream]


def load_transforms(conn: psycopg.Connection, streams: Mapping[str, StreamDef], stream: str) -> list[TransformDef]:
    """The transforms of one stream in name order, read from their stored statements."""
    rows = conn.execute("SELECT definition FROM cv.transforms WHERE stream = %s ORDER BY name", (stream,)).fetchall()
    scope = store.scope(conn, streams)
    return [parse_transform(definition, scope) for (definition,) in rows]
