"""Session fixtures for the real stack: started (or found running) once, then waited for, never slept for.

`stack` runs `python -m stack up`, which is idempotent and returns only when Kafka, Connect,
PostgreSQL and Elasticsearch all answer. Per-test resources (topics, schemas, indices, connectors) get
unique names so tests never see each other's data.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from elasticsearch import Elasticsearch

from pipelines.cv import catalog
from pipelines.cv.engine import StreamMaintainer
from pipelines.cv.model import DefinitionError
from pipelines.settings import (
    AuditSettings,
    ConnectSettings,
    ElasticsearchSettings,
    KafkaSettings,
    PostgresSettings,
)
from stack.configure import client_settings
from stack.settings import StackSettings
from tests.integration.processes import forget_ended, logs_of_started, spawn, stop_process


def unique(prefix: str) -> str:
    """A name no other test (or earlier run) uses."""
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def poll(condition: Callable[[], object], timeout: float, interval: float = 0.2) -> object:
    """`condition()`'s first truthy result, polled every `interval` seconds; None after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            return None
        time.sleep(interval)


def wait_for(condition: Callable[[], object], timeout: float = 60, interval: float = 0.2, what: str = "") -> object:
    """Poll until `condition()` returns something truthy; fail after `timeout` seconds."""
    result = poll(condition, timeout, interval)
    if not result:
        logs = logs_of_started()
        pytest.fail(f"timed out after {timeout}s waiting for {what or condition}" + (f"\n{logs}" if logs else ""))
    return result


@pytest.fixture(autouse=True)
def _forget_ended_processes() -> Iterator[None]:
    """After each test, the log files of the pipeline processes it started and that have ended go."""
    yield
    forget_ended()


@pytest.fixture(scope="session")
def stack() -> StackSettings:
    """The local stack, up and ready."""
    subprocess.run([sys.executable, "-m", "stack", "up"], check=True)
    return StackSettings()


@pytest.fixture(scope="session")
def secrets_dir(stack: StackSettings) -> Path:
    return stack.paths.secrets


@pytest.fixture(scope="session")
def pg(stack: StackSettings, secrets_dir: Path) -> Callable[..., psycopg.Connection]:
    """Connect to the stack's database as a given role (its password comes from the secrets folder)."""
    settings = PostgresSettings(host="127.0.0.1", port=stack.pgport, secrets_dir=secrets_dir)

    def connect(role: str = "sv_owner", **kwargs: object) -> psycopg.Connection:
        return psycopg.connect(settings.conninfo(user=role), **kwargs)

    return connect


@pytest.fixture(scope="session")
def kafka(stack: StackSettings) -> KafkaSettings:
    return KafkaSettings(bootstrap_servers=f"127.0.0.1:{stack.kafka_port}")


@pytest.fixture(scope="session")
def admin(kafka: KafkaSettings) -> AdminClient:
    return AdminClient({"bootstrap.servers": kafka.bootstrap_servers})


@pytest.fixture
def topic_factory(admin: AdminClient) -> Iterator[Callable[..., str]]:
    """Create uniquely named topics for one test; they are deleted afterwards."""
    created: list[str] = []

    def create(prefix: str = "test", partitions: int = 1) -> str:
        name = unique(prefix)
        admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])[name].result(30)
        created.append(name)
        return name

    yield create
    delete_topics(created)  # throwaway_views may have deleted a stream's topic already


@pytest.fixture(scope="session")
def es_settings(stack: StackSettings, secrets_dir: Path) -> ElasticsearchSettings:
    return ElasticsearchSettings(url=f"http://127.0.0.1:{stack.es_port}", secrets_dir=secrets_dir)


@pytest.fixture(scope="session")
def es(es_settings: ElasticsearchSettings) -> Elasticsearch:
    return Elasticsearch(es_settings.url, basic_auth=es_settings.basic_auth(), request_timeout=30)


