"""A stream column's declaration parsed: its type and its constraints (NOT NULL, DEFAULT, CHECK).

A stream's columns are declared like a table's and are what its events must carry (see
pipelines.cv.decoding.values for how each type is read):

- types: smallint, integer, bigint, numeric[(p[, s])], double precision, real, boolean, text,
  varchar[(n)], timestamptz, date, uuid, jsonb;
- constraints: NOT NULL, NULL, DEFAULT <constant | now() | current_timestamp | clock_timestamp() |
  current_date>, CHECK (<condition on this column>), each optionally named (`CONSTRAINT name`);
  table-level CHECK constraints may use every column. A named CHECK is the dead-letter reason of
  an event that fails it, and of a value outside its column type's range.
"""

from __future__ import annotations

from pglast import ast
from pglast.enums import ConstrType, SQLValueFunctionOp
from pglast.stream import RawStream

from pipelines.cv.definitions import (
    Check,
    Column,
    DefinitionError,
    TypeKind,
    plain_identifier,
    reject_unsupported,
    walk,
)

# The supported column types by PostgreSQL's internal name (what `TypeName.names[-1]` holds: `int` is
# int4, `double precision` float8, `timestamp with time zone` timestamptz).
TYPE_NAMES: dict[str, TypeKind] = {
    "int2": "smallint",
    "int4": "integer",
    "int8": "bigint",
    "numeric": "numeric",
    "float8": "double",
    "float4": "real",
    "bool": "boolean",
    "text": "text",
    "varchar": "varchar",
    "timestamptz": "timestamptz",
    "date": "date",
    "uuid": "uuid",
    "jsonb": "jsonb",
}
SUPPORTED_TYPES = (
    "smallint, integer, bigint, numeric[(p[, s])], double precision, real, boolean, text, varchar[(n)], "
    "timestamptz, date, uuid, jsonb"
)
MAX_VARCHAR = 10_485_760

MAX_NUMERIC_PRECISION = 1000

_CONSTRAINT_NAMES = {
    ConstrType.CONSTR_PRIMARY: "PRIMARY KEY",
    ConstrType.CONSTR_UNIQUE: "UNIQUE",
    ConstrType.CONSTR_FOREIGN: "REFERENCES",
    ConstrType.CONSTR_EXCLUSION: "EXCLUDE",
    ConstrType.CONSTR_GENERATED: "GENERATED ALWAYS AS (...)",
    ConstrType.CONSTR_IDENTITY: "GENERATED ... AS IDENTITY",
}
_DEFAULT_FUNCTIONS = frozenset({"now", "clock_timestamp"})

_DEFAULT_VALUE_FUNCTIONS = (SQLValueFunctionOp.SVFOP_CURRENT_TIMESTAMP, SQLValueFunctionOp.SVFOP_CURRENT_DATE)


def resolve_type(node: ast.TypeName, what: str) -> tuple[TypeKind, tuple[int, ...]]:
    """The kind and modifiers of a supported type name: `varchar(20)` -> ("varchar", (20,)).

    Raises:
        DefinitionError: The type is not one a stream supports (arrays, json, timestamp without time
            zone, domains, ...), or its modifiers are out of range.
    """
    label = RawStream()(node).removeprefix("pg_catalog.")
    names = [n.sval for n in node.names]
    kind = TYPE_NAMES.get(names[-1]) if len(names) == 1 or names[0] == "pg_catalog" else None
    if kind is None or node.setof or node.pct_type or node.arrayBounds:
        raise DefinitionError(f"{what}: type {label} is not supported; supported: {SUPPORTED_TYPES}")
    typmods = []
    for mod in node.typmods or ():
        if not isinstance(mod, ast.A_Const) or not isinstance(mod.val, ast.Integer):
            raise DefinitionError(f"{what}: type {label}: modifiers must be integers")
        typmods.append(mod.val.ival)
    if kind == "numeric":
        precision, scale = (*typmods, 0)[:2] if typmods else (1, 0)
        if len(typmods) > 2 or not 1 <= precision <= MAX_NUMERIC_PRECISION or not 0 <= scale <= precision:
            raise DefinitionError(
                f"{what}: type {label}: numeric(p, s) takes 1 <= p <= {MAX_NUMERIC_PRECISION} and 0 <= s <= p"
            )
    elif kind == "varchar":
        if len(typmods) > 1 or (typmods and not 1 <= typmods[0] <= MAX_VARCHAR):
            raise DefinitionError(f"{what}: type {label}: varchar(n) takes 1 <= n <= {MAX_VARCHAR}")
    elif typmods:
        raise DefinitionError(f"{what}: type {label}: {kind} takes no modifier")
    return kind, tuple(typmods)


