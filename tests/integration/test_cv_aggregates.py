"""Every aggregate a view can keep equals PostgreSQL's own aggregate over the stream's rows.

The oracle is PostgreSQL itself: the stream's current rows (a keyed stream's set after its
retractions, an append-only stream's events) go into a temporary table named like the stream, and
the view's own SELECT runs over it. Exact aggregates must match to the last digits of a division
(they are kept as exact sums); approximate ones (percentiles from t-digests, top-K from Misra-Gries
summaries) must stay within their documented error.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.cv import catalog
from pipelines.cv.frontend.aggregate_calls import topk_capacity
from pipelines.cv.model import DefinitionError
from tests.integration.conftest import apply_rows, as_stream_table, throwaway_views, unique

TS = datetime(2030, 1, 1, tzinfo=UTC)
KEYED_VIEW = """
    SELECT g, avg(x) AS avg_x, avg(y) AS avg_y, stddev(x) AS sd_x, stddev_pop(y) AS sdp_y,
           variance(x) AS var_x, var_pop(y) AS varp_y, var_samp(y) AS vars_y,
           corr(y, x) AS corr_yx, covar_pop(y, x) AS covp, covar_samp(y, x) AS covs,
           regr_slope(y, x) AS slope, regr_intercept(y, x) AS icpt, regr_r2(y, x) AS r2,
           regr_count(y, x) AS rc, regr_avgx(y, x) AS ax, regr_avgy(y, x) AS ay,
           regr_sxx(y, x) AS sxx, regr_syy(y, x) AS syy, regr_sxy(y, x) AS sxy,
           bool_and(b) AS all_b, bool_or(b) AS any_b, every(b) AS every_b,
           sum(x) FILTER (WHERE b) AS sum_x_b, count(*) FILTER (WHERE x > 0) AS positive,
           sum(x) / nullif(count(*), 0) AS mean_x, count(*) AS n,
           min(x) AS lo_x, max(y) AS hi_y, max(x) FILTER (WHERE b) AS hi_x_b
    FROM {stream} GROUP BY g"""
APPEND_VIEW = """
    SELECT g, min(x) AS lo, max(x) AS hi, bit_or(x) AS bits_or, bit_and(x) AS bits_and,
           avg(y) AS avg_y, count(*) AS n
    FROM {stream} GROUP BY g"""
SKETCH_VIEW = """
    SELECT g, percentile_cont(0.5) WITHIN GROUP (ORDER BY y) AS median,
           percentile_cont(ARRAY[0.1, 0.9]) WITHIN GROUP (ORDER BY y) AS deciles,
           topk_agg(x, 3) AS top_x, approx_count_distinct(x) AS distinct_x, count(*) AS n
    FROM {stream} GROUP BY g"""


@pytest.fixture(scope="module")
def streams(stack, pg):
    name = unique("agg")
    keyed, append = f"{name}_keyed", f"{name}_events"
    definitions = f"""
        CREATE STREAM {keyed} (g bigint, k bigint, x bigint, y double precision, b boolean)
            WITH (topic = '{keyed}', key = 'g, k');
        CREATE STREAM {append} (g bigint, x bigint, y double precision) WITH (topic = '{append}');
        CREATE CONTINUOUS VIEW {name}.stats AS {KEYED_VIEW.format(stream=keyed)};
        CREATE CONTINUOUS VIEW {name}.plain AS {APPEND_VIEW.format(stream=append)};
        CREATE CONTINUOUS VIEW {name}.sketches AS {SKETCH_VIEW.format(stream=append)};
    """
    with throwaway_views(pg, name, [keyed, append], definitions):
        yield {"schema": name, "keyed": keyed, "append": append}


def recomputed(conn, stream, columns, rows, query, groups):
    """The view's own SELECT over `rows` in a temporary table named like the stream (rolled back)."""
    with conn.transaction(force_rollback=True):
        as_stream_table(conn, stream, columns, rows)
        result = conn.execute(f"SELECT * FROM ({query}) AS q WHERE g = ANY(%s) ORDER BY g", (groups,))
        return [dict(zip([d.name for d in result.description], r, strict=True)) for r in result]


