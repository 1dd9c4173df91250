"""Where a backfill's history goes: each batch applied to its one view in the checkpoint's transaction.

The catch-up (pipelines/cv/backfill.py) reads and decodes the history; this sink applies each batch
to its view alone under the stream's lock, as the live runner's batches are applied, and checks
first that the backfill is still the one it read for (a view dropped or rebuilt meanwhile is not).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg

from pipelines.cv import catalog
from pipelines.cv.catalog import replays
from pipelines.cv.engine import StreamMaintainer
from pipelines.errors import StreamviewsError
from pipelines.runtime.checkpoint import ApplyOutcome

Partition = tuple[str, int]


class BackfillStopped(StreamviewsError):
    """The backfill is gone (its view dropped or rebuilt) or done: the batch rolls back, the catch-up moves on."""

    transient = True  # not the batch's fault: the checkpoint raises it as it is, no isolation


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
    """One batch of history for one view: its stream's changes (inserts), and whether it reaches the switch."""

    backfill: Pending
    ops: list[int] = field(default_factory=list)
    columns: list[list[Any]] = field(default_factory=list)
    finishing: bool = False

    def extend(self, ops: list[int], columns: list[list[Any]]) -> None:
        """Append another topic's decoded changes (a stream fed `into` the view's stream)."""
        if not self.ops:
            self.ops, self.columns = list(ops), [list(c) for c in columns]
            return
        self.ops.extend(ops)
        for mine, theirs in zip(self.columns, columns, strict=True):
            mine.extend(theirs)


class BackfillSink:
    """Applies history to one view in the checkpoint's transaction; marks the backfill done with its last batch."""

    def __init__(self) -> None:
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
        maintainer = self.maintainers.setdefault(backfill.stream, StreamMaintainer(backfill.stream, catching_up=True))
        if backfill.view not in maintainer.planned_views(conn):
            raise ViewNotMaintained(f"backfill of {backfill.view}: the view is quarantined; history waits")
        changed = 0
        if payload.ops:
            changed = maintainer.apply(conn, payload.ops, payload.columns, only=frozenset({backfill.view}))
        if payload.finishing:
            conn.execute("UPDATE cv.backfills SET done_at = now() WHERE group_id = %s", (backfill.group_id,))
        if swap:
            replays.swap_in(conn, backfill.view)
        return changed

    def reset(self) -> None:
        """After a rollback: temporary tables and plans are gone with it."""
        for maintainer in self.maintainers.values():
            maintainer.forget_sessions()

    def housekeeping(self, conn: psycopg.Connection) -> None:
        """Nothing: the live runner keeps the views."""
