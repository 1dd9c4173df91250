"""streamviews' side of `loadgen.bench_social`: the likes pipeline end to end, and the social queries.

Both measurements run on throwaway objects only. A schema `bench_<id>` (owned by `sv_owner`, usable by
`sv_writer` and `sv_reader`) receives copies of the social views of sql/views/social.sql, defined
through the catalog on a bench stream with the same columns, key and options but its own topic
(`copy_definitions` checks that each copy parses to the same stream and views as its original), and
copies of the query functions of sql/functions/social.sql with `social.` replaced by the bench
schema (same PL/pgSQL, so the same plans). Everything is dropped afterwards, catalog entries first; the real
`likes`/`follows` topics and the `social` schema are never read or written.

- `run_pipeline`: one or more stream runners (`python -m pipelines.cv.runner --streams <bench stream>`)
  in one consumer group on the bench topic, timed until their offsets in `ops.kafka_offsets` reach
  the topic's end, then kept running under a steady load with marker likes whose visibility in
  `object_likes` a poller thread times (freshness).
- `run_social_queries`: the views filled through the engine (`StreamMaintainer.apply`, in batches,
  as `sv_writer`) with exactly the seed intersection baseline's likes and follow lists, then pgbench
  of the copied `like_count`, `likers` and `friends_who_like` functions as `sv_reader`.

`throwaway_definitions`, `PipelineWorkers`, `wait_drained` and `CpuSample` serve the other stream
benchmarks too (`loadgen.bench_pageviews`).
"""

from __future__ import annotations

import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from itertools import islice
from pathlib import Path
from typing import Any

import orjson
import psycopg
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from psycopg import sql

from loadgen import seed_baselines as seed
from loadgen.seed_baselines import BenchmarkError
from loadgen.workload import PRODUCER_CONFIG, Like, WorkloadSettings, encode_like, follow_lists, like_events, now_ms
from pipelines.cv import catalog, view_catalog
from pipelines.cv.definitions import StreamDef, ViewDef, parse
from pipelines.cv.engine import StreamMaintainer
from pipelines.cv.statement_text import split_statements
from pipelines.logs import get_logger
from pipelines.runtime.deadletter import dead_letter_topic
from pipelines.settings import ROLE_READER, ROLE_WRITER, KafkaSettings, PostgresSettings

log = get_logger("loadgen.bench_streamviews")

REPO_ROOT = Path(__file__).resolve().parents[1]
VIEWS_SQL = REPO_ROOT / "sql" / "views" / "social.sql"
FUNCTIONS_SQL = REPO_ROOT / "sql" / "functions" / "social.sql"
SOCIAL_SCHEMA = "social"

OFFSETS_POLL_S = 0.050  # how often the drain is checked in ops.kafka_offsets
MARKER_BASE = 9_000_000_000_000  # marker likes use object ids far above any workload object
MARKER_INTERVAL_S = 0.020  # one marker like every 20 ms during the freshness phase
MARKER_POLL_S = 0.005  # the poller looks for pending markers every 5 ms
FRESHNESS_SHARE = 0.5  # the freshness phase produces at this share of the measured throughput
LOAD_BATCH = 20_000  # stream changes per engine transaction when filling views directly
DRAIN_TIMEOUT_S = 300.0
MARKER_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 60.0
PIPELINE_APPLICATION = "streamviews-bench-pipeline"  # its sessions' application_name


# --- the social definitions, copied into a bench schema ------------------------------------------


def social_definitions() -> tuple[dict[str, StreamDef], list[ViewDef]]:
    """The streams and views of sql/views/social.sql, parsed as the catalog would."""
    streams: dict[str, StreamDef] = {}
    views: list[ViewDef] = []
    for statement in split_statements(VIEWS_SQL.read_text()):
        definition = parse(statement, streams)
        if isinstance(definition, StreamDef):
            streams[definition.name] = definition
        else:
            views.append(definition)
    return streams, views


def copy_definitions(
    source: str, *, schema: str, stream: str, topic: str, group: str, views: Collection[str] | None = None
) -> list[str]:
    """CREATE statements copying social stream `source` and its views (all, or those named) into `schema`.

    The stream's statement is copied as written (columns, constraints, key and every WITH option:
    kafka_key, action_field, timestamp_column, ...) with only its name changed to `stream`, its
    `topic` option to `topic`, and `consumer_group = group` added: only a runner started with
    `--group <group>` consumes it, never the supervised one. Each view keeps its name, query and
    options, only its schema and stream change. Each copy is parsed back and compared with its
    original, so a copy that would decode or maintain something else raises instead.

    Raises:
        BenchmarkError: no such stream or view, or a copy differs from its original.
    """
    streams, originals = social_definitions()
    if source not in streams:
        raise BenchmarkError(f"{VIEWS_SQL.name}: no stream {source!r}")
    original = streams[source]
    text, named = re.subn(rf"^(CREATE\s+STREAM\s+){source}\b", rf"\g<1>{stream}", original.definition, flags=re.I)
    text, topics = re.subn(r"\btopic\s*=\s*'[^']*'", f"topic = '{topic}', consumer_group = '{group}'", text)
    statements = [text]
    copied_stream = parse(text, {})
    assert isinstance(copied_stream, StreamDef)
    renamed = replace(original, name=stream, topic=topic, consumer_group=group, definition=text)
    if (named, topics) != (1, 1) or copied_stream != renamed:
        raise BenchmarkError(f"bench stream {stream} differs from {source}")
    wanted = [v for v in originals if v.stream == source and (views is None or v.name in views)]
    missing = set(views or ()) - {v.name for v in wanted}
    if missing:
        raise BenchmarkError(f"{VIEWS_SQL.name}: no views {sorted(missing)} on stream {source}")
    for view in wanted:
        text = re.sub(rf"\b{view.schema}\.{view.name}\b", f"{schema}.{view.name}", view.definition, count=1)
        text = re.sub(rf"\bFROM\s+{source}\b", f"FROM {stream}", text, count=1, flags=re.IGNORECASE)
        copy = parse(text, {stream: copied_stream})
        assert isinstance(copy, ViewDef)
        same = (copy.groups, copy.aggregates, copy.where_sql, copy.ttl) == (
            view.groups,
            view.aggregates,
            view.where_sql,
            view.ttl,
        )
        if not same or (copy.schema, copy.name, copy.stream) != (schema, view.name, stream):
            raise BenchmarkError(f"the copy of {view.qualified_name} in {schema} is not the same view")
        statements.append(text)
    return statements