@pytest.fixture(scope="session")
def connect(stack: StackSettings) -> ConnectSettings:
    """Kafka Connect's REST API, with the stack's credentials (`connect.basic_auth()`)."""
    return ConnectSettings(url=f"http://127.0.0.1:{stack.connect_port}", secrets_dir=stack.paths.secrets)


def pipeline_env(stack: StackSettings, **overrides: str) -> dict[str, str]:
    """The environment of a pipeline process started by a test: this stack, as the writer role, no metrics port."""
    return {
        **os.environ,
        **client_settings(stack),
        "PGUSER": "sv_writer",
        "LOG_FORMAT": "json",
        "METRICS_PORT": "0",
        **overrides,
    }


def start_runner(stack: StackSettings, group: str, **env: str) -> subprocess.Popen:
    """A stream runner of its own consumer group (`python -m pipelines.cv.runner --group G`).

    Quarantined views and held streams are retried every second (the defaults wait 30 s).
    """
    settings = {
        "PIPELINE_BATCH_WAIT_MS": "20",
        "PIPELINE_EXPIRE_INTERVAL_S": "1",
        "PIPELINE_VIEW_RETRY_S": "1",
        "PIPELINE_HOLD_RETRY_S": "1",
        **env,
    }
    return spawn([sys.executable, "-m", "pipelines.cv.runner", "--group", group], pipeline_env(stack, **settings))


def stop_runner(process: subprocess.Popen) -> str:
    """Stop a runner with SIGTERM; its log (stderr), which must hold no traceback."""
    stderr = stop_process(process)
    assert "Traceback" not in stderr, stderr[-3000:]
    return stderr


@contextmanager
def throwaway_views(
    pg: Callable[..., psycopg.Connection],
    schema: str,
    streams: list[str],
    definitions: str,
    *,
    schema_exists: bool = False,
):
    """A schema holding the continuous views `definitions` declares (with `streams`); all dropped after."""
    with pg("sv_owner", autocommit=True) as conn:
        if not schema_exists:
            conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO sv_writer, sv_reader")
        catalog.define(conn, definitions)
    try:
        yield
    finally:
        with pg("sv_owner", autocommit=True) as conn:
            views = [v for (v,) in conn.execute("SELECT name FROM cv.views WHERE name LIKE %s", (f"{schema}.%",))]
            drop_in_dependency_order(conn, views)
            for (transform,) in conn.execute("SELECT name FROM cv.transforms WHERE name LIKE %s", (f"{schema}.%",)):
                catalog.define(conn, f"DROP CONTINUOUS TRANSFORM IF EXISTS {transform}")
            declared = catalog.load_streams(conn, skip_broken=True)
            topics = {declared[stream].topic for stream in streams if stream in declared}
            for stream in streams:
                catalog.drop(conn, [stream], "stream")
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
            still_read = {s.topic for s in catalog.load_streams(conn, skip_broken=True).values()}
        delete_topics({name for topic in topics - still_read for name in (topic, f"{topic}.dlq")})


def drop_in_dependency_order(conn: psycopg.Connection, views: list[str]) -> None:
    """Drop these views, each after the views that read it (a view read by another refuses its DROP)."""
    while views:
        left = []
        for view in views:
            try:
                catalog.drop(conn, [view], "view")
            except DefinitionError:
                left.append(view)  # read by a view still there: dropped on a later pass
        if len(left) == len(views):
            catalog.drop(conn, left[:1], "view")  # raises what keeps it
        views = left


def delete_topics(topics: Iterable[str]) -> None:
    """Delete a test's topics, those it created and those the runner created for its streams.

    Dropping a stream keeps its topic (users' data); left behind, hundreds of test topics weigh on
    the broker's small heap in later runs.
    """
    topics = sorted(topics)
    if not topics:
        return
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{StackSettings().kafka_port}"})
    for future in admin.delete_topics(topics, operation_timeout=30).values():
        # A topic never created (no event was sent to it) or already gone is fine.
        with contextlib.suppress(KafkaException):
            future.result(60)


