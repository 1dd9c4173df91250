"""An upsert sink on the page-views view: ingest with it against without, and event -> record latency.

Issue 25's performance figures for sinks (`CREATE SINK`, docs/results.md "Sinks"):

1. Produce `--events` page views (loadgen.workloads.pageviews: url uniform among `--urls`) to a
   topic of `--partitions`.
2. Drain it six times a round (`--rounds`, default 2), each in a throwaway schema, stream and
   consumer group, with the `basic` view of loadgen.pageviews (count, sum, max per url) and ONE
   runner: without a sink (A), with the view recording its changes and no sink (B: what the change
   stream itself costs the runner, images and all: `changes = true`), with an upsert sink on the
   view (C: its changes recorded, keys only, and the sinks' relay of the run's group publishing
   them, `python -m pipelines.cv.relay --group G`), then C, B, A again (so drift on a shared
   machine weighs on all alike). Each drain is timed in ops.kafka_offsets from its first commit;
   each variant's figure is the median of its runs; the target is C >= 0.9x A. A sink run also
   times the relay's catch-up after the drain. The drains' CPU is printed per process (cores busy,
   median per variant): the runner, its PostgreSQL session, the relay, the relay's, Kafka. Two
   rounds, not one: on this two-core machine one run's ratio moved between 0.68x and 0.98x in a day
   (docs/performance.md).
3. Latency: a fresh topic, the view with its sink, the runner and the relay started; page views
   produced steadily at half the with-sink rate of step 2 for `--seconds`, plus a marker page view
   (a url of its own) every 20 ms; a consumer of the sink's topic times each marker's first record
   after it was handed to the producer. p50 and p99; the target is p99 < 1 s. The p50 of each
   stage is printed too: event -> the transaction of its batch began (cv.view_changes.committed_at:
   Kafka, the runner's batching and its queue), -> the relay produced its record (the rest of the
   transaction, the notification and the relay's page; the record's Kafka timestamp), -> a
   consumer read it. The events are encoded before the clock starts: encoding them on the fly cost
   the producing process 0.52 instead of 0.37 of a core at 134,000 events/s, taken from the
   processes measured on the same cores.
4. The sustained rate: step 2's drains have the machine to themselves, step 3 shares it with the
   load producer, Kafka and the relay. Step 3 also takes the events/s the runner committed over
   its second half. Below the rate offered (the runner did not keep up), that is the rate it
   sustains here; so is the rate offered when the runner committed it but with a queue (stage 1
   over half a second: at capacity, as far behind as it fell at the start). Then step 3 runs again
   at half of it (loadgen.backfill takes its steady load at half the sustained rate the same way).
   The target reads that run's p99, or step 3's when the runner kept up.

Every name is throwaway and dropped at the end, also on failure or Ctrl-C.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from confluent_kafka.admin import AdminClient

from loadgen.common import cli
from loadgen.common.errors import BenchmarkError
from loadgen.common.freshness import MARKER_INTERVAL_S, percentile
from loadgen.common.kafka import Sender, produce_all
from loadgen.common.report import BenchResult, Comparison, FigureRow, Results, machine_line
from loadgen.common.throwaway import create_topic, delete_topic, unique_name
from loadgen.sink.runs import VIEW, RecordProbe, SinkRun
from loadgen.workloads.pageviews import page_views
from pipelines.logs import get_logger
from pipelines.settings import KafkaSettings, PostgresSettings

log = get_logger("loadgen.sink")

# The stages of the latency's p50 (`stages`).
STAGES = ("to_commit", "to_record", "to_reader")
# Without (A), changes recorded without a sink (B), with the sink (C): A B C C B A, `--rounds` times.
ORDER = ("without", "changes", "with", "with", "changes", "without")
VARIANTS = ("without", "changes", "with")
# The processes whose CPU a drain samples (loadgen.common.drain.CpuSample), as the notes name them.
CPU_ROLES = {
    "pipeline": "runner",
    "postgres": "its PostgreSQL",
    "relay": "relay",
    "relay_postgres": "relay's PostgreSQL",
    "kafka": "Kafka",
    "machine": "machine",
}


def throughput(args: argparse.Namespace, kafka: KafkaSettings, postgres: PostgresSettings) -> dict[str, list[float]]:
    """Events/s of each variant's drains (ABBA), the relay's catch-up seconds after each sink drain.

    Also each drain's cores busy per process, under `<variant>.<role>` (roles of `CPU_ROLES`).
    """
    views = page_views(args.events, args.urls, args.seed)
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    topic = unique_name("bench-sink-pv", sep="-")
    create_topic(admin, topic, args.partitions)
    figures: dict[str, list[float]] = {"without": [], "changes": [], "with": [], "catch_up": []}
    try:
        produce_all(topic, range(args.events), views.encode, kafka)
        for variant in ORDER * args.rounds:
            sink, changes = variant == "with", variant == "changes"
            with SinkRun(topic, sink=sink, changes=changes, kafka=kafka, postgres=postgres).running() as run:
                drain = run.drain()
                figures[variant].append(drain.rate(args.events))
                for role, cores in drain.cpu_done.cores_since(drain.cpu_start).items():
                    figures.setdefault(f"{variant}.{role}", []).append(cores)
                if sink:
                    figures["catch_up"].append(run.relay_caught_up())
                run.check(views)
                log.info("drained", variant=variant, events_per_s=round(drain.rate(args.events)))
    finally:
        delete_topic(admin, topic)
    return figures


def latency(
    args: argparse.Namespace, rate: float, kafka: KafkaSettings, postgres: PostgresSettings
) -> tuple[list[float], dict[str, float]]:
    """Milliseconds from producing each marker page view to its first record on the sink's topic, and its stages.

    The stages come with `kept`: the events/s the runner committed over the load's second half (what
    it sustains with the producer on the same machine, when that is below the rate offered).
    """
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    topic = unique_name("bench-sink-lat", sep="-")
    create_topic(admin, topic, args.partitions)
    count = int(rate * args.seconds)
    views = page_views(count, args.urls, args.seed + 1)
    encoded = [views.encode(i) for i in range(count)]
    try:
        with SinkRun(topic, sink=True, kafka=kafka, postgres=postgres).running() as run:
            assert run.runner is not None
            deadline = time.monotonic() + 60
            while not run.runner.settled(range(args.partitions)):  # the runner holds every partition
                run.runner.check_alive()
                if time.monotonic() > deadline:
                    raise BenchmarkError("the runner did not take its partitions within 60 s")
                time.sleep(0.1)
            sender = Sender(topic, kafka, client="bench-sink")
            run.relay_caught_up()  # its snapshot published, so its topic exists
            probe = RecordProbe(run.out, kafka)
            probe.start()
            try:
                started = time.monotonic()
                produced, markers, next_marker = 0, 0, started
                halfway: tuple[float, int] | None = None  # when the load's second half began, and the offsets then
                while (now := time.monotonic()) < started + args.seconds:
                    if halfway is None and now >= started + args.seconds / 2:
                        halfway = (now, run.committed())
                    due = min(int((now - started) * rate), count)
                    while produced < due:
                        sender.send(*encoded[produced])
                        produced += 1
                    if now >= next_marker:
                        url = f"/marker/{markers}"
                        probe.sent(url, time.monotonic())
                        sender.send(url.encode(), f'{{"url": "{url}", "uid": 1, "latency": 1.0}}'.encode())
                        markers += 1
                        next_marker += MARKER_INTERVAL_S
                    sender.producer.poll(0)
                    time.sleep(max(0.0, min(0.001, next_marker - time.monotonic())))
                assert halfway is not None
                kept = (run.committed() - halfway[1]) / (time.monotonic() - halfway[0])
                sender.flush()
                sender.check()
                probe.wait_for_markers(60, run.runner.check_alive)
            finally:
                probe.stop()
                probe.join(10)
            if probe.error is not None:
                raise BenchmarkError(f"record probe: {probe.error}") from probe.error
            if probe.pending:
                raise BenchmarkError(f"{probe.pending} of {markers} markers never reached the sink's topic")
            log.info("latency measured", produced=produced, markers=markers, seconds=args.seconds)
            return [1000 * s for s in probe.latencies], stages(probe, run.commit_times()) | {"kept": kept}
    finally:
        delete_topic(admin, topic)


def stages(probe: RecordProbe, committed: dict[str, float]) -> dict[str, float]:
    """The p50 (ms) of each stage of the markers' way: to their batch's transaction, to the relay's record, on."""
    markers = [m for m in probe.produced_at if m in committed]
    if not markers:
        return {}
    return {
        "to_commit": percentile([committed[m] - probe.sent_at[m] for m in markers], 50),
        "to_record": percentile([probe.produced_at[m] - committed[m] for m in markers], 50),
        "to_reader": percentile([probe.read_at[m] - probe.produced_at[m] for m in markers], 50),
    }


