"""streamviews.keyed_arrays_intersection (pgext/keyed_arrays.c): two keyed reads and their intersection.

The C function behind friends_who_like reads one row of each relation by key, with PostgreSQL's own
rules for `SELECT column FROM relation WHERE key = ...`: the caller needs SELECT on what it names (or
on both columns), a view's owner on the table beneath (the caller, when the view is security_invoker),
and what it cannot read as a query would (a view with conditions or without the key, row-level
security, inheritance children) it refuses with one line.
Each test works in a schema of its own, as the owner, in a transaction that is rolled back.
"""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from tests.integration.conftest import unique


@pytest.fixture
def db(pg):
    """The owner in a rolled-back transaction, with two keyed tables and plain views over them."""
    schema = unique("kai")
    statements = [
        "CREATE SCHEMA {s}",
        "CREATE TABLE {s}.likes (oid bigint PRIMARY KEY, likers bigint[], note text)",
        "CREATE TABLE {s}.follows (uid bigint PRIMARY KEY, following bigint[])",
        "CREATE VIEW {s}.object_likes AS SELECT l.oid, l.likers AS fans FROM {s}.likes AS l",
        "CREATE VIEW {s}.user_following AS SELECT f.uid, f.following FROM {s}.follows AS f",
        "GRANT USAGE ON SCHEMA {s} TO sv_reader",
        "GRANT SELECT ON {s}.object_likes, {s}.user_following TO sv_reader",
    ]
    with pg("sv_owner", autocommit=True) as conn, conn.transaction(force_rollback=True):
        for statement in statements:
            conn.execute(sql.SQL(statement).format(s=sql.Identifier(schema)))
        yield conn, schema


def run(db, statement: str, *params: object) -> object:
    conn, schema = db
    return conn.execute(sql.SQL(statement).format(s=sql.Identifier(schema)), params).fetchone()[0]


def intersection(db, oid: int, uid: int, left: str = "object_likes", right: str = "user_following") -> list[int]:
    """The function over `left`.fans (a table's: .likers) at `oid` and `right`.following at `uid`."""
    _, schema = db
    left_column = "fans" if left == "object_likes" else "likers"
    return run(
        db,
        "SELECT streamviews.keyed_arrays_intersection(%s, %s, %s, %s, %s, 'following')",
        f"{schema}.{left}",
        oid,
        left_column,
        f"{schema}.{right}",
        uid,
    )


def store(db, oid: int, likers: list[int] | None, uid: int, following: list[int] | None) -> None:
    conn, schema = db
    s = sql.Identifier(schema)
    conn.execute(sql.SQL("INSERT INTO {}.likes VALUES (%s, %s)").format(s), (oid, likers))
    conn.execute(sql.SQL("INSERT INTO {}.follows VALUES (%s, %s)").format(s), (uid, following))


def test_the_values_both_rows_hold_each_once_through_views_and_tables(db):
    store(db, 1, [5, 3, 9, 3, 7], 2, [7, 1, 3, 3, 8])
    assert sorted(intersection(db, 1, 2)) == [3, 7]
    assert sorted(intersection(db, 1, 2, left="likes", right="follows")) == [3, 7]


def test_a_missing_row_a_null_or_empty_array_or_null_elements(db):
    store(db, 1, [1, None, 2], 2, [None, 2, 3])
    store(db, 3, None, 4, [])
    assert intersection(db, 1, 2) == [2]
    assert intersection(db, 1, 4) == []  # empty follow list
    assert intersection(db, 3, 2) == []  # NULL likers
    assert intersection(db, 99, 2) == []
    assert intersection(db, 1, 99) == []


def test_large_arrays_meet_in_a_hash_set_whichever_side_is_smaller(db):
    fans, follows = list(range(1, 30_001)), list(range(29_001, 29_001 + 5_000, 1))
    store(db, 1, fans, 2, follows)
    assert sorted(intersection(db, 1, 2)) == list(range(29_001, 30_001))
    store(db, 3, [*follows[:40], 10**12], 4, [*fans, 10**12])
    assert sorted(intersection(db, 3, 4)) == [*range(29_001, 29_041), 10**12]


def test_the_caller_needs_select_on_what_it_names(db):
    store(db, 1, [1], 2, [1])
    conn, _ = db
    conn.execute("SET LOCAL ROLE sv_reader")
    assert intersection(db, 1, 2) == [1]  # granted on the views
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for table likes"):
        intersection(db, 1, 2, left="likes", right="follows")


def test_a_views_owner_needs_select_on_its_table(db):
    store(db, 1, [1], 2, [1])
    conn, schema = db
    conn.execute(sql.SQL("REVOKE SELECT ON {}.likes FROM sv_owner").format(sql.Identifier(schema)))
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for table likes"):
        intersection(db, 1, 2)


