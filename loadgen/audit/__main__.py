"""Audit log benchmark: the writer and the ctid-block puller beside the seed's approach and the ceilings.

One run on this machine's Kafka, PostgreSQL and Elasticsearch, with throwaway objects only: an audit
log `bench_<id>` (`audit.create_log`), a 6-partition topic `bench-audit-<id>` and its consumer group,
indices `audit-bench<id>-YYYY.MM.DD` (the `audit-*` template). Prints figures; a miss never fails it.

1. Ingest. `--rows` events (`{"uid", "ts", "content": 512 characters, "action"}`, key = uid) are
   produced beforehand, untimed. `python -m pipelines.audit.writer` runs as production runs it (sv_writer,
   AUDIT_SCHEMA) and is timed from its first committed batch until `audit.tables` counts every row
   (process start-up excluded; polled every 50 ms). Beside it: the seed's per-row `ins_schemaless`
   from `--clients` Python threads (the target's baseline) and from pgbench, both durable and with
   `synchronous_commit=off`; a bare consumer of the same topic; one COPY of the same rows into one
   table without and with the audit indexes (`loadgen.audit.baselines`).
2. Search. A bare bulk indexer sends the puller's documents of those rows (same ids, fields, indices,
   256-block chunks) to `audit-bench<id>bare-*`; then `python -m pipelines.audit.puller` (sv_indexer,
   retention off) is timed from its first checkpoint until `_count` finds every row. Both are
   searchable through the template's 1 s refresh. Then lag: once Elasticsearch has finished merging
   what the drain wrote, with writer and puller running, events arrive at `--lag-share` (half) of
   the puller's rate for `--seconds`, and a marker every 200 ms is timed from produce until a terms
   query on `content` finds it.
3. Queries. A second log `bench_<id>_q` whose one day table holds `--query-rows` rows (1,000 uids,
   in ts order) is queried as sv_reader: `audit.user_events` first and second page over 2 hours,
   `user_events_estimate` vs `user_events_count`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from itertools import islice
from typing import Any

import psycopg
from confluent_kafka.admin import AdminClient
from elasticsearch import Elasticsearch

from loadgen.audit import baselines as base
from loadgen.audit.pipelines import (
    MARKER_INTERVAL_S,
    PARTITIONS,
    ROWS_INDEXED,
    ROWS_WRITTEN,
    SEARCH_POLL_S,
    Names,
    Services,
    cleanup,
    measure_lag,
    wait_for_count,
)
from loadgen.common import cli
from loadgen.common.drain import cores_text
from loadgen.common.freshness import percentile
from loadgen.common.kafka import bare_consumer_rate, produce_all
from loadgen.common.postgres import owner_conninfo, pgbench_available
from loadgen.common.report import BenchResult, Comparison, Results, drain_series, machine_line
from loadgen.common.throwaway import create_topic, unique_name
from loadgen.workloads.audit import AuditRow, AuditWorkload
from pipelines.audit import elastic
from pipelines.logs import get_logger
from pipelines.settings import AuditSettings, ElasticsearchSettings, KafkaSettings, PostgresSettings

log = get_logger("loadgen.audit")

CONSUMER_PASSES = 3  # the median of a few reads: a shared VM's steal time can halve a single one


def run(args: argparse.Namespace, names: Names, results: Results, es: Elasticsearch) -> dict[str, Any]:
    """Every measurement, in order; returns the runs behind the figures (for the notes)."""
    kafka, postgres = KafkaSettings(), PostgresSettings()
    workload = AuditWorkload(args.seed, uids=args.uids)
    rows = list(islice(workload.rows(), args.rows))
    out: dict[str, Any] = {}
    with psycopg.connect(owner_conninfo(postgres), autocommit=True) as conn:
        conn.execute("SELECT audit.create_log(%s)", (names.schema,))

    if results.measure("producer", lambda: produce_all(names.topic, rows, workload.encode, kafka)) is None:
        return out
    measure_baselines(args, names, results, workload, rows)
    services = Services(names, postgres, kafka)
    try:
        measure_pipelines(args, services, results, es, workload, out)
    finally:
        services.stop()
        services.conn.close()
    if args.query_rows:
        day = datetime.now(UTC).date()

        def queries() -> base.QueryFigures:
            started = time.monotonic()
            base.fill_query_table(names.query_schema, day, args.query_rows, workload, postgres)
            out["fill_seconds"] = time.monotonic() - started
            return base.time_queries(names.query_schema, day, postgres, runs=args.query_runs)

        out["queries"] = results.measure("queries", queries)
    return out


def measure_baselines(
    args: argparse.Namespace, names: Names, results: Results, workload: AuditWorkload, rows: list[AuditRow]
) -> None:
    """The ceilings and the seed's approach on the same rows: bare consumer, per-row function, COPY."""
    postgres = PostgresSettings()
    results.measure(
        "consumer",
        lambda: statistics.median(bare_consumer_rate(names.topic, len(rows)) for _ in range(CONSUMER_PASSES)),
    )
    for key, durable, pgbench in (
        ("per_row", True, False),
        ("per_row_async", False, False),
        ("per_row_pgbench", True, True),
        ("per_row_pgbench_async", False, True),
    ):
        if pgbench and not pgbench_available():
            results.notes[key] = "(no pgbench)"
            continue
        results.measure(
            key,
            lambda durable=durable, pgbench=pgbench: base.seed_per_row_rate(
                unique_name("bench"),
                workload,
                rows,
                args.baseline_seconds,
                clients=args.clients,
                synchronous_commit=durable,
                pgbench=pgbench,
                settings=postgres,
            ),
        )
    chunks = workload.copy_chunks(rows)
    for key, indexed in (("copy", False), ("copy_indexed", True)):
        results.measure(
            key,
            lambda indexed=indexed: base.copy_rate(
                unique_name("bench"), chunks, len(rows), indexed=indexed, settings=postgres
            ),
        )


