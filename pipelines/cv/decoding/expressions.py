"""The expressions of CHECK and DEFAULT, compiled into Python closures with PostgreSQL's semantics.

They are compiled from the SQL PostgreSQL deparsed: three-valued logic (a CHECK passes unless it is
false), integer division truncating toward zero, overflow and division by zero as errors. Ordering
comparisons of text are refused: their result depends on the database's collation. What is not
supported (see SUPPORTED_EXPRESSIONS) fails the definition, naming it.

upper() and lower() change one character at a time, to one character, as PostgreSQL's do in a
database whose LC_CTYPE is a glibc UTF-8 locale (C.UTF-8 in the local stack, en_US.utf8 in the
Compose image): 'ß' and 'ﬁ' stay as they are, 'İ' lowers to 'i', every capital sigma to the small
one. Python's own str.upper and str.lower follow Unicode's full mappings ('SS', 'FI', 'i̇', a
final sigma) instead. (Under a Turkish locale, an ICU or a plain C collation, PostgreSQL would
judge differently.)
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from pglast import ast
from pglast.enums import A_Expr_Kind, BoolExprType, NullTestType
from pglast.stream import RawStream

from pipelines.cv.decoding.values import EXACT, INT_RANGES, INTEGER, json_converter, text_converter
from pipelines.cv.model import Column, DefinitionError
from pipelines.cv.sqltext.types import INPUT, resolve_type
from pipelines.runtime.events import InvalidEvent


class EvalError(Exception):
    """Evaluating an expression failed the way PostgreSQL's would (overflow, division by zero)."""


_NOT_CONSTANT = object()
_NUMBER_KINDS = ("int", "numeric", "float")
_EXPR_KINDS = {
    "smallint": ("int", 2),
    "integer": ("int", 4),
    "bigint": ("int", 8),
    "numeric": ("numeric", 0),
    "double": ("float", 0),
    "real": ("float", 4),  # compared as double precision, as PostgreSQL does; no arithmetic
    "boolean": ("bool", 0),
    "text": ("text", 0),
    "varchar": ("text", 0),
}
_WIDTH_RANGES = {2: INT_RANGES["smallint"], 4: INT_RANGES["integer"], 8: INT_RANGES["bigint"]}
_COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq,
    "<>": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_MIRRORED = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


def pg_upper(text: str) -> str:
    """upper() as PostgreSQL computes it under glibc: each character to one character."""
    upper = text.upper()
    if len(upper) == len(text):  # no character took a mapping to several
        return upper
    return "".join(map(_upper_character, text))


def pg_lower(text: str) -> str:
    """lower() as PostgreSQL computes it under glibc: each character to one character (no final sigma)."""
    lower = text.lower()
    if len(lower) == len(text) and "Σ" not in text:  # str.lower makes a final Σ ς
        return lower
    return "".join(map(_lower_character, text))


def _upper_character(character: str) -> str:
    upper = character.upper()
    if len(upper) == 1:
        return upper
    title = character.title()  # U+1FB3: upper is two characters, its one-character mapping the title case
    return title if len(title) == 1 else character  # ß, ﬁ: no one-character upper case


def _lower_character(character: str) -> str:
    return character.lower()[0]  # İ: lower i̇, of which its one-character mapping is the i


_FUNCTIONS = {"length": len, "char_length": len, "character_length": len, "lower": pg_lower, "upper": pg_upper}
SUPPORTED_EXPRESSIONS = (
    "column references, constants, casts of constants, = <> < <= > >=, AND, OR, NOT, IS [NOT] NULL, IN (...), "
    "BETWEEN, + - * / %, length(), char_length(), lower(), upper()"
)


@dataclass(frozen=True)
class Expr:
    """A compiled expression: its type and `fn(values)`, values being those of the referenced columns.

    `kind` is int, numeric, float, bool, text, timestamptz, date, uuid, jsonb, unknown (a string
    literal, typed by what it meets) or null (the NULL literal).
    """

    kind: str
    fn: Callable[[tuple], Any]
    width: int = 0  # int: 2, 4 or 8 bytes; float: 4 for a real column
    constant: Any = _NOT_CONSTANT
    column: int | None = None  # the position of a plain column reference
    bounds: tuple[int, int | None, int | None] | None = None  # (column position, lowest, highest)

    @property
    def is_constant(self) -> bool:
        """True for a constant (folded at compile time)."""
        return self.constant is not _NOT_CONSTANT


