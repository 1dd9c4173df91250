"""Page views through one stream runner, next to a bare consumer of the same messages. Prints a table.

The issue's aggregation-heavy case: a declared stream of page views (`url` among `--urls` values,
`uid`, `latency`) and a continuous view with count(*), sum(latency) and max(latency) per url, fed
from a backlog of `--events` by ONE `python -m pipelines.cv.runner` process. Targets: >= 400,000
events/s, and >= 50% of a bare consumer that reads and JSON-decodes the same messages.

1. Produce: `--events` JSON events `{"url": "/page/<n>", "uid": <int>, "latency": <ms, 2 decimals>}`
   to a new topic `bench-pv-<id>` (`--partitions`, keyed by url), urls uniform among `--urls`, uids
   uniform in 1..1,000,000, latency exponential with a mean of 80 ms; no `ts` (the stream takes the
   record's timestamp). Events are drawn before the clock; the rate includes encoding.
2. Bare consumer, median of `--passes` passes over the whole topic, each in a fresh group
   (`seed_baselines.bare_consumer_rate`): `.value()` only, + `orjson.loads`, + a msgspec Struct decoder.
3. Define stream `bench_pv_<id>` and view `bench_<id>.url_stats` (schema `bench_<id>`), start the
   runner (`--streams bench_pv_<id> --group bench-pv-<id>`, as sv_writer, default batch settings
   unless `--batch-max`) and time the drain in `ops.kafka_offsets` (`bench_streamviews.wait_drained`),
   sampling the CPU of the runner, its PostgreSQL backends and the Kafka broker; then stop it and
   check the view against what was produced.

Every name is throwaway and dropped at the end, also on failure or Ctrl-C. Figures only: a MISS
never fails the command (a wrong view does).

Usage: `python -m loadgen.bench_pageviews [--events 2000000] [--urls 10000]`.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import statistics
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import orjson
import psycopg
from confluent_kafka.admin import AdminClient
from psycopg import sql
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from loadgen import seed_baselines as seed
from loadgen.audit_pipelines import find_pid
from loadgen.bench_social import Results, create_topic
from loadgen.bench_streamviews import (
    Drain,
    PipelineWorkers,
    delete_topic,
    forget_group,
    high_watermarks,
    throwaway_definitions,
    wait_drained,
)
from loadgen.seed_baselines import BenchmarkError
from loadgen.workload import EventSource, new_rng
from pipelines.logs import configure_logging, get_logger
from pipelines.settings import KafkaSettings, PostgresSettings

log = get_logger("loadgen.bench_pageviews")

UIDS = 1_000_000  # uids are uniform in 1..UIDS
LATENCY_MEAN_CENTS = 8_000  # latency in hundredths of a millisecond: exponential, mean 80 ms
TARGET_EVENTS_PER_S = 400_000
TARGET_SHARE = 0.5  # runner / (bare consumer + orjson.loads)
CHECKED_URLS = 5  # urls whose view row is compared in full


class PageviewSettings(BaseSettings):
    """Size of one run, from `BENCH_*` variables."""

    model_config = SettingsConfigDict(env_prefix="BENCH_", extra="ignore", frozen=True)

    # The events: how many, over how many urls, drawn from which seed.
    events: int = Field(2_000_000, gt=0, description="page views produced and drained")
    urls: int = Field(10_000, gt=0, description="distinct urls, drawn uniformly")
    seed: int = 1
    # Kafka: the bench topic, and the bare consumer read against the runner.
    partitions: int = Field(6, gt=0, description="partitions of the bench topic")
    passes: int = Field(3, gt=0, description="bare consumer passes per variant (the median is shown)")
    # The runner: records per batch (PIPELINE_BATCH_MAX of its environment); 0 = its default.
    batch_max: int = Field(0, ge=0, description="the runner's batch_max, 0 = its default")


class PageView(msgspec.Struct):
    """One event, as a typed msgspec decoder reads it (the third bare consumer variant)."""

    url: str
    latency: float
    uid: int | None = None


@dataclass(frozen=True)
class PageViews:
    """The events, column by column (url index, uid, latency in hundredths of ms), and their url names."""

    urls: list[int]
    uids: list[int]
    cents: list[int]
    names: list[str]

    def encode(self, i: int) -> tuple[bytes, bytes]:
        """Key (the url) and JSON value of event `i`."""
        url = self.names[self.urls[i]]
        return url.encode(), orjson.dumps({"url": url, "uid": self.uids[i], "latency": self.cents[i] / 100})

    def expected(self) -> dict[str, tuple[int, int, int]]:
        """What url_stats must hold: url -> (views, total latency in cents, max latency in cents)."""
        views, total, peak = [0] * len(self.names), [0] * len(self.names), [0] * len(self.names)
        for url, cents in zip(self.urls, self.cents, strict=True):
            views[url] += 1
            total[url] += cents
            peak[url] = max(peak[url], cents)
        return {name: (views[i], total[i], peak[i]) for i, name in enumerate(self.names) if views[i]}


def page_views(count: int, urls: int, seed: int) -> PageViews:
    """`count` events: urls uniform among `urls`, uids uniform, latencies exponential with 2 decimals."""
    rng = new_rng(seed)
    random, expo = rng.random, rng.expovariate
    return PageViews(
        [int(random() * urls) for _ in range(count)],
        [1 + int(random() * UIDS) for _ in range(count)],
        [1 + int(expo(1 / LATENCY_MEAN_CENTS)) for _ in range(count)],
        [f"/page/{n}" for n in range(urls)],
    )


def definitions(schema: str, stream: str, topic: str, group: str) -> list[str]:
    """The bench stream (no key: append-only, so max() is allowed) and its aggregating view.

    The stream's `consumer_group` is the bench runner's: the supervised runner leaves it alone.
    """
    names = {
        "stream": sql.Identifier(stream),
        "view": sql.Identifier(schema, "url_stats"),
        "topic": sql.Literal(topic),
        "group": sql.Literal(group),
    }
    return [
        sql.SQL(text).format(**names).as_string(None)
        for text in (
            "CREATE STREAM {stream} (url text NOT NULL, uid bigint, latency double precision NOT NULL, ts timestamptz)"
            " WITH (topic = {topic}, timestamp_column = 'ts', consumer_group = {group})",
            "CREATE CONTINUOUS VIEW {view} AS SELECT url, count(*) AS views, sum(latency) AS total_latency,"
            " max(latency) AS max_latency FROM {stream} GROUP BY url",
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
    problems: list[str]  # where the view differs from what was produced; empty when right


def run_runner(
    names: tuple[str, str, str, str],
    views: PageViews,
    *,
    batch_max: int,
    kafka: KafkaSettings,
    postgres: PostgresSettings,
) -> RunnerRun:
    """Define the stream and view, drain the topic with one runner, stop it, check the view; drop it all.

    `names` are (topic, schema, stream, group); `batch_max` > 0 sets the runner's PIPELINE_BATCH_MAX.
    The drain is timed by polling `ops.kafka_offsets` every 50 ms from the process start to the poll
    that finds every partition at its end; the headline counts from the first poll that finds a
    committed batch.
    """
    topic, schema, stream, group = names
    owner = seed.owner_conninfo(postgres)
    try:
        with throwaway_definitions(schema, definitions(schema, stream, topic, group), [stream], postgres):
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
            problems = check_view(owner, schema, views)
            return RunnerRun(len(views.urls), drain, totals, warnings, code, str(runner.log_paths[0]), problems)
    finally:
        forget_group(owner, group, topic, kafka)


def check_view(conninfo: str, schema: str, views: PageViews) -> list[str]:
    """Compare url_stats with the produced events: totals over all urls, every column for a few urls."""
    expected = views.expected()
    table = sql.Identifier(schema, "url_stats")
    sample = sorted(expected)[:: max(1, len(expected) // CHECKED_URLS)][:CHECKED_URLS]
    with psycopg.connect(conninfo) as conn:
        urls, count, total = conn.execute(
            sql.SQL("SELECT count(*), coalesce(sum(views), 0), coalesce(sum(total_latency), 0) FROM {}").format(table)
        ).fetchone()
        rows = conn.execute(
            sql.SQL("SELECT url, views, total_latency, max_latency FROM {} WHERE url = ANY(%s)").format(table),
            (sample,),
        ).fetchall()
    problems = []
    produced = sum(cents for _, cents, _ in expected.values()) / 100
    if (urls, count) != (len(expected), len(views.urls)):
        problems.append(f"{urls} urls / {count} views in the view, produced {len(expected)} / {len(views.urls)}")
    if not math.isclose(total, produced, rel_tol=1e-9):
        problems.append(f"sum(total_latency) = {total!r}, produced {produced!r}")
    found = {url: (n, t, m) for url, n, t, m in rows}
    for url in sample:
        n, cents, peak = expected[url]
        got = found.get(url)
        if got is None or got[0] != n or not math.isclose(got[1], cents / 100, rel_tol=1e-9) or got[2] != peak / 100:
            problems.append(f"{url}: {got}, expected ({n}, {cents / 100}, {peak / 100})")
    return problems


Decode = bool | Callable[[bytes], object]  # what `seed.bare_consumer_rate` does with each value


def bare_consumer(topic: str, count: int, passes: int, kafka: KafkaSettings, decode: Decode) -> float:
    """Median messages/s of `passes` bare consumer passes over the whole topic, each in a fresh group."""
    return statistics.median(seed.bare_consumer_rate(topic, count, kafka=kafka, decode=decode) for _ in range(passes))


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m loadgen.bench_pageviews`."""
    defaults = PageviewSettings()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=defaults.events, help="page views (BENCH_EVENTS)")
    parser.add_argument("--urls", type=int, default=defaults.urls, help="distinct urls (BENCH_URLS)")
    parser.add_argument(
        "--partitions", type=int, default=defaults.partitions, help="topic partitions (BENCH_PARTITIONS)"
    )
    parser.add_argument("--passes", type=int, default=defaults.passes, help="bare consumer passes (BENCH_PASSES)")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="same seed, same events (BENCH_SEED)")
    parser.add_argument(
        "--batch-max",
        type=int,
        default=defaults.batch_max,
        help="the runner's batch_max, 0 = its default (BENCH_BATCH_MAX)",
    )
    args = parser.parse_args(argv)
    configure_logging()
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # clean up on SIGTERM as on Ctrl-C
    kafka, postgres = KafkaSettings(), PostgresSettings()
    run_id = uuid.uuid4().hex[:10]
    topic, schema, stream, group = f"bench-pv-{run_id}", f"bench_{run_id}", f"bench_pv_{run_id}", f"bench-pv-{run_id}"
    log.info("start", **vars(args), topic=topic, schema=schema, kafka=kafka.describe())

    views = page_views(args.events, args.urls, args.seed)
    results = Results()
    run: RunnerRun | None = None
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    create_topic(admin, topic, args.partitions)
    try:

        def produce() -> float:
            report = EventSource(topic, range(args.events), views.encode, kafka=kafka, count=args.events).run()
            if report.errors:
                raise BenchmarkError(f"producer: {report.errors} delivery errors, first: {report.first_error}")
            return report.rate

        results.measure("producer", produce)
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
                "runner", lambda: run_runner(names, views, batch_max=args.batch_max, kafka=kafka, postgres=postgres)
            )
        if run is not None:
            results.values["runner"] = run.drain.rate(run.events)  # the headline: start-up excluded
            results.values["runner_startup"] = run.drain.rate_with_startup(run.events)
    finally:
        delete_topic(admin, topic)
    print_report(args, results, run)
    failed = any(note.startswith("failed") for note in results.notes.values())
    return 1 if failed or (run is not None and run.problems) else 0


