"""What a minute -> hour -> day chain costs PostgreSQL today, against two emulated designs.

Issue 25's rollup target (the chain adds at most 20% to the minute view's ingest cost) is missed by
the design where each level is a feed: the minute view records the keys its batch changed, and a
feed, in a transaction of its own, looks each key up in its state and in the upstream, then applies
the difference (pipelines/cv/feeds.py). This benchmark measures, in PostgreSQL alone (no Kafka, no
decoding: the batches go straight in), what other designs could save:

- A: the minute view of loadgen.rollup alone, each batch applied by the engine
  (`StreamMaintainer.apply`, what the runner calls) and committed;
- B: the same with `hourly` FROM it and `daily` FROM `hourly` as today: each batch applied and
  committed (its keys recorded), then the feeds' passes that carry it down both levels
  (`ViewFeeds.step`, what the runner's feed thread runs after each commit);
- A', C', D': an emulation on plain tables of the views' shapes. A' is the minute upsert alone,
  written as the engine writes it. C' applies the levels in the batch: that upsert and both levels
  in one statement (the batch grouped once by (minute, url); the minute upsert; the hour level's
  delta grouped from the minute delta and upserted, a new minute group counted through
  `xmax = 0`; the day level's likewise). D' feeds typed deltas: the batch's statement upserts the
  minutes and logs each changed group's delta in a table; after the commit, a feed takes the log
  (DELETE ... RETURNING) and applies both levels from it. `max` is merged with `greatest`, exact
  only because minute rows over an append-only stream with no ttl only grow. Everything else a real
  design needs (retractions, isolation, backfill, replay, ttl) is left out: floors, not designs.

Each variant is timed on the batch's path (its statements and commit: what the runner's next batch
waits for) and in all (with the feed work after each batch, which the runner does beside its
batches). Each round starts with new minutes, hours and a new day (the events are a day later each
round), so every round inserts its groups and then updates them, alike for all. The variants' rounds
run in order and then reversed, `--rounds` times; each figure is the median of its rounds, in ms per
round, each call timed from the client with its commit.

Every name is throwaway (a schema, two streams no runner consumes) and dropped at the end.
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

# The emulation's tables, shaped as the views' storage, and D''s log of typed minute deltas ({s}: the schema).
_TABLES = sql.SQL("""
CREATE TABLE {s}.m (minute timestamptz, url text, n bigint NOT NULL DEFAULT 0, t1 bigint NOT NULL DEFAULT 0,
    t2 float8 NOT NULL DEFAULT 0, peak float8, rows bigint NOT NULL DEFAULT 0, UNIQUE (minute, url));
CREATE TABLE {s}.h (hour timestamptz, url text, n numeric NOT NULL DEFAULT 0, total float8 NOT NULL DEFAULT 0,
    peak float8, minutes bigint NOT NULL DEFAULT 0, UNIQUE (hour, url));
CREATE TABLE {s}.d (day timestamptz, n numeric NOT NULL DEFAULT 0, peak float8,
    url_hours bigint NOT NULL DEFAULT 0, UNIQUE (day));
