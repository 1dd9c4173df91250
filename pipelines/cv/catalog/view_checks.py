"""What a view's definition must be that only PostgreSQL can tell: its ttl, its window, its time units.

The front end reads intervals and units as text; these checks ask PostgreSQL, inside the definition's
transaction, whether each is one it reads and one every batch can compute with.
"""

from __future__ import annotations

import pglast
import psycopg
from pglast import ast
from pglast.stream import RawStream
from psycopg import sql

from pipelines.cv.model import DefinitionError, StreamDef, ViewDef
from pipelines.cv.sqltext.parsing import walk

# The longest ttl and sliding window: far beyond any use, and far from the timestamps PostgreSQL
# cannot compute (now() - an interval of about 6,700 years is out of range, and would fail each batch).
MAX_INTERVAL = "1000 years"
# A sliding window's shortest width: its steps (1/60 of it) are then at least 1/60 s.
MIN_WINDOW_S = 1
# The shortest ttl, PipelineDB's minimum too.
MIN_TTL_S = 1


def check_ttl(conn: psycopg.Connection, view: ViewDef) -> None:
    """A ttl must be an interval PostgreSQL reads, from MIN_TTL_S (as PipelineDB's) to MAX_INTERVAL.

    Expiry sweeps every PIPELINE_EXPIRE_INTERVAL_S (1 s by default): a shorter ttl could not be kept.
    """
    if view.ttl is None:
        return
    what = f"continuous view {view.qualified_name}"
    seconds, too_long = _interval(conn, view.ttl, f"{what}: ttl")
    if seconds <= 0:
        raise DefinitionError(f"{what}: ttl must be a positive interval, not {view.ttl!r}")
    if seconds < MIN_TTL_S:
        raise DefinitionError(
            f"{what}: ttl must be at least {MIN_TTL_S} second (expiry sweeps each second), not {view.ttl!r}"
        )
    if too_long:
        raise DefinitionError(f"{what}: ttl {view.ttl!r} is longer than {MAX_INTERVAL}")


def check_window(conn: psycopg.Connection, view: ViewDef) -> None:
    """A sliding window's width must be an interval PostgreSQL reads, from MIN_WINDOW_S to MAX_INTERVAL.

    cv.window_step divides it into 60 steps: a zero or negative width would fail every batch.
    """
    if view.window is None:
        return
    what = f"continuous view {view.qualified_name}"
    width = view.window.width
    seconds, too_long = _interval(conn, width, f"{what}: sliding window")
    if seconds < MIN_WINDOW_S:
        raise DefinitionError(
            f"{what}: a sliding window must be at least {MIN_WINDOW_S} second wide (it steps by 1/60 of its width), "
            f"not {width!r}"
        )
    if too_long:
        raise DefinitionError(f"{what}: sliding window {width!r} is longer than {MAX_INTERVAL}")


# Functions whose first argument names a unit that PostgreSQL checks only against a value: over the
# NULL columns view types are resolved with, `date_trunc('fortnight', ts)` passes, and then fails on
# every event. A non-NULL value of the column's type is what each call is tried with.
_UNIT_FUNCTIONS = frozenset({"date_trunc", "date_part", "extract"})
_SAMPLE_VALUES = {"timestamptz": "now()", "date": "current_date"}


def check_units(conn: psycopg.Connection, view: ViewDef, stream: StreamDef) -> None:
    """Each date_trunc / date_part / extract of a stream column must name a unit its type has."""
    kinds = {c.name: c.kind for c in stream.columns}
    expressions = [g.sql for g in view.groups] + [e for a in view.aggregates for e in (a.arg_sql, a.filter_sql) if e]
    expressions += [e for e in (view.where_sql,) if e]
    for expression in expressions:
        for node in walk(pglast.parse_sql(f"SELECT {expression}")[0].stmt):
            unit_call = isinstance(node, ast.FuncCall) and node.funcname[-1].sval in _UNIT_FUNCTIONS
            if not unit_call or len(node.args or ()) != 2:
                continue
            unit, value = node.args
            if not (isinstance(unit, ast.A_Const) and isinstance(unit.val, ast.String)):
                continue
            kind = kinds.get(value.fields[-1].sval, "") if isinstance(value, ast.ColumnRef) else ""
            if kind not in _SAMPLE_VALUES:
                continue
            call = sql.SQL("SELECT {}({}, {})").format(
                sql.Identifier("pg_catalog", node.funcname[-1].sval),
                sql.Literal(unit.val.sval),
                sql.SQL(_SAMPLE_VALUES[kind]),
            )
            try:
                with conn.transaction():
                    conn.execute(call)
            except psycopg.Error as e:
                message = " ".join((e.diag.message_primary or str(e)).split())
                raise DefinitionError(f"continuous view {view.qualified_name}: {RawStream()(node)}: {message}") from e


def _interval(conn: psycopg.Connection, text: str, what: str) -> tuple[float, bool]:
    """An interval's length in seconds, and whether it is longer than MAX_INTERVAL, as PostgreSQL reads it."""
    try:
        with conn.transaction():
            seconds, too_long = conn.execute(
                "SELECT extract(epoch FROM %s::interval)::float8, %s::interval > %s::interval",
                (text, text, MAX_INTERVAL),
            ).fetchone()
    except psycopg.DataError as e:
        raise DefinitionError(f"{what} {text!r} is not an interval") from e
    return seconds, too_long