def print_report(args: argparse.Namespace, results: Results, run: RunnerRun | None) -> None:
    """The table, the targets and the notes."""
    facts = seed.postgres_facts()
    cores = os.cpu_count()
    print(
        f"\npage views benchmark ({cores} cores; PostgreSQL {facts.get('server_version')},"
        f" synchronous_commit={facts.get('synchronous_commit')}, shared_buffers={facts.get('shared_buffers')})"
    )
    print(
        f"  workload: {args.events:,} events, url uniform among {args.urls:,}, uid uniform in 1..{UIDS:,},"
        f" latency exponential (mean {LATENCY_MEAN_CENTS / 100:g} ms, 2 decimals), no ts field (the stream's ts"
        f" takes the record timestamp); topic of {args.partitions} partitions keyed by url"
    )
    print("  view: SELECT url, count(*), sum(latency), max(latency) FROM <stream> GROUP BY url (one runner)\n")
    for label, key in (
        ("producer -> Kafka (msgs/s)", "producer"),
        (f"bare consumer, .value() only (msgs/s, median of {args.passes})", "consumer"),
        ("bare consumer + orjson.loads (msgs/s)", "consumer_json"),
        ("bare consumer + msgspec Struct decode (msgs/s)", "consumer_msgspec"),
        ("stream runner x1, from first commit (events/s)", "runner"),
        ("  same, from process start (events/s)", "runner_startup"),
    ):
        print(f"  {label:<58}{results.show(key):>14}")
    print("\n  targets")
    for label, denominator, target in (
        ("runner / (bare consumer + orjson.loads)", "consumer_json", TARGET_SHARE),
        ("runner / (bare consumer + msgspec)", "consumer_msgspec", None),
        ("runner / bare consumer, .value() only", "consumer", None),
    ):
        verdict = f"    {results.verdict('runner', denominator, target)}" if target else ""
        print(f"  {label:<58}{results.ratio('runner', denominator):>14}{verdict}")
    if "runner" in results.values:
        met = "PASS" if results.values["runner"] >= TARGET_EVENTS_PER_S else "MISS"
        verdict = f">= {TARGET_EVENTS_PER_S:,}/s  {met}"
    else:
        verdict = f">= {TARGET_EVENTS_PER_S:,}/s  (pending)"
    print(f"  {'runner events/s':<58}{results.show('runner'):>14}    {verdict}")
    if run is None:
        return
    drain, notes = run.drain, []
    notes.append(
        f"drain: {run.events - drain.first_committed:,} events in {drain.drain_seconds:.2f}s after"
        f" {drain.startup_seconds:.2f}s of start-up (interpreter, group join, first batches of"
        f" {drain.first_committed:,}); {drain.commits} distinct offset totals seen by the 50 ms polls"
    )
    if run.totals.get("batches"):
        notes.append(
            f"runner batches: {run.totals['batches']:,} of {run.totals['records'] / run.totals['batches']:,.0f}"
            f" records on average; {run.totals.get('retries', 0)} retries, {run.warnings} warnings logged"
        )
    cpu = drain.cpu_done.cores_since(drain.cpu_start)
    notes.append(
        f"cores busy during the drain (of {cores}): "
        + ", ".join(f"{role} {value:.2f}" for role, value in cpu.items())
        + "  (postgres = the runner's backends, kafka = the broker; bench = this process, polling)"
    )
    notes.append(
        "view check: "
        + (
            "; ".join(run.problems)
            if run.problems
            else f"sum(views) = {run.events:,}, sum(total_latency) and"
            f" every column of {CHECKED_URLS} urls match what was produced"
        )
    )
    if run.exit_code:
        notes.append(f"runner exited {run.exit_code} on SIGTERM")
    notes.append(f"runner log: {run.log_path}")
    print("\n  notes")
    for note in notes:
        print(f"  - {note}")


if __name__ == "__main__":
    sys.exit(main())
