"""The backfill's catch-up in a child process of the runner, at a lower CPU priority than the live loop.

A backfill decodes history in Python as fast as it can. As a thread of the runner it shared the
interpreter's lock with the live loop: whatever the backfill decoded, the live batches waited for,
and a new view's backfill raised the live views' freshness from about 1.6 s to 5-14 s on the
backfill benchmark (`python -m loadgen.backfill`). In a process of its own, niced by
`PIPELINE_BACKFILL_NICE` (default 10: about a tenth of the CPU's share when both want it), the
live loop has its own interpreter and the kernel gives it the CPU first; an idle machine still
gives the backfill all it wants. The SQL of its batches is its PostgreSQL backends' work: each of
its sessions (named `<PGAPPNAME>-backfill`) nices its own backend to the same value
(pipelines/cv/backfill_priority.py), or the backend would compete with the live runner's as an equal.

Where the kernel groups processes by session for CPU fairness (autogroups: on in Debian's kernels
and most others), a nice value weighs only within its own session, and the sessions' groups share
the CPU as equals: a niced child in the runner's session took the group's whole share whenever the
runner waited on its database, as much as the backend applying the live batch (measured: a
process niced to 19 in a session of its own took 89% of a core beside two of nice 0 in another).
So the child is started as a session of its own, and its group is niced too (`lower_session_group`).

The child is the runner's: started while a backfill of the runner's streams waits (`python -m
pipelines.cv.backfill_process`, with the runner's environment and stream choice: no Kafka client
or connection is inherited), stopped with SIGTERM once none does or the runner stops, sent SIGTERM
by the kernel when the runner dies, kill -9 included (PR_SET_PDEATHSIG: SIGKILL, since a batch in
flight of a niced child on a loaded machine held a graceful stop past a minute), and started again
by the runner if it died. Exactly once is the catch-up's own (pipelines/cv/backfill.py): its positions
commit with its updates, so a child killed anywhere resumes from them in the next one.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import psycopg

from pipelines.cv.backfill import Backfiller
from pipelines.cv.backfill_priority import BackendPriority
from pipelines.cv.plans import declared_streams
from pipelines.cv.stream_choice import StreamChoice
from pipelines.logs import configure_logging, get_logger
from pipelines.runtime.interpreter import tune_for_batches
from pipelines.settings import KafkaSettings, PipelineSettings, PostgresSettings

log = get_logger("cv.backfill")

_PR_SET_PDEATHSIG = 1  # linux/prctl.h
STOP_TIMEOUT_S = 10.0
AUTOGROUP_WAIT_S = 0.11  # the kernel's interval between two changes of a session group's nice value


def lower_session_group(pid: int | str, nice: int, attempts: int = 1) -> bool:
    """The CPU group of the session `pid` leads niced to `nice` when lower (Linux autogroups); False if not done.

    `pid` must lead its session, the group then being its session's alone. Raising a group's nice
    value needs no privilege, but without CAP_SYS_ADMIN the kernel takes one such change per 100 ms
    machine-wide (EAGAIN): up to `attempts` tries, AUTOGROUP_WAIT_S apart. A kernel without
    autogroups has no such file: nothing to do.
    """
    path = f"/proc/{pid}/autogroup"
    for attempt in range(attempts):
        try:
            with open(path) as group:
                if int(group.read().rsplit("nice", 1)[1]) >= nice:  # "/autogroup-123 nice 0"
                    return True
            with open(path, "w") as group:
                group.write(str(nice))
            return True
        except BlockingIOError:
            if attempt + 1 < attempts:
                time.sleep(AUTOGROUP_WAIT_S)
        except (OSError, ValueError, IndexError) as e:
            log.debug("session's CPU group left as it is", pid=pid, error=str(e))
            return not os.path.exists(path)
    return False


class _CatalogStreams:
    """`Backfiller`'s `runs(name)`: the stream's current definition against the choice, re-read as the catalog moves."""

    def __init__(self, conninfo: str, choice: StreamChoice, poll_s: float, priority: BackendPriority) -> None:
        self.conninfo, self.choice, self.poll_s, self.priority = conninfo, choice, poll_s, priority
        self._running: frozenset[str] = frozenset()
        self._read_at = float("-inf")
        self._conn: psycopg.Connection | None = None  # kept between reads; made again after a failure

    def __call__(self, stream: str) -> bool:
        if time.monotonic() - self._read_at >= self.poll_s:
            self._read()
        return stream in self._running

    def _read(self) -> None:
        if self._conn is None or self._conn.closed:
            self._conn = self.priority.connect(self.conninfo, autocommit=True)
        try:
            streams = declared_streams(self._conn)
            paused = frozenset(name for (name,) in self._conn.execute("SELECT stream FROM cv.paused_streams"))
        except psycopg.Error:
            self._conn.close()  # the Backfiller logs the failure and tries again after its wait
            raise
        self._running = frozenset(s.name for s in streams.values() if self.choice.runs(s, paused))
        self._read_at = time.monotonic()


class BackfillProcess:
    """The runner's handle on its backfill child, started while a backfill of its streams waits.

    The runner says at each look whether one waits (`keep`); the child is started then, and stopped
    once none does, so an idle runner costs no second interpreter (about 50 MB).
    """

    def __init__(self, choice: StreamChoice, nice: int = 0) -> None:
        # Niced from its first instruction by nice(1), which execs the interpreter (same pid): its
        # start-up and imports take about 0.5 s of CPU, which would otherwise compete with the live
        # loop as an equal, just as a backfill begins. main() makes sure of it where nice(1) is missing.
        self.nice = nice
        launcher = shutil.which("nice") if nice > 0 else None
        self.argv = [*([launcher, "-n", str(nice)] if launcher else []), sys.executable, "-m", __name__]
        self.argv += ["--group", choice.group_id]
        if not choice.default_group:
            self.argv.append("--declared-group-only")
        if choice.only is not None:
            self.argv += ["--streams", ",".join(sorted(choice.only))]
        self.process: subprocess.Popen[bytes] | None = None

    def keep(self, wanted: bool) -> None:
        """Start the child when `wanted` and it is not running (again, if it died); SIGTERM it when not."""
        running = self.process is not None and self.process.poll() is None
        if wanted and not running:
            if self.process is not None and self.process.returncode:
                log.warning("backfill process died; starting it again", returncode=self.process.returncode)
            # Niced: a session of its own, its CPU group niced at once (before its imports) if the
            # kernel takes it now, else by the child's main() (module docstring). Not niced (0): in
            # the runner's session, as an equal of its loop.
            niced = self.nice > 0
            self.process = subprocess.Popen(self.argv, start_new_session=niced)  # logs where the runner's go
            if niced:
                lower_session_group(self.process.pid, self.nice)
            log.info("backfill process started", pid=self.process.pid)
        elif not wanted and running:
            assert self.process is not None
            self.process.terminate()  # idle: it exits at once; reaped at the next look or by stop()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after STOP_TIMEOUT_S: a batch in flight commits or rolls back whole."""
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            log.warning("backfill process did not stop; killed", pid=self.process.pid)
            self.process.kill()
            self.process.wait()
        self.process = None


