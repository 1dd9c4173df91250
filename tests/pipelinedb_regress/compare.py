"""PipelineDB's printed rows and ours compared, as psql's text: what makes a statement `passed` or `failed`.

Under ORDER BY the rows compare in order, rows its keys tie on in any order (as PostgreSQL leaves
ties); without it, as sets. The runner (tests.pipelinedb_regress.runner) executes the statements.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pglast
from pglast import ast


@dataclass
class Outcome:
    """One statement's outcome."""

    statement: str
    status: str
    detail: str = ""
    rows: bool = False  # PipelineDB printed rows for it: a SELECT compared


def sort_keys(query: str, columns: list[str]) -> list[int] | None:
    """The output columns a query's ORDER BY sorts by (names or positions); None when it sorts by anything else."""
    try:
        statement = pglast.parse_sql(query)[0].stmt
    except pglast.parser.ParseError:
        return None
    keys = []
    for item in getattr(statement, "sortClause", None) or ():
        node = item.node
        if isinstance(node, ast.A_Const) and isinstance(node.val, ast.Integer):
            keys.append(node.val.ival - 1)
        elif isinstance(node, ast.ColumnRef) and isinstance(node.fields[-1], ast.String):
            name = node.fields[-1].sval
            if columns.count(name) != 1:
                return None
            keys.append(columns.index(name))
        else:
            return None
    return keys


def _runs(rows: list[tuple], keys: list[int]) -> list[tuple[tuple, list[tuple]]]:
    """Rows in their order, as runs of equal sort keys; within a run, in no order (as PostgreSQL leaves ties)."""
    runs: list[tuple[tuple, list[tuple]]] = []
    for row in rows:
        key = tuple(row[i] for i in keys)
        if runs and runs[-1][0] == key:
            runs[-1][1].append(row)
        else:
            runs.append((key, [row]))
    return [(key, sorted(members, key=repr)) for key, members in runs]


def compare(
    text: str, expected: list[tuple], rows: list[tuple], keys: list[int] | None = None, texts: set[int] | None = None
) -> Outcome:
    """PipelineDB's rows and ours: in order under ORDER BY (rows its keys tie on in any order), else as sets.

    PipelineDB's cases ran in an en_US database, this one sorts text in C.UTF-8 ('LO' before 'leri'):
    ordered by text columns (`texts`, ascending), our rows are put in en_US's order before comparing.
    """
    got = [tuple(_normal(v) for v in row) for row in rows]
    want = [tuple(_normal(v) for v in row) for row in expected]
    ordered = re.search(r"\bORDER\s+BY\b", text, re.I) is not None
    if not ordered:
        same = sorted(got, key=repr) == sorted(want, key=repr)
    elif keys is not None and all(len(r) > max(keys, default=-1) for r in got + want):
        if set(keys) & (texts or set()) and not re.search(r"\bDESC\b", text, re.I):
            got = sorted(got, key=lambda row: tuple(_en_us(row[i], i in (texts or set())) for i in keys))
        same = _runs(got, keys) == _runs(want, keys)
    else:
        same = got == want
    if same:
        return Outcome(text, "passed")
    return Outcome(
        text,
        "failed",
        f"rows differ: expected {want[:4]}{'...' if len(want) > 4 else ''}, got "
        f"{got[:4]}{'...' if len(got) > 4 else ''}",
    )


TEXT_TYPES = frozenset({19, 25, 1042, 1043})  # name, text, char(n), varchar


def _en_us(value: str | None, text: bool) -> tuple:
    """A sort key of a cell as en_US orders it (NULLs last, as ASC does): text by its case-folded letters."""
    if value is None:
        return (2, "")
    if text:
        return (1, value.casefold(), value)
    try:
        return (0, float(value), value)
    except ValueError:
        return (1, value, value)


def _normal(value: object) -> str | None:
    """Psql's text of a value: NULL and the empty string print alike; cells are trimmed."""
    if value is None:
        return None
    text = str(value).strip()
    return text or None
