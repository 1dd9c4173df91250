"""One page-views run with or without an upsert sink on its view, and a sink's event -> record latency.

- `SinkRun`: the page-views `basic` view (loadgen.pageviews) in a throwaway schema over a topic,
  one runner draining it and, with a sink, the sinks' relay of the run's group
  (`python -m pipelines.cv.relay --group G`) publishing the view's changes to an upsert topic; or,
  with `changes` alone, the view recording its changes (`WITH (changes = true)`) and no relay;
- `RecordProbe`: a consumer of the sink's topic that times each marker url's first record, and
  keeps when the relay produced it (the record's Kafka timestamp), so that with the marker's commit
  (`SinkRun.commit_times`) the latency splits into runner, relay and topic.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from psycopg import sql

from loadgen.common.drain import Drain, committed_offsets, high_watermarks, wait_drained
from loadgen.common.errors import BenchmarkError
from loadgen.common.freshness import Probe
from loadgen.common.postgres import owner_conninfo
from loadgen.common.processes import PipelineWorkers, ServiceProcess, find_pid, pipeline_env
from loadgen.common.throwaway import delete_topic, forget_group, throwaway_definitions, unique_name
from loadgen.pageviews.__main__ import VIEW_NAME, definitions
from loadgen.pageviews.views import VIEWS
from loadgen.workloads.pageviews import PageViews
from pipelines.cv import catalog
from pipelines.logs import get_logger
from pipelines.runtime.deadletter import dead_letter_topic
from pipelines.settings import KafkaSettings, PostgresSettings

log = get_logger("loadgen.sink")

VIEW = VIEWS["basic"]  # count(*), sum(latency), max(latency) per url
RELAY_APPLICATION = "streamviews-bench-relay"  # the relay's sessions' application_name (its backends sampled apart)


class SinkRun:
    """A throwaway stream over `topic`, the basic view, with or without an upsert sink, and its processes."""

    def __init__(
        self, topic: str, *, sink: bool, kafka: KafkaSettings, postgres: PostgresSettings, changes: bool = False
    ) -> None:
        self.topic, self.with_sink, self.kafka, self.postgres = topic, sink, kafka, postgres
        self.changes = changes
        run_id = unique_name("", sep="")
        self.schema, self.stream, self.group = f"bench_{run_id}", f"bench_pv_{run_id}", f"bench-sink-{run_id}"
        self.sink, self.out = f"bench_sink_{run_id}", f"bench-sink-out-{run_id}"
        self.runner: PipelineWorkers | None = None
        self.relay: ServiceProcess | None = None

    def statements(self) -> list[str]:
        """The stream and view of loadgen.pageviews, and the sink on the view when there is one."""
        statements = definitions(self.schema, self.stream, self.topic, self.group, VIEW.select, self.changes)
        if self.with_sink:
            statements.append(
                f"CREATE SINK {self.sink} FROM {self.schema}.{VIEW_NAME} WITH (topic = '{self.out}', format = 'upsert')"
            )
        return statements

    @contextmanager
    def running(self) -> Iterator[SinkRun]:
        """Defined, the relay (with a sink) and one runner started; stopped and all dropped after."""
        owner = owner_conninfo(self.postgres)
        try:
            with throwaway_definitions(self.schema, self.statements(), [self.stream], self.postgres):
                try:
                    if self.with_sink:
                        env = pipeline_env(self.postgres, self.kafka, application_name=RELAY_APPLICATION)
                        log_path = Path(tempfile.gettempdir()) / f"streamviews-{self.sink}-relay.log"
                        self.relay = ServiceProcess(
                            "relay", "pipelines.cv.relay", ["--group", self.group], env=env, log_path=log_path
                        )
                    self.runner = PipelineWorkers(
                        1,
                        topic=self.topic,
                        stream=self.stream,
                        group=self.group,
                        postgres=self.postgres,
                        kafka=self.kafka,
                    )
                    self.runner.also_sampled["kafka"] = find_pid(b"kafka.Kafka")
                    if self.relay is not None:
                        self.runner.also_sampled["relay"] = self.relay.process.pid
                        self.runner.also_backends["relay_postgres"] = RELAY_APPLICATION
                    yield self
                finally:
                    for process in (self.runner, self.relay):
                        if process is not None:
                            process.stop()
                    if self.with_sink:
                        with psycopg.connect(owner, autocommit=True) as conn:
                            catalog.define(conn, f"DROP SINK IF EXISTS {self.sink}")
        finally:
            forget_group(owner, self.group, self.topic, self.kafka)
            if self.with_sink:
                admin = AdminClient({"bootstrap.servers": self.kafka.bootstrap_servers})
                for topic in (self.out, dead_letter_topic(self.out)):
                    delete_topic(admin, topic)

    def drain(self) -> Drain:
        """Time the runner's drain of the whole topic (ops.kafka_offsets), start-up excluded."""
        assert self.runner is not None
        ends = high_watermarks(self.topic, self.kafka)
        with psycopg.connect(owner_conninfo(self.postgres), autocommit=True) as conn:
            return wait_drained(conn, self.runner, ends)

    def committed(self) -> int:
        """The events the runner has committed so far (its offsets in ops.kafka_offsets, summed)."""
        with psycopg.connect(owner_conninfo(self.postgres), autocommit=True) as conn:
            return sum(committed_offsets(conn, self.group, self.topic).values())

    def relay_caught_up(self, timeout_s: float = 300) -> float:
        """Seconds until the sink has relayed every change its view recorded."""
        started = time.monotonic()
        query = sql.SQL(
            "SELECT r.position >= p.last FROM cv.change_readers AS r"
            " JOIN cv.view_change_positions AS p ON p.view = r.view WHERE r.reader = {}"
        ).format(sql.Literal(f"sink {self.sink}"))
        with psycopg.connect(owner_conninfo(self.postgres), autocommit=True) as conn:
            while not conn.execute(query).fetchone()[0]:
                if self.relay is not None:
                    self.relay.check_alive()
                if time.monotonic() - started > timeout_s:
                    raise BenchmarkError(f"the relay did not catch up within {timeout_s:g} s")
                time.sleep(0.05)
        return time.monotonic() - started

    def commit_times(self) -> dict[str, float]:
        """Each marker url's first change of the view: when its transaction began (epoch ms, cv.view_changes)."""
        query = (
            "SELECT k.key ->> 'url', (extract(epoch FROM min(c.committed_at)) * 1000)::float8"
            " FROM cv.view_changes AS c CROSS JOIN LATERAL unnest(coalesce(c.keys, ARRAY[c.key])) AS k(key)"
            " WHERE c.view = %s AND k.key ->> 'url' LIKE '/marker/%%' GROUP BY 1"
        )
        with psycopg.connect(owner_conninfo(self.postgres)) as conn:
            return dict(conn.execute(query, (f"{self.schema}.{VIEW_NAME}",)).fetchall())

    def check(self, views: PageViews) -> None:
        """The view holds what was produced (loadgen.pageviews' own check)."""
        with psycopg.connect(owner_conninfo(self.postgres)) as conn:
            problems = VIEW.check(conn, sql.Identifier(self.schema, VIEW_NAME), views).problems
        if problems:
            raise BenchmarkError(f"the view differs from what was produced: {problems}")


