"""keyed_arrays_intersection stays fast and cancellable whatever ids it is given.

friends_who_like's ids come straight from events, so whoever produces events chooses them. The hash
set of the first version (a fixed multiplier) could be filled with ids crafted to share one slot,
and a call then ran for seconds, quadratic in the ids, deaf to statement_timeout. Now the hash is
seeded at random on every call, a call whose probes still collide past a bound sorts instead, and
every loop checks for interrupts. Each test runs in a transaction that is rolled back, over temporary
tables.
"""

from __future__ import annotations

import random
import time

import psycopg
import pytest

U64 = 2**64
OLD_MULTIPLIER = 0x9E3779B97F4A7C15  # the first version's hash: (id * this) >> 32, masked
MIX = (0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53)  # the current mixer's multipliers (pgext/keyed_arrays.c)


def signed(value: int) -> int:
    return value - U64 if value >= 2**63 else value


def old_slot(value: int, bits: int) -> int:
    return (((value % U64) * OLD_MULTIPLIER % U64) >> 32) & ((1 << bits) - 1)


def colliding_under_the_old_hash(count: int) -> list[int]:
    """Ids whose product with the old multiplier is below 2**32: slot 0 at every table size."""
    inverse = pow(OLD_MULTIPLIER, -1, U64)
    return [signed(inverse * i % U64) for i in range(1, count + 1)]


def colliding_under_the_seed(seed: int, count: int) -> list[int]:
    """Ids whose mixed hash under `seed` is 1, 2, 3...: one cluster at slot 0, for whoever knows the seed."""

    def unmix(h: int) -> int:  # the mixer run backwards: each step is a bijection
        for multiplier in reversed(MIX):
            h ^= h >> 33
            h = h * pow(multiplier, -1, U64) % U64
        return (h ^ (h >> 33)) ^ seed

    return [signed(unmix(i)) for i in range(1, count + 1)]


@pytest.fixture
def tables(pg):
    """A superuser (to fix the seed) in a rolled-back transaction, with two keyed temporary tables."""
    with pg("postgres", autocommit=True) as conn, conn.transaction(force_rollback=True):
        conn.execute("CREATE TEMP TABLE likes (oid bigint PRIMARY KEY, likers bigint[]) ON COMMIT DROP")
        conn.execute("CREATE TEMP TABLE follows (uid bigint PRIMARY KEY, following bigint[]) ON COMMIT DROP")
        yield conn


def store(conn: psycopg.Connection, likers: list[int], following: list[int]) -> None:
    conn.execute("INSERT INTO likes VALUES (1, %s)", (likers,))
    conn.execute("INSERT INTO follows VALUES (2, %s)", (following,))


def intersection(conn: psycopg.Connection) -> list[int]:
    return conn.execute(
        "SELECT streamviews.keyed_arrays_intersection('likes', 1, 'likers', 'follows', 2, 'following')"
    ).fetchone()[0]


def test_ids_crafted_against_the_old_hash_meet_in_well_under_a_statement_timeout(tables):
    ids = colliding_under_the_old_hash(200_000)
    assert {old_slot(i, 19) for i in ids} == {0}  # 200,000 ids in one slot of the old 2**19-slot set
    following = random.Random(1).sample(ids, len(ids))
    store(tables, ids, following)
    tables.execute("SET LOCAL statement_timeout = '5s'")  # the old set: 2 * 10**10 probes, minutes
    assert intersection(tables) == ids  # each once, in the order of the left array (the two are as long)


def test_ids_crafted_against_a_known_seed_fall_back_to_sorting_and_still_meet_at_once(tables):
    intersection(tables)  # the library loaded, so the setting below is its own, not a placeholder
    tables.execute("SET LOCAL streamviews.intersection_hash_seed = 7")
    ids = colliding_under_the_seed(7, 200_000)
    # The left array is the shorter: the hash set is built from it, and the answer keeps its order.
    store(tables, [*ids, 5, ids[3], 6], [*random.Random(2).sample(ids, len(ids)), 6, 8, 9, 10])
    tables.execute("SET LOCAL statement_timeout = '5s'")
    assert intersection(tables) == [*ids, 6]


def test_only_a_superuser_may_fix_the_seed(pg):
    with pg("sv_reader") as reader:
        reader.execute("SELECT social.friends_who_like(1, 2)")  # loads the library
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            reader.execute("SET streamviews.intersection_hash_seed = 7")


def test_a_call_on_huge_arrays_is_cancelled_midway_by_statement_timeout(tables):
    random_ids = "ARRAY(SELECT (random() * 1e15)::bigint FROM generate_series(1, 8000000))"
    tables.execute(f"INSERT INTO likes SELECT 1, {random_ids}")
    tables.execute(f"INSERT INTO follows SELECT 2, {random_ids}")
    started = time.monotonic()
    intersection(tables)
    whole = time.monotonic() - started  # about a second on 2 cores: the reads are a fifth of it
    timeout_ms = max(int(whole * 1000 / 4), 50)
    tables.execute(f"SET LOCAL statement_timeout = {timeout_ms}")
    started = time.monotonic()
    with pytest.raises(psycopg.errors.QueryCanceled), tables.transaction():
        intersection(tables)
    cancelled = time.monotonic() - started
    assert cancelled < whole * 0.75, f"cancelled after {cancelled:.2f} s of a {whole:.2f} s call"
