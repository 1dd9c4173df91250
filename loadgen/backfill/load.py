"""The backfill benchmark's steady load: page views with timed markers, a second view defined part-way.

`under_load` runs one load phase of `python -m loadgen.backfill` (its docstring says what the phases
are) and returns the live view's freshness around the second view's definition; `timeline` and
`write_samples` show where in that window the p99 comes from.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import psycopg
from psycopg import sql

from loadgen.common.drain import CpuSample, cores_text
from loadgen.common.errors import BenchmarkError
from loadgen.common.freshness import MARKER_INTERVAL_S, Probe, percentile
from loadgen.common.kafka import Sender
from loadgen.common.processes import PipelineWorkers, find_pid
from loadgen.workloads.pageviews import PageViews
from pipelines.settings import KafkaSettings

TIMELINE_S = 2.0  # the freshness timeline's window, seconds
MARKER_PREFIX = "/marker/"


@dataclass
class Backfilled:
    """A backfill's offsets, and when its first batch was seen committed (offsets done then, monotonic time)."""

    offsets: int
    first_done: int = 0
    first_at: float | None = None
    joined_at: float | None = None  # when it was seen joined to the live runner (cv.backfill_status.joined_at)


class UrlProbe(Probe):
    """Polls `live_stats` for pending marker urls every 5 ms, on a connection of its own."""

    def __init__(self, conninfo: str, view: sql.Identifier) -> None:
        super().__init__("marker-probe", 0.005)
        self._conninfo = conninfo
        self._query = sql.SQL("SELECT url FROM {} WHERE url = ANY(%s)").format(view)

    def session(self) -> psycopg.Connection:
        """An autocommit connection: each poll sees the latest commits."""
        return psycopg.connect(self._conninfo, autocommit=True)

    def find(self, session: psycopg.Connection, markers: list[str]) -> Iterable[str]:
        """The marker urls in the view."""
        return [url for (url,) in session.execute(self._query, (markers,)).fetchall()]


class SteadyProducer(threading.Thread):
    """Page views at `rate` per second and a marker every 20 ms (registered with `probe`), until stopped.

    The markers of `phase` are urls of their own: a marker url an earlier phase made is in the view already.
    """

    def __init__(
        self, topic: str, views: PageViews, rate: float, probe: UrlProbe, kafka: KafkaSettings, phase: str
    ) -> None:
        super().__init__(name="steady-producer", daemon=True)
        self.marker_prefix = f"{MARKER_PREFIX}{phase}/"  # a phase's markers are urls no earlier phase made
        self.sender = Sender(topic, kafka, client="bench-backfill")
        self.views, self.rate, self.probe = views, rate, probe
        self.halt = threading.Event()
        self.limit_s = float("inf")  # the load stops after this many seconds, or when halted
        self.produced = self.markers = 0
        self.seconds = 0.0
        self.error: BaseException | None = None

    def run(self) -> None:
        """Pace against the start (events due = rate x elapsed), as loadgen.common.freshness does."""
        started = next_marker = time.monotonic()
        try:
            while not self.halt.is_set() and time.monotonic() - started < self.limit_s:
                now = time.monotonic()
                due = int((now - started) * self.rate)
                while self.produced < due:
                    self.sender.send(*self.views.encode(self.produced % len(self.views.urls)))
                    self.produced += 1
                if now >= next_marker:
                    url = f"{self.marker_prefix}{self.markers}"
                    self.probe.sent(url, time.monotonic())
                    self.sender.send(url.encode(), f'{{"url": "{url}", "uid": 1, "latency": 1}}'.encode())
                    self.markers += 1
                    next_marker += MARKER_INTERVAL_S
                self.sender.producer.poll(0)
                time.sleep(max(0.0, min(0.001, next_marker - time.monotonic())))
            self.seconds = time.monotonic() - started
            self.sender.flush()
            self.sender.check()
        except BaseException as e:  # reported by the caller
            self.error = e


def write_samples(path: str, samples: list[tuple[float, float]], since: float, joined_at: float | None) -> None:
    """Every marker as `seconds since the backfill's definition, latency ms` (CSV), and the join's moment."""
    with open(path, "w") as out:
        out.write("sent_s,latency_ms\n")
        for at, latency in sorted(samples):
            out.write(f"{at - since:.3f},{1000 * latency:.1f}\n")
        if joined_at is not None:
            out.write(f"# joined at {joined_at - since:.3f}\n")


