"""How far the ctid puller is behind on an audit log, read from the ledger (for `make status`).

A running puller reports the same figures in its log and its metrics; this reads them without it:
rows the writer has committed that no checkpoint covers yet, how long ago the puller last moved a
checkpoint, and up to when every write is in Elasticsearch. That last one is the puller's freshness:
a table's checkpoint records the writer's commit time it caught up with (`synced_commit_at`), so every
write committed before the oldest such time among the tables still pending is indexed (to within a
pass: the checkpoint takes the ledger's commit time as it is when the checkpoint is stored).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import psycopg


@dataclass(frozen=True)
class Backlog:
    """An audit log's indexing backlog."""

    tables: int
    rows_behind: int
    last_checkpoint: datetime | None  # None: nothing indexed yet
    # Seconds since the newest moment up to which every committed write is indexed; None: caught up.
    indexed_up_to_s: float | None = None


def backlog(conn: psycopg.Connection, log_schema: str) -> Backlog:
    """The backlog of one audit log (a role that reads audit.tables and the checkpoints: the indexer)."""
    tables, behind, last, up_to = conn.execute(
        "SELECT count(*), coalesce(sum(greatest(t.rows - coalesce(c.rows_indexed, 0), 0)), 0), max(c.updated_at),"
        "       extract(epoch FROM now() - min(coalesce(c.synced_commit_at, t.created_at))"
        "           FILTER (WHERE coalesce(c.seq, 0) < t.seq))::float8"
        " FROM audit.tables t LEFT JOIN audit.pull_checkpoints c USING (table_name) WHERE t.log_schema = %s",
        (log_schema,),
    ).fetchone()
    return Backlog(tables, int(behind), last, None if up_to is None else max(up_to, 0.0))