def test_a_security_invoker_view_checks_its_table_as_the_caller(db):
    store(db, 1, [1], 2, [1])
    conn, schema = db
    s = sql.Identifier(schema)
    conn.execute("SET LOCAL ROLE sv_reader")
    assert intersection(db, 1, 2) == [1]  # the owner's rights on the table; resolved and kept
    conn.execute("RESET ROLE")
    conn.execute(sql.SQL("ALTER VIEW {}.object_likes SET (security_invoker = true)").format(s))
    conn.execute("SET LOCAL ROLE sv_reader")
    for read in (
        lambda: intersection(db, 1, 2),
        lambda: conn.execute(sql.SQL("SELECT fans FROM {}.object_likes WHERE oid = 1").format(s)),
    ):
        denied = pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for table likes")
        with denied, conn.transaction():
            read()
    conn.execute("RESET ROLE")
    conn.execute(sql.SQL("GRANT SELECT ON {}.likes TO sv_reader").format(s))
    conn.execute(sql.SQL("REVOKE SELECT ON {}.likes FROM sv_owner").format(s))  # the owner's rights no longer matter
    conn.execute("SET LOCAL ROLE sv_reader")
    assert intersection(db, 1, 2) == [1]


def test_select_on_the_key_and_the_array_columns_is_enough_and_needed(db):
    store(db, 1, [1], 2, [1])
    conn, schema = db
    s = sql.Identifier(schema)
    conn.execute(sql.SQL("GRANT SELECT (oid, likers) ON {}.likes TO sv_reader").format(s))
    conn.execute(sql.SQL("GRANT SELECT (following) ON {}.follows TO sv_reader").format(s))
    conn.execute("SET LOCAL ROLE sv_reader")
    assert intersection(db, 1, 2, right="user_following", left="likes") == [1]
    denied = pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for table follows")
    with denied, conn.transaction():
        intersection(db, 1, 2, left="likes", right="follows")  # SELECT on following, not on uid


def test_a_view_must_show_the_key_it_is_read_by(db):
    store(db, 1, [1], 2, [1])
    conn, schema = db
    s = sql.Identifier(schema)
    conn.execute(sql.SQL("CREATE VIEW {}.keyless AS SELECT likers FROM {}.likes").format(s, s))
    with pytest.raises(psycopg.errors.FeatureNotSupported, match='does not show its table\'s key column "oid"'):
        intersection(db, 1, 2, left="keyless")


def test_what_a_plain_read_cannot_honour_is_refused_in_one_line(db):
    conn, schema = db
    s = sql.Identifier(schema)
    for statement in [
        "CREATE VIEW {s}.filtered AS SELECT oid, likers FROM {s}.likes WHERE oid > 10",
        "CREATE VIEW {s}.computed AS SELECT oid, likers || 1::bigint AS likers FROM {s}.likes",
        "CREATE TABLE {s}.unkeyed (oid bigint, likers bigint[])",
        "CREATE TABLE {s}.secured (oid bigint PRIMARY KEY, likers bigint[])",
        "ALTER TABLE {s}.secured ENABLE ROW LEVEL SECURITY",
        "CREATE VIEW {s}.secured_view WITH (security_invoker = true) AS SELECT oid, likers FROM {s}.secured",
        "CREATE TABLE {s}.parent (oid bigint PRIMARY KEY, likers bigint[])",
        "CREATE TABLE {s}.child () INHERITS ({s}.parent)",
    ]:
        conn.execute(sql.SQL(statement).format(s=s))
    refused = {
        "filtered": "is not a plain view of one table",
        "computed": 'column "likers" of view "computed" is not a column of its table',
        "unkeyed": "has no unique index on one bigint column",
        "secured": "has row-level security",
        "secured_view": 'table "secured" has row-level security',
        "parent": "has inheritance children",
    }
    for relation, message in refused.items():
        with pytest.raises(psycopg.Error, match=message) as raised, conn.transaction():
            intersection(db, 1, 2, left=relation)
        assert "\n" not in str(raised.value).strip()
    for column, message in [("note", "is not of type bigint"), ("nope", 'column "nope" of relation')]:
        with pytest.raises(psycopg.Error, match=message), conn.transaction():
            run(
                db,
                "SELECT streamviews.keyed_arrays_intersection(%s, 1, %s, %s, 2, 'following')",
                f"{schema}.likes",
                column,
                f"{schema}.follows",
            )


def test_a_replaced_view_is_read_as_it_now_is(db):
    store(db, 1, [1, 2], 2, [1, 2])
    assert sorted(intersection(db, 1, 2)) == [1, 2]  # resolved, and kept by this backend
    conn, schema = db
    for statement in [
        "CREATE TABLE {s}.likes2 (oid bigint PRIMARY KEY, likers bigint[])",
        "INSERT INTO {s}.likes2 VALUES (1, '{{2}}')",
        "CREATE OR REPLACE VIEW {s}.object_likes AS SELECT l.oid, l.likers AS fans FROM {s}.likes2 AS l",
    ]:
        conn.execute(sql.SQL(statement).format(s=sql.Identifier(schema)))
    assert intersection(db, 1, 2) == [2]


def test_friends_who_like_is_inlined_into_one_call(pg):
    """The query function must stay an inlinable SQL function: its cost is the C call's alone."""
    with pg("sv_reader") as conn:
        plan = conn.execute("EXPLAIN (VERBOSE) SELECT social.friends_who_like(1, 2)").fetchall()
    assert "streamviews.keyed_arrays_intersection" in " ".join(row[0] for row in plan)
