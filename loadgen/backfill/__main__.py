"""A new view backfilled from retained page views, beside the live runner on the same view. Prints a table.

Issue 27's benchmark: a view defined today over a stream whose topic holds `--events` page views
(loadgen.workloads.pageviews) is caught up from that history by the runner's backfill process
(pipelines/cv/backfill.py) while the live views keep flowing.

1. Produce `--events` page views to a new topic (`--partitions`, keyed by url).
2. Live: define the stream and `live_stats` (the page views benchmark's `basic` view: count, sum and
   max of latency per url), start ONE runner and time its drain of the backlog from its first
   commit: the live figure.
3. Backfill alone: with that runner still running and idle, define `new_stats`, the same SELECT:
   its backfill reads the whole backlog. The backfill figure is timed like the live one, from its
   first batch seen committed to its completion (cv.backfill_status), beside the live figure; the
   figure from the definition (with the runner's look for it and its process's start-up) is shown too.
   Once it is done, `new_stats` must equal `live_stats` row for row (nothing flows meanwhile), and
   it is dropped: the runner maintains `live_stats` alone again, as before it.
4. Backfill under load: produce page views at `--live-rate` plus a marker page view every 20 ms,
   whose appearance in `live_stats` is timed (freshness): for
   `--baseline-s` without a backfill, then define `loaded_stats` and go on for at most `--load-s`
   (the backfill yields to a live runner that is behind, so under a load the runner cannot keep up
   with it would wait for the load to end). Freshness is over the markers sent meanwhile. The
   default rate is half what the live view sustains with this producer on the same machine: on two
   cores, at half the drain figure its p99 was 1.2 s with no backfill at all (it sustains about that
   much, the producer taking the rest), so a quarter of the drain figure.
   The cores each process used under the load, before the backfill and during it, are printed
   in the notes (the backfill process comes and goes: its share is in the machine's figure).
   The notes also give the p99 per 2 s window from the definition, the window of the join starred
   (`--samples FILE` writes every marker).
5. Stop producing, wait until the runner has read everything, and check that `loaded_stats` equals
   `live_stats` row for row (it saw the history by the backfill, the rest live: nothing twice,
   nothing missed); then drop it.
6. One more view's own cost: the same load again, and after `--baseline-s` `plain_stats`, the same
   view WITH (backfill = 'none'), for as long as step 4's window lasted. The live runner maintains
   two views from then on, as it does once a backfilled view joins it, with no backfill at all: on
   a slow machine that alone can put the live view's p99 near 1 s (docs/performance.md). At the
   end `live_stats` must count every page view produced, and `plain_stats` none it does not.

Targets (issue 27): backfill events/s >= 0.8 x the live runner's, and the live view's freshness p99
< 1 s during the backfill. Every name is throwaway and dropped at the end.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid

import psycopg
from confluent_kafka.admin import AdminClient
from psycopg import sql

from loadgen.backfill.load import TIMELINE_S, Backfilled, timeline, under_load, write_samples
from loadgen.common import cli
from loadgen.common.drain import Drain, high_watermarks, wait_drained
from loadgen.common.errors import BenchmarkError
from loadgen.common.freshness import percentile
from loadgen.common.kafka import produce_all
from loadgen.common.postgres import owner_conninfo
from loadgen.common.processes import PipelineWorkers
from loadgen.common.report import BenchResult, Comparison, Results, machine_line
from loadgen.common.throwaway import create_topic, delete_topic, forget_group, throwaway_definitions
from loadgen.pageviews.views import VIEWS
from loadgen.workloads.pageviews import page_views
from pipelines.cv import catalog
from pipelines.logs import get_logger
from pipelines.settings import KafkaSettings, PostgresSettings

log = get_logger("loadgen.backfill")


def definitions(schema: str, stream: str, topic: str, group: str, view: str, options: str = "") -> list[str]:
    """The page views stream of the bench runner's group, and view `view` of the basic SELECT (`WITH options`)."""
    names = {"stream": sql.Identifier(stream), "topic": sql.Literal(topic), "group": sql.Literal(group)}
    select = VIEWS["basic"].select  # its {stream} is filled in with the others
    return [
        sql.SQL(text).format(**names, view=sql.Identifier(schema, view)).as_string(None)
        for text in (
            "CREATE STREAM {stream} (url text NOT NULL, uid bigint, latency double precision NOT NULL, ts timestamptz)"
            " WITH (topic = {topic}, timestamp_column = 'ts', consumer_group = {group})",
            "CREATE CONTINUOUS VIEW {view}" + (f" WITH ({options})" if options else "") + " AS " + select,
        )
    ]