def read(conn, view, groups):
    result = conn.execute(f"SELECT * FROM {view} WHERE g = ANY(%s) ORDER BY g", (groups,))
    return [dict(zip([d.name for d in result.description], r, strict=True)) for r in result]


def close(a, b):
    """Equal, or for numbers equal to 12 significant digits (both are computed with one rounding)."""
    if a is None or b is None or isinstance(a, (bool, list, str)):
        return a == b
    return math.isclose(float(a), float(b), rel_tol=1e-12, abs_tol=1e-12)


def assert_rows_close(got, expected):
    assert [list(r) for r in got] == [list(r) for r in expected]  # same columns, in declared order
    for g, e in zip(got, expected, strict=True):
        different = {k: (g[k], e[k]) for k in e if not close(g[k], e[k])}
        assert not different, (e["g"], different)


example = itertools.count(1)
keyed_event = st.tuples(
    st.sampled_from([1, 1, 1, -1]),
    st.integers(0, 2),  # group
    st.integers(0, 4),  # key within the group
    st.one_of(st.none(), st.integers(-1000, 1000)),
    st.one_of(st.none(), st.floats(-1e3, 1e3, allow_nan=False).map(lambda f: round(f, 3))),
    st.one_of(st.none(), st.booleans()),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=st.lists(keyed_event, max_size=30), cuts=st.lists(st.integers(0, 30), max_size=3))
def test_statistics_over_a_keyed_stream_equal_postgresql_after_any_retractions(writer, streams, events, cuts):
    base = next(example) * 10
    rows = [(op, base + g, k, x, y, b) for op, g, k, x, y, b in events]
    bounds = sorted({0, len(rows), *(c for c in cuts if c <= len(rows))})
    for start, end in itertools.pairwise(bounds):
        batch = rows[start:end]
        apply_rows(writer, streams["keyed"], [r[0] for r in batch], [(g, k, x, y, b) for _, g, k, x, y, b in batch])
    state = {}
    for op, g, k, x, y, b in rows:
        if op == 1 and (g, k) not in state:
            state[(g, k)] = (g, k, x, y, b)
        elif op == -1:
            state.pop((g, k), None)
    groups = [base + g for g in range(3)]
    expected = recomputed(
        writer,
        streams["keyed"],
        "g bigint, k bigint, x bigint, y double precision, b boolean",
        state.values(),
        KEYED_VIEW.format(stream=streams["keyed"]),
        groups,
    )
    assert_rows_close(read(writer, f"{streams['schema']}.stats", groups), expected)


append_event = st.tuples(st.integers(0, 2), st.integers(0, 15), st.floats(-1e3, 1e3, allow_nan=False))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=st.lists(append_event, max_size=40), cuts=st.lists(st.integers(0, 40), max_size=3))
def test_general_aggregates_over_an_append_only_stream_equal_postgresql(writer, streams, events, cuts):
    base = 1_000_000 + next(example) * 10
    rows = [(base + g, x, y) for g, x, y in events]
    bounds = sorted({0, len(rows), *(c for c in cuts if c <= len(rows))})
    for start, end in itertools.pairwise(bounds):
        apply_rows(writer, streams["append"], [1] * (end - start), rows[start:end])
    groups = [base + g for g in range(3)]
    expected = recomputed(
        writer,
        streams["append"],
        "g bigint, x bigint, y double precision",
        rows,
        APPEND_VIEW.format(stream=streams["append"]),
        groups,
    )
    assert_rows_close(read(writer, f"{streams['schema']}.plain", groups), expected)


