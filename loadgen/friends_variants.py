"""The other ways of intersecting tried for friends_who_like's heavy tail, timed by `bench_friends --variants`.

Each is a function `<schema>.fwl_<name>(uid, oid)` with friends_who_like's contract, over the same
views (or, for the ones that need sorted arrays, over sorted copies of them), so the benchmark can
time it beside the seed and the current function and check its answers. What each showed is in the
docs/performance.md (friends_who_like on the heavy tail); the one that helped is in sql/functions/social.sql.

- `plpgsql`: the PL/pgSQL function friends_who_like was until the C one (sql/functions/social.sql
  at 39185f2): the object read first, `&&` then `= ANY` for small arrays, a hashed `= ANY` planned per
  call (EXECUTE) for large ones; each read a statement;
- `joined_read`: `plpgsql`, but reading both rows in one statement (a join), as the function before
  it did: when the object has no likers, the user's row is read for nothing;
- `join`: a hash join of the two unnested arrays, in PL/pgSQL;
- `where_any`: the hashed `= ANY` of the current function, but in a WHERE clause: the planner then
  estimates the selectivity of each element of the constant array, which costs more than the hash;
- `bsearch`: arrays kept sorted (copies here; the engine appends), each element of the smaller one
  binary-searched in the larger with `width_bucket`, in C, through a plan made per call (EXECUTE);
- `merge`: arrays kept sorted, merged by two indexes in a PL/pgSQL loop;
- `uncompressed`: the current (C) function over copies of the views whose arrays are stored uncompressed
  (`STORAGE EXTERNAL`): what decompressing the two arrays costs in each call.
"""

from __future__ import annotations

import re

import psycopg
from psycopg import sql

from loadgen.social_copies import copy_functions
from pipelines.settings import ROLE_READER

# Sorted and uncompressed copies of the two views friends_who_like reads.
_COPIES = [
    "CREATE TABLE {s}.object_likes_sorted AS"
    " SELECT oid, ARRAY(SELECT x FROM unnest(likers) AS x ORDER BY x) AS likers FROM {s}.object_likes",
    "CREATE TABLE {s}.user_following_sorted AS"
    " SELECT uid, ARRAY(SELECT x FROM unnest(following) AS x ORDER BY x) AS following FROM {s}.user_following",
    "CREATE TABLE {s}.object_likes_uncompressed (oid bigint PRIMARY KEY, like_count bigint, likers bigint[])",
    "ALTER TABLE {s}.object_likes_uncompressed ALTER likers SET STORAGE EXTERNAL",
    "CREATE TABLE {s}.user_following_uncompressed (uid bigint PRIMARY KEY, following bigint[])",
    "ALTER TABLE {s}.user_following_uncompressed ALTER following SET STORAGE EXTERNAL",
    # `|| '{}'` makes a new datum, stored as the column says (a plain copy would keep the compressed one).
    "INSERT INTO {s}.object_likes_uncompressed"
    " SELECT oid, like_count, likers || '{{}}'::bigint[] FROM {s}.object_likes",
    "INSERT INTO {s}.user_following_uncompressed SELECT uid, following || '{{}}'::bigint[] FROM {s}.user_following",
    "ALTER TABLE {s}.object_likes_sorted ADD PRIMARY KEY (oid)",
    "ALTER TABLE {s}.user_following_sorted ADD PRIMARY KEY (uid)",
    "VACUUM (ANALYZE) {s}.object_likes_sorted, {s}.user_following_sorted,"
    " {s}.object_likes_uncompressed, {s}.user_following_uncompressed",
]

# Both rows in one statement, as friends_who_like; @TABLES@ picks the views or their sorted copies. The
# texts are psycopg SQL templates ({s} the schema, {{}} a literal {}), assembled by plain replacement.
_READ = """
    SELECT v.likers, u.following INTO fans, friends
      FROM {s}.object_likes@TABLES@ AS v, {s}.user_following@TABLES@ AS u
     WHERE v.oid = $2 AND u.uid = $1;
    IF fans IS NULL OR friends IS NULL THEN
        RETURN '{{}}';
    END IF;"""

