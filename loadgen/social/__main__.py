"""Likes/follows side by side: the seed's approaches, the ceilings, and streamviews, on the same events.

One run measures, on this machine's Kafka and PostgreSQL:

1. the producer writing `--events` likes of the seed's workload to a fresh `bench-likes-<id>` topic;
2. a bare consumer reading them back (the ceiling of any Kafka pipeline), with and without JSON;
3. the seed's per-event function `f_obj` under pgbench, with durable commits and with
   `synchronous_commit=off` (PipelineDB's stream inserts were not durable per event);
4. one binary COPY of the same rows into an unindexed table (the ceiling of any Postgres sink);
5. pgbench of a plain primary-key read, and of the seed's `array_intersect` query over tables filled
   with the workload (likes from the Gaussian hot spot, `--followers` follow lists with the long tail);
6. streamviews itself (`loadgen.social.streamviews`): the likes pipeline end to end on the bench
   topic (throughput, then freshness under a steady load at half that rate for `--seconds`), and
   pgbench of the social query functions over views holding the same likes and follow lists as step 5.

Every schema and topic is throwaway and dropped afterwards; the real `likes`/`follows` topics and the
`social` schema are never touched. Figures and side-by-side ratios only: a miss never fails the command.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter
from itertools import islice

from confluent_kafka.admin import AdminClient

from loadgen.common import cli
from loadgen.common.drain import cores_text
from loadgen.common.kafka import bare_consumer_rate, produce_all
from loadgen.common.postgres import PGBENCH, pgbench_available
from loadgen.common.report import BenchResult, Comparison, Results, drain_series, machine_line
from loadgen.common.seed import (
    like_rows,
    pk_read_tps,
    raw_copy_rows_per_second,
    seed_intersection_tps,
    seed_per_event_eps,
)
from loadgen.common.throwaway import create_topic, delete_topic, unique_name
from loadgen.social.streamviews import PipelineRun, SocialRun, run_pipeline, run_social_queries
from loadgen.workloads.social import WorkloadSettings, encode_like, follow_lists, workload_likes
from pipelines.logs import get_logger
from pipelines.settings import KafkaSettings, PostgresSettings

log = get_logger("loadgen.social")

CONSUMER_PASSES = 3  # a read lasts about a second: the median of a few passes, against a shared VM's steal time
PARTITIONS = 6


def figure_rows(workers: int) -> list[tuple[str, str]]:
    """The figures, (label, key), in the order printed."""
    return [
        ("producer, the seed's likes -> Kafka (msgs/s)", "producer"),
        ("bare consumer, ceiling (msgs/s, median of 3)", "consumer"),
        ("bare consumer + orjson.loads (msgs/s, median of 3)", "consumer_json"),
        ("seed per-event f_obj, pgbench (events/s)", "per_event"),
        ("  same, synchronous_commit=off (events/s)", "per_event_async"),
        ("raw binary COPY, unindexed (rows/s)", "copy"),
        (f"streamviews likes pipeline x{workers}, end to end (likes/s)", "pipeline"),
        ("  freshness p50 (ms)", "freshness_p50"),
        ("  freshness p99 (ms)", "freshness_p99"),
        ("pgbench plain PK read (tps)", "pk_read"),
        ("pgbench seed array_intersect (tps)", "intersection"),
        ("pgbench social.like_count (tps)", "like_count"),
        ("pgbench social.likers (tps)", "likers"),
        ("pgbench social.friends_who_like (tps)", "friends_who_like"),
    ]


COMPARISONS = [
    Comparison("raw COPY / seed per-event", "copy", "per_event"),
    Comparison("raw COPY / seed per-event, synchronous_commit=off", "copy", "per_event_async"),
    Comparison("pipeline / seed per-event", "pipeline", "per_event"),
    Comparison("pipeline / seed per-event, synchronous_commit=off", "pipeline", "per_event_async"),
    Comparison("pipeline / raw COPY (share of Postgres ceiling)", "pipeline", "copy"),
    Comparison("pipeline / bare consumer (share of Kafka ceiling)", "pipeline", "consumer"),
    Comparison("social.like_count / plain PK read", "like_count", "pk_read", target=0.9),
    Comparison("social.likers / plain PK read", "likers", "pk_read", target=0.9),
    Comparison("social.friends_who_like / seed array_intersect", "friends_who_like", "intersection"),
    Comparison("freshness p99 under sustained load", "freshness_p99", limit=1000.0, unit="ms"),
]


def measure(args: argparse.Namespace) -> BenchResult:
    """Every step of the module's docstring, each failure noted without hiding the other figures."""
    workload, kafka, postgres = WorkloadSettings(), KafkaSettings(), PostgresSettings()
    log.info("start", **vars(args), kafka=kafka.describe())
    if not pgbench_available():
        log.warning("pgbench not found; its figures will fail", pgbench=PGBENCH)
    events = list(islice(workload_likes(workload), args.events))
    results = Results()
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    topic = unique_name("bench-likes", "-")
    create_topic(admin, topic, PARTITIONS)
    pipeline: PipelineRun | None = None
    social: SocialRun | None = None
    try:
        results.measure("producer", lambda: produce_all(topic, events, encode_like, kafka))
        if "producer" in results.values:
            for key, decode in (("consumer", False), ("consumer_json", True)):
                results.measure(
                    key,
                    lambda decode=decode: statistics.median(
                        bare_consumer_rate(topic, len(events), kafka=kafka, decode=decode)
                        for _ in range(CONSUMER_PASSES)
                    ),
                )
        for key, synchronous in (("per_event", True), ("per_event_async", False)):
            results.measure(
                key,
                lambda synchronous=synchronous: seed_per_event_eps(
                    unique_name("bench"),
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
            "copy", lambda: raw_copy_rows_per_second(unique_name("bench"), like_rows(events), settings=postgres)
        )
        results.measure(
            "pk_read",
            lambda: pk_read_tps(
                unique_name("bench"), args.seconds, rows=workload.objects, clients=args.clients, settings=postgres
            ),
        )
        intersection = results.measure(
            "intersection",
            lambda: seed_intersection_tps(
                unique_name("bench"),
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
            lambda: run_pipeline(
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
            lambda: run_social_queries(
                args.seconds,
                events=events,
                clients=args.clients,
                workload=workload,
                followers=args.followers,
                postgres=postgres,
            ),
        )
        if social is not None:
            results.values |= {
                "like_count": social.like_count_tps,
                "likers": social.likers_tps,
                "friends_who_like": social.friends_who_like_tps,
            }
        results.same_note(["freshness_p50", "freshness_p99"], "pipeline")
        results.same_note(["like_count", "likers", "friends_who_like"], "social")
    finally:
        delete_topic(admin, topic)

    actions = Counter(e.action for e in events)
    header = [
        f"likes/follows benchmark ({machine_line(postgres)})",
        f"  workload: {len(events):,} like events ({actions['unlike']:,} unlikes), users 1..{workload.users:,},"
        f" objects random_gaussian(1, {workload.objects:,}, {workload.gaussian});"
        f" pgbench {args.clients} clients -j 2 -M prepared -T {args.seconds}",
    ]
    if intersection is not None:
        header.append(
            f"  intersection tables: {intersection.liked_objects:,} liked objects, {intersection.followers:,}"
            f" follow lists ({intersection.follow_edges:,} follows); {intersection.hit_ratio:.0%} of queried"
            " objects are liked"
        )
    series: dict = {}
    if pipeline is not None:
        label = "likes pipeline, Kafka -> views (loadgen.social)"
        drain = pipeline.drain
        series["drains"] = {
            "likes": drain_series(drain.samples, label=label, total=len(events), first_commit=drain.startup_seconds)
        }
        series["freshness_ms"] = {"likes": {"label": "likes pipeline", "values": list(pipeline.latencies_ms)}}
    return BenchResult.of(
        "social",
        results,
        figure_rows(args.workers),
        comparisons=COMPARISONS,
        header=header,
        notes=notes(args, pipeline, social),
        series=series,
    )


def notes(args: argparse.Namespace, pipeline: PipelineRun | None, social: SocialRun | None) -> list[str]:
    """What the figures mean: where the pipeline's clock starts, its batches and cores, what the queries read."""
    out = []
    if pipeline is not None:
        drain, load = pipeline.drain, pipeline.load
        out.append(
            f"pipeline likes/s (headline) from its first committed batch: {drain.describe(pipeline.events, 'likes')}"
        )
        out.append(
            f"freshness: {load.markers:,} marker likes (one every 20 ms) while producing {load.rate:,.0f} likes/s"
            f" (half the headline) for {args.seconds}s; latency = first seen in object_likes (polled every 5 ms)"
            " - handed to the producer"
        )
        if pipeline.steady_batches:
            out.append(
                f"pipeline batches: {pipeline.totals.get('batches', 0):,} in the run; after the backlog"
                f" {pipeline.steady_batches:,} batches of"
                f" {(pipeline.steady_records or 0) / pipeline.steady_batches:,.0f} records on average, one per"
                f" {1000 * args.seconds / pipeline.steady_batches:,.0f} ms of steady load"
            )
        if pipeline.cpu_steady is not None:
            steady = pipeline.cpu_steady.cores_since(drain.cpu_done)
            out.append(f"cores busy (steady): {cores_text(steady)}  (bench = this process: producer and marker poller)")
    if social is not None:
        changes, load = social.load
        out.append(
            f"social functions: copies of sql/functions/social.sql over views holding {social.liked_objects:,} liked"
            f" objects and {social.followers:,} follow lists ({social.follow_edges:,} follows), same as the"
            f" intersection tables: {'yes' if social.matches_seed else 'NO'}; loaded through the engine"
            f" ({changes:,} changes in {load:.0f}s), then vacuumed; pgbench as sv_reader, objects drawn as the"
            f" likes, users uniform in 1..{args.followers:,}"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m loadgen.social`."""
    parser = cli.parser(__doc__)
    parser.add_argument("--events", type=int, default=200_000, help="like events produced, consumed and copied")
    parser.add_argument("--seconds", type=int, default=20, help="each pgbench run, and the freshness phase")
    parser.add_argument("--clients", type=int, default=8, help="pgbench clients")
    # 20k follow lists hold ~4.1 M follows, loaded through the engine at ~40k changes/s on 2 cores.
    parser.add_argument("--followers", type=int, default=20_000, help="users with a follow list (the intersection)")
    parser.add_argument(
        "--workers", type=int, choices=range(1, PARTITIONS + 1), default=1, help="pipeline processes in one group"
    )
    return cli.run(parser, measure, "loadgen.social", argv)


if __name__ == "__main__":
    sys.exit(main())
