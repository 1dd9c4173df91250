"""The state `friends_who_like` reads, with a typical mix and a heavy tail, in a throwaway schema.

`loadgen.friends` times the query on two kinds of calls that cost very differently: the
typical mix (objects from the seed's Gaussian hot spot, most with a handful of likers; users from
the seed's long tail of follow lists, 90% following at most 100) and the heavy tail the seed's
`unnest ... INTERSECT` is slow on (users following 1,000-10,000, objects with 1,000-20,000 likers).
Both live in the same views, under disjoint ids, so one pgbench script draws from one mix only:

| ids | what they hold |
| --- | --- |
| objects 1..objects | the typical likes: `like_events` (Gaussian hot spot, unlikes, duplicates) |
| objects objects+1..objects+heavy_objects | 1,000-20,000 likers each, uniform users |
| users 1..followers | `follow_lists`: the seed's long tail (90% 1-100, 8% 300-1000, 2% 1000-10000) |
| users followers+1..followers+heavy_users | 1,000-10,000 follows each, uniform targets |

The views are the declared ones (`social.object_likes`, `social.user_following`, copied into the
schema by `loadgen.common.social_copies`) filled through the engine as `sv_writer`, so their arrays are
stored exactly as the live views store them (insertion order, TOASTed and compressed when large).
Beside them: the query functions of sql/functions/social.sql (`copy_functions`), the previous
`friends_who_like` as `friends_who_like_before`, and the seed's own tables `obj` and
`user_like_agg` with its `array_intersect`, holding the same arrays (copied from the views, datum
for datum). Everything is dropped afterwards; the `social` schema is never touched.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain, islice

import psycopg
from psycopg import sql

from loadgen.common.postgres import owner_conninfo
from loadgen.common.social_copies import engine_filled_views
from loadgen.workloads.social import Like, WorkloadSettings, follow_lists, new_rng, now_ms, workload_likes
from pipelines.cv.views.compiler import storage_table_of
from pipelines.logs import get_logger
from pipelines.settings import ROLE_READER, PostgresSettings

log = get_logger("loadgen.friends.data")

HEAVY_LIKERS = (1_000, 20_000)  # likers of a heavy object (the heavy tail)
HEAVY_FOLLOWS = (1_000, 10_000)  # follows of a heavy user (the seed's top 2%)

# friends_who_like as it was before the heavy tail was measured (sql/functions/social.sql at 7998a4c),
# kept here so that every run compares the current function with it on the same data.
BEFORE = """
CREATE FUNCTION {s}.friends_who_like_before(uid bigint, oid bigint) RETURNS bigint[]
LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE
AS $$
DECLARE
    fans bigint[];
    friends bigint[];
BEGIN
    SELECT v.likers, u.following INTO fans, friends
      FROM {s}.object_likes AS v, {s}.user_following AS u
     WHERE v.oid = $2 AND u.uid = $1;
    IF fans IS NULL OR friends IS NULL THEN
        RETURN '{{}}';
    ELSIF least(cardinality(fans), cardinality(friends)) > 32 THEN
        RETURN ARRAY(SELECT l FROM unnest(fans) AS l INTERSECT SELECT f FROM unnest(friends) AS f);
    ELSIF cardinality(fans) <= cardinality(friends) THEN
        RETURN ARRAY(SELECT l FROM unnest(fans) AS l WHERE l = ANY (friends));
    END IF;
    RETURN ARRAY(SELECT f FROM unnest(friends) AS f WHERE f = ANY (fans));