def wait_backfilled(conn: psycopg.Connection, view: str, runner: PipelineWorkers, timeout_s: float) -> Backfilled:
    """Poll cv.backfill_status every 50 ms until the view's backfill is complete; its offsets and first batch."""
    deadline = time.monotonic() + timeout_s
    seen = Backfilled(0)
    while time.monotonic() < deadline:
        row = conn.execute(
            "SELECT complete, offsets_total, offsets_done, joined_at IS NOT NULL"
            " FROM cv.backfill_status WHERE view = %s",
            (view,),
        ).fetchone()
        if row is None:
            raise BenchmarkError(f"{view}: no backfill recorded")
        if seen.first_at is None and row[2] and not row[0]:
            seen.first_done, seen.first_at = int(row[2]), time.monotonic()
        if seen.joined_at is None and row[3]:
            seen.joined_at = time.monotonic()
        if row[0]:
            seen.offsets = int(row[1])
            return seen
        runner.check_alive()
        time.sleep(0.05)
    raise BenchmarkError(f"{view}: backfill not done after {timeout_s} s")


def same_rows(conn: psycopg.Connection, a: sql.Identifier, b: sql.Identifier) -> list[str]:
    """Where two views of the same SELECT differ (none: equal row for row; sums of doubles to 1e-9).

    Floating-point sums added up in another order may differ in their last bits, nothing more.
    """
    query = sql.SQL(
        "SELECT count(*) FROM {a} AS x FULL JOIN {b} AS y USING (url)"
        " WHERE x.views IS DISTINCT FROM y.views OR x.max_latency IS DISTINCT FROM y.max_latency"
        " OR x.total_latency IS NULL OR y.total_latency IS NULL"
        " OR abs(x.total_latency - y.total_latency) > 1e-9 * greatest(abs(x.total_latency), 1)"
    )
    (differ,) = conn.execute(query.format(a=a, b=b)).fetchone()
    return [f"{differ} rows differ between {a.as_string(conn)} and {b.as_string(conn)}"] if differ else []


def backfill_rate(
    conn: psycopg.Connection, define: str, view: str, runner: PipelineWorkers, timeout_s: float
) -> tuple[float, float | None, Backfilled]:
    """Define a view and time its backfill: events/s from the definition, and from its first batch.

    From the first batch on is what the live figure is (a drain timed from its first commit): the
    start-up before it (the runner's look for backfills, its child process started) is left out of
    both. None when the first batch was not seen before the end.
    """
    started = time.monotonic()
    catalog.define(conn, define)
    seen = wait_backfilled(conn, view, runner, timeout_s)
    ended = time.monotonic()
    after_first = None
    if seen.first_at is not None and ended > seen.first_at:
        after_first = (seen.offsets - seen.first_done) / (ended - seen.first_at)
    return seen.offsets / (ended - started), after_first, seen


