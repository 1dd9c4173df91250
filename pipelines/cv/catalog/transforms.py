"""Continuous transforms in the catalog: created and dropped in the caller's transaction (migration 0026).

A transform is a row of cv.transforms (its statement and its output columns' types), a position row
in cv.view_change_positions (its change stream, recorded by the engine: pipelines.cv.views.transforms)
and a read view `schema.name` over its recorded output. It keeps no state, so it starts from now,
whatever the stream: there is nothing to backfill from an append-only stream.

Locks follow pipelines.cv.catalog.locks: the read view first (DROP), then the stream's lock, which
no batch of the stream holds meanwhile.
"""

from __future__ import annotations

from collections.abc import Mapping

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from pipelines.cv.catalog import change_streams, store
from pipelines.cv.catalog.locks import Outcome, drop_read_view, lock_stream_for_change
from pipelines.cv.frontend.transforms import DropTransform, parse_transform
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
    stream = scope.streams[transform.stream]
    lock_stream_for_change(conn, stream.name, what)
    columns = output_types(conn, transform, stream)
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
        log.info("transform dropped", transform=name)
        lines.append(f"transform {name} dropped")
    return Outcome("; ".join(lines), changed=any(line.endswith("dropped") for line in lines))


def transforms_of(conn: psycopg.Connection, stream: str) -> list[str]:
    """The names of the transforms reading `stream`, in name order."""
    rows = conn.execute("SELECT name FROM cv.transforms WHERE stream = %s ORDER BY name", (stream,)).fetchall()
    return [name for (name,) in rows]


def load_transforms(conn: psycopg.Connection, streams: Mapping[str, StreamDef], stream: str) -> list[TransformDef]:
    """The transforms of one stream in name order, read from their stored statements."""
    rows = conn.execute("SELECT definition FROM cv.transforms WHERE stream = %s ORDER BY name", (stream,)).fetchall()
    scope = store.scope(conn, streams)
    return [parse_transform(definition, scope) for (definition,) in rows]
