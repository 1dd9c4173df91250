"""A continuous transform's SQL: its SELECT over a batch, recorded as its change stream in one statement.

The batch is an append-only stream's array parameters (the same ones its views read, see
pipelines.cv.views.stream_sql.batch_source), numbered in batch order; over another transform's
output, the rows that transform recorded in the feed's page, numbered by their position. One statement per transform and
batch projects and filters the events (joined with the table, if any), advances the transform's
position row by the number of rows that passed, inserts one change per row into cv.view_changes
(before NULL, after the row) and notifies `streamviews_changes` as cv.record_view_changes does. A
batch where nothing passes writes nothing, and does not even lock the position row.
"""

from __future__ import annotations

from psycopg import sql

from pipelines.cv.frontend.transforms import POSITION
from pipelines.cv.model import StreamDef, TransformDef
from pipelines.cv.views import compiler, stream_sql
from pipelines.cv.views.sql_text import comma_list, ident, raw

SEQ = "_cv_seq"  # the event's place in the batch: positions follow it


def referenced_columns(transform: TransformDef) -> set[str]:
    """The stream columns the transform reads (a superset: any name its expressions use)."""
    expressions = [o.sql for o in transform.outputs]
    expressions += [transform.where_sql] if transform.where_sql else []
    expressions += transform.join.conditions if transform.join else []
    return stream_sql.referenced_names(expressions)


def numbered_batch(stream: StreamDef, shipped: tuple[str, ...]) -> sql.Composed:
    """The batch's events from their array parameters (`shipped` columns; the others NULL), numbered in order."""
    by_name = {c.name: c for c in stream.columns}
    columns = [
        stream_sql.shipped_value(c)
        if c.name in shipped
        else sql.SQL("NULL::{} AS {}").format(raw(c.type), ident(c.name))
        for c in stream.columns
    ]
    return sql.SQL("(SELECT {}, {} FROM unnest({}) WITH ORDINALITY AS b({}, {}))").format(
        comma_list(columns),
        ident(SEQ),
        comma_list([stream_sql.shipped_array(by_name[c]) for c in shipped]),
        comma_list([ident(c) for c in shipped]),
        ident(SEQ),
    )


def select(transform: TransformDef, source: sql.Composable, *, numbered: bool = True) -> sql.Composed:
    """The transform's SELECT over `source` (with the event's number first, when `numbered`)."""
    stream_alias = transform.join.stream_alias if transform.join else "d"
    outputs = [sql.SQL("{} AS {}").format(raw(o.sql), ident(o.name)) for o in transform.outputs]
    if numbered:
        outputs.insert(0, sql.SQL("{}.{}").format(ident(stream_alias), ident(SEQ)))
    where = sql.SQL(" WHERE ({})").format(raw(transform.where_sql)) if transform.where_sql else sql.SQL("")
    # compiler._from is the views' FROM: the stream as `d`, or joined under the aliases of the definition.
    return sql.SQL("SELECT {} FROM {}{}").format(comma_list(outputs), compiler._from(transform, source), where)


def record(transform: TransformDef, stream: StreamDef, shipped: tuple[str, ...]) -> sql.Composed:
    """The one statement of a batch: project, number, record, notify. Returns (notified, rows) or no row.

    Positions: the position row is advanced by the number of rows that passed, in this statement,
    and stays locked until the batch commits, so positions commit in order (as a view's do at
    commit, migration 0020). Within the batch they follow the events' order. The key is the
    declared key columns' values, or the change's own position.
    """
    name = sql.Literal(transform.qualified_name)
    # Another transform's output is read where it is recorded, with the feed's parameters (the engine's).
    source = stream_sql.numbered_appends(stream, SEQ) if stream.is_feed else numbered_batch(stream, shipped)
    if transform.key:
        key = sql.SQL("jsonb_build_object({})").format(
            comma_list([sql.SQL("{}, o.{}").format(sql.Literal(k), ident(k)) for k in transform.key])
        )
    else:
        key = sql.SQL("jsonb_build_object({}, o.{})").format(sql.Literal(POSITION), ident(POSITION))
    return sql.SQL(
        "WITH out AS MATERIALIZED ({select}),"
        " n AS (SELECT count(*) AS n FROM out),"
        " pos AS (UPDATE cv.view_change_positions AS p SET last = p.last + n.n FROM n"
        " WHERE p.view = {name} AND n.n > 0 RETURNING p.last, n.n),"
        " o AS (SELECT pos.last - pos.n + row_number() OVER (ORDER BY out.{seq}) AS {position},"
        " to_jsonb(out) - {seq_text} AS _cv_row, out.* FROM out, pos),"
        " ins AS (INSERT INTO cv.view_changes (view, position, key, before, after, delta, committed_at)"
        " SELECT {name}, o.{position}, {key}, NULL, o._cv_row, NULL, clock_timestamp() FROM o){into}"
        " SELECT pg_notify('streamviews_changes', cv.view_changes_payload(jsonb_build_object({name}, pos.last))),"
        " pos.n FROM pos"
    ).format(
        select=select(transform, source),
        name=name,
        seq=ident(SEQ),
        seq_text=sql.Literal(SEQ),
        position=ident(POSITION),
        key=key,
        into=_into(transform),
    )


def _into(transform: TransformDef) -> sql.Composable:
    """insert_into_stream: the output rows written into the stream as `INSERT INTO streams.<s>` would, in order.

    Through the stream's writable relation (pipelines.cv.catalog.stream_inserts), in the batch's
    transaction: a batch rolled back writes nothing, a committed one's rows reach the stream's topic.
    """
    if transform.into is None:
        return sql.SQL("")
    stream, columns = transform.into
    return sql.SQL(", fwd AS (INSERT INTO {} ({}) SELECT {} FROM out ORDER BY out.{})").format(
        ident("streams", stream),  # its writable relation, streams.<stream> (migration 0030)
        comma_list([ident(c) for c in columns]),
        comma_list([sql.SQL("out.{}").format(ident(o.name)) for o in transform.outputs]),
        ident(SEQ),
    )


def probe(transform: TransformDef, stream: StreamDef, table: sql.Identifier) -> sql.Composed:
    """A table of the transform's output columns, empty: what PostgreSQL resolves their types to.

    Over a batch of no event, typed as the stream declares. Run it with an empty parameter list.
    """
    columns = [sql.SQL("NULL::{} AS {}").format(raw(c.type), ident(c.name)) for c in stream.columns]
    source = sql.SQL("(SELECT {}, 0::bigint AS {} WHERE false)").format(comma_list(columns), ident(SEQ))
    return sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS {} WITH NO DATA").format(
        table, select(transform, source, numbered=False)
    )


def read_view(transform: TransformDef, columns: list[tuple[str, str]]) -> sql.Composed:
    """The relation `schema.name` users read: the recorded output still kept, typed, with its position.

    It reserves the name among PostgreSQL's relations, and read access to it is read access to the
    transform's change stream (cv.view_changes_readable asks cv.may_read_view).
    """
    return sql.SQL(
        "CREATE VIEW {} AS SELECT c.position AS {}, {} FROM cv.view_changes AS c"
        " CROSS JOIN LATERAL jsonb_to_record(c.after) AS r({}) WHERE c.view = {}"
    ).format(
        ident(transform.schema, transform.name),
        ident(POSITION),
        comma_list([sql.SQL("r.{}").format(ident(n)) for n, _ in columns]),
        comma_list([sql.SQL("{} {}").format(ident(n), raw(t)) for n, t in columns]),
        sql.Literal(transform.qualified_name),
    )