# A steady load the runner committed at least this share of was kept up with, unless its queue was
# long: stage 1's p50 (its batching and queue) over AT_CAPACITY_MS is a runner at capacity, which
# commits what is offered but stays as far behind as it fell at the start (make bench at 6d7aaa5:
# 172,339 of 169,868 events/s committed, stage 1 at 1,820 ms). Unqueued, stage 1 measured 136-231 ms.
KEPT_UP = 0.97
AT_CAPACITY_MS = 500.0


def latency_at(
    results: Results,
    prefix: str,
    rate: float,
    args: argparse.Namespace,
    kafka: KafkaSettings,
    postgres: PostgresSettings,
) -> None:
    """One latency run at `rate`: its figures under `prefix` (the rate, p50, p99, the stages, what the runner kept)."""
    step = f"{prefix}latency"
    results.values[f"{prefix}latency_rate"] = rate
    measured = results.measure(step, lambda: latency(args, rate, kafka, postgres))
    if measured:
        latencies, split = measured
        results.values[f"{prefix}p50"] = percentile(latencies, 50)
        results.values[f"{prefix}p99"] = percentile(latencies, 99)
        results.values.update({prefix + key: value for key, value in split.items()})
    results.same_note([prefix + key for key in ("p50", "p99", "kept", *STAGES)], step)