def measure_pipelines(
    args: argparse.Namespace,
    services: Services,
    results: Results,
    es: Elasticsearch,
    workload: AuditWorkload,
    out: dict[str, Any],
) -> None:
    """The writer on the backlog, the bare indexer and the puller on its rows, then lag; fills `out`."""
    names = services.names
    writer = services.start("writer")
    for n in range(2, args.writers + 1):  # more processes in the same consumer group share the partitions
        services.start(f"writer{n}")
    ingest = results.measure(
        "ingest", lambda: wait_for_count(lambda: services.count(ROWS_WRITTEN), args.rows, writer, services)
    )
    if ingest is None:
        return
    out["ingest"] = ingest
    results.values["ingest"] = (args.rows - ingest.first_committed) / ingest.drain_seconds

    def bare() -> base.IndexingRun:
        with psycopg.connect(owner_conninfo(services.postgres)) as conn:
            chunks = base.puller_chunks(conn, names.schema, names.bare_prefix, AuditSettings().pull_blocks)
        return base.bare_bulk_index(es, chunks, names.bare_prefix)

    out["bulk"] = results.measure("bulk", bare)
    if out["bulk"] is not None:
        results.values["bulk"] = out["bulk"].docs_per_second
    for index in es.indices.get(index=f"{names.bare_prefix}-*", allow_no_indices=True):
        es.indices.delete(index=index)  # the puller then has Elasticsearch to itself

    def pull() -> base.IndexingRun:
        puller = services.start("puller")
        drain = wait_for_count(lambda: services.count(ROWS_INDEXED), args.rows, puller, services)
        out["puller_drain"] = drain
        visible = base.wait_searchable(es, names.prefix, args.rows)
        return base.IndexingRun(args.rows, drain.first_commit, drain.first_committed, drain.done, visible)

    out["puller"] = results.measure("puller", pull)
    if out["puller"] is None:
        return
    results.values["puller"] = out["puller"].docs_per_second
    rate = args.lag_share * results.values["puller"]
    out["lag"] = results.measure("lag", lambda: measure_lag(services, es, workload, rate, args.seconds))
    out["codes"] = services.stop()
    out["warnings"] = {
        role: sum(1 for r in proc.records() if r.get("level") in {"warning", "error", "critical"})
        for role, proc in services.procs.items()
    }
    out["logs"] = [str(proc.log_path) for proc in services.procs.values()]


