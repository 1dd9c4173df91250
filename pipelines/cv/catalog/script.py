"""Definitions applied to the catalog: each statement handed to the handler of its kind.

CREATE STREAM goes to pipelines.cv.catalog.streams; CREATE [OR REPLACE], ALTER and DROP CONTINUOUS
VIEW to pipelines.cv.catalog.views; DROP STREAM to the streams again. Every statement is read
against the catalog's scope (pipelines.cv.catalog.store.scope) under the definitions' lock.
"""

from __future__ import annotations

import psycopg

from pipelines.cv.catalog import store
from pipelines.cv.catalog.locks import begin_change, changing
from pipelines.cv.catalog.streams import define_stream, drop_stream
from pipelines.cv.catalog.views import alter_view, define_view, drop_view
from pipelines.cv.frontend.changes import AlterView, Drop, parse_change
from pipelines.cv.frontend.statements import parse, split_statements
from pipelines.cv.model import Scope, StreamDef
from pipelines.cv.sqltext.scan import Statement


def define(conn: psycopg.Connection, statement: str) -> str:
    """Apply one statement: CREATE (idempotent for an identical definition), CREATE OR REPLACE, ALTER or DROP.

    Returns the outcome as a line for people.

    Raises:
        DefinitionError: The statement is invalid or conflicts with the catalog.
        DefinitionBlocked: Locks held elsewhere kept it from being applied (see `changing`).
    """
    change = parse_change(statement)
    what = Statement(1, 1, statement).label or "definition"

    def apply() -> str:
        begin_change(conn, what)
        scope = store.scope(conn)
        if change is not None:
            return apply_change(conn, change, scope)
        definition = parse(statement, scope)
        if isinstance(definition, StreamDef):
            return define_stream(conn, definition, scope.streams)
        return define_view(conn, definition, scope)

    return changing(conn, what, apply)


def define_file(conn: psycopg.Connection, text: str) -> list[str]:
    """Apply every statement of a definitions file, in order, each in a transaction of its own."""
    return [define(conn, statement) for statement in split_statements(text)]


def apply_change(conn: psycopg.Connection, change: AlterView | Drop, scope: Scope) -> str:
    """ALTER CONTINUOUS VIEW or DROP, in the caller's transaction; the outcome as a line."""
    if isinstance(change, AlterView):
        return alter_view(conn, change, scope)
    outcomes = []
    for name in change.names:
        table = "cv.views" if change.kind == "view" else "cv.streams"
        exists = conn.execute(f"SELECT 1 FROM {table} WHERE name = %s", (name,)).fetchone()  # noqa: S608
        if exists is None and change.if_exists:
            outcomes.append(f"{'view' if change.kind == 'view' else 'stream'} {name} does not exist; skipped")
            continue
        outcomes.append(drop_view(conn, name) if change.kind == "view" else drop_stream(conn, name))
    return "; ".join(outcomes)
