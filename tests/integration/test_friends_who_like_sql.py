"""friends_who_like (sql/functions/social.sql) is exactly the seed's intersection, at every size.

The function is one call of streamviews.keyed_arrays_intersection (pgext/), which compares a few
values directly and meets larger arrays in a hash set of the smaller. Each test runs this
checkout's sql/functions/social.sql, with `social.` replaced by a schema of its own holding plain
`object_likes` and `user_following` tables, in a transaction that is rolled back: nothing stays,
and the live views are never read. Answers are compared, as sets, with the seed's
`unnest ... INTERSECT` over the same rows and with Python's.
"""

from __future__ import annotations

import random
import re
from itertools import count

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from pipelines.dbsetup import SQL_DIR
from tests.integration.conftest import unique

FUNCTIONS = SQL_DIR / "functions" / "social.sql"
PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
BASE = 5_000_000_000  # ids past int4, as bigint ids are

# (likers, follows): few likers and a TOASTed follow list (the typical heavy user), the crossing
# between comparing and hashing (8 and 9 values on the smaller side), both sides large, and the
# heavy tail.
SIZES = [
    (1, 1),
    (3, 60),
    (5, 10_000),
    (6, 20_000),
    (7, 800),
    (8, 9),
    (9, 8),
    (9, 5_000),
    (50, 100),
    (51, 100),
    (80, 100),
    (100, 80),
    (1_000, 20_000),
    (10_000, 1_000),
    (10_000, 20_000),
    (20_000, 10_000),
]


@pytest.fixture
def db(pg):
    """The owner inside a rolled-back transaction, with the query functions over tables of a schema of its own."""
    schema = unique("fwl")
    statements = [
        "CREATE SCHEMA {s}",
        "CREATE TABLE {s}.object_likes (oid bigint PRIMARY KEY, like_count bigint, likers bigint[])",
        "CREATE TABLE {s}.user_following (uid bigint PRIMARY KEY, following bigint[])",
        # The seed's function, as loadgen.common.seed has it.
        "CREATE FUNCTION {s}.array_intersect(anyarray, anyarray) RETURNS anyarray"
        " LANGUAGE sql AS $$ SELECT ARRAY(SELECT UNNEST($1) INTERSECT SELECT UNNEST($2)) $$",
    ]
    with pg("sv_owner", autocommit=True) as conn, conn.transaction(force_rollback=True):
        for statement in statements:
            conn.execute(sql.SQL(statement).format(s=sql.Identifier(schema)))
        conn.execute(re.sub(r"\bsocial\.", f"{schema}.", FUNCTIONS.read_text()))  # as loadgen.common.social_copies does
        yield conn, schema


class Pairs:
    """Stores (likers, follows) pairs under fresh ids and answers friends_who_like and the seed's query for them."""

    def __init__(self, conn, schema):
        self.conn, self.s, self.ids = conn, sql.Identifier(schema), count(1)

    def _one(self, statement: str, params: tuple) -> object:
        return self.conn.execute(sql.SQL(statement).format(s=self.s), params).fetchone()[0]

    def store(self, likers: list[int], follows: list[int]) -> tuple[int, int]:
        uid, oid = next(self.ids), next(self.ids)
        self.conn.execute(
            sql.SQL("INSERT INTO {}.object_likes VALUES (%s, %s, %s)").format(self.s), (oid, len(likers), likers)
        )
        self.conn.execute(sql.SQL("INSERT INTO {}.user_following VALUES (%s, %s)").format(self.s), (uid, follows))
        return uid, oid

    def friends_who_like(self, uid: int, oid: int) -> list[int]:
        return self._one("SELECT {s}.friends_who_like(%s, %s)", (uid, oid))

    def seed(self, uid: int, oid: int) -> list[int]:
        """The seed's test3 statement over the same rows."""
        return self._one(
            "SELECT {s}.array_intersect(t1.likers, t2.like_who)"
            " FROM (SELECT likers FROM {s}.object_likes WHERE oid = %s) t1,"
            " (SELECT array[following] AS like_who FROM {s}.user_following WHERE uid = %s) t2",
            (oid, uid),
        )

    def check(self, likers: list[int], follows: list[int]) -> list[int]:
        """Store the pair; assert friends_who_like equals the intersection, as a set, without duplicates."""
        uid, oid = self.store(likers, follows)
        got = self.friends_who_like(uid, oid)
        assert len(got) == len(set(got))
        assert sorted(got) == sorted(self.seed(uid, oid)) == sorted(set(likers) & set(follows))
        return got


@pytest.fixture
def pairs(db):
    return Pairs(*db)


def overlapping(likers: int, follows: int, seed: int) -> tuple[list[int], list[int], list[int]]:
    """Distinct likers and follows, a third of the smaller side in common, each in random order (as stored)."""
    rng = random.Random(seed)
    ids = [BASE + n for n in rng.sample(range(1, likers + follows + 1), likers + follows)]
    fans, others = ids[:likers], ids[likers:]
    common = fans[: max(1, min(likers, follows) // 3)]
    friends = common + others[: follows - len(common)]
    rng.shuffle(friends)
    return fans, friends, common


@pytest.mark.parametrize(("likers", "follows"), SIZES)
def test_the_intersection_at_every_size(pairs, likers, follows):
    fans, friends, common = overlapping(likers, follows, seed=likers * 100_003 + follows)
    assert sorted(pairs.check(fans, friends)) == sorted(common)
    strangers = [BASE + likers + follows + n for n in range(1, follows + 1)]
    assert pairs.check(fans, strangers) == []
    assert sorted(pairs.check(fans, fans[::-1])) == sorted(fans)


@given(
    likers=st.lists(st.integers(1, 300), max_size=150, unique=True),
    follows=st.lists(st.integers(1, 300), max_size=150, unique=True),
)
@PROPERTY
def test_small_arrays_of_any_shape(pairs, likers, follows):
    pairs.check([BASE + n for n in likers], [BASE + n for n in follows])


def test_unknown_ids_give_an_empty_array(pairs):
    uid, oid = pairs.store([BASE + 1], [BASE + 1])
    assert pairs.friends_who_like(uid, oid) == [BASE + 1]
    assert pairs.friends_who_like(uid, -1) == []
    assert pairs.friends_who_like(-1, oid) == []
    assert pairs.friends_who_like(-1, -1) == []
