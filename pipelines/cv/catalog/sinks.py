"""CREATE SINK and DROP SINK: a reader of a view's changes (migration 0023) with its topic (cv.sinks, 0024).

A sink is created in the definition's transaction, after its view's stream lock (the view may start
recording changes: triggers on its storage, pipelines.cv.catalog.locks step 3): its reader starts at
the view's last position, and the relay (pipelines.cv.relay) publishes the view's rows as they are
then before it relays what follows (`snapshot_done`). Its `where` is checked here by planning it
exactly as the relay runs it (`change_filter`), so a condition PostgreSQL refuses (an unknown
column, a type mismatch, not a boolean) fails the definition in one line, not the relay later.

Dropping a sink removes its reader (the view stops recording if nobody else wants its changes);
its topic stays, as a dropped stream's does: it is users' data.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

import psycopg
from psycopg import sql

from pipelines.cv.catalog import change_streams
from pipelines.cv.catalog.locks import Outcome, lock_stream_for_change
from pipelines.cv.frontend.sinks import DropSink, SinkDef, reader_name
from pipelines.cv.model import DefinitionError, Scope
from pipelines.logs import get_logger

log = get_logger("cv.catalog")


def apply_sink(conn: psycopg.Connection, statement: SinkDef | DropSink, scope: Scope) -> Outcome:
    """CREATE SINK or DROP SINK, in the script's transaction."""
    if isinstance(statement, SinkDef):
        return create_sink(conn, statement, scope)
    lines, changed = [], False
    for name in statement.names:
        if not exists(conn, name):
            if not statement.if_exists:
                raise DefinitionError(f"DROP SINK: no sink named {name}")
            lines.append(f"sink {name} does not exist; skipped")
            continue
        lines.append(drop_sink(conn, name, scope).line)
        changed = True
    return Outcome("; ".join(lines), changed=changed)


def exists(conn: psycopg.Connection, name: str) -> bool:
    """True when a sink of this name exists."""
    return conn.execute("SELECT 1 FROM cv.sinks WHERE name = %s", (name,)).fetchone() is not None


def create_sink(conn: psycopg.Connection, sink: SinkDef, scope: Scope) -> Outcome:
    """A new sink: its view's reader from the view's last position, its filter checked, its row in cv.sinks.

    The same statement again changes nothing; another definition under the same name is refused.
    """
    what = f"CREATE SINK {sink.name}"
    row = conn.execute("SELECT definition FROM cv.sinks WHERE name = %s", (sink.name,)).fetchone()
    if row is not None:
        if " ".join(row[0].split()) == " ".join(sink.definition.split()):
            return Outcome(f"sink {sink.name} unchanged", changed=False)
        raise DefinitionError(f"{what}: a sink of this name exists; DROP SINK {sink.name} first")
    source = change_streams.source_of(conn, sink.view, scope)
    if source is None:
        raise DefinitionError(f"{what}: no continuous view or transform named {sink.view}")
    lock_stream_for_change(conn, source.stream, what)
    start = change_streams.add_source_reader(conn, source, sink.reader, images=sink.needs_images)
    check_filter(conn, sink, what)
    conn.execute(
        "INSERT INTO cv.sinks (name, view, topic, format, envelope, where_sql, partitions, definition, snapshot_done)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (
            sink.name,
            sink.view,
            sink.topic,
            sink.format,
            sink.envelope,
            sink.where,
            sink.partitions,
            sink.definition,
            source.view is None,  # a transform's rows are appended, never current: no snapshot to publish
        ),
    )
    # Wake the relay now rather than at its next safety wake (delivered at commit). `{"views": null}`
    # tells every reader of the channel "look again" (migration 0020), the relay among them.
    conn.execute("SELECT pg_notify('streamviews_changes', %s)", (json.dumps({"views": None, "sink": sink.name}),))
    log.info("sink created", sink=sink.name, view=sink.view, topic=sink.topic, format=sink.format, position=start)
    return Outcome(f"sink {sink.name} created: {sink.view} -> topic {sink.topic} ({sink.format})")


