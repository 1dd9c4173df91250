"""Reference counts behind a view's DISTINCT aggregates: their tables and which expressions need them.

A view's DISTINCT aggregates are over one or more expressions (ViewDef.distinct_args, by index). An
expression the stream's key covers (with the group columns it identifies at most one stream row)
needs none: the batch's deltas netted per (group, value) are its transitions. Any other keeps a
table of reference counts, `<storage>__refs` for the first expression (the name views always had),
`__refs2`, `__refs3`, ... for the others, and a per-session table of each batch's transitions.
pipelines.cv.views.compiler maintains them, each by the same statements.
"""

from __future__ import annotations

from psycopg import sql

from pipelines.cv.model import StreamDef, ViewDef, storage_name
from pipelines.cv.views.sql_text import CV_SCHEMA, ident


def refs_table(view: ViewDef, index: int = 0) -> sql.Identifier:
    """Reference counts behind a view's DISTINCT aggregates over its `index`-th expression, when needed."""
    return refs_table_of(view.schema, view.name, index)


def refs_table_of(schema: str, view: str, index: int = 0) -> sql.Identifier:
    """The reference-count table's name for a view given by name (`cv.<schema>__<view>__refs`, `__refs2`...)."""
    return ident(CV_SCHEMA, f"{storage_name(schema, view)}__refs{suffix(index)}")


def transitions_table(view: ViewDef, index: int = 0) -> sql.Identifier:
    """Per-session table of a batch's DISTINCT transitions (values entering or leaving groups)."""
    return ident("pg_temp", f"cv_trans_{view.schema}_{view.name}{suffix(index)}")


def transitions_tables(view: ViewDef, stream: StreamDef) -> list[sql.Identifier]:
    """The session's transitions tables of a view (emptied between batches)."""
    return [transitions_table(view, index) for index in refs_indexes(view, stream)]


def suffix(index: int) -> str:
    """How the names of a view's `index`-th DISTINCT expression end: `` for the first, then 2, 3, ..."""
    return str(index + 1) if index else ""


def distinct_is_covered(view: ViewDef, stream: StreamDef, index: int = 0) -> bool:
    """True when (groups, distinct argument) identify at most one stream row: deltas are transitions."""
    if stream.key is None or len(view.distinct_args) <= index:
        return False
    arg = view.distinct_args[index]
    columns = {g.source_column for g in view.groups}
    if None in columns or arg not in stream.column_names:
        return False
    return set(stream.key) <= columns | {arg}


def refs_indexes(view: ViewDef, stream: StreamDef) -> list[int]:
    """The DISTINCT expressions (by index) that keep reference counts: those the stream's key does not cover."""
    return [i for i in range(len(view.distinct_args)) if not distinct_is_covered(view, stream, i)]


def drop_all_dead_refs(view: ViewDef, stream: StreamDef) -> list[sql.Composed]:
    """`drop_dead_refs` of each DISTINCT expression that keeps reference counts."""
    return [drop_dead_refs(view, index) for index in refs_indexes(view, stream)]


def drop_dead_refs(view: ViewDef, index: int = 0) -> sql.Composed:
    """Forget the values this batch made unreferenced (only they can have reached zero)."""
    # `value` is never NULL: the equality lets PostgreSQL hash the join; groups may be NULL.
    match = sql.SQL(" AND ").join(
        [sql.SQL("r.value = t.value")]
        + [sql.SQL("r.{0} IS NOT DISTINCT FROM t.{0}").format(ident(g.name)) for g in view.groups]
    )
    return sql.SQL("DELETE FROM {} AS r USING {} AS t WHERE t.sign < 0 AND r.n <= 0 AND {}").format(
        refs_table(view, index), transitions_table(view, index), match
    )
