"""Which streams a runner consumes, and its backfill child's lifetime (pipelines.cv.stream_choice, backfill_process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.cv.backfill_process import BackfillProcess, lower_session_group
from pipelines.cv.model import StreamDef
from pipelines.cv.stream_choice import StreamChoice


def stream(name: str, *, group: str | None = None, into: str | None = None, feed_of: str | None = None) -> StreamDef:
    return StreamDef(name, name, (), None, "", consumer_group=group, into=into, feed_of=feed_of)


@pytest.mark.parametrize(
    ("choice", "declared", "paused", "runs"),
    [
        (StreamChoice("g"), stream("s"), frozenset(), True),  # the default group runs undeclared streams
        (StreamChoice("g", default_group=False), stream("s"), frozenset(), False),  # another group does not
        (StreamChoice("g", default_group=False), stream("s", group="g"), frozenset(), True),
        (StreamChoice("g"), stream("s", group="h"), frozenset(), False),  # declared for another group
        (StreamChoice("g"), stream("s"), frozenset({"s"}), False),  # deactivated
        (StreamChoice("g"), stream("f", into="s"), frozenset({"s"}), False),  # it feeds a deactivated stream
        (StreamChoice("g"), stream("v", feed_of="public.v"), frozenset(), False),  # a view read as a stream
        (StreamChoice("g", only=frozenset({"s"})), stream("t"), frozenset(), False),
        (StreamChoice("g", only=frozenset({"s"})), stream("f", into="s"), frozenset(), True),  # feeds one of only
    ],
)
def test_a_runner_consumes_its_groups_streams_not_paused_nor_fed_from_views(choice, declared, paused, runs):
    assert choice.runs(declared, paused) is runs


def test_the_backfill_child_runs_only_while_wanted_and_is_started_again_when_it_died():
    process = BackfillProcess(StreamChoice("g"))
    process.argv = [sys.executable, "-c", "import time; time.sleep(60)"]  # a stand-in child
    try:
        process.keep(False)
        assert process.process is None  # nothing waits: no second interpreter
        process.keep(True)
        first = process.process
        assert first is not None
        assert first.poll() is None
        process.keep(True)
        assert process.process is first  # still running: not started twice
        first.kill()
        first.wait(10)
        process.keep(True)
        assert process.process is not first
        assert process.process.poll() is None
        second = process.process
        process.keep(False)
        assert second.wait(10) is not None  # no backfill waits any more: SIGTERM
    finally:
        process.stop()
    assert process.process is None


def test_the_backfill_child_is_niced_from_its_first_instruction():
    """Its interpreter's start-up (about 0.5 s of CPU) must not compete with the live loop as an equal."""
    process = BackfillProcess(StreamChoice("g"), nice=7)
    python = process.argv.index(sys.executable)
    # The same launcher, asked for the niceness its interpreter starts with (a stand-in child).
    probe = [*process.argv[:python], sys.executable, "-c", "import os; print(os.getpriority(os.PRIO_PROCESS, 0))"]
    started_at = int(subprocess.run(probe, capture_output=True, text=True, check=True).stdout)
    assert started_at >= min(19, os.getpriority(os.PRIO_PROCESS, 0) + 7)
    assert BackfillProcess(StreamChoice("g")).argv[0] == sys.executable  # nice 0: started as it is


def test_the_backfill_child_leads_a_session_whose_cpu_group_can_be_niced_and_never_back():
    """With autogroups a nice value weighs only within its session: the child's own group must give way too.

    The runner tries once as it starts the child, and the child again in its main(): the kernel takes
    one change of a group's nice value per 100 ms, machine-wide.
    """
    process = BackfillProcess(StreamChoice("g"), nice=7)
    process.argv = [sys.executable, "-c", "import time; time.sleep(60)"]  # a stand-in child
    try:
        process.keep(True)
        assert process.process is not None
        pid = process.process.pid
        assert os.getsid(pid) == pid  # its own session: not the runner's group
        group = Path(f"/proc/{pid}/autogroup")
        assert lower_session_group(pid, 7, attempts=10)
        if group.exists():  # a kernel with autogroups
            assert group.read_text().split()[-1] == "7"
            assert lower_session_group(pid, 3, attempts=10)
            assert group.read_text().split()[-1] == "7"  # raised only
    finally:
        process.stop()


def test_a_backfill_child_not_niced_stays_in_the_runners_session():
    process = BackfillProcess(StreamChoice("g"), nice=0)
    process.argv = [sys.executable, "-c", "import time; time.sleep(60)"]  # a stand-in child
    try:
        process.keep(True)
        assert process.process is not None
        assert os.getsid(process.process.pid) == os.getsid(0)
    finally:
        process.stop()
