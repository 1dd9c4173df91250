"""What each aggregate costs per event in the engine, with no Kafka: one throwaway view per aggregate call.

For each call of `CALLS` (or those `--only` names): an append-only stream `bench_agg_<id>_<n>`
(g, x, y, b, u) and the view `bench_<id>.v<n>` = `SELECT g, <call> AS a FROM <stream> GROUP BY g`,
plus `issue13`, the page views view of `loadgen.pageviews.views` on these columns (and `issue13_hll`, the
same with the distinct count kept as a HyperLogLog, as PipelineDB kept it). Then one warm-up
round and `--batches` measured rounds: in each round every view's stream receives the same batch of
`--rows` rows through `StreamMaintainer(stream).apply` as sv_writer, one transaction per batch
(COMMIT included), the views in turn, their order rotated every round so that the machine's noise
hits all alike.

Reported per view: µs per event, the median of its batches; that minus the count(*) view's (the
call's own cost: its argument shipped as an array parameter, aggregated over the batch, merged into
the view's rows, one per group); and the CPU of this process (building the array literals) and of its PostgreSQL backend
per event, summed over the measured batches.

Rows: g uniform among `--groups`; x like a page latency (ms, exponential with mean 80, 2 decimals);
y = x/2 plus noise; b true half the time; u uniform in 1..1,000,000 like a uid (so the DISTINCT
views' reference counts grow by about one row per event).

Every name is throwaway and dropped at the end, also on failure or Ctrl-C. A view that cannot be
defined or applied is reported as failed and the others go on; the command then exits 1.

"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from loadgen.common import cli
from loadgen.common.drain import process_cpu_seconds
from loadgen.common.postgres import owner_conninfo
from loadgen.common.report import BenchResult, Comparison, Results, machine_line
from loadgen.common.throwaway import throwaway_definitions
from loadgen.workloads.pageviews import LATENCY_MEAN_CENTS, UIDS
from loadgen.workloads.social import new_rng
from pipelines.cv import catalog
from pipelines.cv.engine import StreamMaintainer
from pipelines.logs import get_logger
from pipelines.settings import ROLE_WRITER, PostgresSettings

log = get_logger("loadgen.aggregates")

COLUMNS = "g bigint NOT NULL, x double precision, y double precision, b boolean, u bigint"


@dataclass(frozen=True)
class Call:
    """One view of the benchmark: its key (for `--only`), its label, and its select list after `g,`."""

    key: str
    label: str
    select: str


def single(key: str, call: str) -> Call:
    """The view of one aggregate call, named `a`."""
    return Call(key, call, f"{call} AS a")


BASELINE = "count"
CALLS = (
    Call(BASELINE, "count(*)  (the baseline)", "count(*) AS a"),
    single("count_x", "count(x)"),
    single("sum", "sum(x)"),
    single("avg", "avg(x)"),
    single("stddev", "stddev(x)"),
    single("min", "min(x)"),
    single("max", "max(x)"),
    single("corr", "corr(y, x)"),
    single("bool_and", "bool_and(b)"),
    single("sum_filter", "sum(x) FILTER (WHERE b)"),
    single("bit_or", "bit_or(u)"),
    single("count_distinct", "count(DISTINCT u)"),
    single("array_agg_distinct", "array_agg(DISTINCT u)"),
    single("hll", "hll_add_agg(hll_hash_bigint(u))"),
    single("percentile", "percentile_cont(0.99) WITHIN GROUP (ORDER BY x)"),
    single("topk", "topk_agg(u, 10)"),
    single("approx_count_distinct", "approx_count_distinct(u)"),
    Call(
        "issue13",
        "issue13: count(*), count(DISTINCT u), avg(x), p99 of x",
        "count(*) AS views, count(DISTINCT u) AS visitors, avg(x) AS avg_x,"
        " percentile_cont(0.99) WITHIN GROUP (ORDER BY x) AS p99",
    ),
    # PipelineDB kept count(DISTINCT) in a continuous view as a HyperLogLog (~0.81% error, its docs say).
    Call(
        "issue13_hll",
        "  same, the distinct count as PipelineDB kept it (HLL)",
        "count(*) AS views, approx_count_distinct(u) AS visitors, avg(x) AS avg_x,"
        " percentile_cont(0.99) WITHIN GROUP (ORDER BY x) AS p99",
    ),
)


Batch = list[list[object]]  # one batch, column by column: g, x, y, b, u


def batches(count: int, rows: int, groups: int, seed: int) -> list[Batch]:
    """`count` batches of `rows` rows (see the module docstring), the same for every view."""
    rng = new_rng(seed)
    random, expo, gauss = rng.random, rng.expovariate, rng.gauss
    out = []
    for _ in range(count):
        xs = [(1 + int(expo(1 / LATENCY_MEAN_CENTS))) / 100 for _ in range(rows)]
        out.append(
            [
                [int(random() * groups) for _ in range(rows)],
                xs,
                [round(x / 2 + gauss(0, 10), 2) for x in xs],
                [random() < 0.5 for _ in range(rows)],
                [1 + int(random() * UIDS) for _ in range(rows)],
            ]
        )
    return out


@dataclass
class Timing:
    """One view's measured batches: wall seconds each, CPU seconds of this process and its backend in all."""

    seconds: list[float] = field(default_factory=list)
    client_cpu: float = 0.0
    server_cpu: float | None = 0.0  # None: the backend's CPU is not readable from here
    failed: str | None = None

    def per_event_us(self, rows: int) -> float:
        """Median µs per event over the batches."""
        return statistics.median(self.seconds) / rows * 1e6


