"""The relation users read: `<schema>.<view>`, a plain view of the declared columns over the storage.

Storage (`cv.<schema>__<view>`) holds the groups, the stored aggregates and the engine's bookkeeping;
the read view computes each output from them (an average from its count and sum, a percentile from
its digest) and shows nothing else. PostgreSQL inlines a plain view, so a read by group key is still
a lookup in the storage's unique index.
"""

from __future__ import annotations

import pglast
from psycopg import sql

from pipelines.cv.frontend.aggregate_calls import Reader, translate
from pipelines.cv.frontend.view_shapes import EACH_ROW_GROUP, GLOBAL_GROUP
from pipelines.cv.frontend.windows import STEP_COLUMN
from pipelines.cv.model import AggregateCall, ViewDef, call_placeholder
from pipelines.cv.views.aggregates import ROWS, stored_value, window_merge
from pipelines.cv.views.compiler import storage_table
from pipelines.cv.views.sql_text import comma_list, ident
from pipelines.cv.views.view_types import ViewTypes
from pipelines.cv.views.windows import horizon, keyed_merge

# What the counts of a view without GROUP BY read before any row (and a window's, over no step): 0.
_ZERO_WHEN_EMPTY = frozenset({"count", "count_distinct"})


def read_view(view: ViewDef) -> sql.Identifier:
    """The relation users read: `<schema>.<view>`, only the declared columns."""
    return ident(view.schema, view.name)


def create_read_view(view: ViewDef, types: ViewTypes) -> sql.Composed:
    """DDL of the relation users read: the declared columns in select-list order, nothing else.

    A plain view over the storage table: PostgreSQL inlines it, so a read by group key is still a
    lookup in the storage's unique index. A sliding window's view merges the steps that overlap the
    window, grouped by the declared groups; a condition on a group column is pushed below the
    grouping, so a read by group key is an index range scan over that group's steps.
    """
    columns = comma_list([sql.SQL(c) for c in output_columns(view, types)])
    if is_global(view):
        # One row, as PostgreSQL's own SELECT without GROUP BY: before the first event too, and after
        # every row was retracted (the storage then has none: counts read 0, the others NULL).
        return sql.SQL("CREATE VIEW {} AS SELECT {} FROM (SELECT) AS _cv_one LEFT JOIN {} AS s ON true").format(
            read_view(view), columns, storage_table(view)
        )
    each_row = EACH_ROW_GROUP in view.groups  # each row as many times as it was counted
    if view.window is None and each_row:
        return sql.SQL(
            "CREATE VIEW {} AS SELECT {} FROM {} AS s CROSS JOIN LATERAL generate_series(1, s.{}) AS _cv_n"
        ).format(read_view(view), columns, storage_table(view), ident(ROWS))
    if view.window is None:
        return sql.SQL("CREATE VIEW {} AS SELECT {} FROM {} AS s").format(read_view(view), columns, storage_table(view))
    groups = [sql.SQL("s.{}").format(ident(g.name)) for g in view.groups if g.name != STEP_COLUMN]
    group_by = sql.SQL(" GROUP BY {}").format(comma_list(groups)) if groups else sql.SQL("")
    if each_row:  # the rows of the window: its steps' counts of each row summed
        return sql.SQL(
            "CREATE VIEW {} AS SELECT {} FROM (SELECT {}, sum(s.{}) AS {} FROM {} AS s WHERE s.{} > {}{}) AS s"
            " CROSS JOIN LATERAL generate_series(1, s.{}) AS _cv_n"
        ).format(
            read_view(view),
            columns,
            comma_list(groups),
            ident(ROWS),
            ident(ROWS),
            storage_table(view),
            ident(STEP_COLUMN),
            horizon(view.window),
            group_by,
            ident(ROWS),
        )
    return sql.SQL("CREATE VIEW {} AS SELECT {} FROM {} AS s WHERE s.{} > {}{}").format(
        read_view(view), columns, storage_table(view), ident(STEP_COLUMN), horizon(view.window), group_by
    )


def output_columns(view: ViewDef, types: ViewTypes) -> list[str]:
    """Each output as `<SQL> AS <name>`: a group column, or its expression with each call's reader in place."""
    refs = {}
    for aggregate, type_ in zip(view.aggregates, types.aggregates, strict=True):
        column = f"s.{_quoted(aggregate.name)}"
        if view.window is None:
            refs[aggregate.name] = stored_value(aggregate, column, types.states)
            if is_global(view) and aggregate.kind in _ZERO_WHEN_EMPTY:
                refs[aggregate.name] = f"coalesce({refs[aggregate.name]}, 0)"
        elif aggregate.kind == "keyed":  # merged with the sibling key column: the view is needed
            refs[aggregate.name] = keyed_merge(view, aggregate, column)
        else:
            refs[aggregate.name] = window_merge(aggregate, column, type_, types.states)
            if len(view.groups) == 1 and aggregate.kind in _ZERO_WHEN_EMPTY:  # one row, over no steps too
                refs[aggregate.name] = f"coalesce({refs[aggregate.name]}, 0)"
    columns = []
    for output in view.outputs:
        if output.is_group:
            columns.append(f"s.{_quoted(output.sql)} AS {_quoted(output.name)}")
            continue
        text = output.sql
        # Placeholders end with "_": _cv_call_1_ is never part of _cv_call_10_.
        for index, call in enumerate(view.calls):
            placeholder = call_placeholder(index)
            if placeholder in text:
                reader = reader_of(call, view)
                result_type = types.calls[index] if index < len(types.calls) else ""
                value = reader([refs[n] for n in call.stored], result_type)
                if result_type == "bit":  # kept as bit varying; bitand(x, x) is x as bit of any length
                    value = f"bitand({value}, {value})"
                text = text.replace(placeholder, f"({value})")
        columns.append(f"{text} AS {_quoted(output.name)}")
    return columns


def is_global(view: ViewDef) -> bool:
    """True for a view without GROUP BY (and without a window): one row, under a constant group."""
    return view.groups == (GLOBAL_GROUP,)


def reader_of(call: AggregateCall, view: ViewDef) -> Reader:
    """The reader of a call (re-translated from its text: readers are code, not catalog data)."""
    node = pglast.parse_sql(f"SELECT {call.sql}")[0].stmt.targetList[0].val
    return translate(node, view.qualified_name, windowed=view.window is not None).reader


def _quoted(name: str) -> str:
    return sql.Identifier(name).as_string(None)
