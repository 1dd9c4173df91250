"""The state a `bench_likes_at_size --keep` run left: likes/s at its size (one drain of more likes), and dropping it.

`python -m loadgen.bench_kept_drain SCHEMA [--events 1000000] [--seed 7] [--workers 1]`

The at-size benchmark takes about 40 minutes to fill 20 M likes; comparing two versions of the
pipeline, or two PostgreSQL settings, at that size by filling twice each would take hours and
compare runs hours apart on a shared machine. This command instead appends `--events` of the seed's
likes (a fresh `--seed`, so mostly new pairs, with the usual unlikes and repeats) to the kept likes
topic, then starts stream runners (`--workers`, one consumer group: the kept one) on it and times
the drain from their first committed batch to the end (`loadgen.drain.wait_drained`). The state
grows by about 0.9 likes per event, so consecutive drains measure nearly the same size.

Which pipeline drains: the checkout this command runs from. To compare versions at one size, run
this module from each checkout in turn (`cd <worktree> && PYTHONPATH=. python -m
loadgen.bench_kept_drain ...`), alternating, each against the same kept schema; PostgreSQL settings
that need a restart (shared_buffers) are switched between drains by whoever alternates them.

Prints one line and, with `--out`, appends it as JSON: events, seconds, likes/s, the state's likes
before, and the cores of the runner and its PostgreSQL backend.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path

import orjson
import psycopg
from confluent_kafka.admin import AdminClient

from loadgen.at_size_backlog import LikesBacklog
from loadgen.at_size_sampling import count_rows
from loadgen.bench_report import machine_line, source_commit
from loadgen.drain import high_watermarks, wait_drained
from loadgen.pipeline_processes import PipelineWorkers
from loadgen.seed_baselines import BenchmarkError, owner_conninfo
from loadgen.throwaway import delete_topic, drop_definitions, forget_group
from loadgen.workload import WorkloadSettings
from pipelines.cv import catalog
from pipelines.logs import configure_logging, get_logger
from pipelines.settings import KafkaSettings, PostgresSettings

log = get_logger("loadgen.bench_kept_drain")


def kept_stream(conn: psycopg.Connection, schema: str) -> tuple[str, str]:
    """The kept likes stream's topic and consumer group (its name is the schema's).

    Raises:
        BenchmarkError: no such kept stream.
    """
    stream = catalog.load_streams(conn).get(schema)
    if stream is None or not stream.consumer_group:
        raise BenchmarkError(f"no kept likes stream {schema} (run bench_likes_at_size --keep first)")
    return stream.topic, stream.consumer_group


def drain(schema: str, events: int, seed: int, workers: int) -> dict[str, object]:
    """Append `events` likes to the kept topic, drain them with `workers` runners; the figures."""
    kafka, postgres = KafkaSettings(), PostgresSettings()
    with psycopg.connect(owner_conninfo(postgres), autocommit=True) as conn:
        topic, group = kept_stream(conn, schema)
        before = count_rows(conn, schema)
        start = high_watermarks(topic, kafka)
        backlog = LikesBacklog(topic, len(start), WorkloadSettings(seed=seed))
        backlog.produce(int(events * 0.88), events, kafka, lambda _b, _c: None)  # ~0.88 net likes per event
        ends = high_watermarks(topic, kafka)
        produced = sum(ends.values()) - sum(start.values())
        if produced != backlog.produced:
            raise BenchmarkError(f"{topic}: {produced:,} records appended, {backlog.produced:,} produced")
        pipeline = PipelineWorkers(workers, topic=topic, stream=schema, group=group, postgres=postgres, kafka=kafka)
        try:
            done = wait_drained(conn, pipeline, ends)
        finally:
            pipeline.stop()
        timed = sum(ends.values()) - done.first_committed  # after the first batch, as Drain.rate counts
    cores = done.cpu_done.cores_since(done.cpu_start)
    return {
        "schema": schema,
        "commit": source_commit(),
        "machine": machine_line(postgres),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "likes_in_state_before": before,
        "events": produced,
        "timed_events": timed,
        "seconds": round(done.drain_seconds, 2),
        "likes_per_s": round(timed / done.drain_seconds, 1),
        "workers": workers,
        "cores": cores,
    }


def drop_kept(schema: str, kafka: KafkaSettings, postgres: PostgresSettings) -> int:
    """`--drop <schema>`: what a `--keep` run left (its definitions, topics, offsets)."""
    owner = owner_conninfo(postgres)
    with psycopg.connect(owner, autocommit=True) as conn:
        streams = {n: s for n, s in catalog.load_streams(conn).items() if n in (schema, f"{schema}_follows")}
    if not streams:
        print(f"bench_likes_at_size: no kept streams {schema} / {schema}_follows", file=sys.stderr)
        return 2
    drop_definitions(schema, list(streams), postgres)
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    for stream in streams.values():
        forget_group(owner, stream.consumer_group or "", stream.topic, kafka)
        delete_topic(admin, stream.topic)
    print(f"dropped {schema}: streams {', '.join(streams)}, their topics and offsets")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m loadgen.bench_kept_drain`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("schema", help="what bench_likes_at_size --keep printed (bench_<id>)")
    parser.add_argument("--events", type=int, default=1_000_000, help="like events to append and drain")
    parser.add_argument("--seed", type=int, default=7, help="the workload's seed (a new one: mostly new pairs)")
    parser.add_argument("--workers", type=int, default=1, help="stream runner processes in the kept group")
    parser.add_argument("--out", type=Path, help="append the figures to this file as one JSON line")
    args = parser.parse_args(argv)
    configure_logging()
    try:
        figures = drain(args.schema, args.events, args.seed, args.workers)
    except (BenchmarkError, psycopg.Error) as e:
        print(f"bench_kept_drain: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1
    print(
        f"{figures['likes_per_s']:>10,.0f} likes/s at {figures['likes_in_state_before']:,} likes"
        f" ({figures['timed_events']:,} events in {figures['seconds']} s; commit {figures['commit']};"
        f" cores {figures['cores']})"
    )
    if args.out:
        with args.out.open("ab") as f:
            f.write(orjson.dumps(figures) + b"\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
