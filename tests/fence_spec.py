"""The fence, specified once: two runner generations race for a partition; the loser is Fenced and writes nothing.

During a rebalance the partition's old owner may still hold a batch it read before it lost the
partition, while the new owner reads from the stored offset too. Both batches start where the
stored offset stood when each was read; whichever commits second finds the offset moved (or, for
a partition never committed, claimed) and must write nothing at all.

Every function here takes a `World` and states one rule with plain sequential calls (no sleeps:
the order of the commits is the race's outcome); the last runs the race itself, two transactions
at once, and waits for what the database says, never for time. The same functions run against the
in-memory double (tests/unit/test_fence.py) and PostgreSQL (tests/integration/test_fence_postgresql.py),
so the double cannot drift from the real fence.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

import pytest

from pipelines.runtime.checkpoint import Batch, Checkpoint, Fenced

TOPIC = "fenced-topic"
P0, P1 = (TOPIC, 0), (TOPIC, 1)
Rows = list[tuple[int, Any]]


class World(Protocol):
    """Where the race runs: an offsets store and a sink recording which generation wrote what."""

    def checkpoint(self, generation: str, during: Callable[[], None] | None = None) -> Checkpoint[Any, Rows]:
        """A runner generation's checkpoint (its own connection), in the test's consumer group.

        `during` is called in its sink's apply: inside the transaction, the batch's rows locked.
        """
        ...

    def waiting(self, checkpoint: Checkpoint[Any, Rows]) -> Callable[[], bool]:
        """Asks the database whether the checkpoint's transaction waits for another's lock."""
        ...

    def written(self) -> list[tuple[str, int, Any]]:
        """What committed: (generation, partition, record), in commit order."""
        ...

    def stored(self) -> dict[tuple[str, int], int]:
        """The group's stored offsets."""
        ...


def batch(start: dict[tuple[str, int], int | None], records: dict[tuple[str, int], list[str]]) -> Batch[Rows]:
    """A batch read from `start` (None: never committed), of these records per partition."""
    payload = [(tp[1], record) for tp in sorted(records) for record in records[tp]]
    first = {tp: start[tp] or 0 for tp in start}
    end = {tp: first[tp] + len(records.get(tp, [])) for tp in start}
    return Batch(payload=payload, size=len(payload), start=dict(start), first=first, end=end)


def the_second_claim_of_a_partition_never_committed_is_fenced(world: World) -> None:
    old, new = world.checkpoint("old"), world.checkpoint("new")
    old_batch = batch({P0: None}, {P0: ["a", "b"]})  # read before it lost the partition
    new_batch = batch({P0: None}, {P0: ["a", "b", "c"]})

    assert new.commit(new_batch) == 3
    with pytest.raises(Fenced, match="another consumer"):
        old.commit(old_batch)

    assert world.written() == [("new", 0, "a"), ("new", 0, "b"), ("new", 0, "c")]
    assert world.stored() == {P0: 3}


def a_batch_read_before_the_offset_moved_is_fenced(world: World) -> None:
    old, new = world.checkpoint("old"), world.checkpoint("new")
    old.commit(batch({P0: None}, {P0: ["a", "b"]}))
    stale = batch({P0: 2}, {P0: ["c"]})  # the old owner's next batch, in flight at the rebalance
    new.commit(batch({P0: 2}, {P0: ["c", "d", "e"]}))  # the new owner read from the stored offset, 2

    with pytest.raises(Fenced, match=r"fenced-topic\[0\] is at 5 .* starts at 2"):
        old.commit(stale)

    assert world.written() == [("old", 0, "a"), ("old", 0, "b"), ("new", 0, "c"), ("new", 0, "d"), ("new", 0, "e")]
    assert world.stored() == {P0: 5}


def a_fenced_batch_writes_none_of_its_partitions(world: World) -> None:
    old, new = world.checkpoint("old"), world.checkpoint("new")
    old.commit(batch({P0: None, P1: None}, {P0: ["a"], P1: ["x"]}))
    new.commit(batch({P1: 1}, {P1: ["y"]}))  # the rebalance gave partition 1 to the new owner
    spanning = batch({P0: 1, P1: 1}, {P0: ["b"], P1: ["y"]})  # still right about 0, not about 1

    with pytest.raises(Fenced):
        old.commit(spanning)

    assert ("old", 0, "b") not in world.written()
    assert world.stored() == {P0: 1, P1: 2}