def check_filter(conn: psycopg.Connection, sink: SinkDef, what: str) -> None:
    """Plan the relay's filter over the view's changes (EXPLAIN): PostgreSQL's refusal, in one line."""
    if sink.where is None:
        return
    statement = sql.SQL("EXPLAIN SELECT c.position FROM cv.view_changes AS c WHERE c.view = %s AND {}").format(
        change_filter(sink.view, sink.where)
    )
    try:
        with conn.transaction():  # a savepoint: the refusal must not end the script's transaction
            conn.execute(statement, (sink.view,))
    except psycopg.Error as e:
        message = " ".join(str(e.diag.message_primary or e).split())
        raise DefinitionError(f"{what}: where: {message}") from e


def change_filter(view: str, where: str | None) -> sql.Composable:
    """The condition on a change `c` of cv.view_changes, (old) and (new) being its before and after as view rows.

    `where` is the front end's own writing of one expression that names only old and new
    (pipelines.cv.frontend.sinks); each row is built from the change's jsonb as the view's row type,
    so `(new).n > 100` compares as the view's column type, and `(old) IS NULL` holds for a new group.
    """
    if where is None:
        return sql.SQL("true")
    row_type = sql.Identifier(*view.split(".", 1))
    return sql.SQL(
        "coalesce((SELECT true FROM jsonb_populate_record(NULL::{}, c.before) AS old,"
        " jsonb_populate_record(NULL::{}, c.after) AS new WHERE {}), false)"
    ).format(row_type, row_type, sql.SQL(where))


def drop_sink(conn: psycopg.Connection, name: str, scope: Scope) -> Outcome:
    """DROP SINK: its row and its reader (its view may stop recording); its topic stays."""
    what = f"DROP SINK {name}"
    (view_name,) = conn.execute("SELECT view FROM cv.sinks WHERE name = %s", (name,)).fetchone()
    conn.execute("DELETE FROM cv.sinks WHERE name = %s", (name,))
    source = change_streams.source_of(conn, view_name, scope)
    if source is None:  # its owner is gone (it cannot be dropped while read): only the reader to remove
        conn.execute("DELETE FROM cv.change_readers WHERE view = %s AND reader = %s", (view_name, reader_name(name)))
    else:
        lock_stream_for_change(conn, source.stream, what)
        change_streams.remove_source_reader(conn, source, reader_name(name))
    log.info("sink dropped", sink=name, view=view_name)
    return Outcome(f"sink {name} dropped (its topic is kept)")


@dataclass(frozen=True)
class SinkState:
    """A sink as the relay and `streamviews status` see it: definition, position, lag, failure."""

    name: str
    view: str
    stream: str | None  # the view's stream (None for a change stream that is not a view's)
    topic: str
    format: str
    envelope: str | None
    where: str | None
    partitions: int | None
    snapshot_done: bool
    position: int  # the last position relayed (cv.change_readers)
    last: int  # the view's last position
    oldest_untaken: datetime | None  # commit time of the first change not relayed yet
    failed_at: datetime | None
    error: str | None

    @property
    def lag_changes(self) -> int:
        """Changes the view recorded that the sink has not relayed (filtered ones included)."""
        return max(self.last - self.position, 0)


_STATES = """
SELECT s.name, s.view, v.stream, s.topic, s.format, s.envelope, s.where_sql, s.partitions, s.snapshot_done,
       r.position, p.last,
       (SELECT c.committed_at FROM cv.view_changes AS c WHERE c.view = s.view AND c.position > r.position
         ORDER BY c.position LIMIT 1),
       s.failed_at, s.error
  FROM cv.sinks AS s
  JOIN cv.change_readers AS r ON r.view = s.view AND r.reader = 'sink ' || s.name
  JOIN cv.view_change_positions AS p ON p.view = s.view
  LEFT JOIN {sources} AS v ON v.name = s.view
 ORDER BY s.name
""".replace("{sources}", change_streams.SOURCES_SQL)


def sink_states(conn: psycopg.Connection) -> list[SinkState]:
    """Every sink with its position and the view's, in name order."""
    return [SinkState(*row) for row in conn.execute(_STATES).fetchall()]
