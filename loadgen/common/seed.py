"""The seed's own approaches, measured on our PostgreSQL: the baselines the likes benchmarks stand beside.

Each measurement creates its objects in a throwaway schema named by the caller and drops it afterwards:

- `seed_per_event_eps`: the seed's per-event PL/pgSQL function `f_obj` (membership check, then
  append), written for a plain table since there is no PipelineDB, driven by pgbench as in the seed;
- `raw_copy_rows_per_second`: binary COPY of the same like rows into an unindexed table, the ceiling
  of any Postgres sink;
- `pk_read_tps` and `seed_intersection_tps`: pgbench of a plain primary-key read and of the seed's
  `array_intersect` query ("which of my friends like it") over tables filled with the workload.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import psycopg
from psycopg import sql

from loadgen.common.postgres import bench_schema, execute, owner_conninfo, pgbench_env, pgbench_script, pgbench_tps
from loadgen.workloads.social import GAUSSIAN_PARAMETER, OBJECTS, USERS, Like, new_rng, pgbench_gaussian
from pipelines.logs import get_logger
from pipelines.settings import PostgresSettings

log = get_logger("loadgen.common.seed")


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
    (the likes-at-size benchmark copies in the likes its views hold).
    """
    env = pgbench_env(settings=settings)
    if not synchronous_commit:
        env["PGOPTIONS"] = "-c synchronous_commit=off"
    with bench_schema(schema, settings):
        execute(schema, [_F_OBJ], settings)
        if prefill:
            with psycopg.connect(owner_conninfo(settings), autocommit=True) as conn:
                for statement in prefill:
                    conn.execute(statement)
        script = pgbench_script(
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
        execute(schema, ["CREATE TABLE {s}.likes_raw (oid int8, uid int8, ts timestamptz)"], settings)
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
        execute(schema, _PLAIN, settings, rows=rows)
        script = pgbench_script(schema, "\\set id random(1, :rows)\n", "SELECT v FROM {s}.plain WHERE id = :id;")
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
    return pgbench_script(
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
    binary COPY, indexed afterwards and vacuumed, so the run reads settled tables. `followers` is
    how many lists `follows` yields (the query's uid range); the queried object is drawn as the likes.
    """
    likers = likers_by_object(likes)
    with bench_schema(schema, settings):
        execute(schema, [_INTERSECT_TABLES], settings)
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
        execute(
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
