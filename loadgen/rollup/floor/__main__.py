"""What a minute -> hour -> day chain costs PostgreSQL today, and the floor of applying it in the batch.

Issue 25's rollup target (the chain adds at most 20% to the minute view's ingest cost) is missed by
the design where each level is a feed: the minute view records the keys its batch changed, and a
feed, in a transaction of its own, looks each key up in its state and in the upstream, then applies
the difference (pipelines/cv/feeds.py). docs/performance.md names the way out: the levels applied
in the minute batch's own transaction, from the batch's typed deltas. This benchmark measures, in
PostgreSQL alone (no Kafka, no decoding: the batches go straight in), what that could save:

- A: the minute view of loadgen.rollup alone, each batch applied by the engine
  (`StreamMaintainer.apply`, what the runner calls) and committed;
- B: the same with `hourly` FROM it and `daily` FROM `hourly` as today: each batch applied and
  committed (its keys recorded), then the feeds' passes that carry it down both levels
  (`ViewFeeds.step`, what the runner's feed thread runs after each commit);
- A' and C': an emulation, on plain tables of the views' shapes. A' is the minute upsert alone,
  written as the engine writes it. C' is that upsert and both levels in one statement: the batch
  grouped once by (minute, url); the minute upsert; the hour level's delta grouped from the
  minute delta and upserted (a new minute group counted through `xmax = 0`); the day level's
  delta grouped from the hour delta and upserted. `max` is merged with `greatest`, which is
  exact only because minute rows over an append-only stream with no ttl only grow. Everything
  else a real design needs (retractions, isolation, backfill, replay, ttl) is left out, so C' is a
  floor, not a design.

Each round starts with new minutes, hours and a new day (the events are a day later each round),
so every round inserts its groups and then updates them, alike for all four. Rounds run ABA'C'
and then in reverse, `--rounds` times; each figure is the median of its rounds, in ms of
PostgreSQL time per round (each call timed from the client, commit included). The added costs:
(B - A) / A today, (C' - A') / A' for the floor.

Every name is throwaway (a schema, a stream no runner consumes) and dropped at the end.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
from psycopg import sql

from loadgen.common import cli
from loadgen.common.postgres import owner_conninfo
from loadgen.common.report import BenchResult, Comparison, Results, machine_line
from loadgen.common.throwaway import throwaway_definitions
from loadgen.rollup.queries import DAY, HOUR, MINUTE
from pipelines.cv.engine import StreamMaintainer
from pipelines.cv.feeds import ViewFeeds
from pipelines.cv.sqltext.arrays import array_literal
from pipelines.logs import get_logger
from pipelines.settings import ROLE_WRITER, PostgresSettings

log = get_logger("loadgen.rollup.floor")

# The emulation's tables, shaped as the views' storage ({s}: the run's schema).
_TABLES = sql.SQL("""
CREATE TABLE {s}.m (minute timestamptz, url text, n bigint NOT NULL DEFAULT 0, t1 bigint NOT NULL DEFAULT 0,
    t2 float8 NOT NULL DEFAULT 0, peak float8, rows bigint NOT NULL DEFAULT 0, UNIQUE (minute, url));
CREATE TABLE {s}.h (hour timestamptz, url text, n numeric NOT NULL DEFAULT 0, total float8 NOT NULL DEFAULT 0,
    peak float8, minutes bigint NOT NULL DEFAULT 0, UNIQUE (hour, url));
CREATE TABLE {s}.d (day timestamptz, n numeric NOT NULL DEFAULT 0, peak float8,
    url_hours bigint NOT NULL DEFAULT 0, UNIQUE (day));