def _constant(kind: str, value: Any, width: int = 0) -> Expr:
    return Expr(kind, lambda values: value, width, value)


class ExpressionCompiler:
    """Compiles one CHECK or DEFAULT expression of a stream into Python closures."""

    def __init__(self, columns: dict[str, tuple[int, Column]], what: str, sql: str) -> None:
        self.columns, self.what, self.sql = columns, what, sql
        self.refs: list[str] = []

    def fail(self, message: str) -> DefinitionError:
        """The error for an expression that cannot be compiled."""
        return DefinitionError(f"{self.what}: {self.sql}: {message}")

    def compile(self, node: ast.Node) -> Expr:
        """Compile a pglast expression node."""
        if isinstance(node, ast.ColumnRef):
            return self.column(node)
        if isinstance(node, ast.A_Const):
            return self.literal(node)
        if isinstance(node, ast.TypeCast):
            return self.cast(node)
        if isinstance(node, ast.A_Expr):
            operands = node.rexpr if isinstance(node.rexpr, tuple) else None
            if node.kind == A_Expr_Kind.AEXPR_OP:
                return self.operator(node)
            if node.kind == A_Expr_Kind.AEXPR_IN and operands:
                negated = node.name[-1].sval == "<>"
                tests = [self.compare("<>" if negated else "=", node.lexpr, item) for item in operands]
                return self.logic(BoolExprType.AND_EXPR if negated else BoolExprType.OR_EXPR, tests)
            if node.kind in (A_Expr_Kind.AEXPR_BETWEEN, A_Expr_Kind.AEXPR_NOT_BETWEEN) and operands:
                if node.kind == A_Expr_Kind.AEXPR_BETWEEN:
                    tests = [self.compare(">=", node.lexpr, operands[0]), self.compare("<=", node.lexpr, operands[1])]
                    return self.logic(BoolExprType.AND_EXPR, tests)
                tests = [self.compare("<", node.lexpr, operands[0]), self.compare(">", node.lexpr, operands[1])]
                return self.logic(BoolExprType.OR_EXPR, tests)
        if isinstance(node, ast.BoolExpr):
            return self.logic(node.boolop, [self.compile(arg) for arg in node.args])
        if isinstance(node, ast.NullTest) and not node.argisrow:
            arg = self.compile(node.arg)
            fn, is_null = arg.fn, node.nulltesttype == NullTestType.IS_NULL
            return self.fold(Expr("bool", (lambda v: fn(v) is None) if is_null else (lambda v: fn(v) is not None)), arg)
        if isinstance(node, ast.FuncCall):
            return self.function(node)
        raise self.fail(f"{RawStream()(node)} is not supported; supported: {SUPPORTED_EXPRESSIONS}")

    def column(self, node: ast.ColumnRef) -> Expr:
        """A column reference: its value, typed as the column."""
        name = ".".join(f.sval if isinstance(f, ast.String) else "*" for f in node.fields)
        if name not in self.columns:
            raise self.fail(f"{name} is not a column it may use ({', '.join(self.columns) or 'none'})")
        if name not in self.refs:
            self.refs.append(name)
        column = self.columns[name][1]
        if column.kind == INPUT:
            raise self.fail(f"{name} is {column.type}, which PostgreSQL reads, not decoding: a CHECK cannot use it")
        kind, width = _EXPR_KINDS.get(column.kind, (column.kind, 0))
        return Expr(kind, operator.itemgetter(self.refs.index(name)), width, column=self.refs.index(name))

    def literal(self, node: ast.A_Const) -> Expr:
        """A literal: integers as PostgreSQL types them (int4, int8, else numeric), strings untyped."""
        if node.isnull:
            return _constant("null", None)
        value = node.val
        if isinstance(value, ast.Integer):
            return _constant("int", value.ival, 4)
        if isinstance(value, ast.Float):
            if INTEGER.fullmatch(value.fval) and INT_RANGES["bigint"][0] <= int(value.fval) <= INT_RANGES["bigint"][1]:
                return _constant("int", int(value.fval), 8)
            return _constant("numeric", Decimal(value.fval))
        if isinstance(value, ast.Boolean):
            return _constant("bool", value.boolval)
        if isinstance(value, ast.String):
            return _constant("unknown", value.sval)
        raise self.fail(f"{RawStream()(node)} is not a supported constant")

    def cast(self, node: ast.TypeCast) -> Expr:
        """A cast of a constant: the constant read as the type's text, as strictly as an event's."""
        arg = self.compile(node.arg)
        kind, typmods = resolve_type(node.typeName, f"{self.what}: {self.sql}")
        if kind == INPUT:
            raise self.fail(f"{RawStream()(node)}: decoding evaluates this without PostgreSQL, which reads that type")
        if arg.is_constant:
            return self.typed(arg, Column("constant", RawStream()(node.typeName), kind, typmods=typmods))
        # A value can be cast where nothing is lost: an integer to a wider type, numeric to double.
        target, width = _EXPR_KINDS.get(kind, (kind, 0))
        widening = (arg.kind, target) in (("int", "numeric"), ("int", "float"), ("numeric", "float"))
        if typmods or not (widening or (arg.kind == target == "int" and width >= arg.width)):
            raise self.fail(f"{RawStream()(node)}: only constants, or numbers to a wider type, can be cast")
        if target == "float":
            return _as_float(arg)
        f = arg.fn
        return Expr(
            target, (lambda v: None if (x := f(v)) is None else Decimal(x)) if target == "numeric" else f, width
        )

    def typed(self, arg: Expr, column: Column) -> Expr:
        """A constant as a value of a column type (an untyped literal takes the type)."""
        kind, width = _EXPR_KINDS.get(column.kind, (column.kind, 0))
        if arg.constant is None:
            return _constant(kind, None, width)
        value = _constant_text(arg.constant)
        try:
            converted = text_converter(column, json_converter(column, "out_of_range")[1], "out_of_range")(value)
        except InvalidEvent as e:
            raise self.fail(f"{value!r} is not a {column.type}: {e.detail}") from None
        return _constant(kind, converted, width)

    def operator(self, node: ast.A_Expr) -> Expr:
        """A comparison, arithmetic, or a unary sign."""
        name = node.name[-1].sval
        if node.lexpr is None and name in ("-", "+"):
            arg = self.compile(node.rexpr)
            if arg.kind == "unknown":
                raise self.fail(f"{RawStream()(node)}: a sign needs a number")
            return self.arithmetic(name, _constant("int", 0, 2), arg) if name == "-" else self.number(arg)
        if name in _COMPARISONS and node.lexpr is not None:
            return self.compare(name, node.lexpr, node.rexpr)
        if name in ("+", "-", "*", "/", "%") and node.lexpr is not None:
            return self.arithmetic(name, self.compile(node.lexpr), self.compile(node.rexpr))
        raise self.fail(f"operator {name} is not supported; supported: {SUPPORTED_EXPRESSIONS}")

    def number(self, arg: Expr) -> Expr:
        """An operand that must be a number."""
        if arg.kind not in _NUMBER_KINDS and arg.kind != "null":
            raise self.fail(f"expected a number, got {arg.kind}")
        return arg

    def coerce(self, left: Expr, right: Expr) -> tuple[Expr, Expr]:
        """Both operands in one type, as PostgreSQL resolves them (an untyped literal takes the other's)."""
        if left.kind == "unknown" and right.kind not in ("unknown", "null"):
            left = self.typed(left, _column_of(right))
        elif right.kind == "unknown" and left.kind not in ("unknown", "null"):
            right = self.typed(right, _column_of(left))
        if "null" in (left.kind, right.kind):
            return left, right
        if left.kind == right.kind or {left.kind, right.kind} == {"unknown", "text"}:
            return left, right
        if left.kind in _NUMBER_KINDS and right.kind in _NUMBER_KINDS:
            if "float" in (left.kind, right.kind):
                return _as_float(left), _as_float(right)
            return left, right  # int and numeric: Python compares and adds int and Decimal exactly
        raise self.fail(f"cannot compare or combine {left.kind} with {right.kind}")

    def compare(self, name: str, left_node: ast.Node | Expr, right_node: ast.Node | Expr) -> Expr:
        """A comparison, NULL when either side is."""
        left = left_node if isinstance(left_node, Expr) else self.compile(left_node)
        right = right_node if isinstance(right_node, Expr) else self.compile(right_node)
        left, right = self.coerce(left, right)
        if "null" in (left.kind, right.kind):
            return _constant("bool", None)
        if left.kind == "jsonb":
            raise self.fail("jsonb values can only be tested with IS [NOT] NULL")
        if left.kind in ("text", "unknown") and name not in ("=", "<>"):
            raise self.fail(f"text {name} text depends on the database's collation; use = <> IN or length()")
        compare, f, g = _COMPARISONS[name], left.fn, right.fn
        if right.is_constant:
            c = right.constant
            fn = lambda v: None if (x := f(v)) is None else compare(x, c)  # noqa: E731
        else:
            fn = lambda v: None if (x := f(v)) is None or (y := g(v)) is None else compare(x, y)  # noqa: E731
        result = self.fold(Expr("bool", fn), left, right)
        bounds = _bounds(name, left, right) or _bounds(_MIRRORED[name], right, left)
        return result if bounds is None or result.is_constant else Expr("bool", fn, bounds=bounds)

    def arithmetic(self, name: str, left: Expr, right: Expr) -> Expr:
        """+ - * / % with PostgreSQL's results: integer division truncates, overflow is an error."""
        left, right = self.coerce(self.number(left), self.number(right))
        if "null" in (left.kind, right.kind):
            return _constant(left.kind if right.kind == "null" else right.kind, None)
        if 4 in (left.width, right.width) and left.kind == right.kind == "float":
            raise self.fail("arithmetic on real values is not supported; compare them instead")
        kind = left.kind if left.kind == right.kind else "numeric"
        if kind == "int":
            width = max(left.width, right.width)
            op = _integer_operation(name, *_WIDTH_RANGES[width])
        elif kind == "numeric":
            if name not in ("+", "-", "*"):
                raise self.fail(f"numeric {name} is not supported (its result scale is PostgreSQL's to choose)")
            width, op = 0, {"+": EXACT.add, "-": EXACT.subtract, "*": EXACT.multiply}[name]
        else:
            if name == "%":
                raise self.fail("% of double precision values does not exist in PostgreSQL")
            width, op = 0, _float_operation(name)
        f, g = left.fn, right.fn
        fn = lambda v: None if (x := f(v)) is None or (y := g(v)) is None else op(x, y)  # noqa: E731
        return self.fold(Expr(kind, fn, width), left, right)

    def logic(self, boolop: BoolExprType, args: list[Expr]) -> Expr:
        """AND, OR, NOT in three-valued logic, evaluated left to right."""
        for arg in args:
            if arg.kind not in ("bool", "null"):
                raise self.fail(f"AND, OR and NOT take conditions, not {arg.kind}")
        fns = [a.fn for a in args]
        if boolop == BoolExprType.NOT_EXPR:
            f = fns[0]
            return self.fold(Expr("bool", lambda v: None if (x := f(v)) is None else not x), *args)
        stop = boolop == BoolExprType.OR_EXPR  # the value that decides: True for OR, False for AND

        def combine(values: tuple) -> bool | None:
            result: bool | None = not stop
            for f in fns:
                x = f(values)
                if x is stop:
                    return stop
                if x is None:
                    result = None
            return result

        folded = self.fold(Expr("bool", combine), *args)
        bounds = None
        if boolop == BoolExprType.AND_EXPR and all(a.bounds for a in args):
            positions = {a.bounds[0] for a in args}  # type: ignore[index]
            if len(positions) == 1:
                lows = [a.bounds[1] for a in args if a.bounds[1] is not None]  # type: ignore[index]
                highs = [a.bounds[2] for a in args if a.bounds[2] is not None]  # type: ignore[index]
                bounds = (positions.pop(), max(lows, default=None), min(highs, default=None))
        return folded if bounds is None or folded.is_constant else Expr("bool", combine, bounds=bounds)

    def function(self, node: ast.FuncCall) -> Expr:
        """length(), char_length(), lower(), upper() of text."""
        names = [n.sval for n in node.funcname]
        function = _FUNCTIONS.get(names[-1]) if len(names) == 1 or names[0] == "pg_catalog" else None
        plain = not (node.agg_star or node.agg_distinct or node.over or node.agg_filter or node.func_variadic)
        if function is None or not plain or len(node.args or ()) != 1:
            raise self.fail(f"{RawStream()(node)} is not supported; supported: {SUPPORTED_EXPRESSIONS}")
        arg = self.compile(node.args[0])
        if arg.kind == "unknown":
            arg = Expr("text", arg.fn, constant=arg.constant)
        if arg.kind not in ("text", "null"):
            raise self.fail(f"{names[-1]}() takes text, not {arg.kind}")
        f = arg.fn
        kind, width = ("int", 4) if function is len else ("text", 0)
        return self.fold(Expr(kind, lambda v: None if (x := f(v)) is None else function(x), width), arg)

    def fold(self, expr: Expr, *args: Expr) -> Expr:
        """A constant when every operand is one (a constant failing to evaluate fails the definition)."""
        if not all(a.is_constant for a in args):
            return expr
        try:
            return _constant(expr.kind, expr.fn(()), expr.width)
        except EvalError as e:
            raise self.fail(str(e)) from None