def parse_column(element: ast.ColumnDef, what: str) -> Column:
    """A column definition: its type, NOT NULL / NULL, DEFAULT and CHECK constraints."""
    name = plain_identifier(element.colname, f"{what}: column")
    where = f"{what}: column {name}"
    kind, typmods = resolve_type(element.typeName, where)
    reject_unsupported(
        (
            (element.collClause, "COLLATE"),
            (element.compression, "COMPRESSION"),
            (element.storage_name, "STORAGE"),
            (element.fdwoptions, "OPTIONS"),
            (element.raw_default, "DEFAULT"),
        ),
        where,
    )
    not_null: bool | None = None
    default = None
    checks = []
    for constraint in element.constraints or ():
        contype = constraint.contype
        if contype in (ConstrType.CONSTR_NULL, ConstrType.CONSTR_NOTNULL):
            if not_null is not None and not_null != (contype == ConstrType.CONSTR_NOTNULL):
                raise DefinitionError(f"{where}: NULL and NOT NULL contradict each other")
            not_null = contype == ConstrType.CONSTR_NOTNULL
        elif contype == ConstrType.CONSTR_DEFAULT:
            if default is not None:
                raise DefinitionError(f"{where}: DEFAULT is given twice")
            default = _default(constraint.raw_expr, where)
        elif contype == ConstrType.CONSTR_CHECK:
            checks.append(parse_check(constraint, {name}, where, "column"))
        else:
            raise DefinitionError(
                f"{where}: {constraint_label(constraint)} is not supported; a stream column takes NOT NULL, NULL, "
                "DEFAULT and CHECK"
            )
    if not_null and default is not None and default.upper() == "NULL":
        raise DefinitionError(f"{where}: DEFAULT NULL on a NOT NULL column")
    return Column(name, RawStream()(element.typeName), kind, bool(not_null), default, typmods, tuple(checks))


def parse_check(constraint: ast.Constraint, columns: set[str], what: str, level: str) -> Check:
    """A CHECK constraint that may use `columns` (`level`: "column" or "table", for the error message)."""
    label = f"CHECK ({RawStream()(constraint.raw_expr)})"
    if constraint.is_no_inherit or constraint.skip_validation or not constraint.is_enforced:
        raise DefinitionError(f"{what}: {label}: NO INHERIT, NOT VALID and NOT ENFORCED are not supported")
    name = plain_identifier(constraint.conname, f"{what}: constraint") if constraint.conname else None
    for child in walk(constraint.raw_expr):
        if isinstance(child, ast.ColumnRef):
            ref = ".".join(f.sval if isinstance(f, ast.String) else "*" for f in child.fields)
            if ref not in columns:
                scope = (
                    f"a column CHECK may use only its own column ({next(iter(columns))}); write a table CHECK"
                    if level == "column"
                    else f"columns: {', '.join(sorted(columns))}"
                )
                raise DefinitionError(f"{what}: {label} uses {ref}, which it may not ({scope})")
    return Check(name, RawStream()(constraint.raw_expr))


def constraint_label(constraint: ast.Constraint) -> str:
    """How the constraint is written in SQL (`PRIMARY KEY`, `REFERENCES`, ...), for error messages."""
    return _CONSTRAINT_NAMES.get(constraint.contype, constraint.contype.name.removeprefix("CONSTR_").replace("_", " "))


def _default(node: ast.Node, what: str) -> str:
    """A DEFAULT's SQL text, when it is something decoding can evaluate without a database."""
    function = (
        isinstance(node, ast.FuncCall)
        and node.funcname[-1].sval in _DEFAULT_FUNCTIONS
        and (len(node.funcname) == 1 or node.funcname[0].sval == "pg_catalog")
        and not (node.args or node.agg_star or node.agg_distinct or node.over or node.agg_filter)
    )
    value_function = isinstance(node, ast.SQLValueFunction) and node.op in _DEFAULT_VALUE_FUNCTIONS
    if not (function or value_function or _is_constant(node)):
        raise DefinitionError(
            f"{what}: DEFAULT {RawStream()(node)} is not supported; a default is a constant (optionally cast), "
            "now(), current_timestamp, clock_timestamp() or current_date"
        )
    return RawStream()(node)


def _is_constant(node: object) -> bool:
    """A literal, maybe cast and negated: `5`, `'x'`, `NULL`, `'{}'::jsonb`, `-5::bigint`."""
    if isinstance(node, ast.A_Const):
        return True
    if isinstance(node, ast.TypeCast):
        return _is_constant(node.arg)
    return _is_negation(node) and _is_constant(node.rexpr)


def _is_negation(node: object) -> bool:
    return isinstance(node, ast.A_Expr) and node.lexpr is None and node.name[-1].sval == "-"
