"""Likes at size: what the likes pipeline sustains while its state grows to tens of millions of likes.

`--quick`: 1 M likes, 200 k follows, 10 s. One run, on throwaway topics and a throwaway schema
`bench_<id>` holding copies of the social streams and views of sql/views/social.sql
(`loadgen.common.social_copies`); the real `likes`/`follows` topics and `social` schema are never touched.

1. Disk: the run's needs are estimated from the bytes per like measured at 1 M likes and compared
   with the free space; not enough is a one-line refusal.
2. Follows: the seed's follow lists (long tail, some unfollows) until `--follows` are in force,
   produced to their topic, then drained by a stream runner (`--streams <follows copy>`).
3. Likes backlog: the seed's likes (users 1..10 M, objects `random_gaussian(1, 2 M, 10.0)`, 5 %
   unlikes and 2 % repeated likes) until `--likes` pairs are in
   force, produced in chunks of `--chunk` before any runner reads them (`loadgen.likes_at_size.backlog`
   says why: the 2 cores, and no pauses that would let autovacuum catch up for free).
4. Fill: one stream runner process (`--workers N`: N in one consumer group, as `docker compose up
   --scale streams=N` runs them; their cores are summed, PSS is the first one's), the production code
   path (`python -m pipelines.cv.runner --streams <likes copy> --group <bench group>`, default batch
   settings) drains the backlog while
   `loadgen.likes_at_size.sampling` samples every `--sample-s`: likes in the state, events committed, the
   runner's PSS, CPU and the load average. The curve is likes/s per million likes of state. Then the
   state is counted and checked against the backlog's own count.
5. Freshness: with the same runner, the workload goes on at half the rate sustained over the fill's
   last tenth for `--seconds`, a marker like every 20 ms timed until visible (`loadgen.common.freshness`).
6. At full size: table and index sizes; the seed's per-event function
   `f_obj` under pgbench (durable commits, 8 clients) on a table holding the same likes, copied by
   INSERT ... SELECT from the bench `object_likes` (not built through f_obj: that would take hours).
7. Everything is dropped.

Output: the printed report and, with `--json` (default bench-results/likes_at_size.json: a fill of
40 minutes always keeps its figures), the result's JSON line: its figures, `series.likes_at_size`
(the curve's points, as make bench plots them) and, in `extra`, the run's document: `curve` (each
million likes: likes/s, state growth, PSS, cores, load), `samples`, `fill`, `follows`, `producer`,
`freshness_ms`, `sizes` (tables and indexes), `peak_pss_mib`, `seed_per_event` and `errors`.

`likes_per_s` counts every like event applied (likes, unlikes, repeated likes: the pipeline's
throughput, as the social benchmark's headline); `state_growth_per_s` counts likes added to the state.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka.admin import AdminClient
from psycopg import sql

from loadgen.common import cli
from loadgen.common.drain import DrainProgress
from loadgen.common.errors import BenchmarkError
from loadgen.common.freshness import MARKER_BASE, MarkerProbe, SteadyLoad, likes_freshness, percentile
from loadgen.common.postgres import owner_conninfo
from loadgen.common.processes import PipelineWorkers
from loadgen.common.report import BenchResult, machine_line
from loadgen.common.seed import seed_per_event_eps
from loadgen.common.social_copies import StreamCopy, bench_views
from loadgen.common.throwaway import create_topic, delete_topic, forget_group, unique_name
from loadgen.likes_at_size import report
from loadgen.likes_at_size.backlog import LikesBacklog, Produced, produce_follows
from loadgen.likes_at_size.sampling import (
    DISK_MARGIN,
    PssWatch,
    count_rows,
    curve,
    curve_step,
    data_directory,
    disk_estimate,
    free_bytes,
    sample_fill,
    storage_sizes,
    storage_tables,
    tail_rate,
    topic_ends,
)
from loadgen.workloads.social import WorkloadSettings
from pipelines.logs import get_logger
from pipelines.settings import ROLE_READER, ROLE_WRITER, KafkaSettings, PostgresSettings

log = get_logger("loadgen.likes_at_size")

FRESHNESS_SHARE = 0.5  # of the last curve point's rate
MARKER_TIMEOUT_S = 30.0
NET_LIKES_PER_EVENT = 0.88  # 93 % new likes, 5 % unlikes, 2 % repeats: events needed per like in force
QUICK = {"likes": 1_000_000, "follows": 200_000, "seconds": 10}
DEFAULT_OUT = Path("bench-results/likes_at_size.json")


class AtSizeRun:
    """One run: its throwaway names, its settings, and the document it fills phase by phase."""

    def __init__(self, args: argparse.Namespace, workload: WorkloadSettings, kafka: KafkaSettings) -> None:
        self.args, self.workload, self.kafka = args, workload, kafka
        self.postgres = PostgresSettings()
        self.schema = unique_name("bench")
        self.follows_stream = f"{self.schema}_follows"
        prefix = self.schema.replace("_", "-")
        self.likes_topic, self.follows_topic = f"{prefix}-likes", f"{prefix}-follows"
        self.group = f"{prefix}-at-size"
        self.owner = owner_conninfo(self.postgres)
        # The runners' sessions: named for this run alone, looked at as their own role (which alone sees their state).
        self.application_name = f"streamviews-at-size-{self.schema}"
        self.writer = self.postgres.conninfo(user=ROLE_WRITER, application_name="streamviews-bench-sampler")
        self.doc: dict[str, Any] = {"errors": {}}

    def run(self) -> None:
        """Every phase in order; the topics and definitions are dropped at the end."""
        admin = AdminClient({"bootstrap.servers": self.kafka.bootstrap_servers})
        for topic in (self.likes_topic, self.follows_topic):
            create_topic(admin, topic, self.args.partitions)
        copies = [
            StreamCopy("likes", self.schema, self.likes_topic, self.group),
            StreamCopy("follows", self.follows_stream, self.follows_topic, self.group),
        ]
        try:
            with bench_views(self.schema, copies, self.postgres) as views:
                log.info("bench views", schema=self.schema, views=views, group=self.group)
                self._phases()
        finally:
            forget_group(self.owner, self.group, self.likes_topic, self.kafka)
            forget_group(self.owner, self.group, self.follows_topic, self.kafka)
            for topic in (self.likes_topic, self.follows_topic):
                delete_topic(admin, topic)

    def _phases(self) -> None:
        self.follows()
        backlog = LikesBacklog(self.likes_topic, self.args.partitions, self.workload)
        self.produce_likes(backlog)
        runner = self.runner(self.likes_topic, self.schema, self.args.workers)
        watch = PssWatch(runner.workers[0].process.pid)
        watch.start()
        try:
            self.fill(runner, backlog)
            self.optional("freshness", lambda: self.freshness(runner, backlog))
        finally:
            code = runner.stop()
            watch.stop()
            self.doc["peak_pss_mib"] = round(watch.peak_mib, 1)
            self.doc["runner"] = {"exit_code": code, "log": str(runner.log_paths[0]), "totals": runner.totals()[0]}
        with psycopg.connect(self.owner, autocommit=True) as conn:
            self.doc["sizes"] = storage_sizes(
                conn, storage_tables(conn, self.schema, [self.schema, self.follows_stream])
            )
        self.optional("seed_per_event", self.seed_per_event)

    def runner(self, topic: str, stream: str, workers: int = 1) -> PipelineWorkers:
        """`workers` stream runners (one group) on a bench stream, default batches, sessions named for the run."""
        settings = {"PGAPPNAME": self.application_name}
        return PipelineWorkers(
            workers,
            topic=topic,
            stream=stream,
            group=self.group,
            postgres=self.postgres,
            kafka=self.kafka,
            settings=settings,
        )

    def optional(self, key: str, step: Any) -> None:
        """A phase whose failure leaves the others' figures: its error goes to the document's `errors`."""
        try:
            step()
        except Exception as e:
            log.exception("phase failed", phase=key)
            self.doc["errors"][key] = str(e).splitlines()[0][:200] if str(e) else type(e).__name__

    def follows(self) -> None:
        """Step 2: the follow lists, produced, then drained by a runner of their own."""
        produced = produce_follows(
            self.follows_topic, self.args.partitions, self.args.follows, self.workload, self.kafka
        )
        log.info("follows produced", events=produced.produced.events, follows=produced.follows, lists=produced.lists)
        runner = self.runner(self.follows_topic, self.follows_stream)
        try:
            ends = topic_ends(self.follows_topic, produced.produced.events, self.kafka)
            with psycopg.connect(self.writer, autocommit=True) as conn:
                fill = sample_fill(
                    conn, runner, ends, None, application_name=self.application_name, sample_s=self.args.sample_s
                )
        finally:
            runner.stop()
        with psycopg.connect(self.owner, autocommit=True) as conn:
            stored = count_rows(conn, self.follows_stream)
        self.doc["follows"] = {
            "events": produced.produced.events,
            "follows_in_state": stored,
            "expected": produced.follows,
            "lists": produced.lists,
            "longest_list": produced.longest,
            "follows_per_s": round(fill.rate, 1) if fill.rate else None,
            "startup_s": round(fill.first_commit_s or 0, 2),
            "producer_events_per_s": round(produced.produced.rate),
        }
        if stored != produced.follows:
            raise BenchmarkError(f"follows: the state holds {stored:,}, the events leave {produced.follows:,}")

    def produce_likes(self, backlog: LikesBacklog) -> None:
        """Step 3: the likes backlog, chunk by chunk, before any runner reads it."""

        def on_chunk(b: LikesBacklog, chunk: Produced) -> None:
            log.info("likes produced", events=b.produced, likes=b.likes, chunk_rate=round(chunk.rate))

        produced = backlog.produce(self.args.likes, self.args.chunk, self.kafka, on_chunk)
        self.doc["producer"] = {
            "events": produced.events,
            "seconds": round(produced.seconds, 1),
            "events_per_s": round(produced.rate),
            "partitions": self.args.partitions,
            "actions": dict(backlog.actions),
        }

    def fill(self, runner: PipelineWorkers, backlog: LikesBacklog) -> None:
        """Step 4: the runner drains the backlog while it is sampled; the curve; the state counted."""
        progress = DrainProgress(self.likes_topic, backlog.produced)
        with psycopg.connect(self.writer, autocommit=True) as sampling:
            fill = sample_fill(
                sampling,
                runner,
                topic_ends(self.likes_topic, backlog.produced, self.kafka),
                backlog.likes_at,
                application_name=self.application_name,
                sample_s=self.args.sample_s,
                on_sample=lambda sample: progress(sample.events, time.monotonic()),
            )
        with psycopg.connect(self.owner, autocommit=True) as conn:
            stored = count_rows(conn, self.schema)
            viewed = conn.execute(
                sql.SQL("SELECT coalesce(sum(like_count), 0)::bigint FROM {}.object_likes").format(
                    sql.Identifier(self.schema)
                )
            ).fetchone()[0]
        self.doc["curve"] = curve(fill.samples, curve_step(self.args.likes), fill.first_commit_s)
        first, last, sustained = fill.first, fill.last, tail_rate(fill.samples)
        self.doc["fill"] = {
            "events": backlog.produced,
            "likes_in_state": stored,
            "likes_in_object_likes": viewed,
            "expected_likes": backlog.likes,
            "startup_s": round(fill.first_commit_s or 0, 2),
            "seconds": round(last.elapsed_s - first.elapsed_s, 1),
            "likes_per_s": round(fill.rate, 1) if fill.rate else None,
            "sustained_likes_per_s": round(sustained, 1) if sustained else None,
            "pss_mib_first": round(first.pss_mib, 1),
            "pss_mib_last": round(last.pss_mib, 1),
            "cores": last.cpu.cores_since(first.cpu),
        }
        self.doc["samples"] = [
            [round(s.elapsed_s, 2), s.events, s.likes, round(s.pss_mib, 1), round(s.load[0], 2)] for s in fill.samples
        ]
        if stored != backlog.likes or viewed != backlog.likes:
            raise BenchmarkError(
                f"likes: the state holds {stored:,} and object_likes {viewed:,}; the events leave {backlog.likes:,}"
            )

    def freshness(self, runner: PipelineWorkers, backlog: LikesBacklog) -> None:
        """Step 5: markers under a steady load at half the sustained rate, with the runner that filled the state."""
        rate = FRESHNESS_SHARE * (self.doc["fill"]["sustained_likes_per_s"] or self.doc["curve"][-1]["likes_per_s"])
        load = SteadyLoad(rate=rate, seconds=self.args.seconds)
        probe = MarkerProbe(
            self.postgres.conninfo(user=ROLE_READER, application_name="streamviews-bench-probe"), self.schema
        )
        latencies = likes_freshness(
            self.likes_topic,
            backlog.events,
            load,
            probe,
            users=self.workload.users,
            kafka=self.kafka,
            check_alive=runner.check_alive,
            timeout_s=MARKER_TIMEOUT_S,
        )
        self.doc["freshness_ms"] = {
            "p50": round(statistics.median(latencies), 1),
            "p99": round(percentile(latencies, 99), 1),
            "max": round(max(latencies), 1),
            "rate": round(rate, 1),
            "produced": load.produced,
            "markers": len(latencies),
            "seconds": self.args.seconds,
        }

    def seed_per_event(self) -> None:
        """Step 6: the seed's f_obj under pgbench, durable, on a table holding the views' likes."""
        schema = unique_name("bench")
        fill = [
            sql.SQL(
                "INSERT INTO {}.obj (id, who_like, like_cnt) SELECT oid, likers, like_count FROM {}.object_likes"
                " WHERE oid < {}"
            ).format(sql.Identifier(schema), sql.Identifier(self.schema), sql.Literal(MARKER_BASE)),
            sql.SQL("VACUUM (ANALYZE) {}.obj").format(sql.Identifier(schema)),
        ]
        eps = seed_per_event_eps(
            schema,
            self.args.seconds,
            users=self.workload.users,
            objects=self.workload.objects,
            gaussian=self.workload.gaussian,
            clients=self.args.clients,
            settings=self.postgres,
            prefill=fill,
        )
        self.doc["seed_per_event"] = round(eps, 1)


def measure(args: argparse.Namespace) -> BenchResult:
    """The disk check, then every phase; the figures measured so far even when a phase fails."""
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    workload, kafka, postgres = WorkloadSettings(), KafkaSettings(), PostgresSettings()
    events = int(args.likes / NET_LIKES_PER_EVENT)
    needed = int(disk_estimate(args.likes, args.follows, events + args.follows) * DISK_MARGIN)
    with psycopg.connect(owner_conninfo(postgres), autocommit=True) as conn:
        where = data_directory(conn)
    free = free_bytes(where)
    print(f"disk: this run needs about {needed / 2**30:.1f} GiB (estimate), {free / 2**30:.1f} GiB free on {where}")
    if needed > free:
        raise BenchmarkError(f"not enough disk: ~{needed / 2**30:.1f} GiB needed, {free / 2**30:.1f} free")
    run = AtSizeRun(args, workload, kafka)
    started = time.monotonic()
    run.doc.update(
        benchmark="likes_at_size",
        machine=machine_line(postgres),
        date=datetime.now(UTC).isoformat(timespec="seconds"),
        settings={
            **{
                k: getattr(args, k)
                for k in ("likes", "follows", "seconds", "chunk", "sample_s", "partitions", "workers")
            },
            "workload": asdict(workload),
            "disk_estimate_bytes": needed,
        },
    )
    try:
        run.run()
    except Exception as e:  # the figures measured so far are still written and shown
        log.exception("run failed")
        run.doc["errors"]["run"] = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
    run.doc["wall_s"] = round(time.monotonic() - started, 1)
    return report.result(run.doc)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m loadgen.likes_at_size`."""
    parser = cli.parser(__doc__)
    parser.add_argument("--likes", type=int, default=20_000_000, help="likes in force to fill the state with")
    parser.add_argument("--follows", type=int, default=2_000_000, help="follows in force (the seed's long tail)")
    parser.add_argument("--seconds", type=int, default=30, help="the freshness phase, and the seed's pgbench run")
    parser.add_argument("--chunk", type=int, default=1_000_000, help="events per production step of the backlog")
    parser.add_argument("--sample-s", type=float, default=2.0, help="seconds between samples of the fill")
    parser.add_argument("--partitions", type=int, default=6, help="partitions of the bench topics")
    parser.add_argument("--clients", type=int, default=8, help="pgbench clients for the seed's function")
    parser.add_argument(
        "--workers", type=int, default=1, help="stream runner processes on the likes (one group; 2 uses both cores)"
    )
    parser.add_argument("--quick", action="store_true", help="1 M likes, 200 k follows, 10 s: a check, not a figure")
    parser.set_defaults(json=DEFAULT_OUT)
    return cli.run(parser, measure, "loadgen.likes_at_size", argv)


if __name__ == "__main__":
    sys.exit(main())
