"""What the likes-at-size benchmark watches while the runner fills the state, and the curve it draws from that.

- `sample_fill`: until the runner's stored offsets reach the backlog's end, every `sample_s` one
  `Sample`: events committed (offsets in `ops.kafka_offsets`) and, through the backlog's prefix
  counts, likes in the state; the runner's PSS, CPU of the runner and its backends, the load
  average. Nothing here touches the growing tables.
- `curve`: the samples as throughput per step of likes in the state (by default per million), the
  figure the benchmark is about, and `tail_rate`, the sustained rate at full size (over the last
  tenth of the fill); pure functions, tested in tests/unit/test_bench_at_size.py.
- `storage_sizes`: table and index bytes of each storage table; `disk_estimate` / `free_bytes`: a
  run that will not fit is refused before it starts.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from loadgen.common.drain import CpuSample, committed_offsets, high_watermarks
from loadgen.common.errors import BenchmarkError
from loadgen.common.processes import PipelineWorkers, backend_pids
from pipelines.settings import KafkaSettings
from stack.procmem import pss_kib

STALL_TIMEOUT_S = 600.0  # no offset moved for this long (a Kafka restart takes minutes here): the run has failed
# Disk per like in force, everything the state and views keep with their indexes, measured at 1 M likes.
BYTES_PER_LIKE = 450
BYTES_PER_FOLLOW = 200
KAFKA_BYTES_PER_EVENT = 60  # lz4-compressed JSON likes in the topic
DISK_MARGIN = 1.3  # a run needs its estimate times this
TAIL_SHARE = 0.1  # the sustained rate at full size is measured over the last tenth of the fill


@dataclass(frozen=True)
class Sample:
    """The fill at one moment, on the clock of `sample_fill` (seconds since the runner was started)."""

    elapsed_s: float
    events: int  # records whose effects are committed (the sum of the stored next offsets)
    likes: int  # likes in force in the state at those offsets
    pss_mib: float  # the runner process
    cpu: CpuSample
    load: tuple[float, float, float]


@dataclass
class Fill:
    """Everything `sample_fill` saw."""

    samples: list[Sample] = field(default_factory=list)
    first_commit_s: float | None = None  # the first sample with a stored offset

    @property
    def first(self) -> Sample:
        """The first sample once a batch was committed: where throughput starts counting (start-up excluded)."""
        return next(s for s in self.samples if s.elapsed_s >= (self.first_commit_s or 0))

    @property
    def last(self) -> Sample:
        """The sample that found the backlog drained."""
        return self.samples[-1]

    @property
    def rate(self) -> float | None:
        """Events per second from the first committed batch to the end of the backlog (None: all in one sample)."""
        seconds = self.last.elapsed_s - self.first.elapsed_s
        return (self.last.events - self.first.events) / seconds if seconds > 0 else None


def sample_fill(
    conn: psycopg.Connection,
    pipeline: PipelineWorkers,
    ends: dict[int, int],
    likes_at: Callable[[dict[int, int]], int] | None,
    *,
    application_name: str,
    sample_s: float,
    on_sample: Callable[[Sample], None] | None = None,
) -> Fill:
    """Sample the runner's drain of its topic until its stored offsets reach `ends`.

    `likes_at` turns stored offsets into likes in force (`LikesBacklog.likes_at`); None counts none.
    The runner names its sessions `application_name` (unique to the run: other benchmarks' runners
    may be working at the same time), whose CPU is sampled once they are found.

    Raises:
        BenchmarkError: the runner exited, or committed nothing new for `STALL_TIMEOUT_S`.
    """
    fill = Fill()
    runner = pipeline.workers[0]
    next_sample = time.monotonic()
    moved_at, last_events = time.monotonic(), -1
    while True:
        now = time.monotonic()
        if now >= next_sample:
            offsets = committed_offsets(conn, pipeline.group, pipeline.topic)
            if offsets and not runner.backend:
                runner.backend = backend_pids(conn, application_name)
            sample = Sample(
                now - pipeline.started,
                sum(offsets.values()),
                likes_at(offsets) if likes_at else 0,
                pss_kib(runner.process.pid) / 1024,
                CpuSample.take(pipeline.pids),
                os.getloadavg(),
            )
            fill.samples.append(sample)
            if offsets and fill.first_commit_s is None:
                fill.first_commit_s = sample.elapsed_s
            if on_sample is not None:
                on_sample(sample)
            if offsets == ends:
                return fill
            if sample.events != last_events:
                moved_at, last_events = now, sample.events
            elif now - moved_at > STALL_TIMEOUT_S:
                raise BenchmarkError(f"runner: no batch committed for {STALL_TIMEOUT_S:.0f}s at {sample.events:,}")
            next_sample += sample_s
        pipeline.check_alive()
        time.sleep(max(0.0, next_sample - time.monotonic()))


class PssWatch(threading.Thread):
    """The peak PSS of one process, read every second until stopped (or until the process is gone)."""

    def __init__(self, pid: int) -> None:
        super().__init__(name="pss-watch", daemon=True)
        self.pid = pid
        self.peak_mib = 0.0
        self._halt = threading.Event()

    def run(self) -> None:
        """Sample until stopped."""
        while not self._halt.is_set():
            self.peak_mib = max(self.peak_mib, pss_kib(self.pid) / 1024)
            self._halt.wait(1.0)

    def stop(self) -> None:
        """One last sample, then end the thread."""
        self.peak_mib = max(self.peak_mib, pss_kib(self.pid) / 1024)
        self._halt.set()
        self.join(5)


def curve_step(likes: int) -> int:
    """Likes of state per curve point: a million, or a tenth of a smaller run."""
    return 1_000_000 if likes >= 10_000_000 else max(1, likes // 10)


def curve(samples: Sequence[Sample], step: int, start_s: float | None = None) -> list[dict[str, Any]]:
    """Throughput per `step` likes of state: one point each time the state crosses a multiple of `step`.

    The crossing times are interpolated linearly between the two samples around them, and so are the
    events committed at those times. A point's `likes_per_s` is the like events the runner applied
    (likes, unlikes and repeated likes, the pipeline's throughput) per second since the previous
    point; `state_growth_per_s` is the likes added to the state per second. The first point counts
    from `start_s` (the first committed batch: start-up is not throughput) or the first sample.
    Each point also carries the runner's PSS and cores busy since the previous point, and the load
    average, of the sample just after the crossing.
    """
    ordered = [s for s in samples if start_s is None or s.elapsed_s >= start_s]
    if len(ordered) < 2:
        return []
    points: list[dict[str, Any]] = []
    previous_t, previous_events, previous_likes, previous_sample = (
        ordered[0].elapsed_s,
        float(ordered[0].events),
        ordered[0].likes,
        ordered[0],
    )
    boundary = (ordered[0].likes // step + 1) * step
    for before, after in pairwise(ordered):
        while before.likes < boundary <= after.likes:
            share = (boundary - before.likes) / (after.likes - before.likes)
            t = before.elapsed_s + share * (after.elapsed_s - before.elapsed_s)
            events = before.events + share * (after.events - before.events)
            dt = t - previous_t
            if dt > 0:
                points.append(
                    {
                        "likes_in_state": boundary,
                        "likes_per_s": round((events - previous_events) / dt, 1),
                        "elapsed_s": round(t, 2),
                        "events_consumed": round(events),
                        "state_growth_per_s": round((boundary - previous_likes) / dt, 1),
                        "pss_mib": round(after.pss_mib, 1),
                        "cores": after.cpu.cores_since(previous_sample.cpu) if after is not previous_sample else {},
                        "load1": round(after.load[0], 2),
                    }
                )
                previous_sample = after
            previous_t, previous_events, previous_likes = t, events, boundary
            boundary += step
    return points


def crossing(samples: Sequence[Sample], likes: int) -> tuple[float, float] | None:
    """When the state first held `likes`, and the events committed then, interpolated between two samples."""
    for before, after in pairwise(samples):
        if before.likes < likes <= after.likes:
            share = (likes - before.likes) / (after.likes - before.likes)
            return (
                before.elapsed_s + share * (after.elapsed_s - before.elapsed_s),
                before.events + share * (after.events - before.events),
            )
    return None


def tail_rate(samples: Sequence[Sample], share: float = TAIL_SHARE) -> float | None:
    """The sustained rate at full size: events per second while the state grew over its last `share`.

    At the default size that is the last two curve points, some 45 batches of the runner: one
    point alone can be a batch more or less (the offsets move a batch at a time), a tail this long
    cannot.
    """
    final = samples[-1] if samples else None
    start = crossing(samples, int(final.likes * (1 - share))) if final else None
    if final is None or start is None or final.elapsed_s <= start[0]:
        return None
    return (final.events - start[1]) / (final.elapsed_s - start[0])


def topic_ends(topic: str, events: int, kafka: KafkaSettings) -> dict[int, int]:
    """Where a bench topic ends (what a drain must reach), checked against what was produced."""
    ends = high_watermarks(topic, kafka)
    if sum(ends.values()) != events:
        raise BenchmarkError(f"{topic} holds {sum(ends.values()):,} records, {events:,} were produced")
    return ends


def count_rows(conn: psycopg.Connection, stream: str) -> int:
    """Rows of a stream's state table: its keys in force."""
    return conn.execute(sql.SQL("SELECT count(*) FROM cv.{}").format(sql.Identifier(f"state_{stream}"))).fetchone()[0]


def storage_tables(conn: psycopg.Connection, schema: str, streams: Sequence[str]) -> list[str]:
    """The cv.* tables of a bench schema's views (`<schema>__<view>`, `__refs`, ...) and its streams' states."""
    pattern = schema.replace("_", r"\_") + r"\_\_%"
    rows = conn.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = 'cv' AND c.relkind = 'r' AND (c.relname LIKE %s OR c.relname = ANY(%s)) ORDER BY 1",
        (pattern, [f"state_{s}" for s in streams]),
    ).fetchall()
    return [name for (name,) in rows]


