"""Time buckets: the GROUP BY expressions a view's ttl expires groups by.

`date_trunc('hour', ts)` over a stream column, PipelineDB's helpers `second(ts)`, `minute(ts)`,
`hour(ts)`, `day(ts)`, `month(ts)`, `year(ts)` (truncation to that unit, in UTC), and
`date_round(ts, interval '5 minutes')` (ts rounded down to a multiple of the step): migration
0022_time_buckets_and_avg_terms.sql defines the helpers in SQL.
"""

from __future__ import annotations

from pglast import ast

BUCKET_UNITS = ("second", "minute", "hour", "day", "week", "month", "year")
# PipelineDB's one-argument helpers, each the unit it truncates to.
HELPERS = frozenset({"second", "minute", "hour", "day", "month", "year"})
# Calls a view's output may leave unnamed, named after the function as in PostgreSQL: `minute(ts)` is minute.
NAMED = HELPERS | {"date_round"}


def bucket_unit(node: ast.Node, columns: set[str]) -> str | None:
    """The unit of a time bucket over a stream column (`'5 minutes'` for date_round), else None."""
    if not isinstance(node, ast.FuncCall):
        return None
    name = [n.sval for n in node.funcname]
    args = node.args or ()
    if len(name) > 1 and name[0] not in {"public", "pg_catalog"}:
        return None
    function = name[-1].lower()
    if function == "date_trunc" and len(args) == 2 and _is_text(args[0]) and _is_column(args[1], columns):
        unit = args[0].val.sval.lower()
        return unit if unit in BUCKET_UNITS else None
    if function in HELPERS and len(args) == 1 and _is_column(args[0], columns):
        return function
    if function == "date_round" and len(args) == 2 and _is_column(args[0], columns):
        step = args[1].arg if isinstance(args[1], ast.TypeCast) else args[1]
        return step.val.sval if _is_text(step) else None
    return None


def _is_text(node: ast.Node) -> bool:
    return isinstance(node, ast.A_Const) and isinstance(node.val, ast.String)


def _is_column(node: ast.Node, columns: set[str]) -> bool:
    last = node.fields[-1] if isinstance(node, ast.ColumnRef) else None
    return isinstance(last, ast.String) and last.sval in columns
