"""What one definition costs a running system with many streams: its own time, and the others' stall.

`python -m loadgen.bench_definition_stall [--streams 200] [--definitions 5] [--rate 200]`

Defines `--streams` streams with a view each in a consumer group of its own, runs one stream
runner on them, and keeps events flowing into one of them (the probe) at `--rate` per second and
into each of the others at one a second (so every stream's plan is in use).
Then it defines `--definitions` more streams with a view each, one after another, each while the
probe flows, and prints:

- how long each definition took (`catalog.define` of the stream and of its view), beside the same
  with a single stream defined (`--streams 1` for that figure alone);
- the probe's freshness (now minus the newest event time its group committed, sampled every 50 ms)
  in the seconds before the definitions and in the seconds after each: its worst is the stall a
  definition causes the streams it does not touch.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from loadgen.bench_blast_radius import BlastRadius, sample_freshness, wait_for_assignment
from loadgen.pipeline_processes import ServiceProcess, pipeline_env
from loadgen.seed_baselines import BenchmarkError, owner_conninfo, unique_name
from loadgen.throwaway import create_topic, delete_topic, forget_group, throwaway_definitions
from pipelines.cv import catalog
from pipelines.logs import configure_logging
from pipelines.settings import KafkaSettings, PostgresSettings

STREAM = (
    "CREATE STREAM {stream} (tag text NOT NULL) WITH (topic = '{topic}', consumer_group = '{group}', partitions = 1)"
)
VIEW = "CREATE CONTINUOUS VIEW {schema}.{stream} AS SELECT tag, count(*) AS n FROM {stream} GROUP BY tag"
SETTLE_S = 3.0  # freshness is watched this long after each definition


def definitions(schema: str, group: str, names: list[str], topics: dict[str, str]) -> list[str]:
    """A stream and a count view for each name (the bench's own generated names)."""
    statements = [STREAM.format(stream=n, topic=topics[n], group=group) for n in names]
    return statements + [VIEW.format(schema=schema, stream=n) for n in names]


def run(streams: int, added: int, rate: int) -> dict[str, object]:
    """Define, run, measure; everything created is dropped after."""
    postgres, kafka = PostgresSettings(), KafkaSettings()
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    schema, group = unique_name("stall"), unique_name("bench-stall", "-")
    names = [f"{schema}_s{i}" for i in range(streams + added)]
    topics = {name: unique_name("bench-stall", "-") for name in names}
    probe, kept, new = names[0], names[:streams], names[streams:]
    create_topic(admin, topics[probe], 1)
    owner = owner_conninfo(postgres)
    freshness = BlastRadius(0, 0.0)
    figures: dict[str, object] = {"streams": streams}
    try:
        started = time.monotonic()
        with throwaway_definitions(schema, definitions(schema, group, kept, topics), names, postgres):
            figures["define_all_s"] = round(time.monotonic() - started, 1)
            env = pipeline_env(postgres, kafka)
            log_path = Path(tempfile.mkstemp(prefix="definition-stall-", suffix=".log")[1])
            runner = ServiceProcess("runner", "pipelines.cv.runner", ["--group", group], env=env, log_path=log_path)
            stop = threading.Event()
            sampler = threading.Thread(
                target=sample_freshness, args=(owner, group, [topics[probe]], freshness, stop, 0.05), daemon=True
            )
            producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "linger.ms": 5})
            others = [topics[n] for n in kept[1:]]
            flowing = threading.Thread(target=_produce, args=(producer, topics[probe], rate, others, stop), daemon=True)
            try:
                wait_for_assignment(owner, group, streams, runner)
                flowing.start()
                sampler.start()
                _wait_for_commits(freshness, runner)
                freshness.freshness_s.clear()
                time.sleep(SETTLE_S)
                figures["before"] = _summary(freshness.freshness_s)
                durations, after = [], []
                with psycopg.connect(owner, autocommit=True) as conn:
                    for name in new:
                        freshness.freshness_s.clear()
                        began = time.monotonic()
                        for statement in definitions(schema, group, [name], topics):
                            catalog.define(conn, statement)
                        durations.append(round(time.monotonic() - began, 3))
                        time.sleep(SETTLE_S)
                        runner.check_alive()
                        after.append(_summary(freshness.freshness_s))
                figures["definition_s"] = durations
                figures["after"] = after
            finally:
                stop.set()
                runner.stop()
    finally:
        forget_group(owner, group, topics[probe], kafka)
        existing = admin.list_topics(timeout=10).topics
        for topic in topics.values():
            for name in (topic, f"{topic}.dlq"):
                if name in existing:
                    delete_topic(admin, name)
    return figures


def _wait_for_commits(freshness: BlastRadius, runner: ServiceProcess, timeout: float = 300.0) -> None:
    """Until the probe's events commit (a runner starting with many streams prepares them first)."""
    deadline = time.monotonic() + timeout
    while not freshness.freshness_s or freshness.freshness_s[-1] > 1.0:
        runner.check_alive()
        if time.monotonic() > deadline:
            raise BenchmarkError(f"definition stall: the probe's events were not committed in {timeout:.0f} s")
        time.sleep(0.2)


def _produce(producer: Producer, topic: str, rate: int, others: list[str], stop: threading.Event) -> None:
    """`rate` events a second into the probe, and one a second into each other stream: every plan is live."""
    value = json.dumps({"tag": "probe"}).encode()
    started, sent, seconds = time.monotonic(), 0, -1
    while not stop.wait(0.01):
        elapsed = time.monotonic() - started
        due = int(elapsed * rate)
        for _ in range(due - sent):
            producer.produce(topic, value=value)
        sent = due
        if int(elapsed) != seconds:
            seconds = int(elapsed)
            for other in others:
                producer.produce(other, value=value)
        producer.poll(0)
    producer.flush(10)


def _summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    if not ordered:
        raise BenchmarkError("definition stall: no freshness sample (is the runner committing?)")
    return {"p50": round(ordered[len(ordered) // 2], 3), "max": round(ordered[-1], 3), "samples": len(ordered)}


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m loadgen.bench_definition_stall`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=200, help="streams (each with a view) defined first")
    parser.add_argument("--definitions", type=int, default=5, help="streams (each with a view) defined while it runs")
    parser.add_argument("--rate", type=int, default=200, help="events per second into the probe stream")
    args = parser.parse_args(argv)
    configure_logging()
    try:
        figures = run(args.streams, args.definitions, args.rate)
    except (BenchmarkError, psycopg.Error) as e:
        print(f"bench_definition_stall: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1
    print(f"{figures['streams']} streams with a view each, defined in {figures['define_all_s']} s")
    print(f"one more stream and view, each definition: {figures['definition_s']} s")
    before = figures["before"]
    print(f"probe freshness before: p50 {before['p50']} s, max {before['max']} s")
    for i, after in enumerate(figures["after"], 1):
        print(f"  {SETTLE_S:.0f} s after definition {i}: p50 {after['p50']} s, max {after['max']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
