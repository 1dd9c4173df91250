"""Change data capture benchmark: rows INSERTed into app.likes until visible in social.like_count.

Runs against the stack `make up` started (Debezium connector app-social, the cdc_likes pipeline) and
prints figures; it is not a test.

1. Throughput: `--rows` likes inserted as rows in multi-row INSERTs of 1,000 (objects from the seed's
   Gaussian hot spot, in an id range of their own), timed from the first INSERT until every one of
   them is counted by social.object_likes.
2. Freshness: for `--seconds`, rows keep arriving at `--rate` per second, and every 20 ms a marker
   like of a fresh object is inserted; its latency is from its COMMIT until social.like_count sees it.
3. Cleanup: the benchmark's rows are deleted (their unlikes flow through the same path).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

import psycopg

from loadgen.common import cli
from loadgen.common.drain import DrainProgress
from loadgen.common.freshness import percentile
from loadgen.common.report import BenchResult, Comparison, Results, drain_series
from loadgen.workloads.cdc import ID_RANGE, delete_likes, insert_likes, like_rows
from loadgen.workloads.social import OBJECTS, new_rng
from pipelines.settings import ROLE_OWNER, ROLE_WRITER, PostgresSettings


def counted(conn: psycopg.Connection, base: int) -> int:
    """Likes of the benchmark's objects that the views count."""
    return conn.execute(
        "SELECT coalesce(sum(like_count), 0) FROM social.object_likes WHERE oid > %s AND oid <= %s",
        (base, base + ID_RANGE),
    ).fetchone()[0]


def measure(args: argparse.Namespace) -> BenchResult:
    """Throughput of a backlog of rows, then freshness under a steady rate of rows; the rows deleted after."""
    settings = PostgresSettings()
    rng = new_rng(1)
    base = rng.randrange(10**10, 10**11) * 10**7  # an id range no other data uses (below 2**63)
    rows = like_rows(rng, args.rows, base)
    app_conninfo = settings.conninfo(user=ROLE_WRITER, dbname=settings.app_database)
    with (
        psycopg.connect(app_conninfo, autocommit=True) as app,
        psycopg.connect(settings.conninfo(user=ROLE_OWNER), autocommit=True) as owner,
    ):
        # A run that failed half-way left its rows (the same ones: same seed) counted; uncount them first.
        delete_likes(app, base)
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
            with psycopg.connect(app_conninfo, autocommit=True) as conn:
                uid = 10_000_001
                while not stop.is_set():
                    tick = time.monotonic()
                    batch = [(o, uid + i) for i, (o, _) in enumerate(like_rows(rng, args.rate // 10, base))]
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
        delete_likes(app, base)

    results = Results()
    results.values |= {
        "visible": len(rows) / (visible - started),
        "accepted": len(rows) / (inserted - started),
        "p50": statistics.median(latencies),
        "p99": percentile(latencies, 99),
    }
    label = "rows of app.likes -> Debezium -> views, after the INSERTs (loadgen.cdc)"
    drain = drain_series(samples, label=label, total=len(rows), first_commit=0.0)
    drain["marks"] = {"INSERTs done": round(inserted - started, 3)}
    return BenchResult.of(
        "cdc",
        results,
        [
            ("rows/s, first INSERT until all visible in social.like_count", "visible"),
            ("rows/s accepted by PostgreSQL (the INSERTs alone)", "accepted"),
            (f"freshness p50 at {args.rate:,} rows/s (ms)", "p50"),
            (f"freshness p99 at {args.rate:,} rows/s (ms)", "p99"),
        ],
        comparisons=[Comparison("CDC end to end / the INSERTs alone", "visible", "accepted")],
        header=[f"change data capture: INSERT into app.likes -> visible in social.like_count ({len(rows):,} rows)"],
        notes=[f"{len(latencies)} markers, one every 20 ms"],
        series={
            "drains": {"cdc": drain},
            "freshness_ms": {"cdc": {"label": "CDC, COMMIT -> visible", "values": latencies}},
        },
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m loadgen.cdc`."""
    parser = cli.parser(__doc__)
    parser.add_argument("--rows", type=int, default=100_000, help="likes inserted as rows for the throughput")
    parser.add_argument("--rate", type=int, default=2_000, help="rows/s during the freshness phase")
    parser.add_argument("--seconds", type=int, default=20, help="length of the freshness phase")
    return cli.run(parser, measure, "loadgen.cdc", argv)


if __name__ == "__main__":
    sys.exit(main())