def latency_rows(prefix: str, load: str, where: str) -> list[FigureRow]:
    """The table rows of one latency run (`latency_at` with `prefix`): its load, p50 and its stages, p99."""
    return [
        (load, f"{prefix}latency_rate"),
        ("  same, committed by the runner meanwhile (events/s, the load's second half)", f"{prefix}kept"),
        (f"event -> its record {where}, p50 (ms)", f"{prefix}p50", ".0f"),
        ("  same, stage 1: -> its batch's transaction began (ms)", f"{prefix}to_commit", ".0f"),
        ("  same, stage 2: -> the relay produced its record (ms)", f"{prefix}to_record", ".0f"),
        ("  same, stage 3: -> a consumer read it (ms)", f"{prefix}to_reader", ".0f"),
        (f"event -> its record {where}, p99 (ms)", f"{prefix}p99", ".0f"),
    ]


def measure(args: argparse.Namespace) -> BenchResult:
    """ABBA drains with and without the sink; the latency at half the with-sink rate, and at half what it sustains.

    The drains run alone on the machine; during a latency run the load producer, Kafka and the relay
    share its cores with the runner. So the rate the runner sustains is taken from that first run
    (what it committed over its second half), and when that is below the rate offered, or the
    runner committed it with a queue (`AT_CAPACITY_MS`), the latency is measured again at half of
    it (`loadgen.backfill` takes its steady load the same way): the figure the target reads. When
    the runner kept up, the first run is that figure already.
    """
    kafka, postgres = KafkaSettings(), PostgresSettings()
    results = Results()
    figures = None if args.rate else results.measure("throughput", lambda: throughput(args, kafka, postgres))
    if args.rate:
        results.values["with"] = 2 * args.rate  # the latency phase alone, at the rate given
    if figures:
        for variant in ("without", "changes", "with"):
            results.values[variant] = statistics.median(figures[variant])
        results.values["catch_up"] = max(figures["catch_up"])
    results.same_note(["without", "changes", "with", "catch_up"], "throughput" if not args.rate else "--rate")
    if "with" in results.values:
        offered = results.values["with"] / 2
        latency_at(results, "", offered, args, kafka, postgres)
        kept = results.values.get("kept")
        queued = results.values.get("to_commit", 0.0) > AT_CAPACITY_MS
        if kept is not None and kept >= KEPT_UP * offered and not queued:
            if "p99" in results.values:
                results.values["sustained_p99"] = results.values["p99"]
        elif kept is not None and not args.rate:
            latency_at(results, "sustained_", min(kept, offered) / 2, args, kafka, postgres)
    results.same_note(["latency_rate", "sustained_latency_rate", "sustained_p99"], "latency")
    if "sustained_p99" in results.values and "sustained_latency_rate" not in results.values:
        results.notes["sustained_latency_rate"] = "(kept up: the run above)"
    runs = (
        "; ".join(f"{v}: " + ", ".join(f"{r:,.0f}" for r in figures[v]) for v in ("without", "changes", "with"))
        if figures
        else "not run"
    )
    notes = [f"drains (events/s, in order of each variant): {runs}"]
    if figures:
        notes += [f"drain CPU, {v} (cores busy, median): {cpu_line(figures, v)}" for v in VARIANTS]
    return BenchResult.of(
        "sink",
        results,
        [
            ("one runner, no sink (events/s, median of its runs)", "without"),
            ("one runner, the view recording its changes, no sink (events/s)", "changes"),
            ("one runner, upsert sink on the view (events/s, median of its runs)", "with"),
            ("relay catch-up after a drain, the longer (s)", "catch_up", ".1f"),
            *latency_rows("", "steady load for the latency (events/s, half the with-sink rate)", "on the sink topic"),
            *latency_rows("sustained_", "steady load at half what the runner sustained (events/s)", "at that load"),
        ],
        comparisons=[
            Comparison("with an upsert sink / without", "with", "without", target=0.9),
            Comparison("changes recorded, no sink / without", "changes", "without"),
            Comparison("with an upsert sink / changes recorded, no sink", "with", "changes"),
            Comparison("event -> record p99 at half the with-sink drain rate", "p99", limit=1000.0, unit="ms"),
            Comparison("event -> record p99 at half the sustained rate", "sustained_p99", limit=1000.0, unit="ms"),
        ],
        header=[
            f"upsert sink benchmark ({machine_line(postgres)})",
            f"  workload: {args.events:,} page views, url uniform among {args.urls:,}, {args.partitions} partitions;"
            f" view basic: {VIEW.select.format(stream='<stream>')}",
            f"  runs in the order without, changes, sink, sink, changes, without, {args.rounds} rounds:"
            " each a fresh group draining one topic",
            "  latency: at half the with-sink drain rate; then, if the runner did not keep up with it beside the load"
            " producer (or kept up with a queue of over 0.5 s), at half what it committed meanwhile"
            " (the sustained rate)",
        ],
        notes=notes,
        check="every drained view matches what was produced (loadgen.pageviews' basic check)" if figures else None,
    )


def cpu_line(figures: dict[str, list[float]], variant: str) -> str:
    """The median cores busy per process over a variant's drains, as `runner 0.85, its PostgreSQL 0.52, ...`."""
    parts = []
    for role, name in CPU_ROLES.items():
        values = figures.get(f"{variant}.{role}")
        if values:
            parts.append(f"{name} {statistics.median(values):.2f}")
    return ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m loadgen.sink`."""
    parser = cli.parser(__doc__)
    parser.add_argument("--events", type=int, default=1_000_000, help="page views produced and drained per run")
    parser.add_argument("--urls", type=int, default=10_000, help="distinct urls (groups of the view)")
    parser.add_argument("--partitions", type=int, default=6, help="partitions of the bench topics")
    parser.add_argument("--seconds", type=float, default=15.0, help="steady load of the latency phase")
    parser.add_argument("--seed", type=int, default=1, help="same seed, same events")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the six drains (A B C C B A)")
    parser.add_argument(
        "--rate", type=float, default=0.0, help="only the latency phase, at this many events/s (0: half the measured)"
    )
    return cli.run(parser, measure, "loadgen.sink", argv)


if __name__ == "__main__":
    sys.exit(main())