def copy_functions(schema: str) -> str:
    """sql/functions/social.sql with every `social.` qualifier replaced by `schema.`: same bodies, same plans."""
    text = re.sub(rf"\b{SOCIAL_SCHEMA}\.", f"{schema}.", FUNCTIONS_SQL.read_text())
    if re.search(rf"\b{SOCIAL_SCHEMA}\.", text):
        raise BenchmarkError(f"{FUNCTIONS_SQL.name}: a reference to {SOCIAL_SCHEMA} survived the copy")
    return text


@dataclass(frozen=True)
class StreamCopy:
    """One social stream copied into a bench schema: which, under what name, on what topic, which views.

    `group` is the copy's `consumer_group`: the bench's own runners' group, or one that no runner runs
    when the views are filled through the engine directly.
    """

    source: str
    stream: str
    topic: str
    group: str
    views: tuple[str, ...] | None = None  # None: every view of the source stream


@contextmanager
def bench_views(schema: str, copies: Sequence[StreamCopy], settings: PostgresSettings) -> Iterator[list[str]]:
    """Create `schema` with copies of social streams and views; yield the views' names; drop it all after.

    See `throwaway_definitions`; the statements are `copy_definitions`' for each copy.
    """
    statements = [
        statement
        for c in copies
        for statement in copy_definitions(
            c.source, schema=schema, stream=c.stream, topic=c.topic, group=c.group, views=c.views
        )
    ]
    with throwaway_definitions(schema, statements, [c.stream for c in copies], settings) as views:
        yield views


@contextmanager
def throwaway_definitions(
    schema: str, statements: Iterable[str], streams: Sequence[str], settings: PostgresSettings
) -> Iterator[list[str]]:
    """Create `schema`, define `statements` (streams and views) in it; yield the views' names; drop it all after.

    The schema is owned by `sv_owner` and usable by `sv_writer` and `sv_reader`. Definitions go
    through `catalog.define_file` on an autocommit owner connection, as `python -m pipelines.cv
    define` does. Cleanup drops every view of the schema or of `streams` and each of `streams`
    through the catalog (so `cv.views`/`cv.streams` keep no trace), then the schema with CASCADE; a
    failed step is logged and the rest still runs.
    """
    conninfo = seed.owner_conninfo(settings)
    ident = sql.Identifier(schema)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(ident))
    try:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(
                sql.SQL("GRANT USAGE ON SCHEMA {} TO {}, {}").format(
                    ident, sql.Identifier(ROLE_WRITER), sql.Identifier(ROLE_READER)
                )
            )
            for outcome in catalog.define_file(conn, ";\n".join(statements)):
                log.info("bench definition", outcome=outcome)
            views = [
                name
                for (name,) in conn.execute(
                    "SELECT name FROM cv.views WHERE stream = ANY(%s) ORDER BY name", (list(streams),)
                )
            ]
        yield views
    finally:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            for (name,) in conn.execute(
                "SELECT name FROM cv.views WHERE name LIKE %s OR stream = ANY(%s) ORDER BY name",
                (f"{schema}.%", list(streams)),
            ).fetchall():
                try:
                    view_catalog.drop_view(conn, name)
                except Exception:
                    log.exception("could not drop bench view", view=name)
            for stream in streams:
                if conn.execute("SELECT 1 FROM cv.streams WHERE name = %s", (stream,)).fetchone():
                    try:
                        catalog.drop_stream(conn, stream)
                    except Exception:
                        log.exception("could not drop bench stream", stream=stream)
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(ident))


# --- the pipeline, end to end ---------------------------------------------------------------------


def stack_env_file() -> Path | None:
    """The local stack's client settings (`.state/stack.env`), when the stack package is there."""
    try:
        from stack.settings import StackSettings
    except ImportError:
        return None
    path = StackSettings().paths.env_file
    return path if path.is_file() else None


