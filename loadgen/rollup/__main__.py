"""Page views into a per-minute view through one runner, with and without a minute -> hour -> day chain on it.

Issue 25's target: a three-level rollup adds at most 20% to the ingest cost of the minute view. The
same backlog of `--events` page views (the page views benchmark's workload, `loadgen.workloads.pageviews`)
is drained by ONE `python -m pipelines.cv.runner` process in rounds, each with a fresh stream, schema
and consumer group over the same topic, in ABBA order (A: the minute view alone; B: the minute view
and the chain over it, `hourly` FROM it and `daily` FROM `hourly`), so a drift of the machine weighs
on both alike:

- events/s of each round, from its first commit to the last offset committed (`drain.wait_drained`);
  for B the drain also waits for the chain: until the day level holds every event (the runner's feeds
  thread applies the levels from PostgreSQL, pipelines/cv/feeds.py);
- the added ingest cost: 1 - (B's events/s / A's), medians of the rounds;
- event -> day level: after B's last drain, with its runner still running and idle, `--probes` single
  events produced one at a time, each timed from its produce call until the day level counts it.

Every name is throwaway and dropped at the end. Another runner feeding the same chain (the supervised
one feeds every view over a view too; the feeds are fenced) would take part of B's cost off the clock:
run it with the stack's runner stopped, or PIPELINE_FEEDS=false in its environment, for a strict figure.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid

import orjson
import psycopg
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from psycopg import sql

from loadgen.common import cli
from loadgen.common.drain import high_watermarks, wait_drained
from loadgen.common.errors import BenchmarkError
from loadgen.common.kafka import produce_all
from loadgen.common.postgres import owner_conninfo
from loadgen.common.processes import PipelineWorkers
from loadgen.common.report import BenchResult, Comparison, Results, machine_line
from loadgen.common.throwaway import create_topic, delete_topic, forget_group, throwaway_definitions
from loadgen.rollup.queries import DAY, DAY_COMBINE, HOUR, HOUR_COMBINE, MINUTE
from loadgen.workloads.pageviews import page_views
from pipelines.logs import get_logger
from pipelines.settings import KafkaSettings, PostgresSettings

log = get_logger("loadgen.rollup")


def definitions(schema: str, stream: str, topic: str, group: str, chain: bool, combine: bool = False) -> list[str]:
    """The stream (its own consumer group: the supervised runner leaves it alone), the minute view, maybe the chain."""
    statements = [
        sql.SQL(
            "CREATE STREAM {} (url text NOT NULL, uid bigint, latency double precision NOT NULL, ts timestamptz)"
            " WITH (topic = {}, timestamp_column = 'ts', consumer_group = {})"
        )
        .format(sql.Identifier(stream), sql.Literal(topic), sql.Literal(group))
        .as_string(None),
        f"CREATE CONTINUOUS VIEW {schema}.per_minute AS {MINUTE.format(src=stream)}",
    ]
    if chain:
        hour, day = (HOUR_COMBINE, DAY_COMBINE) if combine else (HOUR, DAY)
        statements += [
            f"CREATE CONTINUOUS VIEW {schema}.hourly AS {hour.format(src=f'{schema}.per_minute')}",
            f"CREATE CONTINUOUS VIEW {schema}.daily AS {day.format(src=f'{schema}.hourly')}",
        ]
    return statements


def day_count(conn: psycopg.Connection, schema: str) -> int:
    """The events the day level counts now."""
    query = sql.SQL("SELECT coalesce(sum(n), 0) FROM {}").format(sql.Identifier(schema, "daily"))
    return int(conn.execute(query).fetchone()[0])


def wait_for_day(conn: psycopg.Connection, schema: str, count: int, timeout_s: float) -> float:
    """Poll the day level every 5 ms until it counts `count` events; the seconds it took."""
    started = time.monotonic()
    while day_count(conn, schema) < count:
        if time.monotonic() - started > timeout_s:
            raise BenchmarkError(f"the day level did not reach {count} events in {timeout_s:.0f} s")
        time.sleep(0.005)
    return time.monotonic() - started


def one_round(topic: str, events: int, chain: bool, probes: int, args: argparse.Namespace) -> dict[str, object]:
    """Define, drain with one runner (and the chain, in B), maybe probe the latency; every name dropped after."""
    kafka, postgres = KafkaSettings(), PostgresSettings()
    run_id = uuid.uuid4().hex[:8]
    schema, stream, group = f"bench_{run_id}", f"bench_ru_{run_id}", f"bench-ru-{run_id}"
    owner = owner_conninfo(postgres)
    try:
        statements = definitions(schema, stream, topic, group, chain, args.combine)
        with throwaway_definitions(schema, statements, [stream], postgres):
            ends = high_watermarks(topic, kafka)
            settings = {"PIPELINE_FEED_PAGE": str(args.feed_page)} if args.feed_page else {}
            runner = PipelineWorkers(
                1, topic=topic, stream=stream, group=group, postgres=postgres, kafka=kafka, settings=settings
            )
            latencies: list[float] = []
            try:
                with psycopg.connect(owner, autocommit=True) as conn:
                    drain = wait_drained(conn, runner, ends)
                    chain_s = wait_for_day(conn, schema, events, 600) if chain else 0.0
                    if chain and probes:
                        latencies = probe(conn, schema, topic, events, probes, kafka)
            finally:
                runner.stop()
            rate = (events - drain.first_committed) / (drain.drain_seconds + chain_s)
            log.info("round", chain=chain, events_per_s=round(rate), chain_after_drain_s=round(chain_s, 3))
            return {"rate": rate, "chain_s": chain_s, "latencies": latencies}
    finally:
        forget_group(owner, group, topic, kafka)


def probe(
    conn: psycopg.Connection, schema: str, topic: str, done: int, probes: int, kafka: KafkaSettings
) -> list[float]:
    """Single events produced one at a time; each one's seconds from produce to the day level."""
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "linger.ms": 0})
    seconds = []
    for i in range(probes):
        started = time.monotonic()
        producer.produce(topic, key=b"/probe", value=orjson.dumps({"url": "/probe", "uid": i + 1, "latency": 1.0}))
        producer.flush(10)
        wait_for_day(conn, schema, done + i + 1, 60)
        seconds.append(time.monotonic() - started)
    return seconds


