"""PipelineDB's reads of a topk_agg (migration 0035): topk(t) rows, topk_values(t) arrays, ties in its order.

PipelineDB's filtered space-saving listed equal counts in the order the values reached them (an
increment moves a value up only past smaller counts); a summary here keeps that order across
batches, so a view fed one event at a time lists ties exactly as PipelineDB did. The oracle is that
rule simulated here over the same events, while the summary's capacity holds every value (exact).
Each test runs the migration's text in a rolled-back transaction, over this checkout's functions.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from pipelines.dbsetup import SQL_DIR

MIGRATION = SQL_DIR / "migrations" / "0035_pipelinedb_aggregate_forms.sql"
PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture
def db(stack, pg):
    with pg("sv_owner", autocommit=True) as conn, conn.transaction(force_rollback=True):
        conn.execute(MIGRATION.read_text())
        yield conn


def jsonb(summary):
    return None if summary is None else Jsonb(summary)


def summarized(db, events, weights=None):
    """The summary of one-event batches, each added as a view adds a batch (capacity 100: exact here)."""
    summary = None
    for i, x in enumerate(events):
        if weights is None:
            row = db.execute("SELECT cv.topk_add(%s, ARRAY[%s]::bigint[], 100)", (jsonb(summary), x))
        else:
            row = db.execute(
                "SELECT cv.topk_add_weighted(%s, ARRAY[%s]::bigint[], ARRAY[%s]::bigint[], 100)",
                (jsonb(summary), x, weights[i]),
            )
        summary = row.fetchone()[0]
    return summary


def space_saving_order(events, weights=None):
    """PipelineDB's order: counts descending; an increment passes only strictly smaller counts."""
    entries: list[list[int]] = []
    for i, x in enumerate(events):
        w = 1 if weights is None else weights[i]
        at = next((j for j, e in enumerate(entries) if e[0] == x), None)
        if at is None:
            entries.append([x, 0])
            at = len(entries) - 1
        entries[at][1] += w
        while at > 0 and entries[at][1] > entries[at - 1][1]:
            entries[at - 1], entries[at] = entries[at], entries[at - 1]
            at -= 1
    return [tuple(e) for e in entries]


def topk_rows(db, summary, k):
    return db.execute("SELECT value, frequency FROM topk(cv.topk_top(%s, %s))", (jsonb(summary), k)).fetchall()


def test_topk_reads_rows_of_value_and_frequency_with_ties_in_counting_order(db):
    summary = summarized(db, [4, 5, 3, 3, 4, 4, 3])  # PipelineDB's cont_topk_agg, group b
    assert topk_rows(db, summary, 3) == [("4", 3), ("3", 3), ("5", 1)]
    (values, freqs) = db.execute(
        "SELECT topk_values(t), topk_freqs(t) FROM cv.topk_top(%s, 3) AS t", (jsonb(summary),)
    ).fetchone()
    assert (values, freqs) == (["4", "3", "5"], [3, 3, 1])


def test_topk_values_is_an_array_that_casts_to_the_values_type(db):
    row = db.execute(
        "SELECT topk_values(t)::text, topk_values(t)::int[], pg_typeof(topk_values(t))::text"
        " FROM cv.topk_top(cv.topk_add(NULL, ARRAY[1, 2, 2], 100), 3) AS t"
    ).fetchone()
    assert row == ("{2,1}", [2, 1], "text[]")
    text = db.execute("SELECT topk(cv.topk_top(cv.topk_add(NULL, ARRAY['a b', 'a b', 'c'], 100), 3))::text").fetchall()
    assert text == [('("a b",2)',), ("(c,1)",)]  # as psql prints PipelineDB's rows


def test_a_summary_of_nothing_reads_as_no_rows_and_null(db):
    assert db.execute("SELECT * FROM topk(NULL)").fetchall() == []
    assert db.execute("SELECT topk_values(NULL), topk_values('[]')").fetchone() == (None, [])


@PROPERTY
@given(st.lists(st.integers(0, 6), max_size=40))
def test_one_event_batches_list_ties_as_pipelinedb_did(db, events):
    expected = space_saving_order(events)
    assert topk_rows(db, summarized(db, events), 10) == [(str(x), n) for x, n in expected]


@PROPERTY
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(1, 4)), max_size=30))
def test_weighted_one_event_batches_list_ties_as_pipelinedb_did(db, pairs):
    events, weights = [x for x, _ in pairs], [w for _, w in pairs]
    expected = space_saving_order(events, weights)
    assert topk_rows(db, summarized(db, events, weights), 10) == [(str(x), n) for x, n in expected]


@PROPERTY
@given(st.lists(st.integers(0, 6), max_size=40), st.sets(st.integers(0, 40), max_size=5))
def test_any_batching_gives_the_exact_counts(db, events, cuts):
    bounds = sorted({0, len(events), *(c for c in cuts if c <= len(events))})
    summary = None
    for a, b in itertools.pairwise(bounds):
        summary = db.execute("SELECT cv.topk_add(%s, %s::bigint[], 100)", (jsonb(summary), events[a:b])).fetchone()[0]
    got = dict(topk_rows(db, summary, 10))
    assert got == {str(x): events.count(x) for x in set(events)}