def pipeline_env(
    postgres: PostgresSettings,
    kafka: KafkaSettings,
    *,
    role: str = ROLE_WRITER,
    application_name: str = PIPELINE_APPLICATION,
) -> dict[str, str]:
    """Environment of a pipeline process: ours and stack.env's, as `role`, JSON logs, default batches.

    `PIPELINE_*` variables are left out so the pipeline runs with its default batch settings, and the
    Kafka and PostgreSQL endpoints are the ones this benchmark uses. `application_name` names its
    PostgreSQL sessions (see `backend_pids`).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_") and k not in {"PGPASSWORD", "PGUSER"}}
    env_file = stack_env_file()
    if env_file is not None:
        for line in env_file.read_text().splitlines():
            name, sep, value = line.partition("=")
            if sep and not line.lstrip().startswith("#"):
                env[name.strip()] = value.strip()
    env.update(
        {
            "PGHOST": postgres.host,
            "PGPORT": str(postgres.port),
            "PGDATABASE": postgres.database,
            "PGUSER": role,
            "PGAPPNAME": application_name,
            "KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
            "LOG_FORMAT": "json",
        }
    )
    if postgres.secrets_dir is not None:
        env["SECRETS_DIR"] = str(postgres.secrets_dir)
    password = postgres.role_password(role)
    if password is not None:
        env["PGPASSWORD"] = password.get_secret_value()
    return env


def high_watermarks(topic: str, kafka: KafkaSettings) -> dict[int, int]:
    """The end offset of each partition of `topic` that holds records."""
    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "group.id": seed.unique_name("bench-watermarks", "-"),
            "enable.auto.commit": False,
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
    finally:
        consumer.close()
    return {p: end for p, end in ends.items() if end > 0}


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process on this machine (from /proc), None if unreadable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime


def machine_cpu_seconds() -> float | None:
    """Busy CPU seconds of the whole machine, all cores (from /proc/stat; idle and iowait excluded)."""
    try:
        ticks = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    except (OSError, ValueError, IndexError):
        return None
    return (sum(ticks) - ticks[3] - ticks[4]) / _CLOCK_TICKS


def processes_cpu_seconds(pids: int | Sequence[int] | None) -> float | None:
    """CPU seconds of one process or the sum over several (None when there are none or one is unreadable)."""
    if not pids:
        return None
    seconds = [process_cpu_seconds(pid) for pid in ([pids] if isinstance(pids, int) else pids)]
    return None if None in seconds else sum(s for s in seconds if s is not None)


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds used so far by the pipeline, its PostgreSQL backends, this process and the machine."""

    at: float
    values: dict[str, float | None]

    @staticmethod
    def take(pids: dict[str, int | Sequence[int] | None]) -> CpuSample:
        """Sample the processes in `pids` (by role; a role's pids are summed), this process and the machine, now."""
        values = {role: processes_cpu_seconds(pid) for role, pid in pids.items()}
        values["bench"] = time.process_time()
        values["machine"] = machine_cpu_seconds()
        return CpuSample(time.monotonic(), values)

    def cores_since(self, earlier: CpuSample) -> dict[str, float]:
        """Average cores busy per role between `earlier` and this sample."""
        wall = self.at - earlier.at
        return {
            role: round((value - earlier.values[role]) / wall, 2)  # type: ignore[operator]
            for role, value in self.values.items()
            if wall > 0 and value is not None and earlier.values.get(role) is not None
        }


def backend_pid(conn: psycopg.Connection, application_name: str) -> int | None:
    """The PostgreSQL backend of the session with this application name, if there is exactly one."""
    pids = backend_pids(conn, application_name)
    return pids[0] if len(pids) == 1 else None


def backend_pids(conn: psycopg.Connection, application_name: str) -> tuple[int, ...]:
    """The PostgreSQL backends of the sessions with this application name (a runner has two: batches, catalog)."""
    rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s", (application_name,))
    return tuple(pid for (pid,) in rows)


@dataclass(frozen=True)
class Drain:
    """How the pipeline worked off the backlog, on the monotonic clock of this process."""

    started: float  # just before the process was spawned
    first_commit: float  # first poll that found a committed offset row of the group
    first_committed: int  # records already committed at that poll (the first batches)
    done: float  # first poll that found every partition at its end
    commits: int  # commits seen by the polls (each moves the offsets; batches take far more than 50 ms)
    cpu_start: CpuSample  # at the first commit
    cpu_done: CpuSample  # at the end of the backlog

    @property
    def startup_seconds(self) -> float:
        """Process start to the first committed batch (interpreter, imports, group join, first batch)."""
        return self.first_commit - self.started

    @property
    def drain_seconds(self) -> float:
        """First committed batch to the last."""
        return self.done - self.first_commit

    @property
    def total_seconds(self) -> float:
        """Process start to the last committed batch."""
        return self.done - self.started

    def rate(self, events: int) -> float:
        """Records/s of a backlog of `events`: those after the first committed batch, over the time to the last."""
        return (events - self.first_committed) / self.drain_seconds

    def rate_with_startup(self, events: int) -> float:
        """Records/s of a backlog of `events` from process start to the last committed batch."""
        return events / self.total_seconds