def topic_records(kafka: KafkaSettings, topic: str, *, transactional: bool = False) -> list[Message]:
    """Every record `topic` holds now (none when it does not exist), each partition's in its order.

    Read committed. A record missing before a partition's end fails the test, except on a topic
    written in Kafka transactions (`transactional`): its last offsets can be commit markers, which
    no consumer is given, so reading stops at the first poll that finds nothing more.
    """
    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "group.id": unique("reader"),
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        ends = _partition_ends(consumer, topic)
        left = {p: end for p, end in ends.items() if end > 0}
        consumer.assign([TopicPartition(topic, p, 0) for p in left])
        out: list[Message] = []
        while left:
            message = consumer.poll(1 if transactional else 5)
            if message is None and transactional:
                break
            assert message is not None, f"{topic}: records missing before {left}"
            assert message.error() is None, message.error()
            out.append(message)
            if message.offset() + 1 >= left.get(message.partition(), 0):
                left.pop(message.partition(), None)
        return out
    finally:
        consumer.close()


# What a topic created a moment ago can answer while its partitions' leader is being elected.
_NOT_READY = (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART)


def _partition_ends(consumer: Consumer, topic: str) -> dict[int, int]:
    """Each partition's end offset (none when the topic does not exist), asked again while it is not ready."""

    def ends() -> tuple[dict[int, int]] | None:  # in a tuple: a topic that does not exist is an answer too
        metadata = consumer.list_topics(timeout=10).topics.get(topic)
        numbers = sorted(metadata.partitions) if metadata is not None and metadata.error is None else []
        try:
            return ({p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in numbers},)
        except KafkaException as e:
            if e.args[0].code() not in _NOT_READY:
                raise
            return None

    return wait_for(ends, timeout=30, what=f"a leader for each partition of {topic}")[0]  # type: ignore[index]


@pytest.fixture(scope="module")
def writer(pg: Callable[..., psycopg.Connection], streams: object) -> Iterator[psycopg.Connection]:
    """The pipelines' role, once the module's `streams` fixture has defined its streams and views.

    Autocommit, so each `transaction()` block is a real transaction.
    """
    with pg("sv_writer", autocommit=True) as conn:
        yield conn


def as_stream_table(conn: psycopg.Connection, stream: str, columns: str, rows: Iterable[tuple]) -> None:
    """The rows in a temporary table named like the stream, so a view's own SELECT runs over them.

    The oracle of the view tests; call it inside a transaction the caller rolls back.
    """
    conn.execute(f"CREATE TEMP TABLE {stream} ({columns}) ON COMMIT DROP")
    with conn.cursor().copy(f"COPY {stream} FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)


def apply_rows(conn: psycopg.Connection, stream: str, ops: list[int], rows: list[tuple]) -> None:
    """One batch of stream rows (+1 insert / -1 delete each) through the engine, in one transaction."""
    with conn.transaction():
        StreamMaintainer(stream).apply(conn, ops, [list(c) for c in zip(*rows, strict=True)])


@pytest.fixture
def audit_log(pg, es):
    """A throwaway audit log: its schema and index prefix, dropped (tables, documents) afterwards."""
    schema = unique("audit_t")
    settings = AuditSettings(schema_name=schema, index_prefix=f"audit-{schema.replace('_', '')}")
    with pg("sv_owner", autocommit=True) as conn:
        conn.execute("SELECT audit.create_log(%s)", (schema,))
    yield settings
    with pg("sv_owner", autocommit=True) as conn:
        conn.execute("DELETE FROM audit.tables WHERE log_schema = %s", (schema,))  # checkpoints go with them
        conn.execute("DELETE FROM audit.index_deletions WHERE log_schema = %s", (schema,))
        conn.execute(f"DROP SCHEMA {schema} CASCADE")
    for index in es.indices.get(index=f"{settings.index_prefix}-*", allow_no_indices=True):
        es.indices.delete(index=index)