def _column_of(expr: Expr) -> Column:
    """A column type for typing a literal that meets `expr`."""
    kinds = {"int": "bigint", "numeric": "numeric", "float": "double", "bool": "boolean", "text": "text"}
    kind = kinds.get(expr.kind, expr.kind)
    return Column("constant", kind, kind)  # type: ignore[arg-type]


def _constant_text(value: Any) -> str:
    if type(value) is bool:
        return "true" if value else "false"
    if isinstance(value, datetime | date):
        return value.isoformat()
    return repr(value) if type(value) is float else str(value)


def _as_float(expr: Expr) -> Expr:
    if expr.kind == "float":
        return expr
    if expr.is_constant:
        return _constant("float", None if expr.constant is None else float(expr.constant))
    f = expr.fn
    return Expr("float", lambda v: None if (x := f(v)) is None else float(x), column=None)


def _bounds(name: str, column: Expr, constant: Expr) -> tuple[int, int | None, int | None] | None:
    """`column <op> integer` on an integer column as (position, lowest, highest), else None."""
    if column.column is None or column.kind != "int" or not constant.is_constant or type(constant.constant) is not int:
        return None
    c = constant.constant
    return {
        "=": (column.column, c, c),
        "<": (column.column, None, c - 1),
        "<=": (column.column, None, c),
        ">": (column.column, c + 1, None),
        ">=": (column.column, c, None),
    }.get(name)


