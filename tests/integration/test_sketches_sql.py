"""pgext/sketches.c: Bloom filters and count-min sketches keep the error bounds PipelineDB documented.

A Bloom filter never misses a value it was given, and over at most n distinct values answers "maybe"
for others at about rate p; a count-min sketch never under-counts, and over-counts by more than
eps * N with probability at most 1 - p. Both merge batch by batch, in any order, into the same bytes.
Checked against the exact answer over seeded random data, in rolled-back transactions.
"""

from __future__ import annotations

import random
from collections import Counter

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


@pytest.fixture
def db(stack, pg):
    with pg("sv_owner", autocommit=True) as conn, conn.transaction(force_rollback=True):
        yield conn


def built(db, kind, batches, *shape):
    """A sketch built batch by batch, as a view merges them: bloom (bigint values) or freq (text values)."""
    add, merge, element = {"bloom": ("bloom_add", "bloom_union", "bigint"), "freq": ("freq_add", "freq_merge", "text")}[
        kind
    ]
    state = None
    for batch in batches:
        query = f"SELECT streamviews.{add}(NULL, %s::{element}[], %s, %s)"
        added = db.execute(query, (batch, *shape)).fetchone()[0]
        state = db.execute(f"SELECT streamviews.{merge}(%s, %s)", (state, added)).fetchone()[0]
    return state


def bloom(db, batches, p=0.02, n=1000):
    return built(db, "bloom", batches, p, n)


def test_a_bloom_filter_never_misses_and_keeps_false_positives_near_p(db):
    rng = random.Random(26)
    members = rng.sample(range(10**9), 1000)  # n distinct values: the filter's design point
    state = bloom(db, [members[i : i + 137] for i in range(0, len(members), 137)], p=0.02, n=1000)
    (missed,) = db.execute(
        "SELECT count(*) FROM unnest(%s::bigint[]) AS v WHERE NOT bloom_contains(%s, v)", (members, state)
    ).fetchone()
    assert missed == 0
    strangers = [v for v in rng.sample(range(10**9, 2 * 10**9), 20000)]
    (maybe,) = db.execute(
        "SELECT count(*) FROM unnest(%s::bigint[]) AS v WHERE bloom_contains(%s, v)", (strangers, state)
    ).fetchone()
    assert maybe / len(strangers) <= 0.02 * 1.5  # 20,000 probes: 1.5 p is over 10 standard deviations away
    (estimate,) = db.execute("SELECT bloom_cardinality(%s)", (state,)).fetchone()
    assert abs(estimate - 1000) <= 50


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(st.integers(-50, 50), max_size=60), cut=st.integers(0, 60))
def test_a_bloom_filter_is_the_same_whatever_the_batching(db, values, cut):
    assert bloom(db, [values[:cut], values[cut:]]) == bloom(db, [values[cut:], values[:cut]]) == bloom(db, [values])


def freq(db, batches, eps=0.002, p=0.995):
    return built(db, "freq", batches, eps, p)


def test_a_count_min_sketch_never_under_counts_and_over_counts_within_eps_n(db):
    rng = random.Random(27)
    values = [f"u{int(rng.paretovariate(1.1))}" for _ in range(20000)]  # a heavy-tailed stream
    truth = Counter(values)
    state = freq(db, [values[i : i + 5000] for i in range(0, len(values), 5000)], eps=0.01, p=0.99)
    rows = db.execute("SELECT v, freq(%s, v) FROM unnest(%s::text[]) AS v", (state, list(truth))).fetchall()
    assert all(estimate >= truth[v] for v, estimate in rows)
    over = [v for v, estimate in rows if estimate > truth[v] + 0.01 * len(values)]
    assert len(over) <= max(1, 0.01 * len(rows) * 3)  # each value over the bound with probability <= 1 - p
    assert db.execute("SELECT freq_total(%s)", (state,)).fetchone()[0] == len(values)


def test_sketches_of_different_shapes_do_not_merge_and_bad_parameters_are_refused(db):
    with db.transaction(force_rollback=True), pytest.raises(psycopg.errors.InvalidParameterValue, match="differ"):
        db.execute(
            "SELECT streamviews.bloom_union(streamviews.bloom_add(NULL, ARRAY[1], 0.02, 10),"
            " streamviews.bloom_add(NULL, ARRAY[1], 0.02, 100))"
        )
    with db.transaction(force_rollback=True), pytest.raises(psycopg.errors.InvalidParameterValue, match="eps and p"):
        db.execute("SELECT streamviews.freq_add(NULL, ARRAY[1], 2, 0.5)")
    with db.transaction(force_rollback=True), pytest.raises(psycopg.errors.InvalidParameterValue, match="not a Bloom"):
        db.execute("SELECT bloom_contains('\\x00'::bytea, 1)")


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(st.one_of(st.none(), st.integers(-30, 30)), max_size=50))
def test_the_aggregates_of_a_query_build_what_a_view_keeps(db, values):
    """bloom_agg, freq_agg and set_agg over rows (1.2) equal a view's batch-built sketch and array_agg(DISTINCT)."""
    row = db.execute(
        "SELECT bloom_agg(v) = streamviews.bloom_add(NULL, array_agg(v), 0.02, 16384),"
        " freq_agg(v, 0.01, 0.99) = streamviews.freq_add(NULL, array_agg(v), 0.01, 0.99),"
        " set_agg(v), array_agg(DISTINCT v) FROM unnest(%s::bigint[]) AS v",
        (values,),
    ).fetchone()
    same_bloom, same_freq, got_set, distinct = row
    assert (same_bloom, same_freq) == ((True, True) if values else (None, None))
    assert got_set == (list(dict.fromkeys(values)) if values else None)  # first-come order, NULL once
    assert sorted(got_set or [], key=str) == sorted(distinct or [], key=str)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.lists(
        st.tuples(st.one_of(st.none(), st.integers(0, 4)), st.one_of(st.none(), st.integers(-9, 9))), max_size=30
    )
)
def test_keyed_min_max_and_first_values_aggregates_answer_as_a_view_does(db, rows):
    """1.3's aggregates for queries: the value at the extreme key (a tie: the least value), the n least values."""
    keys, values = [k for k, _ in rows], [v for _, v in rows]
    got = db.execute(
        "SELECT keyed_max(k, v), keyed_min(k, v), first_values(3, v), (array_agg(v ORDER BY v))[1:3]"
        " FROM unnest(%s::int[], %s::int[]) AS r(k, v)",
        (keys, values),
    ).fetchone()
    assert got[:2] == (at_extreme(rows, max), at_extreme(rows, min))
    assert got[2] == got[3]


def at_extreme(rows, extreme):
    keyed = [(k, v) for k, v in rows if k is not None]
    if not keyed:
        return None
    best = extreme(k for k, _ in keyed)
    values = [v for k, v in keyed if k == best and v is not None]
    return min(values) if values else None