def measure(args: argparse.Namespace) -> BenchResult:
    """Produce once; drain it in ABBA rounds; the rates, the added cost and the probes' latency."""
    kafka, postgres = KafkaSettings(), PostgresSettings()
    topic = f"bench-rollup-{uuid.uuid4().hex[:10]}"
    views = page_views(args.events, args.urls, args.seed)
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    create_topic(admin, topic, args.partitions)
    results = Results()
    alone: list[float] = []
    chained: list[float] = []
    latencies: list[float] = []
    try:
        results.measure("producer", lambda: produce_all(topic, range(args.events), views.encode, kafka))
        for index, chain in enumerate([False, True, True, False] * args.rounds):
            last_b = chain and index == 4 * args.rounds - 2
            outcome = one_round(topic, args.events, chain, args.probes if last_b else 0, args)
            (chained if chain else alone).append(float(outcome["rate"]))  # type: ignore[arg-type]
            latencies += outcome["latencies"]  # type: ignore[arg-type]
    finally:
        delete_topic(admin, topic)
    results.values["alone"] = statistics.median(alone)
    results.values["chained"] = statistics.median(chained)
    results.values["added_cost_pct"] = 100 * (1 - results.values["chained"] / results.values["alone"])
    if latencies:
        ordered = sorted(latencies)
        results.values["p50_ms"] = 1000 * statistics.median(ordered)
        results.values["p99_ms"] = 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    rows = [
        ("producer -> Kafka (msgs/s)", "producer"),
        (f"runner, minute view alone (events/s, median of {len(alone)})", "alone"),
        (f"runner, minute view + hour + day chain (events/s, median of {len(chained)})", "chained"),
        ("added ingest cost of the chain (%)", "added_cost_pct"),
        (f"event -> day level, p50 of {len(latencies)} probes (ms)", "p50_ms"),
        ("event -> day level, p99 (ms)", "p99_ms"),
    ]
    header = [
        f"rollup benchmark ({machine_line(postgres)})",
        f"  workload: {args.events:,} page views among {args.urls:,} urls, topic of {args.partitions} partitions;"
        f" rounds ABBA x{args.rounds} (A: minute view alone, B: minute -> hour -> day)",
        f"  minute: {MINUTE.format(src='<stream>')}",
        f"  hour: {(HOUR_COMBINE if args.combine else HOUR).format(src='<minute>')}",
        f"  day: {(DAY_COMBINE if args.combine else DAY).format(src='<hour>')}",
        f"  rates: A {', '.join(f'{r:,.0f}' for r in alone)}; B {', '.join(f'{r:,.0f}' for r in chained)} events/s",
    ]
    comparisons = [Comparison("chain / minute view alone (target >= 0.8)", "chained", "alone", target=0.8)]
    return BenchResult.of("rollup", results, rows, comparisons=comparisons, header=header)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m loadgen.rollup`."""
    parser = cli.parser(__doc__)
    parser.add_argument("--events", type=int, default=500_000, help="page views produced and drained per round")
    parser.add_argument("--urls", type=int, default=10_000, help="distinct urls, drawn uniformly")
    parser.add_argument("--partitions", type=int, default=6, help="partitions of the bench topic")
    parser.add_argument("--rounds", type=int, default=1, help="ABBA sequences (each 4 drains)")
    parser.add_argument("--probes", type=int, default=50, help="single events timed to the day level")
    parser.add_argument("--seed", type=int, default=1, help="same seed, same events")
    parser.add_argument(
        "--combine", action="store_true", help="the levels combine() the minute view's states (its changes carry them)"
    )
    parser.add_argument("--feed-page", type=int, default=0, help="the runner's PIPELINE_FEED_PAGE, 0 = its default")
    return cli.run(parser, measure, "loadgen.rollup", argv)


if __name__ == "__main__":
    sys.exit(main())
