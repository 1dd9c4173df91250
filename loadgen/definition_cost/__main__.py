"""What one definition costs with 1 and with 200 streams in the catalog: `python -m loadgen.definition_cost`.

Every definition reads the catalog's streams to check a statement against them (a view names its
stream, a stream its target). This command defines streams of its own (`defcost_<run>_<i>`, in a
consumer group no runner has, so nothing consumes them), then times definitions that change nothing
else: a view's ttl altered, a stream created and dropped. It prints the median and the slowest of
each with 1 and with `--streams` streams of its own, and drops all it made, also on failure. Streams
already in the catalog count too: the figures say how many there were in all.

    set -a; . .state/stack.env; set +a
    .venv/bin/python -m loadgen.definition_cost [--streams 200] [--repeat 15]
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Callable, Sequence

import psycopg
from psycopg import sql

from pipelines.cv import catalog
from pipelines.logs import configure_logging
from pipelines.settings import ROLE_OWNER, ROLE_READER, ROLE_WRITER, LogSettings, PostgresSettings

STREAM = (
    "CREATE STREAM {name} (k bigint NOT NULL, ts timestamptz NOT NULL)"
    " WITH (topic = '{name}', consumer_group = '{group}')"
)
# A ttl needs a time bucket to expire by.
VIEW = "CREATE CONTINUOUS VIEW {schema}.v AS SELECT date_trunc('hour', ts) AS h, count(*) AS n FROM {stream} GROUP BY h"


def _timed(repeat: int, step: Callable[[int], object]) -> tuple[float, float]:
    """The median and the slowest time of `step(i)` over `repeat` runs, in milliseconds."""
    times = []
    for i in range(repeat):
        start = time.perf_counter()
        step(i)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), max(times)


def measure(
    conn: psycopg.Connection, run: str, sizes: Sequence[int], repeat: int
) -> list[tuple[int, int, str, float, float]]:
    """(own streams, streams in the catalog, definition, median ms, slowest ms) for each size, smallest first."""
    schema, group = f"defcost_{run}", f"defcost-{run}"
    rows = []
    defined = 0
    for size in sizes:
        for i in range(defined, size):
            catalog.define(conn, STREAM.format(name=f"{schema}_{i}", group=group))
            if i == 0:
                catalog.define(conn, VIEW.format(schema=schema, stream=f"{schema}_0"))
        defined = size
        total = conn.execute("SELECT count(*) FROM cv.streams").fetchone()[0]

        def alter(i: int) -> None:
            catalog.define(conn, f"ALTER CONTINUOUS VIEW {schema}.v SET (ttl = '{i + 1} days')")

        def create_and_drop(i: int) -> None:
            catalog.define(conn, STREAM.format(name=f"{schema}_x{i}", group=group))
            catalog.define(conn, f"DROP STREAM {schema}_x{i}")

        rows.append((size, total, "ALTER CONTINUOUS VIEW ... SET (ttl)", *_timed(repeat, alter)))
        rows.append((size, total, "CREATE STREAM, then DROP STREAM", *_timed(repeat, create_and_drop)))
    return rows


def cleanup(conn: psycopg.Connection, run: str) -> None:
    """Drop the view, the streams and the schema this run made."""
    schema = f"defcost_{run}"
    pattern = f"{schema}\\_%"
    for (name,) in conn.execute("SELECT name FROM cv.views WHERE stream LIKE %s", (pattern,)).fetchall():
        catalog.define(conn, f"DROP CONTINUOUS VIEW IF EXISTS {name}")
    streams = [name for (name,) in conn.execute("SELECT name FROM cv.streams WHERE name LIKE %s", (pattern,))]
    if streams:
        catalog.define(conn, f"DROP STREAM IF EXISTS {', '.join(streams)}")
    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def main(argv: Sequence[str] | None = None) -> int:
    """Measure and print the figures; the exit status."""
    parser = argparse.ArgumentParser(prog="python -m loadgen.definition_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=200, help="the larger catalog: streams of its own (200)")
    parser.add_argument("--repeat", type=int, default=15, help="definitions timed at each size (15)")
    args = parser.parse_args(argv)
    configure_logging(LogSettings(level="WARNING"))  # the catalog's INFO line per definition is not the result
    run = uuid.uuid4().hex[:8]
    with psycopg.connect(PostgresSettings().conninfo(user=ROLE_OWNER), autocommit=True) as conn:
        schema = sql.Identifier(f"defcost_{run}")
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(schema))
        try:
            readers = sql.SQL(", ").join([sql.Identifier(ROLE_WRITER), sql.Identifier(ROLE_READER)])
            conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(schema, readers))
            rows = measure(conn, run, (1, args.streams), args.repeat)
        finally:
            cleanup(conn, run)
    print(f"{'own streams':>11}  {'in catalog':>10}  {'definition':<36}  {'median ms':>9}  {'slowest ms':>10}")
    for size, total, what, median, slowest in rows:
        print(f"{size:>11}  {total:>10}  {what:<36}  {median:>9.1f}  {slowest:>10.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
