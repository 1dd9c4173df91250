"""Change data capture benchmark: rows INSERTed into app.likes until visible in social.like_count.

Runs against the stack `make up` started (Debezium connector app-social, the cdc_likes pipeline) and
prints figures; it is not a test.

1. Throughput: `--rows` likes inserted as rows in multi-row INSERTs of 1,000 (objects from the seed's
   Gaussian hot spot, in an id range of their own), timed from the first INSERT until every one of
   them is counted by social.object_likes.
2. Freshness: for `--seconds`, rows keep arriving at `--rate` per second, and every 20 ms a marker
   like of a fresh object is inserted; its latency is from its COMMIT until social.like_count sees it.
3. Cleanup: the benchmark's rows are deleted (their unlikes flow through the same path).

Usage: `python -m loadgen.bench_cdc [--rows 100000] [--rate 2000] [--seconds 20] [--json PATH]`
(`--json`: the figures, the visible count after the INSERTs and every marker's latency, for `loadgen.bench_all`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import psycopg

from loadgen.bench_report import Comparison, Results, drain_series, figures_document, write_figures
from loadgen.drain import DrainProgress
from loadgen.freshness import percentile
from loadgen.workload import new_rng, pgbench_gaussian
from pipelines.logs import configure_logging
from pipelines.settings import ROLE_OWNER, ROLE_WRITER, PostgresSettings

OBJECTS = 2_000_000
INSERT_BATCH = 1_000


def insert_likes(conn: psycopg.Connection, rows: list[tuple[int, int]]) -> None:
    """One multi-row INSERT per 1,000 likes, each its own transaction (as an application would)."""
    for start in range(0, len(rows), INSERT_BATCH):
        chunk = rows[start : start + INSERT_BATCH]
        with conn.transaction():
            conn.execute(
                "INSERT INTO app.likes (oid, uid) SELECT * FROM unnest(%s::bigint[], %s::bigint[])"
                " ON CONFLICT DO NOTHING",
                ([o for o, _ in chunk], [u for _, u in chunk]),
            )


def counted(conn: psycopg.Connection, base: int) -> int:
    """Likes of the benchmark's objects that the views count."""
    return conn.execute(
        "SELECT coalesce(sum(like_count), 0) FROM social.object_likes WHERE oid > %s AND oid <= %s",
        (base, base + OBJECTS + 1_000_000),
    ).fetchone()[0]


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m loadgen.bench_cdc`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rate", type=int, default=2_000, help="rows/s during the freshness phase")
    parser.add_argument("--seconds", type=int, default=20, help="length of the freshness phase")
    parser.add_argument("--json", type=Path, help="also write the figures and samples there (for bench_all)")
    args = parser.parse_args(argv)
    configure_logging()
    settings = PostgresSettings()
    rng = new_rng(1)
    base = rng.randrange(10**10, 10**11) * 10**7  # an id range no other data uses (below 2**63)
    pairs = {(base + pgbench_gaussian(rng, 1, OBJECTS, 10.0), rng.randint(1, 10_000_000)) for _ in range(args.rows)}
    rows = sorted(pairs, key=lambda _: rng.random())

    with (
        psycopg.connect(settings.conninfo(user=ROLE_WRITER, dbname=settings.app_database), autocommit=True) as app,
        psycopg.connect(settings.conninfo(user=ROLE_OWNER), autocommit=True) as owner,
    ):
        # A run that failed half-way left its rows (the same ones: same seed) counted; uncount them first.
        app.execute("DELETE FROM app.likes WHERE oid > %s AND oid <= %s", (base, base + OBJECTS + 1_000_000))
        while counted(owner, base):
            time.sleep(0.05)
        started = time.monotonic()
        insert_likes(app, rows)
        inserted = time.monotonic()
        samples, progress = [(0.0, 0)], DrainProgress("cdc rows", len(rows))
        while (n := int(counted(owner, base))) < len(rows):
            samples.append((time.monotonic() - started, n))
            progress(n, time.monotonic())
            time.sleep(0.05)
        visible = time.monotonic()
        samples.append((visible - started, n))

        latencies: list[float] = []
        stop = threading.Event()

        def background() -> None:
            with psycopg.connect(
                settings.conninfo(user=ROLE_WRITER, dbname=settings.app_database), autocommit=True
            ) as conn:
                uid = 10_000_001
                while not stop.is_set():
                    tick = time.monotonic()
                    batch = [(base + pgbench_gaussian(rng, 1, OBJECTS, 10.0), uid + i) for i in range(args.rate // 10)]
                    uid += len(batch)
                    insert_likes(conn, batch)
                    time.sleep(max(0.0, 0.1 - (time.monotonic() - tick)))

        load = threading.Thread(target=background, daemon=True)
        load.start()
        marker = base + OBJECTS + 1
        deadline = time.monotonic() + args.seconds
        while time.monotonic() < deadline:
            app.execute("INSERT INTO app.likes (oid, uid) VALUES (%s, 1)", (marker,))
            committed = time.monotonic()
            while owner.execute("SELECT social.like_count(%s)", (marker,)).fetchone()[0] == 0:
                time.sleep(0.005)
            latencies.append((time.monotonic() - committed) * 1000)
            marker += 1
            time.sleep(0.02)
        stop.set()
        load.join(30)
        app.execute("DELETE FROM app.likes WHERE oid > %s AND oid <= %s", (base, base + OBJECTS + 1_000_000))

    print(f"\nchange data capture: INSERT into app.likes -> visible in social.like_count ({len(rows):,} rows)")
    if args.json:
        results = Results()
        results.values |= {
            "visible": len(rows) / (visible - started),
            "accepted": len(rows) / (inserted - started),
            "p50": statistics.median(latencies),
            "p99": percentile(latencies, 99),
        }
        figures = [
            ("rows/s, first INSERT until all visible in social.like_count", "visible"),
            ("rows/s accepted by PostgreSQL (the INSERTs alone)", "accepted"),
            (f"freshness p50 at {args.rate:,} rows/s (ms)", "p50"),
            (f"freshness p99 at {args.rate:,} rows/s (ms)", "p99"),
        ]
        label = "rows of app.likes -> Debezium -> views, after the INSERTs (bench_cdc)"
        drain = drain_series(samples, label=label, total=len(rows), first_commit=0.0)
        drain["marks"] = {"INSERTs done": round(inserted - started, 3)}
        series = {
            "drains": {"cdc": drain},
            "freshness_ms": {"cdc": {"label": "CDC, COMMIT -> visible", "values": latencies}},
        }
        comparisons = [Comparison("CDC end to end / the INSERTs alone", "visible", "accepted")]
        write_figures(args.json, figures_document("cdc", results, figures, comparisons, series=series))
    print(f"  rows/s, first INSERT until all visible        {len(rows) / (visible - started):>12,.0f}")
    print(f"  rows/s accepted by PostgreSQL (INSERTs alone) {len(rows) / (inserted - started):>12,.0f}")
    print(
        f"  freshness p50 / p99 at {args.rate:,} rows/s        {statistics.median(latencies):>7,.0f} / "
        f"{percentile(latencies, 99):,.0f} ms ({len(latencies)} markers)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
