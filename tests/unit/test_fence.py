"""The fence's specification (tests/fence_spec.py) against the in-memory offsets store.

tests/integration/test_fence.py runs the same specification against PostgreSQL: the double used by
the pipeline's unit tests fences as the real `ops.kafka_offsets` does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from pipelines.runtime.checkpoint import Checkpoint
from pipelines.runtime.testing import MemoryDatabase, MemoryOffsets, MemorySink
from tests.fence_spec import SPECIFICATION, Rows, World


class MemoryWorld:
    """Checkpoints of one consumer group over a `MemoryDatabase`; every generation's sink writes one table."""

    def __init__(self) -> None:
        self.db = MemoryDatabase()
        self.offsets = MemoryOffsets(self.db, "fence-group")

    def checkpoint(self, generation: str) -> Checkpoint[Any, Rows]:
        return Checkpoint(MemoryOffsets(self.db, "fence-group"), MemorySink(table="written", label=generation))

    def written(self) -> list[tuple[str, int, Any]]:
        return MemorySink(table="written").rows(self.db)

    def stored(self) -> dict[tuple[str, int], int]:
        return self.offsets.stored()


@pytest.mark.parametrize("rule", SPECIFICATION, ids=lambda rule: rule.__name__)
def test_the_in_memory_fence_follows_the_specification(rule: Callable[[World], None]) -> None:
    rule(MemoryWorld())
