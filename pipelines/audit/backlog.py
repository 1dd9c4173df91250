"""How far the ctid puller is behind on an audit log, read from the ledger (for `make status`).

A running puller reports the same figures in its log; this reads them without it: rows the writer
has committed that no checkpoint covers yet, and how long ago the puller last moved a checkpoint.
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


def backlog(conn: psycopg.Connection, log_schema: str) -> Backlog:
    """The backlog of one audit log (a role that reads audit.tables and the checkpoints: the indexer)."""
    tables, behind, last = conn.execute(
        "SELECT count(*), coalesce(sum(greatest(t.rows - coalesce(c.rows_indexed, 0), 0)), 0), max(c.updated_at)"
        " FROM audit.tables t LEFT JOIN audit.pull_checkpoints c USING (table_name) WHERE t.log_schema = %s",
        (log_schema,),
    ).fetchone()
    return Backlog(tables, int(behind), last)
