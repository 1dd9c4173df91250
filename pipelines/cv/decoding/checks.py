"""A stream's CHECK constraints and DEFAULTs, compiled once and enforced on every decoded row.

now() / current_timestamp are the decoding time, and current_date the UTC date.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pglast
from pglast import ast
from pglast.enums import SQLValueFunctionOp
from pglast.stream import RawStream

from pipelines.cv.decoding.expressions import EvalError, ExpressionCompiler
from pipelines.cv.model import Check, Column, DefinitionError
from pipelines.cv.sqltext.types import INPUT
from pipelines.runtime.events import DETAIL_LIMIT, InvalidEvent


@dataclass(frozen=True)
class CompiledCheck:
    """A compiled CHECK: `test(*values of columns)` is True, False or None (NULL: the check passes).

    Attributes:
        bounds: (lowest, highest) allowed value when the check is `column <op> integer` on an integer
            column (or an AND / BETWEEN of such): exactly a msgspec constraint on that column.
    """

    reason: str
    sql: str
    names: tuple[str, ...]
    columns: tuple[int, ...]
    test: Callable[..., bool | None]
    bounds: tuple[int | None, int | None] | None = None


def enforce(check: CompiledCheck, values: tuple) -> None:
    """Reject the values (InvalidEvent, the check's reason) unless the CHECK passes: true or NULL."""
    try:
        passed = check.test(*values)
    except EvalError as e:
        shown = ", ".join(f"{n} = {_sql_value(v)}" for n, v in zip(check.names, values, strict=True))
        raise InvalidEvent(check.reason, f"{shown}: CHECK ({check.sql}) fails: {e}") from None
    if passed is False:
        shown = ", ".join(f"{n} = {_sql_value(v)}" for n, v in zip(check.names, values, strict=True))
        raise InvalidEvent(check.reason, f"{shown} violates CHECK ({check.sql})")


def _sql_value(value: Any) -> str:
    if value is None:
        return "NULL"
    if type(value) is bool:
        return "true" if value else "false"
    if isinstance(value, int | float | Decimal):
        return str(value)
    if isinstance(value, datetime | date):
        return f"'{value.isoformat()}'"
    return "'" + str(value)[:DETAIL_LIMIT].replace("'", "''") + "'"


def _parse_expression(sql: str, what: str) -> ast.Node:
    try:
        statement = pglast.parse_sql(f"SELECT {sql}")[0].stmt
    except pglast.parser.ParseError as e:
        raise DefinitionError(f"{what}: {sql}: {e}") from None
    targets = statement.targetList or ()
    if len(targets) != 1 or statement.fromClause or statement.whereClause:
        raise DefinitionError(f"{what}: {sql} is not one expression")
    return targets[0].val


def compile_check(check: Check, columns: dict[str, tuple[int, Column]], what: str) -> CompiledCheck:
    """A CHECK over `columns` (name -> (position in the row, column)), or DefinitionError naming what fails."""
    label = f"CHECK ({check.sql})"
    compiler = ExpressionCompiler(columns, what, label)
    root = compiler.compile(_parse_expression(check.sql, f"{what}: {label}"))
    if root.kind not in ("bool", "null"):
        raise compiler.fail(f"a CHECK is a condition, not a {root.kind} value")
    fn = root.fn
    bounds = root.bounds[1:] if root.bounds is not None and len(compiler.refs) == 1 else None
    return CompiledCheck(
        check.name or "check_violation",
        check.sql,
        tuple(compiler.refs),
        tuple(columns[name][0] for name in compiler.refs),
        lambda *values: fn(values),
        bounds,
    )


def _input_default(node: ast.Node, column: Column, compiler: ExpressionCompiler) -> Callable[[], Any]:
    """The DEFAULT of a column PostgreSQL reads (kind input): a string (its text, as an event's field) or NULL.

    Whether PostgreSQL reads the string as the type is asked at CREATE STREAM
    (pipelines.cv.catalog.stream_types), as for an event's value.
    """
    if isinstance(node, ast.TypeCast) and RawStream()(node.typeName) == column.type:
        node = node.arg  # 'x'::<the column's type>
    if isinstance(node, ast.A_Const) and node.isnull:
        if column.not_null:
            raise compiler.fail(f"NULL in the NOT NULL column {column.name}")
        return lambda: None
    if not (isinstance(node, ast.A_Const) and isinstance(node.val, ast.String)):
        raise compiler.fail(f"a default of a {column.type} column is a string PostgreSQL reads as one, or NULL")
    text = json.dumps(node.val.sval)  # as an event's JSON string field
    return lambda: text


def default_text(column: Column) -> str | None:
    """The text a DEFAULT of a column of kind input gives PostgreSQL's input (None: none, or NULL)."""
    if column.kind != INPUT or column.default is None:
        return None
    value = compile_default(column, lambda v: v, (), f"column {column.name}")()
    return None if value is None else json.loads(value)


def compile_default(
    column: Column, from_json: Callable[[Any], Any], checks: tuple[CompiledCheck, ...], what: str
) -> Callable[[], Any]:
    """A DEFAULT as a function of nothing: a constant, or the time of decoding.

    A constant is read by the column's `from_json` and must pass its `checks`.
    """
    assert column.default is not None
    label = f"DEFAULT {column.default}"
    node = _parse_expression(column.default, f"{what}: {label}")
    now_function = isinstance(node, ast.FuncCall) and node.funcname[-1].sval in ("now", "clock_timestamp")
    value_function = isinstance(node, ast.SQLValueFunction)
    if now_function or (value_function and node.op == SQLValueFunctionOp.SVFOP_CURRENT_TIMESTAMP):
        if column.kind != "timestamptz":
            raise DefinitionError(f"{what}: {label} is a timestamptz, not {column.type}")
        return lambda: datetime.now(UTC)
    if value_function and node.op == SQLValueFunctionOp.SVFOP_CURRENT_DATE:
        if column.kind != "date":
            raise DefinitionError(f"{what}: {label} is a date, not {column.type}")
        return lambda: datetime.now(UTC).date()
    compiler = ExpressionCompiler({}, what, label)
    if column.kind == INPUT:
        return _input_default(node, column, compiler)
    value = compiler.compile(node)
    if not value.is_constant:
        raise compiler.fail("a default is a constant, now(), current_timestamp, clock_timestamp() or current_date")
    if value.kind == "unknown":
        converted = compiler.typed(value, column).constant
    elif value.constant is None:
        converted = None
    elif value.kind in ("timestamptz", "date", "uuid", "jsonb"):
        if value.kind != column.kind:
            raise compiler.fail(f"a {value.kind} is not a {column.type}")
        converted = value.constant
    else:
        if value.kind == "text" and column.kind not in ("text", "varchar"):
            raise compiler.fail(f"text is not a {column.type}")
        constant = Decimal(repr(value.constant)) if type(value.constant) is float else value.constant
        try:
            converted = from_json(constant)
        except InvalidEvent as e:
            raise compiler.fail(e.detail) from None
    if converted is None and column.not_null:
        raise compiler.fail(f"NULL in the NOT NULL column {column.name}")
    # Checked once, here: the fast path does not check what it fills in (see FastJson).
    for check in checks:
        try:
            enforce(check, (converted,))
        except InvalidEvent as e:
            raise compiler.fail(e.detail) from None
    return lambda: converted
