"""streamviews 1.4 to 1.7 (pgext/): freq and bloom_contains of a literal, bucket_agg, dist_cdf, hll_agg.

PipelineDB's users write freq(f, '42') with an untyped literal, which PostgreSQL cannot resolve
against freq(bytea, anyelement): the text overload takes it and reads it as the type the sketch
counts (bloom_contains, whose filter has no type, hashes the text as written). bucket_add and
bucket_merge keep each distinct value in the bucket of its latest row (or greatest ts), whatever
the batches. dist_cdf interpolates as PipelineDB did: never decreasing, and within one value's share
of the exact answer over a digest that keeps every value. hll_agg over a table is the sketch a view
keeps. Checked in rolled-back transactions.
"""

from __future__ import annotations

import struct

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


@pytest.fixture
def db(stack, pg):
    with pg("sv_owner", autocommit=True) as conn, conn.transaction(force_rollback=True):
        yield conn


def one(db, query, params=()):
    return db.execute(query, params).fetchone()


def test_an_untyped_literal_is_read_as_the_type_the_sketch_counts(db):
    ints = "streamviews.freq_add(NULL, ARRAY[42, 42, 7], 0.002, 0.995)"
    texts = "streamviews.freq_add(NULL, ARRAY['00', '0', '00'], 0.002, 0.995)"
    assert one(db, f"SELECT freq({ints}, '42'), freq({ints}, '042'), freq({ints}, 42), freq({ints}, 7::bigint)") == (
        2,
        2,
        2,
        1,
    )
    assert one(db, f"SELECT freq({texts}, '00'), freq({texts}, '0'), freq({texts}, 'x')") == (2, 1, 0)


def test_a_bloom_filter_takes_an_untyped_literal_as_the_text_it_hashes(db):
    words = "streamviews.bloom_add(NULL, ARRAY['hello', 'world'], 0.02, 1000)"
    ints = "streamviews.bloom_add(NULL, ARRAY[42, 7], 0.02, 1000)"
    row = one(
        db, f"SELECT bloom_contains({words}, 'hello'), bloom_contains({words}, 'nope'), bloom_contains({ints}, '42')"
    )
    assert row == (True, False, True)


def test_the_aggregate_and_a_merge_keep_the_type(db):
    merged = "streamviews.freq_merge(NULL, (SELECT freq_agg(x) FROM generate_series(1, 5) AS x))"
    assert one(db, f"SELECT freq({merged}, '03'), freq({merged}, '6')") == (1, 0)


def test_a_literal_that_is_not_of_the_sketchs_type_fails_as_a_cast_would(db):
    with pytest.raises(psycopg.errors.InvalidTextRepresentation):
        db.execute("SELECT freq(streamviews.freq_add(NULL, ARRAY[1], 0.002, 0.995), 'one')")


def buckets(db, state):
    return one(
        db,
        "SELECT bucket_ids(s), bucket_cardinalities(s), bucket_cardinality(s, 1::smallint)"
        f" FROM (SELECT {state} AS s) AS t",
    )


def test_the_latest_row_of_a_value_decides_its_bucket(db):
    first = "streamviews.bucket_add(NULL, ARRAY[0, 1, 1], ARRAY[0, 0, 1]::int2[], NULL)"
    later = f"streamviews.bucket_add({first}, ARRAY[0, 2, NULL], ARRAY[1, 2, 3]::int2[], NULL)"
    assert buckets(db, first) == ([0, 1], [1, 1], 1)
    assert buckets(db, later) == ([1, 2], [2, 1], 2)  # 0 moved to 1; a NULL value counts nowhere


def test_a_timed_state_keeps_the_bucket_of_the_greatest_time_whatever_the_merge_order(db):
    def state(x, b, ts):
        return f"streamviews.bucket_add(NULL, ARRAY[{x}], ARRAY[{b}]::int2[], ARRAY[to_timestamp({ts})])"

    a, b = state(5, 1, 10), state(5, 2, 9)
    assert buckets(db, f"streamviews.bucket_merge({a}, {b})") == ([1], [1], 1)
    assert buckets(db, f"streamviews.bucket_merge({b}, {a})") == ([1], [1], 1)
    assert one(db, "SELECT streamviews.bucket_merge(NULL, NULL) IS NULL")[0]


def test_timed_and_untimed_states_do_not_merge(db):
    untimed = "streamviews.bucket_add(NULL, ARRAY[1], ARRAY[1]::int2[], NULL)"
    timed = "streamviews.bucket_add(NULL, ARRAY[1], ARRAY[1]::int2[], ARRAY[now()])"
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="do not merge"):
        db.execute(f"SELECT streamviews.bucket_merge({untimed}, {timed})")


def cdf(db, values, points):
    """dist_cdf of a digest of `values` (as a view's batch builds it) at each of `points`."""
    query = (
        "SELECT array_agg(dist_cdf(d, p) ORDER BY o)"
        " FROM (SELECT tdigest_add(NULL::tdigest, %s::float8[], 100) AS d) AS t,"
        " unnest(%s::float8[]) WITH ORDINALITY AS u(p, o)"
    )
    return one(db, query, (values, points))[0]


def test_dist_cdf_interpolates_as_pipelinedb_did(db):
    values = list(range(1, 1000, 10))  # PipelineDB's cont_dist_agg, group 1: 1, 11, ..., 991
    assert [round(c, 6) for c in cdf(db, values, [0, 1, 10, 50, 500, 991, 2000])] == [0, 0, 0.014, 0.054, 0.504, 1, 1]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(-50, 50), min_size=1, max_size=60), st.lists(st.integers(-60, 60), min_size=1, max_size=10))
def test_dist_cdf_never_decreases_and_stays_within_a_value_of_the_exact_share(db, values, points):
    points = sorted(points)
    got = cdf(db, values, points)
    assert got == sorted(got)  # no saw-tooth: the tdigest extension's own added 0.5/N past each centroid
    for p, c in zip(points, got, strict=True):
        share = sum(v <= p for v in values) / len(values)
        assert 0 <= c <= 1
        assert abs(c - share) <= 1 / len(values) + 1e-9, (p, c, share)


def test_hll_agg_over_a_table_is_the_sketch_a_view_keeps(db):
    row = one(
        db,
        "SELECT hll_agg(x) = hll_add_agg(hll_hash_any(x), 14), hll_log2m(hll_agg(x)),"
        " (SELECT hll_agg(v) IS NULL FROM (VALUES (NULL::int)) AS n(v)) FROM generate_series(1, 5000) AS x",
    )
    assert row == (True, 14, True)


@pytest.mark.parametrize(
    ("call", "state"),
    [
        # bucket_agg: n such that n * 24 wraps around to 0; then an entry whose bucket is no smallint
        ("bucket_ids", struct.pack("=IIQ", 0x424B5431, 0, 2**61)),
        ("bucket_ids", struct.pack("=IIQqqq", 0x424B5431, 0, 1, 5, 0, 1 << 40)),
        # Bloom: m + 7 wraps around; count-min: depth x width far past the counters there are
        ("bloom_cardinality", struct.pack("=IIQ", 0x424C4F31, 3, 2**64 - 1)),
        ("freq_total", struct.pack("=IIIIq", 0x434D5331, 2**31, 2**31, 0, 0)),
    ],
)
def test_a_crafted_state_is_refused_not_read_past_its_end(db, call, state):
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="not a"):
        db.execute(f"SELECT {call}(%s::bytea)", (state,))  # call: one of this file's constants
