"""Whether a view records its changes: the capture triggers on its storage and its position row.

A view records changes while someone wants them: its definition says `WITH (changes = true)` (or
ALTER ... SET (changes = true)), or a *reader* takes them (migration 0023: a sink relaying them to
Kafka, a view over the view). `record_changes` is the one call that turns recording on, whoever asks;
`follow_option` and `remove_reader` turn it off only when neither the option nor any reader is left,
so a view redefined with `changes = false` keeps feeding its sinks. Turning it off keeps the view's
position row and its changes, so positions continue where they stopped if it is turned on again;
dropping the view drops both, and its readers (migrations 0020, 0023).

What a change carries follows the readers too (migration 0046): before and after images when the
option asks for the change stream or any reader needs them (`output_of`, a `changes` sink, a filter
on (old)); the group's key alone when every reader reads only current rows (upsert sinks, views over
the view's rows), which costs the runner a fraction per changed group. Each reader row says whether
it needs images.

It runs in the caller's transaction, after the stream's lock (pipelines.cv.catalog.locks, step 3):
no batch of the stream is being applied meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

from pipelines.cv.catalog import store
from pipelines.cv.frontend.combine import is_states_reader
from pipelines.cv.model import DefinitionError, Scope, ViewDef
from pipelines.cv.views import change_capture, compiler
from pipelines.cv.views.view_types import ViewTypes


def record_changes(conn: psycopg.Connection, view: ViewDef, types: ViewTypes, *, images: bool = False) -> None:
    """Record the view's changes from now on (again, after its read view or readers changed): triggers and position row.

    `images`: a reader about to be added needs each change's rows, whatever the others need.
    """
    if view.window is not None:  # the front end refuses the option there; a caller must not force it
        raise ValueError(f"{view.qualified_name}: a sliding window's changes cannot be recorded")
    present = conn.execute(
        "SELECT reader, images FROM cv.change_readers WHERE view = %s", (view.qualified_name,)
    ).fetchall()
    # An output_of(v, states) reader (pipelines.cv.frontend.combine) needs the stored states with each
    # change (0033); a combine(v) reader reads them from the storage (stream_sql.feed_to_deltas).
    states = any(is_states_reader(reader) and wants for reader, wants in present)
    sets = states and store.keeps_refs(conn, view)  # an exact distinct count's state: its set of values
    images = images or view.records_changes or states or any(wants for _, wants in present)
    for statement in change_capture.create_triggers(view, types, states=states, sets=sets, keys_only=not images):
        conn.execute(statement)
    conn.execute(
        "INSERT INTO cv.view_change_positions (view, delta_columns, states, images) VALUES (%s, %s, %s, %s)"
        " ON CONFLICT (view) DO UPDATE SET recording = true, delta_columns = excluded.delta_columns,"
        " states = excluded.states, images = excluded.images",
        (view.qualified_name, change_capture.delta_columns(view, types) if images else [], states, images),
    )


def stop_recording(conn: psycopg.Connection, view: ViewDef) -> None:
    """Record no more changes of the view; those recorded and its last position are kept."""
    for statement in change_capture.drop_triggers(view):
        conn.execute(statement)
    conn.execute("UPDATE cv.view_change_positions SET recording = false WHERE view = %s", (view.qualified_name,))


def follow_option(conn: psycopg.Connection, view: ViewDef, types: ViewTypes) -> None:
    """Record changes or not, as the view's `changes` option and its readers say (after its storage is made)."""
    if view.records_changes or readers(conn, view.qualified_name):
        record_changes(conn, view, types)
    elif is_recording(conn, view.qualified_name):
        stop_recording(conn, view)


def add_reader(conn: psycopg.Connection, view: ViewDef, types: ViewTypes, reader: str, *, images: bool = True) -> int:
    """Make `reader` ('sink <name>', 'view <schema.name>') take the view's changes from now; its start position.

    The view records changes from here on if it did not, with their rows unless neither this reader
    (`images`) nor any other needs them. The reader starts after the view's last
    position: what it must know of the rows already there it reads from the view itself, in the
    same snapshot as that position (both commit together), or under the stream's lock.

    Raises:
        DefinitionError: The view cannot record changes (a sliding window), or the reader exists.
    """
    if view.window is not None:
        raise DefinitionError(f"{view.qualified_name}: a sliding window view has no change stream to read")
    record_changes(conn, view, types, images=images)
    row = conn.execute(
        "INSERT INTO cv.change_readers (view, reader, position, images)"
        " SELECT view, %s, last, %s FROM cv.view_change_positions WHERE view = %s"
        " ON CONFLICT (view, reader) DO NOTHING RETURNING position",
        (reader, images, view.qualified_name),
    ).fetchone()
    if row is None:
        raise DefinitionError(f"{reader} already reads the changes of {view.qualified_name}")
    if is_states_reader(reader) and images:  # its changes carry the states from now on
        record_changes(conn, view, types)
    return int(row[0])


