"""The fence's specification (tests/fence_spec.py) against PostgreSQL: `PostgresOffsets` on `ops.kafka_offsets`.

The same rules as the in-memory double's (tests/unit/test_fence.py), here with real row locks; and one
race only a real database can run: a second claimant blocked on the first one's lock, fenced once
it commits. Each test has its own consumer group and table; they are deleted afterwards.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pipelines.runtime.checkpoint import ApplyOutcome, Checkpoint, Fenced
from pipelines.runtime.offsets import PostgresOffsets
from pipelines.settings import PostgresSettings
from tests.fence_spec import P0, SPECIFICATION, Rows, World, batch
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


def test_a_claimant_blocked_on_the_lock_is_fenced_when_the_first_commits(world: PostgresWorld) -> None:
    """The race itself: `second` claims while `first` holds the row; it waits, then finds it taken."""
    second = world.checkpoint("second")
    second_pid = second.conn.info.backend_pid  # connected here, before its thread uses it
    outcome: list[BaseException | int] = []
    racer = threading.Thread(target=lambda: outcome.append(attempt(second)))

    def claim_while_first_holds_the_row() -> None:
        racer.start()
        # No sleep: PostgreSQL says when the second transaction waits for the first one's lock.
        blocked = "SELECT cardinality(pg_blocking_pids(%s)) > 0"
        while racer.is_alive() and not world.owner.execute(blocked, (second_pid,)).fetchone()[0]:
            pass
        assert racer.is_alive(), f"the second claimant did not wait for the first: {outcome}"

    first = world.checkpoint("first", during=claim_while_first_holds_the_row)
    assert first.commit(batch({P0: None}, {P0: ["a", "b"]})) == 2
    racer.join()

    [result] = outcome
    assert isinstance(result, Fenced), result
    assert world.written() == [("first", 0, "a"), ("first", 0, "b")]
    assert world.stored() == {P0: 2}


def attempt(checkpoint: Checkpoint[Any, Rows]) -> BaseException | int:
    """Commit a batch claiming partition 0 from its start; what it returned or raised."""
    try:
        return checkpoint.commit(batch({P0: None}, {P0: ["x"]}))
    except BaseException as e:
        return e
