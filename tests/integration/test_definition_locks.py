"""A definition never makes ingestion wait on a reader, and never waits long itself.

A reader that holds a view open (a transaction that read it and has not ended) blocks changes to
that view: CREATE OR REPLACE and DROP must wait for it, or fail. What they must not do is hold the
stream's lock while they wait, which would stop every batch of the stream until the reader ends.
Here a runner-like writer applies batches in a loop the whole time (StreamMaintainer.apply, the
runner's own call); each batch's duration is measured, and none may exceed the lock timeout by more
than a batch's own time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from pipelines.cv import catalog
from pipelines.cv.catalog import DefinitionBlocked
from tests.integration.conftest import apply_rows, throwaway_views, unique, wait_for

LOCK_TIMEOUT_S = catalog.LOCK_TIMEOUT_MS / 1000
# Tries of a blocked definition here (PIPELINE_DEFINITION_ATTEMPTS): two show the retry and the
# pause between, in 2.25 s instead of the default five's 9 s.
ATTEMPTS = 2
# What a batch of one row takes on a busy 2-core test machine, beyond any wait for a lock.
BATCH_SLACK_S = 0.5
VIEW = "SELECT g, count(*) AS n, sum(x) AS total FROM {stream} GROUP BY g"
# avg(x) is kept as count(x) and sum(x), which the view stores already: only the read view changes.
REPLACED = "SELECT g, count(*) AS n, sum(x) AS total, avg(x) AS mean FROM {stream} GROUP BY g"


@pytest.fixture(autouse=True)
def _attempts(monkeypatch):
    monkeypatch.setenv("PIPELINE_DEFINITION_ATTEMPTS", str(ATTEMPTS))


@pytest.fixture
def view(stack, pg):
    """A keyed stream (its own consumer group: no runner reads it) and one view over it."""
    schema = unique("locks")
    stream = f"{schema}_s"
    definitions = f"""
        CREATE STREAM {stream} (g bigint, k bigint, x bigint)
            WITH (topic = '{stream}', key = 'g, k', consumer_group = '{schema}');
        CREATE CONTINUOUS VIEW {schema}.v AS {VIEW.format(stream=stream)};
    """
    with throwaway_views(pg, schema, [stream], definitions):
        yield {"schema": schema, "stream": stream, "name": f"{schema}.v"}


@contextmanager
def writing(pg, stream: str) -> Iterator[list[float]]:
    """A runner-like writer applying one-row batches back to back; yields the durations of its batches."""
    durations: list[float] = []
    failures: list[BaseException] = []
    stop = threading.Event()

    def run() -> None:
        with pg("sv_writer", autocommit=True) as conn:
            k = 0
            while not stop.is_set():
                k += 1
                started = time.monotonic()
                try:
                    apply_rows(conn, stream, [1], [(1, k, k)])
                except BaseException as e:  # reported by the test, not lost in the thread
                    failures.append(e)
                    return
                durations.append(time.monotonic() - started)

    thread = threading.Thread(target=run, name="writer", daemon=True)
    thread.start()
    try:
        yield durations
    finally:
        stop.set()
        thread.join(30)
    assert not failures, failures
    assert not thread.is_alive()


@contextmanager
def reader_holding(pg, view: str) -> Iterator[int]:
    """A reader's transaction that read `view` and stays open; yields its backend pid.

    The reader connects as the owner: the reader watchdog (ops.stop_overrunning_reads), which other
    tests call with bounds of a second, ends sv_reader sessions idle in a transaction, as this one is.
    """
    with pg("sv_owner") as conn:  # not autocommit: the SELECT opens a transaction that stays open
        conn.execute(f"SELECT * FROM {view}").fetchall()
        yield conn.info.backend_pid
        conn.rollback()


def test_a_reader_holding_a_view_open_delays_its_replace_and_drop_but_never_the_streams_batches(pg, view):
    name, stream = view["name"], view["stream"]
    replace = f"CREATE OR REPLACE CONTINUOUS VIEW {name} AS {REPLACED.format(stream=stream)}"
    with writing(pg, stream) as durations, pg("sv_owner", autocommit=True) as owner:
        with reader_holding(pg, name) as reader:
            before = len(durations)
            started = time.monotonic()
            with pytest.raises(DefinitionBlocked) as blocked:
                catalog.define(owner, replace)
            tried_for = time.monotonic() - started
            message = str(blocked.value)
            assert message.startswith(f"continuous view {name}: a reader holds {name} open (pid {reader}, sv_owner")
            assert message.endswith(f"(tried {ATTEMPTS} times); retry later")
            assert "\n" not in message
            with pytest.raises(DefinitionBlocked, match=f"a reader holds {name} open \\(pid {reader}"):
                catalog.define(owner, f"DROP CONTINUOUS VIEW {name}")
            # ALTER keeps the read view and the storage's shape: the reader does not hold it up.
            assert catalog.define(owner, f"ALTER CONTINUOUS VIEW {name} RESET (ttl)") == [
                f"view {name} altered: no ttl"
            ]
            during = durations[before:]
        # The reader ended: the same statement goes through.
        assert catalog.define(owner, replace) == [
            f"view {name} replaced; its storage is unchanged (only what is computed from it changed)"
        ]
        after = len(durations)
        wait_for(lambda: len(durations) >= after + 3, interval=0.01, what="the writer over the replaced view")
    # Each attempt waited the lock timeout for the reader, then paused: the writer went on throughout.
    assert tried_for >= ATTEMPTS * LOCK_TIMEOUT_S
    assert len(during) > 10
    assert max(during) < LOCK_TIMEOUT_S, f"a batch waited {max(during):.3f} s while the view was replaced"
    with pg("sv_reader") as conn:
        n, total, mean = conn.execute(f"SELECT n, total, mean FROM {name} WHERE g = 1").fetchone()
    assert n == len(durations)
    assert total == n * (n + 1) // 2
    assert mean == pytest.approx((n + 1) / 2)


def test_a_stream_lock_held_past_the_timeout_fails_the_definition_and_holds_up_batches_at_most_that_long(pg, view):
    """A batch that does not end (a stuck runner) holds its stream's lock.

    A definition waits at most the lock timeout for it, each attempt, and meanwhile other batches of
    the stream queue behind the definition: for that long at most.
    """
    name, stream = view["name"], view["stream"]
    replace = f"CREATE OR REPLACE CONTINUOUS VIEW {name} AS {REPLACED.format(stream=stream)}"
    with pg("sv_writer") as stuck, pg("sv_owner", autocommit=True) as owner:
        stuck.execute("SELECT 1")  # a transaction is open: the batch below is a savepoint in it, never committed
        stuck_pid = stuck.info.backend_pid
        apply_rows(stuck, stream, [1], [(2, 1, 1)])
        with writing(pg, stream) as durations:
            with pytest.raises(DefinitionBlocked) as blocked:
                catalog.define(owner, replace)
            count = len(durations)
        stuck.rollback()
    message = str(blocked.value)
    assert message.startswith(f"continuous view {name}: the pipelines of stream {stream} hold it (")
    assert f"pid {stuck_pid}, sv_writer" in message
    assert count > 10
    assert max(durations) < LOCK_TIMEOUT_S + BATCH_SLACK_S, f"a batch waited {max(durations):.3f} s"
