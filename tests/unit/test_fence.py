"""The fence's specification (tests/fence_spec.py) against the in-memory offsets store.

tests/integration/test_fence_postgresql.py runs the same specification against PostgreSQL: the double used by
the pipeline's unit tests fences as the real `ops.kafka_offsets` does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from pipelines.runtime.checkpoint import ApplyOutcome, Checkpoint
from pipelines.runtime.testing import MemoryConnection, MemoryDatabase, MemoryOffsets, MemorySink
from tests.fence_spec import SPECIFICATION, Rows, World


@dataclass
class HookedSink(MemorySink):
    """A MemorySink calling `during` first in its apply (inside the transaction, the rows claimed)."""

    during: Callable[[], None] | None = None

    def apply(self, conn: MemoryConnection, payload: Rows, outcome: ApplyOutcome) -> int:
        if self.during is not None:
            self.during()
        return super().apply(conn, payload, outcome)


class MemoryWorld:
    """Checkpoints of one consumer group over a `MemoryDatabase`; every generation's sink writes one table."""

    def __init__(self) -> None:
        self.db = MemoryDatabase()
        self.offsets = MemoryOffsets(self.db, "fence-group")

    def checkpoint(self, generation: str, during: Callable[[], None] | None = None) -> Checkpoint[Any, Rows]:
        return Checkpoint(
            MemoryOffsets(self.db, "fence-group"), HookedSink(table="written", label=generation, during=during)
        )

    def waiting(self, checkpoint: Checkpoint[Any, Rows]) -> Callable[[], bool]:
        conn = checkpoint.conn  # connected here, before another thread uses it
        return lambda: conn.waiting

    def written(self) -> list[tuple[str, int, Any]]:
        return MemorySink(table="written").rows(self.db)

    def stored(self) -> dict[tuple[str, int], int]:
        return self.offsets.stored()


@pytest.mark.parametrize("rule", SPECIFICATION, ids=lambda rule: rule.__name__)
def test_the_in_memory_fence_follows_the_specification(rule: Callable[[World], None]) -> None:
    rule(MemoryWorld())
