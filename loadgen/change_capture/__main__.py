"""Where a view's change stream costs: one batch applied in PostgreSQL, with and without recording changes.

Issue 25's sink and rollup targets are bounded by what recording a view's changes costs per changed
group (a sink reads the changes; each level of a rollup records its own). This benchmark isolates
that cost from Kafka, decoding and the relay: batches of `--events` page views over `--urls` urls
(every batch changes every url's group) go straight into the engine (`StreamMaintainer.apply`, what
the runner calls), on one sv_writer connection, in rounds ABCABC (A: the view without a change
stream; B: `WITH (changes = true)`; C: an upsert sink reading it, so it records keys only),
first batch of each round not counted:

- A: the apply of a batch (its commit, about 3 ms, is not counted in either);
- B: the same apply, which now fires the capture triggers (project each changed row as users read
  it, net it per group: `cv.capture_view_changes`), and the flush that the commit would run, called
  just before it (`cv.record_view_changes`: number the netted changes and insert them into
  cv.view_changes);
- C: as B, the changes carrying each group's key alone (migration 0046): what an upsert sink costs
  the runner (the sink's topic is never made: no relay reads the throwaway stream's group);
- two floors, each over the same number of rows in a rolled-back transaction: building the JSON
  images a change holds (key, before, after) from typed rows, and inserting that many change rows
  into a temporary table like cv.view_changes (same columns and indexes; temporary, so without
  the WAL cv.view_changes writes: a lower bound). Whatever the capture's design, a change stream
  that stores before and after images as JSON pays at least these two.

Every name is throwaway (a schema, a stream no runner consumes) and dropped at the end.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable

import psycopg

from loadgen.common import cli
from loadgen.common.postgres import owner_conninfo
from loadgen.common.report import BenchResult, Comparison, Results, machine_line
from loadgen.common.throwaway import throwaway_definitions
from pipelines.cv import catalog
from pipelines.cv.engine import StreamMaintainer
from pipelines.logs import get_logger
from pipelines.settings import ROLE_WRITER, PostgresSettings

log = get_logger("loadgen.change_capture")

VIEW = (
    "SELECT url, count(*) AS views, sum(latency) AS total_latency, max(latency) AS max_latency"
    " FROM {stream} GROUP BY url"
)

# The floors, over `n` synthetic groups shaped like the view's rows (parameter: n).
_ROWS = (
    "CREATE TEMP TABLE cv_bench_rows ON COMMIT DROP AS SELECT 'https://example.com/page/' || g AS url,"
    " g::bigint AS views, (g * 3)::bigint AS total_latency, (g %% 1000) AS max_latency FROM generate_series(1, %s) AS g"
)
_IMAGES = (
    "SELECT to_jsonb(k) AS key, to_jsonb(r) AS before, to_jsonb(r) AS after"
    " FROM cv_bench_rows AS s CROSS JOIN LATERAL (SELECT s.url) AS k"
    " CROSS JOIN LATERAL (SELECT s.url, s.views, s.total_latency, s.max_latency) AS r"
)
# Every image used: OFFSET 0 keeps the subquery whole, and the condition reads each column.
_IMAGES_BUILT = (
    "SELECT count(*) FROM (" + _IMAGES + " OFFSET 0) AS i"  # noqa: S608 - constant text
    " WHERE key IS NOT NULL AND before IS NOT NULL AND after IS NOT NULL"
)
_INSERT = (
    "INSERT INTO cv_bench_changes (view, position, key, before, after, committed_at)"
    " SELECT 'bench.view', row_number() OVER (), p.key, p.before, p.after, now() FROM cv_bench_images AS p"
)


def batch(rng: random.Random, urls: list[str], events: int) -> tuple[list[int], list[list[object]]]:
    """One batch: every url at least once, shuffled; the ops and columns StreamMaintainer.apply takes."""
    chosen = [urls[i % len(urls)] for i in range(events)]
    rng.shuffle(chosen)
    return [1] * events, [chosen, [rng.randrange(1, 1000) for _ in range(events)]]


# What the view records in each round: nothing, each change's rows, each change's key.
MODES = ("none", "images", "keys")


def set_mode(owner: str, view: str, sink: str, mode: str) -> None:
    """Through the catalog: the view's change stream on for images, an upsert sink on it for keys."""
    with psycopg.connect(owner, autocommit=True) as conn:
        catalog.define(conn, f"ALTER CONTINUOUS VIEW {view} SET (changes = {'true' if mode == 'images' else 'false'})")
        if mode == "keys":
            catalog.define(conn, f"CREATE SINK {sink} FROM {view} WITH (topic = '{sink}', format = 'upsert')")
        else:
            catalog.define(conn, f"DROP SINK IF EXISTS {sink}")


