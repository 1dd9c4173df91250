"""The column types a stream can declare, read from a type name: what decoding and the front end agree on.

- smallint, integer, bigint, numeric[(p[, s])], double precision, real, boolean, text, varchar[(n)],
  timestamptz, date, uuid, jsonb: decoding reads each itself, as strictly as PostgreSQL stores it
  (pipelines.cv.decoding.values), and evaluates CHECK and DEFAULT over them;
- every other type PostgreSQL reads from text (timestamp, interval, json, money, bit(n), inet, oid,
  arrays, enums, composite types, domains, ...) is the kind `input`: one mechanism for all, no code
  per type. The event's field is kept as its JSON text and PostgreSQL types it as
  json_to_record does (`INPUT_SQL`): a JSON string is given to the type's input function, a number
  or boolean as its text, an array to an array type, an object to a composite type. Whether a value
  parses, only PostgreSQL can say: the runner asks it for each batch (a value that does not is a
  dead letter `invalid_input` with PostgreSQL's message), and the catalog asks it, at CREATE STREAM,
  whether the type exists (pipelines.cv.catalog.stream_types).
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
MAX_VARCHAR = 10_485_760
INPUT = "input"
# How a batch's JSON texts of a column of kind `input` become its type: the one conversion, a
# json_to_record of one field ({value}: a json expression, {type}: the column's type as declared).
INPUT_SQL = "(SELECT _cv_r.v FROM json_to_record(json_build_object('v', {value})) AS _cv_r(v {type}))"

MAX_NUMERIC_PRECISION = 1000


def resolve_type(node: ast.TypeName, what: str) -> tuple[TypeKind, tuple[int, ...]]:
    """The kind and modifiers of a type name: `varchar(20)` -> ("varchar", (20,)), `bit(3)` -> ("input", ()).

    Raises:
        DefinitionError: SETOF or %TYPE, or the modifiers of a type decoding reads are out of range.
    """
    label = RawStream()(node).removeprefix("pg_catalog.")
    names = [n.sval for n in node.names]
    if node.setof or node.pct_type:
        raise DefinitionError(f"{what}: type {label} is not supported: SETOF and %TYPE name no column type")
    kind = TYPE_NAMES.get(names[-1]) if len(names) == 1 or names[0] == "pg_catalog" else None
    if kind is None or node.arrayBounds:
        return INPUT, ()  # its modifiers, as written, are PostgreSQL's to read (bit(3), interval(0))
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
