"""The audit pipelines of `loadgen.audit` as production runs them, and what is timed around them.

- `Names`: every throwaway name of one run (audit logs, topic, group, index prefixes);
- `Services`: `python -m pipelines.audit.writer` (as sv_writer) and `python -m pipelines.audit.puller` (as
  sv_indexer, retention off) on the bench log, with a monitoring session and the PIDs whose CPU is
  sampled (the services, their PostgreSQL backends, the Elasticsearch and Kafka JVMs);
- `wait_for_count`: a count over the ledger polled every 50 ms until it reaches the backlog;
- `measure_lag`: steady production with marker events, each timed until a terms query finds it;
- `cleanup`: the logs' ledger rows and schemas, queued index deletions,
  indices, offsets and topics.
"""

from __future__ import annotations

import contextlib
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka.admin import AdminClient
from elasticsearch import Elasticsearch
from psycopg import sql

from loadgen.audit import baselines as base
from loadgen.common.drain import CpuSample, Drain, time_drain
from loadgen.common.errors import BenchmarkError
from loadgen.common.freshness import Probe
from loadgen.common.kafka import EventSource, Sender
from loadgen.common.postgres import owner_conninfo
from loadgen.common.processes import ServiceProcess, backend_pids, find_pid, pipeline_env
from loadgen.common.throwaway import forget_group
from loadgen.workloads.audit import AuditWorkload
from pipelines.logs import get_logger
from pipelines.settings import ROLE_INDEXER, ROLE_WRITER, KafkaSettings, PostgresSettings

log = get_logger("loadgen.audit.pipelines")

PARTITIONS = 6  # the pipelines' default (PIPELINE_TOPIC_PARTITIONS)
DRAIN_TIMEOUT_S = 900.0
MARKER_INTERVAL_S = 0.2
SEARCH_POLL_S = 0.1
MARKER_TIMEOUT_S = 60.0
MERGE_SETTLE_TIMEOUT_S = 120.0
APPS = {"writer": "streamviews-bench-audit-writer", "puller": "streamviews-bench-audit-puller"}


def _app(role: str) -> str:
    """The session name of a service's PostgreSQL backend (writer2, writer3, ... for extra writers)."""
    return APPS.get(role, f"streamviews-bench-audit-{role}")


@dataclass(frozen=True)
class Names:
    """Every throwaway name of one run."""

    run: str

    schema = property(lambda self: f"bench_{self.run}")
    query_schema = property(lambda self: f"bench_{self.run}_q")
    topic = property(lambda self: f"bench-audit-{self.run}")
    group = property(lambda self: f"bench-audit-{self.run}")
    prefix = property(lambda self: f"audit-bench{self.run}")
    bare_prefix = property(lambda self: f"audit-bench{self.run}bare")


class Services:
    """The bench log's writer and puller, started as production runs them, and a monitoring session."""

    def __init__(self, names: Names, postgres: PostgresSettings, kafka: KafkaSettings) -> None:
        self.names, self.postgres, self.kafka = names, postgres, kafka
        self.conn = psycopg.connect(owner_conninfo(postgres), autocommit=True)
        self.procs: dict[str, ServiceProcess] = {}
        self.backends: dict[str, tuple[int, ...]] = {}
        self.jvms = {
            "elasticsearch": find_pid(b"org.elasticsearch.bootstrap.Elasticsearch"),
            "kafka": find_pid(b"kafka.Kafka"),
        }

    def start(self, role: str) -> ServiceProcess:
        """Spawn the writer (`role="writer"`) or the puller, its JSON log in a temporary file."""
        user = ROLE_WRITER if role.startswith("writer") else ROLE_INDEXER
        env = pipeline_env(self.postgres, self.kafka, role=user, application_name=_app(role))
        env = {k: v for k, v in env.items() if not k.startswith("AUDIT_")} | {"AUDIT_SCHEMA": self.names.schema}
        if role.startswith("writer"):
            module, args = "pipelines.audit.writer", ["--topic", self.names.topic, "--group", self.names.group]
        else:
            module, args = "pipelines.audit.puller", []
            env |= {
                "AUDIT_INDEX_PREFIX": self.names.prefix,
                "AUDIT_RETENTION_INTERVAL_S": "0",
                "PIPELINE_REPORT_INTERVAL_S": "1",  # progress (lag) lines every second
            }
        path = Path(tempfile.gettempdir()) / f"streamviews-{self.names.schema}-{role}.log"
        self.procs[role] = ServiceProcess(role, module, args, env=env, log_path=path)
        return self.procs[role]

    def pids(self) -> dict[str, int | Sequence[int] | None]:
        """Processes whose CPU is sampled: the services, their PostgreSQL backends, the JVMs."""
        pids: dict[str, int | Sequence[int] | None] = dict(self.jvms)
        for role, proc in self.procs.items():
            if not self.backends.get(role):
                self.backends[role] = backend_pids(self.conn, _app(role))
            pids |= {role: proc.process.pid, f"{role}_pg": self.backends[role]}
        return pids

    def count(self, query: str) -> int:
        """A count over the bench log's ledger (`%s` = its schema)."""
        return self.conn.execute(query, (self.names.schema,)).fetchone()[0]

    def stop(self) -> dict[str, int]:
        """SIGTERM every service (again: a no-op); their exit codes. Their logs stay readable."""
        return {role: proc.stop() for role, proc in self.procs.items()}