def test_percentiles_and_top_k_stay_within_their_documented_error(writer, streams):
    """t-digest: within 1% of the value range here; top-K: Misra-Gries' N/(capacity+1); HyperLogLog."""
    g = 5_000_000
    values = [(i * 7919) % 1000 / 10 for i in range(5000)]  # 0.0 .. 99.9, evenly spread
    xs = [i % 50 if i % 3 else 7 for i in range(5000)]  # 7 is the most frequent by far
    rows = [(g, x, y) for x, y in zip(xs, values, strict=True)]
    for start in range(0, len(rows), 700):  # several batches: digests and summaries are merged
        batch = rows[start : start + 700]
        apply_rows(writer, streams["append"], [1] * len(batch), batch)

    (got,) = read(writer, f"{streams['schema']}.sketches", [g])
    assert got["n"] == 5000
    assert abs(got["median"] - 50) <= 1  # 1% of the value range at the median
    assert abs(got["deciles"][0] - 10) <= 1
    assert abs(got["deciles"][1] - 90) <= 1
    assert got["distinct_x"] == 50  # HyperLogLog is exact at this size (its error: about 1.6% at large counts)
    exact = Counter(xs)
    bound = len(xs) / (topk_capacity(3) + 1)
    assert next(entry["value"] for entry in got["top_x"]) == 7
    for entry in got["top_x"]:
        assert exact[entry["value"]] - bound <= entry["count"] <= exact[entry["value"]]


def test_a_read_view_shows_only_the_declared_columns_and_reads_by_key_through_an_index(pg, streams):
    with pg("sv_reader") as reader:
        cursor = reader.execute(f"SELECT * FROM {streams['schema']}.plain LIMIT 0")
        assert [d.name for d in cursor.description] == ["g", "lo", "hi", "bits_or", "bits_and", "avg_y", "n"]
        plan = reader.execute(f"EXPLAIN SELECT * FROM {streams['schema']}.plain WHERE g = 42").fetchall()
        assert "Index Scan" in plan[0][0], plan
        with pytest.raises(Exception, match="permission denied"):
            reader.execute(f"SELECT * FROM cv.{streams['schema']}__plain")


@pytest.mark.parametrize(
    ("select", "match"),
    [
        ("SELECT g, string_agg(x::text, x::text) AS s FROM {append} GROUP BY g", "constant delimiter"),
        ("SELECT g, percentile_disc(0.5) WITHIN GROUP (ORDER BY y) AS p FROM {append} GROUP BY g", "percentile_cont"),
        ("SELECT g, topk_agg(x, 0) AS t FROM {append} GROUP BY g", "positive integer"),
        ("SELECT g, topk_agg(x, 300000000) AS t FROM {append} GROUP BY g", "k is at most 1000"),
        ("SELECT g, percentile_cont(1.5) WITHIN GROUP (ORDER BY y) AS p FROM {append} GROUP BY g", "between 0 and 1"),
        ("SELECT g, x + count(*) AS t FROM {append} GROUP BY g", "inside an aggregate"),
        ("SELECT g, json_agg(x ORDER BY y) AS t FROM {append} GROUP BY g", "ORDER BY inside an aggregate"),
        ("SELECT g, avg(x) FILTER (WHERE count(*) > 1) AS t FROM {append} GROUP BY g", "not allowed"),
    ],
)
def test_an_aggregate_that_cannot_be_kept_is_refused_with_the_reason(pg, streams, select, match):
    statement = f"CREATE CONTINUOUS VIEW {streams['schema']}.nope AS " + select.format(append=streams["append"])
    with pg("sv_owner", autocommit=True) as owner, pytest.raises(DefinitionError, match=match):
        catalog.define(owner, statement)


@pytest.mark.parametrize(
    "select",
    [
        "SELECT g, count(*) AS n FROM {append} WHERE pg_sleep(0) IS NOT NULL GROUP BY g",
        "SELECT g, count(*) AS n FROM {append} WHERE set_config('x.y', 'z', true) = 'z' GROUP BY g",
        "SELECT g, sum(x * random()) AS n FROM {append} GROUP BY g",
    ],
)
def test_a_volatile_function_is_refused_in_a_view(pg, streams, select):
    statement = f"CREATE CONTINUOUS VIEW {streams['schema']}.volatile AS " + select.format(append=streams["append"])
    with pg("sv_owner", autocommit=True) as owner, pytest.raises(DefinitionError, match="volatile"):
        catalog.define(owner, statement)


