"""Blast radius: ten streams in one runner, poison events and a view broken mid-run; how the others fare.

One stream runner (its own consumer group) reads `--streams` append-only streams, each with a view
of counts and sums. The first stream also has a view that divides by a column and one that joins a
table. While events flow at `--rate` per stream and second, the first stream receives poison:
values that overflow its sum (every "big" event after the first) and zeros its division cannot take;
halfway through, the joined table is renamed away, which breaks that view for good. Then it prints:

- the freshness of the other streams while it all happens: now minus the newest event time the
  group committed per topic (`ops.kafka_offsets.last_event_at`), sampled every 100 ms, p50/p99/max;
- whether every view is exact: each other stream counts every event it was sent, the first stream
  every event but the poison, which is in its dead-letter topic once each; the broken view is
  quarantined.

The figures are what isolation costs the bystanders; the exactness is what it must never cost.
`run()` is the scenario of `python -m loadgen.blast_radius` and of the blast-radius integration test
(tests/integration/test_blast_radius.py); `make bench` does not run it.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from psycopg import sql

from loadgen.common.errors import BenchmarkError
from loadgen.common.postgres import owner_conninfo
from loadgen.common.processes import ServiceProcess, pipeline_env
from loadgen.common.throwaway import create_topic, delete_topic, forget_group, throwaway_definitions, unique_name
from pipelines.cv import catalog
from pipelines.settings import KafkaSettings, PostgresSettings

BIG = 1.7e308  # two of them overflow a double precision sum
STREAM = (
    "CREATE STREAM {stream} (tag text NOT NULL, v double precision, x integer)"
    " WITH (topic = '{topic}', consumer_group = '{group}')"
)
COUNTS = (
    "CREATE CONTINUOUS VIEW {schema}.{stream} AS SELECT tag, count(*) AS n, sum(v) AS total FROM {stream} GROUP BY tag"
)
RATIO = (
    "CREATE CONTINUOUS VIEW {schema}.ratio AS SELECT tag, count(*) AS n FROM {stream} WHERE 100 / x > 0 GROUP BY tag"
)
JOINED = (
    "CREATE CONTINUOUS VIEW {schema}.joined AS SELECT p.name, count(*) AS n FROM {stream} e"
    " JOIN {schema}.pages p ON p.cat = e.x GROUP BY p.name"
)


@dataclass
class BlastRadius:
    """What a run measured."""

    streams: int
    seconds: float
    events: dict[str, int] = field(default_factory=dict)  # sent per stream
    poison: dict[str, int] = field(default_factory=dict)  # overflow / zero, sent to the first stream
    counted: dict[str, int] = field(default_factory=dict)  # what each stream's counts view holds
    dead_letters: int = 0
    quarantined: list[str] = field(default_factory=list)
    freshness_s: list[float] = field(default_factory=list)  # samples of the other streams

    def percentile(self, q: float) -> float:
        """The q-th quantile of the bystanders' freshness samples."""
        ordered = sorted(self.freshness_s)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")

    @property
    def exact(self) -> bool:
        """Every view as the events dictate, and the poison dead-lettered once each."""
        first, *others = sorted(self.events)
        poison = self.poison["overflow"] - 1 + self.poison["zero"]
        return (
            all(self.counted.get(s) == self.events[s] for s in others)
            and self.counted.get(first) == self.events[first] - poison
            and self.dead_letters == poison
        )


def run(
    streams: int = 10,
    seconds: float = 30.0,
    rate: int = 100,
    postgres: PostgresSettings | None = None,
    kafka: KafkaSettings | None = None,
) -> BlastRadius:
    """Run the scenario once (see the module's docstring); everything it created is dropped after."""
    postgres, kafka = postgres or PostgresSettings(), kafka or KafkaSettings()
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    schema, group = unique_name("blast"), unique_name("bench-blast", "-")
    names = [f"{schema}_s{i}" for i in range(streams)]
    topics = {name: unique_name(f"bench-blast{i}", "-") for i, name in enumerate(names)}
    first = names[0]
    # The bench's own generated names: nothing from outside reaches these statements.
    statements = [
        *(STREAM.format(stream=n, topic=topics[n], group=group) for n in names),
        *(COUNTS.format(schema=schema, stream=n) for n in names),
        RATIO.format(schema=schema, stream=first),
    ]
    joined = JOINED.format(schema=schema, stream=first)
    for topic in topics.values():
        create_topic(admin, topic, 1)
    result = BlastRadius(streams, seconds, dict.fromkeys(names, 0), {"overflow": 0, "zero": 0})
    owner = owner_conninfo(postgres)
    try:
        with throwaway_definitions(schema, statements, names, postgres):
            with psycopg.connect(owner, autocommit=True) as conn:
                pages = sql.Identifier(schema, "pages")
                conn.execute(sql.SQL("CREATE TABLE {} (cat integer PRIMARY KEY, name text NOT NULL)").format(pages))
                conn.execute(
                    sql.SQL("INSERT INTO {} SELECT i, 'page ' || i FROM generate_series(1, 10) AS i").format(pages)
                )
                catalog.define(conn, joined)
            _run(result, postgres, kafka, owner, schema, group, topics, rate)
    finally:
        forget_group(owner, group, topics[first], kafka)
        existing = admin.list_topics(timeout=10).topics
        for topic in topics.values():
            for name in (topic, f"{topic}.dlq"):
                if name in existing:
                    delete_topic(admin, name)
    return result


