"""A view's replay in the catalog: its hidden shadow view, started, swapped in once caught up, or cancelled.

`streamviews replay V --from T` recomputes an append-only view from T of its stream's retained
history without readers ever seeing a partial result. One mechanism, the backfill's: the replay is a
*shadow* view, `cv_replay.replay_<id>`, with V's definition and `backfill = T` (without V's change
stream), created as a definition is (pipelines.cv.catalog.views). The runner's backfill process
catches it up on the history and the live runner takes it in once it is caught up, exactly as for a
new view (pipelines.cv.catalog.backfills, pipelines/cv/backfill.py).

The batch that finishes the shadow's catch-up swaps it in (`swap_in`, migration 0032's
cv.swap_replay), in its own transaction, which holds the stream's lock exclusively: no live batch is
in flight, so both have seen the same live events. V's storage rows are replaced by the shadow's
with DELETE + INSERT (its change stream records the net diff per group), then the shadow is
dropped; V keeps its name, grants, readers, sinks and change positions. The swap is the runner's,
not the command's: it happens whether or not `streamviews replay` still waits, and a kill -9 of the
runner anywhere leaves either the catch-up to resume from its stored positions or the swap done
(`swap_ready` swaps any replay found caught up but not swapped in, should one ever be). DROP of V
drops its shadow; any change of V's definition cancels the replay (a trigger on cv.views), as
`streamviews replay V --cancel` does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import psycopg
from psycopg import errors, sql

from pipelines.cv.catalog import store
from pipelines.cv.catalog.locks import (
    LOCK_TIMEOUT_MS,
    begin_change,
    bump,
    changing,
    lock_stream_for_change,
    mark_catalog_ddl,
)
from pipelines.cv.catalog.views import define_view
from pipelines.cv.frontend.backfill import EARLIEST, order_dependent
from pipelines.cv.frontend.changes import with_options
from pipelines.cv.frontend.statements import parse
from pipelines.cv.frontend.view_sources import stream_named
from pipelines.cv.model import DefinitionError, StreamDef, ViewDef
from pipelines.logs import get_logger
from pipelines.settings import ROLE_READER

log = get_logger("cv.catalog")

SCHEMA = "cv_replay"  # the shadows' read views; migration 0032 creates it


def shadow_name(replay_id: int) -> str:
    """The hidden view that recomputes a view for replay `replay_id`."""
    return f"{SCHEMA}.replay_{replay_id}"


def is_shadow(name: str) -> bool:
    """True for a replay's shadow view (hidden from `streamviews list`)."""
    return name.startswith(f"{SCHEMA}.")


def shadow_definition(definition: str, options: dict[str, str], shadow: str, rule: str) -> str:
    """The view's statement as its shadow's: its name, `backfill = rule`, and no change stream of its own."""
    kept = {k: v for k, v in options.items() if k != "changes"} | {"backfill": rule}
    _, _, after_name = with_options(definition, kept).partition(" WITH (")
    return f"CREATE CONTINUOUS VIEW {shadow} WITH ({after_name}"


def refusal(view: ViewDef, stream: StreamDef) -> str | None:
    """Why a view cannot be replayed (one line), or None: it reads an append-only stream, order-free."""
    name = view.qualified_name
    if stream.key is not None:
        return f"{name} reads the keyed stream {stream.name}: its state is the source; nothing to replay"
    if stream.is_feed:
        return f"{name} reads {stream.feed_of}'s changes, which Kafka does not retain; nothing to replay"
    if unordered := order_dependent(view.aggregates):
        return (
            f"{name} cannot be replayed: {', '.join(sorted(set(unordered)))} kept as a transition state may depend "
            "on the order events come in, and the history is applied after live events"
        )
    return None


@dataclass(frozen=True)
class Replay:
    """A replay as the catalog keeps it, with its shadow's catch-up progress (offsets done of those to do)."""

    id: int
    view: str
    shadow: str
    rule: str
    created_at: datetime
    ended_at: datetime | None
    outcome: str | None
    groups: int | None
    done: int
    total: int
    caught_up: bool


_REPLAY = """
SELECT r.id, r.view, r.shadow, r.rule, r.created_at, r.ended_at, r.outcome, r.groups,
       coalesce(s.offsets_done, 0), coalesce(s.offsets_total, 0), coalesce(s.complete, false)
  FROM cv.replays AS r LEFT JOIN cv.backfill_status AS s ON s.view = r.shadow
"""


def running(conn: psycopg.Connection, view: str) -> Replay | None:
    """The replay of `view` that has not ended, if any."""
    row = conn.execute(_REPLAY + " WHERE r.view = %s AND r.ended_at IS NULL", (view,)).fetchone()
    return Replay(*row) if row else None


def replay(conn: psycopg.Connection, replay_id: int) -> Replay | None:
    """A replay by id, running or ended (None: its view was dropped, and its history with it)."""
    row = conn.execute(_REPLAY + " WHERE r.id = %s", (replay_id,)).fetchone()
    return Replay(*row) if row else None


