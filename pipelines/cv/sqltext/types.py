"""The column types a stream can declare, read from a type name: what decoding and the front end agree on.

- smallint, integer, bigint, numeric[(p[, s])], double precision, real, boolean, text, varchar[(n)],
  timestamptz, date, uuid, jsonb.
"""

from __future__ import annotations

from pglast import ast
from pglast.stream import RawStream

from pipelines.cv.model import DefinitionError, TypeKind

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
