"""PipelineDB's aggregates in a view equal the exact answer over the stream's rows, whatever the batching.

The oracle is PostgreSQL's own aggregate where one exists (array_agg, string_agg, json_agg,
array_agg(DISTINCT), hll_union_agg, `(array_agg(x ORDER BY x))[1:n]` for first_values), computed
over the same rows in a temporary table named like the stream; keyed_max/min and the weighted top-K
are checked against answers computed here. Collecting aggregates keep arrival order between
batches only (PostgreSQL's own array_agg promises no order without ORDER BY): they are compared as
multisets. The weighted top-K must stay within W/(capacity+1) of each value's true weight.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.cv import catalog
from pipelines.cv.frontend.aggregate_calls import topk_capacity
from pipelines.cv.frontend.pipelinedb_calls import APPEND_MAX_VALUES
from pipelines.cv.model import DefinitionError
from tests.integration.conftest import apply_rows, as_stream_table, throwaway_views, unique

COLUMNS = "g bigint, k bigint, x bigint, t text, w int"
VIEW = """
    SELECT g, keyed_max(k, x) AS kmax, keyed_min(k, t) AS kmin,
           first_values(3) WITHIN GROUP (ORDER BY x) AS lo3, first_values(2) WITHIN GROUP (ORDER BY x DESC) AS hi2,
           first_values(2, t) AS t2, set_agg(x) AS xs, set_cardinality(set_agg(x)) AS n_xs,
           array_agg(x) AS all_x, string_agg(t, ',') AS ts, json_agg(x) AS jx, jsonb_agg(t) FILTER (WHERE x > 0) AS jt,
           topk_agg(t, 2, w) AS top_t, topk_values(topk_agg(t, 2, w)) AS top_values,
           topk_freqs(topk_agg(t, 2, w)) AS top_freqs
    FROM {stream} GROUP BY g"""
ORACLE = """
    SELECT g, (array_agg(x ORDER BY x))[1:3] AS lo3, (array_agg(x ORDER BY x DESC))[1:2] AS hi2,
           (array_agg(t ORDER BY t))[1:2] AS t2, array_agg(DISTINCT x) AS xs,
           count(DISTINCT x) + max((x IS NULL)::int) AS n_xs,
           array_agg(x) AS all_x, string_agg(t, ',') AS ts, json_agg(x) AS jx, jsonb_agg(t) FILTER (WHERE x > 0) AS jt
    FROM {stream} GROUP BY g"""


SKETCHES = """
    SELECT g, bloom_agg(x) AS xb, bloom_contains(bloom_agg(x), 3) AS has3, freq_agg(t) AS tf,
           freq(freq_agg(t), 'a'::text) AS fa, dist_agg(x) AS xd, dist_quantile(dist_agg(x), 0.5) AS med,
           dist_cdf(dist_agg(x), 0) AS below0, count(x) AS n
    FROM {stream} GROUP BY g"""


@pytest.fixture(scope="module")
def streams(stack, pg):
    name = unique("pdbagg")
    events, hlls, timed = f"{name}_events", f"{name}_hlls", f"{name}_timed"
    definitions = f"""
        CREATE STREAM {events} ({COLUMNS}) WITH (topic = '{events}');
        CREATE STREAM {hlls} (g bigint, h text) WITH (topic = '{hlls}');
        CREATE CONTINUOUS VIEW {name}.pdb AS {VIEW.format(stream=events)};
        CREATE CONTINUOUS VIEW {name}.sketches AS {SKETCHES.format(stream=events)};
        CREATE STREAM {timed} (g bigint, x bigint, ts timestamptz) WITH (topic = '{timed}');
        CREATE CONTINUOUS VIEW {name}.recent AS
            SELECT g, bloom_agg(x) AS b, freq_agg(x) AS f, dist_agg(x) AS d FROM {timed}
            WHERE ts > clock_timestamp() - interval '1 hour' GROUP BY g;
        CREATE CONTINUOUS VIEW {name}.unions AS
            SELECT g, hll_cardinality(hll_union_agg(h::hll)) AS n, hll_union_agg(h::hll) AS h FROM {hlls} GROUP BY g;
    """
    with throwaway_views(pg, name, [events, hlls, timed], definitions):
        yield {"schema": name, "events": events, "hlls": hlls, "timed": timed}


def rows_of(conn, query, params=()):
    result = conn.execute(query, params)
    return {r[0]: dict(zip([d.name for d in result.description], r, strict=True)) for r in result}


def keyed(rows, extreme):
    """keyed_max/min(k, v) as documented: v at the extreme non-NULL k; a tie of keys keeps the least v."""
    with_key = [(k, v) for k, v in rows if k is not None]
    if not with_key:
        return None
    best = (max if extreme == "max" else min)(k for k, _ in with_key)
    values = [v for k, v in with_key if k == best and v is not None]
    return min(values) if values else None


def sorted_or_none(values):
    return None if values is None else sorted(values, key=lambda v: (v is None, v))


event = st.tuples(
    st.integers(0, 2),  # group
    st.one_of(st.none(), st.integers(0, 5)),  # k: ties and NULL keys
    st.one_of(st.none(), st.integers(-20, 20)),
    st.one_of(st.none(), st.sampled_from(["a", "b", "c", "dd", ""])),
    st.one_of(st.none(), st.integers(-2, 9)),  # weights, some not positive
)
example = itertools.count(1)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=st.lists(event, max_size=40), cuts=st.lists(st.integers(0, 40), max_size=4))
def test_pipelinedb_aggregates_equal_the_exact_answer_whatever_the_batching(writer, streams, events, cuts):
    base = next(example) * 10
    rows = [(base + g, k, x, t, w) for g, k, x, t, w in events]
    bounds = sorted({0, len(rows), *(c for c in cuts if c <= len(rows))})
    for start, end in itertools.pairwise(bounds):
        batch = rows[start:end]
        apply_rows(writer, streams["events"], [1] * len(batch), batch)
    groups = [base + g for g in range(3)]
    got = rows_of(writer, f"SELECT * FROM {streams['schema']}.pdb WHERE g = ANY(%s)", (groups,))
    with writer.transaction(force_rollback=True):
        as_stream_table(writer, streams["events"], COLUMNS, rows)
        expected = rows_of(writer, ORACLE.format(stream=streams["events"]))
    assert set(got) == set(expected)
    for g, e in expected.items():
        v, mine = got[g], [r for r in rows if r[0] == g]
        assert v["kmax"] == keyed([(k, x) for _, k, x, _, _ in mine], "max")
        assert v["kmin"] == keyed([(k, t) for _, k, _, t, _ in mine], "min")
        assert (v["lo3"], v["hi2"], v["t2"]) == (e["lo3"], e["hi2"], e["t2"])
        assert sorted_or_none(v["xs"]) == sorted_or_none(e["xs"])
        assert v["n_xs"] == e["n_xs"]
        assert sorted_or_none(v["all_x"]) == sorted_or_none(e["all_x"])
        assert sorted_or_none(v["jx"]) == sorted_or_none(e["jx"])
        assert sorted_or_none(v["jt"]) == sorted_or_none(e["jt"])
        assert sorted_or_none(v["ts"] and v["ts"].split(",")) == sorted_or_none(e["ts"] and e["ts"].split(","))
        weights = Counter()
        for _, _, _, t, w in mine:
            if t is not None and w is not None and w > 0:
                weights[t] += w
        assert_topk_within_bound(v["top_t"], weights, k=2)
        check_sketches(writer, streams["schema"], g, mine)
        if v["top_t"] is None:  # no positive weight yet: NULL, as topk_agg over no values
            assert (v["top_values"], v["top_freqs"]) == (None, None)
        else:
            assert v["top_values"] == [e["value"] for e in v["top_t"]]
            assert v["top_freqs"] == [e["count"] for e in v["top_t"]]


def check_sketches(writer, schema, group, mine):
    """bloom_agg, freq_agg and dist_agg of one group against its rows, within PipelineDB's bounds."""
    xs = sorted(x for _, _, x, _, _ in mine if x is not None)
    ts = Counter(t for _, _, _, t, _ in mine if t is not None)
    row = writer.execute(
        f"SELECT has3, fa, med, below0, n, (SELECT bool_and(bloom_contains(xb, v)) FROM unnest(%s::bigint[]) AS v),"
        f" (SELECT array_agg(freq(tf, v) ORDER BY v) FROM unnest(%s::text[]) AS v) FROM {schema}.sketches WHERE g = %s",
        (xs, sorted(ts), group),
    ).fetchone()
    if row is None:
        return
    has3, fa, med, below0, n, all_in, counts = row
    assert n == len(xs)
    assert all_in is not False  # a Bloom filter never misses a value it was given
    assert has3 or 3 not in xs
    eps_n = 0.002 * sum(ts.values())  # freq_agg's default eps: over by at most eps * N (w.p. 0.995 each)
    for value, estimate in zip(sorted(ts), counts or [], strict=True):
        assert ts[value] <= estimate <= ts[value] + max(eps_n, 0)
    assert ts["a"] <= (fa or 0) <= ts["a"] + eps_n
    if xs:  # dist_agg: a t-digest of 100 centroids keeps these few values exactly, interpolated
        assert xs[0] <= med <= xs[-1]
        assert abs(below0 - sum(x <= 0 for x in xs) / len(xs)) <= 1 / len(xs) + 1e-9
    else:
        assert (med, below0) == (None, None)