ROWS_WRITTEN = "SELECT coalesce(sum(rows), 0)::bigint FROM audit.tables WHERE log_schema = %s"
ROWS_INDEXED = (
    "SELECT coalesce(sum(c.rows_indexed), 0)::bigint FROM audit.pull_checkpoints c"
    " JOIN audit.tables t USING (table_name) WHERE t.log_schema = %s"
)


def wait_for_count(count: Callable[[], int], target: int, proc: ServiceProcess, services: Services) -> Drain:
    """Poll `count` every 50 ms until it reaches `target` (`time_drain`); the first non-zero poll starts the clock."""
    drain = time_drain(
        count,
        target,
        what=proc.name,
        started=proc.started,
        check_alive=proc.check_alive,
        pids=services.pids,
        timeout=DRAIN_TIMEOUT_S,
    )
    if drain.first_committed >= target:
        raise BenchmarkError(f"{proc.name}: the first poll found all {target} rows; use more --rows")
    return drain


class SearchProbe(Probe):
    """Polls `<prefix>-*` every 100 ms for marker tokens, which start the marker events' content."""

    def __init__(self, es: Elasticsearch, prefix: str) -> None:
        super().__init__("search-probe", SEARCH_POLL_S)
        self.es, self.prefix = es, prefix

    def session(self) -> contextlib.nullcontext[Elasticsearch]:
        """The shared client (thread-safe)."""
        return contextlib.nullcontext(self.es)

    def find(self, session: Elasticsearch, markers: list[str]) -> Iterable[str]:
        """The tokens a terms query on `content` finds now."""
        hits = session.search(
            index=f"{self.prefix}-*",
            query={"terms": {"content": markers}},
            size=len(markers),
            source_includes=["content"],
        )["hits"]["hits"]
        return [hit["_source"]["content"].split(" ", 1)[0] for hit in hits]


@dataclass(frozen=True)
class LagRun:
    """The steady phase: what was produced, marker latencies, the puller's own lag lines, CPU."""

    rate: float
    produced: int
    latencies: list[float]
    progress: list[dict[str, Any]]
    cpu: dict[str, float]
    pg_rows: int
    es_docs: int
    index_ops: int  # index operations on the puller's indices over the whole run (re-sent rows included)
    merges_waited: float  # seconds spent before the phase until the drain's merges were done
    samples: list[tuple[float, float]] = field(default_factory=list)  # (s since the phase began, marker latency s)
    started_wall: float = 0.0  # the phase's start, on the wall clock (the puller's progress lines carry UTC times)