def add_stream_reader(conn: psycopg.Connection, name: str, reader: str) -> int:
    """Make `reader` take the changes of `name`, a change stream that always records (a transform's); its start.

    A transform's output is recorded from its creation (migration 0026): nothing to turn on.

    Raises:
        DefinitionError: `name` records no change stream, or the reader exists.
    """
    row = conn.execute(
        "INSERT INTO cv.change_readers (view, reader, position)"
        " SELECT view, %s, last FROM cv.view_change_positions WHERE view = %s AND recording"
        " ON CONFLICT (view, reader) DO NOTHING RETURNING position",
        (reader, name),
    ).fetchone()
    if row is None:
        if conn.execute("SELECT 1 FROM cv.change_readers WHERE view = %s AND reader = %s", (name, reader)).fetchone():
            raise DefinitionError(f"{reader} already reads the changes of {name}")
        raise DefinitionError(f"{name} records no change stream")
    return int(row[0])


# What owns a change stream, with the stream it reads: a continuous view or a continuous transform.
SOURCES_SQL = "(SELECT name, stream FROM cv.views UNION ALL SELECT name, stream FROM cv.transforms)"


@dataclass(frozen=True)
class Source:
    """A change stream readers may take: its owner's name, the stream it reads, and the view (None: a transform)."""

    name: str
    stream: str
    view: store.CompiledView | None


def source_of(conn: psycopg.Connection, name: str, scope: Scope) -> Source | None:
    """The continuous view or transform `name` as a change-stream source; None when it is neither."""
    row = conn.execute("SELECT definition, types, stream FROM cv.views WHERE name = %s", (name,)).fetchone()
    if row is not None:
        return Source(name, row[2], store.stored_view(row[0], row[1], scope))
    row = conn.execute("SELECT stream FROM cv.transforms WHERE name = %s", (name,)).fetchone()
    return Source(name, row[0], None) if row is not None else None


def add_source_reader(conn: psycopg.Connection, source: Source, reader: str, *, images: bool = True) -> int:
    """`add_reader` for a view, `add_stream_reader` for a transform (which records from its creation)."""
    if source.view is None:
        return add_stream_reader(conn, source.name, reader)
    return add_reader(conn, source.view.view, source.view.types, reader, images=images)


def remove_source_reader(conn: psycopg.Connection, source: Source, reader: str) -> None:
    """`remove_reader` for a view; a transform keeps recording, so only its reader row goes."""
    if source.view is None:
        conn.execute("DELETE FROM cv.change_readers WHERE view = %s AND reader = %s", (source.name, reader))
    else:
        remove_reader(conn, source.view.view, reader, source.view.types)


def remove_reader(conn: psycopg.Connection, view: ViewDef, reader: str, types: ViewTypes | None = None) -> None:
    """`reader` takes no more of the view's changes; recording stops when nobody else wants them.

    With `types` given, what the changes carry follows the readers left: the last output_of(v, states)
    reader gone, no stored states; the last reader that needed images gone, keys only.
    """
    gone = conn.execute(
        "DELETE FROM cv.change_readers WHERE view = %s AND reader = %s RETURNING images",
        (view.qualified_name, reader),
    ).fetchone()
    if not view.records_changes and not readers(conn, view.qualified_name) and is_recording(conn, view.qualified_name):
        stop_recording(conn, view)
    elif (
        types is not None
        and gone
        and gone[0]  # it needed the rows (and maybe the states): what the others need may be less
        and is_recording(conn, view.qualified_name)
    ):
        record_changes(conn, view, types)


def readers(conn: psycopg.Connection, name: str) -> list[str]:
    """Who reads view `name`'s changes, by name."""
    rows = conn.execute("SELECT reader FROM cv.change_readers WHERE view = %s ORDER BY reader", (name,)).fetchall()
    return [reader for (reader,) in rows]


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
