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