COMPARISONS = [
    Comparison("writer / seed per-row function", "ingest", "per_row", target=10.0),
    Comparison("writer / seed per-row, synchronous_commit=off", "ingest", "per_row_async"),
    Comparison("writer / seed per-row from pgbench", "ingest", "per_row_pgbench"),
    Comparison("writer / seed per-row from pgbench, sync. commit off", "ingest", "per_row_pgbench_async"),
    Comparison("writer / bare consumer", "ingest", "consumer"),
    Comparison("writer / raw COPY (share of the Postgres ceiling)", "ingest", "copy"),
    Comparison("writer / indexed COPY", "ingest", "copy_indexed"),
    Comparison("puller / bare bulk indexer", "puller", "bulk", target=0.8),
    Comparison("lag p99 under sustained writes", "lag99", limit=5.0, unit="s"),
    Comparison("user_events first page, median", "q_page1", limit=10.0, unit="ms"),
]


def figure_rows(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """The figures of the report: (label, key, format)."""
    return [
        ("producer -> Kafka, before the clock (msgs/s)", "producer", ",.0f"),
        ("bare consumer, ceiling (msgs/s, median of 3)", "consumer", ",.0f"),
        ("seed ins_schemaless, one call per row (rows/s)", "per_row", ",.0f"),
        ("  same, synchronous_commit=off (rows/s)", "per_row_async", ",.0f"),
        ("  same from pgbench (rows/s)", "per_row_pgbench", ",.0f"),
        ("  same from pgbench, synchronous_commit=off (rows/s)", "per_row_pgbench_async", ",.0f"),
        ("raw COPY, one unindexed table (rows/s)", "copy", ",.0f"),
        ("COPY, one table, BRIN(ts) + btree(uid, ts) (rows/s)", "copy_indexed", ",.0f"),
        (f"audit writer x{args.writers}, Kafka -> tables (rows/s)", "ingest", ",.0f"),
        ("bare bulk indexer -> searchable (docs/s)", "bulk", ",.0f"),
        ("ctid puller, tables -> searchable (docs/s)", "puller", ",.0f"),
        ("lag, produce -> searchable, p50 (s)", "lag50", ".2f"),
        ("lag, produce -> searchable, p99 (s)", "lag99", ".2f"),
        ("  max (s)", "lagmax", ".2f"),
        ("user_events page 1, 2 h, contains 'abc' (ms)", "q_page1", ".2f"),
        ("user_events page 2, after => cursor (ms)", "q_page2", ".2f"),
        ("user_events_estimate / _count, no filter (ms)", "q_estimate", ".2f"),
        ("  user_events_count, no filter (ms)", "q_count", ".2f"),
        ("user_events_estimate, contains 'abc' (ms)", "q_estimate_filter", ".2f"),
        ("  user_events_count, contains 'abc' (ms)", "q_count_filter", ".2f"),
    ]


def series_of(args: argparse.Namespace, out: dict[str, Any]) -> dict[str, Any]:
    """Both drains' progress and the lag phase's samples, for the plots."""
    series: dict[str, Any] = {"drains": {}}
    for key, drain, label in (
        ("audit_writer", out.get("ingest"), f"audit writer x{args.writers}, Kafka -> tables (loadgen.audit)"),
        ("audit_puller", out.get("puller_drain"), "ctid puller, tables -> Elasticsearch (loadgen.audit)"),
    ):
        if drain is not None:
            series["drains"][key] = drain_series(
                drain.samples, label=label, total=args.rows, first_commit=drain.startup_seconds
            )
    if (lag := out.get("lag")) is not None:
        behind = []
        for record in lag.progress:
            with contextlib.suppress(KeyError, ValueError):
                at = datetime.fromisoformat(record["timestamp"]).timestamp() - lag.started_wall
                behind.append([round(at, 3), record.get("seconds_behind"), record.get("rows_behind")])
        series["audit_lag"] = {
            "label": f"produce -> searchable at {lag.rate:,.0f} events/s",
            "rate": lag.rate,
            "markers": [[round(t, 3), round(latency, 4)] for t, latency in lag.samples],
            "puller_behind": behind,  # [s since the phase began, seconds_behind, rows_behind]
        }
    return series


def notes(args: argparse.Namespace, out: dict[str, Any], machine: dict[str, str]) -> list[str]:
    """How each figure was taken, and what the run saw (CPU by process, lag lines, consistency)."""
    lines = []
    if (ingest := out.get("ingest")) is not None:
        lines.append(f"writer rows/s from its first committed batch: {ingest.describe(args.rows, 'rows')}")
    if (bulk := out.get("bulk")) is not None and (pull := out.get("puller")) is not None:
        drain = out["puller_drain"]
        lines.append(
            f"indexing rates count from the first acknowledged chunk until `_count` finds all (1 s refresh"
            f" included); until the last acknowledgement: puller {pull.acked_per_second:,.0f}, bare"
            f" {bulk.acked_per_second:,.0f} docs/s ({bulk.bulks:,} bulks of ~{bulk.documents / bulk.bulks:,.0f});"
            f" puller start-up {drain.startup_seconds:.2f}s; cores busy while pulling:"
            f" {cores_text(drain.cpu_done.cores_since(drain.cpu_start))}"
        )
    if (lag := out.get("lag")) is not None:
        seconds = [r.get("seconds_behind", 0) for r in lag.progress] or [0]
        rows_behind = max((r.get("rows_behind", 0) for r in lag.progress), default=0)
        lines.append(
            f"lag: started after the drain's merges settled ({lag.merges_waited:.1f}s);"
            f" {lag.produced:,} events at {lag.rate:,.0f}/s for {args.seconds}s, {len(lag.latencies)} markers"
            f" (one per {MARKER_INTERVAL_S:g}s, terms query every {SEARCH_POLL_S:g}s); the puller's own progress"
            f" lines ({len(lag.progress)}, asked for one a second): seconds_behind median"
            f" {statistics.median(seconds):.2f} max {max(seconds):.2f}, rows_behind max {rows_behind:,};"
            f" cores busy: {cores_text(lag.cpu)}"
        )
        same = "yes" if lag.pg_rows == lag.es_docs else "NO"
        lines.append(
            f"after the run: {lag.pg_rows:,} rows in PostgreSQL, {lag.es_docs:,} documents: equal {same};"
            f" Elasticsearch indexed {lag.index_ops:,} times ({lag.index_ops - lag.es_docs:,} documents sent again:"
            f" every pass re-reads the last, partly filled block of each table)"
        )
    if (queries := out.get("queries")) is not None:
        values = queries.values
        ratio, ratio_f = (
            statistics.median(e / c for e, c in zip(values[f"estimate{k}"], values[f"count{k}"], strict=True) if c)
            for k in ("", "_filter")
        )
        lines.append(
            f"queries: {args.query_rows:,} rows filled in {out['fill_seconds']:.0f}s, as sv_reader, median of"
            f" {queries.runs} random (uid, 2 h) samples; page 1 held {statistics.mean(values['page1_rows']):.0f} rows"
            f" on average; estimate/count median {ratio:.2f} (no filter, counts"
            f" ~{statistics.median(values['count']):,.0f}), {ratio_f:.2f} (contains, counts"
            f" ~{statistics.median(values['count_filter']):,.0f})"
        )
    if "codes" in out:
        lines.append(f"services' exit codes {out['codes']}, warnings logged {out['warnings']}; logs {out['logs']}")
    lines.append(f"machine: {machine['notes']}")
    return lines


def measure(args: argparse.Namespace) -> BenchResult:
    """Every measurement on throwaway names, dropped at the end; the figures, notes and samples."""
    started, load = time.monotonic(), os.getloadavg()
    names = Names(unique_name("", ""))
    kafka, postgres = KafkaSettings(), PostgresSettings()
    log.info("start", **vars(args), schema=names.schema, topic=names.topic, prefix=names.prefix)
    results = Results()
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    out: dict[str, Any] = {}
    with elastic.client(ElasticsearchSettings(), request_timeout=120) as es:
        try:
            create_topic(admin, names.topic, PARTITIONS)
            out = run(args, names, results, es)
        finally:
            cleanup(names, owner_conninfo(postgres), es, admin, kafka)
        node = es.nodes.info(node_id="_local", metric="jvm", filter_path="nodes.*.version,nodes.*.jvm.mem")
        version = ", ".join(
            f"{n['version']} (heap {n['jvm']['mem']['heap_max_in_bytes'] >> 20} MiB)" for n in node["nodes"].values()
        )
    if (lag := out.get("lag")) is not None:
        ms = sorted(lag.latencies)
        results.values |= {"lag50": statistics.median(ms), "lag99": percentile(ms, 99), "lagmax": ms[-1]}
    if (queries := out.get("queries")) is not None:
        for key in ("page1", "page2", "estimate", "count", "estimate_filter", "count_filter"):
            results.values[f"q_{key}"] = queries.median_ms(key)
    results.same_note(["lag50", "lag99", "lagmax"], "lag")
    results.same_note(["q_page1", "q_page2", "q_estimate", "q_count", "q_estimate_filter", "q_count_filter"], "queries")
    machine = {
        "notes": f"load average {load[0]:.2f} before, {os.getloadavg()[0]:.2f} after; the whole run took"
        f" {time.monotonic() - started:.0f}s; names bench_{names.run} / {names.topic} / {names.prefix}-*",
    }
    header = [
        f"audit log benchmark ({machine_line(postgres)}; Elasticsearch {version})",
        f"  workload: {args.rows:,} events (512-character text over 'abcdef ', action), uids 1..{args.uids},"
        f" {PARTITIONS} partitions; seed per-row function: {args.clients} Python client threads or pgbench"
        f" -c {args.clients} -j 2, {args.baseline_seconds:g}s each",
    ]
    return BenchResult.of(
        "audit",
        results,
        figure_rows(args),
        comparisons=COMPARISONS,
        header=header,
        notes=notes(args, out, machine),
        series=series_of(args, out),
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m loadgen.audit`."""
    parser = cli.parser(__doc__)
    parser.add_argument("--rows", type=int, default=500_000, help="events produced, ingested and pulled")
    parser.add_argument("--writers", type=int, default=1, help="writer processes in the consumer group")
    parser.add_argument("--seconds", type=float, default=30, help="length of the lag phase")
    parser.add_argument("--lag-share", type=float, default=0.5, help="lag phase rate, share of the puller's rate")
    parser.add_argument("--query-rows", type=int, default=2_000_000, help="rows of the query table (0: skip)")
    parser.add_argument("--query-runs", type=int, default=20, help="timed samples per query")
    parser.add_argument("--uids", type=int, default=100, help="events' uids are 1..uids")
    parser.add_argument("--clients", type=int, default=4, help="client threads of the seed's per-row function")
    parser.add_argument("--baseline-seconds", type=float, default=10, help="length of each per-row run")
    parser.add_argument("--seed", type=int, default=1, help="same seed, same rows")
    return cli.run(parser, measure, "loadgen.audit", argv)


if __name__ == "__main__":
    sys.exit(main())