""")
# A': the minute upsert as the engine writes it (its RETURNING feeds the emptied-rows check).
_MINUTE = sql.SQL(
    "WITH up AS (INSERT INTO {s}.m AS v (minute, url, n, t1, t2, peak, rows)"
    " SELECT date_trunc('minute', ts), url, count(*), count(latency), coalesce(sum(latency), 0), max(latency), count(*)"
    " FROM unnest(%t::text[], %t::float8[], %t::timestamptz[]) AS b(url, latency, ts) GROUP BY 1, 2 ORDER BY 1, 2"
    " ON CONFLICT (minute, url) DO UPDATE SET n = v.n + excluded.n, t1 = v.t1 + excluded.t1,"
    " t2 = v.t2 + excluded.t2, peak = greatest(v.peak, excluded.peak), rows = v.rows + excluded.rows"
    " RETURNING v.ctid AS tid, v.rows AS n) SELECT count(*) FROM up"
)
# C': the minute upsert and both levels from the batch's typed deltas, in one statement.
_CHAIN = sql.SQL(
    "WITH d AS MATERIALIZED (SELECT date_trunc('minute', ts) AS minute, url, count(*) AS n, count(latency) AS t1,"
    " coalesce(sum(latency), 0) AS t2, max(latency) AS peak"
    " FROM unnest(%t::text[], %t::float8[], %t::timestamptz[]) AS b(url, latency, ts) GROUP BY 1, 2),"
    " up AS (INSERT INTO {s}.m AS v (minute, url, n, t1, t2, peak, rows)"
    " SELECT minute, url, n, t1, t2, peak, n FROM d ORDER BY 1, 2"
    " ON CONFLICT (minute, url) DO UPDATE SET n = v.n + excluded.n, t1 = v.t1 + excluded.t1,"
    " t2 = v.t2 + excluded.t2, peak = greatest(v.peak, excluded.peak), rows = v.rows + excluded.rows"
    " RETURNING v.minute, v.url, v.xmax = 0 AS inserted),"
    " hd AS MATERIALIZED (SELECT date_trunc('hour', d.minute) AS hour, d.url, sum(d.n) AS n, sum(d.t2) AS total,"
    " max(d.peak) AS peak, count(*) FILTER (WHERE up.inserted) AS minutes"
    " FROM d JOIN up USING (minute, url) GROUP BY 1, 2),"
    " hup AS (INSERT INTO {s}.h AS v (hour, url, n, total, peak, minutes) SELECT * FROM hd ORDER BY 1, 2"
    " ON CONFLICT (hour, url) DO UPDATE SET n = v.n + excluded.n, total = v.total + excluded.total,"
    " peak = greatest(v.peak, excluded.peak), minutes = v.minutes + excluded.minutes"
    " RETURNING v.hour, v.url, v.xmax = 0 AS inserted),"
    " dd AS (SELECT date_trunc('day', hd.hour) AS day, sum(hd.n) AS n, max(hd.peak) AS peak,"
    " count(*) FILTER (WHERE hup.inserted) AS url_hours FROM hd JOIN hup USING (hour, url) GROUP BY 1),"
    " dup AS (INSERT INTO {s}.d AS v (day, n, peak, url_hours) SELECT * FROM dd"
    " ON CONFLICT (day) DO UPDATE SET n = v.n + excluded.n, peak = greatest(v.peak, excluded.peak),"
    " url_hours = v.url_hours + excluded.url_hours RETURNING 1)"
    " SELECT (SELECT count(*) FROM up), (SELECT count(*) FROM hup), (SELECT count(*) FROM dup)"
)

Batch = tuple[list[str], list[float], list[datetime]]  # url, latency, ts (aware UTC, as the decoder passes it)


def batches(args: argparse.Namespace, day: int) -> list[Batch]:
    """`--batches` batches of `--events` page views in time order over two minutes, `day` days after a fixed start."""
    rng = random.Random(args.seed)  # noqa: S311 (load generation, not cryptography)
    total = args.events * args.batches
    start = datetime(2026, 1, 1, 10, 59, 20, tzinfo=UTC) + timedelta(days=day)
    urls = [f"/page/{int(rng.random() * args.urls)}" for _ in range(total)]
    latencies = [round(rng.expovariate(1 / 80), 2) for _ in range(total)]
    times = [start + timedelta(seconds=120 * i / total) for i in range(total)]
    return [
        (urls[i : i + args.events], latencies[i : i + args.events], times[i : i + args.events])
        for i in range(0, total, args.events)
    ]


def engine_round(writer: psycopg.Connection, stream: str, rounds: list[Batch], feeds: ViewFeeds | None) -> float:
    """Each batch applied by the engine and committed (then, with `feeds`, carried down the chain); ms."""
    maintainer = StreamMaintainer(stream)
    spent = 0.0
    feed_conn = psycopg.connect(feeds.conninfo, autocommit=True) if feeds is not None else None
    try:
        for urls, latencies, times in rounds:
            started = time.perf_counter()
            maintainer.apply(writer, [1] * len(urls), [urls, [None] * len(urls), latencies, times])
            writer.commit()
            if feeds is not None and feed_conn is not None:
                while feeds.step(feed_conn):
                    pass
            spent += time.perf_counter() - started
    finally:
        if feed_conn is not None:
            feed_conn.close()
    return spent * 1000


def emulated_round(owner: psycopg.Connection, schema: str, rounds: list[Batch], chain: bool) -> float:
    """Each batch through the emulation's statement (A': the minute upsert; C': with both levels); ms."""
    s = sql.Identifier(schema)
    # The levels join each delta to the rows its upsert returned: PostgreSQL estimates both at a few
    # hundred rows (a grouped array parameter) and would join 10,000 by 10,000 in a nested loop.
    owner.execute("SET enable_nestloop = off")
    owner.execute(sql.SQL("DROP TABLE IF EXISTS {s}.m, {s}.h, {s}.d").format(s=s))
    owner.execute(_TABLES.format(s=s))
    owner.commit()
    statement = (_CHAIN if chain else _MINUTE).format(s=s)
    spent = 0.0
    for urls, latencies, times in rounds:
        started = time.perf_counter()
        # The batch's literals built as the engine builds them, so that both pairs pay the same client work.
        literals = [array_literal(urls, "text"), array_literal(latencies, "float"), array_literal(times, "timestamptz")]
        owner.execute(statement, literals).fetchone()
        owner.commit()
        spent += time.perf_counter() - started
    if chain:
        (counted,) = owner.execute(sql.SQL("SELECT n FROM {s}.d").format(s=s)).fetchone()
        if counted != sum(len(b[0]) for b in rounds):
            raise AssertionError(f"the emulated day level counts {counted} events")
    return spent * 1000


