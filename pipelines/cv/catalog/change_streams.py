"""Whether a view records its changes: the capture triggers on its storage and its position row.

A view records changes when its definition says `WITH (changes = true)` (or ALTER ... SET
(changes = true)). `record_changes` is the one call that turns recording on, whoever asks for it:
the definition today, a sink or a view reading `output_of()` later. Turning it off keeps the view's
position row and its changes, so positions continue where they stopped if it is turned on again;
dropping the view drops both (migration 0020).

It runs in the caller's transaction, after the stream's lock (pipelines.cv.catalog.locks, step 3):
no batch of the stream is being applied meanwhile.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from pipelines.cv.model import ViewDef
from pipelines.cv.views import change_capture, compiler
from pipelines.cv.views.view_types import ViewTypes


def record_changes(conn: psycopg.Connection, view: ViewDef, types: ViewTypes) -> None:
    """Record the view's changes from now on (again, after its read view changed): triggers and position row."""
    if view.window is not None:  # the front end refuses the option there; a caller must not force it
        raise ValueError(f"{view.qualified_name}: a sliding window's changes cannot be recorded")
    for statement in change_capture.create_triggers(view, types):
        conn.execute(statement)
    conn.execute(
        "INSERT INTO cv.view_change_positions (view, delta_columns) VALUES (%s, %s)"
        " ON CONFLICT (view) DO UPDATE SET recording = true, delta_columns = excluded.delta_columns",
        (view.qualified_name, change_capture.delta_columns(view, types)),
    )


def stop_recording(conn: psycopg.Connection, view: ViewDef) -> None:
    """Record no more changes of the view; those recorded and its last position are kept."""
    for statement in change_capture.drop_triggers(view):
        conn.execute(statement)
    conn.execute("UPDATE cv.view_change_positions SET recording = false WHERE view = %s", (view.qualified_name,))


def follow_option(conn: psycopg.Connection, view: ViewDef, types: ViewTypes) -> None:
    """Record changes or not, as the view's `changes` option says (after its storage or read view was made)."""
    if view.records_changes:
        record_changes(conn, view, types)
    elif is_recording(conn, view.qualified_name):
        stop_recording(conn, view)


def is_recording(conn: psycopg.Connection, name: str) -> bool:
    """True when view `name` records its changes now."""
    row = conn.execute("SELECT recording FROM cv.view_change_positions WHERE view = %s", (name,)).fetchone()
    return bool(row and row[0])


def record_removal(conn: psycopg.Connection, view: ViewDef) -> None:
    """Before a rebuild drops the storage of a view that records changes: every row recorded as leaving.

    DROP TABLE fires no trigger. The rebuild's backfill then inserts the new rows, and each group's
    change nets to one (before: the old row, after: the new one, or none where they are equal).
    """
    if is_recording(conn, view.qualified_name):
        conn.execute(sql.SQL("DELETE FROM {}").format(compiler.storage_table(view)))