class ServiceProcess:
    """One `python -m <module> [args]` service process (a pipeline, the puller), its log in a file."""

    def __init__(self, name: str, module: str, args: Sequence[str], *, env: dict[str, str], log_path: Path) -> None:
        self.name, self.log_path = name, log_path
        self.backend: tuple[int, ...] = ()  # its PostgreSQL backends, once known
        self._log = log_path.open("w")
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-m", module, *args], env=env, stdout=self._log, stderr=subprocess.STDOUT
        )

    def check_alive(self) -> None:
        """Raise when the process has exited."""
        code = self.process.poll()
        if code is not None:
            raise BenchmarkError(f"{self.name} exited {code}: {self.tail()}")

    def stop(self) -> int:
        """SIGTERM (finish the batch or chunk in flight), then wait; SIGKILL if it will not stop."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                log.warning("service ignored SIGTERM; killing it", service=self.name, pid=self.process.pid)
                self.process.kill()
                self.process.wait(STOP_TIMEOUT_S)
        self._log.close()
        return self.process.returncode

    def records(self) -> list[dict[str, Any]]:
        """The JSON log lines written so far."""
        lines = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                lines.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                lines.append({"event": line, "level": "raw"})
        return lines

    def tail(self, lines: int = 3) -> str:
        """The last lines of its log, for error messages."""
        return " | ".join(self.log_path.read_text(errors="replace").strip().splitlines()[-lines:])[-400:]


_PARTITION = re.compile(r"^(?P<topic>.+)\[(?P<partition>\d+)\]$")  # "likes[3]", as the pipelines log them


class PipelineProcess(ServiceProcess):
    """One stream runner (`python -m pipelines.cv.runner --streams <stream> --group <group>`) on a bench stream.

    The runner consumes the topic the bench stream declares (`topic`) and nothing else.
    """

    def __init__(self, *, topic: str, stream: str, group: str, env: dict[str, str], log_path: Path) -> None:
        self.topic, self.stream, self.group = topic, stream, group
        args = ["--streams", stream, "--group", group]
        super().__init__("pipeline", "pipelines.cv.runner", args, env=env, log_path=log_path)

    @property
    def pids(self) -> dict[str, int | Sequence[int] | None]:
        """The pipeline process and its PostgreSQL backends, by role."""
        return {"pipeline": self.process.pid, "postgres": self.backend}

    def assignment(self) -> list[int] | None:
        """The partitions of its topic its last rebalance event gave it, from its log (None before the first)."""
        for record in reversed(self.records()):
            if record.get("event") == "partitions assigned":
                found = (_PARTITION.match(str(tp)) for tp in record.get("offsets", {}))
                return [int(m["partition"]) for m in found if m and m["topic"] == self.topic]
            if record.get("event") == "partitions revoked":
                return []
        return None


class PipelineWorkers:
    """`count` pipeline processes in one consumer group, measured as one pipeline.

    Worker i (from 1) names its PostgreSQL sessions `PIPELINE_APPLICATION` with suffix i (none for
    the first) and logs to its own file; CPU is sampled per worker (`pipeline`, `postgres`,
    `pipeline2`, `postgres2`, ...). `settings` (e.g. `{"PIPELINE_BATCH_MAX": "50000"}`) are added to
    each worker's environment; without them the workers run with their default batch settings.
    """

    def __init__(
        self,
        count: int,
        *,
        topic: str,
        stream: str,
        group: str,
        postgres: PostgresSettings,
        kafka: KafkaSettings,
        settings: dict[str, str] | None = None,
    ) -> None:
        self.topic, self.stream, self.group = topic, stream, group
        self.workers = [
            PipelineProcess(
                topic=topic,
                stream=stream,
                group=group,
                env=pipeline_env(postgres, kafka, application_name=PIPELINE_APPLICATION + self._suffix(i))
                | (settings or {}),
                log_path=Path(tempfile.gettempdir()) / f"streamviews-{stream}-pipeline{self._suffix(i)}.log",
            )
            for i in range(count)
        ]
        self.started = self.workers[0].started
        self.log_paths = [w.log_path for w in self.workers]
        self.also_sampled: dict[str, int | None] = {}  # other processes whose CPU to sample, by role (e.g. kafka)

    @staticmethod
    def _suffix(i: int) -> str:
        return str(i + 1) if i else ""

    def find_backends(self, conn: psycopg.Connection) -> None:
        """Look up each worker's PostgreSQL backends by their application name."""
        for i, worker in enumerate(self.workers):
            worker.backend = backend_pids(conn, PIPELINE_APPLICATION + self._suffix(i))

    @property
    def pids(self) -> dict[str, int | Sequence[int] | None]:
        """Each worker and its PostgreSQL backends, by role, then `also_sampled`."""
        pids = {f"{role}{self._suffix(i)}": pid for i, w in enumerate(self.workers) for role, pid in w.pids.items()}
        return {**pids, **self.also_sampled}

    def settled(self, partitions: Collection[int]) -> bool:
        """True when every worker owns partitions and together they own each of `partitions` once."""
        owned = [w.assignment() for w in self.workers]
        return all(owned) and sorted(p for parts in owned for p in parts or []) == sorted(partitions)

    def check_alive(self) -> None:
        """Raise when a worker has exited."""
        for worker in self.workers:
            worker.check_alive()

    def stop(self) -> int:
        """SIGTERM every worker; the first non-zero exit code, else 0."""
        codes = [worker.stop() for worker in self.workers]
        return next((code for code in codes if code), 0)

    def records(self) -> list[dict[str, Any]]:
        """Every worker's JSON log lines, worker after worker."""
        return [record for worker in self.workers for record in worker.records()]

    def totals(self) -> tuple[dict[str, int], int]:
        """Summed totals of the workers' "pipeline stopped" lines (batches, records, ...), and the warnings logged."""
        records = self.records()
        totals: dict[str, int] = {}
        for stopped in (r for r in records if r.get("event") == "pipeline stopped"):  # one per worker
            for k in ("batches", "records", "changes", "retries"):
                if k in stopped:
                    totals[k] = totals.get(k, 0) + stopped[k]
        return totals, sum(1 for r in records if r.get("level") in {"warning", "error", "critical"})

    def tail(self) -> str:
        """The last lines of each worker's log."""
        return " || ".join(worker.tail() for worker in self.workers)


