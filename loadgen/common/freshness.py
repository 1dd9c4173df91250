"""Freshness: how long a marker takes from the producer until it is visible downstream, under a steady load.

- `Probe`: a thread that polls for pending markers on a session of its own and times when each is
  seen; `MarkerProbe` looks for marker objects in a bench `object_likes`, other benchmarks
  subclass it for their own sinks (Elasticsearch in `loadgen.audit.pipelines`);
- `produce_steadily`: likes at a fixed rate for a fixed time, plus a marker like every 20 ms,
  registered with the probe just before it is produced (`SteadyLoad` counts what was sent);
- `likes_freshness`: the two together, as the likes benchmarks run them, with every failure raised;
- `percentile`: the latency percentiles reported.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from loadgen.common.errors import BenchmarkError
from loadgen.common.kafka import Sender
from loadgen.workloads.social import Like, encode_like, now_ms
from pipelines.settings import KafkaSettings

MARKER_BASE = 9_000_000_000_000  # marker likes use object ids far above any workload object
MARKER_INTERVAL_S = 0.020  # one marker like every 20 ms during the freshness phase
MARKER_POLL_S = 0.005  # the poller looks for pending markers every 5 ms


class Probe(threading.Thread):
    """Polls for pending markers every `poll_s` on a session of its own, and times when each is seen.

    A marker counts as seen at the moment the poll that returned it was sent: the previous poll did
    not find it, so it became visible in between. Latency = seen - the time it was registered (just
    before it was handed to the producer). Subclasses say how to open the session and look markers up.
    """

    def __init__(self, name: str, poll_s: float) -> None:
        super().__init__(name=name, daemon=True)
        self._poll_s = poll_s
        self._lock = threading.Lock()
        self._pending: dict[Any, float] = {}
        self._halt = threading.Event()
        self.latencies: list[float] = []  # seconds
        self.samples: list[tuple[float, float]] = []  # (registered at, latency), monotonic seconds: lag over time
        self.polls = 0
        self.error: BaseException | None = None

    def session(self) -> AbstractContextManager[Any]:
        """The session `find` polls with, opened in the probe's thread."""
        raise NotImplementedError

    def find(self, session: Any, markers: list[Any]) -> Iterable[Any]:
        """Which of `markers` are visible now."""
        raise NotImplementedError

    def sent(self, marker: Any, at: float) -> None:
        """Register a marker just before it is produced."""
        with self._lock:
            self._pending[marker] = at

    @property
    def pending(self) -> int:
        """Markers sent and not seen yet."""
        with self._lock:
            return len(self._pending)

    def stop(self) -> None:
        """End the loop after the current poll."""
        self._halt.set()

    def wait_for_markers(self, timeout_s: float, check_alive: Callable[[], None], poll_s: float = 0.05) -> None:
        """Until every marker sent is seen, `timeout_s` passes or the probe fails.

        `check_alive` raises as soon as the pipeline being measured has died, rather than waiting out
        the timeout.
        """
        deadline = time.monotonic() + timeout_s
        while self.pending and self.is_alive() and time.monotonic() < deadline:
            check_alive()
            time.sleep(poll_s)

    def run(self) -> None:
        """Poll until stopped; any error is kept for the caller."""
        try:
            with self.session() as session:
                tick = time.monotonic()
                while not self._halt.is_set():
                    with self._lock:
                        markers = list(self._pending)
                    if markers:
                        asked = time.monotonic()
                        found = list(self.find(session, markers))
                        self.polls += 1
                        with self._lock:
                            for marker in found:
                                sent = self._pending.pop(marker, None)
                                if sent is not None:
                                    self.latencies.append(asked - sent)
                                    self.samples.append((sent, asked - sent))
                    tick += self._poll_s
                    delay = tick - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    else:
                        tick = time.monotonic()
        except BaseException as e:  # reported by the caller, which owns the run
            self.error = e


class MarkerProbe(Probe):
    """Polls `<schema>.object_likes` for pending marker objects every 5 ms, on its own connection.

    The poll's snapshot is taken after it was sent, so a marker it finds committed before that.
    """

    def __init__(self, conninfo: str, schema: str) -> None:
        super().__init__("marker-probe", MARKER_POLL_S)
        self._conninfo = conninfo
        self._query = sql.SQL("SELECT oid FROM {}.object_likes WHERE oid = ANY(%s)").format(sql.Identifier(schema))

    def session(self) -> psycopg.Connection:
        """An autocommit connection (each poll sees the latest commits)."""
        return psycopg.connect(self._conninfo, autocommit=True)

    def find(self, session: psycopg.Connection, markers: list[int]) -> Iterable[int]:
        """The marker objects present in object_likes."""
        return [oid for (oid,) in session.execute(self._query, (markers,)).fetchall()]


@dataclass
class SteadyLoad:
    """What the freshness phase produced."""

    rate: float  # target events/s (markers excluded)
    seconds: float
    produced: int = 0
    markers: int = 0


def produce_steadily(
    topic: str, events: Iterator[Like], load: SteadyLoad, probe: Probe, *, users: int, kafka: KafkaSettings
) -> None:
    """Produce `events` at `load.rate` for `load.seconds`, plus a marker like every 20 ms.

    Pacing is against the start (events due = rate x elapsed), checked at least every millisecond, so
    the rate holds on average without a sleep per event. Markers are likes of fresh objects
    `MARKER_BASE + i`, encoded like any other event.

    Raises:
        BenchmarkError: a record was not delivered.
    """
    sender = Sender(topic, kafka, client="bench-freshness")
    started = time.monotonic()
    end = started + load.seconds
    next_marker = started
    try:
        while (now := time.monotonic()) < end:
            due = int((now - started) * load.rate)
            while load.produced < due:
                sender.send(*encode_like(next(events)))
                load.produced += 1
            if now >= next_marker:
                oid = MARKER_BASE + load.markers
                key, value = encode_like(Like(oid, 1 + load.markers % users, "like", now_ms()))
                probe.sent(oid, time.monotonic())
                sender.send(key, value)
                load.markers += 1
                next_marker += MARKER_INTERVAL_S
            sender.producer.poll(0)
            time.sleep(max(0.0, min(0.001, next_marker - time.monotonic())))
    finally:
        sender.flush()
    sender.check()


def likes_freshness(
    topic: str,
    events: Iterator[Like],
    load: SteadyLoad,
    probe: MarkerProbe,
    *,
    users: int,
    kafka: KafkaSettings,
    check_alive: Callable[[], None],
    timeout_s: float,
    while_loaded: Callable[[], None] | None = None,
) -> list[float]:
    """Markers in a steady load of likes until each is seen; their latencies in ms.

    Starts `probe`, produces `load` (calling `while_loaded` right after, e.g. to sample CPU while the
    pipeline still works), waits up to `timeout_s` for every marker, and stops the probe whatever
    happened.

    Raises:
        BenchmarkError: the probe failed, a record was not delivered, or a marker was never seen.
    """
    probe.start()
    try:
        produce_steadily(topic, events, load, probe, users=users, kafka=kafka)
        if while_loaded is not None:
            while_loaded()
        probe.wait_for_markers(timeout_s, check_alive)
    finally:
        probe.stop()
        probe.join(10)
    if probe.error is not None:
        raise BenchmarkError(f"marker probe: {probe.error}") from probe.error
    if probe.pending:
        raise BenchmarkError(f"{probe.pending} of {load.markers} markers not visible after {timeout_s}s")
    return [1000 * s for s in probe.latencies]


def percentile(values: Sequence[float], q: int) -> float:
    """The q-th percentile (1..99), inclusive method; the value itself for a single sample."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]
