"""Timing a pipeline's drain of a backlog: topic ends, committed offsets, CPU used along the way.

- `high_watermarks`: where a bench topic ends, i.e. the offsets a drain must reach;
- `time_drain`: polls a count of records done until it reaches the backlog, and returns a `Drain`:
  start-up, drain time and rate, the samples; `wait_drained` counts the group's offsets in
  `ops.kafka_offsets` (the pipeline's own truth), the audit benchmark its ledgers;
- `CpuSample`: CPU seconds of the pipeline, its PostgreSQL backends, this process and the machine,
  read from /proc, so that a phase's cores busy per role can be reported;
- `DrainProgress`: a "drain progress" log line every `PROGRESS_EVERY_S` seconds (a benchmark's
  `--progress`; default 0: none), which `make bench` turns into a live percentage and rate.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg
from confluent_kafka import Consumer, TopicPartition

from loadgen.common.errors import BenchmarkError
from loadgen.common.processes import PipelineWorkers
from loadgen.common.throwaway import unique_name
from pipelines.logs import get_logger
from pipelines.settings import KafkaSettings

log = get_logger("loadgen.common.drain")

OFFSETS_POLL_S = 0.050  # how often the drain is checked in ops.kafka_offsets
DRAIN_TIMEOUT_S = 300.0
PROGRESS_EVERY_S = 0.0  # set from --progress by loadgen.common.cli


def high_watermarks(topic: str, kafka: KafkaSettings) -> dict[int, int]:
    """The end offset of each partition of `topic` that holds records."""
    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "group.id": unique_name("bench-watermarks", "-"),
            "enable.auto.commit": False,
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
    finally:
        consumer.close()
    return {p: end for p, end in ends.items() if end > 0}


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process on this machine (from /proc), None if unreadable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime


def machine_cpu_seconds() -> float | None:
    """Busy CPU seconds of the whole machine, all cores (from /proc/stat; idle and iowait excluded)."""
    try:
        ticks = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    except (OSError, ValueError, IndexError):
        return None
    return (sum(ticks) - ticks[3] - ticks[4]) / _CLOCK_TICKS


def processes_cpu_seconds(pids: int | Sequence[int] | None) -> float | None:
    """CPU seconds of one process or the sum over several (None when there are none or one is unreadable)."""
    if not pids:
        return None
    seconds = [process_cpu_seconds(pid) for pid in ([pids] if isinstance(pids, int) else pids)]
    return None if None in seconds else sum(s for s in seconds if s is not None)


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds used so far by the pipeline, its PostgreSQL backends, this process and the machine."""

    at: float
    values: dict[str, float | None]

    @staticmethod
    def take(pids: dict[str, int | Sequence[int] | None]) -> CpuSample:
        """Sample the processes in `pids` (by role; a role's pids are summed), this process and the machine, now."""
        values = {role: processes_cpu_seconds(pid) for role, pid in pids.items()}
        values["bench"] = time.process_time()
        values["machine"] = machine_cpu_seconds()
        return CpuSample(time.monotonic(), values)

    def cores_since(self, earlier: CpuSample) -> dict[str, float]:
        """Average cores busy per role between `earlier` and this sample."""
        wall = self.at - earlier.at
        return {
            role: round((value - earlier.values[role]) / wall, 2)  # type: ignore[operator]
            for role, value in self.values.items()
            if wall > 0 and value is not None and earlier.values.get(role) is not None
        }


@dataclass(frozen=True)
class Drain:
    """How the pipeline worked off the backlog, on the monotonic clock of this process."""

    started: float  # just before the process was spawned
    first_commit: float  # first poll that found a committed offset row of the group
    first_committed: int  # records already committed at that poll (the first batches)
    done: float  # first poll that found every partition at its end
    commits: int  # commits seen by the polls (each moves the offsets; batches take far more than 50 ms)
    cpu_start: CpuSample  # at the first commit
    cpu_done: CpuSample  # at the end of the backlog
    samples: tuple[tuple[float, int], ...] = ()  # (seconds since `started`, records done) at every poll

    @property
    def startup_seconds(self) -> float:
        """Process start to the first committed batch (interpreter, imports, group join, first batch)."""
        return self.first_commit - self.started

    @property
    def drain_seconds(self) -> float:
        """First committed batch to the last."""
        return self.done - self.first_commit

    @property
    def total_seconds(self) -> float:
        """Process start to the last committed batch."""
        return self.done - self.started

    def rate(self, events: int) -> float:
        """Records/s of a backlog of `events`: those after the first committed batch, over the time to the last."""
        return (events - self.first_committed) / self.drain_seconds

    def rate_with_startup(self, events: int) -> float:
        """Records/s of a backlog of `events` from process start to the last committed batch."""
        return events / self.total_seconds

    def describe(self, events: int, unit: str) -> str:
        """Where the headline's clock starts, the rate from process start and the cores busy: a report's note."""
        return (
            f"{events - self.first_committed:,} {unit} in {self.drain_seconds:.2f}s after {self.startup_seconds:.2f}s"
            f" of start-up (interpreter, group join, first batches of {self.first_committed:,}); from process"
            f" start {self.rate_with_startup(events):,.0f} {unit}/s; cores busy (of {os.cpu_count()}):"
            f" {cores_text(self.cpu_done.cores_since(self.cpu_start))}"
        )