def committed_offsets(conn: psycopg.Connection, group: str, topic: str) -> dict[int, int]:
    """Next offsets stored in PostgreSQL for the group: the pipeline's truth (see pipelines.runtime.checkpoint)."""
    return dict(
        conn.execute(
            "SELECT partition, next_offset FROM ops.kafka_offsets WHERE group_id = %s AND topic = %s", (group, topic)
        ).fetchall()
    )


def wait_drained(conn: psycopg.Connection, pipeline: PipelineWorkers, ends: dict[int, int]) -> Drain:
    """Poll `ops.kafka_offsets` every 50 ms until the group's offsets equal `ends`.

    The clock starts at the first poll that finds a committed batch once every worker holds its
    share of the partitions, so that start-up and the rebalances of workers joining one after the
    other are not timed. (Not "once every partition has a batch": one consumer reads a backlog a
    partition at a time, so that would leave only the last few batches on the clock.)
    """
    first_commit: float | None = None
    first_committed = 0
    cpu_start: CpuSample | None = None
    seen: set[int] = set()
    deadline = pipeline.started + DRAIN_TIMEOUT_S
    tick = time.monotonic()
    while True:
        offsets = committed_offsets(conn, pipeline.group, pipeline.topic)
        now = time.monotonic()
        if offsets:
            seen.add(sum(offsets.values()))
        if first_commit is None and offsets and pipeline.settled(ends):
            first_commit, first_committed = now, sum(offsets.values())
            pipeline.find_backends(conn)
            cpu_start = CpuSample.take(pipeline.pids)
        if offsets == ends:
            assert first_commit is not None
            assert cpu_start is not None
            cpu_done = CpuSample.take(pipeline.pids)
            return Drain(pipeline.started, first_commit, first_committed, now, len(seen), cpu_start, cpu_done)
        pipeline.check_alive()
        if now > deadline:
            raise BenchmarkError(
                f"pipeline: {sum(offsets.values())} of {sum(ends.values())} records committed after {DRAIN_TIMEOUT_S}s"
            )
        tick += OFFSETS_POLL_S
        time.sleep(max(0.0, tick - time.monotonic()))


class Probe(threading.Thread):
    """Polls for pending markers every `poll_s` on a session of its own, and times when each is seen.

    A marker counts as seen at the moment the poll that returned it was sent: the previous poll did
    not find it, so it became visible in between. Latency = seen - the time it was registered (just
    before it was handed to the producer). Subclasses say how to open the session and look markers up.
    """

    def __init__(self, name: str, poll_s: float) -> None:
        super().__init__(name=name, daemon=True)
        self._poll_s = poll_s
        self._lock = threading.Lock()
        self._pending: dict[Any, float] = {}
        self._halt = threading.Event()
        self.latencies: list[float] = []  # seconds
        self.polls = 0
        self.error: BaseException | None = None

    def session(self) -> AbstractContextManager[Any]:
        """The session `find` polls with, opened in the probe's thread."""
        raise NotImplementedError

    def find(self, session: Any, markers: list[Any]) -> Iterable[Any]:
        """Which of `markers` are visible now."""
        raise NotImplementedError

    def sent(self, marker: Any, at: float) -> None:
        """Register a marker just before it is produced."""
        with self._lock:
            self._pending[marker] = at

    @property
    def pending(self) -> int:
        """Markers sent and not seen yet."""
        with self._lock:
            return len(self._pending)

    def stop(self) -> None:
        """End the loop after the current poll."""
        self._halt.set()

    def run(self) -> None:
        """Poll until stopped; any error is kept for the caller."""
        try:
            with self.session() as session:
                tick = time.monotonic()
                while not self._halt.is_set():
                    with self._lock:
                        markers = list(self._pending)
                    if markers:
                        asked = time.monotonic()
                        found = list(self.find(session, markers))
                        self.polls += 1
                        with self._lock:
                            for marker in found:
                                sent = self._pending.pop(marker, None)
                                if sent is not None:
                                    self.latencies.append(asked - sent)
                    tick += self._poll_s
                    delay = tick - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    else:
                        tick = time.monotonic()
        except BaseException as e:  # reported by the caller, which owns the run
            self.error = e


class MarkerProbe(Probe):
    """Polls `<schema>.object_likes` for pending marker objects every 5 ms, on its own connection.

    The poll's snapshot is taken after it was sent, so a marker it finds committed before that.
    """

    def __init__(self, conninfo: str, schema: str) -> None:
        super().__init__("marker-probe", MARKER_POLL_S)
        self._conninfo = conninfo
        self._query = sql.SQL("SELECT oid FROM {}.object_likes WHERE oid = ANY(%s)").format(sql.Identifier(schema))

    def session(self) -> psycopg.Connection:
        """An autocommit connection (each poll sees the latest commits)."""
        return psycopg.connect(self._conninfo, autocommit=True)

    def find(self, session: psycopg.Connection, markers: list[int]) -> Iterable[int]:
        """The marker objects present in object_likes."""
        return [oid for (oid,) in session.execute(self._query, (markers,)).fetchall()]