def _run(
    result: BlastRadius,
    postgres: PostgresSettings,
    kafka: KafkaSettings,
    owner: str,
    schema: str,
    group: str,
    topics: dict[str, str],
    rate: int,
) -> None:
    first = min(topics)
    env = pipeline_env(postgres, kafka) | {"PIPELINE_VIEW_RETRY_S": "2", "PIPELINE_HOLD_RETRY_S": "2"}
    log_path = Path(tempfile.mkstemp(prefix="blast-radius-", suffix=".log")[1])
    runner = ServiceProcess("runner", "pipelines.cv.runner", ["--group", group], env=env, log_path=log_path)
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "enable.idempotence": True, "linger.ms": 5})
    stop = threading.Event()
    bystanders = [topics[n] for n in sorted(topics) if n != first]
    sampler = threading.Thread(target=sample_freshness, args=(owner, group, bystanders, result, stop), daemon=True)
    try:
        wait_for_assignment(owner, group, len(topics), runner)
        sampler.start()
        started, sent, broken = time.monotonic(), 0, False
        tick = 0.05
        while (elapsed := time.monotonic() - started) < result.seconds:
            runner.check_alive()
            due = int(elapsed * rate) + 1
            for name, topic in topics.items():
                for _ in range(due - sent):
                    producer.produce(topic, value=json.dumps({"tag": "t", "v": 1.0, "x": 1}).encode())
                    result.events[name] += 1
            sent = due
            if int(elapsed / 2) != int((elapsed - tick) / 2):  # every 2 s: one of each poison
                producer.produce(topics[first], value=json.dumps({"tag": "big", "v": BIG, "x": 1}).encode())
                producer.produce(topics[first], value=json.dumps({"tag": "zero", "v": 1.0, "x": 0}).encode())
                result.events[first] += 2
                result.poison["overflow"] += 1
                result.poison["zero"] += 1
            if not broken and elapsed >= result.seconds / 2:
                with psycopg.connect(owner, autocommit=True) as conn:
                    conn.execute(sql.SQL("ALTER TABLE {} RENAME TO pages_gone").format(sql.Identifier(schema, "pages")))
                broken = True
            producer.poll(0)
            time.sleep(tick)
        if producer.flush(30):
            raise BenchmarkError("blast radius: the producer could not deliver every event")
        _wait_until_consumed(owner, group, topics, result, runner)
    finally:
        stop.set()
        runner.stop()
    with psycopg.connect(owner, autocommit=True) as conn:
        for name in topics:
            query = sql.SQL("SELECT coalesce(sum(n), 0) FROM {}").format(sql.Identifier(schema, name))
            result.counted[name] = int(conn.execute(query).fetchone()[0])
        result.dead_letters = int(
            conn.execute(
                "SELECT coalesce(sum(count), 0) FROM ops.dead_letters WHERE group_id = %s", (group,)
            ).fetchone()[0]
        )
        result.quarantined = [
            v for (v,) in conn.execute("SELECT view FROM cv.view_failures WHERE view LIKE %s", (f"{schema}.%",))
        ]


def wait_for_assignment(owner: str, group: str, partitions: int, runner: ServiceProcess) -> None:
    """Until the runner holds every partition (its first batches claim their offset rows)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        runner.check_alive()
        if any(r.get("event") == "partitions assigned" for r in runner.records()):
            return
        time.sleep(0.2)
    raise BenchmarkError(f"blast radius: the runner took no partitions in 60 s: {runner.tail()}")


def sample_freshness(
    owner: str, group: str, topics: list[str], result: BlastRadius, stop: threading.Event, interval: float = 0.1
) -> None:
    """Every `interval` seconds, each topic's freshness: now minus its newest event time committed."""
    with psycopg.connect(owner, autocommit=True) as conn:
        while not stop.wait(interval):
            rows = conn.execute(
                "SELECT extract(epoch FROM now() - max(last_event_at))::float8 FROM ops.kafka_offsets"
                " WHERE group_id = %s AND topic = ANY(%s) GROUP BY topic",
                (group, topics),
            ).fetchall()
            result.freshness_s.extend(max(0.0, age) for (age,) in rows if age is not None)


def _wait_until_consumed(
    owner: str, group: str, topics: dict[str, str], result: BlastRadius, runner: ServiceProcess
) -> None:
    """Until the group's stored offsets cover every event sent (one partition per topic)."""
    expected = {topics[name]: n for name, n in result.events.items()}
    deadline = time.monotonic() + 120
    with psycopg.connect(owner, autocommit=True) as conn:
        while time.monotonic() < deadline:
            runner.check_alive()
            stored = dict(
                conn.execute(
                    "SELECT topic, next_offset FROM ops.kafka_offsets WHERE group_id = %s", (group,)
                ).fetchall()
            )
            if all(stored.get(t, 0) >= n for t, n in expected.items()):
                return
            time.sleep(0.2)
    raise BenchmarkError(f"blast radius: events not all consumed in 120 s: {runner.tail()}")
