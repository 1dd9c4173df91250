"""The seed's own approaches, measured on our PostgreSQL and Kafka: the baselines streamviews must beat.

Each measurement creates its objects in a throwaway schema named by the caller (as `sv_owner`, who
owns the database) and drops it afterwards, so it never touches the real tables:

- `seed_per_event_eps`: the seed's per-event PL/pgSQL function `f_obj` (membership check, then
  append), written for a plain table since there is no PipelineDB, driven by pgbench as in the seed;
- `raw_copy_rows_per_second`: binary COPY of the same like rows into an unindexed table, the ceiling
  of any Postgres sink;
- `bare_consumer_rate`: reading a topic and doing nothing else, the ceiling of any Kafka pipeline;
- `pk_read_tps` and `seed_intersection_tps`: pgbench of a plain primary-key read and of the seed's
  `array_intersect` query ("which of my friends like it") over tables filled with the workload.

`pgbench_tps` runs any pgbench script the same way, so streamviews' own queries are measured on equal
terms; `pgbench_run` also returns each transaction's latency (bench_friends' p50/p99).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import orjson
import psycopg
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from psycopg import sql

from loadgen.workload import GAUSSIAN_PARAMETER, OBJECTS, USERS, Like, new_rng, pgbench_gaussian
from pipelines.errors import StreamviewsError
from pipelines.logs import get_logger
from pipelines.settings import ROLE_OWNER, KafkaSettings, PostgresSettings

log = get_logger("loadgen.seed_baselines")

PGBENCH = os.environ.get("PGBENCH", "/usr/lib/postgresql/15/bin/pgbench")
_TPS = re.compile(r"^tps = ([0-9.]+) \(without initial connection time\)", re.MULTILINE)
_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class BenchmarkError(StreamviewsError):
    """A benchmark step could not run or gave no figure."""


def unique_name(prefix: str, sep: str = "_") -> str:
    """A name no earlier run used, e.g. `bench_3f9a0c1d2e` (schemas) or `bench-likes-...` (topics)."""
    return f"{prefix}{sep}{uuid.uuid4().hex[:10]}"


def owner_conninfo(settings: PostgresSettings | None = None) -> str:
    """Connection string for `sv_owner`, who may create and drop schemas in the database."""
    return (settings or PostgresSettings()).conninfo(user=ROLE_OWNER, application_name="streamviews-bench")


@contextmanager
def bench_schema(schema: str, settings: PostgresSettings | None = None) -> Iterator[str]:
    """Create `schema` as `sv_owner`, yield its name, and drop it with everything in it afterwards."""
    if not _SCHEMA_NAME.match(schema):
        raise BenchmarkError(f"bench schema: {schema!r} is not a plain lower-case identifier")
    conninfo = owner_conninfo(settings)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    try:
        yield schema
    finally:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def _execute(schema: str, statements: Sequence[str], settings: PostgresSettings | None, **literals: object) -> None:
    """Run statements in autocommit (so VACUUM works), `{s}` bound to the schema and `{name}` to literals."""
    values = {name: sql.Literal(value) for name, value in literals.items()}
    with psycopg.connect(owner_conninfo(settings), autocommit=True) as conn:
        for statement in statements:
            conn.execute(sql.SQL(statement).format(s=sql.Identifier(schema), **values))


def _script(schema: str, setup: str, query: str) -> str:
    r"""A pgbench script: `\set` lines, then one SQL statement with `{s}` bound to the schema."""
    return setup + sql.SQL(query).format(s=sql.Identifier(schema)).as_string() + "\n"


def pgbench_env(role: str = ROLE_OWNER, settings: PostgresSettings | None = None) -> dict[str, str]:
    """Environment for pgbench as `role` (libpq variables), the password included (for the child's environment only)."""
    settings = settings or PostgresSettings()
    env = {
        "PGHOST": settings.host,
        "PGPORT": str(settings.port),
        "PGDATABASE": settings.database,
        "PGUSER": role,
        "PGAPPNAME": "streamviews-pgbench",
    }
    password = settings.role_password(role)
    if password is None and role == settings.user and settings.password is not None:
        password = settings.password
    if password is not None:
        env["PGPASSWORD"] = password.get_secret_value()
    return env


def pgbench_tps(
    script_text: str,
    seconds: int,
    clients: int = 8,
    *,
    threads: int = 2,
    env: Mapping[str, str] | None = None,
    variables: Mapping[str, object] | None = None,
) -> float:
    r"""Run one pgbench script for `seconds` and return its transactions per second (see `pgbench_run`)."""
    return pgbench_run(script_text, seconds, clients, threads=threads, env=env, variables=variables)[0]


def pgbench_run(
    script_text: str,
    seconds: int,
    clients: int = 8,
    *,
    threads: int = 2,
    env: Mapping[str, str] | None = None,
    variables: Mapping[str, object] | None = None,
    latencies: bool = False,
) -> tuple[float, list[float]]:
    r"""Run one pgbench script for `seconds`: its transactions per second and, if asked, each one's latency.

    The run is `pgbench -n -M prepared -c clients -j threads -T seconds -f script`, as the seed ran
    its tests (one statement per transaction, so tps = statements/s).

    Args:
        script_text: pgbench script: `\set` lines, then the statement(s) of one transaction.
        seconds: duration (`-T`).
        clients: concurrent sessions (`-c`).
        threads: pgbench worker threads (`-j`).
        env: libpq variables (PGHOST, PGUSER, PGPASSWORD, ...); default `pgbench_env()` (sv_owner).
        variables: script variables (`-D name=value`).
        latencies: also log every transaction (`-l`) and return their latencies in ms.

    Returns:
        The "tps = ... (without initial connection time)" figure, and the latencies (empty unless asked).

    Raises:
        BenchmarkError: pgbench failed, some client aborted, or no tps line was printed.
    """
    env = dict(env) if env is not None else pgbench_env()
    with tempfile.TemporaryDirectory(prefix="streamviews-pgbench-") as work:
        script = Path(work, "script.sql")
        script.write_text(script_text)
        command = [PGBENCH, "-n", "-M", "prepared", "-c", str(clients), "-j", str(threads), "-T", str(seconds)]
        if latencies:
            command += ["-l", "--log-prefix", str(Path(work, "tx"))]
        for name, value in (variables or {}).items():
            command += ["-D", f"{name}={value}"]
        command += ["-f", str(script)]
        try:
            done = subprocess.run(
                command,
                env={**os.environ, **env},
                capture_output=True,
                text=True,
                timeout=seconds + 120,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise BenchmarkError(f"pgbench: could not run {PGBENCH}: {e}") from e
        match = _TPS.search(done.stdout)
        if done.returncode != 0 or match is None:
            tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
            raise BenchmarkError(f"pgbench exited {done.returncode}: {' | '.join(tail)}")
        # Log lines: client_id transaction_no latency_us script_no epoch_s epoch_us
        logged = [int(line.split()[2]) / 1000 for log in Path(work).glob("tx.*") for line in log.open()]
    return float(match.group(1)), logged


# The seed's f_obj, for a plain table: skip if the user already likes the object, else append and count.
# ON CONFLICT makes the "insert the row if missing" branch safe under concurrent clients; its WHERE
# re-checks membership on the locked row, so two sessions racing on one like cannot count it twice.
_F_OBJ = """
CREATE TABLE {s}.obj (id int8 PRIMARY KEY, who_like int8[], like_cnt int8);
CREATE FUNCTION {s}.f_obj(i_id int8, i_who_like int8) RETURNS void
LANGUAGE plpgsql STRICT AS $$
BEGIN
    PERFORM 1 FROM {s}.obj WHERE id = i_id AND who_like @> ARRAY[i_who_like];
    IF NOT FOUND THEN
        INSERT INTO {s}.obj AS o (id, who_like, like_cnt) VALUES (i_id, ARRAY[i_who_like], 1)
        ON CONFLICT (id) DO UPDATE
            SET who_like = o.who_like || EXCLUDED.who_like, like_cnt = o.like_cnt + 1
            WHERE NOT o.who_like @> EXCLUDED.who_like;
    END IF;
END
$$;
"""


def seed_per_event_eps(
    schema: str,
    seconds: int,
    *,
    users: int = USERS,
    objects: int = OBJECTS,
    gaussian: float = GAUSSIAN_PARAMETER,
    clients: int = 8,
    synchronous_commit: bool = True,
    settings: PostgresSettings | None = None,
    prefill: Sequence[sql.Composable] = (),
) -> float:
    """Likes/s of the seed's per-event function: `SELECT f_obj(:id, :uid)` from pgbench, one per transaction.

    The script is the seed's test.sql in today's syntax: a uniform user, a `gaussian 10.0` object.
    On a plain table every call is a durable transaction waiting for its WAL flush; PipelineDB's
    stream inserts were not durable per event, so `synchronous_commit=False` (set for pgbench's
    sessions only) gives the figure closer to what the seed measured.

    `prefill` statements run after `<schema>.obj` is created and before pgbench, as `sv_owner` in
    autocommit: they fill `obj` so that the function is measured at a size, not on an empty table
    (`loadgen.bench_likes_at_size` copies in the likes its views hold).

    Returns:
        Events (function calls, each its own transaction) per second.
    """
    env = pgbench_env(settings=settings)
    if not synchronous_commit:
        env["PGOPTIONS"] = "-c synchronous_commit=off"
    with bench_schema(schema, settings):
        _execute(schema, [_F_OBJ], settings)
        if prefill:
            with psycopg.connect(owner_conninfo(settings), autocommit=True) as conn:
                for statement in prefill:
                    conn.execute(statement)
        script = _script(
            schema,
            f"\\set uid random(1, :users)\n\\set id random_gaussian(1, :objects, {gaussian})\n",
            "SELECT {s}.f_obj(:id, :uid);",
        )
        return pgbench_tps(script, seconds, clients, env=env, variables={"users": users, "objects": objects})


def like_rows(events: Iterable[Like]) -> list[tuple[int, int, datetime]]:
    """The `(oid, uid, ts)` rows of like events, `ts` as the timestamptz a sink would store."""
    return [(e.oid, e.uid, datetime.fromtimestamp(e.ts / 1000, UTC)) for e in events]


def raw_copy_rows_per_second(
    schema: str, rows: Sequence[tuple[int, int, datetime]], *, settings: PostgresSettings | None = None
) -> float:
    """Rows/s of one binary COPY of `rows` into an unindexed table, commit included.

    Rows are prepared before the clock starts (see `like_rows`), so the figure is the client's
    per-row encoding plus the server's insert and WAL, nothing of our generator.
    """
    with bench_schema(schema, settings):
        _execute(schema, ["CREATE TABLE {s}.likes_raw (oid int8, uid int8, ts timestamptz)"], settings)
        statement = sql.SQL("COPY {}.likes_raw (oid, uid, ts) FROM STDIN (FORMAT BINARY)").format(
            sql.Identifier(schema)
        )
        with psycopg.connect(owner_conninfo(settings)) as conn:
            started = time.perf_counter()
            with conn.cursor() as cur, cur.copy(statement) as copy:
                copy.set_types(["int8", "int8", "timestamptz"])
                for row in rows:
                    copy.write_row(row)
            conn.commit()
            elapsed = time.perf_counter() - started
    return len(rows) / elapsed


def bare_consumer_rate(
    topic: str,
    count: int,
    *,
    kafka: KafkaSettings | None = None,
    timeout: float = 120.0,
    decode: bool | Callable[[bytes], object] = False,
) -> float:
    """Messages/s of a consumer reading `count` messages of `topic` from the beginning, doing nothing else.

    Partitions are assigned, not subscribed, so no group rebalance is timed, and the connection and
    metadata are set up before the clock starts at `assign()`. Every message is counted from there:
    starting at the first batch instead would miss what librdkafka prefetches meanwhile (most of a
    small topic). Each message's `.value()` is read; with `decode`, each value also goes through
    `orjson.loads` (what any pipeline does first), or through `decode` itself when it is a function
    (e.g. a msgspec decoder).

    Args:
        topic: topic to read, from offset 0 of every partition.
        count: messages to read.
        kafka: where Kafka is.
        timeout: give up after this many seconds.
        decode: parse each value as JSON (True: `orjson.loads`; or the function to call on each value).

    Raises:
        BenchmarkError: fewer than `count` messages arrived within `timeout`, or a message carried an error.
    """
    kafka = kafka or KafkaSettings()
    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "client.id": f"{kafka.client_id}-bench",
            "group.id": unique_name("bench-consumer", "-"),
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            # As the pipelines: without it librdkafka idles up to 1 s each time its queue fills,
            # which measured a 400,000-message read at a third of the rate of a 200,000 one.
            "fetch.queue.backoff.ms": 10,
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        deadline = time.monotonic() + timeout
        received = 0
        parse = orjson.loads if decode is True else decode or None
        started = time.perf_counter()
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        while received < count and time.monotonic() < deadline:
            batch = consumer.consume(num_messages=10000, timeout=1.0)
            for message in batch:
                if message.error() is not None:
                    raise BenchmarkError(f"bare consumer: {topic}: {message.error()}")
                value = message.value()
                if parse is not None:
                    parse(value)
            received += len(batch)
        elapsed = time.perf_counter() - started
    finally:
        consumer.close()
    if received < count:
        raise BenchmarkError(f"bare consumer: {topic}: {received} of {count} messages in {timeout}s")
    return received / elapsed


_PLAIN = [
    "CREATE TABLE {s}.plain (id int8, v int8)",
    "INSERT INTO {s}.plain SELECT g, g FROM generate_series(1, {rows}::int8) AS g",
    "ALTER TABLE {s}.plain ADD PRIMARY KEY (id)",
    "VACUUM (FREEZE, ANALYZE) {s}.plain",
]


def pk_read_tps(
    schema: str,
    seconds: int,
    *,
    rows: int = OBJECTS,
    clients: int = 8,
    settings: PostgresSettings | None = None,
) -> float:
    """Transactions/s of a primary-key read on a plain table of `rows` rows: the floor of any lookup.

    Ids are uniform, as in the seed's test1/test2 (who likes / how many likes).
    """
    with bench_schema(schema, settings):
        _execute(schema, _PLAIN, settings, rows=rows)
        script = _script(schema, "\\set id random(1, :rows)\n", "SELECT v FROM {s}.plain WHERE id = :id;")
        return pgbench_tps(script, seconds, clients, env=pgbench_env(settings=settings), variables={"rows": rows})


# The seed's function and tables for "which of my friends like it", unchanged.
_INTERSECT_TABLES = """
CREATE FUNCTION {s}.array_intersect(anyarray, anyarray) RETURNS anyarray
LANGUAGE sql AS $$ SELECT ARRAY(SELECT UNNEST($1) INTERSECT SELECT UNNEST($2)) $$;
CREATE TABLE {s}.obj (id int8, who_like int8[], like_cnt int8);
CREATE TABLE {s}.user_like_agg (uid int8, like_who int8[]);
"""


def intersection_script(schema: str, gaussian: float = GAUSSIAN_PARAMETER) -> str:
    """The pgbench script of the seed's test3 query over `schema`; needs `-D objects=... -D followers=...`.

    The object is drawn from the same Gaussian as the likes (readers look at hot objects). The seed
    drew it uniformly, but at our scale a uniform id almost never hits a liked object, and the query
    would then time empty index probes instead of intersections. The user is uniform over the
    followers that have a list, as in the seed, where every user had one.
    """
    return _script(
        schema,
        f"\\set id random_gaussian(1, :objects, {gaussian})\n\\set uid random(1, :followers)\n",
        "SELECT {s}.array_intersect(t1.who_like, t2.like_who)"
        " FROM (SELECT who_like FROM {s}.obj WHERE id = :id) t1,"
        " (SELECT array[like_who] AS like_who FROM {s}.user_like_agg WHERE uid = :uid) t2;",
    )


@dataclass(frozen=True)
class IntersectionFigures:
    """The seed's intersection query: throughput and what the tables held."""

    tps: float
    liked_objects: int  # rows of obj
    followers: int  # rows of user_like_agg
    follow_edges: int  # elements of all like_who arrays
    hit_ratio: float  # share of the script's object draws that find a liked object


def likers_by_object(events: Iterable[Like]) -> dict[int, list[int]]:
    """Who likes each object after replaying like/unlike events in order (the seed's `who_like`)."""
    likers: dict[int, dict[int, None]] = {}  # dict as an ordered set: arrays keep like order
    for event in events:
        if event.action == "like":
            likers.setdefault(event.oid, {})[event.uid] = None
        else:
            likers.get(event.oid, {}).pop(event.uid, None)
    return {oid: list(uids) for oid, uids in likers.items() if uids}


def seed_intersection_tps(
    schema: str,
    seconds: int,
    likes: Iterable[Like],
    follows: Iterable[tuple[int, Sequence[int]]],
    *,
    objects: int = OBJECTS,
    followers: int,
    gaussian: float = GAUSSIAN_PARAMETER,
    clients: int = 8,
    settings: PostgresSettings | None = None,
) -> IntersectionFigures:
    """Transactions/s of the seed's test3 ("which of my friends like it") over workload-filled tables.

    `obj(id, who_like, like_cnt)` holds the likes in force after `likes`; `user_like_agg(uid,
    like_who)` holds `follows` (e.g. `follow_lists(seed, followers=200_000)`). Both are loaded by
    binary COPY, indexed afterwards and vacuumed, so the run reads settled tables.

    Args:
        schema: throwaway schema name.
        seconds: pgbench duration.
        likes: like events, replayed in order.
        follows: `(uid, targets)` for uids 1..followers.
        objects: the object id range of the likes.
        followers: how many follow lists `follows` yields (the query's uid range).
        gaussian: the likes' Gaussian parameter, reused for the queried object.
        clients: pgbench clients.
        settings: where Postgres is.
    """
    likers = likers_by_object(likes)
    with bench_schema(schema, settings):
        _execute(schema, [_INTERSECT_TABLES], settings)
        s = sql.Identifier(schema)
        edges = 0
        with psycopg.connect(owner_conninfo(settings)) as conn:
            with conn.cursor() as cur:
                with cur.copy(sql.SQL("COPY {}.obj FROM STDIN (FORMAT BINARY)").format(s)) as copy:
                    copy.set_types(["int8", "int8[]", "int8"])
                    for oid, uids in likers.items():
                        copy.write_row((oid, uids, len(uids)))
                with cur.copy(sql.SQL("COPY {}.user_like_agg FROM STDIN (FORMAT BINARY)").format(s)) as copy:
                    copy.set_types(["int8", "int8[]"])
                    for uid, targets in follows:
                        copy.write_row((uid, targets))
                        edges += len(targets)
            conn.commit()
        _execute(
            schema,
            [
                "ALTER TABLE {s}.obj ADD PRIMARY KEY (id)",
                "ALTER TABLE {s}.user_like_agg ADD PRIMARY KEY (uid)",
                "VACUUM (FREEZE, ANALYZE) {s}.obj, {s}.user_like_agg",
            ],
            settings,
        )
        log.info("intersection tables loaded", schema=schema, objects=len(likers), followers=followers, edges=edges)
        tps = pgbench_tps(
            intersection_script(schema, gaussian),
            seconds,
            clients,
            env=pgbench_env(settings=settings),
            variables={"objects": objects, "followers": followers},
        )
    rng = new_rng(0)
    draws = 20_000
    hits = sum(pgbench_gaussian(rng, 1, objects, gaussian) in likers for _ in range(draws))
    return IntersectionFigures(tps, len(likers), followers, edges, hits / draws)


def postgres_facts(settings: PostgresSettings | None = None) -> dict[str, str]:
    """Server settings that shape every write figure (durability, memory), for the report header."""
    with psycopg.connect(owner_conninfo(settings)) as conn:
        rows = conn.execute(
            "SELECT name, current_setting(name) FROM pg_settings"
            " WHERE name IN ('server_version', 'synchronous_commit', 'shared_buffers', 'max_wal_size', 'fsync')"
        ).fetchall()
    return dict(rows)


def pgbench_available() -> bool:
    """True when the pgbench binary exists (Debian's postgresql-15 ships it)."""
    return Path(PGBENCH).is_file()
