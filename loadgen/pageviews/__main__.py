"""Page views through one stream runner, next to a bare consumer of the same messages. Prints a table.

The issue's aggregation-heavy case: a declared stream of page views (`url` among `--urls` values,
`uid`, `latency`) and one continuous view per url, fed from a backlog of `--events` by ONE
`python -m pipelines.cv.runner` process. `--view` chooses the view (`loadgen.pageviews.views`):
`basic`, count(*), sum(latency) and max(latency), target >= 400,000 events/s; `issue13`, count(*),
count(DISTINCT uid), avg(latency) and percentile_cont(0.99), target >= 134,000 events/s (PipelineDB
1.0 on that view, fed by COPY); `issue13_hll`, the same with a HyperLogLog distinct count.
`--changes` makes the view record its change stream (`WITH (changes = true)`), to compare its cost.

1. Produce: `--events` JSON events `{"url": "/page/<n>", "uid": <int>, "latency": <ms, 2 decimals>}`
   to a new topic `bench-pv-<id>` (`--partitions`, keyed by url), urls uniform among `--urls`, uids
   uniform in 1..1,000,000, latency exponential with a mean of 80 ms; no `ts` (the stream takes the
   record's timestamp). Events are drawn before the clock; the rate includes encoding.
2. Bare consumer, median of `--passes` passes over the whole topic, each in a fresh group
   (`loadgen.common.kafka.bare_consumer_rate`): `.value()` only, + `orjson.loads`, + a msgspec Struct decoder.
3. Define stream `bench_pv_<id>` and view `bench_<id>.url_stats` (schema `bench_<id>`), start the
   runner (`--streams bench_pv_<id> --group bench-pv-<id>`, as sv_writer, default batch settings
   unless `--batch-max`) and time the drain in `ops.kafka_offsets` (`drain.wait_drained`),
   sampling the CPU of the runner, its PostgreSQL backends and the Kafka broker; then stop it and
   check the view against what was produced (each view's own check).

Every name is throwaway and dropped at the end, also on failure or Ctrl-C. A MISS never fails the
command; a wrong view does.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import psycopg
from confluent_kafka.admin import AdminClient
from psycopg import sql

from loadgen.common import cli
from loadgen.common.drain import Drain, high_watermarks, wait_drained
from loadgen.common.errors import BenchmarkError
from loadgen.common.kafka import bare_consumer_rate, produce_all
from loadgen.common.postgres import owner_conninfo
from loadgen.common.processes import PipelineWorkers, find_pid
from loadgen.common.report import BenchResult, Comparison, Results, drain_series, machine_line
from loadgen.common.throwaway import create_topic, delete_topic, forget_group, throwaway_definitions
from loadgen.pageviews.views import VIEWS, Checked, PageviewView
from loadgen.workloads.pageviews import LATENCY_MEAN_CENTS, UIDS, PageViews, page_views
from pipelines.logs import get_logger
from pipelines.settings import KafkaSettings, PostgresSettings

log = get_logger("loadgen.pageviews")

VIEW_NAME = "url_stats"  # the bench view, whichever `--view` defines it


class PageView(msgspec.Struct):
    """One event, as a typed msgspec decoder reads it (the third bare consumer variant)."""

    url: str
    latency: float
    uid: int | None = None


def definitions(schema: str, stream: str, topic: str, group: str, select: str, changes: bool = False) -> list[str]:
    """The bench stream (no key: append-only, so max() and sketches are allowed) and the view `select` defines.

    `changes`: the view records its change stream (WITH (changes = true), docs/results.md).

    The stream's `consumer_group` is the bench runner's: the supervised runner leaves it alone.
    """
    names = {
        "stream": sql.Identifier(stream),
        "view": sql.Identifier(schema, VIEW_NAME),
        "topic": sql.Literal(topic),
        "group": sql.Literal(group),
    }
    return [
        sql.SQL(text).format(**names).as_string(None)
        for text in (
            "CREATE STREAM {stream} (url text NOT NULL, uid bigint, latency double precision NOT NULL, ts timestamptz)"
            " WITH (topic = {topic}, timestamp_column = 'ts', consumer_group = {group})",
            "CREATE CONTINUOUS VIEW {view}" + (" WITH (changes = true)" if changes else "") + " AS " + select,
        )
    ]


@dataclass(frozen=True)
class RunnerRun:
    """One runner draining the backlog: timing, CPU, its own counts and the view's check."""

    events: int
    drain: Drain
    totals: dict[str, int]  # from the runner's "pipeline stopped" line: batches, records, changes, retries
    warnings: int
    exit_code: int
    log_path: str
    checked: Checked  # where the view differs from what was produced (none when right), and what was compared


