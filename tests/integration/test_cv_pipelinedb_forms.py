"""PipelineDB's aggregate forms in a view equal the answer over the stream's rows, whatever the batching.

The oracle is PostgreSQL's own aggregate where one exists, over the same rows in a temporary table
named like the stream: `hll_cardinality(hll_add_agg(hll_hash_any(x), 14))` for hll_agg (2^14
registers, PipelineDB's; expressions over it included), json_object_agg and jsonb_object_agg.
bucket_agg has none: its answer (each distinct value in the bucket of its latest row, or of its
greatest ts) is computed here. Rows of one batch come in no order a view promises, so the generated
batches never hold two rows of a value that the answer would have to order (a key of
jsonb_object_agg, a value of untimed bucket_agg).
"""

from __future__ import annotations

import itertools
import json
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.cv.frontend.pipelinedb_calls import APPEND_MAX_VALUES
from tests.integration.conftest import apply_rows, as_stream_table, throwaway_views, unique

COLUMNS = "g bigint, x bigint, k text, v int, b int, ts bigint"
VIEW = """
    SELECT g, hll_agg(x) AS hx, hll_cardinality(hll_agg(x)) AS nx,
           hll_cardinality(hll_agg(x)) + hll_cardinality(hll_agg(k)) AS nxk,
           json_object_agg(k, v) AS jo, jsonb_object_agg(k, v) AS jbo,
           bucket_agg(x, b::smallint) AS latest, bucket_agg(x, b::smallint, to_timestamp(ts)) AS timed
    FROM {stream} GROUP BY g"""
ORACLE = """
    SELECT g, hll_cardinality(hll_add_agg(hll_hash_any(x), 14)) AS nx,
           hll_cardinality(hll_add_agg(hll_hash_any(x), 14)) + hll_cardinality(hll_add_agg(hll_hash_any(k), 14)) AS nxk,
           (json_object_agg(k, v) FILTER (WHERE k IS NOT NULL))::text AS jo
    FROM {stream} GROUP BY g"""
BUCKETS = "SELECT g, bucket_ids({0}), bucket_cardinalities({0}), bucket_cardinality({0}, 1::smallint) FROM {1}"


@pytest.fixture(scope="module")
def streams(stack, pg):
    name = unique("pdbforms")
    events = f"{name}_events"
    definitions = f"""
        CREATE STREAM {events} ({COLUMNS}) WITH (topic = '{events}');
        CREATE CONTINUOUS VIEW {name}.forms AS {VIEW.format(stream=events)};
    """
    with throwaway_views(pg, name, [events], definitions):
        yield {"schema": name, "events": events}


def rows_of(conn, query, params=()):
    result = conn.execute(query, params)
    return {r[0]: dict(zip([d.name for d in result.description], r, strict=True)) for r in result}


@st.composite
def batches(draw: st.DrawFn) -> list[list[tuple]]:
    """Batches of (group, x, k, v, bucket, ts): within a batch each (group, x) and (group, k) at most once."""
    out, ts = [], itertools.count(draw(st.integers(0, 100)))
    for _ in range(draw(st.integers(1, 4))):
        rows = draw(
            st.lists(
                st.tuples(
                    st.integers(0, 2),
                    st.integers(0, 6),
                    st.sampled_from(["a", "b", "c", None]),
                    st.one_of(st.none(), st.integers(-5, 5)),
                    st.integers(0, 3),
                ),
                max_size=12,
                unique_by=(lambda r: (r[0], r[1]), lambda r: (r[0], r[2]) if r[2] is not None else object()),
            )
        )
        out.append([(g, x, k, v, b, next(ts) * 7 % 101) for g, x, k, v, b in rows])
    return out


def latest_buckets(rows, timed):
    """bucket_agg's answer: each x in the bucket of its last row (timed: of its greatest ts)."""
    at: dict[int, tuple[int, int]] = {}
    for order, (_, x, _, _, b, ts) in enumerate(rows):
        rank = ts if timed else order
        if x not in at or rank >= at[x][0]:
            at[x] = (rank, b)
    counts = Counter(b for _, b in at.values())
    return sorted(counts), [counts[b] for b in sorted(counts)], counts[1]