def measure(args: argparse.Namespace) -> BenchResult:
    """Produce, drain live, backfill a view alone and one under a steady load, compare the views; all dropped after."""
    kafka, postgres = KafkaSettings(), PostgresSettings()
    run_id = uuid.uuid4().hex[:10]
    topic, schema, stream, group = f"bench-bf-{run_id}", f"bench_{run_id}", f"bench_bf_{run_id}", f"bench-bf-{run_id}"
    names = (schema, stream, topic, group)
    owner = owner_conninfo(postgres)
    views = page_views(args.events, args.urls, args.seed)
    results = Results()
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    create_topic(admin, topic, args.partitions)
    live, alone, loaded, plain = (
        sql.Identifier(schema, name) for name in ("live_stats", "new_stats", "loaded_stats", "plain_stats")
    )
    check: list[str] = []
    drain: Drain | None = None
    markers = 0
    notes: list[str] = []  # cores busy per process under each load; the freshness timelines
    try:
        results.measure("producer", lambda: produce_all(topic, range(args.events), views.encode, kafka))
        with throwaway_definitions(schema, definitions(*names, "live_stats"), [stream], postgres):
            settings = {
                name: str(value)
                for name, value in (
                    ("PIPELINE_BACKFILL_BATCH_MAX", args.backfill_batch_max),
                    ("PIPELINE_BACKFILL_PAUSE_S", args.backfill_pause_s),
                    ("PIPELINE_BACKFILL_NICE", args.backfill_nice),
                    ("PIPELINE_BACKFILL_YIELD_LAG", args.backfill_yield_lag),
                )
                if value is not None
            }  # unset: the runner's defaults
            runner = PipelineWorkers(
                1, topic=topic, stream=stream, group=group, postgres=postgres, kafka=kafka, settings=settings
            )
            try:
                with psycopg.connect(owner, autocommit=True) as conn:
                    drain = wait_drained(conn, runner, high_watermarks(topic, kafka))
                    results.values["live"] = drain.rate(args.events)
                    # 1. the backfill alone, beside the live figure on the same view and backlog
                    define = definitions(*names, "new_stats")[1]
                    whole, after_first, _ = backfill_rate(conn, define, f"{schema}.new_stats", runner, args.timeout)
                    results.values["backfill_whole"] = whole
                    if after_first is not None:
                        results.values["backfill"] = after_first
                    # Checked now, then dropped: left in place, it would be a third view for every live
                    # batch of the next step, whose load is set from the drain of one view.
                    check = same_rows(conn, live, alone)
                    catalog.drop(conn, [f"{schema}.new_stats"], "view")
                    # 2. another backfill while page views flow: the live view's freshness meanwhile
                    load = (topic, views, args.live_rate or results.values["live"] / 4, owner, kafka, live)

                    def backfilled() -> tuple[float | None, Backfilled]:
                        define = definitions(*names, "loaded_stats")[1]
                        rate, _, seen = backfill_rate(conn, define, f"{schema}.loaded_stats", runner, args.timeout)
                        return rate, seen

                    phase = under_load(runner, args, load, backfilled, "backfill")
                    markers += len(phase.samples)
                    for key, within in (("baseline", phase.baseline()), ("freshness", phase.during())):
                        if within:
                            results.values[f"{key}_p50"] = percentile(within, 50)
                            results.values[f"{key}_p99"] = percentile(within, 99)
                    if phase.backfill_rate is not None:
                        results.values["backfill_loaded"] = phase.backfill_rate
                    results.values["steady_rate"] = phase.steady_rate
                    if args.samples:
                        write_samples(args.samples, phase.samples, phase.started, phase.joined_at)
                    notes += phase.cpu_notes
                    notes.append(
                        f"freshness p99 (ms) per {TIMELINE_S:g} s from the backfill's definition (* it joined the"
                        f" live runner): {timeline(phase.samples, phase.started, phase.load_end, phase.joined_at)}"
                    )
                    # 3. every view equals the live one; the live one counts every page view produced
                    wait_drained(conn, runner, high_watermarks(topic, kafka))
                    check += same_rows(conn, live, loaded)
                    produced = phase.produced
                    # 4. the same load and window with the same view defined WITH (backfill = 'none'):
                    # what one more view costs the live runner, with no backfill at all.
                    catalog.drop(conn, [f"{schema}.loaded_stats"], "view")
                    window = phase.load_end - phase.started

                    def without_backfill() -> tuple[float | None, Backfilled]:
                        catalog.define(conn, definitions(*names, "plain_stats", "backfill = 'none'")[1])
                        time.sleep(window)
                        return None, Backfilled(0)

                    plain_phase = under_load(runner, args, load, without_backfill, "plain")
                    markers += len(plain_phase.samples)
                    if within := plain_phase.during():
                        results.values["plain_p50"] = percentile(within, 50)
                        results.values["plain_p99"] = percentile(within, 99)
                    results.values["plain_rate"] = plain_phase.steady_rate
                    notes.append(
                        f"same, with the second view defined WITH (backfill = 'none'): "
                        f"{timeline(plain_phase.samples, plain_phase.started, plain_phase.load_end, None)}"
                    )
                    produced += plain_phase.produced
                    wait_drained(conn, runner, high_watermarks(topic, kafka))
                    (count,) = conn.execute(
                        sql.SQL("SELECT sum(views) FROM {} WHERE url NOT LIKE '/marker/%'").format(live)
                    ).fetchone()
                    if count != args.events + produced:
                        check.append(f"live_stats counts {count} page views, produced {args.events + produced}")
                    (missing,) = conn.execute(  # everything plain_stats counts, live_stats counts alike
                        sql.SQL(
                            "SELECT count(*) FROM {} AS p LEFT JOIN {} AS l USING (url)"
                            " WHERE l.views IS NULL OR l.views < p.views"
                        ).format(plain, live)
                    ).fetchone()
                    if missing:
                        check.append(f"{missing} urls counted more by plain_stats than by live_stats")
            finally:
                runner.stop()
    finally:
        forget_group(owner, group, topic, kafka)
        delete_topic(admin, topic)
    comparisons = [
        Comparison("backfill / live runner, same view and backlog (events/s)", "backfill", "live", target=0.8),
        Comparison("live view freshness p99 during a backfill", "freshness_p99", limit=1000.0, unit="ms"),
    ]
    header = [
        f"backfill benchmark ({machine_line(postgres)})",
        f"  workload: {args.events:,} retained page views (loadgen.workloads.pageviews), {args.urls:,} urls,"
        f" topic of {args.partitions} partitions; view: {VIEWS['basic'].select.format(stream='<stream>')}",
        "  one runner; its backfill process catches up new_stats alone (then dropped), then loaded_stats while"
        " page views flow; then plain_stats, the same view WITH (backfill = 'none'), under the same load",
    ]
    rows = [
        ("producer -> Kafka (msgs/s)", "producer"),
        ("live runner draining the backlog into live_stats (events/s)", "live"),
        ("backfill of new_stats from the same backlog, from its first batch (events/s)", "backfill"),
        ("  same, from the definition (its process's start-up too)", "backfill_whole"),
        ("backfill of loaded_stats under the steady load (events/s)", "backfill_loaded"),
        ("steady load meanwhile (page views/s, bench producer)", "steady_rate"),
        ("live_stats freshness p50 under that load, before the backfill (ms)", "baseline_p50"),
        ("  same, p99 (ms)", "baseline_p99"),
        ("live_stats freshness p50 during that backfill (ms)", "freshness_p50"),
        ("live_stats freshness p99 during that backfill (ms)", "freshness_p99"),
        ("the same load again (page views/s)", "plain_rate"),
        ("live_stats freshness p50 as long after plain_stats, the same view without backfill (ms)", "plain_p50"),
        ("  same, p99: one more view's own cost to the live view (ms)", "plain_p99"),
    ]
    if drain:
        notes.insert(0, f"{markers} markers in all; live drain: {drain.describe(args.events, 'events')}")
    return BenchResult.of(
        "backfill",
        results,
        rows,
        comparisons=comparisons,
        check=check
        or "new_stats and loaded_stats equal live_stats; live_stats counts every page view produced, plain_stats"
        " none it does not",
        header=header,
        notes=notes,
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m loadgen.backfill`."""
    parser = cli.parser(__doc__)
    parser.add_argument("--events", type=int, default=2_000_000, help="page views retained before the new view")
    parser.add_argument("--urls", type=int, default=10_000, help="distinct urls, drawn uniformly")
    parser.add_argument("--partitions", type=int, default=6, help="partitions of the bench topic")
    parser.add_argument(
        "--live-rate", type=float, default=0.0, help="steady page views/s (0: a quarter of the drain figure)"
    )
    parser.add_argument(
        "--backfill-batch-max", type=int, help="the runner's PIPELINE_BACKFILL_BATCH_MAX (default: its own)"
    )
    parser.add_argument(
        "--backfill-pause-s", type=float, help="the runner's PIPELINE_BACKFILL_PAUSE_S (default: its own)"
    )
    parser.add_argument(
        "--backfill-nice", type=int, help="the runner's PIPELINE_BACKFILL_NICE (default: its own; 0: not niced)"
    )
    parser.add_argument(
        "--backfill-yield-lag", type=int, help="the runner's PIPELINE_BACKFILL_YIELD_LAG (default: its own)"
    )
    parser.add_argument("--baseline-s", type=float, default=5.0, help="seconds of the load before the backfill")
    parser.add_argument(
        "--load-s", type=float, default=30.0, help="seconds the load goes on once the backfill started (at most)"
    )
    parser.add_argument(
        "--samples", help="write every marker's send time and latency to this CSV file (where the p99 comes from)"
    )
    parser.add_argument("--seed", type=int, default=1, help="same seed, same events")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds the backfill may take")
    return cli.run(parser, measure, "loadgen.backfill", argv)


if __name__ == "__main__":
    sys.exit(main())
