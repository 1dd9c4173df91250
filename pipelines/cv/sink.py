"""The views sink: a batch's changes, grouped by stream, into each stream's state and continuous views."""

from __future__ import annotations

import psycopg
from psycopg import sql

from pipelines.cv import isolation
from pipelines.cv.apply_errors import StreamDropped
from pipelines.cv.engine import StreamMaintainer
from pipelines.cv.stream_changes import StreamChanges
from pipelines.logs import get_logger
from pipelines.runtime.checkpoint import ApplyOutcome

log = get_logger("cv.sink")


# The runner's payload: each target stream's changes, by stream name (what `StreamRunner.decode` makes).
ViewChanges = dict[str, StreamChanges]


class ViewSink:
    """Applies each batch to the streams it touches, in stream name order, then views in name order.

    That order, and groups sorted within a view, is the one every writer locks rows in, so several
    runner processes never deadlock. A stream dropped since its records were read is skipped: its
    definition, state and views are gone. A batch that failed is applied again in isolation
    (`outcome.isolate`): see pipelines/cv/isolation.py.
    """

    def __init__(
        self,
        group_id: str = "",
        poison_limit: int = 100,
        view_retry_s: float = 30.0,
        changes_retention_s: float = 86_400.0,
        feed_dead_letters_retention_s: float = 604_800.0,
    ) -> None:
        self.group_id = group_id
        self.changes_retention_s = changes_retention_s
        self.feed_dead_letters_retention_s = feed_dead_letters_retention_s
        self.maintainers: dict[str, StreamMaintainer] = {}
        self.streams: tuple[str, ...] = ()  # the streams whose retention housekeeping runs
        self.poison_limit, self.view_retry_s = poison_limit, view_retry_s
        # The group's streams recorded in cv.stream_failures (read at the first batch: a restarted
        # runner clears what it held before once the stream applies again).
        self.held_streams: set[str] | None = None

    def apply(self, conn: psycopg.Connection, payload: ViewChanges, outcome: ApplyOutcome) -> int:
        """Apply every stream's changes in this transaction; returns the deltas (real changes)."""
        changed = 0
        if self.held_streams is None:
            self.held_streams = isolation.held_streams(conn, self.group_id)
        for name in sorted(payload):
            changes = payload[name]
            if not changes.ops:
                continue
            maintainer = self._maintainer(name)
            try:
                if outcome.isolate:
                    changed += isolation.StreamIsolation(conn, maintainer, changes, outcome, self).apply()
                else:
                    changed += maintainer.apply(
                        conn, changes.ops, changes.columns, decoded_as=_decoded_as(name, changes)
                    )
            except StreamDropped:
                log.warning("stream dropped; skipping its records", stream=name, records=len(changes.ops))
                continue
            if name in self.held_streams and not set(changes.topics) & outcome.held_topics:
                isolation.release_stream(conn, name)
                self.held_streams.discard(name)
        return changed

    def hold_stream(
        self,
        conn: psycopg.Connection,
        stream: str,
        broken: isolation.StreamBroken,
        topics: list[str],
        outcome: ApplyOutcome,
    ) -> None:
        """Isolation's step 5: the stream's topics held back, released once it applies again."""
        isolation.hold(conn, stream, broken, topics, outcome)
        assert self.held_streams is not None
        self.held_streams.add(stream)

    def reset(self) -> None:
        """Temporary tables created in a rolled-back transaction are gone with it."""
        for maintainer in self.maintainers.values():
            maintainer.forget_sessions()

    def housekeeping(self, conn: psycopg.Connection) -> None:
        """Delete time buckets, recorded changes and feed dead letters past retention, stop overrunning reads, retry.

        The second duty sits here because the runner is the one service always running against the
        views' database: see migrations 0014 and 0016 for why PostgreSQL needs the help.
        """
        for pid, action, running in conn.execute("SELECT * FROM ops.stop_overrunning_reads()").fetchall():
            log.warning("stopped an overrunning read", pid=pid, action=action, seconds=round(running.total_seconds()))
        isolation.retry_quarantined(conn, self.streams, self.group_id, self.view_retry_s)
        for name in self.streams:
            try:
                deleted = self._maintainer(name).expire(conn)
            except StreamDropped:
                continue
            if deleted:
                log.info("expired time buckets", stream=name, rows=deleted)
        for prune, retention_s, event in (
            ("prune_view_changes", self.changes_retention_s, "pruned recorded changes"),
            ("prune_feed_dead_letters", self.feed_dead_letters_retention_s, "pruned feed dead letters"),
        ):
            pruned = conn.execute(
                sql.SQL("SELECT {}(make_interval(secs => %s))").format(sql.Identifier("cv", prune)), (retention_s,)
            )
            if count := pruned.fetchone()[0]:
                log.info(event, rows=count, older_than_s=retention_s)

    def _maintainer(self, name: str) -> StreamMaintainer:
        maintainer = self.maintainers.get(name)
        if maintainer is None:
            maintainer = self.maintainers[name] = StreamMaintainer(name)
        return maintainer

    def __str__(self) -> str:
        return "views of the declared streams"


def _decoded_as(stream: str, changes: StreamChanges) -> tuple[str, ...] | None:
    """The columns a stream's own changes were decoded for (None when fed `into` it: those match by position)."""
    decoders = {o.decoder for o in changes.origins}
    if len(decoders) != 1:
        return None
    declared = getattr(next(iter(decoders)), "stream", None)
    return declared.column_names if declared is not None and declared.name == stream else None
