"""A view's stored aggregates: how each is computed over a batch of deltas and merged into its row.

How each kind merges a batch (`v` the stored row, `d` the batch's aggregate for the group):

| kind                 | stored              | merge                                             |
| count(*) / count(x)  | bigint              | v + d (d may be negative)                         |
| sum(x)               | type of sum(x)      | v + d (sum over no rows is 0, not NULL)           |
| min(x) / max(x)      | type of x           | least / greatest; over a keyed stream, the first  |
|                      |                     | value of the group's counts (extremes.py)         |
| hll                  | hll                 | hll_union; retractions leave it unchanged         |
| count_distinct       | bigint              | v + (values entering - values leaving the group)  |
| set                  | x[]                 | (v - values leaving) || values entering           |
| tdigest              | tdigest             | tdigest_union (append-only streams)               |
| topk                 | jsonb summary       | cv.topk_merge, Misra-Gries (append-only streams)  |
| state                | the aggregate's     | its combine function (append-only streams)        |
|                      | transition state    |                                                   |
| keyed, first, append,| see pipelines.cv.views.pipelinedb_columns (append-only streams)         |
| bloom, freq, bucket  |                                                                          |
| combined             | an upstream's       | recomputed from the feed's rows per changed group |
|                      | summary (combine()) | (pipelines.cv.views.combine)                      |

Any kind but the DISTINCT ones takes a FILTER (WHERE ...). Each view also keeps the number of stream
rows behind a group (ROWS), and, with array_agg(DISTINCT), the values a batch removes (REMOVED). See
pipelines.cv.views.compiler for the statements these make up, and `window_merge` for how the stored values
of a sliding window's steps are merged when it is read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from psycopg import sql

from pipelines.cv.model import DISTINCT_KINDS, Aggregate, ViewDef
from pipelines.cv.sqltext.parsing import split_arguments
from pipelines.cv.views.combine import recombined
from pipelines.cv.views.general import StateFunctions
from pipelines.cv.views.pipelinedb_columns import either as _either
from pipelines.cv.views.pipelinedb_columns import pipelinedb_column
from pipelines.cv.views.sql_text import ident, raw

ROWS = "_cv_rows"  # stream rows behind a group: the group is deleted when it reaches 0
REMOVED = "_cv_removed"  # scratch column carrying a batch's removals into ON CONFLICT; always NULL at rest
_DELTA_SIGN = sql.SQL("_cv_sign")  # a delta row's sign: +1 entering its group, -1 leaving


@dataclass(frozen=True)
class StoredColumn:
    """How one stored column receives a batch: its aggregate over the batch, and its merge."""

    target: str
    batch: sql.Composable
    merge: sql.Composable | None


def stored_columns(
    view: ViewDef,
    sign: sql.Composable,
    value: sql.Composable | None,
    rows_sign: sql.Composable = _DELTA_SIGN,
    states: Mapping[str, StateFunctions] | None = None,
    aggregates: tuple[Aggregate, ...] | None = None,
    extreme_merges: Mapping[str, sql.Composable] | None = None,
    distinct_sources: Sequence[tuple[sql.Composable, sql.Composable]] = (),
) -> list[StoredColumn]:
    """The view's stored columns: each one's aggregate over a batch, and its merge into the stored row.

    `sign`/`value`: where DISTINCT transitions come from (the deltas, or the transitions table).
    `distinct_sources`: with several DISTINCT expressions, each one's (sign, value), by its index in
    ViewDef.distinct_args (the first's being `sign`/`value`).

    `rows_sign` is what `count(*)` and the group's row count add up: the deltas' sign, or, for views
    aggregated from transitions alone (`counts_from_transitions`), the transitions' sign.

    `states`: the functions of aggregates kept as their transition state, by stored column.

    `aggregates`: the view's, with their arguments and filters as inputs computed beforehand.

    `extreme_merges`: min/max over a keyed stream, by stored column: their merge (the engine then reads
    them from their value counts, pipelines.cv.views.extremes, since a retraction may take an extreme away).
    """
    columns = []
    rows = sql.SQL("sum({})").format(rows_sign)
    sources = list(distinct_sources) or [(sign, value)]
    for original, aggregate in zip(view.aggregates, aggregates or view.aggregates, strict=True):
        if original.kind in DISTINCT_KINDS:  # the transitions of its own expression
            index = view.distinct_args.index(original.arg_sql or "")
            sign, value = sources[index]
            removed = ident(removed_column(index))
        col = ident(aggregate.name)
        a = raw(aggregate.arg_sql) if aggregate.arg_sql else None
        where = raw(aggregate.filter_sql) if aggregate.filter_sql else None
        add = sql.SQL("v.{0} + excluded.{0}").format(col)
        if aggregate.kind == "count" and a is None and where is None:
            columns.append(StoredColumn(aggregate.name, rows, add))
        elif aggregate.kind == "count":
            conditions = [sql.SQL("({}) IS NOT NULL").format(a)] if a is not None else []
            conditions += [sql.SQL("({})").format(where)] if where is not None else []
            batch = sql.SQL("coalesce(sum({}) FILTER (WHERE {}), 0)").format(
                rows_sign, sql.SQL(" AND ").join(conditions)
            )
            columns.append(StoredColumn(aggregate.name, batch, add))
        elif aggregate.kind == "sum":
            # '0' - x and '0' take x's type: money has no unary minus, and interval or money no 0.
            batch = sql.SQL("coalesce(sum(CASE WHEN _cv_sign > 0 THEN ({0}) ELSE '0' - ({0}) END){1}, '0')").format(
                a, _filter(where)
            )
            columns.append(StoredColumn(aggregate.name, batch, add))
        elif aggregate.kind in {"min", "max"} and extreme_merges and aggregate.name in extreme_merges:
            batch = sql.SQL(f"{aggregate.kind}({{}}) FILTER (WHERE _cv_sign > 0{{}})").format(a, _and(where))
            columns.append(StoredColumn(aggregate.name, batch, extreme_merges[aggregate.name]))
        elif aggregate.kind in {"min", "max"}:
            extreme = "least" if aggregate.kind == "min" else "greatest"
            columns.append(
                StoredColumn(
                    aggregate.name,
                    sql.SQL(f"{aggregate.kind}({{}}){{}}").format(a, _filter(where)),
                    sql.SQL(f"{extreme}(v.{{0}}, excluded.{{0}})").format(col),
                )
            )
        elif aggregate.kind == "hll":
            merge = _either(col, sql.SQL("hll_union(v.{0}, excluded.{0})").format(col))
            adding = "hll_union_agg" if aggregate.params[:1] == ("union",) else "hll_add_agg"
            batch = sql.SQL(adding + "({}) FILTER (WHERE _cv_sign > 0{})").format(a, _and(where))
            columns.append(StoredColumn(aggregate.name, batch, merge))
        elif aggregate.kind in {"keyed", "first", "append", "bloom", "freq", "bucket"}:
            columns.append(StoredColumn(aggregate.name, *pipelinedb_column(view, aggregate, where)))
        elif aggregate.kind == "tdigest":
            merge = _either(col, sql.SQL("tdigest_union(v.{0}, excluded.{0})").format(col))
            # A digest built from the group's values in one call: the aggregate tdigest() keeps a ~13 kB
            # state per group while the batch is grouped, which made a 50,000-row batch of 10,000
            # groups 4x slower than collecting the values first.
            batch = sql.SQL("tdigest_add(NULL::tdigest, array_agg({}) FILTER (WHERE _cv_sign > 0{}), {})").format(
                a, _and(where), sql.Literal(int(aggregate.params[0]))
            )
            columns.append(StoredColumn(aggregate.name, batch, merge))
        elif aggregate.kind == "topk":
            capacity = sql.Literal(int(aggregate.params[0]))
            batch = sql.SQL("cv.topk_add(NULL, array_agg({}) FILTER (WHERE _cv_sign > 0{}), {})").format(
                a, _and(where), capacity
            )
            if aggregate.params[1:] == ("weighted",):  # topk_agg(x, k, weight): values and weights side by side
                x, w = (raw(e) for e in split_arguments(aggregate.arg_sql or ""))
                batch = sql.SQL(
                    "cv.topk_add_weighted(NULL, array_agg({0}) FILTER (WHERE _cv_sign > 0{2}),"
                    " array_agg({1}) FILTER (WHERE _cv_sign > 0{2}), {3})"
                ).format(x, w, _and(where), capacity)
            merge = sql.SQL("cv.topk_merge(v.{0}, excluded.{0}, {1})").format(col, capacity)
            columns.append(StoredColumn(aggregate.name, batch, merge))
        elif aggregate.kind == "state":
            functions = (states or {})[aggregate.name]
            batch = sql.SQL("{}({}) FILTER (WHERE _cv_sign > 0{})").format(raw(functions.partial), a, _and(where))
            merge = _either(col, sql.SQL("{}(v.{}, excluded.{})").format(raw(functions.combine), col, col))
            columns.append(StoredColumn(aggregate.name, batch, merge))
        elif aggregate.kind == "combined":  # combine() of a summary over a view's rows: recomputed per group
            columns.append(StoredColumn(aggregate.name, *recombined(view, aggregate, window_merge, states)))
        elif aggregate.kind == "count_distinct":
            batch = sql.SQL("coalesce(sum({}) FILTER (WHERE ({}) IS NOT NULL), 0)").format(sign, value)
            columns.append(StoredColumn(aggregate.name, batch, add))
        else:  # set
            entering = sql.SQL("coalesce(array_agg({0}) FILTER (WHERE {1} > 0 AND ({0}) IS NOT NULL), '{{}}')")
            merge = sql.SQL(
                "CASE WHEN excluded.{removed} IS NULL THEN v.{0} || excluded.{0}"
                " ELSE cv.set_remove(v.{0}, excluded.{removed}) || excluded.{0} END"
            ).format(col, removed=removed)
            columns.append(StoredColumn(aggregate.name, entering.format(value, sign), merge))
    for index in removed_indexes(view):
        sign, value = sources[index]
        leaving = sql.SQL("array_agg({0}) FILTER (WHERE {1} < 0 AND ({0}) IS NOT NULL)").format(value, sign)
        columns.append(StoredColumn(removed_column(index), leaving, sql.SQL("NULL")))
    columns.append(StoredColumn(ROWS, rows, sql.SQL("v.{0} + excluded.{0}").format(ident(ROWS))))
    return columns


def removed_indexes(view: ViewDef) -> list[int]:
    """The DISTINCT expressions (by index in ViewDef.distinct_args) an array_agg(DISTINCT) keeps a set of."""
    return sorted({view.distinct_args.index(a.arg_sql or "") for a in view.aggregates if a.kind == "set"})


def removed_column(index: int) -> str:
    """The scratch column of the values a batch removes from the sets over DISTINCT expression `index`."""
    return REMOVED if index == 0 else f"{REMOVED}{index + 1}"


def _filter(where: sql.Composable | None) -> sql.Composable:
    return sql.SQL(" FILTER (WHERE {})").format(where) if where is not None else sql.SQL("")


def _and(where: sql.Composable | None) -> sql.Composable:
    return sql.SQL(" AND ({})").format(where) if where is not None else sql.SQL("")


def stored_value(aggregate: Aggregate, column: str, states: Mapping[str, StateFunctions]) -> str:
    """How a read view reads a stored aggregate: the column, or a kept state's final value."""
    if aggregate.kind == "state":
        return states[aggregate.name].final_of(column)
    return column


def window_merge(aggregate: Aggregate, column: str, type_: str, states: Mapping[str, StateFunctions]) -> str:
    """The aggregate merging a group's steps of a sliding window at read time (SQL over `column`)."""
    kind = aggregate.kind
    if kind in {"count", "sum"}:
        return f"CAST(sum({column}) AS {type_})"
    if kind in {"min", "max"}:
        return f"{kind}({column})"
    if kind == "hll":
        return f"hll_union_agg({column})"
    if kind == "tdigest":
        return f"tdigest({column})"
    if kind == "topk":
        return f"cv.topk_merge_agg({column}, {int(aggregate.params[0])})"
    if kind in {"bloom", "freq"}:  # pgext's aggregates, in public
        return f"{'bloom_union_agg' if kind == 'bloom' else 'freq_merge_agg'}({column})"
    if kind == "state":
        return states[aggregate.name].final_of(f"{states[aggregate.name].combine_aggregate}({column})")
    raise AssertionError(f"{kind} is not kept in sliding windows")  # DISTINCT kinds: refused by the parser
