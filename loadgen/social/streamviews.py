"""streamviews' side of `loadgen.social`: the likes pipeline end to end, and the social queries.

Both measurements run on throwaway objects only: a schema `bench_<id>` with copies of the social
streams, views and query functions (`loadgen.common.social_copies`), dropped afterwards with everything
else the run created (`loadgen.common.throwaway`); the real `likes`/`follows` topics and the `social`
schema are never read or written.

- `run_pipeline`: one or more stream runners (`python -m pipelines.cv.runner --streams <bench stream>`,
  `loadgen.common.processes`) in one consumer group on the bench topic, timed until their offsets
  in `ops.kafka_offsets` reach the topic's end (`loadgen.common.drain`), then kept running under a steady
  load with marker likes whose visibility in `object_likes` a poller thread times (`loadgen.common.freshness`).
- `run_social_queries`: the views filled through the engine (`StreamMaintainer.apply`, in batches,
  as `sv_writer`) with exactly the seed intersection baseline's likes and follow lists, then pgbench
  of the copied `like_count`, `likers` and `friends_who_like` functions as `sv_reader`.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from loadgen.common.drain import CpuSample, Drain, high_watermarks, wait_drained
from loadgen.common.errors import BenchmarkError
from loadgen.common.freshness import MarkerProbe, SteadyLoad, likes_freshness, percentile
from loadgen.common.postgres import owner_conninfo, pgbench_env, pgbench_tps
from loadgen.common.processes import PipelineWorkers
from loadgen.common.seed import likers_by_object
from loadgen.common.social_copies import StreamCopy, bench_views, engine_filled_views
from loadgen.common.throwaway import forget_group, unique_name
from loadgen.workloads.social import Like, WorkloadSettings, follow_lists, workload_likes
from pipelines.logs import get_logger
from pipelines.settings import ROLE_READER, KafkaSettings, PostgresSettings

log = get_logger("loadgen.social.streamviews")

FRESHNESS_SHARE = 0.5  # the freshness phase produces at this share of the measured throughput
MARKER_TIMEOUT_S = 30.0
LOAD_BATCH = 20_000  # stream changes per engine transaction when filling views directly


# --- the pipeline, end to end ---------------------------------------------------------------------


@dataclass(frozen=True)
class PipelineRun:
    """The pipeline end to end: drain of the backlog, then freshness under a steady load."""

    events: int
    drain: Drain
    load: SteadyLoad
    latencies_ms: list[float]
    log_paths: list[Path]  # one per worker
    totals: dict[str, Any] = field(default_factory=dict)
    warnings: int = 0
    cpu_steady: CpuSample | None = None  # at the end of the steady production

    @property
    def steady_batches(self) -> int | None:
        """Batches committed after the backlog (the steady phase and its tail), from the pipeline's totals."""
        batches = self.totals.get("batches")
        return batches - self.drain.commits if batches is not None else None

    @property
    def steady_records(self) -> int | None:
        """Records consumed after the backlog."""
        records = self.totals.get("records")
        return records - self.events if records is not None else None

    @property
    def likes_per_second(self) -> float:
        """Headline: the backlog after the first committed batch over the time from it to the last."""
        return self.drain.rate(self.events)

    @property
    def freshness_p50_ms(self) -> float:
        """Median marker latency."""
        return statistics.median(self.latencies_ms)

    @property
    def freshness_p99_ms(self) -> float:
        """99th percentile marker latency."""
        return percentile(self.latencies_ms, 99)


def run_pipeline(
    topic: str,
    events: Sequence[Like],
    *,
    workload: WorkloadSettings,
    kafka: KafkaSettings,
    postgres: PostgresSettings,
    seconds: int,
    workers: int = 1,
) -> PipelineRun:
    """Run the likes pipeline on `topic` (holding `events`) into bench views; time the drain, then freshness.

    1. Views: schema and stream `bench_<id>` with copies of the likes views of social.sql.
    2. Throughput: spawn `workers` pipeline processes (group `bench-pipeline-<id>`, default batch
       settings) and poll `ops.kafka_offsets` every 50 ms until the group's offsets reach the
       topic's end (see `wait_drained`).
    3. Freshness: keep it running, produce the workload's next events at `FRESHNESS_SHARE` of the
       headline throughput for `seconds`, plus a marker like every 20 ms; a poller thread times
       each marker until it is visible in `object_likes`.
    4. SIGTERM the pipeline; drop the views, stream and schema, the group's offset rows and the
       dead-letter topic the pipeline created.
    """
    name = unique_name("bench")
    group = unique_name("bench-pipeline", "-")
    # The events that follow `events` in the same workload (same seed and parameters), drawn lazily
    # during the freshness phase; drawn past the backlog now, before any clock starts.
    continuation = workload_likes(workload)
    for _ in islice(continuation, len(events)):
        pass
    owner = owner_conninfo(postgres)
    try:
        with bench_views(name, [StreamCopy("likes", name, topic, group)], postgres) as views:
            ends = high_watermarks(topic, kafka)
            if sum(ends.values()) != len(events):
                raise BenchmarkError(f"{topic} holds {sum(ends.values())} records, expected {len(events)}")
            pipeline = PipelineWorkers(workers, topic=topic, stream=name, group=group, postgres=postgres, kafka=kafka)
            log.info(
                "pipeline bench views", views=views, topic=topic, group=group, logs=list(map(str, pipeline.log_paths))
            )
            try:  # the pipeline stops before its views are dropped, whatever happens
                return _measure(pipeline, topic, events, continuation, workload, kafka, postgres, ends, seconds)
            finally:
                pipeline.stop()
    finally:
        forget_group(owner, group, topic, kafka)