def define_views(conn: psycopg.Connection, schema: str, streams: dict[str, str], timings: dict[str, Timing]) -> None:
    """One view per call on its own stream; a call whose view cannot be defined is marked failed."""
    calls = {c.key: c for c in CALLS}
    for n, (key, stream) in enumerate(streams.items()):
        statement = sql.SQL("CREATE CONTINUOUS VIEW {} AS SELECT g, {} FROM {} GROUP BY g").format(
            sql.Identifier(schema, f"v{n}"), sql.SQL(calls[key].select), sql.Identifier(stream)
        )
        try:
            catalog.define(conn, statement.as_string(conn))
        except Exception as e:
            log.exception("view not defined", call=calls[key].label)
            timings[key].failed = f"failed to define: {str(e).splitlines()[0][:200]}"


def run_rounds(
    conn: psycopg.Connection, streams: dict[str, str], data: list[Batch], timings: dict[str, Timing]
) -> None:
    """Apply each batch to every view's stream in turn (order rotated per round); the first round is warm-up."""
    maintainers = {key: StreamMaintainer(stream) for key, stream in streams.items()}
    keys = list(streams)
    backend = conn.info.backend_pid
    ops = [1] * len(data[0][0])
    for round_, columns in enumerate(data):
        log.info("round", round=round_, of=len(data) - 1, warm_up=round_ == 0)
        for key in keys[round_ % len(keys) :] + keys[: round_ % len(keys)]:
            timing = timings[key]
            if timing.failed:
                continue
            client, server, started = time.process_time(), process_cpu_seconds(backend), time.perf_counter()
            try:
                with conn.transaction():
                    maintainers[key].apply(conn, ops, columns)
            except Exception as e:  # an engine error fails this view only; Ctrl-C still stops the run
                log.exception("batch failed", view=key)
                maintainers[key].forget_sessions()
                timing.failed = f"failed to apply: {str(e).splitlines()[0][:200]}"
                continue
            wall, after = time.perf_counter() - started, process_cpu_seconds(backend)
            if round_ == 0:
                continue
            timing.seconds.append(wall)
            timing.client_cpu += time.process_time() - client
            if timing.server_cpu is not None and server is not None and after is not None:
                timing.server_cpu += after - server
            else:
                timing.server_cpu = None


