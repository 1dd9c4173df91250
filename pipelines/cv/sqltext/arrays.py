"""A batch's columns as PostgreSQL array literals: how they travel to the maintenance statements.

Each column of a batch is one parameter, `'{1,2,3}'` or `'{"a","b"}'`, cast by the statement to the
column's array type, so PostgreSQL's array input parses it in C. psycopg's own array dumpers
(binary or text) run a Python call per element in the committing thread, which holds the GIL that
the decoding thread needs: at 20,000 values that cost 24 ms for text and 30 ms for bigint here,
against well under 1 ms for the joins below. Numbers, booleans, timestamps, dates and uuids print
without characters that need quoting; text, and jsonb (the JSON text decoding kept, which jsonb's
input reads: numbers exact), are quoted and escaped on the whole joined column at once.

Every value decoding accepts renders, and PostgreSQL's input takes it: decoding rejects what it
would refuse (pipelines.cv.decoding.values, json_text).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import date, datetime
from typing import Any

from pipelines.cv.model import Column

_SEPARATOR = "\x1f"  # joins text values before escaping; a value holding it is escaped on its own


def array_literal(values: Sequence[Any], kind: str) -> str:
    """The values of a column of this kind (see Column.kind) as an array literal; None is NULL."""
    if not values:
        return "{}"
    if kind in ("text", "varchar", "jsonb", "input"):  # input: JSON texts (pipelines.cv.sqltext.types)
        return _text_literal(values)
    element = _ELEMENT.get(kind, str)
    if None in values:
        return "{" + ",".join(["NULL" if v is None else element(v) for v in values]) + "}"
    return "{" + ",".join(map(element, values)) + "}"


def ops_literal(ops: Sequence[int]) -> str:
    """A batch's ops (+1 insert, -1 delete) as an int2[] literal."""
    return "{" + ",".join(map(str, ops)) + "}"


def column_literals(columns: Sequence[Sequence[Any]], stream_columns: Sequence[Column]) -> list[str]:
    """Each column as its literal, in order, given the stream columns they hold."""
    return [array_literal(values, column.kind) for values, column in zip(columns, stream_columns, strict=True)]


def _text_literal(values: Sequence[Any]) -> str:
    if None not in values:
        joined = _SEPARATOR.join(values)
        if joined.count(_SEPARATOR) == len(values) - 1:  # no value holds the separator
            escaped = joined.replace("\\", "\\\\").replace('"', '\\"')
            return '{"' + escaped.replace(_SEPARATOR, '","') + '"}'
    return "{" + ",".join(["NULL" if v is None else _quoted(v) for v in values]) + "}"


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


_ELEMENT: dict[str, Callable[[Any], str]] = {
    "smallint": str,
    "integer": str,
    "bigint": str,
    "numeric": str,  # Decimal's str is exact, and numeric's input reads its exponent form
    "double": repr,  # the shortest text that reads back as the same double
    "real": repr,
    "boolean": str,  # True / False: boolean input is case-insensitive
    "timestamptz": datetime.isoformat,  # aware UTC datetimes: 2026-11-23T10:00:00.123000+00:00
    "date": date.isoformat,
    "uuid": str,
}