CREATE TABLE {s}.log (minute timestamptz, url text, n bigint, total float8, peak float8, inserted bool);
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
# The same upsert from the batch grouped once (`d`), returning which groups it made (`up`).
_MINUTE_DELTAS = sql.SQL(
    "d AS MATERIALIZED (SELECT date_trunc('minute', ts) AS minute, url, count(*) AS n, count(latency) AS t1,"
    " coalesce(sum(latency), 0) AS t2, max(latency) AS peak"
    " FROM unnest(%t::text[], %t::float8[], %t::timestamptz[]) AS b(url, latency, ts) GROUP BY 1, 2),"
    " up AS (INSERT INTO {s}.m AS v (minute, url, n, t1, t2, peak, rows)"
    " SELECT minute, url, n, t1, t2, peak, n FROM d ORDER BY 1, 2"
    " ON CONFLICT (minute, url) DO UPDATE SET n = v.n + excluded.n, t1 = v.t1 + excluded.t1,"
    " t2 = v.t2 + excluded.t2, peak = greatest(v.peak, excluded.peak), rows = v.rows + excluded.rows"
    " RETURNING v.minute, v.url, v.xmax = 0 AS inserted)"
)
# The hour and day levels from `hd`, the hour level's delta (a new minute group counted as `minutes`).
_LEVELS = sql.SQL(
    "hup AS (INSERT INTO {s}.h AS v (hour, url, n, total, peak, minutes) SELECT * FROM hd ORDER BY 1, 2"
    " ON CONFLICT (hour, url) DO UPDATE SET n = v.n + excluded.n, total = v.total + excluded.total,"
    " peak = greatest(v.peak, excluded.peak), minutes = v.minutes + excluded.minutes"
    " RETURNING v.hour, v.url, v.xmax = 0 AS inserted),"
    " dd AS (SELECT date_trunc('day', hd.hour) AS day, sum(hd.n) AS n, max(hd.peak) AS peak,"
    " count(*) FILTER (WHERE hup.inserted) AS url_hours FROM hd JOIN hup USING (hour, url) GROUP BY 1),"
    " dup AS (INSERT INTO {s}.d AS v (day, n, peak, url_hours) SELECT * FROM dd"
    " ON CONFLICT (day) DO UPDATE SET n = v.n + excluded.n, peak = greatest(v.peak, excluded.peak),"
    " url_hours = v.url_hours + excluded.url_hours RETURNING 1)"
)
_HOUR_DELTA = sql.SQL(
    "hd AS MATERIALIZED (SELECT date_trunc('hour', {src}.minute) AS hour, {src}.url, sum({src}.n) AS n,"
    " sum({src}.{total}) AS total, max({src}.peak) AS peak, count(*) FILTER (WHERE inserted) AS minutes"
)
# C': the minute upsert and both levels, in the batch's statement ({hd}: over `d`, joined to `up`).
_CHAIN = sql.SQL(
    "WITH {deltas}, {hd} FROM d JOIN up USING (minute, url) GROUP BY 1, 2), {levels}"
    " SELECT (SELECT count(*) FROM up), (SELECT count(*) FROM hup), (SELECT count(*) FROM dup)"
)
# D': the minute upsert logging its typed deltas, in the batch's statement; then a feed of its own
# takes the log (DELETE ... RETURNING, a queue) and applies both levels, off the batch's path.
_LOGGED = sql.SQL(
    "WITH {deltas} INSERT INTO {s}.log SELECT d.minute, d.url, d.n, d.t2, d.peak, up.inserted"
    " FROM d JOIN up USING (minute, url)"
)
_FEED = sql.SQL(
    "WITH l AS (DELETE FROM {s}.log RETURNING *), {hd} FROM l GROUP BY 1, 2), {levels}"
    " SELECT (SELECT count(*) FROM hup), (SELECT count(*) FROM dup)"
)

# The variants, in the order of a round (A, B: the engine; A', C', D': the emulation).
VARIANTS = ("a", "b", "a_floor", "c_floor", "d_floor")
Batch = tuple[list[str], list[float], list[datetime]]  # url, latency, ts (aware UTC, as the decoder passes it)


def page_views(args: argparse.Namespace) -> tuple[list[str], list[float]]:
    """A round's `--batches` x `--events` page views (url, latency), the same every round."""
    rng = random.Random(args.seed)  # noqa: S311 (load generation, not cryptography)
    total = args.events * args.batches
    urls = [f"/page/{int(rng.random() * args.urls)}" for _ in range(total)]
    return urls, [round(rng.expovariate(1 / 80), 2) for _ in range(total)]


def batches(args: argparse.Namespace, views: tuple[list[str], list[float]], day: int) -> list[Batch]:
    """The page views in batches of `--events`, in time order over two minutes, `day` days after a fixed start."""
    urls, latencies = views
    total = len(urls)
    start = datetime(2026, 1, 1, 10, 59, 20, tzinfo=UTC) + timedelta(days=day)
    times = [start + timedelta(seconds=120 * i / total) for i in range(total)]
    return [
        (urls[i : i + args.events], latencies[i : i + args.events], times[i : i + args.events])
        for i in range(0, total, args.events)
    ]


