"""Writing a stream with SQL beside producing to Kafka: `python -m loadgen.stream_insert`. Prints a table.

One stream of page views (`url`, `uid`, `latency`) and a view counting them per url, fed by a stream
runner and an inbox relay of the benchmark's own consumer group (both `python -m` processes, as
sv_writer, default settings). Each round writes `--events` events one way and times, from the
first write, until the view has counted them all (end to end: outbox, relay, Kafka, runner, view):

- `kafka`: produced as JSON by the benchmarks' producer (`loadgen.common.kafka.Sender`), then flushed;
- `insert`: `INSERT INTO <stream> ... SELECT ... FROM generate_series(...)`, `--batch` rows per
  statement, each statement its own transaction;
- `copy`: one `COPY <stream> FROM STDIN` of all the rows from the client.

The rounds alternate (kafka, insert, copy, copy, insert, kafka, ...) on the same processes, so each
method meets the same machine state. Printed per method: the median events/s end to end, the
median seconds the writer took (until its last commit or flush), and the ratio to `kafka`.

    set -a; . .state/stack.env; set +a
    .venv/bin/python -m loadgen.stream_insert [--events 200000] [--batch 10000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import psycopg
from confluent_kafka.admin import AdminClient
from psycopg import sql

from loadgen.common.errors import BenchmarkError
from loadgen.common.kafka import Sender
from loadgen.common.processes import ServiceProcess, pipeline_env
from loadgen.common.throwaway import create_topic, delete_topic, throwaway_definitions, unique_name
from pipelines.logs import LogSettings, configure_logging
from pipelines.settings import KafkaSettings, PostgresSettings

METHODS = ("kafka", "insert", "copy")
STREAM = (
    "CREATE STREAM {stream} (url text NOT NULL, uid bigint, latency double precision)"
    " WITH (topic = '{topic}', consumer_group = '{group}', partitions = 6)"
)
VIEW = "CREATE CONTINUOUS VIEW {schema}.counts AS SELECT url, count(*) AS n FROM {stream} GROUP BY url"
TIMEOUT_S = 600.0


def write_kafka(kafka: KafkaSettings, topic: str, url: str, events: int, _conninfo: str, _batch: int) -> None:
    """Produce the events as JSON with the benchmarks' one producer, then wait for every acknowledgement."""
    # linger 20 ms and no compression: the settings its figures in docs/performance.md were measured with
    sender = Sender(topic, kafka, client="stream-insert", **{"linger.ms": 20, "compression.type": "none"})
    for i in range(events):
        sender.send(None, json.dumps({"url": url, "uid": i, "latency": (i % 1000) / 10}).encode())
    sender.flush(TIMEOUT_S)
    sender.check()


def write_insert(_kafka: KafkaSettings, stream: str, url: str, events: int, conninfo: str, batch: int) -> None:
    """INSERT ... SELECT from generate_series, `batch` rows per statement and transaction."""
    statement = sql.SQL(
        "INSERT INTO {} (url, uid, latency)"
        " SELECT %s, i, (i %% 1000) / 10.0 FROM generate_series(%s::bigint, %s::bigint) AS i"
    ).format(sql.Identifier(stream))
    with psycopg.connect(conninfo, autocommit=True) as conn:
        for start in range(0, events, batch):
            conn.execute(statement, (url, start, min(start + batch, events) - 1))


def write_copy(_kafka: KafkaSettings, stream: str, url: str, events: int, conninfo: str, _batch: int) -> None:
    """One COPY FROM STDIN of every row, sent from the client."""
    with (
        psycopg.connect(conninfo, autocommit=True) as conn,
        conn.cursor().copy(f"COPY {stream} (url, uid, latency) FROM STDIN") as copy,
    ):
        for i in range(events):
            copy.write_row((url, i, (i % 1000) / 10))


def counted(conninfo: str, view: str, url: str) -> int:
    """The view's count for `url` (0 before its first event)."""
    schema, _, name = view.partition(".")
    with psycopg.connect(conninfo) as conn:
        row = conn.execute(
            sql.SQL("SELECT n FROM {} WHERE url = %s").format(sql.Identifier(schema, name)), (url,)
        ).fetchone()
    return int(row[0]) if row else 0