def timeline(samples: list[tuple[float, float]], since: float, until: float, joined_at: float | None) -> str:
    """The markers' p99 per TIMELINE_S window from `since`, the window the backfill joined in starred.

    Where in a backfill the live view's freshness suffers: its catch-up alone, the join, or the rest
    read beside the live runner after it (pipelines/cv/backfill.py).
    """
    windows: list[str] = []
    start = since
    while start < until:
        end = min(start + TIMELINE_S, until)
        within = [1000 * lat for (at, lat) in samples if start <= at < end]
        joined = "*" if joined_at is not None and start <= joined_at < end else ""
        windows.append(f"{percentile(within, 99):,.0f}{joined}" if within else f"-{joined}")
        start = end
    return ", ".join(windows)


@dataclass
class LoadPhase:
    """A steady load on the live view, a second view defined part-way: the live view's freshness around it."""

    quiet: float  # when the load began, without the second view (monotonic)
    started: float  # when the second view was defined
    joined_at: float | None  # its backfill joined the live runner
    backfill_rate: float | None  # its backfill's events/s under the load
    produced: int  # page views the load produced
    steady_rate: float
    samples: list[tuple[float, float]]  # every marker: (sent at, latency s)
    load_end: float  # the load's end, or the backfill's if sooner: the freshness window's end
    cpu_notes: list[str]

    def baseline(self) -> list[float]:
        """The markers' latencies (ms) under the load before the second view, its first second left out."""
        return self._within(self.quiet + 1, self.started)

    def during(self) -> list[float]:
        """The markers' latencies (ms) from the second view's definition to the window's end."""
        return self._within(self.started, self.load_end)

    def _within(self, since: float, until: float) -> list[float]:
        return [1000 * lat for (at, lat) in self.samples if since <= at <= until]


def under_load(
    runner: PipelineWorkers,
    args: argparse.Namespace,
    load: tuple[str, PageViews, float, str, KafkaSettings, sql.Identifier],
    second_view: Callable[[], tuple[float | None, Backfilled]],
    phase: str,
) -> LoadPhase:
    """Page views at the load's rate with markers timed in the live view; `second_view` defined after `--baseline-s`.

    `load` is (topic, page views, rate, the owner's conninfo, Kafka, the live view). `second_view` defines the view
    and returns once its window is over: its backfill's rate under the load and how it went.
    """
    topic, views, rate, owner, kafka, live = load
    probe = UrlProbe(owner, live)
    probe.start()
    steady = SteadyProducer(topic, views, rate, probe, kafka, phase)
    steady.limit_s = args.baseline_s + args.load_s
    steady.start()
    try:
        quiet = time.monotonic()  # the same load without the second view first: the baseline
        runner.also_sampled["kafka"] = find_pid(b"kafka.Kafka")  # the broker serving both consumers
        cpu_quiet = CpuSample.take(runner.pids)
        time.sleep(args.baseline_s)
        started = time.monotonic()
        cpu_started = CpuSample.take(runner.pids)
        backfill_rate, seen = second_view()
        ended = time.monotonic()
        # The backfill process comes and goes, so it is not sampled: its share is in "machine".
        before, during = cpu_started.cores_since(cpu_quiet), CpuSample.take(runner.pids).cores_since(cpu_started)
        steady.halt.set()
        steady.join(60)
        if steady.error is not None:
            raise BenchmarkError(f"steady producer: {steady.error}") from steady.error
        probe.wait_for_markers(60, runner.check_alive)
    finally:
        steady.halt.set()
        probe.stop()
        probe.join(10)
    return LoadPhase(
        quiet,
        started,
        seen.joined_at,
        backfill_rate,
        steady.produced,
        steady.produced / max(steady.seconds, 1e-9),
        probe.samples,
        min(ended, quiet + steady.limit_s),
        [
            f"cores busy (of {os.cpu_count()}) under the load, before the second view: {cores_text(before)}",
            f"  after it, until its backfill completed: {cores_text(during)}",
        ],
    )