class RecordProbe(Probe):
    """Reads the sink's topic from its start and times the first record of each pending marker url."""

    def __init__(self, topic: str, kafka: KafkaSettings) -> None:
        super().__init__("sink-record-probe", 0.0)
        self.topic, self.kafka = topic, kafka
        self._seen: set[str] = set()
        self.sent_at: dict[str, float] = {}  # marker url -> when it was handed to the producer (epoch ms)
        self.produced_at: dict[str, float] = {}  # marker url -> its first record's Kafka timestamp (epoch ms)
        self.read_at: dict[str, float] = {}  # marker url -> when this consumer read that record (epoch ms)

    def sent(self, marker: str, at: float) -> None:
        """Register a marker just before it is produced, with the wall clock its stages are timed by."""
        self.sent_at[marker] = time.time() * 1000
        super().sent(marker, at)

    @contextmanager
    def session(self) -> Iterator[Consumer]:
        """A consumer assigned to every partition of the sink's topic, from its start."""
        consumer = Consumer(
            {
                "bootstrap.servers": self.kafka.bootstrap_servers,
                "group.id": unique_name("probe"),
                "fetch.wait.max.ms": 5,
            }
        )
        try:
            consumer.assign([TopicPartition(self.topic, p, 0) for p in self._partitions(consumer)])
            yield consumer
        finally:
            consumer.close()

    def _partitions(self, consumer: Consumer, timeout_s: float = 30) -> list[int]:
        """The sink topic's partitions, asked again while the metadata has none (yet).

        Once every marker of a run was missed, the relay having published: most likely the answer
        named no partitions yet and the probe was assigned none. Now it asks again, or says so.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            topic = consumer.list_topics(self.topic, timeout=10).topics.get(self.topic)
            if topic is not None and topic.error is None and topic.partitions:
                return sorted(topic.partitions)
            if time.monotonic() > deadline:
                raise BenchmarkError(f"no partitions of {self.topic} in Kafka's metadata after {timeout_s:g} s")
            time.sleep(0.1)

    def find(self, session: Consumer, markers: list[str]) -> list[str]:
        """The pending markers whose record arrived, reading what the topic holds now."""
        for message in session.consume(1000, timeout=0.005):
            if message.error() is None and message.key() is not None:
                url = json.loads(message.key())["url"]
                if url in self.sent_at and url not in self._seen:
                    self.produced_at[url] = message.timestamp()[1]  # CreateTime: the relay's produce()
                    self.read_at[url] = time.time() * 1000
                self._seen.add(url)
        return [m for m in markers if m in self._seen]