def measure_lag(services: Services, es: Elasticsearch, workload: AuditWorkload, rate: float, seconds: float) -> LagRun:
    """Produce at `rate` for `seconds` with a marker every 200 ms; time each until searchable."""
    names, puller = services.names, services.procs["puller"]
    merges_waited = wait_merges_settled(es, names.prefix)
    probe = SearchProbe(es, names.prefix)
    probe.start()
    log_mark = len(puller.records())
    cpu_start, started_wall = CpuSample.take(services.pids()), time.time()
    source = EventSource(
        names.topic, workload.rows(1), workload.encode, kafka=services.kafka, rate=rate, duration=seconds
    )
    reports = []
    loader = threading.Thread(target=lambda: reports.append(source.run()), daemon=True)
    loader.start()
    markers_out = Sender(names.topic, services.kafka, client="bench-markers", **{"linger.ms": 0})
    markers, rows, next_marker = 0, workload.rows(2), time.monotonic()
    try:
        while loader.is_alive():
            if time.monotonic() >= next_marker:
                token = f"zq{names.run}{markers:06d}"
                key, value = workload.encode(next(rows), token)
                probe.sent(token, time.monotonic())
                markers_out.send(key, value)
                markers, next_marker = markers + 1, next_marker + MARKER_INTERVAL_S
            markers_out.producer.poll(0)
            time.sleep(0.005)
        cpu_end = CpuSample.take(services.pids())
        unsent = markers_out.flush(30)
        probe.wait_for_markers(MARKER_TIMEOUT_S, puller.check_alive, poll_s=0.1)
    finally:
        source.stop()
        probe.stop()
        probe.join(10)
    if probe.error is not None:
        raise BenchmarkError(f"search probe: {probe.error}") from probe.error
    if unsent or not reports or reports[0].errors:
        raise BenchmarkError(f"lag producer: {unsent} markers lost ({markers_out.first_error}), report {reports}")
    if probe.pending:
        raise BenchmarkError(f"{probe.pending} of {markers} markers not searchable after {MARKER_TIMEOUT_S}s")
    progress = [r for r in puller.records()[log_mark:] if r.get("event") == "progress"]
    pg_rows = services.count(ROWS_WRITTEN)
    es_docs = count_when_settled(es, names.prefix, pg_rows)
    stats = es.indices.stats(index=f"{names.prefix}-*", metric="indexing")["_all"]["primaries"]
    cpu = cpu_end.cores_since(cpu_start)
    return LagRun(
        rate,
        reports[0].delivered,
        probe.latencies,
        progress,
        cpu,
        pg_rows,
        es_docs,
        stats["indexing"]["index_total"],
        merges_waited,
        [(sent - cpu_start.at, latency) for sent, latency in probe.samples],
        started_wall,
    )


def wait_merges_settled(es: Elasticsearch, prefix: str, timeout: float = MERGE_SETTLE_TIMEOUT_S) -> float:
    """Wait until no merge runs on `<prefix>-*`; returns the seconds waited.

    The drain before the lag phase puts hundreds of thousands of documents into today's index within
    a minute, and Elasticsearch merges their segments for a while after. The lag phase writes into
    the same index: started at once, it would time that leftover merge, not a steady state (whose
    own merges it still includes).
    """
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        stats = es.indices.stats(index=f"{prefix}-*", metric="merge")["_all"]["total"]["merges"]
        if stats["current"] == 0:
            break
        time.sleep(0.5)
    return time.monotonic() - started


def count_when_settled(es: Elasticsearch, prefix: str, expected: int) -> int:
    """Documents in `<prefix>-*` once they reach `expected` (or after the timeout), refreshed."""
    with contextlib.suppress(BenchmarkError):
        base.wait_searchable(es, prefix, expected)
    es.indices.refresh(index=f"{prefix}-*")
    return base.count_documents(es, prefix)


def cleanup(names: Names, owner: str, es: Elasticsearch, admin: AdminClient, kafka: KafkaSettings) -> None:
    """Drop the logs (tables through retention, then the schemas), indices, offsets and topics. Never raises."""
    forget_group(owner, names.group, names.topic, kafka)  # offsets, dead-letter counts and topic
    for schema in (names.schema, names.query_schema):
        try:
            with psycopg.connect(owner, autocommit=True) as conn:
                # As the tests' audit_log fixture does: audit.drop_expired refuses anything younger than
                # the log's retention, and the bench log's tables are all from today.
                conn.execute("DELETE FROM audit.tables WHERE log_schema = %s", (schema,))  # checkpoints go too
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
                conn.execute("DELETE FROM audit.index_deletions WHERE log_schema = %s", (schema,))
        except psycopg.Error:
            log.exception("could not drop a bench audit log", schema=schema)
    for prefix in (names.prefix, names.bare_prefix):
        try:
            for index in es.indices.get(index=f"{prefix}-*", allow_no_indices=True, ignore_unavailable=True):
                es.indices.delete(index=index)
        except Exception:
            log.exception("could not delete bench indices", prefix=prefix)
    for future in admin.delete_topics([names.topic]).values():
        try:
            future.result(30)
        except Exception:
            log.exception("could not delete the bench topic", topic=names.topic)