END
$$
"""

# The seed's tables and function for "which of my friends like it" (as in loadgen.common.seed),
# filled from the views: the same arrays, datum for datum, so only the query differs.
SEED_TABLES = [
    "CREATE FUNCTION {s}.array_intersect(anyarray, anyarray) RETURNS anyarray"
    " LANGUAGE sql AS $$ SELECT ARRAY(SELECT UNNEST($1) INTERSECT SELECT UNNEST($2)) $$",
    "CREATE TABLE {s}.obj (id int8 PRIMARY KEY, who_like int8[], like_cnt int8)",
    "CREATE TABLE {s}.user_like_agg (uid int8 PRIMARY KEY, like_who int8[])",
    "INSERT INTO {s}.obj SELECT oid, likers, like_count FROM {s}.object_likes",
    "INSERT INTO {s}.user_like_agg SELECT uid, following FROM {s}.user_following",
    "GRANT SELECT ON {s}.obj, {s}.user_like_agg TO {reader}",
    "GRANT EXECUTE ON FUNCTION {s}.friends_who_like_before(bigint, bigint), {s}.array_intersect(anyarray, anyarray)"
    " TO {reader}",
    # The views' storage, not the read views (VACUUM skips views): as settled as the seed's tables.
    "VACUUM (ANALYZE) {s}.obj, {s}.user_like_agg, {likes_storage}, {follows_storage}",
]


@dataclass(frozen=True)
class FriendsShape:
    """How large each part of the state is; ids of the heavy tail follow those of the typical mix."""

    likes: int = 200_000  # typical like events
    followers: int = 2_000  # users 1..followers have long-tail follow lists
    heavy_objects: int = 100
    heavy_users: int = 100
    workload: WorkloadSettings = field(default_factory=WorkloadSettings)

    @property
    def objects(self) -> int:
        """Typical objects are 1..objects (the Gaussian's range); heavy ones come after."""
        return self.workload.objects


@dataclass(frozen=True)
class FriendsState:
    """A filled throwaway schema: where it is, how long the load took, what the arrays hold per mix."""

    schema: str
    shape: FriendsShape
    load_changes: int
    load_seconds: float
    sizes: dict[str, dict[str, float]]  # mix -> figures of its arrays (see `array_sizes`)


def heavy_likes(shape: FriendsShape) -> Iterator[Like]:
    """Likes of the heavy objects: each gets 1,000-20,000 distinct users, uniform in 1..users."""
    rng = new_rng(shape.workload.seed ^ 0x4EA7)
    population = range(1, shape.workload.users + 1)
    ts = now_ms()
    for oid in range(shape.objects + 1, shape.objects + shape.heavy_objects + 1):
        for uid in rng.sample(population, rng.randint(*HEAVY_LIKERS)):
            yield Like(oid, uid, "like", ts)


def heavy_follows(shape: FriendsShape) -> Iterator[tuple[int, list[int]]]:
    """Follow lists of the heavy users: 1,000-10,000 distinct targets each, uniform, never themselves."""
    rng = new_rng(shape.workload.seed ^ 0xF011)
    population = range(1, shape.workload.users + 1)
    for uid in range(shape.followers + 1, shape.followers + shape.heavy_users + 1):
        targets = rng.sample(population, rng.randint(*HEAVY_FOLLOWS) + 1)
        yield uid, [t for t in targets if t != uid][: len(targets) - 1]


def typical_likes(shape: FriendsShape) -> Iterator[Like]:
    """The seed's likes workload (`like_events`), as `loadgen.social` replays it."""
    return islice(workload_likes(shape.workload), shape.likes)


def array_sizes(conn: psycopg.Connection, schema: str, shape: FriendsShape) -> dict[str, dict[str, float]]:
    """Per mix: how many rows, and the median, 99th percentile and largest array, of objects and users."""
    s = sql.Identifier(schema)
    query = sql.SQL(
        "SELECT count(*), percentile_disc(0.5) WITHIN GROUP (ORDER BY n),"
        " percentile_disc(0.99) WITHIN GROUP (ORDER BY n), max(n)"
        " FROM (SELECT cardinality({col}) AS n FROM {s}.{table} WHERE {key} BETWEEN %s AND %s) AS t"
    )
    ranges = {
        "typical": ((1, shape.objects), (1, shape.followers)),
        "heavy": (
            (shape.objects + 1, shape.objects + shape.heavy_objects),
            (shape.followers + 1, shape.followers + shape.heavy_users),
        ),
    }
    sizes: dict[str, dict[str, float]] = {}
    for mix, (objects, users) in ranges.items():
        sizes[mix] = {}
        for side, (table, key, col), bounds in (
            ("likers", ("object_likes", "oid", "likers"), objects),
            ("following", ("user_following", "uid", "following"), users),
        ):
            row = conn.execute(
                query.format(s=s, table=sql.Identifier(table), key=sql.Identifier(key), col=sql.Identifier(col)),
                bounds,
            ).fetchone()
            for name, value in zip(("rows", "p50", "p99", "max"), row, strict=True):
                sizes[mix][f"{side}_{name}"] = float(value or 0)
    return sizes


@contextmanager
def friends_state(shape: FriendsShape, postgres: PostgresSettings) -> Iterator[FriendsState]:
    """Create and fill the throwaway schema (see the module docstring); yield it; drop it all after.

    The likes copy keeps only `object_likes`: with `user_following`, the views friends_who_like reads,
    with less to maintain while loading (`engine_filled_views`).
    """
    w = shape.workload
    likes = chain(typical_likes(shape), heavy_likes(shape))
    lists = chain(follow_lists(w.seed, users=w.users, followers=shape.followers), heavy_follows(shape))
    with engine_filled_views(likes, lists, postgres, like_views=("object_likes",)) as filled:
        name, s, owner = filled.schema, sql.Identifier(filled.schema), owner_conninfo(postgres)
        seconds = filled.likes.seconds + filled.follows.seconds
        with psycopg.connect(owner, autocommit=True) as conn:
            names = {
                "s": s,
                "reader": sql.Identifier(ROLE_READER),
                "likes_storage": storage_table_of(name, "object_likes"),
                "follows_storage": storage_table_of(name, "user_following"),
            }
            for statement in [BEFORE, *SEED_TABLES]:
                conn.execute(sql.SQL(statement).format(**names))
            sizes = array_sizes(conn, name, shape)
        log.info("friends state ready", schema=name, seconds=round(seconds, 1), sizes=sizes)
        yield FriendsState(name, shape, filled.likes.changes + filled.follows.changes, seconds, sizes)
