"""The audit benchmark's references: the seed's per-row function, the ceilings, and the query timings.

Used by `loadgen.audit`, which runs the real audit writer and ctid-block puller beside these.
Every object is throwaway, named by the caller and dropped afterwards:

- `seed_per_row_rate`: the seed's `ins_schemaless` (one dynamic INSERT per row into
  `bptest_<uid>_<yyyymmdd>`, the table created on 42P01, BRIN on ts) called once per row, one
  transaction each, from Python client threads or from pgbench (the seed ran `-c 3` per instance).
- `copy_rate`: one binary COPY (the writer's own format) of the same rows into one table, unindexed
  or with the audit indexes.
- `puller_chunks` / `bare_bulk_index`: the documents the puller makes of an audit log (same ids,
  fields, daily indices and 256-block chunks) sent by a loop that does nothing else.
- `fill_query_table` / `time_queries`: one day table filled by `INSERT ... SELECT generate_series`,
  and timings of `audit.user_events` (two pages), `user_events_estimate` and `user_events_count`.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

import orjson
import psycopg
from elasticsearch import Elasticsearch
from psycopg import sql

from loadgen.common.errors import BenchmarkError
from loadgen.common.postgres import bench_schema, owner_conninfo, pgbench_env, pgbench_tps
from loadgen.workloads.audit import ACTIONS, CONTENT_CHARS, AuditRow, AuditWorkload
from loadgen.workloads.social import new_rng
from pipelines.audit import elastic
from pipelines.audit.puller import document
from pipelines.audit.writer import COPY_COLUMNS
from pipelines.settings import ROLE_OWNER, ROLE_READER, PostgresSettings

VISIBLE_TIMEOUT_S = 120.0


def _create(schema: str, statements: str, settings: PostgresSettings | None) -> None:
    with psycopg.connect(owner_conninfo(settings), autocommit=True) as conn:
        conn.execute(sql.SQL(statements).format(s=sql.Identifier(schema)))


# The seed's schemaless writer, unchanged but for the BRIN variant of its index (the one its audit
# figures used): the functions name tables unqualified, so clients set search_path to the schema.
_SEED_SCHEMALESS = """
CREATE TABLE {s}.bptest (ts timestamptz, content text);
CREATE INDEX idx_bptest_ts ON {s}.bptest USING brin (ts);
CREATE FUNCTION {s}.create_schemaless(target name) RETURNS void LANGUAGE plpgsql STRICT AS $$
BEGIN
    EXECUTE format('create table if not exists %I (like bptest including all) inherits(bptest)', target);
EXCEPTION WHEN others THEN
    RETURN;
END
$$;
CREATE FUNCTION {s}.ins_schemaless(uid int, ts timestamptz, content text) RETURNS void
LANGUAGE plpgsql STRICT AS $$
DECLARE
    target name := 'bptest_' || uid || '_' || to_char(ts, 'yyyymmdd');
BEGIN
    EXECUTE format('insert into %I values (%L, %L)', target, ts, content);
EXCEPTION WHEN SQLSTATE '42P01' THEN
    PERFORM create_schemaless(target);
    EXECUTE format('insert into %I values (%L, %L)', target, ts, content);