def engine_round(
    writer: psycopg.Connection, stream: str, rounds: list[Batch], feeds: ViewFeeds | None
) -> tuple[float, float]:
    """Each batch applied by the engine and committed, then (`feeds`) carried down the chain.

    The ms on the batch's path (apply and commit), and the feeds' passes after each batch, off it.
    """
    maintainer = StreamMaintainer(stream)
    on_path = off_path = 0.0
    feed_conn = psycopg.connect(feeds.conninfo, autocommit=True) if feeds is not None else None
    try:
        for urls, latencies, times in rounds:
            started = time.perf_counter()
            maintainer.apply(writer, [1] * len(urls), [urls, [None] * len(urls), latencies, times])
            writer.commit()
            applied = time.perf_counter()
            if feeds is not None and feed_conn is not None:
                while feeds.step(feed_conn):
                    pass
            on_path += applied - started
            off_path += time.perf_counter() - applied
    finally:
        if feed_conn is not None:
            feed_conn.close()
    return on_path * 1000, off_path * 1000


def emulated_round(owner: psycopg.Connection, schema: str, rounds: list[Batch], variant: str) -> tuple[float, float]:
    """Each batch through the emulation (A': the minute upsert; C': with both levels; D': logged, then fed); ms.

    The ms on the batch's path (its statement and commit), and D''s feed after each batch, off it.
    """
    s = sql.Identifier(schema)
    # The levels join each delta to the rows its upsert returned: PostgreSQL estimates both at a few
    # hundred rows (a grouped array parameter) and would join 10,000 by 10,000 in a nested loop.
    owner.execute("SET enable_nestloop = off")
    owner.execute(sql.SQL("DROP TABLE IF EXISTS {s}.m, {s}.h, {s}.d, {s}.log").format(s=s))
    owner.execute(_TABLES.format(s=s))
    owner.commit()
    deltas, levels = _MINUTE_DELTAS.format(s=s), _LEVELS.format(s=s)
    # `inserted` (a new minute group) is the upsert's in C' (`d` joined to `up`), the log's in D'.
    over_batch = _HOUR_DELTA.format(src=sql.Identifier("d"), total=sql.Identifier("t2"))
    statement = {
        "a_floor": _MINUTE.format(s=s),
        "c_floor": _CHAIN.format(deltas=deltas, hd=over_batch, levels=levels),
        "d_floor": _LOGGED.format(deltas=deltas, s=s),
    }[variant]
    over_log = _HOUR_DELTA.format(src=sql.Identifier("l"), total=sql.Identifier("total"))
    feed = _FEED.format(s=s, hd=over_log, levels=levels) if variant == "d_floor" else None
    on_path = off_path = 0.0
    for urls, latencies, times in rounds:
        started = time.perf_counter()
        # The batch's literals built as the engine builds them, so that both pairs pay the same client work.
        literals = [array_literal(urls, "text"), array_literal(latencies, "float"), array_literal(times, "timestamptz")]
        owner.execute(statement, literals)
        owner.commit()
        applied = time.perf_counter()
        if feed is not None:
            owner.execute(feed)
            owner.commit()
        on_path += applied - started
        off_path += time.perf_counter() - applied
    if variant != "a_floor":
        (counted,) = owner.execute(sql.SQL("SELECT n FROM {s}.d").format(s=s)).fetchone()
        if counted != sum(len(b[0]) for b in rounds):
            raise AssertionError(f"the emulated day level counts {counted} events")
    return on_path * 1000, off_path * 1000


def measure(args: argparse.Namespace) -> BenchResult:
    """Define both throwaway streams; the variants' rounds in order, then reversed; the report."""
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
    on_path: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    off_path: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    writer_info = postgres.conninfo(user=ROLE_WRITER, application_name="streamviews-bench")
    feeds = ViewFeeds(writer_info, roots=lambda stream: stream == chained)
    views = page_views(args)  # drawn once; each round gives them its own day
    with (
        throwaway_definitions(schema, statements, [alone, chained], postgres),
        psycopg.connect(writer_info) as writer,
        psycopg.connect(owner_info, prepare_threshold=None) as owner,
    ):
        day = 0
        for order in (VARIANTS, VARIANTS[::-1]) * args.rounds:
            for variant in order:
                day += 1
                rounds = batches(args, views, day)
                if variant in ("a", "b"):
                    stream = alone if variant == "a" else chained
                    ms = engine_round(writer, stream, rounds, feeds if variant == "b" else None)
                else:
                    ms = emulated_round(owner, schema, rounds, variant)
                on_path[variant].append(ms[0])
                off_path[variant].append(ms[1])
                log.info("round", variant=variant, on_path_ms=round(ms[0]), off_path_ms=round(ms[1]))
    return report(args, postgres, on_path, off_path)