def one_round(
    writer: psycopg.Connection, stream: str, batches: list[tuple[list[int], list[list[object]]]], changes: bool
) -> tuple[list[float], list[float]]:
    """Apply each batch and commit; per batch (after the first), apply ms and flush ms (0 without changes)."""
    maintainer = StreamMaintainer(stream)
    applies, flushes = [], []
    for index, (ops, columns) in enumerate(batches):
        started = time.perf_counter()
        maintainer.apply(writer, ops, columns)
        applied = time.perf_counter()
        if changes:
            writer.execute("SELECT cv.record_view_changes()")
        flushed = time.perf_counter()
        writer.commit()
        if index:
            applies.append((applied - started) * 1000)
            flushes.append((flushed - applied) * 1000)
    return applies, flushes


def floor_ms(owner: str, groups: int, repeats: int) -> tuple[float, float]:
    """The two floors for `groups` changes (best of `repeats`, ms): JSON images built, change rows inserted."""
    images, inserts = [], []
    with psycopg.connect(owner) as conn:
        for _ in range(repeats):
            conn.execute(_ROWS, (groups,))
            images.append(_timed(lambda: conn.execute(_IMAGES_BUILT).fetchone()))
            conn.execute("CREATE TEMP TABLE cv_bench_images ON COMMIT DROP AS " + _IMAGES)
            conn.execute("CREATE TEMP TABLE cv_bench_changes (LIKE cv.view_changes INCLUDING ALL) ON COMMIT DROP")
            inserts.append(_timed(lambda: conn.execute(_INSERT)))
            conn.rollback()
    return min(images), min(inserts)


def _timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000


