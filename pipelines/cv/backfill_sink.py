"""Where a backfill's history goes: each batch applied to its one view in the checkpoint's transaction.

The catch-up (pipelines/cv/backfill.py) reads and decodes the history; this sink applies each batch
to its view alone under the stream's lock, as the live runner's batches are applied, and checks
first that the backfill is still the one it read for (a view dropped or rebuilt meanwhile is not).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import psycopg

from pipelines.cv import catalog, isolation
from pipelines.cv.catalog import replays
from pipelines.cv.engine import StreamMaintainer
from pipelines.cv.stream_changes import StreamChanges
from pipelines.errors import StreamviewsError
from pipelines.runtime.checkpoint import ApplyOutcome

Partition = tuple[str, int]


class BackfillStopped(StreamviewsError):
    """The backfill is gone (its view dropped or rebuilt) or done: the batch rolls back, the catch-up moves on."""

    transient = True  # not the batch's fault: the checkpoint raises it as it is, no isolation


class BackfillHeld(StreamviewsError):
    """The stream itself fails (its state or a type gone): the batch rolls back and is tried again later."""

    transient = True


class ViewNotMaintained(StreamviewsError):
    """The view is quarantined: the history waits until it is maintained again."""

    transient = True


@dataclass
class Pending:
    """A backfill to catch up: its view and stream, its group, rule, and switch point per partition.

    The switch points are None until the view joins the live runner (`joined`).
    """

    view: str
    stream: str
    group_id: str
    rule: str
    switch: dict[Partition, int | None]
    joined: bool = True


@dataclass
class HistoryBatch:
    """One batch of history for one view: its stream's changes, and whether it reaches the switch points."""

    backfill: Pending
    changes: StreamChanges = field(default_factory=StreamChanges)
    finishing: bool = False


class BackfillSink:
    """Applies history to one view in the checkpoint's transaction; marks the backfill done with its last batch.

    A batch the view fails on is applied again in isolation as a live batch is (pipelines/cv/isolation.py):
    the records the view cannot take are dead-lettered (`view_error`, naming the view) and the rest
    applied; a view that cannot run, or rejects more than PIPELINE_POISON_LIMIT records of a batch,
    is quarantined, and the batch's offsets then wait with it, so its history is read again once it
    is maintained again. A failure of the stream itself is raised (`BackfillHeld`): the catch-up
    tries again later, and the live runner's streams are not held for it.
    """

    def __init__(self, poison_limit: int = 100, view_retry_s: float = 30.0) -> None:
        self.poison_limit, self.view_retry_s = poison_limit, view_retry_s
        self.maintainers: dict[str, StreamMaintainer] = {}

    def apply(self, conn: psycopg.Connection, payload: HistoryBatch, outcome: ApplyOutcome) -> int:
        """Under the stream's lock (then the backfill's row: the catalog's order): check, apply, maybe finish.

        A replay's last batch holds the lock exclusively: no live batch is in flight, so the view and
        its shadow have seen the same live events, and the shadow is swapped in with it.
        """
        backfill = payload.backfill
        swap = payload.finishing and replays.is_shadow(backfill.view)
        catalog.lock_stream(conn, backfill.stream, shared=not swap)
        row = conn.execute("SELECT done_at FROM cv.backfills WHERE group_id = %s", (backfill.group_id,)).fetchone()
        if row is None or row[0] is not None:
            raise BackfillStopped(f"backfill of {backfill.view}: dropped, rebuilt or done meanwhile")
        maintainer = self.maintainers.get(backfill.view)
        if maintainer is None:  # one backfill at a time: the last one's plan is not needed again
            maintainer = StreamMaintainer(backfill.stream, backfilling=backfill.view)
            self.maintainers = {backfill.view: maintainer}
        if backfill.view not in maintainer.planned_views(conn):
            raise ViewNotMaintained(f"backfill of {backfill.view}: the view is quarantined; history waits")
        changes = payload.changes
        changed = 0
        if changes.ops and not outcome.isolate:
            changed = maintainer.apply(conn, changes.ops, changes.columns)
        elif changes.ops:
            changed = isolation.StreamIsolation(conn, maintainer, changes, outcome, self).apply()
            if backfill.view not in maintainer.planned_views(conn):  # quarantined by it: its history waits too
                outcome.held_topics.update(changes.topics)
                return changed
        if payload.finishing:
            conn.execute("UPDATE cv.backfills SET done_at = now() WHERE group_id = %s", (backfill.group_id,))
        if swap:
            replays.swap_in(conn, backfill.view)
        return changed

    def hold_stream(
        self,
        conn: psycopg.Connection,
        stream: str,
        broken: isolation.StreamBroken,
        topics: list[str],
        outcome: ApplyOutcome,
    ) -> None:
        """The stream's records cannot be applied at all: the batch rolls back, the catch-up tries again later."""
        raise BackfillHeld(broken.reason)

    def reset(self) -> None:
        """After a rollback: temporary tables and plans are gone with it."""
        for maintainer in self.maintainers.values():
            maintainer.forget_sessions()

    def housekeeping(self, conn: psycopg.Connection) -> None:
        """Nothing: the live runner keeps the views."""