def assert_topk_within_bound(top, weights, k):
    """Each estimate within W/(capacity+1) below the true weight, never above; the k heaviest present if clear."""
    bound = sum(weights.values()) / (topk_capacity(k) + 1)
    for entry in top or []:
        assert weights[entry["value"]] - bound <= entry["count"] <= weights[entry["value"]]
    assert len(top or []) == min(k, len(weights))


def test_a_collecting_aggregate_keeps_the_first_values_of_a_group_up_to_its_cap(writer, streams):
    g = 999_000
    first, second = list(range(APPEND_MAX_VALUES - 5)), list(range(10_000, 10_020))
    apply_rows(writer, streams["events"], [1] * len(first), [(g, None, x, None, None) for x in first])
    apply_rows(writer, streams["events"], [1] * len(second), [(g, None, x, None, None) for x in second])
    (all_x,) = writer.execute(f"SELECT all_x FROM {streams['schema']}.pdb WHERE g = %s", (g,)).fetchone()
    assert len(all_x) == APPEND_MAX_VALUES
    assert all_x[: len(first)] == first  # batches in arrival order; the values past the cap are dropped
    assert set(all_x[len(first) :]) <= set(second)


def test_keyed_min_max_follow_pipelinedbs_regression_case(writer, streams):
    g = 998_000
    minutes = [1, 3, 4, 2, 6, 5]  # PipelineDB's keyed_min_max1: the first and last value by time, not arrival
    for minute in minutes:
        apply_rows(writer, streams["events"], [1], [(g, minute, minute * 10, f"v{minute}", None)])
    row = writer.execute(f"SELECT kmax, kmin FROM {streams['schema']}.pdb WHERE g = %s", (g,)).fetchone()
    assert row == (60, "v1")


