"""Top-K summaries in SQL (migrations 0009 and 0035): exact while the values fit, within N/(capacity+1) after.

Each test runs the migrations' text in a transaction that is rolled back, so it checks this
checkout's functions whether or not the database has applied them yet; the one test that needs
another role's session uses the applied migrations (the `stack` fixture applies them). Equal counts
keep the order values reached them (0035; test_topk_reads_sql.py checks that order against PipelineDB's).
"""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from pipelines.cv.frontend.aggregate_calls import topk_capacity
from pipelines.dbsetup import SQL_DIR
from tests.integration.conftest import unique

MIGRATIONS = [
    SQL_DIR / "migrations" / name for name in ("0009_topk_summaries.sql", "0035_pipelinedb_aggregate_forms.sql")
]
PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
# Zipf-like: 1 about half the time, 2 a sixth, ... up to 300 rarely; heavy hitters and a long tail.
SKEWED = st.integers(1, 300).map(lambda r: 300 // r)
CAPACITIES = st.integers(1, 6)


@pytest.fixture
def db(pg):
    """The owner role inside a transaction that is rolled back, with the migrations' functions."""
    with pg("sv_owner", autocommit=True) as conn, conn.transaction(force_rollback=True):
        for migration in MIGRATIONS:
            conn.execute(migration.read_text())
        yield conn


@st.composite
def batched_streams(draw: st.DrawFn) -> tuple[list[int], list[list[int]]]:
    """A stream of values and the same stream cut into batches at random places."""
    stream = draw(st.lists(SKEWED, max_size=200))
    cuts = sorted(draw(st.sets(st.integers(0, len(stream)), max_size=8)))
    bounds = [0, *cuts, len(stream)]
    return stream, [stream[a:b] for a, b in pairwise(bounds)]


def add(db, summary, batch, capacity, sql_type="bigint"):
    """cv.topk_add; `sql_type` is one of this file's constants, never test data."""
    query = f"SELECT cv.topk_add(%s, %s::{sql_type}[], %s)"
    return db.execute(query, (jsonb(summary), batch, capacity)).fetchone()[0]


def merge(db, a, b, capacity):
    return db.execute("SELECT cv.topk_merge(%s, %s, %s)", (jsonb(a), jsonb(b), capacity)).fetchone()[0]


def top(db, summary, k):
    return db.execute("SELECT cv.topk_top(%s, %s)", (jsonb(summary), k)).fetchone()[0]


def jsonb(summary):
    return None if summary is None else Jsonb(summary)


def summarize(db, batches, capacity):
    summary = None
    for batch in batches:
        summary = add(db, summary, batch, capacity)
    return summary


def assert_within_bound(summary, stream, capacity):
    """Misra-Gries: true - N/(capacity+1) <= estimate <= true for every value, at most `capacity` kept.

    Checked in the tighter form Agarwal et al. prove, with N less the counts kept, which also catches
    a trim that drops values without taking the cut from the others. A value left out reads 0, so
    one seen more than N/(capacity+1) times is necessarily present.
    """
    truth = Counter(stream)
    entries = summary or []
    estimates = {value: count for value, count in entries}
    slack = (len(stream) - sum(estimates.values())) / (capacity + 1)
    assert len(estimates) <= capacity
    assert all(count > 0 for count in estimates.values())
    assert set(estimates) <= set(truth)
    for value, true in truth.items():
        assert true - slack <= estimates.get(value, 0) <= true, (value, true, estimates.get(value), slack)
    assert [count for _, count in entries] == sorted((count for _, count in entries), reverse=True)


def test_counts_are_exact_while_the_distinct_values_fit(db):
    summary = add(db, None, [3, 1, 3, 2, 3, 1], 3)
    assert summary == [[3, 3], [1, 2], [2, 1]]
    assert add(db, summary, [2, 2, 2, 1], 3) == [[2, 4], [3, 3], [1, 3]]  # 3 reached 3 before 1 did


def test_one_value_too_many_takes_the_smallest_count_from_every_count(db):
    # Counts 3, 2, 1, 1 with room for 3: the 4th largest (1) is subtracted, values at 0 leave.
    assert add(db, None, [5, 5, 5, 6, 6, 7, 8], 3) == [[5, 2], [6, 1]]
    # Equal counts beyond capacity cancel out entirely: values were seen, none is frequent.
    assert add(db, None, [1, 2, 3], 2) == []


def test_nulls_are_skipped_and_a_summary_of_nothing_is_null(db):
    assert add(db, None, [None, 4, None], 5) == [[4, 1]]
    assert add(db, None, [None, None], 5) is None
    assert add(db, None, [], 5) is None
    assert add(db, [[4, 1]], [None], 5) == [[4, 1]]
    assert top(db, None, 3) is None


def test_text_and_bigint_values_keep_their_json_types(db):
    assert add(db, None, ["1", "b", "1"], 5, "text") == [["1", 2], ["b", 1]]
    big = 2**62 + 1
    assert add(db, None, [big, 1, big], 5, "bigint") == [[big, 2], [1, 1]]
    assert merge(db, [["1", 2]], [[1, 3]], 5) == [[1, 3], ["1", 2]]  # the number 1 is not the text "1"


@PROPERTY
@given(batched_streams(), CAPACITIES)
def test_the_bound_holds_however_the_stream_is_cut_into_batches(db, stream_and_batches, capacity):
    stream, batches = stream_and_batches
    assert_within_bound(summarize(db, batches, capacity), stream, capacity)


@PROPERTY
@given(batched_streams(), batched_streams(), CAPACITIES)
def test_merging_two_summaries_keeps_the_bound_over_both_streams(db, first, second, capacity):
    merged = merge(db, summarize(db, first[1], capacity), summarize(db, second[1], capacity), capacity)
    assert_within_bound(merged, first[0] + second[0], capacity)


@PROPERTY
@given(st.lists(batched_streams(), min_size=1, max_size=5), CAPACITIES)
def test_merge_agg_equals_merging_one_summary_after_another(db, streams, capacity):
    summaries = [summarize(db, batches, capacity) for _, batches in streams]
    folded = None
    for summary in summaries:
        folded = merge(db, folded, summary, capacity)
    (aggregated,) = db.execute(
        "SELECT cv.topk_merge_agg(s, %s ORDER BY i) FROM unnest(%s::jsonb[]) WITH ORDINALITY AS t (s, i)",
        (capacity, [jsonb(s) for s in summaries]),
    ).fetchone()
    assert aggregated == folded
    assert_within_bound(aggregated, [v for stream, _ in streams for v in stream], capacity)


def test_merge_with_null_returns_the_other_side(db):
    assert merge(db, None, [[1, 2]], 5) == [[1, 2]]
    assert merge(db, [[1, 2]], None, 5) == [[1, 2]]
    assert merge(db, None, None, 5) is None
    (aggregated,) = db.execute("SELECT cv.topk_merge_agg(s, 5) FROM unnest(ARRAY[NULL, NULL]::jsonb[]) AS s").fetchone()
    assert aggregated is None


def test_the_query_role_merges_summaries_through_a_view(pg):
    """sv_reader cannot look names up in schema cv, yet a sliding window merges its steps when read."""
    schema = unique("topk")
    with pg("sv_owner", autocommit=True) as owner:
        owner.execute(f"CREATE SCHEMA {schema}")
        try:
            owner.execute(f"GRANT USAGE ON SCHEMA {schema} TO sv_reader")
            owner.execute(
                f"CREATE VIEW {schema}.steps AS SELECT cv.topk_top(cv.topk_merge_agg(s, 5), 2) AS top_x "
                "FROM (VALUES ('[[1, 2]]'::jsonb), ('[[2, 5], [1, 1]]'), (NULL)) AS steps (s)"
            )
            owner.execute(f"GRANT SELECT ON {schema}.steps TO sv_reader")
            with pg("sv_reader") as reader:
                (top_x,) = reader.execute(f"SELECT top_x FROM {schema}.steps").fetchone()
        finally:
            owner.execute(f"DROP SCHEMA {schema} CASCADE")
    assert top_x == [{"value": 2, "count": 5}, {"value": 1, "count": 3}]


def test_a_batch_merges_into_the_stored_row_on_conflict(db):
    db.execute("CREATE TEMP TABLE view_rows (g int PRIMARY KEY, top_x jsonb)")
    upsert = """
        INSERT INTO view_rows AS v (g, top_x) SELECT 1, cv.topk_add(NULL, %s::text[], 5)
        ON CONFLICT (g) DO UPDATE SET top_x = cv.topk_merge(v.top_x, excluded.top_x, 5)
    """
    for batch in (["a", "b", "a"], ["a", None], [None]):
        db.execute(upsert, (batch,))
    assert db.execute("SELECT top_x FROM view_rows").fetchone()[0] == [["a", 3], ["b", 1]]


def test_top_orders_by_count_then_first_counted_and_keeps_k(db):
    summary = add(db, None, [9, 9, 9, 4, 4, 7, 7, 2], 10)
    assert top(db, summary, 3) == [{"value": 9, "count": 3}, {"value": 4, "count": 2}, {"value": 7, "count": 2}]
    assert top(db, summary, 10) == [*top(db, summary, 3), {"value": 2, "count": 1}]
    assert top(db, [[1, 1], [2, 5]], 1) == [{"value": 2, "count": 5}]  # unordered input is sorted too
    assert top(db, [], 3) == []


@pytest.mark.parametrize("k", [1, 3, 10, 11, 50])
def test_the_capacity_rule_is_the_engines(db, k):
    assert db.execute("SELECT cv.topk_capacity(%s)", (k,)).fetchone()[0] == topk_capacity(k)