END
$$;
"""
_INS = "SELECT ins_schemaless(%s::int, now(), %s)"


def seed_per_row_rate(
    schema: str,
    workload: AuditWorkload,
    rows: Sequence[AuditRow],
    seconds: float,
    *,
    clients: int = 4,
    synchronous_commit: bool = True,
    pgbench: bool = False,
    settings: PostgresSettings | None = None,
) -> float:
    """Rows/s of the seed's `ins_schemaless`, one call (and transaction) per row, for `seconds`.

    Every uid's table of today is created first, untimed, as a long run amortises it. Then either
    `clients` Python threads, each with its own session (prepared statement, autocommit), cycle
    through their share of `rows`; or, with `pgbench`, the seed's own driver (`-M prepared`, a
    uniform uid, the first row's text for every row), whose clients cost far less CPU than ours.
    """
    settings = settings or PostgresSettings()
    options = f"-c search_path={schema}" + ("" if synchronous_commit else " -c synchronous_commit=off")
    conninfo = settings.conninfo(user=ROLE_OWNER, application_name="streamviews-bench-seed", options=options)
    calls, errors = [0] * clients, []
    start, stop = threading.Barrier(clients + 1), threading.Event()

    def client(i: int) -> None:
        try:
            mine = rows[i::clients]
            with psycopg.connect(conninfo, autocommit=True) as conn:
                start.wait()
                n = 0
                while not stop.is_set():
                    row = mine[n % len(mine)]
                    conn.execute(_INS, (row.uid, workload.content(row)), prepare=True)
                    n += 1
                calls[i] = n
        except BaseException as e:  # reported below; the barrier must not hang the others
            errors.append(e)
            start.abort()

    with bench_schema(schema, settings):
        _create(schema, _SEED_SCHEMALESS, settings)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            for uid in range(1, workload.uids + 1):
                conn.execute(_INS, (uid, "warm-up"))
        if pgbench:
            text = workload.content(rows[0])  # the alphabet has no quote to escape
            script = f"\\set uid random(1, {workload.uids})\nSELECT ins_schemaless(:uid, now(), '{text}');\n"
            env = pgbench_env(settings=settings) | {"PGOPTIONS": options}
            return pgbench_tps(script, round(seconds), clients, env=env)
        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
        for thread in threads:
            thread.start()
        with contextlib.suppress(threading.BrokenBarrierError):  # a client failed: reported below
            start.wait(30)
        started = time.perf_counter()
        time.sleep(seconds)
        stop.set()
        for thread in threads:
            thread.join(60)
        elapsed = time.perf_counter() - started
    if errors:
        raise BenchmarkError(f"seed per-row client: {errors[0]}") from errors[0]
    return sum(calls) / elapsed


_AUDIT_TABLE = "CREATE TABLE {s}.copied (shard smallint, ts timestamptz, uid bigint, content text, fields jsonb);"
_AUDIT_INDEXES = "CREATE INDEX ON {s}.copied USING brin (ts); CREATE INDEX ON {s}.copied (uid, ts);"


def copy_rate(
    schema: str, chunks: Sequence[bytes], rows: int, *, indexed: bool, settings: PostgresSettings | None = None
) -> float:
    """Rows/s of one binary COPY of `chunks` (see `AuditWorkload.copy_chunks`) into one table, commit included.

    The table has the audit tables' columns; with `indexed`, also their indexes (BRIN on ts, B-tree
    on (uid, ts)). The text is prepared before the clock starts.
    """
    with bench_schema(schema, settings):
        _create(schema, _AUDIT_TABLE + (_AUDIT_INDEXES if indexed else ""), settings)
        statement = sql.SQL("COPY {}.copied ({}) FROM STDIN (FORMAT binary)").format(
            sql.Identifier(schema), sql.SQL(", ").join(map(sql.Identifier, COPY_COLUMNS))
        )
        with psycopg.connect(owner_conninfo(settings)) as conn:
            started = time.perf_counter()
            with conn.cursor() as cur, cur.copy(statement) as copy:
                for chunk in chunks:
                    copy.write(chunk)
            conn.commit()
            return rows / (time.perf_counter() - started)


# --- the puller's documents, sent by a bare bulk indexer ------------------------------------------

Chunk = tuple[str, list[tuple[str, dict]]]  # index, [(document id, document)]


def puller_chunks(conn: psycopg.Connection, log_schema: str, prefix: str, pull_blocks: int) -> list[Chunk]:
    """The documents the puller makes of `log_schema`'s rows, in its chunks: `pull_blocks` blocks of one table."""
    chunks: list[Chunk] = []
    tables = conn.execute(
        "SELECT table_name, day FROM audit.tables WHERE log_schema = %s ORDER BY day, shard", (log_schema,)
    ).fetchall()
    for table, day in tables:
        schema, name = table.split(".")
        rows = conn.execute(
            sql.SQL(
                "SELECT audit.block_of(ctid), (ctid::text::point)[1]::int, ts, uid, content, fields FROM {}"
                " ORDER BY ctid"
            ).format(sql.Identifier(schema, name))
        ).fetchall()
        by_chunk: dict[int, list[tuple[str, dict]]] = defaultdict(list)
        for block, offset, *row in rows:
            by_chunk[block // pull_blocks].append((f"{table}:{block}:{offset}", document(table, block, offset, row)))
        index = elastic.index_name(prefix, day)
        chunks.extend((index, by_chunk[n]) for n in sorted(by_chunk))
    return chunks


@dataclass(frozen=True)
class IndexingRun:
    """Documents into Elasticsearch: first and last acknowledged chunk, and when all were searchable."""

    documents: int
    first_ack: float  # monotonic clock
    first_acked: int  # documents acknowledged at that moment
    last_ack: float
    visible: float  # first `_count` of the prefix that found every document
    bulks: int = 0

    @property
    def docs_per_second(self) -> float:
        """Headline: documents after the first chunk, until searchable (the 1 s refresh included)."""
        return (self.documents - self.first_acked) / (self.visible - self.first_ack)

    @property
    def acked_per_second(self) -> float:
        """The same until the last acknowledgement (no refresh wait)."""
        return (self.documents - self.first_acked) / (self.last_ack - self.first_ack)


def count_documents(es: Elasticsearch, prefix: str) -> int:
    """Documents searchable in `<prefix>-*` now (no refresh forced)."""
    return es.count(index=f"{prefix}-*", allow_no_indices=True)["count"]


def wait_searchable(es: Elasticsearch, prefix: str, documents: int, timeout: float = VISIBLE_TIMEOUT_S) -> float:
    """Poll `_count` every 100 ms until `documents` are searchable; the monotonic time it was seen."""
    deadline = time.monotonic() + timeout
    while (found := count_documents(es, prefix)) < documents:
        if time.monotonic() > deadline:
            raise BenchmarkError(f"{prefix}-*: {found} of {documents} documents searchable after {timeout}s")
        time.sleep(0.1)
    return time.monotonic()


def bare_bulk_index(es: Elasticsearch, chunks: Sequence[Chunk], prefix_check: str) -> IndexingRun:
    """Send `chunks` one bulk request each (orjson NDJSON, as the puller), then wait until all are searchable."""
    documents = sum(len(docs) for _, docs in chunks)
    first_ack = first_acked = 0.0
    done = 0
    for index, docs in chunks:
        lines = []
        for doc_id, doc in docs:
            lines.append(orjson.dumps({"index": {"_index": index, "_id": doc_id}}))
            lines.append(orjson.dumps(doc))
        response = es.bulk(operations=b"\n".join(lines) + b"\n", refresh=False)
        if response["errors"]:
            failed = next(i["index"] for i in response["items"] if i["index"]["status"] >= 300)
            raise BenchmarkError(f"bare bulk indexer: {failed}")
        done += len(docs)
        if not first_ack:
            first_ack, first_acked = time.monotonic(), done
    last_ack = time.monotonic()
    visible = wait_searchable(es, prefix_check, documents)
    return IndexingRun(documents, first_ack, int(first_acked), last_ack, visible, len(chunks))


# --- queries on one day table ---------------------------------------------------------------------

QUERY_UIDS = 1_000
POOL_TEXTS = 2_048  # distinct texts of the query table (the 1 MiB pool cut in 512-character pieces)


def fill_query_table(log_schema: str, day: date, rows: int, workload: AuditWorkload, settings: PostgresSettings) -> str:
    """A new audit log whose (shard 0, `day`) table holds `rows` rows in ts order over the day, analyzed.

    uids are uniform in 1..1000, texts cycle through `POOL_TEXTS` pieces of the workload's pool.
    Returns the table's name.
    """
    texts = [workload.pool[i * CONTENT_CHARS : (i + 1) * CONTENT_CHARS] for i in range(POOL_TEXTS)]
    with psycopg.connect(owner_conninfo(settings), autocommit=True) as conn:
        conn.execute("SELECT audit.create_log(%s)", (log_schema,))
        table = conn.execute("SELECT audit.ensure_table(%s, 0, %s)", (log_schema, day)).fetchone()[0]
        ident = sql.Identifier(*table.split("."))
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (shard, ts, uid, content, fields)"
                " SELECT 0, %(day)s::timestamptz + g * %(step)s * interval '1 microsecond',"
                "        1 + floor(random() * %(uids)s)::int, (%(texts)s::text[])[1 + g %% %(n)s],"
                "        jsonb_build_object('action', (%(actions)s::text[])[1 + g %% 5])"
                "   FROM generate_series(0, %(rows)s::bigint - 1) AS g"
            ).format(ident),
            {
                "day": datetime(day.year, day.month, day.day, tzinfo=UTC),
                "step": 86_400_000_000 // rows,
                "uids": QUERY_UIDS,
                "texts": texts,
                "n": POOL_TEXTS,
                "actions": list(ACTIONS),
                "rows": rows,
            },
        )
        conn.execute(sql.SQL("ANALYZE {}").format(ident))
    return table