def test_a_user_aggregate_view_can_be_altered_replaced_and_dropped_and_then_so_can_the_aggregate(stack, pg):
    """ALTER, CREATE OR REPLACE and DROP of a view over a user aggregate (one with a combine function).

    The view keeps it through helper aggregates in schema cv; ALTER and CREATE OR REPLACE read its
    stored definition with the user's aggregates known, and DROP takes the helpers with it, so that
    the aggregate and its function can then be dropped too.
    """
    schema = unique("uagg")
    stream = f"{schema}_s"
    select = f"SELECT g, date_trunc('hour', ts) AS h, {schema}.total(x) AS {{out}} FROM {stream} GROUP BY g, h"
    with pg("sv_owner", autocommit=True) as owner:
        owner.execute(f"CREATE SCHEMA {schema}")
        owner.execute(
            f"CREATE FUNCTION {schema}.add(a bigint, b bigint) RETURNS bigint LANGUAGE sql IMMUTABLE"
            " RETURN coalesce(a, 0) + coalesce(b, 0)"
        )
        owner.execute(
            f"CREATE AGGREGATE {schema}.total(bigint)"
            f" (SFUNC = {schema}.add, STYPE = bigint, COMBINEFUNC = {schema}.add)"
        )
        owner.execute(f"GRANT USAGE ON SCHEMA {schema} TO sv_writer, sv_reader")
    definitions = f"""
        CREATE STREAM {stream} (g bigint, x bigint, ts timestamptz)
            WITH (topic = '{stream}', consumer_group = '{schema}');
        CREATE CONTINUOUS VIEW {schema}.totals AS {select.format(out="t")};
    """
    with throwaway_views(pg, schema, [stream], definitions, schema_exists=True):
        with pg("sv_writer", autocommit=True) as writer:
            apply_rows(writer, stream, [1, 1, 1], [(1, 5, TS), (1, 7, TS), (2, 1, TS)])
        with pg("sv_owner", autocommit=True) as owner:
            assert owner.execute(f"SELECT g, t FROM {schema}.totals ORDER BY g").fetchall() == [(1, 12), (2, 1)]
            assert catalog.define(owner, f"ALTER CONTINUOUS VIEW {schema}.totals SET (ttl = '30 days')") == [
                f"view {schema}.totals altered: ttl '30 days'"
            ]
            stored = owner.execute("SELECT definition FROM cv.views WHERE name = %s", (f"{schema}.totals",)).fetchone()
            assert "ttl = '30 days'" in stored[0]
            assert owner.execute(f"SELECT g, t FROM {schema}.totals ORDER BY g").fetchall() == [(1, 12), (2, 1)]
            [replaced] = catalog.define(
                owner,
                f"CREATE OR REPLACE CONTINUOUS VIEW {schema}.totals WITH (ttl = '30 days') AS {select.format(out='s')}",
            )
            assert replaced.startswith(f"view {schema}.totals replaced; its storage is unchanged")
            assert owner.execute(f"SELECT g, s FROM {schema}.totals ORDER BY g").fetchall() == [(1, 12), (2, 1)]
        with pg("sv_writer", autocommit=True) as writer:  # the replaced view is still maintained
            apply_rows(writer, stream, [1, 1], [(2, 4, TS), (3, 2, TS)])
        with pg("sv_owner", autocommit=True) as owner:
            totals = owner.execute(f"SELECT g, s FROM {schema}.totals ORDER BY g").fetchall()
            assert totals == [(1, 12), (2, 5), (3, 2)]

            assert catalog.define(owner, f"DROP CONTINUOUS VIEW {schema}.totals") == [f"view {schema}.totals dropped"]
            owner.execute(f"DROP AGGREGATE {schema}.total(bigint)")  # no CASCADE: nothing of the view is left
            owner.execute(f"DROP FUNCTION {schema}.add(bigint, bigint)")