def _watch_parent(parent: int, stop: threading.Event) -> None:
    """Stop when the runner is gone and PR_SET_PDEATHSIG could not say so (not Linux, or it died first)."""
    while not stop.wait(1.0):
        if os.getppid() != parent:
            stop.set()


def main(argv: list[str] | None = None) -> int:
    """`python -m pipelines.cv.backfill_process --group G`: the runner's backfill child (started by the runner)."""
    parser = argparse.ArgumentParser(prog="streamviews backfill", description="A runner's backfill child.")
    parser.add_argument("--group", required=True, help="the runner's consumer group")
    parser.add_argument("--declared-group-only", action="store_true", help="not the default group's runner")
    parser.add_argument("--streams", default="", help="the runner's --streams")
    args = parser.parse_args(argv)
    settings = PipelineSettings()
    # Before any thread (librdkafka's threads inherit it); already so when started by nice(1).
    os.setpriority(os.PRIO_PROCESS, 0, max(os.getpriority(os.PRIO_PROCESS, 0), settings.backfill_nice))
    if settings.backfill_nice and os.getsid(0) == os.getpid():  # its own session (as the runner starts it)
        lower_session_group("self", settings.backfill_nice, attempts=10)
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the runner's SIGTERM or the watchdog stops it
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    configure_logging()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    threading.Thread(target=_watch_parent, args=(parent, stop), name="parent-watch", daemon=True).start()
    only = frozenset(name for name in args.streams.split(",") if name) or None
    choice = StreamChoice(args.group, not args.declared_group_only, only)
    postgres = PostgresSettings()  # its sessions named apart from the runner's (pg_stat_activity, locks)
    conninfo = postgres.conninfo(application_name=f"{postgres.application_name}-backfill")
    log.info("backfill process running", nice=os.nice(0), group_id=args.group)
    priority = BackendPriority(settings.backfill_nice)  # every session of this process, as the process itself
    runs = _CatalogStreams(conninfo, choice, settings.catalog_poll_s, priority)
    tune_for_batches()
    Backfiller(conninfo, KafkaSettings(), settings, runs, priority).run(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
