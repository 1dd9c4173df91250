"""Pieces of the maintenance SQL, composed with psycopg.sql: names, definition expressions, lists.

A string literal kept as SQL text (in a definition) is pipelines.cv.sqltext.parsing.string_literal.
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

CV_SCHEMA = "cv"  # the engine's schema: catalog, streams' state, views' storage, helper functions


def ident(*parts: str) -> sql.Identifier:
    """A quoted name: `ident("cv", "state_likes")` is `"cv"."state_likes"`."""
    return sql.Identifier(*parts)


def raw(text: str) -> sql.SQL:
    """An expression of a view or stream definition (or a type name), as SQL text."""
    # Expressions come from the view definition, parsed and deparsed by pglast and checked to
    # reference stream columns only; they are SQL text written by the view's author, never event data.
    # A `%` (modulo, LIKE patterns) is doubled: maintenance statements run with parameters, where
    # psycopg reads `%` as a placeholder, so every statement holding an expression is executed with a
    # parameter list (empty if need be).
    return sql.SQL(text.replace("%", "%%"))


def comma_list(items: list[sql.Composable]) -> sql.Composed:
    """The items, separated by commas."""
    return sql.SQL(", ").join(items)


def columns_of(row: str, names: Sequence[str]) -> sql.Composed:
    """`row.a, row.b`: the named columns of relation `row`, or of a composite value (`(new)`)."""
    return comma_list([sql.SQL("{}.{}").format(sql.SQL(row), ident(n)) for n in names])


# Types whose input reads the text of their JSON scalar back to the same value (to_jsonb writes them
# as a JSON string, number or boolean): `(key ->> 'c')::type` is then what jsonb_populate_record
# makes of the field, at a fraction of the cost (it looks up every column of the row type it fills).
# Arrays, json and composite types are not scalars in JSON: a key with one of those is populated.
SCALAR_JSON_TYPES = frozenset(
    {"smallint", "integer", "bigint", "numeric", "real", "double precision", "text", "character varying"}
    | {"boolean", "date", "uuid", "interval", "timestamp with time zone", "timestamp without time zone"}
)


def typed_from_json(json: sql.Composable, columns: Sequence[tuple[str, str]], row_type: sql.Composable) -> sql.Composed:
    """A FROM item of one row: the fields `columns` (name, type) of the JSON object `json`, typed.

    Each field is cast from its text when every type is in SCALAR_JSON_TYPES; otherwise the object
    is populated as `row_type`, a composite type holding those columns (a table's row type). Both
    read what to_jsonb wrote back to the same values; the cast is the cheaper by far
    (docs/performance.md: a feed's statement and the relay's page, both typing their pages' keys).
    """
    if not all(type_.split("(")[0].strip() in SCALAR_JSON_TYPES for _, type_ in columns):
        return sql.SQL("jsonb_populate_record(NULL::{}, {})").format(row_type, json)
    fields = [sql.SQL("({} ->> {})::{} AS {}").format(json, sql.Literal(n), raw(t), ident(n)) for n, t in columns]
    return sql.SQL("(SELECT {})").format(comma_list(fields))


def found_by_key(
    select: sql.Composable,
    row: str,
    probe: str,
    names: Sequence[str],
    null_in_probe: sql.Composable,
    where: sql.Composable | None = None,
) -> sql.Composed:
    """`select` (SELECT ... FROM, no WHERE) for the row `row` whose key columns `names` are the probe's.

    Two branches, UNION ALL: by `=`, which the relation's unique index answers; and, for a probe key
    with a NULL (a group kept under UNIQUE NULLS NOT DISTINCT, which `=` cannot find), by IS NOT
    DISTINCT FROM. `null_in_probe` says the probe key has a NULL, on the outer query alone, so that
    PostgreSQL skips the second branch for a key without one. `where`: a condition both branches add.
    """
    equal = sql.SQL(" AND ").join(
        sql.SQL("{}.{} = {}.{}").format(sql.SQL(row), ident(n), sql.SQL(probe), ident(n)) for n in names
    )
    same = sql.SQL("({}) IS NOT DISTINCT FROM ({})").format(columns_of(row, names), columns_of(probe, names))
    given = sql.SQL("") if where is None else sql.SQL("{} AND ").format(where)
    return sql.SQL("{select} WHERE {given}{equal} UNION ALL {select} WHERE {given}({null}) AND {same}").format(
        select=select, given=given, equal=equal, null=null_in_probe, same=same
    )
