"""Where one batch's time goes inside PostgreSQL: each maintenance statement under EXPLAIN (ANALYZE, BUFFERS).

`probe_batch` applies one batch of like events to a stream through the engine itself
(`StreamMaintainer.apply`, the statements the runner sends), in a transaction that is rolled back,
with every statement that writes (the deltas statement, each view's upsert) run as `EXPLAIN
(ANALYZE, BUFFERS)` instead. Each statement then reports its execution time, its plan and the pages
it touched in and outside shared buffers. Run on empty tables and again at full size, it shows which
statement grows with the state and why (a plan that turned into a scan, pages read from disk, an
index that no longer fits in memory). The rollback leaves only dead rows behind, which vacuum
reclaims.

A statement whose result the engine reads (a view's upsert returning emptied groups) returns none
here, so the groups a batch would empty are not deleted: only unlikes empty a group, and the
probe's timings leave that delete out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import sql

from loadgen.workload import Like
from pipelines.cv.engine import StreamMaintainer

_WRITES = re.compile(r'(?:INSERT INTO|UPDATE|DELETE FROM)\s+"cv"\."([^"]+)"')
_EXECUTION = re.compile(r"^Execution Time: ([0-9.]+) ms", re.MULTILINE)
_BUFFERS = re.compile(r"^\s*Buffers: (.*)$", re.MULTILINE)


@dataclass(frozen=True)
class StatementProfile:
    """One maintenance statement of the batch: what it writes, its time, its pages, its plan."""

    writes: str  # the cv tables it writes
    ms: float
    buffers: str  # the plan's first Buffers line: the whole statement's pages
    plan: str

    def as_dict(self, events: int) -> dict[str, Any]:
        """For the JSON report: µs per event of the batch, and the plan."""
        return {
            "writes": self.writes,
            "ms": round(self.ms, 1),
            "us_per_event": round(1000 * self.ms / events, 2),
            "buffers": self.buffers,
            "plan": self.plan,
        }


class _ExplainingConnection:
    """Stands in for the connection the engine applies a batch with: writing statements are explained."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self._conn = conn
        self.info = conn.info
        self.profiles: list[StatementProfile] = []

    def execute(self, statement: Any, params: Any = None) -> Any:
        text = statement.as_string(self._conn) if isinstance(statement, sql.Composable) else str(statement)
        if not text.lstrip().upper().startswith(("WITH", "INSERT", "UPDATE", "DELETE")):
            return self._conn.execute(statement, params)
        explain = sql.SQL("EXPLAIN (ANALYZE, BUFFERS) ") + (
            statement if isinstance(statement, sql.Composable) else sql.SQL(statement)
        )
        plan = "\n".join(row[0] for row in self._conn.execute(explain, params).fetchall())
        execution = _EXECUTION.search(plan)
        buffers = _BUFFERS.search(plan)
        self.profiles.append(
            StatementProfile(
                ",".join(dict.fromkeys(_WRITES.findall(text))) or "?",
                float(execution.group(1)) if execution else 0.0,
                buffers.group(1) if buffers else "",
                plan,
            )
        )
        return _Explained()


class _Explained:
    """What the engine reads from an explained statement: some rows changed, no groups to delete."""

    rowcount = 1

    @staticmethod
    def fetchone() -> tuple[None, None]:
        return None, None


def probe_batch(conninfo: str, stream: str, events: Sequence[Like], rounds: int = 2) -> list[StatementProfile]:
    """Apply `events` to `stream` with each writing statement explained, then roll back; the statements' profiles.

    The batch is applied `rounds` times on one session, each time rolled back, and the last round is
    reported: the first pays for what a running pipeline has already paid once (its plans, the
    catalog caches of a new session). The temporary tables are created and committed first, as a
    running pipeline's are.
    """
    ops = [1 if e.action == "like" else -1 for e in events]
    columns = [
        [e.oid for e in events],
        [e.uid for e in events],
        [datetime.fromtimestamp(e.ts / 1000, UTC) for e in events],
    ]
    maintainer = StreamMaintainer(stream)
    with psycopg.connect(conninfo, application_name="streamviews-bench-probe") as conn:
        maintainer.apply(conn, [], [[] for _ in columns])  # the session's temporary tables, kept past rollbacks
        conn.commit()
        for _ in range(rounds):
            explaining = _ExplainingConnection(conn)
            try:
                maintainer.apply(explaining, ops, columns)  # type: ignore[arg-type]
            finally:
                conn.rollback()
    return explaining.profiles