@dataclass
class SteadyLoad:
    """What the freshness phase produced."""

    rate: float  # target events/s (markers excluded)
    seconds: float
    produced: int = 0
    markers: int = 0
    errors: int = 0
    first_error: str | None = None


def produce_steadily(
    topic: str,
    events: Iterator[Like],
    load: SteadyLoad,
    probe: MarkerProbe,
    *,
    users: int,
    kafka: KafkaSettings,
) -> None:
    """Produce `events` at `load.rate` for `load.seconds`, plus a marker like every 20 ms.

    Pacing is against the start (events due = rate x elapsed), checked at least every millisecond, so
    the rate holds on average without a sleep per event. Markers are likes of fresh objects
    `MARKER_BASE + i`, encoded like any other event.
    """

    def on_delivery(error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            load.errors += 1
            load.first_error = load.first_error or str(error)

    producer = Producer(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "client.id": f"{kafka.client_id}-bench-freshness",
            "on_delivery": on_delivery,
            **PRODUCER_CONFIG,
        }
    )
    producer.list_topics(topic, timeout=10)

    def produce(key: bytes, value: bytes) -> None:
        while True:
            try:
                producer.produce(topic, value, key)
                return
            except BufferError:
                producer.poll(0.01)

    started = time.monotonic()
    end = started + load.seconds
    next_marker = started
    try:
        while (now := time.monotonic()) < end:
            due = int((now - started) * load.rate)
            while load.produced < due:
                produce(*encode_like(next(events)))
                load.produced += 1
            if now >= next_marker:
                oid = MARKER_BASE + load.markers
                key, value = encode_like(Like(oid, 1 + load.markers % users, "like", now_ms()))
                probe.sent(oid, time.monotonic())
                produce(key, value)
                load.markers += 1
                next_marker += MARKER_INTERVAL_S
            producer.poll(0)
            time.sleep(max(0.0, min(0.001, next_marker - time.monotonic())))
    finally:
        unsent = producer.flush(60)
        if unsent:
            load.errors += unsent
            load.first_error = load.first_error or f"{unsent} messages unsent after flush"


def percentile(values: Sequence[float], q: int) -> float:
    """The q-th percentile (1..99), inclusive method; the value itself for a single sample."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


@dataclass(frozen=True)
class PipelineRun:
    """The pipeline end to end: drain of the backlog, then freshness under a steady load."""

    events: int
    drain: Drain
    load: SteadyLoad
    latencies_ms: list[float]
    log_paths: list[Path]  # one per worker
    totals: dict[str, Any] = field(default_factory=dict)
    warnings: int = 0
    cpu_steady: CpuSample | None = None  # at the end of the steady production

    @property
    def cpu(self) -> dict[str, dict[str, float]]:
        """Average cores busy per role during the drain and during the steady production."""
        phases = {"drain": self.drain.cpu_done.cores_since(self.drain.cpu_start)}
        if self.cpu_steady is not None:
            phases["steady"] = self.cpu_steady.cores_since(self.drain.cpu_done)
        return phases

    @property
    def steady_batches(self) -> int | None:
        """Batches committed after the backlog (the steady phase and its tail), from the pipeline's totals."""
        batches = self.totals.get("batches")
        return batches - self.drain.commits if batches is not None else None

    @property
    def steady_records(self) -> int | None:
        """Records consumed after the backlog."""
        records = self.totals.get("records")
        return records - self.events if records is not None else None

    @property
    def likes_per_second(self) -> float:
        """Headline: the backlog after the first committed batch over the time from it to the last."""
        return self.drain.rate(self.events)

    @property
    def likes_per_second_with_startup(self) -> float:
        """All events over the time from process start to the last committed batch."""
        return self.drain.rate_with_startup(self.events)

    @property
    def freshness_p50_ms(self) -> float:
        """Median marker latency."""
        return statistics.median(self.latencies_ms)

    @property
    def freshness_p99_ms(self) -> float:
        """99th percentile marker latency."""
        return percentile(self.latencies_ms, 99)


def run_pipeline(
    topic: str,
    events: Sequence[Like],
    *,
    workload: WorkloadSettings,
    kafka: KafkaSettings,
    postgres: PostgresSettings,
    seconds: int,
    workers: int = 1,
) -> PipelineRun:
    """Run the likes pipeline on `topic` (holding `events`) into bench views; time the drain, then freshness.

    1. Views: schema and stream `bench_<id>` with copies of the likes views of social.sql.
    2. Throughput: spawn `workers` pipeline processes (group `bench-pipeline-<id>`, default batch
       settings) and poll `ops.kafka_offsets` every 50 ms until the group's offsets reach the
       topic's end (see `wait_drained`).
    3. Freshness: keep it running, produce the workload's next events at `FRESHNESS_SHARE` of the
       headline throughput for `seconds`, plus a marker like every 20 ms; a poller thread times
       each marker until it is visible in `object_likes`.
    4. SIGTERM the pipeline; drop the views, stream and schema, the group's offset rows and the
       dead-letter topic the pipeline created.
    """
    name = seed.unique_name("bench")
    group = seed.unique_name("bench-pipeline", "-")
    # The events that follow `events` in the same workload (same seed and parameters), drawn lazily
    # during the freshness phase; drawn past the backlog now, before any clock starts.
    continuation = like_events(
        workload.seed,
        users=workload.users,
        objects=workload.objects,
        gaussian=workload.gaussian,
        unlike_fraction=workload.unlike_fraction,
        duplicate_fraction=workload.duplicate_fraction,
        memory=workload.memory,
    )
    for _ in islice(continuation, len(events)):
        pass
    owner = seed.owner_conninfo(postgres)
    try:
        with bench_views(name, [StreamCopy("likes", name, topic, group)], postgres) as views:
            ends = high_watermarks(topic, kafka)
            if sum(ends.values()) != len(events):
                raise BenchmarkError(f"{topic} holds {sum(ends.values())} records, expected {len(events)}")
            pipeline = PipelineWorkers(workers, topic=topic, stream=name, group=group, postgres=postgres, kafka=kafka)
            log.info(
                "pipeline bench views", views=views, topic=topic, group=group, logs=list(map(str, pipeline.log_paths))
            )
            try:  # the pipeline stops before its views are dropped, whatever happens
                return _measure(pipeline, topic, events, continuation, workload, kafka, postgres, ends, seconds)
            finally:
                pipeline.stop()
    finally:
        forget_group(owner, group, topic, kafka)