example = itertools.count(1)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batched=batches())
def test_the_forms_equal_the_answer_over_the_rows_whatever_the_batching(writer, streams, batched):
    base = next(example) * 10
    batched = [[(base + g, *rest) for g, *rest in batch] for batch in batched]
    for batch in batched:
        if batch:
            apply_rows(writer, streams["events"], [1] * len(batch), batch)
    rows = [r for batch in batched for r in batch]
    groups = [base + g for g in range(3)]
    got = rows_of(
        writer, f"SELECT g, nx, nxk, jo::text AS jo, jbo FROM {streams['schema']}.forms WHERE g = ANY(%s)", (groups,)
    )
    with writer.transaction(force_rollback=True):
        as_stream_table(writer, streams["events"], COLUMNS, rows)
        expected = rows_of(writer, ORACLE.format(stream=streams["events"]))
    assert set(got) == set(expected)
    for g, e in expected.items():
        view = got[g]
        assert (view["nx"], view["nxk"]) == (e["nx"], e["nxk"])
        # json keeps every pair, as PostgreSQL's; jsonb the value of a key's last row.
        assert sorted(_pairs(view["jo"]), key=repr) == sorted(_pairs(e["jo"]), key=repr)
        mine = [r for r in rows if r[0] == g]
        last = {k: v for _, _, k, v, _, _ in mine if k is not None}
        assert view["jbo"] == (last or None)
        (_, ids, cards, one) = writer.execute(
            BUCKETS.format("latest", f"{streams['schema']}.forms WHERE g = %s"), (g,)
        ).fetchone()
        assert (ids, cards, one) == latest_buckets(mine, timed=False)
        (_, ids, cards, one) = writer.execute(
            BUCKETS.format("timed", f"{streams['schema']}.forms WHERE g = %s"), (g,)
        ).fetchone()
        assert (ids, cards, one) == latest_buckets(mine, timed=True)


def _pairs(text):
    """A json object's pairs, duplicates kept (json_object_agg writes every pair): read from its text."""
    return [] if text is None else [tuple(p) for p in json.loads(text, object_pairs_hook=list)]


def test_a_value_moved_to_another_bucket_leaves_the_first(writer, streams):
    g = 999_000
    for x, b in [(0, 0), (0, 1), (1, 0)]:  # PipelineDB's bucket_agg case: 0 moves to bucket 1, then 1 comes to 0
        apply_rows(writer, streams["events"], [1], [(g, x, None, None, b, 1)])
    row = writer.execute(BUCKETS.format("latest", f"{streams['schema']}.forms WHERE g = %s"), (g,)).fetchone()
    assert row[1:3] == ([0, 1], [1, 1])


def test_a_timed_bucket_agg_keeps_the_bucket_of_the_latest_time_not_the_latest_row(writer, streams):
    g = 998_000
    for b, ts in [(0, 1), (1, 0), (2, 2)]:  # PipelineDB's bucket3: an earlier ts does not move the value
        apply_rows(writer, streams["events"], [1], [(g, 7, None, None, b, ts)])
        row = writer.execute(BUCKETS.format("timed", f"{streams['schema']}.forms WHERE g = %s"), (g,)).fetchone()
        assert row[1] == [0 if b != 2 else 2]


def test_hll_agg_keeps_pipelinedbs_error_bound(writer, streams):
    g, n = 997_000, 20_000
    for start in range(0, n, 5_000):
        rows = [(g, x, None, None, 0, 0) for x in range(start, start + 5_000)]
        apply_rows(writer, streams["events"], [1] * len(rows), rows)
    log2m, estimate = writer.execute(
        f"SELECT hll_log2m(hx), hll_cardinality(hx) FROM {streams['schema']}.forms WHERE g = %s", (g,)
    ).fetchone()
    assert log2m == 14
    assert abs(estimate - n) <= 3 * 0.0081 * n  # three standard errors of 1.04 / sqrt(2^14)


def test_an_object_aggregate_keeps_the_first_pairs_of_a_group_up_to_the_cap(writer, streams):
    g = 996_000
    keys = [f"k{i}" for i in range(APPEND_MAX_VALUES + 5)]
    for part in (keys[:600], keys[600:]):  # two batches: the cap cuts the second
        rows = [(g, None, k, int(k[1:]), 0, 0) for k in part]
        apply_rows(writer, streams["events"], [1] * len(rows), rows)
    pairs, object_ = writer.execute(
        f"SELECT jo::text, jbo FROM {streams['schema']}.forms WHERE g = %s", (g,)
    ).fetchone()
    pairs = _pairs(pairs)
    assert len(pairs) == len(object_) == APPEND_MAX_VALUES
    assert all(v == int(k[1:]) for k, v in pairs)  # keys and values stay side by side
    assert pairs[:600] == [(k, int(k[1:])) for k in keys[:600]]