_BODIES = {
    "joined_read": (
        "",
        """IF cardinality(fans) <= cardinality(friends) THEN
        IF cardinality(fans) <= 6 OR cardinality(fans)::bigint * cardinality(friends) <= 5000 THEN
            IF NOT fans && friends THEN
                RETURN '{{}}'::bigint[];
            END IF;
            RETURN ARRAY(SELECT l FROM unnest(fans) AS l WHERE l = ANY (friends));
        END IF;
        EXECUTE 'SELECT coalesce(array_agg(x) FILTER (WHERE x = ANY ($2)), ''{{}}'')'
             ' FROM (SELECT unnest($1) AS x) AS s' INTO common USING fans, friends;
        RETURN common;
    ELSIF cardinality(friends) <= 6 OR cardinality(friends)::bigint * cardinality(fans) <= 5000 THEN
        IF NOT fans && friends THEN
            RETURN '{{}}'::bigint[];
        END IF;
        RETURN ARRAY(SELECT f FROM unnest(friends) AS f WHERE f = ANY (fans));
    END IF;
    EXECUTE 'SELECT coalesce(array_agg(x) FILTER (WHERE x = ANY ($2)), ''{{}}'')'
         ' FROM (SELECT unnest($1) AS x) AS s' INTO common USING friends, fans;
    RETURN common;""",
    ),
    "join": (
        "",
        "RETURN ARRAY(SELECT l FROM unnest(fans) AS l JOIN unnest(friends) AS f ON f = l);",
    ),
    "where_any": (
        "",
        """IF cardinality(fans) <= cardinality(friends) THEN
        EXECUTE 'SELECT ARRAY(SELECT x FROM unnest($1) AS x WHERE x = ANY ($2))' INTO common USING fans, friends;
    ELSE
        EXECUTE 'SELECT ARRAY(SELECT x FROM unnest($1) AS x WHERE x = ANY ($2))' INTO common USING friends, fans;
    END IF;
    RETURN common;""",
    ),
    "bsearch": (
        "_sorted",
        """IF cardinality(fans) <= cardinality(friends) THEN
        EXECUTE 'SELECT coalesce(array_agg(x) FILTER (WHERE $2[width_bucket(x, $2)] = x), ''{{}}'')'
             ' FROM (SELECT unnest($1) AS x) AS s' INTO common USING fans, friends;
    ELSE
        EXECUTE 'SELECT coalesce(array_agg(x) FILTER (WHERE $2[width_bucket(x, $2)] = x), ''{{}}'')'
             ' FROM (SELECT unnest($1) AS x) AS s' INTO common USING friends, fans;
    END IF;
    RETURN common;""",
    ),
    "merge": (
        "_sorted",
        """WHILE i <= cardinality(fans) AND j <= cardinality(friends) LOOP
        IF fans[i] < friends[j] THEN
            i := i + 1;
        ELSIF fans[i] > friends[j] THEN
            j := j + 1;
        ELSE
            common := common || fans[i];
            i := i + 1;
            j := j + 1;
        END IF;
    END LOOP;
    RETURN common;""",
    ),
}

# The PL/pgSQL friends_who_like of 39185f2, the one the C function replaced, as a template like the others.
_PLPGSQL = """
CREATE FUNCTION {s}.fwl_plpgsql(uid bigint, oid bigint) RETURNS bigint[]
LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE
AS $$
DECLARE
    fans bigint[];
    friends bigint[];
    small bigint[];
    large bigint[];
    common bigint[];
BEGIN
    SELECT v.likers INTO fans FROM {s}.object_likes AS v WHERE v.oid = $2;
    IF fans IS NULL THEN
        RETURN '{{}}'::bigint[];
    END IF;
    SELECT u.following INTO friends FROM {s}.user_following AS u WHERE u.uid = $1;
    IF friends IS NULL THEN
        RETURN '{{}}'::bigint[];
    ELSIF cardinality(fans) <= cardinality(friends) THEN
        small := fans;
        large := friends;
    ELSE
        small := friends;
        large := fans;
    END IF;
    IF cardinality(small) <= 6 OR cardinality(small)::bigint * cardinality(large) <= 5000 THEN
        IF NOT small && large THEN
            RETURN '{{}}'::bigint[];
        END IF;
        RETURN ARRAY(SELECT x FROM unnest(small) AS x WHERE x = ANY (large));
    END IF;
    EXECUTE 'SELECT coalesce(array_agg(x) FILTER (WHERE x = ANY ($2)), ''{{}}'')'
            ' FROM (SELECT unnest($1) AS x) AS s'
       INTO common USING small, large;
    RETURN common;
END
$$
"""

_FUNCTION = """
CREATE FUNCTION {s}.@NAME@(uid bigint, oid bigint) RETURNS bigint[]
LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE
AS $$
DECLARE
    fans bigint[];
    friends bigint[];
    common bigint[] := '{{}}';
    i int := 1;
    j int := 1;
BEGIN@READ@
    @BODY@
END
$$
"""


def functions() -> list[str]:
    """The variants' function names, in the order they are timed."""
    return [f"fwl_{name}" for name in ("plpgsql", *_BODIES, "uncompressed")]


def install(conn: psycopg.Connection, schema: str) -> dict[str, str]:
    """Create the copies and the variants in `schema` (as its owner); return their pgbench statements by name."""
    s = sql.Identifier(schema)
    for statement in _COPIES:
        conn.execute(sql.SQL(statement).format(s=s))
    conn.execute(sql.SQL(_PLPGSQL).format(s=s))
    for name, (tables, body) in _BODIES.items():
        read = _READ.replace("@TABLES@", tables)
        text = _FUNCTION.replace("@NAME@", f"fwl_{name}").replace("@READ@", read).replace("@BODY@", body)
        conn.execute(sql.SQL(text).format(s=s))
    # The current friends_who_like, renamed, over the uncompressed copies.
    current = copy_functions(schema)
    start = current.index(f"CREATE OR REPLACE FUNCTION {schema}.friends_who_like(")
    text = current[start : current.index("\n$$;", start) + 4]
    text = text.replace(f"{schema}.friends_who_like(", f"{schema}.fwl_uncompressed(")
    text = re.sub(rf"\b{schema}\.(object_likes|user_following)\b", rf"{schema}.\1_uncompressed", text)
    conn.execute(text)
    names = functions()
    conn.execute(sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA {} TO {}").format(s, sql.Identifier(ROLE_READER)))
    for name in names:
        conn.execute(
            sql.SQL("GRANT EXECUTE ON FUNCTION {}.{}(bigint, bigint) TO {}").format(
                s, sql.Identifier(name), sql.Identifier(ROLE_READER)
            )
        )
    return {name: f"SELECT {{s}}.{name}(:uid, :id);" for name in names}
