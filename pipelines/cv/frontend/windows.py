"""Sliding windows read from a view's WHERE clause, `WHERE ts > now() - interval '5 minutes'`, or option.

PipelineDB's option `WITH (sw = '5 minutes')` is a window over arrival_timestamp (`option_window`).

PipelineDB's clock_timestamp() works too, and `arrival_timestamp`, PipelineDB's arrival time, names
the stream's `timestamp_column` (the event's time, or the Kafka record's when the event has none).
A window view keeps its groups per *step* of the window: one more group column, `STEP_COLUMN`. How
the steps are stored, merged and expired is pipelines.cv.views.windows.
"""

from __future__ import annotations

from collections.abc import Mapping

from pglast import ast
from pglast.enums import BoolExprType, SQLValueFunctionOp

from pipelines.cv.model import DefinitionError, GroupColumn, StreamDef, Window
from pipelines.cv.sqltext.parsing import string_literal

STEP_COLUMN = "_cv_step"
_NOW = frozenset({"now", "clock_timestamp", "statement_timestamp", "transaction_timestamp"})


def split_window(
    where: ast.Node | None, stream: StreamDef, what: str, alias: str | None = None
) -> tuple[Window | None, ast.Node | None]:
    """The sliding window a WHERE clause declares (one conjunct), and what remains of the clause.

    With a join, the column may be qualified by the stream's `alias` (`s.arrival_timestamp`).
    """
    if where is None:
        return None, None
    conjuncts = list(where.args) if _is_and(where) else [where]
    windows = [(i, w) for i, c in enumerate(conjuncts) if (w := _window_of(c, stream, what, alias)) is not None]
    if not windows:
        return None, where
    if len(windows) > 1:
        raise DefinitionError(f"{what}: only one sliding-window condition (ts > now() - interval '...') per view")
    index, window = windows[0]
    rest = conjuncts[:index] + conjuncts[index + 1 :]
    if not rest:
        return window, None
    if len(rest) == 1:
        return window, rest[0]
    return window, ast.BoolExpr(boolop=BoolExprType.AND_EXPR, args=tuple(rest))


def _is_and(node: ast.Node) -> bool:
    return isinstance(node, ast.BoolExpr) and node.boolop == BoolExprType.AND_EXPR


def _window_of(node: ast.Node, stream: StreamDef, what: str, alias: str | None = None) -> Window | None:
    """`column > now() - <interval constant>` (or >=) as a Window; None for any other condition."""
    if not (isinstance(node, ast.A_Expr) and len(node.name) == 1 and node.name[0].sval in {">", ">="}):
        return None
    left, right = node.lexpr, node.rexpr
    if not (isinstance(right, ast.A_Expr) and len(right.name) == 1 and right.name[0].sval == "-"):
        return None
    if not _is_now(right.lexpr):
        return None
    fields = left.fields if isinstance(left, ast.ColumnRef) else ()
    names = [f.sval for f in fields if isinstance(f, ast.String)]
    if len(names) != len(fields) or not (len(names) == 1 or (len(names) == 2 and names[0] == alias)):
        raise DefinitionError(f"{what}: a sliding window compares a stream column: ts > now() - interval '...'")
    width = _interval(right.rexpr)
    if width is None:
        raise DefinitionError(
            f"{what}: a sliding window's width must be a constant interval, e.g. interval '5 minutes'"
        )
    return _checked(Window(names[-1], width), stream, what)


def _checked(window: Window, stream: StreamDef, what: str) -> Window:
    """The window over a timestamptz column of the stream (arrival_timestamp: its timestamp_column)."""
    column = window.column
    if column == "arrival_timestamp" and "arrival_timestamp" not in stream.column_names:
        if stream.timestamp_column is None:
            raise DefinitionError(
                f"{what}: arrival_timestamp is the stream's timestamp_column, and {stream.name} declares none"
            )
        column = stream.timestamp_column
    kinds = {c.name: c.kind for c in stream.columns}
    if kinds.get(column) != "timestamptz":
        raise DefinitionError(f"{what}: a sliding window slides over a timestamptz column of {stream.name}")
    return Window(column, window.width)


def option_window(
    options: Mapping[str, str], where_window: Window | None, stream: StreamDef, what: str
) -> Window | None:
    """PipelineDB's `WITH (sw = '1 minute' [, sw_column = 'ts'] [, step_factor = n])` as a Window.

    The window slides over `sw_column`, a timestamptz column of the stream (by default arrival_timestamp):
    the same window as `WHERE arrival_timestamp > clock_timestamp() - interval '1 minute'`. PipelineDB's
    step_factor (the step as a percentage of the window, 1 to 50) is accepted and checked; the step
    here is always 1/60 of the window (pipelines.cv.views.windows), finer than PipelineDB's default
    of 5 and than any step_factor from 2 up.
    """
    factor = options.get("step_factor")
    if factor is not None and not (factor.isdigit() and 1 <= int(factor) <= 50):
        raise DefinitionError(f"{what}: step_factor is an integer from 1 to 50 (a percentage of sw), not {factor!r}")
    width = options.get("sw")
    if width is None:
        for option in ("step_factor", "sw_column"):
            if option in options:
                raise DefinitionError(f"{what}: {option} applies to a sliding window: give sw = '<interval>' too")
        return where_window
    if where_window is not None:
        raise DefinitionError(
            f"{what}: sw and a WHERE sliding-window condition both declare a window; keep one of them"
        )
    return _checked(Window(options.get("sw_column", "arrival_timestamp"), width), stream, f"{what}: sw")


def _is_now(node: ast.Node) -> bool:
    if isinstance(node, ast.FuncCall):
        return node.funcname[-1].sval.lower() in _NOW and not node.args
    return isinstance(node, ast.SQLValueFunction) and node.op in (
        SQLValueFunctionOp.SVFOP_CURRENT_TIMESTAMP,
        SQLValueFunctionOp.SVFOP_LOCALTIMESTAMP,
    )


def _interval(node: ast.Node) -> str | None:
    if (
        isinstance(node, ast.TypeCast)
        and node.typeName.names[-1].sval == "interval"
        and isinstance(node.arg, ast.A_Const)
        and isinstance(node.arg.val, ast.String)
    ):
        return node.arg.val.sval
    return None


def step_group(window: Window) -> GroupColumn:
    """The extra group column of a window's storage: the start of each row's step."""
    return GroupColumn(STEP_COLUMN, f"cv.window_step({window.column}, {string_literal(window.width)}::interval)")