def measure(args: argparse.Namespace) -> BenchResult:
    """Define both throwaway streams; rounds ABA'C' then C'A'BA; the medians and added costs."""
    postgres = PostgresSettings()
    owner_info = owner_conninfo(postgres)
    run_id = uuid.uuid4().hex[:8]
    schema = f"bench_{run_id}"
    alone, chained = f"bench_rfa_{run_id}", f"bench_rfb_{run_id}"
    statements = []
    for stream, views in ((alone, ("per_minute",)), (chained, ("per_minute_c", "hourly", "daily"))):
        statements.append(
            f"CREATE STREAM {stream} (url text NOT NULL, uid bigint, latency double precision NOT NULL,"
            f" ts timestamptz) WITH (topic = '{stream}', timestamp_column = 'ts', consumer_group = '{stream}')"
        )
        source = stream
        for view, query in zip(views, (MINUTE, HOUR, DAY), strict=False):
            statements.append(f"CREATE CONTINUOUS VIEW {schema}.{view} AS {query.format(src=source)}")
            source = f"{schema}.{view}"
    timings: dict[str, list[float]] = {"a": [], "b": [], "a_floor": [], "c_floor": []}
    writer_info = postgres.conninfo(user=ROLE_WRITER, application_name="streamviews-bench")
    feeds = ViewFeeds(writer_info, roots=lambda stream: stream == chained)
    with (
        throwaway_definitions(schema, statements, [alone, chained], postgres),
        psycopg.connect(writer_info) as writer,
        psycopg.connect(owner_info, prepare_threshold=None) as owner,
    ):
        day = 0
        for order in (("a", "b", "a_floor", "c_floor"), ("c_floor", "a_floor", "b", "a")) * args.rounds:
            for variant in order:
                day += 1
                rounds = batches(args, day)
                if variant in ("a", "b"):
                    stream = alone if variant == "a" else chained
                    ms = engine_round(writer, stream, rounds, feeds if variant == "b" else None)
                else:
                    ms = emulated_round(owner, schema, rounds, chain=variant == "c_floor")
                timings[variant].append(ms)
                log.info("round", variant=variant, ms=round(ms))
    results = Results()
    values = results.values
    for variant, figures in timings.items():
        values[variant] = statistics.median(figures)
    values["added_today_pct"] = 100 * (values["b"] - values["a"]) / values["a"]
    values["added_floor_pct"] = 100 * (values["c_floor"] - values["a_floor"]) / values["a_floor"]
    rows = [
        ("A: minute view alone, engine (ms of PostgreSQL per round, median)", "a", ",.0f"),
        ("B: with hour and day as feeds, as today (ms)", "b", ",.0f"),
        ("  added by the chain today (% of A)", "added_today_pct", ",.1f"),
        ("A': minute upsert alone, emulated (ms)", "a_floor", ",.0f"),
        ("C': with both levels from the batch's typed deltas, one statement (ms)", "c_floor", ",.0f"),
        ("  added by the chain at that floor (% of A')", "added_floor_pct", ",.1f"),
    ]
    header = [
        f"rollup floor benchmark ({machine_line(postgres)})",
        f"  workload: {args.batches} batches of {args.events:,} page views over {args.urls:,} urls and two minutes,"
        f" per round; rounds ABA'C' and reversed, x{args.rounds}",
        f"  rounds (ms): {'; '.join(f'{k} ' + ', '.join(f'{v:,.0f}' for v in vs) for k, vs in timings.items())}",
    ]
    comparisons = [
        Comparison("B / A (PostgreSQL time with the chain as feeds)", "b", "a"),
        Comparison("C' / A' (the same chain in the batch, its floor)", "c_floor", "a_floor"),
    ]
    return BenchResult.of("rollup_floor", results, rows, comparisons=comparisons, header=header)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m loadgen.rollup.floor`."""
    parser = cli.parser(__doc__)
    parser.add_argument("--events", type=int, default=50_000, help="page views per batch")
    parser.add_argument("--batches", type=int, default=6, help="batches per round")
    parser.add_argument("--urls", type=int, default=10_000, help="distinct urls, drawn uniformly")
    parser.add_argument("--rounds", type=int, default=2, help="ABA'C' quadruples (each then reversed)")
    parser.add_argument("--seed", type=int, default=1, help="same seed, same events")
    return cli.run(parser, measure, "loadgen.rollup.floor", argv)


if __name__ == "__main__":
    sys.exit(main())