def test_hll_union_agg_equals_the_union_of_the_same_sketches(writer, streams):
    base = 997_000
    sketches = writer.execute(
        "SELECT g, hll_add_agg(hll_hash_bigint(x))::text FROM generate_series(1, 600) AS x,"
        " LATERAL (SELECT %s + x %% 3 AS g) AS gg GROUP BY g, x / 50",
        (base,),
    ).fetchall()
    for start in range(0, len(sketches), 5):
        batch = sketches[start : start + 5]
        apply_rows(writer, streams["hlls"], [1] * len(batch), batch)
    got = rows_of(writer, f"SELECT g, n FROM {streams['schema']}.unions WHERE g >= %s ORDER BY g", (base,))
    with writer.transaction(force_rollback=True):
        as_stream_table(writer, streams["hlls"], "g bigint, h text", sketches)
        expected = rows_of(
            writer,
            f"SELECT g, hll_cardinality(hll_union_agg(h::hll)) AS n FROM {streams['hlls']} GROUP BY g ORDER BY g",
        )
    assert got == expected
    for g, row in got.items():
        assert abs(row["n"] - 200) <= 200 * 3 * 1.04 / 2**5.5, g  # within 3 standard errors (log2m 11)


def test_json_agg_reads_as_json_and_jsonb_agg_as_jsonb(writer, streams):
    g = 996_000
    apply_rows(writer, streams["events"], [1, 1], [(g, 1, 5, "x", 1), (g, 2, -1, "y", 1)])
    row = writer.execute(
        f"SELECT pg_typeof(jx)::text, pg_typeof(jt)::text, jt FROM {streams['schema']}.pdb WHERE g = %s", (g,)
    ).fetchone()
    assert row[:2] == ("json", "jsonb")
    assert row[2] == ["x"]
    assert json.dumps(row[2]) == '["x"]'


def test_sketches_in_a_sliding_window_merge_its_steps_on_read(writer, streams):
    now = writer.execute("SELECT now()").fetchone()[0]
    for batch in ([1, 2, 2], [3, 2], [100]):
        apply_rows(writer, streams["timed"], [1] * len(batch), [(1, x, now) for x in batch])
    row = writer.execute(
        "SELECT bloom_contains(b, 3), bloom_contains(b, 4), freq(f, 2), dist_quantile(d, 0), dist_quantile(d, 1)"
        f" FROM {streams['schema']}.recent WHERE g = 1"
    ).fetchone()
    assert row == (True, False, 3, 1.0, 100.0)


def test_a_keyed_value_without_an_ordering_is_refused_saying_why(pg, streams):
    statement = (
        f"CREATE CONTINUOUS VIEW {streams['schema']}.nope AS"
        f" SELECT g, keyed_max(k, to_json(t)) AS j FROM {streams['events']} GROUP BY g"
    )
    with pg("sv_owner", autocommit=True) as owner, pytest.raises(DefinitionError, match="needs an ordering"):
        catalog.define(owner, statement)