def the_same_batch_commits_once(world: World) -> None:
    runner = world.checkpoint("runner")
    once = batch({P0: None}, {P0: ["a", "b"]})
    runner.commit(once)

    with pytest.raises(Fenced):
        runner.commit(batch({P0: None}, {P0: ["a", "b"]}))  # committed, but the runner did not hear so
    with pytest.raises(Fenced):
        runner.commit(batch({P0: 0}, {P0: ["a", "b"]}))

    assert world.written() == [("runner", 0, "a"), ("runner", 0, "b")]
    assert world.stored() == {P0: 2}


def the_fenced_generation_resumes_from_the_stored_offsets(world: World) -> None:
    old, new = world.checkpoint("old"), world.checkpoint("new")
    new.commit(batch({P0: None}, {P0: ["a", "b"]}))
    with pytest.raises(Fenced):
        old.commit(batch({P0: None}, {P0: ["a"]}))

    resumed_at = old.stored_offsets([P0])  # what the pipeline re-seeks to after a fence
    old.commit(batch({P0: resumed_at[P0]}, {P0: ["c"]}))

    assert resumed_at == {P0: 2}
    assert world.written() == [("new", 0, "a"), ("new", 0, "b"), ("old", 0, "c")]
    assert world.stored() == {P0: 3}


def a_claimant_waiting_for_the_lock_is_fenced_once_the_first_commits(world: World) -> None:
    """The race itself: `second` claims the partition while `first` holds its row, waits, then finds it taken.

    No sleep: the database says when the second transaction waits for the first one's lock.
    """
    second = world.checkpoint("second")
    second_waits = world.waiting(second)
    outcome: list[BaseException | int] = []
    racer = threading.Thread(target=lambda: outcome.append(attempt(second, batch({P0: None}, {P0: ["x"]}))))

    def let_second_claim_and_wait() -> None:
        racer.start()
        while racer.is_alive() and not second_waits():
            pass
        assert racer.is_alive(), f"the second claimant did not wait for the first: {outcome}"

    first = world.checkpoint("first", during=let_second_claim_and_wait)
    assert first.commit(batch({P0: None}, {P0: ["a", "b"]})) == 2
    racer.join()

    [result] = outcome
    assert isinstance(result, Fenced), result
    assert world.written() == [("first", 0, "a"), ("first", 0, "b")]
    assert world.stored() == {P0: 2}


def attempt(checkpoint: Checkpoint[Any, Rows], attempted: Batch[Rows]) -> BaseException | int:
    """What committing the batch returned or raised."""
    try:
        return checkpoint.commit(attempted)
    except BaseException as e:
        return e


def the_first_start_stored_wins_and_a_batch_from_another_is_fenced(world: World) -> None:
    # Two generations resolve a start rule ('latest', pipelines/runtime/starts.py) at different moments.
    old, new = world.checkpoint("old"), world.checkpoint("new")

    assert old.begin({P0: 5}) == {P0: 5}
    assert new.begin({P0: 7}) == {P0: 5}  # the stored start wins: the second resolution is not kept

    assert new.commit(batch({P0: 5}, {P0: ["f"]})) == 1
    with pytest.raises(Fenced, match="is at 6 in PostgreSQL, this batch starts at 7"):
        old.commit(batch({P0: 7}, {P0: ["h"]}))
    assert world.stored() == {P0: 6}


def a_batch_of_a_forgotten_topic_is_fenced(world: World) -> None:
    # The topic was recreated and has a start rule: its rows are forgotten, to be resolved again.
    old, new = world.checkpoint("old"), world.checkpoint("new")
    assert old.commit(batch({P0: None, P1: None}, {P0: ["a"], P1: ["b"]})) == 2

    assert new.forget_topic(TOPIC) == 2
    with pytest.raises(Fenced, match="is at None in PostgreSQL, this batch starts at 1"):
        old.commit(batch({P0: 1}, {P0: ["c"]}))  # read from the old topic before it was recreated
    assert world.stored() == {}


SPECIFICATION: list[Callable[[World], None]] = [
    the_second_claim_of_a_partition_never_committed_is_fenced,
    a_batch_read_before_the_offset_moved_is_fenced,
    a_fenced_batch_writes_none_of_its_partitions,
    the_same_batch_commits_once,
    the_fenced_generation_resumes_from_the_stored_offsets,
    a_claimant_waiting_for_the_lock_is_fenced_once_the_first_commits,
    the_first_start_stored_wins_and_a_batch_from_another_is_fenced,
    a_batch_of_a_forgotten_topic_is_fenced,
]
