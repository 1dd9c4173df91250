"""The fence's specification (tests/fence_spec.py) against PostgreSQL: `PostgresOffsets` on `ops.kafka_offsets`.

The same rules as the in-memory double's (tests/unit/test_fence.py), here with real row locks (the
race of two transactions at once included). Each test has its own consumer group and table; they
are deleted afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pipelines.runtime.checkpoint import ApplyOutcome, Checkpoint
from pipelines.runtime.offsets import PostgresOffsets
from pipelines.settings import PostgresSettings
from tests.fence_spec import SPECIFICATION, Rows, World
from tests.integration.conftest import unique


class RowsSink:
    """Inserts (generation, partition, record) into the test's table, in the checkpoint's transaction."""

    def __init__(self, table: str, generation: str, during: Callable[[], None] | None = None) -> None:
        self.table, self.generation, self.during = table, generation, during

    def apply(self, conn: psycopg.Connection, payload: Rows, outcome: ApplyOutcome) -> int:
        if self.during is not None:  # inside the transaction, the partition's row locked
            self.during()
        with conn.cursor() as cursor:
            cursor.executemany(
                sql.SQL("INSERT INTO {} (generation, partition, record) VALUES (%s, %s, %s)").format(
                    sql.Identifier(self.table)
                ),
                [(self.generation, partition, record) for partition, record in payload],
            )
        return len(payload)

    def reset(self) -> None:
        pass

    def housekeeping(self, conn: psycopg.Connection) -> None:
        pass


class PostgresWorld:
    def __init__(self, conninfo: str, owner: psycopg.Connection, group: str, table: str) -> None:
        self.conninfo, self.owner, self.group, self.table = conninfo, owner, group, table
        self.checkpoints: list[Checkpoint[Any, Rows]] = []

    def checkpoint(self, generation: str, during: Callable[[], None] | None = None) -> Checkpoint[Any, Rows]:
        checkpoint = Checkpoint(PostgresOffsets(self.conninfo, self.group), RowsSink(self.table, generation, during))
        self.checkpoints.append(checkpoint)
        return checkpoint

    def waiting(self, checkpoint: Checkpoint[Any, Rows]) -> Callable[[], bool]:
        pid = checkpoint.conn.info.backend_pid  # connected here, before another thread uses it
        blocked = "SELECT cardinality(pg_blocking_pids(%s)) > 0"
        return lambda: self.owner.execute(blocked, (pid,)).fetchone()[0]

    def written(self) -> list[tuple[str, int, Any]]:
        query = sql.SQL("SELECT generation, partition, record FROM {} ORDER BY id").format(sql.Identifier(self.table))
        return [tuple(row) for row in self.owner.execute(query).fetchall()]

    def stored(self) -> dict[tuple[str, int], int]:
        rows = self.owner.execute(
            "SELECT topic, partition, next_offset FROM ops.kafka_offsets WHERE group_id = %s", (self.group,)
        ).fetchall()
        return {(topic, partition): offset for topic, partition, offset in rows}


@pytest.fixture
def world(stack, secrets_dir, pg) -> Iterator[PostgresWorld]:
    """A consumer group and a table of its own; the checkpoints connect as the pipelines' role, sv_writer."""
    settings = PostgresSettings(host="127.0.0.1", port=stack.pgport, secrets_dir=secrets_dir)
    group, table = unique("fence-group"), unique("fence_written")
    with pg(autocommit=True) as owner:
        owner.execute(
            sql.SQL(
                "CREATE TABLE public.{} (id bigserial PRIMARY KEY, generation text, partition int, record text)"
            ).format(sql.Identifier(table))
        )
        owner.execute(sql.SQL("GRANT INSERT, SELECT ON public.{} TO sv_writer").format(sql.Identifier(table)))
        owner.execute(sql.SQL("GRANT USAGE ON public.{} TO sv_writer").format(sql.Identifier(f"{table}_id_seq")))
        world = PostgresWorld(settings.conninfo(user="sv_writer"), owner, group, table)
        try:
            yield world
        finally:
            for checkpoint in world.checkpoints:
                checkpoint.close()
            owner.execute("DELETE FROM ops.kafka_offsets WHERE group_id = %s", (group,))
            owner.execute(sql.SQL("DROP TABLE public.{}").format(sql.Identifier(table)))


@pytest.mark.parametrize("rule", SPECIFICATION, ids=lambda rule: rule.__name__)
def test_the_postgresql_fence_follows_the_specification(world: World, rule: Callable[[World], None]) -> None:
    rule(world)
