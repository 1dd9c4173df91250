"""A stream column's declaration parsed: its type and its constraints (NOT NULL, DEFAULT, CHECK).

A stream's columns are declared like a table's and are what its events must carry (the types in
pipelines.cv.sqltext.types; see pipelines.cv.decoding.values for how each is read):

- constraints: NOT NULL, NULL, DEFAULT <constant | now() | current_timestamp | clock_timestamp() |
  current_date>, CHECK (<condition on this column>), each optionally named (`CONSTRAINT name`);
  table-level CHECK constraints may use every column. A named CHECK is the dead-letter reason of
  an event that fails it, and of a value outside its column type's range.
"""

from __future__ import annotations

from pglast import ast
from pglast.enums import ConstrType, SQLValueFunctionOp
from pglast.stream import RawStream

from pipelines.cv.model import Check, Column, DefinitionError
from pipelines.cv.sqltext.parsing import plain_identifier, reject_unsupported, walk
from pipelines.cv.sqltext.types import resolve_type

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