def _measure(
    pipeline: PipelineWorkers,
    topic: str,
    events: Sequence[Like],
    continuation: Iterator[Like],
    workload: WorkloadSettings,
    kafka: KafkaSettings,
    postgres: PostgresSettings,
    ends: dict[int, int],
    seconds: int,
) -> PipelineRun:
    """Steps 2 and 3 of `run_pipeline`, with the pipeline running; stops it at the end."""
    with psycopg.connect(owner_conninfo(postgres), autocommit=True) as conn:
        drain = wait_drained(conn, pipeline, ends)
    if drain.first_committed >= len(events):
        raise BenchmarkError(
            f"the pipeline's first batches held the whole backlog ({len(events)} likes): too few to time"
            " without start-up; produce more (--events)"
        )
    log.info(
        "backlog drained",
        startup_s=round(drain.startup_seconds, 2),
        drain_s=round(drain.drain_seconds, 2),
        first_committed=drain.first_committed,
        commits=drain.commits,
    )
    load = SteadyLoad(
        rate=FRESHNESS_SHARE * (len(events) - drain.first_committed) / drain.drain_seconds, seconds=seconds
    )
    probe = MarkerProbe(
        postgres.conninfo(user=ROLE_READER, application_name="streamviews-bench-probe"), pipeline.stream
    )
    cpu: list[CpuSample] = []
    latencies_ms = likes_freshness(
        topic,
        continuation,
        load,
        probe,
        users=workload.users,
        kafka=kafka,
        check_alive=pipeline.check_alive,
        timeout_s=MARKER_TIMEOUT_S,
        while_loaded=lambda: cpu.append(CpuSample.take(pipeline.pids)),
    )
    cpu_steady = cpu[0]
    code = pipeline.stop()
    if code != 0:
        raise BenchmarkError(f"pipeline exited {code} on SIGTERM: {pipeline.tail()}")
    totals, warnings = pipeline.totals()
    return PipelineRun(len(events), drain, load, latencies_ms, pipeline.log_paths, totals, warnings, cpu_steady)


# --- the social queries ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SocialRun:
    """pgbench of the copied social functions, and what their tables held."""

    like_count_tps: float
    likers_tps: float
    friends_who_like_tps: float
    liked_objects: int
    followers: int
    follow_edges: int
    matches_seed: bool
    load: tuple[int, float]  # changes applied through the engine, in seconds


def run_social_queries(
    seconds: int,
    *,
    events: Sequence[Like],
    clients: int,
    workload: WorkloadSettings,
    followers: int,
    postgres: PostgresSettings,
) -> SocialRun:
    """Fill bench copies of the social views with the seed baseline's data, then pgbench the query functions.

    Likes are `events` (what the seed intersection baseline replayed into `obj`), follows are
    `follow_lists(workload.seed, users=workload.users, followers=followers)` (its `user_like_agg`),
    both applied through the engine as `sv_writer`. The view tables are then vacuumed and analyzed,
    as the seed's tables were. Each function is run with the seed intersection script's draws:
    objects `random_gaussian(1, objects, gaussian)`, users uniform in 1..followers.
    """
    follows = follow_lists(workload.seed, users=workload.users, followers=followers)
    with engine_filled_views(events, follows, postgres) as filled:
        name, owner = filled.schema, owner_conninfo(postgres)
        s = sql.Identifier(name)
        expected = likers_by_object(events)
        with psycopg.connect(owner, autocommit=True) as conn:
            conn.execute(sql.SQL("VACUUM (ANALYZE) {}.object_likes, {}.user_following").format(s, s))
            liked, like_sum = conn.execute(
                sql.SQL("SELECT count(*), coalesce(sum(like_count), 0) FROM {}.object_likes").format(s)
            ).fetchone()
            lists, follow_sum = conn.execute(
                sql.SQL("SELECT count(*), coalesce(sum(cardinality(following)), 0) FROM {}.user_following").format(s)
            ).fetchone()
        matches = (liked, like_sum, lists, follow_sum) == (
            len(expected),
            sum(len(u) for u in expected.values()),
            followers,
            filled.follow_edges,
        )
        if not matches:
            log.warning(
                "bench views differ from the seed baseline's tables",
                liked_objects=(liked, len(expected)),
                follow_lists=(lists, followers),
                follows=(follow_sum, filled.follow_edges),
            )
        object_draw = f"\\set id random_gaussian(1, :objects, {workload.gaussian})\n"
        user_draw = "\\set uid random(1, :followers)\n"
        env = pgbench_env(ROLE_READER, postgres)
        variables = {"objects": workload.objects, "followers": followers}
        tps = {}
        for function, draws, call in (
            ("like_count", object_draw, "SELECT {s}.like_count(:id);"),
            ("likers", object_draw, "SELECT {s}.likers(:id);"),
            ("friends_who_like", object_draw + user_draw, "SELECT {s}.friends_who_like(:uid, :id);"),
        ):
            script = draws + sql.SQL(call).format(s=s).as_string() + "\n"
            tps[function] = pgbench_tps(script, seconds, clients, env=env, variables=variables)
            log.info("social query measured", function=function, tps=tps[function])
    return SocialRun(
        tps["like_count"],
        tps["likers"],
        tps["friends_who_like"],
        liked,
        lists,
        follow_sum,
        matches,
        (filled.likes.changes + filled.follows.changes, filled.likes.seconds + filled.follows.seconds),
    )
