"""The backfill's PostgreSQL backends at its process's CPU priority (streamviews.lower_backend_priority).

The backfill child runs niced by PIPELINE_BACKFILL_NICE (pipelines/cv/backfill_process.py), but the
SQL of its batches is the work of its backends, which the postmaster forks at the normal priority:
on two cores such a backend competed with the live runner's as an equal, and the live view's
freshness p99 during a backfill was 0.7-1.1 s against a target of 1 s. Only a backend can nice
itself without privilege, so each connection of the backfill asks its own, once, right after it is
made (pgext/priority.c). The value lasts as long as the backend, i.e. the connection. A backend is
a session of its own, so where Linux shares the CPU between sessions first (autogroups), its nice
value alone weighs nothing against the live runner's backend: the function nices the session's group
too (waiting up to a second when another group's value changed in the last 100 ms).

An extension older than 1.8, or a role without EXECUTE on the function, has none: one warning, and
the backfill goes on at the backends' normal priority (it is slower to give way, not wrong).
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import errors

from pipelines.logs import get_logger
from pipelines.runtime.offsets import PostgresOffsets

log = get_logger("cv.backfill")

_MISSING = (errors.UndefinedFunction, errors.InvalidSchemaName, errors.InsufficientPrivilege)


class BackendPriority:
    """Connections whose backends run at `nice` (0: left alone), for every connection of the backfill process."""

    def __init__(self, nice: int) -> None:
        self.nice = nice
        self.missing = False  # the function is not there (or not ours to call): asked no more

    def lower(self, conn: psycopg.Connection) -> None:
        """Nice the connection's backend, in a transaction of its own (committed: the connection is left idle)."""
        if self.nice <= 0 or self.missing:
            return
        try:
            with conn.transaction():
                conn.execute("SELECT streamviews.lower_backend_priority(%s)", (self.nice,))
        except _MISSING as e:
            self.missing = True
            log.warning(
                "the backfill's PostgreSQL sessions keep their normal CPU priority:"
                " streamviews.lower_backend_priority is missing (extension older than 1.8?) or not granted",
                error=str(e).strip().splitlines()[0],
            )

    def connect(self, conninfo: str, **kwargs: Any) -> psycopg.Connection:
        """`psycopg.connect(conninfo, **kwargs)`, its backend niced."""
        conn = psycopg.connect(conninfo, **kwargs)
        try:
            self.lower(conn)
        except BaseException:
            conn.close()
            raise
        return conn


class NicedOffsets(PostgresOffsets):
    """The catch-up's checkpoint connections (they apply its batches), niced as they are made, reconnects too."""

    def __init__(self, conninfo: str, group_id: str, priority: BackendPriority) -> None:
        super().__init__(conninfo, group_id)
        self.priority = priority

    def connect(self) -> psycopg.Connection:
        """A new connection of the pipeline's role, its backend niced."""
        return self.priority.connect(self.conninfo)