def storage_sizes(conn: psycopg.Connection, tables: Sequence[str]) -> dict[str, Any]:
    """Bytes of `tables` (in cv): each one's total (heap, TOAST, indexes), indexes and live rows, and the sums."""
    rows = conn.execute(
        "SELECT c.relname, pg_total_relation_size(c.oid), pg_indexes_size(c.oid), s.n_live_tup"
        " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_stat_user_tables s ON s.relid = c.oid"
        " WHERE n.nspname = 'cv' AND c.relname = ANY(%s) ORDER BY c.relname",
        (list(tables),),
    ).fetchall()
    sized = {name: {"total_bytes": total, "index_bytes": index, "live_rows": live} for name, total, index, live in rows}
    return {
        "tables": sized,
        "total_bytes": sum(t["total_bytes"] for t in sized.values()),
        "index_bytes": sum(t["index_bytes"] for t in sized.values()),
    }


def data_directory(conn: psycopg.Connection) -> Path:
    """Where PostgreSQL keeps its files, when this role may know; else the local stack's state or /."""
    try:
        (path,) = conn.execute("SELECT current_setting('data_directory')").fetchone() or ("",)
        return Path(path)
    except psycopg.Error:
        state = Path(os.environ.get("STACK_STATE_DIR", Path(__file__).resolve().parents[2] / ".state"))
        return state if state.exists() else Path("/")


def free_bytes(path: Path) -> int:
    """Free bytes on the filesystem holding `path` (or its nearest existing parent)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def disk_estimate(likes: int, follows: int, events: int, *, bytes_per_like: float = BYTES_PER_LIKE) -> int:
    """Bytes a run will add: the state and views of `likes` and `follows`, and `events` in the topics.

    WAL is not counted: it is recycled after each checkpoint (max_wal_size), unless an inactive
    replication slot of the database holds it back, which the report's notes then show.
    """
    return int(likes * bytes_per_like + follows * BYTES_PER_FOLLOW + events * KAFKA_BYTES_PER_EVENT)
