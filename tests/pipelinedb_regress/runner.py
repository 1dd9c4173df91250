"""A PipelineDB regression case run against the real stack, statement by statement.

Each case gets its own schema (its views and tables), its own streams and topics, and its own
runner group: a stream runner and an inbox relay of that group run for the case alone, so its
INSERTs reach its views through Kafka like any client's. Before each statement that prints rows, the
case waits until everything inserted was applied: the outbox holds none of its streams' rows and the
group's stored offsets are at the topics' ends. Each statement's outcome is one of:

- `passed`: rows equal to PipelineDB's (psql's text; in order when the query has ORDER BY), or an
  error where PipelineDB gave one;
- `failed`: other rows, or an error where PipelineDB gave rows;
- `refused`: this system refused a definition PipelineDB accepted (its one-line reason);
- `accepted`: this system accepted what PipelineDB refused (not a failure: a wider grammar);
- `skipped`: no meaning here (PipelineDB internals), or it reads something refused before.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import psycopg
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from psycopg.types.string import TextLoader

from pipelines.cv import catalog
from pipelines.cv.catalog import store, view_feeds
from pipelines.cv.engine import StreamMaintainer
from pipelines.cv.model import DefinitionError
from pipelines.cv.views import compiler
from pipelines.errors import StreamviewsError
from pipelines.settings import PostgresSettings
from stack.configure import client_settings
from stack.settings import StackSettings
from tests.integration.conftest import drop_in_dependency_order, poll
from tests.pipelinedb_regress.compare import TEXT_TYPES, Outcome, compare, sort_keys
from tests.pipelinedb_regress.translator import Names, Step, load, translate

# How long one statement may wait for its rows to be applied (a stuck case fails, it does not hang).
APPLY_TIMEOUT_S = 30.0
# The session PipelineDB's regression suite ran in (pg_regress's PGTZ and PGDATESTYLE, the
# IntervalStyle its database is set to; PostgreSQL 11's float output, 15 significant digits).
SESSION = (
    "SET TimeZone = 'PST8PDT'",
    "SET DateStyle = 'Postgres, MDY'",
    "SET IntervalStyle = 'postgres_verbose'",
    "SET extra_float_digits = 0",
)


@dataclass
class CaseResult:
    """A case's outcomes, and the reasons for what did not pass, for the table."""

    name: str
    outcomes: list[Outcome] = field(default_factory=list)
    timeouts: int = 0  # waits for the inserted rows to be applied that gave up (APPLY_TIMEOUT_S)
    seconds: float = 0.0

    def count(self, *statuses: str) -> int:
        return sum(o.status in statuses for o in self.outcomes)

    def reasons(self, *statuses: str) -> list[str]:
        seen: dict[str, None] = {}
        for o in self.outcomes:
            if o.status in statuses:
                seen.setdefault(o.detail, None)
        return list(seen)


