"""`streamviews subscribe <view>`: a view's recorded changes as JSON lines, then each new one as it commits.

    streamviews subscribe public.url_stats --from 0          # every change kept, then new ones
    streamviews subscribe public.url_stats                   # from now on (--from now)
    streamviews subscribe public.url_stats --from 41 --limit 10

Each line is one change (migration 0020): `{"view", "position", "key", "before", "after", "delta",
"committed_at"}`, in position order. `--from P` prints the changes after position P (the last one
you saw: resuming with it prints each change once). The command LISTENs on `streamviews_changes`
before it reads, so no commit falls between its read and its wait; it reads again when a
notification names the view, and at least every `SAFETY_WAKE_S` in case one was lost. It reads
`cv.view_changes_readable`: a role sees the changes of the views it may read.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from typing import TextIO

import psycopg
from psycopg import sql

from pipelines.cv.cli_common import USAGE, CommandError

CHANNEL = "streamviews_changes"
# The longest the command waits without reading, should a notification be lost.
SAFETY_WAKE_S = 30.0
# A wait for a notification is cut in slices this long, each followed by a look at whether to stop:
# Ctrl-C is taken by a signal handler, not by an exception raised inside the driver's wait.
WAIT_SLICE_S = 0.5
# Changes read per query.
PAGE = 1000

# One change as its JSON line, built by PostgreSQL: json (not jsonb) keeps the keys in this order,
# and numbers are written exactly as stored. A sink of format `changes` publishes the same object.
CHANGE_JSON = (
    "json_build_object('view', view, 'position', position, 'key', key, 'before', before,"
    " 'after', after, 'delta', delta, 'committed_at', committed_at)"
)
_CHANGES = (
    f"SELECT position, {CHANGE_JSON}::text"  # noqa: S608 (a constant)
    " FROM cv.view_changes_readable WHERE view = %s AND position > %s ORDER BY position LIMIT %s"
)


def qualified(view: str) -> str:
    """`x` is `public.x`, as everywhere a view is named."""
    return view if "." in view else f"public.{view}"


def start_position(conn: psycopg.Connection, view: str, start: str) -> int:
    """The position to print after: `start` as a number, or the view's last position for `now`.

    Raises:
        CommandError: No such view, a view that does not record changes (or only their keys), or `start` is neither.
    """
    row = conn.execute(
        "SELECT recording, last, images FROM cv.view_change_positions WHERE view = %s", (view,)
    ).fetchone()
    if row is None or not row[0]:
        try:
            exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (view,)).fetchone()[0]
        except psycopg.errors.InvalidName:
            exists = False
        if not exists:
            raise CommandError(f"no view named {view}", USAGE)
        raise CommandError(
            f"view {view} does not record its changes: ALTER CONTINUOUS VIEW {view} SET (changes = true)", USAGE
        )
    if not row[2]:  # only upsert sinks read it (migration 0046)
        raise CommandError(
            f"view {view} records only which groups changed, for its upsert sinks: ALTER CONTINUOUS VIEW {view}"
            " SET (changes = true) to record each change's rows",
            USAGE,
        )
    if start == "now":
        return int(row[1])
    if not start.isdigit():
        raise CommandError(f"--from takes a position (0 or more) or now, not {start!r}", USAGE)
    return int(start)


def follow(
    conn: psycopg.Connection,
    view: str,
    after: int,
    limit: int | None,
    out: TextIO = sys.stdout,
    stopped: Callable[[], bool] = lambda: False,
) -> int:
    """Print the view's changes after position `after`, waiting for more, until `limit` are printed or `stopped()`.

    `conn` is in autocommit and already LISTENs on CHANNEL. Returns how many were printed.
    """
    printed = 0
    first = True
    while not stopped():
        want = PAGE if limit is None else min(PAGE, limit - printed)
        rows = conn.execute(_CHANGES, (view, after, want)).fetchall()
        if first and rows and rows[0][0] > after + 1:
            print(f"note: changes {after + 1} to {rows[0][0] - 1} of {view} were pruned (retention)", file=sys.stderr)
        first = False
        for position, line in rows:
            out.write(line + "\n")
            after = position
        out.flush()
        printed += len(rows)
        if limit is not None and printed >= limit:
            return printed
        if len(rows) < want:
            _wait(conn, view, stopped)
    return printed


def _wait(conn: psycopg.Connection, view: str, stopped: Callable[[], bool]) -> None:
    """Until a notification names the view (or may: a truncated payload), SAFETY_WAKE_S passed, or `stopped()`."""
    deadline = time.monotonic() + SAFETY_WAKE_S
    while not stopped() and (left := deadline - time.monotonic()) > 0:
        for notify in conn.notifies(timeout=min(left, WAIT_SLICE_S)):
            if names_view(notify.payload, view):
                return


def names_view(payload: str, view: str) -> bool:
    """True when a `streamviews_changes` payload names the view, or cannot tell (names left out)."""
    try:
        views = json.loads(payload).get("views")
    except (ValueError, AttributeError):
        return True
    return views is None or view in views


def listen(conn: psycopg.Connection) -> None:
    """LISTEN on the channel (the connection in autocommit, so it takes effect now)."""
    conn.autocommit = True
    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))


def changes(conn: psycopg.Connection, view: str) -> Iterator[tuple[int, str]]:
    """Every change of the view kept now, in position order: (position, JSON line). For tests and tools."""
    after = 0
    while rows := conn.execute(_CHANGES, (view, after, PAGE)).fetchall():
        yield from rows
        after = rows[-1][0]