def start(conn: psycopg.Connection, name: str, rule: str) -> tuple[int, str]:
    """Create the shadow of view `name` recomputing it from `rule`, all in one definition; its id and a line.

    Raises:
        DefinitionError: No such view, it cannot be replayed (`refusal`), it is still backfilling,
            a replay of it already runs, or the runner has read nothing of its stream yet.
        DefinitionBlocked: Locks held elsewhere kept the definition from being applied.
    """
    what = f"replay of {name}"

    def run() -> tuple[int, str]:
        begin_change(conn, what)
        scope = store.scope(conn)
        row = conn.execute("SELECT definition, types FROM cv.views WHERE name = %s", (name,)).fetchone()
        if row is None or is_shadow(name):
            raise DefinitionError(f"no continuous view named {name}")
        view = store.stored_view(row[0], row[1], scope).view
        stream = stream_named(view.stream, scope.streams, scope.views)
        if why := refusal(view, stream):
            raise DefinitionError(why)
        if (other := running(conn, name)) is not None:
            raise DefinitionError(
                f"a replay of {name} is already running (from {other.rule}, since "
                f"{other.created_at:%Y-%m-%d %H:%M:%S %Z}, {other.done}/{other.total} offsets); "
                f"`streamviews replay {name} --cancel` drops it"
            )
        if conn.execute("SELECT 1 FROM cv.backfills WHERE view = %s AND done_at IS NULL", (name,)).fetchone():
            raise DefinitionError(f"{name} is still catching up on its own history; replay it once complete")
        replay_id = conn.execute("SELECT nextval(pg_get_serial_sequence('cv.replays', 'id'))").fetchone()[0]
        shadow = shadow_name(replay_id)
        shadow_view = parse(shadow_definition(row[0], view.options, shadow, rule), scope)
        assert isinstance(shadow_view, ViewDef)
        define_view(conn, shadow_view, scope)
        if conn.execute("SELECT 1 FROM cv.backfills WHERE view = %s", (shadow,)).fetchone() is None:
            raise DefinitionError(f"{what}: the runner has read nothing of {stream.name} yet; nothing to replay")
        hidden = sql.Identifier(SCHEMA, shadow.partition(".")[2])  # readers never see it
        conn.execute(sql.SQL("REVOKE ALL ON {} FROM {}").format(hidden, sql.Identifier(ROLE_READER)))
        conn.execute(
            "INSERT INTO cv.replays (id, view, shadow, rule) VALUES (%s, %s, %s, %s)", (replay_id, name, shadow, rule)
        )
        bump(conn)
        since = "the earliest retained event" if rule == EARLIEST else rule
        log.info("replay started", view=name, shadow=shadow, rule=rule)
        line = f"replaying {name} from {since}; readers see its current result until the new one is swapped in"
        return replay_id, line

    return changing(conn, what, run)


def cancel(conn: psycopg.Connection, name: str) -> bool:
    """Drop the shadow of the running replay of view `name`; False when none runs."""
    what = f"cancel the replay of {name}"

    def run() -> bool:
        begin_change(conn, what)
        row = conn.execute("SELECT stream FROM cv.views WHERE name = %s", (name,)).fetchone()
        if row is None or running(conn, name) is None:
            return False
        lock_stream_for_change(conn, row[0], what)  # the runner writes the shadow's tables under it
        cancelled = conn.execute(
            "SELECT cv.end_replay(%s, 'cancelled: streamviews replay --cancel')", (name,)
        ).fetchone()[0]
        bump(conn)
        return bool(cancelled)

    return changing(conn, what, run)


def swap_in(conn: psycopg.Connection, shadow: str) -> str | None:
    """In the transaction that marks the shadow's catch-up done, under the stream's exclusive lock: the swap.

    As sv_writer (cv.swap_replay is SECURITY DEFINER); its outcome ('swapped', 'failed') or None.
    The swap drops the shadow's read view and tables: the catalog's own DDL (`mark_catalog_ddl`).
    """
    mark_catalog_ddl(conn)
    row = conn.execute(
        "SELECT r.view, cv.swap_replay(r.view) FROM cv.replays AS r WHERE r.shadow = %s AND r.ended_at IS NULL",
        (shadow,),
    ).fetchone()
    if row is not None:
        log.info("replay ended", view=row[0], outcome=row[1])
    return row[1] if row else None


def swap_ready(conn: psycopg.Connection, runs: Callable[[str], bool]) -> list[str]:
    """Swap in every replay of a stream `runs` accepts whose shadow has caught up; the views swapped.

    The backfill process looks between backfills. The batch that finishes a catch-up swaps it in
    (`swap_in`), so none should be left; this is the safety net. A lock not had within
    LOCK_TIMEOUT_MS (a definition, a reader of the shadow) leaves it to the next look.
    """
    ready = conn.execute(
        "SELECT r.view, v.stream FROM cv.replays AS r JOIN cv.backfills AS b ON b.view = r.shadow"
        " JOIN cv.views AS v ON v.name = r.view WHERE r.ended_at IS NULL AND b.done_at IS NOT NULL ORDER BY r.id"
    ).fetchall()
    swapped = []
    for view, stream in ready:
        if not runs(stream):
            continue
        try:
            with conn.transaction():
                conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{LOCK_TIMEOUT_MS}ms",))
                mark_catalog_ddl(conn)  # the swap drops the shadow's read view and tables
                outcome = conn.execute("SELECT cv.swap_replay(%s)", (view,)).fetchone()[0]
        except (errors.LockNotAvailable, errors.DeadlockDetected) as e:
            log.info("replay swap blocked; trying again later", view=view, reason=str(e).strip()[:200])
            continue
        if outcome is not None:
            log.info("replay ended", view=view, outcome=outcome)
        if outcome == "swapped":
            swapped.append(view)
    return swapped