def run_case(name: str, stack: StackSettings | None = None) -> CaseResult:
    """Run the committed case `name` in a schema, streams and runner group of its own; everything dropped after."""
    stack = stack or StackSettings()
    suffix = uuid.uuid4().hex[:8]
    names = Names(schema=f"pdb_{suffix}", suffix=suffix, group=f"pdbregress-{name}-{suffix}")
    settings = PostgresSettings(host="127.0.0.1", port=stack.pgport, secrets_dir=stack.paths.secrets)
    result = CaseResult(name)
    started = time.monotonic()
    with psycopg.connect(settings.conninfo(user="sv_owner"), autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {names.schema}")
        conn.execute(f"GRANT USAGE ON SCHEMA {names.schema} TO sv_writer, sv_reader")
        conn.execute(f"SET search_path = {names.schema}, public, streams")
        for setting in SESSION:
            conn.execute(setting)
        try:
            with _pipelines(stack, names.group):
                _Case(conn, names, stack, result).run(translate(load(name), names))
        finally:
            _clean(conn, names)
    result.seconds = time.monotonic() - started
    return result


class _Case:
    def __init__(self, conn: psycopg.Connection, names: Names, stack: StackSettings, result: CaseResult) -> None:
        self.conn, self.names, self.result, self.stack = conn, names, result, stack
        self.cursor = conn.cursor()
        for (oid,) in conn.execute("SELECT oid FROM pg_type").fetchall():  # every value as psql prints it
            self.cursor.adapters.register_loader(oid, TextLoader)
        # Its watermarks are the log's end (read_uncommitted): a read_committed query answers the last
        # stable offset, which may still stand before a transaction the relay has committed (Kafka
        # writes the commit markers after commit_transaction returns), so a first INSERT's rows read
        # as "nothing written yet" and the SELECT ran before the runner applied them.
        self.consumer = Consumer(
            {
                "bootstrap.servers": f"127.0.0.1:{stack.kafka_port}",
                "group.id": names.group + "-w",
                "isolation.level": "read_uncommitted",
            }
        )
        self.refused: set[str] = set()
        self.last_insert: float | None = None  # when the statement before, an INSERT, ran
        self.unread: set[str] = set()  # streams defined whose topic the case's runner may not read yet
        self.inserted = False
        self.reads_changes = False  # a view over output_of() was defined: each INSERT is applied alone
        self.timeouts = 0

    def run(self, steps: list[Step]) -> None:
        try:
            for step in steps:
                self.result.outcomes.append(self.step(step))
        finally:
            self.consumer.close()
            self.result.timeouts = self.timeouts

    def step(self, step: Step) -> Outcome:
        text = step.statement.text
        expected = step.statement.expected
        if step.kind == "unsupported":
            if step.source:
                self.refused.add(step.source)
            return Outcome(text, "skipped", step.reason)
        blocked = [n for n in self.refused if re.search(rf"\b{n}\b", text, re.I)]
        if blocked:
            if step.source:
                self.refused.add(step.source)
            return Outcome(text, "skipped", f"reads {blocked[0]}, refused above")
        anchor, self.last_insert = self.last_insert, None  # a sleep right after INSERTs is timed from them
        if step.kind == "view" and self.inserted:
            self.wait_applied()  # PipelineDB's view sees the rows inserted after it: not those still in flight
        if step.kind in ("stream", "view", "drop_stream", "drop_view", "set_ttl", "rename_view"):
            return self.define(step)
        if step.kind == "drop_schema":  # PipelineDB's views went with their schema; here the catalog drops them
            self.drop_schema_views(step.name)
        if step.kind == "ttl_expire":
            return self.expire(step)
        inserting = re.match(r"\s*(INSERT|COPY)\b", step.sql, re.I) is not None
        idle = self.conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE  # not in the case's BEGIN
        if inserting and self.inserted and self.reads_changes and idle:
            # PipelineDB applied each INSERT in a transaction of its own, so each gave its own change
            # to output_of(); two INSERTs in one runner batch give one. Apply the one before first.
            self.wait_applied()
        if inserting:
            self.inserted = True
            for stream in [s for s in self.unread if re.search(rf"\b{s}\b", step.sql)]:
                self.wait_subscribed(stream)
        if expected.rows is not None and self.inserted:
            self.wait_applied()
        try:
            self.cursor.execute(_sleep_after(step.sql, anchor))
            rows = self.cursor.fetchall() if self.cursor.description else None
            self.last_insert = time.monotonic() if inserting else None
        except psycopg.Error as e:
            message = _line(str(e))
            if expected.error is not None:
                return Outcome(text, "passed", f"an error, as PipelineDB: {message}")
            return Outcome(text, "failed", f"error: {message}")
        if expected.error is not None:
            return Outcome(text, "accepted", f"PipelineDB refused it: {expected.error}")
        if expected.rows is None:
            return Outcome(text, "passed")
        columns = [c.name for c in self.cursor.description or ()]
        texts = {i for i, c in enumerate(self.cursor.description or ()) if c.type_code in TEXT_TYPES}
        outcome = compare(text, expected.rows, rows or [], sort_keys(step.sql, columns), texts)
        outcome.rows = True
        return outcome

    def define(self, step: Step) -> Outcome:
        text = step.statement.text
        try:
            if step.kind in ("stream", "view", "set_ttl"):
                catalog.define(self.conn, step.sql)
            elif step.kind == "drop_view":
                self.drop_views(step.name.split(","))
            elif step.kind == "rename_view":
                self.rename_view(step.name, step.sql)
            else:
                self.drop_streams(step.name.split(","))
        except (DefinitionError, StreamviewsError) as e:
            if step.statement.expected.error is not None:  # PipelineDB made nothing either: what reads it runs
                return Outcome(text, "passed", f"refused, as PipelineDB: {_line(str(e))}")
            if step.source:
                self.refused.add(step.source)
            return Outcome(text, "refused", _line(str(e)))
        if step.kind == "stream":
            self.unread.add(step.name)
        if step.kind == "view" and "output_of" in step.sql.lower():
            self.reads_changes = True
        if step.statement.expected.error is not None:
            if step.kind == "view":  # PipelineDB made nothing: the case goes on without it, as PipelineDB's did
                catalog.drop(self.conn, [step.name], "view")
            return Outcome(text, "accepted", f"PipelineDB refused it: {step.statement.expected.error}")
        return Outcome(text, "passed")

    def wait_subscribed(self, stream: str) -> None:
        """Before a stream's first INSERT: until the case's runner reads its topic, as PipelineDB read at once.

        Otherwise the first INSERT waits for the runner to see the catalog, subscribe and rebalance
        (seconds), and a case that sleeps past a short window (sw_expiration: rows 1 s old in a 3 s
        window) reads them already expired.
        """
        self.unread.discard(stream)
        topic = self.conn.execute("SELECT topic FROM cv.streams WHERE name = %s", (stream,)).fetchone()
        if topic is None:
            return
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{self.stack.kafka_port}"})

        def assigned() -> bool:
            with contextlib.suppress(KafkaException):
                group = admin.describe_consumer_groups([self.names.group])[self.names.group].result(5)
                return any(tp.topic == topic[0] for m in group.members for tp in m.assignment.topic_partitions)
            return False

        poll(assigned, APPLY_TIMEOUT_S, 0.1)  # past it, the case goes on and its reads say what is missing

    def expire(self, step: Step) -> Outcome:
        """PipelineDB's ttl_expire(view): the expiry the runner runs every second, run now on the view's stream."""
        text, expected = step.statement.text, step.statement.expected
        if self.inserted:  # the rows inserted before are in the view first, as in PipelineDB's matrel
            self.wait_applied()
        row = self.conn.execute("SELECT stream FROM cv.views WHERE name = %s", (step.name,)).fetchone()
        streams = catalog.load_streams(self.conn)
        views = {c.view.qualified_name: c.view for c in store.load_views(self.conn, streams, row[0])} if row else {}
        view = views.get(step.name)
        if view is None or not compiler.expire(view, streams[view.stream]):
            error = f"{step.name} is not a continuous view with a ttl or a sliding window"
            return Outcome(text, "passed" if expected.error else "failed", f"error: {error}")
        settings = PostgresSettings(host="127.0.0.1", port=self.stack.pgport, secrets_dir=self.stack.paths.secrets)
        with psycopg.connect(settings.conninfo(user="sv_writer")) as conn:  # as the runner: its own session
            StreamMaintainer(view.stream).expire(conn)
        if expected.error is not None:
            return Outcome(text, "accepted", f"PipelineDB refused it: {expected.error}")
        return Outcome(text, "passed", "expired now (PipelineDB's answer, 0 * rows, not compared)", rows=True)

    def drop_views(self, views: list[str]) -> None:
        """DROP VIEW: a continuous view, or a transform (PipelineDB's CREATE VIEW made both)."""
        for view in views:
            if self.conn.execute("SELECT 1 FROM cv.transforms WHERE name = %s", (view,)).fetchone():
                catalog.define(self.conn, f"DROP CONTINUOUS TRANSFORM {view}")
            else:
                catalog.drop(self.conn, [view], "view")

    def rename_view(self, name: str, new_name: str) -> None:
        """ALTER VIEW ... RENAME TO / SET SCHEMA as PipelineDB did it: here the catalog's drop, then its define.

        The view defined again under its new name starts empty: PipelineDB kept the rows.
        """
        (definition,) = self.conn.execute("SELECT definition FROM cv.views WHERE name = %s", (name,)).fetchone()
        head = re.match(rf"\s*CREATE\s+(?:CONTINUOUS\s+)?VIEW\s+{re.escape(name)}\b", definition, re.I)
        if head is None:
            raise DefinitionError(f"{name}: its stored definition does not start with its name")
        with self.conn.transaction():
            catalog.drop(self.conn, [name], "view")
            catalog.define(self.conn, head.group(0).replace(name, new_name) + definition[head.end() :])

    def drop_schema_views(self, schema: str) -> None:
        """The continuous views and transforms in `schema`, dropped through the catalog (DROP SCHEMA may not)."""
        in_schema = "SELECT name FROM {} WHERE split_part(name, '.', 1) = %s"
        _drop_views(self.conn, [v for (v,) in self.conn.execute(in_schema.format("cv.views"), (schema,))])
        for (transform,) in self.conn.execute(in_schema.format("cv.transforms"), (schema,)).fetchall():
            with contextlib.suppress(DefinitionError, StreamviewsError):  # left to DROP SCHEMA's error
                catalog.define(self.conn, f"DROP CONTINUOUS TRANSFORM {transform}")

    def drop_streams(self, streams: list[str]) -> None:
        """DROP FOREIGN TABLE ... CASCADE: the views and transforms over the streams first."""
        for stream in streams:
            views = [v for (v,) in self.conn.execute("SELECT name FROM cv.views WHERE stream = %s", (stream,))]
            for view in views:  # and the views over them (FROM the view, output_of, combine), as CASCADE does
                views += [v for v in view_feeds.views_over(self.conn, view) if v not in views]
            _drop_views(self.conn, views)
            _drop_transforms(self.conn, stream)
            catalog.drop(self.conn, [stream], "stream")

    def wait_applied(self) -> None:
        """Until the case's rows left the outbox and the runner's offsets reached the topics' ends."""
        streams = list(self.names.streams.values())
        if not poll(lambda: self.applied(streams), APPLY_TIMEOUT_S, 0.1):
            self.timeouts += 1
        self.inserted = False

    def applied(self, streams: list[str]) -> bool:
        left = self.conn.execute("SELECT count(*) FROM cv.stream_inbox WHERE stream = ANY(%s)", (streams,)).fetchone()
        if left[0]:
            return False
        stored = dict(
            self.conn.execute(
                "SELECT topic, next_offset FROM ops.kafka_offsets WHERE group_id = %s AND partition = 0",
                (self.names.group,),
            ).fetchall()
        )
        for stream in streams:
            topic = self.conn.execute("SELECT topic FROM cv.streams WHERE name = %s", (stream,)).fetchone()
            if topic is None:
                continue
            try:
                _, high = self.consumer.get_watermark_offsets(TopicPartition(topic[0], 0), timeout=5)
            except KafkaException:
                # A topic the relay has just created is unknown to this client's metadata for a while
                # (Local: Unknown partition): written to, not yet applied. Only a topic Kafka does not
                # have holds nothing.
                if self._topic_exists(topic[0]):
                    return False
                continue
            # Every record came from the relay's transactions: the last offset is a commit marker (or,
            # while Kafka is still writing it, the transaction's last record: not read yet either way).
            if high > 0 and stored.get(topic[0], 0) < high - 1:
                return False
        if not self.feeds_caught_up():
            return False
        # A batch committed since the first look may have written rows (a transform's insert_into_stream).
        left = self.conn.execute("SELECT count(*) FROM cv.stream_inbox WHERE stream = ANY(%s)", (streams,)).fetchone()
        return not left[0]

    def feeds_caught_up(self) -> bool:
        """Whether the views over the case's views (FROM a view, output_of) have taken every change recorded.

        A level's changes are recorded in the transaction that applies the level below, so once every
        feed has read up to its upstream's last position, a whole chain is done.
        """
        behind = self.conn.execute(
            "SELECT count(*) FROM cv.change_readers AS r JOIN cv.view_change_positions AS p ON p.view = r.view"
            " WHERE starts_with(r.reader, 'stream ') AND split_part(r.view, '.', 1) = ANY(%s) AND r.position < p.last",
            ([self.names.schema, *self.names.schemas],),
        ).fetchone()
        return not behind[0]

    def _topic_exists(self, topic: str) -> bool:
        """Whether Kafka has the topic, asked of the broker (not this client's cached metadata)."""
        try:
            found = self.consumer.list_topics(topic, timeout=5).topics.get(topic)
        except KafkaException:
            return True  # no answer: ask again rather than read too early
        return found is not None and found.error is None


_SLEEP = re.compile(r"^\s*SELECT\s+pg_sleep\(\s*([0-9.]+)\s*\)\s*;?\s*$", re.I)


def _sleep_after(statement: str, inserted_at: float | None) -> str:
    """`SELECT pg_sleep(n)` right after INSERTs sleeps until n seconds after them, as it did in PipelineDB.

    PipelineDB applied an INSERT's rows as it returned; here they go through the inbox and Kafka
    first, and the wait for them to be applied must not lengthen the sleep a case times a short
    window or ttl by (rows are as old as their arrival_timestamp, the INSERT's time).
    """
    sleep = _SLEEP.match(statement)
    if sleep is None or inserted_at is None:
        return statement
    return f"SELECT pg_sleep({max(float(sleep.group(1)) - (time.monotonic() - inserted_at), 0):.3f})"


def _line(message: str) -> str:
    return message.strip().splitlines()[0] if message.strip() else message


def _drop_views(conn: psycopg.Connection, views: list[str]) -> None:
    """Drop views, each after the views that read it; one that cannot go is left to DROP SCHEMA's error."""
    with contextlib.suppress(DefinitionError, StreamviewsError):  # e.g. blocked by a lock: left to the schema's DROP
        drop_in_dependency_order(conn, views)


def _drop_transforms(conn: psycopg.Connection, stream: str) -> None:
    """The transforms over a stream, each after what reads its output (views, transforms), as CASCADE does."""
    for (name,) in conn.execute("SELECT name FROM cv.transforms WHERE stream = %s", (stream,)).fetchall():
        views = view_feeds.views_over(conn, name)
        for view in views:
            views += [v for v in view_feeds.views_over(conn, view) if v not in views]
        _drop_views(conn, views)
        for feed in view_feeds.feeds_of(conn, name):
            _drop_transforms(conn, feed.name)
        catalog.define(conn, f"DROP CONTINUOUS TRANSFORM {name}")


def _clean(conn: psycopg.Connection, names: Names) -> None:
    """Everything the case made: views, transforms, streams, the schema, the topics."""
    streams = [
        s for (s,) in conn.execute("SELECT name FROM cv.streams WHERE name = ANY(%s)", (list(names.streams.values()),))
    ]
    views = [
        v
        for (v,) in conn.execute(
            "SELECT name FROM cv.views WHERE split_part(name, '.', 1) = ANY(%s) OR stream = ANY(%s)",
            ([names.schema, *names.schemas], streams),
        )
    ]
    _drop_views(conn, views)
    for schema in sorted(names.schemas):  # the case's own schemas, with what in them reads the streams
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    for stream in streams:
        with contextlib.suppress(DefinitionError, StreamviewsError):
            _drop_transforms(conn, stream)
            catalog.drop(conn, [stream], "stream")
    conn.execute(f"DROP SCHEMA {names.schema} CASCADE")
    topics = names.topics()
    if topics:
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{StackSettings().kafka_port}"})
        for future in admin.delete_topics([*topics, *(f"{t}.dlq" for t in topics)], operation_timeout=30).values():
            with contextlib.suppress(KafkaException, TimeoutError):  # never created, or Kafka away: left
                future.result(60)


@contextlib.contextmanager
def _pipelines(stack: StackSettings, group: str) -> Iterator[None]:
    """The stream runner and the inbox relay of the case's group, stopped (SIGTERM) after."""
    env = {
        **os.environ,
        **client_settings(stack),
        "PGUSER": "sv_writer",
        "LOG_FORMAT": "json",
        "METRICS_PORT": "0",
        "PIPELINE_BATCH_WAIT_MS": "20",
        "PIPELINE_EXPIRE_INTERVAL_S": "1",
        "PIPELINE_VIEW_RETRY_S": "1",  # a view activated again resumes at the next sweep: within a second
        "PIPELINE_HOLD_RETRY_S": "1",
        "INBOX_WAKE_S": "0.5",
    }
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", f"pipelines.cv.{module}", "--group", group],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for module in ("runner", "inbox")
    ]
    try:
        yield
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
