"""Likes/follows side by side: the seed's approaches, the ceilings, and streamviews. Prints a table.

One run measures, on this machine's Kafka and PostgreSQL and with the same generated events:

1. the producer (`loadgen.workload`) writing `--events` likes to a fresh `bench-likes-<id>` topic;
2. a bare consumer reading them back (the ceiling of any Kafka pipeline), with and without JSON;
3. the seed's per-event function `f_obj` under pgbench (its way of counting likes), with durable
   commits and with `synchronous_commit=off` (PipelineDB's stream inserts were not durable per event);
4. one binary COPY of the same rows into an unindexed table (the ceiling of any Postgres sink);
5. pgbench of a plain primary-key read, and of the seed's `array_intersect` query over tables filled
   with the workload (likes from the Gaussian hot spot, `--followers` follow lists with the long tail);
6. streamviews itself (`loadgen.bench_streamviews`): the likes pipeline end to end on the bench topic
   (throughput, then freshness under a steady load at half that rate for `--seconds`), and pgbench
   of the social query functions over views holding the same likes and follow lists as step 5.

Ratios are printed wherever both sides were measured, with PASS/MISS against the targets (figures
only: a miss never fails the command). Every schema and topic is throwaway and dropped afterwards;
the real `likes`/`follows` topics and the `social` schema are never touched.

Usage: `python -m loadgen.bench_social [--events 200000] [--seconds 20] [--followers 20000] [--json PATH]`
(`--json`: the figures and the drain's and freshness phase's samples, for `loadgen.bench_all`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

from confluent_kafka.admin import AdminClient
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from loadgen import bench_streamviews
from loadgen import seed_baselines as seed
from loadgen.bench_report import Comparison, Results, drain_series, figures_document, write_figures
from loadgen.throwaway import create_topic
from loadgen.workload import EventSource, Like, WorkloadSettings, encode_like, follow_lists, workload_likes
from pipelines.logs import configure_logging, get_logger
from pipelines.settings import KafkaSettings, PostgresSettings

log = get_logger("loadgen.bench_social")

CONSUMER_PASSES = 3
# The seed article's own figures (its server, 256 clients for likes, 128 for reads), for scale only.
SEED_ARTICLE = {"per_event": 177_666, "pk_read": 1_041_480, "intersection": 648_368}
# The targets, as minimum ratios numerator / denominator.
TARGETS = {
    ("pipeline", "per_event"): 10.0,  # ingest >= 10x the seed's per-event function
    ("pipeline", "per_event_async"): 10.0,  # the same, against its non-durable figure (stricter)
    ("pipeline", "consumer"): 0.5,  # ingest >= 50% of a bare consumer
    ("like_count", "pk_read"): 0.9,  # counts read >= 90% of a plain primary-key read
    ("likers", "pk_read"): 0.9,
    ("friends_who_like", "intersection"): 2.0,  # friends who like >= 2x the seed's array_intersect
}


class BenchSettings(BaseSettings):
    """Size and length of one benchmark run, from `BENCH_*` variables."""

    model_config = SettingsConfigDict(env_prefix="BENCH_", extra="ignore", frozen=True)

    events: int = Field(200_000, gt=0, description="like events produced, consumed and copied")
    seconds: int = Field(20, gt=0, description="length of each pgbench run")
    clients: int = Field(8, gt=0, description="pgbench clients")
    # 20k follow lists hold ~4.1 M follows. streamviews' copy of them is loaded through the engine
    # (~40k changes/s on 2 cores), so the 41.5 M follows of 200k lists would take ~17 minutes.
    followers: int = Field(20_000, gt=0, description="users with a follow list in the intersection test")
    partitions: int = Field(6, gt=0, description="partitions of the bench topic")
    workers: int = Field(1, gt=0, description="pipeline processes in one consumer group (at most `partitions`)")


@dataclass(frozen=True)
class PipelineFigures:
    """End to end: likes from Kafka until visible in Postgres."""

    likes_per_second: float  # headline: from the first committed batch to the last (start-up excluded)
    freshness_p50_ms: float
    freshness_p99_ms: float
    likes_per_second_with_startup: float | None = None  # from process start to the last committed batch
    startup_seconds: float | None = None  # process start to the first committed batch
    drain_seconds: float | None = None  # first committed batch to the last
    first_committed: int | None = None  # records already committed when the first batch was seen
    freshness_rate: float | None = None  # likes/s produced during the freshness phase (markers excluded)
    markers: int = 0  # marker likes timed
    batches: int | None = None  # batches the pipeline committed over the whole run
    records: int | None = None  # records it consumed over the whole run
    steady_batches: int | None = None  # batches committed after the backlog (steady phase and its tail)
    steady_records: int | None = None  # records consumed after the backlog
    cpu: dict[str, dict[str, float]] | None = None  # cores busy by phase ("drain", "steady") and by process
    drain_samples: tuple[tuple[float, int], ...] = ()  # (s since process start, likes committed) every 50 ms
    first_commit_s: float | None = None  # when the timed part of the drain began, s since process start
    latencies_ms: tuple[float, ...] = ()  # every marker's freshness


@dataclass(frozen=True)
class SocialQueryFigures:
    """pgbench transactions/s of the three social queries."""

    like_count_tps: float
    likers_tps: float
    friends_who_like_tps: float
    liked_objects: int | None = None  # rows of the bench object_likes
    followers: int | None = None  # rows of the bench user_following
    follow_edges: int | None = None  # elements of its `following` arrays
    matches_seed: bool | None = None  # same counts as the seed intersection baseline's tables
    load_seconds: float | None = None  # filling the views through the engine
    load_changes: int | None = None  # stream changes applied


def measure_pipeline(
    topic: str,
    events: Sequence[Like],
    *,
    workload: WorkloadSettings,
    kafka: KafkaSettings,
    postgres: PostgresSettings,
    seconds: int,
    workers: int = 1,
) -> PipelineFigures:
    """The likes pipeline end to end: likes/s from Kafka until visible in PostgreSQL, then freshness.

    `workers` `python -m pipelines.cv.runner` processes (one consumer group of their own, default batch
    settings) consume `topic`, which already holds `events`, into copies of the likes views in a
    throwaway schema `bench_<id>`. Throughput is timed by polling `ops.kafka_offsets` every 50 ms
    until the group reaches the topic's end; the headline excludes process start-up (it counts from
    the first poll that finds a committed batch once every worker holds its partitions).
    Then, with the pipeline still running, the workload's next events are produced at half that rate
    for `seconds`, with a marker like every 20 ms whose visibility in `object_likes` a poller times
    every 5 ms. See `bench_streamviews.run_pipeline`; all is cleaned up.

    Args:
        topic: bench topic holding `events`; deleted by the caller afterwards.
        events: the like events in the topic, in production order.
        workload: the workload's settings (seed, users, objects, Gaussian parameter).
        kafka: where Kafka is.
        postgres: where Postgres is.
        seconds: length of the freshness phase.
        workers: pipeline processes in the group (at most the topic's partitions).
    """
    run = bench_streamviews.run_pipeline(
        topic, events, workload=workload, kafka=kafka, postgres=postgres, seconds=seconds, workers=workers
    )
    log.info(
        "pipeline measured",
        likes_per_second=round(run.likes_per_second),
        with_startup=round(run.likes_per_second_with_startup),
        startup_s=round(run.drain.startup_seconds, 2),
        drain_s=round(run.drain.drain_seconds, 2),
        first_committed=run.drain.first_committed,
        freshness_rate=round(run.load.rate),
        freshness_produced=run.load.produced,
        markers=run.load.markers,
        p50_ms=round(run.freshness_p50_ms, 1),
        p99_ms=round(run.freshness_p99_ms, 1),
        max_ms=round(max(run.latencies_ms), 1),
        totals=run.totals,
        steady_batches=run.steady_batches,
        cpu=run.cpu,
        warnings=run.warnings,
        logs=list(map(str, run.log_paths)),
    )
    return PipelineFigures(
        run.likes_per_second,
        run.freshness_p50_ms,
        run.freshness_p99_ms,
        likes_per_second_with_startup=run.likes_per_second_with_startup,
        startup_seconds=run.drain.startup_seconds,
        drain_seconds=run.drain.drain_seconds,
        first_committed=run.drain.first_committed,
        freshness_rate=run.load.rate,
        markers=len(run.latencies_ms),
        batches=run.totals.get("batches"),
        records=run.totals.get("records"),
        steady_batches=run.steady_batches,
        steady_records=run.steady_records,
        cpu=run.cpu,
        drain_samples=run.drain.samples,
        first_commit_s=run.drain.startup_seconds,
        latencies_ms=tuple(run.latencies_ms),
    )


def measure_social_queries(
    seconds: int,
    *,
    events: Sequence[Like],
    clients: int,
    workload: WorkloadSettings,
    followers: int,
    postgres: PostgresSettings,
) -> SocialQueryFigures:
    """The social queries under pgbench (like_count, likers, friends_who_like) over the seed baseline's data.

    The `social` schema is never filled with benchmark data: copies of the views (object_likes and
    the other likes views, user_following) and of the query functions (sql/functions/social.sql,
    `social.` replaced) go into a throwaway schema. The views are filled through the engine
    (`StreamMaintainer.apply`, batches of 20k, as `sv_writer`) with `events` and
    `follow_lists(workload.seed, users=workload.users, followers=followers)`, the very data of the
    seed's `obj` and `user_like_agg`. pgbench runs as `sv_reader` with the intersection script's
    draws: objects `random_gaussian(1, objects, gaussian)`, users uniform in 1..followers. See
    `bench_streamviews.run_social_queries`.

    Args:
        seconds: pgbench duration per query.
        events: the like events, as replayed by the seed intersection baseline.
        clients: pgbench clients.
        workload: the workload's settings (seed, users, objects, Gaussian parameter).
        followers: users 1..followers have follow lists.
        postgres: where Postgres is.
    """
    run = bench_streamviews.run_social_queries(
        seconds, events=events, clients=clients, workload=workload, followers=followers, postgres=postgres
    )
    return SocialQueryFigures(
        run.like_count_tps,
        run.likers_tps,
        run.friends_who_like_tps,
        liked_objects=run.liked_objects,
        followers=run.followers,
        follow_edges=run.follow_edges,
        matches_seed=run.matches_seed,
        load_seconds=run.likes_load.seconds + run.follows_load.seconds,
        load_changes=run.likes_load.changes + run.follows_load.changes,
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m loadgen.bench_social`."""
    defaults = BenchSettings()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=defaults.events, help="like events (BENCH_EVENTS)")
    parser.add_argument("--seconds", type=int, default=defaults.seconds, help="each pgbench run (BENCH_SECONDS)")
    parser.add_argument("--clients", type=int, default=defaults.clients, help="pgbench clients (BENCH_CLIENTS)")
    parser.add_argument("--followers", type=int, default=defaults.followers, help="follow lists (BENCH_FOLLOWERS)")
    parser.add_argument(
        "--workers", type=int, default=defaults.workers, help="pipeline processes in one group (BENCH_WORKERS)"
    )
    parser.add_argument("--json", type=Path, help="also write the figures and samples there (for bench_all)")
    args = parser.parse_args(argv)
    if not 0 < args.workers <= defaults.partitions:
        parser.error(f"--workers must be 1..{defaults.partitions} (the bench topic's partitions)")

    configure_logging()
    workload, kafka, postgres = WorkloadSettings(), KafkaSettings(), PostgresSettings()
    log.info("start", **vars(args), workload=workload.model_dump(), kafka=kafka.describe())
    if not seed.pgbench_available():
        log.warning("pgbench not found; its figures will fail", pgbench=seed.PGBENCH)

    events = list(
        islice(
            workload_likes(workload),
            args.events,
        )
    )
    actions = Counter(e.action for e in events)
    results = Results()
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    topic = seed.unique_name("bench-likes", "-")
    create_topic(admin, topic, defaults.partitions)
    try:

        def produce() -> float:
            report = EventSource(topic, events, encode_like, kafka=kafka, count=len(events)).run()
            if report.errors:
                raise seed.BenchmarkError(f"producer: {report.errors} delivery errors, first: {report.first_error}")
            return report.rate

        results.measure("producer", produce)
        if "producer" in results.values:
            # Median of a few passes: a read of this size lasts about a second, and a shared VM's steal
            # time can halve a single pass.
            for key, decode in (("consumer", False), ("consumer_json", True)):
                results.measure(
                    key,
                    lambda decode=decode: statistics.median(
                        seed.bare_consumer_rate(topic, len(events), kafka=kafka, decode=decode)
                        for _ in range(CONSUMER_PASSES)
                    ),
                )
        for key, synchronous in (("per_event", True), ("per_event_async", False)):
            results.measure(
                key,
                lambda synchronous=synchronous: seed.seed_per_event_eps(
                    seed.unique_name("bench"),
                    args.seconds,
                    users=workload.users,
                    objects=workload.objects,
                    gaussian=workload.gaussian,
                    clients=args.clients,
                    synchronous_commit=synchronous,
                    settings=postgres,
                ),
            )
        results.measure(
            "copy",
            lambda: seed.raw_copy_rows_per_second(seed.unique_name("bench"), seed.like_rows(events), settings=postgres),
        )
        results.measure(
            "pk_read",
            lambda: seed.pk_read_tps(
                seed.unique_name("bench"), args.seconds, rows=workload.objects, clients=args.clients, settings=postgres
            ),
        )
        intersection = results.measure(
            "intersection",
            lambda: seed.seed_intersection_tps(
                seed.unique_name("bench"),
                args.seconds,
                events,
                follow_lists(workload.seed, users=workload.users, followers=args.followers),
                objects=workload.objects,
                followers=args.followers,
                gaussian=workload.gaussian,
                clients=args.clients,
                settings=postgres,
            ),
        )
        if intersection is not None:
            results.values["intersection"] = intersection.tps
        pipeline = results.measure(
            "pipeline",
            lambda: measure_pipeline(
                topic,
                events,
                workload=workload,
                kafka=kafka,
                postgres=postgres,
                seconds=args.seconds,
                workers=args.workers,
            ),
        )
        if pipeline is not None:
            results.values["pipeline"] = pipeline.likes_per_second
            results.values["freshness_p50"] = pipeline.freshness_p50_ms
            results.values["freshness_p99"] = pipeline.freshness_p99_ms
        social = results.measure(
            "social",
            lambda: measure_social_queries(
                args.seconds,
                events=events,
                clients=args.clients,
                workload=workload,
                followers=args.followers,
                postgres=postgres,
            ),
        )
        if social is not None:
            results.values["like_count"] = social.like_count_tps
            results.values["likers"] = social.likers_tps
            results.values["friends_who_like"] = social.friends_who_like_tps
        for key in ("freshness_p50", "freshness_p99"):
            results.notes[key] = results.notes.get("pipeline", "(pending)")
        for key in ("like_count", "likers", "friends_who_like"):
            results.notes[key] = results.notes.get("social", "(pending)")
    finally:
        for future in admin.delete_topics([topic]).values():
            try:
                future.result(30)
            except Exception:  # reported, never masks the run's own outcome
                log.exception("could not delete bench topic", topic=topic)

    facts = seed.postgres_facts(postgres)
    print(
        f"\nlikes/follows benchmark ({os.cpu_count()} cores; PostgreSQL {facts.get('server_version')},"
        f" synchronous_commit={facts.get('synchronous_commit')}, shared_buffers={facts.get('shared_buffers')})"
    )
    print(
        f"  workload: {len(events):,} like events ({actions['unlike']:,} unlikes), users 1..{workload.users:,},"
        f" objects random_gaussian(1, {workload.objects:,}, {workload.gaussian});"
        f" pgbench {args.clients} clients -j 2 -M prepared -T {args.seconds}"
    )
    if intersection is not None:
        print(
            f"  intersection tables: {intersection.liked_objects:,} liked objects,"
            f" {intersection.followers:,} follow lists ({intersection.follow_edges:,} follows);"
            f" {intersection.hit_ratio:.0%} of queried objects are liked"
        )
    table = [
        ("producer, workload.py -> Kafka (msgs/s)", "producer"),
        ("bare consumer, ceiling (msgs/s, median of 3)", "consumer"),
        ("bare consumer + orjson.loads (msgs/s, median of 3)", "consumer_json"),
        ("seed per-event f_obj, pgbench (events/s)", "per_event"),
        ("  same, synchronous_commit=off (events/s)", "per_event_async"),
        ("raw binary COPY, unindexed (rows/s)", "copy"),
        (f"streamviews likes pipeline x{args.workers}, end to end (likes/s)", "pipeline"),
        ("  freshness p50 (ms)", "freshness_p50"),
        ("  freshness p99 (ms)", "freshness_p99"),
        ("pgbench plain PK read (tps)", "pk_read"),
        ("pgbench seed array_intersect (tps)", "intersection"),
        ("pgbench social.like_count (tps)", "like_count"),
        ("pgbench social.likers (tps)", "likers"),
        ("pgbench social.friends_who_like (tps)", "friends_who_like"),
    ]
    ratios = (
        ("raw COPY / seed per-event", "copy", "per_event"),
        ("raw COPY / seed per-event, synchronous_commit=off", "copy", "per_event_async"),
        ("pipeline / seed per-event", "pipeline", "per_event"),
        ("pipeline / seed per-event, synchronous_commit=off", "pipeline", "per_event_async"),
        ("pipeline / raw COPY (share of Postgres ceiling)", "pipeline", "copy"),
        ("pipeline / bare consumer (share of Kafka ceiling)", "pipeline", "consumer"),
        ("social.like_count / plain PK read", "like_count", "pk_read"),
        ("social.likers / plain PK read", "likers", "pk_read"),
        ("social.friends_who_like / seed array_intersect", "friends_who_like", "intersection"),
    )
    if args.json:
        write_json(args.json, results, table, ratios, pipeline, len(events))
    print()
    for label, key in table:
        print(f"  {label:<52}{results.show(key):>16}")
    print("\n  ratios")
    for label, numerator, denominator in ratios:
        target = TARGETS.get((numerator, denominator))
        verdict = f"    {results.verdict(numerator, denominator, target)}" if target is not None else ""
        print(f"  {label:<52}{results.ratio(numerator, denominator):>16}{verdict}")
    notes = []
    if pipeline is not None:
        notes.append(
            f"pipeline likes/s (headline) counts from its first committed batch to its last, process start-up"
            f" excluded: {len(events) - (pipeline.first_committed or 0):,} likes in {pipeline.drain_seconds:.2f}s"
            f" after {pipeline.startup_seconds:.2f}s of start-up (interpreter, group join, first batches of"
            f" {pipeline.first_committed:,}); from process start: {pipeline.likes_per_second_with_startup:,.0f} likes/s"
        )
        notes.append(
            f"freshness: {pipeline.markers:,} marker likes (one every 20 ms) while producing"
            f" {pipeline.freshness_rate:,.0f} likes/s (half the headline) for {args.seconds}s; latency = first seen"
            f" in object_likes (polled every 5 ms) - handed to the producer"
        )
        if pipeline.steady_batches:
            notes.append(
                f"pipeline batches: {pipeline.batches:,} in the run; after the backlog {pipeline.steady_batches:,}"
                f" batches of {(pipeline.steady_records or 0) / pipeline.steady_batches:,.0f} records on average,"
                f" one per {1000 * args.seconds / pipeline.steady_batches:,.0f} ms of steady load"
            )
        for phase, cores in (pipeline.cpu or {}).items():
            notes.append(
                f"cores busy ({phase}, of {os.cpu_count()}): "
                + ", ".join(f"{role} {value:.2f}" for role, value in cores.items())
                + ("  (bench = this process: producer and marker poller)" if phase == "steady" else "")
            )
    if social is not None:
        same = "yes" if social.matches_seed else "NO"
        notes.append(
            f"social functions: copies of sql/functions/social.sql over views holding {social.liked_objects:,} liked"
            f" objects and {social.followers:,} follow lists ({social.follow_edges:,} follows), same as the"
            f" intersection tables: {same}; loaded through the engine ({social.load_changes:,} changes in"
            f" {social.load_seconds:.0f}s), then vacuumed; pgbench as sv_reader, objects drawn as the likes, users"
            f" uniform in 1..{args.followers:,}"
        )
    if notes:
        print("\n  notes")
        for note in notes:
            print(f"  - {note}")
    print(
        f"\n  the seed article's own figures (its server, 128-256 clients): f_obj {SEED_ARTICLE['per_event']:,}/s,"
        f" like_cnt read {SEED_ARTICLE['pk_read']:,}/s, array_intersect {SEED_ARTICLE['intersection']:,}/s"
    )
    return 1 if any(note.startswith("failed") for note in results.notes.values()) else 0


def write_json(
    path: Path, results: Results, table: Sequence, ratios: Sequence, pipeline: PipelineFigures | None, events: int
) -> None:
    """The printed figures and ratios as JSON, with the drain's progress and the marker latencies."""
    comparisons = [Comparison(label, n, d, TARGETS.get((n, d))) for label, n, d in ratios]
    comparisons.append(Comparison("freshness p99 under sustained load", "freshness_p99", limit=1000.0, unit="ms"))
    series: dict = {}
    if pipeline is not None:
        label, first = "likes pipeline, Kafka -> views (bench_social)", pipeline.first_commit_s or 0.0
        series["drains"] = {
            "likes": drain_series(pipeline.drain_samples, label=label, total=events, first_commit=first)
        }
        series["freshness_ms"] = {"likes": {"label": "likes pipeline", "values": list(pipeline.latencies_ms)}}
    write_figures(path, figures_document("social", results, table, comparisons, series=series))


if __name__ == "__main__":
    sys.exit(main())