def cores_text(cores: dict[str, float]) -> str:
    """Cores busy by role, as the notes print them."""
    return ", ".join(f"{role} {value:.2f}" for role, value in cores.items())


class DrainProgress:
    """Logs "drain progress" (what, done, total, rate so far) every `PROGRESS_EVERY_S` seconds.

    The rate counts from the first poll that found records done, so that start-up is not in it and
    batch commits (one every second or so) do not make it jump between 0 and twice the real rate.

    Off by default, so a benchmark run by hand prints what it always did; `make bench` turns it
    on (`--progress 1`) and shows the lines as a live percentage and rate.
    """

    def __init__(self, what: str, total: int) -> None:
        self.what, self.total = what, total
        self.interval = PROGRESS_EVERY_S
        self._first: tuple[float, int] | None = None  # the first poll that found records done
        self._logged = 0.0

    def __call__(self, done: int, now: float) -> None:
        """Record a poll's count; log it when the interval has passed since the last line."""
        if not self.interval:
            return
        if self._first is None and done:
            self._first = (now, done)
        if now - self._logged < self.interval:
            return
        self._logged = now
        at, before = self._first or (now, done)
        rate = (done - before) / (now - at) if now > at else 0.0
        log.info("drain progress", what=self.what, done=done, total=self.total, rate=round(rate))


def committed_offsets(conn: psycopg.Connection, group: str, topic: str) -> dict[int, int]:
    """Next offsets stored in PostgreSQL for the group: the pipeline's truth (see pipelines.runtime.checkpoint)."""
    return dict(
        conn.execute(
            "SELECT partition, next_offset FROM ops.kafka_offsets WHERE group_id = %s AND topic = %s", (group, topic)
        ).fetchall()
    )


def time_drain(
    count: Callable[[], int],
    total: int,
    *,
    what: str,
    started: float,
    check_alive: Callable[[], None],
    pids: Callable[[], dict[str, int | Sequence[int] | None]],
    ready: Callable[[], bool] = lambda: True,
    on_first: Callable[[], None] = lambda: None,
    timeout: float = DRAIN_TIMEOUT_S,
) -> Drain:
    """Poll `count` (records done) every 50 ms until it reaches `total`: the one drain loop of the benchmarks.

    The clock starts at the first poll that finds records done once `ready()` (after `on_first()`,
    e.g. finding the processes' PostgreSQL backends, whose CPU `pids()` then names); `started` is
    when the process was spawned, so start-up is measured apart. Every poll is a sample of the
    throughput plot, and a progress line when `--progress` asks for them.

    Raises:
        BenchmarkError: `check_alive` found a process gone, or `timeout` passed since `started`.
    """
    first: tuple[float, int, CpuSample] | None = None
    seen: set[int] = set()
    samples: list[tuple[float, int]] = []
    progress = DrainProgress(what, total)
    tick = time.monotonic()
    while True:
        n, now = count(), time.monotonic()
        samples.append((now - started, n))
        progress(n, now)
        if n:
            seen.add(n)
        if first is None and n and ready():
            on_first()
            first = (now, n, CpuSample.take(pids()))
        if n >= total and first is not None:
            return Drain(started, first[0], first[1], now, len(seen), first[2], CpuSample.take(pids()), tuple(samples))
        check_alive()
        if now - started > timeout:
            raise BenchmarkError(f"{what}: {n:,} of {total:,} records done after {timeout:.0f}s")
        tick += OFFSETS_POLL_S
        time.sleep(max(0.0, tick - time.monotonic()))


def wait_drained(conn: psycopg.Connection, pipeline: PipelineWorkers, ends: dict[int, int]) -> Drain:
    """Poll the group's offsets in `ops.kafka_offsets` every 50 ms until they reach `ends`.

    The clock starts at the first poll that finds a committed batch once every worker holds its
    share of the partitions, so that start-up and the rebalances of workers joining one after the
    other are not timed. (Not "once every partition has a batch": one consumer reads a backlog a
    partition at a time, so that would leave only the last few batches on the clock.)
    """
    return time_drain(
        lambda: sum(committed_offsets(conn, pipeline.group, pipeline.topic).values()),
        sum(ends.values()),
        what=pipeline.topic,
        started=pipeline.started,
        check_alive=pipeline.check_alive,
        pids=lambda: pipeline.pids,
        ready=lambda: pipeline.settled(ends),
        on_first=lambda: pipeline.find_backends(conn),
    )