def measure(args: argparse.Namespace) -> BenchResult:
    """Define the throwaway view; ABAB rounds of batches; the floors; per-group figures."""
    postgres = PostgresSettings()
    owner = owner_conninfo(postgres)
    run_id = uuid.uuid4().hex[:8]
    schema, stream = f"bench_{run_id}", f"bench_cc_{run_id}"
    view = f"{schema}.pageviews"
    statements = [
        f"CREATE STREAM {stream} (url text NOT NULL, latency integer NOT NULL)"
        f" WITH (topic = 'bench-cc-{run_id}', consumer_group = 'bench-cc-{run_id}')",
        f"CREATE CONTINUOUS VIEW {view} AS {VIEW.format(stream=stream)}",
    ]
    rng = random.Random(args.seed)  # noqa: S311 (load generation, not cryptography)
    urls = [f"https://example.com/page/{i}" for i in range(args.urls)]
    batches = [batch(rng, urls, args.events) for _ in range(args.batches + 1)]
    results = Results()
    sink = f"bench_cc_sink_{run_id}"
    timings: dict[str, dict[str, list[float]]] = {mode: {"apply": [], "flush": []} for mode in MODES}
    with throwaway_definitions(schema, statements, [stream], postgres):
        writer_info = postgres.conninfo(user=ROLE_WRITER, application_name="streamviews-bench")
        try:
            with psycopg.connect(writer_info) as writer:
                for mode in MODES * args.rounds:
                    set_mode(owner, view, sink, mode)
                    applies, flushes = one_round(writer, stream, batches, mode != "none")
                    timings[mode]["apply"] += applies
                    timings[mode]["flush"] += flushes
                    log.info("round", mode=mode, apply_ms=round(statistics.median(applies), 1))
        finally:
            set_mode(owner, view, sink, "none")  # the view cannot be dropped while a sink reads it
        images, inserts = floor_ms(owner, args.urls, args.rounds * args.batches)
    per_group = 1000 / args.urls  # ms per batch -> µs per changed group
    values = results.values
    values["plain_ms"] = statistics.median(timings["none"]["apply"])
    for mode, prefix in (("images", ""), ("keys", "keys_")):
        values[f"{prefix}recorded_apply_ms"] = statistics.median(timings[mode]["apply"])
        values[f"{prefix}flush_ms"] = statistics.median(timings[mode]["flush"])
        values[f"{prefix}recorded_ms"] = values[f"{prefix}recorded_apply_ms"] + values[f"{prefix}flush_ms"]
        values[f"{prefix}triggers_us"] = (values[f"{prefix}recorded_apply_ms"] - values["plain_ms"]) * per_group
        values[f"{prefix}flush_us"] = values[f"{prefix}flush_ms"] * per_group
        values[f"{prefix}capture_us"] = values[f"{prefix}triggers_us"] + values[f"{prefix}flush_us"]
    values["images_us"] = images * per_group
    values["insert_us"] = inserts * per_group
    values["floor_us"] = values["images_us"] + values["insert_us"]
    rows = [
        ("batch without a change stream: apply (ms, median)", "plain_ms", ",.1f"),
        ("batch recording its changes: apply incl. capture triggers (ms)", "recorded_apply_ms", ",.1f"),
        ("  same, the flush at commit (ms)", "flush_ms", ",.1f"),
        ("  same, in all (ms)", "recorded_ms", ",.1f"),
        ("capture per changed group: triggers (µs)", "triggers_us", ",.1f"),
        ("  same, flush (µs)", "flush_us", ",.1f"),
        ("  same, in all (µs)", "capture_us", ",.1f"),
        ("batch recording keys only (an upsert sink): apply incl. triggers (ms)", "keys_recorded_apply_ms", ",.1f"),
        ("  same, the flush at commit (ms)", "keys_flush_ms", ",.1f"),
        ("  same, in all (ms)", "keys_recorded_ms", ",.1f"),
        ("keys-only capture per changed group: triggers (µs)", "keys_triggers_us", ",.1f"),
        ("  same, flush (µs)", "keys_flush_us", ",.1f"),
        ("  same, in all (µs)", "keys_capture_us", ",.1f"),
        ("floor per change: JSON key + before + after built (µs, best)", "images_us", ",.1f"),
        ("  same, one row into a temporary cv.view_changes (µs, best)", "insert_us", ",.1f"),
        ("  same, both (µs)", "floor_us", ",.1f"),
    ]
    header = [
        f"change capture benchmark ({machine_line(postgres)})",
        f"  workload: batches of {args.events:,} page views over {args.urls:,} urls (each batch changes every"
        f" url's group), {args.batches} per round counted,",
        f"  rounds ABC x{args.rounds} (A: no change stream, B: changes = true, C: keys only, for an upsert sink)",
        f"  view: {VIEW.format(stream='<stream>')}",
    ]
    comparisons = [
        Comparison("batch recording its changes / batch without", "recorded_ms", "plain_ms"),
        Comparison("batch recording keys only / batch without", "keys_recorded_ms", "plain_ms"),
        Comparison("keys-only capture per group / images", "keys_capture_us", "capture_us"),
        Comparison("capture per group / its floor", "capture_us", "floor_us"),
    ]
    return BenchResult.of("change_capture", results, rows, comparisons=comparisons, header=header)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m loadgen.change_capture`."""
    parser = cli.parser(__doc__)
    parser.add_argument("--events", type=int, default=50_000, help="page views per batch")
    parser.add_argument("--urls", type=int, default=10_000, help="distinct urls: the groups each batch changes")
    parser.add_argument("--batches", type=int, default=6, help="batches counted per round (one more warms up)")
    parser.add_argument("--rounds", type=int, default=2, help="ABC triples of rounds")
    parser.add_argument("--seed", type=int, default=1, help="same seed, same batches")
    return cli.run(parser, measure, "loadgen.change_capture", argv)


if __name__ == "__main__":
    sys.exit(main())