def report(
    args: argparse.Namespace,
    postgres: PostgresSettings,
    on_path: dict[str, list[float]],
    off_path: dict[str, list[float]],
) -> BenchResult:
    """Medians per variant, on the batch's path and in all, and what each chain adds to its own base."""
    results = Results()
    values = results.values
    for variant in VARIANTS:
        paths, offs = on_path[variant], off_path[variant]
        values[f"{variant}_path"] = statistics.median(paths)
        values[f"{variant}_all"] = statistics.median(a + b for a, b in zip(paths, offs, strict=True))
    for variant, base in (("b", "a"), ("c_floor", "a_floor"), ("d_floor", "a_floor")):
        for part in ("path", "all"):
            values[f"{variant}_added_{part}_pct"] = 100 * (values[f"{variant}_{part}"] / values[f"{base}_{part}"] - 1)
    rows = [
        ("A: minute view alone, engine (ms of PostgreSQL per round, median)", "a_path", ",.0f"),
        ("B: with hour and day as feeds, as today: on the batch's path (ms)", "b_path", ",.0f"),
        ("  same, with the feeds' passes (ms)", "b_all", ",.0f"),
        ("  added to A on the batch's path (%)", "b_added_path_pct", ",.1f"),
        ("  same, in all (%)", "b_added_all_pct", ",.1f"),
        ("A': minute upsert alone, emulated (ms)", "a_floor_path", ",.0f"),
        ("C': both levels in the batch's statement, from its typed deltas (ms)", "c_floor_path", ",.0f"),
        ("  added to A' (%)", "c_floor_added_path_pct", ",.1f"),
        ("D': the batch logs its typed deltas: on the batch's path (ms)", "d_floor_path", ",.0f"),
        ("  same, with a feed applying the levels from the log (ms)", "d_floor_all", ",.0f"),
        ("  added to A' on the batch's path (%)", "d_floor_added_path_pct", ",.1f"),
        ("  same, in all (%)", "d_floor_added_all_pct", ",.1f"),
    ]
    rounds = "; ".join(
        f"{v} " + ", ".join(f"{a:,.0f}+{b:,.0f}" for a, b in zip(on_path[v], off_path[v], strict=True))
        for v in VARIANTS
    )
    header = [
        f"rollup floor benchmark ({machine_line(postgres)})",
        f"  workload: {args.batches} batches of {args.events:,} page views over {args.urls:,} urls and two minutes,"
        f" per round; rounds {' '.join(VARIANTS)} and reversed, x{args.rounds}",
        f"  rounds (ms on the batch's path + off it): {rounds}",
    ]
    comparisons = [
        Comparison("B / A in all (the chain as feeds, today)", "b_all", "a_path"),
        Comparison("C' / A' (both levels in the batch: the floor)", "c_floor_path", "a_floor_path"),
        Comparison("D' / A' on the batch's path (typed deltas logged)", "d_floor_path", "a_floor_path"),
        Comparison("D' / A' in all (and fed from the log)", "d_floor_all", "a_floor_path"),
    ]
    return BenchResult.of("rollup_floor", results, rows, comparisons=comparisons, header=header)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m loadgen.rollup.floor`."""
    parser = cli.parser(__doc__)
    parser.add_argument("--events", type=int, default=50_000, help="page views per batch")
    parser.add_argument("--batches", type=int, default=6, help="batches per round")
    parser.add_argument("--urls", type=int, default=10_000, help="distinct urls, drawn uniformly")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each variant in order, then reversed")
    parser.add_argument("--seed", type=int, default=1, help="same seed, same events")
    return cli.run(parser, measure, "loadgen.rollup.floor", argv)


if __name__ == "__main__":
    sys.exit(main())