def run_round(
    method: str,
    write: Callable[..., None],
    target: str,
    view: str,
    events: int,
    batch: int,
    kafka: KafkaSettings,
    conninfo: str,
    round_no: int,
    processes: Sequence[ServiceProcess],
) -> tuple[float, float]:
    """One round: (seconds until the writer was done, seconds until the view counted every event)."""
    url = f"{method}-{round_no}"
    started = time.perf_counter()
    write(kafka, target, url, events, conninfo, batch)
    written = time.perf_counter() - started
    while counted(conninfo, view, url) < events:
        for process in processes:
            process.check_alive()
        if time.perf_counter() - started > TIMEOUT_S:
            raise BenchmarkError(f"{method}: the view did not count {events} events in {TIMEOUT_S} s")
        time.sleep(0.05)
    return written, time.perf_counter() - started


def main(argv: Sequence[str] | None = None) -> int:
    """Measure and print the figures; the exit status."""
    parser = argparse.ArgumentParser(prog="python -m loadgen.stream_insert", description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000, help="events per round (200,000)")
    parser.add_argument("--batch", type=int, default=10_000, help="rows per INSERT statement (10,000)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each method, alternated (2)")
    args = parser.parse_args(argv)
    configure_logging(LogSettings(level="WARNING"))
    postgres, kafka = PostgresSettings(), KafkaSettings()
    name, group = unique_name("bench_ins"), unique_name("bench-ins", "-")
    stream, topic = f"{name}_pv", unique_name("bench-ins", "-")
    statements = [
        STREAM.format(stream=stream, topic=topic, group=group),
        VIEW.format(schema=name, stream=stream),
    ]
    writer = postgres.conninfo(user="sv_writer")
    env = pipeline_env(postgres, kafka)
    logs = Path(tempfile.mkdtemp(prefix="stream-insert-"))
    order = [m for r in range(args.rounds) for m in (METHODS if r % 2 == 0 else METHODS[::-1])]
    figures: dict[str, list[tuple[float, float]]] = {m: [] for m in METHODS}
    writers = {"kafka": write_kafka, "insert": write_insert, "copy": write_copy}
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    create_topic(admin, topic, 6)  # before the first event: the producer checks its topic exists
    try:
        with throwaway_definitions(name, statements, [stream], postgres):
            processes = [
                ServiceProcess(
                    "runner", "pipelines.cv.runner", ["--group", group], env=env, log_path=logs / "runner.log"
                ),
                ServiceProcess("inbox", "pipelines.cv.inbox", ["--group", group], env=env, log_path=logs / "inbox.log"),
            ]
            try:
                run_round("kafka", write_kafka, topic, f"{name}.counts", 1000, args.batch, kafka, writer, -1, processes)
                for i, method in enumerate(order):
                    target = topic if method == "kafka" else stream
                    figures[method].append(
                        run_round(
                            method,
                            writers[method],
                            target,
                            f"{name}.counts",
                            args.events,
                            args.batch,
                            kafka,
                            writer,
                            i,
                            processes,
                        )
                    )
                    print(
                        f"  round {i + 1}/{len(order)} {method}: {args.events / figures[method][-1][1]:,.0f} events/s"
                    )
            finally:
                for process in processes:
                    process.stop()
    finally:
        delete_topic(admin, topic)
    base = statistics.median(args.events / end for _, end in figures["kafka"])
    print(f"\n{args.events:,} events per round, {args.rounds} rounds per method (logs: {logs})")
    print(f"{'method':<8} {'events/s end to end':>20} {'writer s':>9} {'vs kafka':>9}")
    for method in METHODS:
        rate = statistics.median(args.events / end for _, end in figures[method])
        written = statistics.median(w for w, _ in figures[method])
        print(f"{method:<8} {rate:>20,.0f} {written:>9.2f} {rate / base:>8.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