@dataclass
class QueryFigures:
    """Milliseconds per call (client side, median of the runs) and the values of the estimate/count pairs."""

    runs: int
    ms: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    values: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))

    def median_ms(self, key: str) -> float:
        """Median time of one query kind."""
        return statistics.median(self.ms[key])


_PAGE = "SELECT * FROM audit.user_events(%s, %s, %s, contains => %s, after => %s, page_size => 50, log_schema => %s)"
_ESTIMATE = "SELECT audit.user_events_estimate(%s, %s, %s, contains => %s, log_schema => %s)"
_COUNT = "SELECT audit.user_events_count(%s, %s, %s, contains => %s, log_schema => %s)"


def time_queries(
    log_schema: str, day: date, settings: PostgresSettings, *, runs: int = 20, contains: str = "abc"
) -> QueryFigures:
    """Time, as sv_reader, `runs` random (uid, 2-hour range) samples after 3 untimed ones.

    Per sample: the first page of `user_events` with `contains`, the second page (`after` = the first
    page's last `next_cursor`), and estimate vs exact count without and with the text filter.
    """
    rng = new_rng(7)
    midnight = datetime(day.year, day.month, day.day, tzinfo=UTC)
    figures = QueryFigures(runs)
    conninfo = settings.conninfo(user=ROLE_READER, application_name="streamviews-bench-queries")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        for n in range(runs + 3):
            uid = rng.randint(1, QUERY_UIDS)
            since = midnight + timedelta(minutes=rng.randrange(22 * 60))
            until = since + timedelta(hours=2)

            def timed(key: str, query: str, params: tuple, n: int = n) -> list[tuple]:
                started = time.perf_counter()
                rows = conn.execute(query, params).fetchall()
                if n >= 3:
                    figures.ms[key].append((time.perf_counter() - started) * 1000)
                return rows

            page = timed("page1", _PAGE, (uid, since, until, contains, None, log_schema))
            figures.values["page1_rows"].append(len(page))
            if page:
                timed("page2", _PAGE, (uid, since, until, contains, page[-1][-1], log_schema))
            for suffix, text in (("", None), ("_filter", contains)):
                (estimate,) = timed(f"estimate{suffix}", _ESTIMATE, (uid, since, until, text, log_schema))[0]
                (count,) = timed(f"count{suffix}", _COUNT, (uid, since, until, text, log_schema))[0]
                if n >= 3:
                    figures.values[f"estimate{suffix}"].append(estimate)
                    figures.values[f"count{suffix}"].append(count)
    return figures