def run_runner(
    names: tuple[str, str, str, str],
    views: PageViews,
    view: PageviewView,
    *,
    batch_max: int,
    kafka: KafkaSettings,
    postgres: PostgresSettings,
    changes: bool = False,
) -> RunnerRun:
    """Define the stream and `view`, drain the topic with one runner, stop it, check the view; drop it all.

    `names` are (topic, schema, stream, group); `batch_max` > 0 sets the runner's PIPELINE_BATCH_MAX.
    The drain is timed by polling `ops.kafka_offsets` every 50 ms from the process start to the poll
    that finds every partition at its end; the headline counts from the first poll that finds a
    committed batch.
    """
    topic, schema, stream, group = names
    owner = owner_conninfo(postgres)
    try:
        statements = definitions(schema, stream, topic, group, view.select, changes)
        with throwaway_definitions(schema, statements, [stream], postgres):
            ends = high_watermarks(topic, kafka)
            if sum(ends.values()) != len(views.urls):
                raise BenchmarkError(f"{topic} holds {sum(ends.values())} records, expected {len(views.urls)}")
            settings = {"PIPELINE_BATCH_MAX": str(batch_max)} if batch_max else {}
            runner = PipelineWorkers(
                1, topic=topic, stream=stream, group=group, postgres=postgres, kafka=kafka, settings=settings
            )
            runner.also_sampled["kafka"] = find_pid(b"kafka.Kafka")  # the broker serving the runner's fetches
            log.info("runner started", topic=topic, stream=stream, group=group, log=str(runner.log_paths[0]))
            try:
                with psycopg.connect(owner, autocommit=True) as conn:
                    drain = wait_drained(conn, runner, ends)
            finally:
                code = runner.stop()
            if drain.first_committed >= len(views.urls):
                raise BenchmarkError("the runner's first batches held the whole backlog: produce more (--events)")
            totals, warnings = runner.totals()
            with psycopg.connect(owner) as conn:
                checked = view.check(conn, sql.Identifier(schema, VIEW_NAME), views)
            return RunnerRun(len(views.urls), drain, totals, warnings, code, str(runner.log_paths[0]), checked)
    finally:
        forget_group(owner, group, topic, kafka)


Decode = bool | Callable[[bytes], object]  # what `bare_consumer_rate` does with each value


def bare_consumer(topic: str, count: int, passes: int, kafka: KafkaSettings, decode: Decode) -> float:
    """Median messages/s of `passes` bare consumer passes over the whole topic, each in a fresh group."""
    return statistics.median(bare_consumer_rate(topic, count, kafka=kafka, decode=decode) for _ in range(passes))


