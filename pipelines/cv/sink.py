"""The views sink: a pipeline's changes into the continuous views of one stream."""

from __future__ import annotations

import psycopg

from pipelines.checkpoint import Record
from pipelines.cv.engine import StreamMaintainer
from pipelines.logs import get_logger

log = get_logger("cv.sink")


class ViewSink:
    """Applies each batch of `Change`s (see pipelines.events) to a stream's views, set-based."""

    def __init__(self, stream: str) -> None:
        self.stream = stream
        self.maintainer = StreamMaintainer(stream)

    def apply(self, conn: psycopg.Connection, records: list[Record]) -> int:
        """Hand the changes to the maintainer as parallel columns, in batch order; returns deltas."""
        changes = [change for _, change in records]
        ops = [change.op for change in changes]
        columns = [list(column) for column in zip(*(change.values for change in changes), strict=True)]
        return self.maintainer.apply(conn, ops, columns)

    def reset(self) -> None:
        """Temporary tables created in a rolled-back transaction are gone with it."""
        self.maintainer.forget_sessions()

    def housekeeping(self, conn: psycopg.Connection) -> None:
        """Delete time buckets past each view's retention."""
        deleted = self.maintainer.expire(conn)
        if deleted:
            log.info("expired time buckets", stream=self.stream, rows=deleted)

    def __str__(self) -> str:
        return f"views of stream {self.stream}"