def _integer_operation(name: str, low: int, high: int) -> Callable[[int, int], int]:
    def checked(result: int) -> int:
        if not low <= result <= high:
            raise EvalError(f"integer out of range ({result})")
        return result

    def divide(x: int, y: int) -> int:
        if y == 0:
            raise EvalError("division by zero")
        quotient = abs(x) // abs(y)
        return checked(-quotient if (x < 0) != (y < 0) else quotient)

    def modulo(x: int, y: int) -> int:
        if y == 0:
            raise EvalError("division by zero")
        remainder = abs(x) % abs(y)
        return -remainder if x < 0 else remainder  # the sign of the dividend, as in C

    return {
        "+": lambda x, y: checked(x + y),
        "-": lambda x, y: checked(x - y),
        "*": lambda x, y: checked(x * y),
        "/": divide,
        "%": modulo,
    }[name]


def _float_operation(name: str) -> Callable[[float, float], float]:
    inf = float("inf")

    def checked(result: float, x: float, y: float, product: bool) -> float:
        # PostgreSQL's float8 checks: an infinite result of finite operands overflowed, and a zero
        # product or quotient of non-zero operands underflowed.
        if abs(result) == inf and abs(x) != inf and abs(y) != inf:
            raise EvalError("value out of range: overflow")
        if product and result == 0.0 and x != 0.0 and y != 0.0 and abs(y) != inf:
            raise EvalError("value out of range: underflow")
        return result

    def divide(x: float, y: float) -> float:
        if y == 0.0:
            raise EvalError("division by zero")
        return checked(x / y, x, y, True)

    return {
        "+": lambda x, y: checked(x + y, x, y, False),
        "-": lambda x, y: checked(x - y, x, y, False),
        "*": lambda x, y: checked(x * y, x, y, True),
        "/": divide,
    }[name]