def measure(args: argparse.Namespace) -> BenchResult:
    """Produce, read back with bare consumers, drain with one runner, check the view; every name dropped after."""
    kafka, postgres = KafkaSettings(), PostgresSettings()
    run_id = uuid.uuid4().hex[:10]
    topic, schema, stream, group = f"bench-pv-{run_id}", f"bench_{run_id}", f"bench_pv_{run_id}", f"bench-pv-{run_id}"
    log.info("start", **vars(args), topic=topic, schema=schema, kafka=kafka.describe())
    view = VIEWS[args.view]
    views = page_views(args.events, args.urls, args.seed)
    results = Results()
    run: RunnerRun | None = None
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    create_topic(admin, topic, args.partitions)
    try:
        results.measure("producer", lambda: produce_all(topic, range(args.events), views.encode, kafka))
        if "producer" in results.values:
            variants: list[tuple[str, Decode]] = [
                ("consumer", False),
                ("consumer_json", True),
                ("consumer_msgspec", msgspec.json.Decoder(PageView).decode),
            ]
            for key, decode in variants:
                results.measure(key, lambda d=decode: bare_consumer(topic, args.events, args.passes, kafka, d))
            names = (topic, schema, stream, group)
            run = results.measure(
                "runner",
                lambda: run_runner(
                    names, views, view, batch_max=args.batch_max, kafka=kafka, postgres=postgres, changes=args.changes
                ),
            )
        if run is not None:
            results.values["runner"] = run.drain.rate(run.events)  # the headline: start-up excluded
            results.values["runner_startup"] = run.drain.rate_with_startup(run.events)
    finally:
        delete_topic(admin, topic)
    comparisons = [
        Comparison("runner / (bare consumer + orjson.loads)", "runner", "consumer_json"),
        Comparison("runner / (bare consumer + msgspec)", "runner", "consumer_msgspec"),
        Comparison("runner / bare consumer, .value() only", "runner", "consumer"),
        Comparison("runner events/s", "runner", target=1.0, fixed=view.target, fixed_label=view.target_source),
    ]
    header = [
        f"page views benchmark ({machine_line(postgres)})",
        f"  workload: {args.events:,} events, url uniform among {args.urls:,}, uid uniform in 1..{UIDS:,},"
        f" latency exponential (mean {LATENCY_MEAN_CENTS / 100:g} ms, 2 decimals), no ts field (the stream's ts"
        f" takes the record timestamp); topic of {args.partitions} partitions keyed by url",
        f"  view {args.view}: {view.select.format(stream='<stream>')} (one runner)"
        + (", WITH (changes = true)" if args.changes else ""),
    ]
    series, check = {}, None
    if run is not None:
        label = f"page views, one runner, view {args.view} (loadgen.pageviews)"
        drain = drain_series(run.drain.samples, label=label, total=run.events, first_commit=run.drain.startup_seconds)
        series["drains"] = {f"pageviews_{args.view}": drain}
        check = run.checked.problems or f"{run.checked.compared} match what was produced"
    rows = [
        ("producer -> Kafka (msgs/s)", "producer"),
        (f"bare consumer, .value() only (msgs/s, median of {args.passes})", "consumer"),
        ("bare consumer + orjson.loads (msgs/s)", "consumer_json"),
        ("bare consumer + msgspec Struct decode (msgs/s)", "consumer_msgspec"),
        ("stream runner x1, from first commit (events/s)", "runner"),
        ("  same, from process start (events/s)", "runner_startup"),
    ]
    return BenchResult.of(
        f"pageviews_{args.view}",
        results,
        rows,
        comparisons=comparisons,
        check=check,
        header=header,
        notes=notes(run),
        series=series,
    )


def notes(run: RunnerRun | None) -> list[str]:
    """The drain's start-up, the runner's batches, the cores busy, the runner's exit and log."""
    if run is None:
        return []
    drain, out = run.drain, []
    out.append(
        f"drain: {drain.describe(run.events, 'events')}  (postgres = the runner's backends, kafka = the broker;"
        f" bench = this process, polling); {drain.commits} distinct offset totals seen by the 50 ms polls"
    )
    if run.totals.get("batches"):
        out.append(
            f"runner batches: {run.totals['batches']:,} of {run.totals['records'] / run.totals['batches']:,.0f}"
            f" records on average; {run.totals.get('retries', 0)} retries, {run.warnings} warnings logged"
        )
    if run.exit_code:
        out.append(f"runner exited {run.exit_code} on SIGTERM")
    out.append(f"runner log: {run.log_path}")
    return out


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m loadgen.pageviews`."""
    parser = cli.parser(__doc__)
    parser.add_argument("--view", choices=sorted(VIEWS), default="basic", help="the view over the stream")
    parser.add_argument("--events", type=int, default=2_000_000, help="page views produced and drained")
    parser.add_argument("--urls", type=int, default=10_000, help="distinct urls, drawn uniformly")
    parser.add_argument("--partitions", type=int, default=6, help="partitions of the bench topic")
    parser.add_argument("--passes", type=int, default=3, help="bare consumer passes per variant (the median)")
    parser.add_argument("--seed", type=int, default=1, help="same seed, same events")
    parser.add_argument("--batch-max", type=int, default=0, help="the runner's PIPELINE_BATCH_MAX, 0 = its default")
    parser.add_argument("--changes", action="store_true", help="the view records its changes (WITH (changes = true))")
    return cli.run(parser, measure, "loadgen.pageviews", argv)


if __name__ == "__main__":
    sys.exit(main())
