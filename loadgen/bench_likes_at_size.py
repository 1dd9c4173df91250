"""Likes at size: what the likes pipeline sustains while its state grows to tens of millions of likes.

`python -m loadgen.bench_likes_at_size [--likes 20000000] [--follows 2000000] [--seconds 30] [--keep] [--workers 1]`
(`--quick`: 1 M likes, 200 k follows, 10 s). One run, on throwaway topics and a throwaway schema
`bench_<id>` holding copies of the social streams and views of sql/views/social.sql
(`loadgen.social_copies`); the real `likes`/`follows` topics and `social` schema are never touched.

1. Disk: the run's needs are estimated from measured bytes per like and compared with the free space;
   not enough is a one-line refusal. The estimate is re-measured at 2 M likes (`DISK_CHECK_LIKES`).
2. Empty tables: one batch of 50,000 like events through the engine with each statement under
   EXPLAIN (ANALYZE, BUFFERS), rolled back (`loadgen.batch_probe`): the per-statement cost to compare
   with step 7.
3. Follows: the seed's follow lists (long tail, some unfollows) until `--follows` are in force,
   produced to their topic, then drained by a stream runner (`--streams <follows copy>`).
4. Likes backlog: the seed's likes (users 1..10 M, objects `random_gaussian(1, 2 M, 10.0)`, 5 %
   unlikes and 2 % repeated likes; `LOADGEN_*` variables change them) until `--likes` pairs are in
   force, produced in chunks of `--chunk` before any runner reads them (`loadgen.at_size_backlog`
   says why: the 2 cores, and no pauses that would let autovacuum catch up for free).
5. Fill: one stream runner process (`--workers N`: N in one consumer group, as `docker compose up
   --scale streams=N` runs them; their cores are summed, PSS is the first one's), the production code
   path (`python -m pipelines.cv.runner --streams <likes copy> --group <bench group>`, default batch
   settings) drains the backlog while
   `loadgen.at_size_sampling` samples every `--sample-s`: likes in the state, events committed, the
   runner's PSS, CPU, load average, and what its PostgreSQL backend is doing. The curve is likes/s
   per million likes of state. Then the state is counted and checked against the backlog's own count.
6. Freshness: with the same runner, the workload goes on at half the rate sustained over the fill's
   last tenth for `--seconds`, a marker like every 20 ms timed until visible (`loadgen.freshness`).
7. At full size: the batch of step 2 again; table and index sizes; the seed's per-event function
   `f_obj` under pgbench (durable commits, 8 clients) on a table holding the same likes, copied by
   INSERT ... SELECT from the bench `object_likes` (not built through f_obj: that would take hours).
8. Everything is dropped, unless `--keep`: the schema, streams, topics and offsets then stay, and the
   report says how to run a runner on them (to profile at size) and to drop them (`--drop <schema>`).

Output: a printed report, and `--out` (default bench-results/likes_at_size.json; `--json` is the same)::

    {"benchmark": "likes_at_size", "command": ..., "machine": "2 cores, ...; commit ...",
     "commit": ..., "date": ISO 8601, "finished": ISO 8601, "settings": {...},
     "curve": [{"likes_in_state": 1000000, "likes_per_s": 31000.0, "elapsed_s": 40.1,
                "events_consumed": ..., "state_growth_per_s": ..., "pss_mib": ..., "cores": {...}, "load1": ...}, ...],
     "points": [{"likes_in_state": ..., "likes_per_second": ...}, ...],    # the curve, as bench_all plots it
     "samples": [[elapsed_s, events_committed, likes_in_state, runner_pss_mib, load1], ...],  # every --sample-s
     "fill": {"sustained_likes_per_s": the last tenth's rate, "wal_bytes", ...}, "follows": {...}, "producer": {...},
     "freshness_ms": {"p50": ..., "p99": ..., "max": ..., "rate": likes/s, "markers": n, "seconds": s},
     "sizes": {"tables": {"state_bench_x": {"total_bytes", "index_bytes", "heap_bytes", "live_rows", ...}},
               "total_bytes": ..., "index_bytes": ...},
     "peak_pss_mib": MiB (the likes runner, sampled every second of its life),
     "seed_per_event": events/s, "seed_per_event_detail": {...},
     "load_average": {"min1", "median1", "max1", "samples": [[elapsed_s, load1, load5, load15], ...]},
     "backend_states": {"CPU": share, "IO:DataFileRead": share, ...},
     "statements": {"empty": [...], "full": [...]},   # loadgen.batch_probe, µs per event and plans
     "figures": [...], "comparisons": [...], "errors": {...}, "kept": null | {...}}

`likes_per_s` counts every like event applied (likes, unlikes, repeated likes: the pipeline's
throughput, as bench_social's headline); `state_growth_per_s` counts likes added to the state.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka.admin import AdminClient
from psycopg import sql

from loadgen import at_size_report as report
from loadgen import seed_baselines as seed
from loadgen.at_size_backlog import LikesBacklog, Produced, describe_actions, produce_follows
from loadgen.at_size_sampling import (
    DISK_CHECK_LIKES,
    DISK_MARGIN,
    PssWatch,
    Sample,
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
    wal_position,
)
from loadgen.batch_probe import probe_batch
from loadgen.bench_kept_drain import drop_kept
from loadgen.bench_report import machine_line
from loadgen.drain import DrainProgress
from loadgen.freshness import MARKER_BASE, MarkerProbe, SteadyLoad, likes_freshness, percentile
from loadgen.pipeline_processes import PipelineWorkers
from loadgen.seed_baselines import BenchmarkError
from loadgen.social_copies import StreamCopy, bench_views
from loadgen.throwaway import create_topic, delete_topic, forget_group
from loadgen.workload import WorkloadSettings, like_events
from pipelines.logs import configure_logging, get_logger
from pipelines.settings import ROLE_READER, ROLE_WRITER, KafkaSettings, PostgresSettings

log = get_logger("loadgen.bench_likes_at_size")

FRESHNESS_SHARE = 0.5  # of the last curve point's rate
MARKER_TIMEOUT_S = 30.0
PROBE_EVENTS = 50_000  # one full batch (PIPELINE_BATCH_MAX), as the runner applies them under a backlog
NET_LIKES_PER_EVENT = 0.88  # 93 % new likes, 5 % unlikes, 2 % repeats: events needed per like in force
QUICK = {"likes": 1_000_000, "follows": 200_000, "seconds": 10}
DEFAULT_OUT = Path("bench-results/likes_at_size.json")


class AtSizeRun:
    """One run: its throwaway names, its settings, and the document it fills phase by phase."""

    def __init__(self, args: argparse.Namespace, workload: WorkloadSettings, kafka: KafkaSettings) -> None:
        self.args, self.workload, self.kafka = args, workload, kafka
        self.postgres = PostgresSettings()
        self.schema = seed.unique_name("bench")
        self.follows_stream = f"{self.schema}_follows"
        prefix = self.schema.replace("_", "-")
        self.likes_topic, self.follows_topic = f"{prefix}-likes", f"{prefix}-follows"
        self.group = f"{prefix}-at-size"
        self.owner = seed.owner_conninfo(self.postgres)
        # The runners' sessions: named for this run alone, looked at as their own role (which alone sees their state).
        self.application_name = f"streamviews-at-size-{self.schema}"
        self.writer = self.postgres.conninfo(user=ROLE_WRITER, application_name="streamviews-bench-sampler")
        self.doc: dict[str, Any] = {"errors": {}, "kept": None}
        self.loads: list[list[float]] = []

    def run(self) -> None:
        """Every phase in order; the topics and definitions are dropped at the end unless `--keep`."""
        admin = AdminClient({"bootstrap.servers": self.kafka.bootstrap_servers})
        for topic in (self.likes_topic, self.follows_topic):
            create_topic(admin, topic, self.args.partitions)
        copies = [
            StreamCopy("likes", self.schema, self.likes_topic, self.group),
            StreamCopy("follows", self.follows_stream, self.follows_topic, self.group),
        ]
        try:
            with bench_views(self.schema, copies, self.postgres, keep=self.args.keep) as views:
                log.info("bench views", schema=self.schema, views=views, group=self.group)
                self._phases()
        finally:
            if self.args.keep:
                self.doc["kept"] = self.kept()
            else:
                forget_group(self.owner, self.group, self.likes_topic, self.kafka)
                forget_group(self.owner, self.group, self.follows_topic, self.kafka)
                for topic in (self.likes_topic, self.follows_topic):
                    delete_topic(admin, topic)

    def _phases(self) -> None:
        writer = self.postgres.conninfo(user=ROLE_WRITER, application_name="streamviews-bench-probe")
        empty_events = like_events(self.workload.seed + 1, users=self.workload.users, objects=self.workload.objects)
        self.optional(
            "statements_empty", lambda: self.probe(writer, "empty", [next(empty_events) for _ in range(PROBE_EVENTS)])
        )
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
        self.optional(
            "statements_full", lambda: self.probe(writer, "full", [next(backlog.events) for _ in range(PROBE_EVENTS)])
        )
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

    def probe(self, conninfo: str, phase: str, events: list[Any]) -> None:
        """Step 2 / 7: one batch's statements explained; stored under statements.empty / .full."""
        profiles = probe_batch(conninfo, self.schema, events)
        self.doc.setdefault("statements", {})[phase] = [p.as_dict(len(events)) for p in profiles]

    def follows(self) -> None:
        """Step 3: the follow lists, produced, then drained by a runner of their own."""
        produced = produce_follows(
            self.follows_topic, self.args.partitions, self.args.follows, self.workload, self.kafka
        )
        log.info("follows produced", events=produced.produced.events, follows=produced.follows, lists=produced.lists)
        runner = self.runner(self.follows_topic, self.follows_stream)
        watch = PssWatch(runner.workers[0].process.pid)
        watch.start()
        try:
            ends = topic_ends(self.follows_topic, produced.produced.events, self.kafka)
            with psycopg.connect(self.writer, autocommit=True) as conn:
                fill = sample_fill(
                    conn, runner, ends, None, application_name=self.application_name, sample_s=self.args.sample_s
                )
        finally:
            runner.stop()
            watch.stop()
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
            "peak_pss_mib": round(watch.peak_mib, 1),
        }
        if stored != produced.follows:
            raise BenchmarkError(f"follows: the state holds {stored:,}, the events leave {produced.follows:,}")

    def produce_likes(self, backlog: LikesBacklog) -> None:
        """Step 4: the likes backlog, chunk by chunk, before any runner reads it."""

        def on_chunk(b: LikesBacklog, chunk: Produced) -> None:
            log.info("likes produced", events=b.produced, likes=b.likes, chunk_rate=round(chunk.rate))
            print(f"  produced {b.produced:,} events, {b.likes:,} likes in force ({chunk.rate:,.0f} events/s)")

        produced = backlog.produce(self.args.likes, self.args.chunk, self.kafka, on_chunk)
        self.doc["producer"] = {
            "events": produced.events,
            "seconds": round(produced.seconds, 1),
            "events_per_s": round(produced.rate),
            "partitions": self.args.partitions,
            "actions": describe_actions(backlog.actions),
        }

    def fill(self, runner: PipelineWorkers, backlog: LikesBacklog) -> None:
        """Step 5: the runner drains the backlog while it is sampled; the curve; the state counted."""
        progress = DrainProgress(self.likes_topic, backlog.produced)
        disk: dict[str, Any] = {}

        def on_sample(sample: Sample, conn: psycopg.Connection) -> None:
            self.loads.append([round(sample.elapsed_s, 1), *(round(v, 2) for v in sample.load)])
            progress(sample.events, time.monotonic())
            if sample.likes >= min(DISK_CHECK_LIKES, self.args.likes // 2) and not disk:
                disk.update(self.check_disk(conn, sample.likes))
            if len(self.loads) % max(1, round(30 / self.args.sample_s)) == 0:
                print(f"  {sample.elapsed_s:7.0f}s  {sample.events:>12,} events  {sample.likes:>12,} likes in state")

        with (
            psycopg.connect(self.owner, autocommit=True) as conn,
            psycopg.connect(self.writer, autocommit=True) as sampling,
        ):
            self.doc["baseline_bytes"] = storage_sizes(conn, storage_tables(conn, self.schema, [self.schema]))[
                "total_bytes"
            ]
            wal_start = wal_position(conn)
            fill = sample_fill(
                sampling,
                runner,
                topic_ends(self.likes_topic, backlog.produced, self.kafka),
                backlog.likes_at,
                application_name=self.application_name,
                sample_s=self.args.sample_s,
                on_sample=lambda s: on_sample(s, conn),
            )
            wal_bytes = wal_position(conn) - wal_start
            stored = count_rows(conn, self.schema)
            viewed = conn.execute(
                sql.SQL("SELECT coalesce(sum(like_count), 0)::bigint FROM {}.object_likes").format(
                    sql.Identifier(self.schema)
                )
            ).fetchone()[0]
        points = curve(fill.samples, curve_step(self.args.likes), fill.first_commit_s)
        self.doc["curve"] = points
        self.doc["points"] = [
            {"likes_in_state": p["likes_in_state"], "likes_per_second": p["likes_per_s"]} for p in points
        ]
        first, last = fill.first, fill.last
        sustained = tail_rate(fill.samples)
        ticks = sum(fill.waits.values()) or 1
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
            "wal_bytes": wal_bytes,
            "wal_bytes_per_event": round(wal_bytes / backlog.produced),
            "disk_check": disk,
        }
        self.doc["samples"] = [
            [round(s.elapsed_s, 2), s.events, s.likes, round(s.pss_mib, 1), round(s.load[0], 2)] for s in fill.samples
        ]
        self.doc["backend_states"] = {k: round(v / ticks, 3) for k, v in fill.waits.most_common()}
        if stored != backlog.likes or viewed != backlog.likes:
            raise BenchmarkError(
                f"likes: the state holds {stored:,} and object_likes {viewed:,}; the events leave {backlog.likes:,}"
            )

    def check_disk(self, conn: psycopg.Connection, likes: int) -> dict[str, Any]:
        """The state's bytes per like so far, the rest of the run extrapolated; stop when it will not fit."""
        grown = storage_sizes(conn, storage_tables(conn, self.schema, [self.schema]))["total_bytes"]
        per_like = max(grown - self.doc.get("baseline_bytes", 0), 0) / likes
        needed = int((self.args.likes - likes) * per_like * DISK_MARGIN)
        free = free_bytes(data_directory(conn))
        check = {"at_likes": likes, "bytes_per_like": round(per_like), "needed_bytes": needed, "free_bytes": free}
        print(
            f"  disk at {likes:,} likes: {per_like:,.0f} bytes per like, the rest needs ~{needed / 2**30:.1f} GiB,"
            f" {free / 2**30:.1f} GiB free"
        )
        if needed > free:
            raise BenchmarkError(
                f"not enough disk: the rest of the run needs ~{needed / 2**30:.1f} GiB, {free / 2**30:.1f} free"
            )
        return check

    def freshness(self, runner: PipelineWorkers, backlog: LikesBacklog) -> None:
        """Step 6: markers under a steady load at half the sustained rate, with the runner that filled the state."""
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
        """Step 7: the seed's f_obj under pgbench, durable, on a table holding the views' likes."""
        schema = seed.unique_name("bench")
        fill = [
            sql.SQL(
                "INSERT INTO {}.obj (id, who_like, like_cnt) SELECT oid, likers, like_count FROM {}.object_likes"
                " WHERE oid < {}"
            ).format(sql.Identifier(schema), sql.Identifier(self.schema), sql.Literal(MARKER_BASE)),
            sql.SQL("VACUUM (ANALYZE) {}.obj").format(sql.Identifier(schema)),
        ]
        started = time.monotonic()
        eps = seed.seed_per_event_eps(
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
        self.doc["seed_per_event_detail"] = {
            "events_per_s": round(eps, 1),
            "synchronous_commit": "on",
            "clients": self.args.clients,
            "seconds": self.args.seconds,
            "likes_in_table": self.doc.get("fill", {}).get("likes_in_state"),
            "loaded_by": "INSERT ... SELECT of the bench object_likes (likers, like_count), then VACUUM ANALYZE",
            "wall_s": round(time.monotonic() - started, 1),
        }

    def kept(self) -> dict[str, Any]:
        """What `--keep` left, and how to use and drop it."""
        return {
            "schema": self.schema,
            "streams": [self.schema, self.follows_stream],
            "topics": [self.likes_topic, self.follows_topic],
            "group": self.group,
            "run": f"python -m pipelines.cv.runner --streams {self.schema} --group {self.group}",
            "produce": f"python -m loadgen.workload likes --topic {self.likes_topic} --seed 7 --count 1000000",
            "drop": f"python -m loadgen.bench_likes_at_size --drop {self.schema}",
        }


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m loadgen.bench_likes_at_size`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    parser.add_argument("--keep", action="store_true", help="keep the state, topics and offsets (to profile at size)")
    parser.add_argument("--drop", metavar="SCHEMA", help="drop what a --keep run left, then exit")
    parser.add_argument("--out", "--json", dest="out", type=Path, default=DEFAULT_OUT, help="the JSON for plots")
    args = parser.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    configure_logging()
    workload, kafka, postgres = WorkloadSettings(), KafkaSettings(), PostgresSettings()
    if args.drop:
        return drop_kept(args.drop, kafka, postgres)

    events = int(args.likes / NET_LIKES_PER_EVENT)
    needed = int(disk_estimate(args.likes, args.follows, events + args.follows) * DISK_MARGIN)
    with psycopg.connect(seed.owner_conninfo(postgres), autocommit=True) as conn:
        where = data_directory(conn)
    free = free_bytes(where)
    print(f"disk: this run needs about {needed / 2**30:.1f} GiB (estimate), {free / 2**30:.1f} GiB free on {where}")
    if needed > free:
        print(
            f"bench_likes_at_size: not enough disk: ~{needed / 2**30:.1f} GiB needed, {free / 2**30:.1f} free",
            file=sys.stderr,
        )
        return 2

    run = AtSizeRun(args, workload, kafka)
    started, machine = time.monotonic(), machine_line(postgres)
    run.doc.update(
        benchmark="likes_at_size",
        machine=machine,
        date=datetime.now(UTC).isoformat(timespec="seconds"),
        settings={
            **{
                k: getattr(args, k)
                for k in ("likes", "follows", "seconds", "chunk", "sample_s", "partitions", "workers")
            },
            "workload": workload.model_dump(),
            "disk_estimate_bytes": needed,
        },
    )
    failed = False
    try:
        run.run()
    except Exception as e:  # the figures measured so far are still written and shown
        failed = True
        log.exception("run failed")
        run.doc["errors"]["run"] = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        print(f"bench_likes_at_size: {run.doc['errors']['run']}", file=sys.stderr)
    finally:
        run.doc["load_average"] = report.load_summary(run.loads)
        run.doc["wall_s"] = round(time.monotonic() - started, 1)
        document = report.document(run.doc)
        report.write(args.out, document)
    report.show(document)
    return 1 if failed or run.doc["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
