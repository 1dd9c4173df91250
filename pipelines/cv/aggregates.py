"""A view's aggregates: how each is computed over a batch of deltas and merged into its stored row.

How each aggregate merges a batch (`v` the stored row, `d` the batch's aggregate for the group):

| aggregate            | stored              | merge                                             |
| count(*) / count(x)  | bigint              | v + d (d may be negative)                         |
| sum(x)               | type of sum(x)      | v + d (sum over no rows is 0, not NULL)           |
| min(x) / max(x)      | type of x           | least / greatest (append-only streams only)       |
| hll_add_agg(x)       | hll                 | hll_union; retractions leave it unchanged         |
| count(DISTINCT x)    | bigint              | v + (values entering - values leaving the group)  |
| array_agg(DISTINCT x)| x[]                 | (v - values leaving) || values entering           |

Each view also keeps the number of stream rows behind a group (ROWS), and, with array_agg(DISTINCT),
the values a batch removes (REMOVED). See pipelines.cv.compiler for the statements these make up.
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import sql

from pipelines.cv.definitions import ViewDef
from pipelines.cv.sql_text import ident, raw

ROWS = "_cv_rows"  # stream rows behind a group: the group is deleted when it reaches 0
REMOVED = "_cv_removed"  # scratch column carrying a batch's removals into ON CONFLICT; always NULL at rest
_DELTA_SIGN = sql.SQL("sign")  # a delta row's sign: +1 entering its group, -1 leaving


@dataclass(frozen=True)
class StoredColumn:
    """How one stored column receives a batch: its aggregate over the batch, and its merge."""

    target: str
    batch: sql.Composable
    merge: sql.Composable | None


def stored_columns(
    view: ViewDef, sign: sql.Composable, value: sql.Composable | None, rows_sign: sql.Composable = _DELTA_SIGN
) -> list[StoredColumn]:
    """The view's stored columns: each one's aggregate over a batch, and its merge into the stored row.

    `sign`/`value`: where DISTINCT transitions come from (the deltas, or the transitions table).

    `rows_sign` is what `count(*)` and the group's row count add up: the deltas' sign, or, for views
    aggregated from transitions alone (`counts_from_transitions`), the transitions' sign.
    """
    columns = []
    rows = sql.SQL("sum({})").format(rows_sign)
    for aggregate in view.aggregates:
        col = ident(aggregate.name)
        a = raw(aggregate.arg_sql) if aggregate.arg_sql else None
        add = sql.SQL("v.{0} + excluded.{0}").format(col)
        if aggregate.kind == "count" and a is None:
            columns.append(StoredColumn(aggregate.name, rows, add))
        elif aggregate.kind == "count":
            columns.append(
                StoredColumn(
                    aggregate.name, sql.SQL("coalesce(sum(sign) FILTER (WHERE ({}) IS NOT NULL), 0)").format(a), add
                )
            )
        elif aggregate.kind == "sum":
            batch = sql.SQL("coalesce(sum(CASE WHEN sign > 0 THEN ({0}) ELSE -({0}) END), 0)").format(a)
            columns.append(StoredColumn(aggregate.name, batch, add))
        elif aggregate.kind in {"min", "max"}:
            extreme = "least" if aggregate.kind == "min" else "greatest"
            columns.append(
                StoredColumn(
                    aggregate.name,
                    sql.SQL(f"{aggregate.kind}({{}})").format(a),
                    sql.SQL(f"{extreme}(v.{{0}}, excluded.{{0}})").format(col),
                )
            )
        elif aggregate.kind == "hll":
            merge = sql.SQL(
                "CASE WHEN excluded.{0} IS NULL THEN v.{0} WHEN v.{0} IS NULL THEN excluded.{0}"
                " ELSE hll_union(v.{0}, excluded.{0}) END"
            ).format(col)
            columns.append(
                StoredColumn(aggregate.name, sql.SQL("hll_add_agg({}) FILTER (WHERE sign > 0)").format(a), merge)
            )
        elif aggregate.kind == "count_distinct":
            batch = sql.SQL("coalesce(sum({}) FILTER (WHERE ({}) IS NOT NULL), 0)").format(sign, value)
            columns.append(StoredColumn(aggregate.name, batch, add))
        else:  # set
            entering = sql.SQL("coalesce(array_agg({0}) FILTER (WHERE {1} > 0 AND ({0}) IS NOT NULL), '{{}}')")
            merge = sql.SQL(
                "CASE WHEN excluded.{removed} IS NULL THEN v.{0} || excluded.{0}"
                " ELSE cv.set_remove(v.{0}, excluded.{removed}) || excluded.{0} END"
            ).format(col, removed=ident(REMOVED))
            columns.append(StoredColumn(aggregate.name, entering.format(value, sign), merge))
    if any(a.kind == "set" for a in view.aggregates):
        leaving = sql.SQL("array_agg({0}) FILTER (WHERE {1} < 0 AND ({0}) IS NOT NULL)").format(value, sign)
        columns.append(StoredColumn(REMOVED, leaving, sql.SQL("NULL")))
    columns.append(StoredColumn(ROWS, rows, sql.SQL("v.{0} + excluded.{0}").format(ident(ROWS))))
    return columns