def measure(args: argparse.Namespace) -> BenchResult:
    """Define a view per call, run the rounds, and report each view's µs per event beside count(*)'s."""
    only = {k.strip() for k in args.only.split(",") if k.strip()}
    postgres = PostgresSettings()
    run_id = uuid.uuid4().hex[:10]
    schema = f"bench_{run_id}"
    calls = [c for c in CALLS if not only or c.key in only | {BASELINE}]
    streams = {c.key: f"bench_agg_{run_id}_{n}" for n, c in enumerate(calls)}
    log.info("start", **vars(args), schema=schema, views=len(calls))
    started, load = time.monotonic(), os.getloadavg()
    data = batches(args.batches + 1, args.rows, args.groups, args.seed)
    timings = {c.key: Timing() for c in calls}
    statements = [
        sql.SQL("CREATE STREAM {} ({}) WITH (topic = {}, consumer_group = {})")
        .format(
            sql.Identifier(stream),
            sql.SQL(COLUMNS),
            sql.Literal(stream.replace("_", "-")),
            sql.Literal(f"bench-agg-{run_id}"),  # no runner reads these streams: no topic exists
        )
        .as_string(None)
        for stream in streams.values()
    ]
    with throwaway_definitions(schema, statements, list(streams.values()), postgres):
        with psycopg.connect(owner_conninfo(postgres), autocommit=True) as conn:
            define_views(conn, schema, streams, timings)
        conninfo = postgres.conninfo(user=ROLE_WRITER, application_name="streamviews-bench-aggregates")
        with psycopg.connect(conninfo, autocommit=True) as conn:
            run_rounds(conn, streams, data, timings)
    results = Results()
    for call in calls:
        timing = timings[call.key]
        if timing.seconds and not timing.failed:
            results.values[call.key] = timing.per_event_us(args.rows)
        else:
            results.notes[call.key] = timing.failed or "(not run)"
    header = [
        f"aggregate cost in the engine, per event ({machine_line(postgres)})",
        f"  workload: per view 1 warm-up + {args.batches} measured batches of {args.rows:,} rows, g uniform among"
        f" {args.groups:,}, x exponential (mean {LATENCY_MEAN_CENTS / 100:g}, 2 decimals), y = x/2 + noise,"
        f" b true half the time, u uniform in 1..{UIDS:,}",
        "  each batch: StreamMaintainer.apply + COMMIT as sv_writer, one transaction; the views in turn, their"
        " order rotated every round",
    ]
    notes = [*view_notes(args.rows, calls, timings, results.values.get(BASELINE))]
    notes.append(
        f"load average {load[0]:.2f} before, {os.getloadavg()[0]:.2f} after; the whole run took"
        f" {time.monotonic() - started:.0f}s; names {schema} / bench_agg_{run_id}_*"
    )
    return BenchResult.of(
        "aggregates",
        results,
        [(f"{call.label.strip()} (µs/event)", call.key, ".2f") for call in calls],
        comparisons=[
            Comparison(f"{call.label.strip()} / count(*) (cost, lower is better)", call.key, BASELINE)
            for call in calls
            if call.key != BASELINE
        ],
        header=header,
        notes=notes,
    )


def view_notes(rows: int, calls: Sequence[Call], timings: dict[str, Timing], baseline: float | None) -> list[str]:
    """Per view: µs per event minus count(*)'s, events/s, the batches' range, backend and bench CPU per event."""
    out = []
    for call in calls:
        timing = timings[call.key]
        if timing.failed or not timing.seconds:
            continue
        us = timing.per_event_us(rows)
        own = "" if call.key == BASELINE or baseline is None else f", {us - baseline:+.2f} µs over count(*)"
        low, high = (s / rows * 1e6 for s in (min(timing.seconds), max(timing.seconds)))
        events = rows * len(timing.seconds)
        server = "-" if timing.server_cpu is None else f"{timing.server_cpu / events * 1e6:.2f}"
        out.append(
            f"{call.label.strip()}: {us:.2f} µs/event{own}, {1e6 / us:,.0f} events/s, batches {low:.2f}-{high:.2f}"
            f" µs; CPU µs/event backend {server}, bench {timing.client_cpu / events * 1e6:.2f}"
        )
    out.append(
        "µs/event: the median batch's wall time over its rows; CPU: summed over the measured batches, over their"
        " rows (backend from /proc, 10 ms ticks)"
    )
    return out


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m loadgen.aggregates`."""
    parser = cli.parser(__doc__)
    parser.add_argument("--rows", type=int, default=50_000, help="rows per batch (one transaction)")
    parser.add_argument("--batches", type=int, default=5, help="measured batches per view, after one warm-up")
    parser.add_argument("--groups", type=int, default=10_000, help="distinct g, drawn uniformly")
    parser.add_argument("--seed", type=int, default=1, help="same seed, same rows")
    keys = ", ".join(c.key for c in CALLS)
    parser.add_argument("--only", default="", help=f"comma-separated views (the baseline always runs): {keys}")
    args = parser.parse_args(argv)
    unknown = {k.strip() for k in args.only.split(",") if k.strip()} - {c.key for c in CALLS}
    if unknown:
        parser.error(f"--only: unknown {', '.join(sorted(unknown))}; choose among {keys}")
    return cli.run(parser, measure, "loadgen.aggregates", argv)


if __name__ == "__main__":
    sys.exit(main())
