"""The views sink: a batch's changes, grouped by stream, into each stream's state and continuous views."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg

from pipelines.cv.engine import StreamDropped, StreamMaintainer
from pipelines.logs import get_logger

log = get_logger("cv.sink")


@dataclass
class StreamChanges:
    """One stream's part of a batch, as parallel columns: an op (+1 insert, -1 delete) per change."""

    ops: list[int] = field(default_factory=list)
    columns: list[list[Any]] = field(default_factory=list)

    def extend(self, ops: list[int], columns: list[list[Any]]) -> None:
        """Append changes read after the ones already here (another topic feeding the same stream)."""
        if not self.ops:
            self.ops, self.columns = ops, columns  # the common case, one topic per stream: no copy
            return
        self.ops.extend(ops)
        for mine, theirs in zip(self.columns, columns, strict=True):
            mine.extend(theirs)


class ViewSink:
    """Applies each batch to the streams it touches, in stream name order, then views in name order.

    That order, and groups sorted within a view, is the one every writer locks rows in, so several
    runner processes never deadlock. A stream dropped since its records were read is skipped: its
    definition, state and views are gone.
    """

    def __init__(self) -> None:
        self.maintainers: dict[str, StreamMaintainer] = {}
        self.streams: tuple[str, ...] = ()  # the streams whose retention housekeeping runs

    def apply(self, conn: psycopg.Connection, payload: dict[str, StreamChanges]) -> int:
        """Apply every stream's changes in this transaction; returns the deltas (real changes)."""
        changed = 0
        for name in sorted(payload):
            changes = payload[name]
            if not changes.ops:
                continue
            try:
                changed += self._maintainer(name).apply(conn, changes.ops, changes.columns)
            except StreamDropped:
                log.warning("stream dropped; skipping its records", stream=name, records=len(changes.ops))
        return changed

    def reset(self) -> None:
        """Temporary tables created in a rolled-back transaction are gone with it."""
        for maintainer in self.maintainers.values():
            maintainer.forget_sessions()

    def housekeeping(self, conn: psycopg.Connection) -> None:
        """Delete time buckets past each view's retention; stop reads that lifted their timeouts.

        The second duty sits here because the runner is the one service always running against the
        views' database: see migration 0014 for why PostgreSQL needs the help.
        """
        for pid, action, running in conn.execute("SELECT * FROM ops.stop_overrunning_reads()").fetchall():
            log.warning("stopped an overrunning read", pid=pid, action=action, seconds=round(running.total_seconds()))
        for name in self.streams:
            try:
                deleted = self._maintainer(name).expire(conn)
            except StreamDropped:
                continue
            if deleted:
                log.info("expired time buckets", stream=name, rows=deleted)

    def _maintainer(self, name: str) -> StreamMaintainer:
        maintainer = self.maintainers.get(name)
        if maintainer is None:
            maintainer = self.maintainers[name] = StreamMaintainer(name)
        return maintainer

    def __str__(self) -> str:
        return "views of the declared streams"