def _measure(
    pipeline: PipelineWorkers,
    topic: str,
    events: Sequence[Like],
    continuation: Iterator[Like],
    workload: WorkloadSettings,
    kafka: KafkaSettings,
    postgres: PostgresSettings,
    ends: dict[int, int],
    seconds: int,
) -> PipelineRun:
    """Steps 2 and 3 of `run_pipeline`, with the pipeline running; stops it at the end."""
    with psycopg.connect(seed.owner_conninfo(postgres), autocommit=True) as conn:
        drain = wait_drained(conn, pipeline, ends)
    if drain.first_committed >= len(events):
        raise BenchmarkError(
            f"the pipeline's first batches held the whole backlog ({len(events)} likes): too few to time"
            " without start-up; produce more (--events)"
        )
    log.info(
        "backlog drained",
        startup_s=round(drain.startup_seconds, 2),
        drain_s=round(drain.drain_seconds, 2),
        first_committed=drain.first_committed,
        commits=drain.commits,
    )
    load = SteadyLoad(
        rate=FRESHNESS_SHARE * (len(events) - drain.first_committed) / drain.drain_seconds, seconds=seconds
    )
    probe = MarkerProbe(
        postgres.conninfo(user=ROLE_READER, application_name="streamviews-bench-probe"), pipeline.stream
    )
    probe.start()
    try:
        produce_steadily(topic, continuation, load, probe, users=workload.users, kafka=kafka)
        cpu_steady = CpuSample.take(pipeline.pids)
        deadline = time.monotonic() + MARKER_TIMEOUT_S
        while probe.pending and time.monotonic() < deadline and probe.is_alive():
            pipeline.check_alive()
            time.sleep(0.05)
    finally:
        probe.stop()
        probe.join(10)
    if probe.error is not None:
        raise BenchmarkError(f"marker probe: {probe.error}") from probe.error
    if load.errors:
        raise BenchmarkError(f"freshness producer: {load.errors} delivery errors, first: {load.first_error}")
    if probe.pending:
        raise BenchmarkError(f"{probe.pending} of {load.markers} markers not visible after {MARKER_TIMEOUT_S}s")
    code = pipeline.stop()
    if code != 0:
        raise BenchmarkError(f"pipeline exited {code} on SIGTERM: {pipeline.tail()}")
    totals, warnings = pipeline.totals()
    latencies_ms = [s * 1000 for s in probe.latencies]
    return PipelineRun(len(events), drain, load, latencies_ms, pipeline.log_paths, totals, warnings, cpu_steady)


def forget_group(owner: str, group: str, topic: str, kafka: KafkaSettings) -> None:
    """Delete what a bench pipeline leaves outside its schema: offset rows, dead-letter topic. Never raises."""
    try:
        with psycopg.connect(owner, autocommit=True) as conn:
            conn.execute("DELETE FROM ops.kafka_offsets WHERE group_id = %s", (group,))
            conn.execute("DELETE FROM ops.dead_letters WHERE group_id = %s", (group,))
    except psycopg.Error:
        log.exception("could not delete the bench group's offset rows", group=group)
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    dlq = dead_letter_topic(topic)
    if dlq in admin.list_topics(timeout=10).topics:
        delete_topic(admin, dlq)


def delete_topic(admin: AdminClient, topic: str) -> None:
    """Delete a bench topic and wait for it; a failure is logged, never raised (it must not mask the run's own)."""
    try:
        admin.delete_topics([topic])[topic].result(30)
    except Exception:
        log.exception("could not delete a bench topic", topic=topic)


# --- the social queries ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Load:
    """Stream changes applied through the engine."""

    changes: int
    deltas: int
    batches: int
    seconds: float


def apply_in_batches(
    conn: psycopg.Connection, stream: str, changes: Iterable[tuple[int, tuple[object, ...]]], batch: int = LOAD_BATCH
) -> Load:
    """Apply `(op, values)` changes to `stream` through `StreamMaintainer.apply`, one transaction per batch."""
    maintainer = StreamMaintainer(stream)
    started = time.perf_counter()
    total = deltas = batches = 0
    iterator = iter(changes)
    while chunk := list(islice(iterator, batch)):
        ops = [op for op, _ in chunk]
        columns = [list(column) for column in zip(*(values for _, values in chunk), strict=True)]
        with conn.transaction():
            deltas += maintainer.apply(conn, ops, columns)
        total += len(chunk)
        batches += 1
    return Load(total, deltas, batches, time.perf_counter() - started)


def like_changes(events: Iterable[Like]) -> Iterator[tuple[int, tuple[object, ...]]]:
    """Like events as changes of the likes stream `(oid, uid, ts)`, as the pipeline decodes them."""
    for e in events:
        yield (1 if e.action == "like" else -1), (e.oid, e.uid, datetime.fromtimestamp(e.ts / 1000, UTC))


def follow_changes(lists: Iterable[tuple[int, Sequence[int]]], edges: list[int]) -> Iterator[tuple[int, tuple]]:
    """Follow lists as inserts into the follows stream `(uid, target, ts)`; counts the edges in `edges[0]`."""
    ts = datetime.now(UTC)
    for uid, targets in lists:
        edges[0] += len(targets)
        for target in targets:
            yield 1, (uid, target, ts)


@dataclass(frozen=True)
class SocialRun:
    """pgbench of the copied social functions, and what their tables held."""

    like_count_tps: float
    likers_tps: float
    friends_who_like_tps: float
    liked_objects: int
    followers: int
    follow_edges: int
    matches_seed: bool
    likes_load: Load
    follows_load: Load


def run_social_queries(
    seconds: int,
    *,
    events: Sequence[Like],
    clients: int,
    workload: WorkloadSettings,
    followers: int,
    postgres: PostgresSettings,
) -> SocialRun:
    """Fill bench copies of the social views with the seed baseline's data, then pgbench the query functions.

    Likes are `events` (what the seed intersection baseline replayed into `obj`), follows are
    `follow_lists(workload.seed, users=workload.users, followers=followers)` (its `user_like_agg`),
    both applied through the engine as `sv_writer`. The view tables are then vacuumed and analyzed,
    as the seed's tables were. Each function is run with the seed intersection script's draws:
    objects `random_gaussian(1, objects, gaussian)`, users uniform in 1..followers.
    """
    name = seed.unique_name("bench")
    prefix = name.replace("_", "-")
    unused = f"{prefix}-unused"  # their consumer group: no runner consumes these streams, the engine fills them
    copies = [
        StreamCopy("likes", name, f"{prefix}-likes-unused", unused),
        StreamCopy("follows", f"{name}_follows", f"{prefix}-follows-unused", unused, ("user_following",)),
    ]
    with bench_views(name, copies, postgres) as views:
        log.info("social bench views", views=views)
        owner = seed.owner_conninfo(postgres)
        with psycopg.connect(owner, autocommit=True) as conn:
            conn.execute(copy_functions(name))
        edges = [0]
        with psycopg.connect(postgres.conninfo(user=ROLE_WRITER, application_name="streamviews-bench-load")) as conn:
            likes_load = apply_in_batches(conn, name, like_changes(events))
            log.info("likes applied", **likes_load.__dict__)
            follows_load = apply_in_batches(
                conn,
                f"{name}_follows",
                follow_changes(follow_lists(workload.seed, users=workload.users, followers=followers), edges),
            )
            log.info("follows applied", **follows_load.__dict__)
        s = sql.Identifier(name)
        expected = seed.likers_by_object(events)
        with psycopg.connect(owner, autocommit=True) as conn:
            conn.execute(sql.SQL("VACUUM (ANALYZE) {}.object_likes, {}.user_following").format(s, s))
            liked, like_sum = conn.execute(
                sql.SQL("SELECT count(*), coalesce(sum(like_count), 0) FROM {}.object_likes").format(s)
            ).fetchone()
            lists, follow_sum = conn.execute(
                sql.SQL("SELECT count(*), coalesce(sum(cardinality(following)), 0) FROM {}.user_following").format(s)
            ).fetchone()
        matches = (liked, like_sum, lists, follow_sum) == (
            len(expected),
            sum(len(u) for u in expected.values()),
            followers,
            edges[0],
        )
        if not matches:
            log.warning(
                "bench views differ from the seed baseline's tables",
                liked_objects=(liked, len(expected)),
                follow_lists=(lists, followers),
                follows=(follow_sum, edges[0]),
            )
        object_draw = f"\\set id random_gaussian(1, :objects, {workload.gaussian})\n"
        user_draw = "\\set uid random(1, :followers)\n"
        env = seed.pgbench_env(ROLE_READER, postgres)
        variables = {"objects": workload.objects, "followers": followers}
        tps = {}
        for function, draws, call in (
            ("like_count", object_draw, "SELECT {s}.like_count(:id);"),
            ("likers", object_draw, "SELECT {s}.likers(:id);"),
            ("friends_who_like", object_draw + user_draw, "SELECT {s}.friends_who_like(:uid, :id);"),
        ):
            script = draws + sql.SQL(call).format(s=s).as_string() + "\n"
            tps[function] = seed.pgbench_tps(script, seconds, clients, env=env, variables=variables)
            log.info("social query measured", function=function, tps=tps[function])
    return SocialRun(
        tps["like_count"],
        tps["likers"],
        tps["friends_who_like"],
        liked,
        lists,
        follow_sum,
        matches,
        likes_load,
        follows_load,
    )
