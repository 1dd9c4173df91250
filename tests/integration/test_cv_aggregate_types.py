"""Each (aggregate, input type) a view keeps answers what PostgreSQL's own aggregate answers.

The oracle is the view's own SELECT over the stream's current rows in a temporary table (the
fixtures of test_cv_aggregates). Every output must have PostgreSQL's result type, and its value:
exactly (numeric to its last digit and scale, money, interval, text, dates, timestamps, booleans,
bits), except floats. PostgreSQL's own float sums depend on the order it reads rows in, and its
sum(real) adds up in real where a view adds up in double precision (as PostgreSQL's avg(real)
does), so a `real` result is compared to 1e-5 of its value and a `double precision` one to 1e-12.

Here money, interval, bit and timestamp come from casts in the view; the same pairs over stream columns
of those types (and json, inet, oid, arrays, enums, composites), read by PostgreSQL's input, are in
test_stream_input_types.py.
"""

from __future__ import annotations

import itertools
import math
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.cv import catalog
from pipelines.cv.model import DefinitionError
from tests.integration.conftest import apply_rows, as_stream_table, throwaway_views, unique

FLOAT4, FLOAT8 = 700, 701
TOLERANCE = {FLOAT4: 1e-5, FLOAT8: 1e-12}
NUMBERS = "i2 smallint, i4 integer, i8 bigint, n numeric, r real, d double precision"
COLUMNS = f"{NUMBERS}, t text, b boolean, dt date, tz timestamptz"
MONEY, SECONDS = "(n)::money", "make_interval(secs => i4)"
# Over a keyed stream: the aggregates that forget a retracted row, over each type PostgreSQL takes.
KEYED_VIEW = f"""
    SELECT g,
        sum(i2) AS sum_i2, sum(i4) AS sum_i4, sum(i8) AS sum_i8, sum(n) AS sum_n, sum(r) AS sum_r, sum(d) AS sum_d,
        sum({MONEY}) AS sum_m, sum({SECONDS}) AS sum_iv,
        avg(i2) AS avg_i2, avg(i4) AS avg_i4, avg(i8) AS avg_i8, avg(n) AS avg_n, avg(r) AS avg_r, avg(d) AS avg_d,
        avg({SECONDS}) AS avg_iv,
        count(t) AS count_t, count(b) AS count_b,
        min(i2) AS min_i2, max(i4) AS max_i4, min(i8) AS min_i8, max(n) AS max_n, min(r) AS min_r, max(d) AS max_d,
        min({MONEY}) AS min_m, max({SECONDS}) AS max_iv, min(t) AS min_t, max(t) AS max_t, min(dt) AS min_dt,
        max(tz) AS max_tz, min((tz)::timestamp) AS min_ts, max((t || t)::character(2)) AS max_c,
        bool_and(b) AS and_b, bool_or(b) AS or_b, every(b) AS every_b,
        var_samp(i2) AS vars_i2, var_pop(i4) AS varp_i4, stddev_samp(i8) AS sds_i8, stddev_pop(n) AS sdp_n,
        variance(r) AS var_r, stddev(d) AS sd_d
    FROM {{stream}} GROUP BY g"""
DISTINCT_VIEW = (
    "SELECT g, array_agg(DISTINCT t) AS ts, count(DISTINCT t) AS n_t, count(*) AS n FROM {stream} GROUP BY g"
)
# Over an append-only stream: the aggregates kept as their transition state, and the same sums.
APPEND_VIEW = """
    SELECT g, bit_and(i2) AS and_i2, bit_or(i4) AS or_i4, bit_xor(i8) AS xor_i8, bit_or((i4 & 15)::bit(4)) AS or_bit,
        bit_and((i4 & 15)::bit(4)) AS and_bit, sum(r) AS sum_r, avg(r) AS avg_r, sum((n)::money) AS sum_m,
        avg(make_interval(secs => i4)) AS avg_iv, min(dt) AS min_dt, max(tz) AS max_tz, min(t) AS min_t
    FROM {stream} GROUP BY g"""


@pytest.fixture(scope="module")
def streams(stack, pg):
    name = unique("aggt")
    keyed, append = f"{name}_keyed", f"{name}_events"
    definitions = f"""
        CREATE STREAM {keyed} (g bigint, k bigint, {COLUMNS}) WITH (topic = '{keyed}', key = 'g, k');
        CREATE STREAM {append} (g bigint, {COLUMNS}) WITH (topic = '{append}');
        CREATE CONTINUOUS VIEW {name}.typed AS {KEYED_VIEW.format(stream=keyed)};
        CREATE CONTINUOUS VIEW {name}.sets AS {DISTINCT_VIEW.format(stream=keyed)};
        CREATE CONTINUOUS VIEW {name}.states AS {APPEND_VIEW.format(stream=append)};
    """
    with throwaway_views(pg, name, [keyed, append], definitions):
        yield {"schema": name, "keyed": keyed, "append": append}


def rows_of(conn, query, args=()):
    """The rows of a query, with each column's type (oid)."""
    result = conn.execute(query, args)
    names = [(d.name, d.type_code) for d in result.description]
    return names, [dict(zip([n for n, _ in names], r, strict=True)) for r in result]


def recomputed(conn, stream, columns, rows, query, groups):
    with conn.transaction(force_rollback=True):
        as_stream_table(conn, stream, columns, rows)
        return rows_of(conn, f"SELECT * FROM ({query}) AS q WHERE g = ANY(%s) ORDER BY g", (groups,))


def read(conn, view, groups):
    return rows_of(conn, f"SELECT * FROM {view} WHERE g = ANY(%s) ORDER BY g", (groups,))


def same(got, expected, type_oid, column=""):
    """Equal, and of the same scale for numeric; floats to their tolerance.

    A numeric standard deviation (`sd*`) may differ by one unit in its last digit: PostgreSQL takes
    the square root of the variance at the variance's scale (sqrt_var), a view rounds sqrt()'s
    longer result to that scale.
    """
    if column.startswith("sd") and isinstance(got, Decimal) and isinstance(expected, Decimal):
        exponent = expected.as_tuple().exponent
        return got.as_tuple().exponent == exponent and abs(got - expected) <= Decimal(1).scaleb(exponent)
    if got is None or expected is None or type_oid not in TOLERANCE:
        return got == expected and str(got) == str(expected)
    return math.isclose(got, expected, rel_tol=TOLERANCE[type_oid], abs_tol=TOLERANCE[type_oid])


def assert_same(got, expected, *, unordered=()):
    (got_columns, got_rows), (expected_columns, expected_rows) = got, expected
    assert got_columns == expected_columns  # the same names, in order, of the same types
    assert [r["g"] for r in got_rows] == [r["g"] for r in expected_rows]
    types = dict(expected_columns)
    for g, e in zip(got_rows, expected_rows, strict=True):
        for column in unordered:  # array_agg(DISTINCT): the same values, NULL last as PostgreSQL lists it
            g[column] = _set_order(g[column])
        different = {k: (g[k], e[k]) for k in e if not same(g[k], e[k], types[k], k)}
        assert not different, (e["g"], different)


def _set_order(values):
    return sorted(v for v in values if v is not None) + [None] * values.count(None)


example = itertools.count(1)
TS = datetime(2030, 1, 1, tzinfo=UTC)
value_row = st.tuples(
    st.one_of(st.none(), st.integers(-300, 300)),  # i2
    st.one_of(st.none(), st.integers(-100_000, 100_000)),  # i4
    st.one_of(st.none(), st.integers(-(10**15), 10**15)),  # i8
    st.one_of(st.none(), st.decimals(-1000, 1000, places=2, allow_nan=False)),  # n
    st.one_of(st.none(), st.floats(-1e3, 1e3, allow_nan=False, width=32)),  # r
    st.one_of(st.none(), st.floats(-1e3, 1e3, allow_nan=False).map(lambda f: round(f, 3))),  # d
    st.one_of(st.none(), st.sampled_from(["a", "b", "1", "B", "ä"])),  # t
    st.one_of(st.none(), st.booleans()),  # b
    st.one_of(st.none(), st.integers(0, 400).map(lambda n: date(2030, 1, 1) + timedelta(days=n))),  # dt
    st.one_of(st.none(), st.integers(0, 10**6).map(lambda s: TS + timedelta(seconds=s, microseconds=s))),  # tz
)
keyed_event = st.tuples(st.sampled_from([1, 1, 1, -1]), st.integers(0, 2), st.integers(0, 4), value_row)


def replay(writer, stream, rows, cuts):
    """The rows in the batches `cuts` makes (none: one batch; every index: one row per batch)."""
    bounds = sorted({0, len(rows), *(c for c in cuts if c <= len(rows))})
    for start, end in itertools.pairwise(bounds):
        batch = rows[start:end]
        apply_rows(writer, stream, [r[0] for r in batch], [r[1:] for r in batch])


def current(rows):
    """A keyed stream's rows after its inserts and retractions: an insert of a present key is ignored."""
    state = {}
    for op, g, k, *values in rows:
        if op == 1 and (g, k) not in state:
            state[(g, k)] = (g, k, *values)
        elif op == -1:
            state.pop((g, k), None)
    return list(state.values())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=st.lists(keyed_event, max_size=30), cuts=st.lists(st.integers(0, 30), max_size=4), each=st.booleans())
def test_each_type_over_a_keyed_stream_equals_postgresql_after_retractions(writer, streams, events, cuts, each):
    base = next(example) * 10
    rows = [(op, base + g, k, *values) for op, g, k, values in events]
    replay(writer, streams["keyed"], rows, range(len(rows)) if each else cuts)
    groups = [base + g for g in range(3)]
    state = current(rows)
    columns = f"g bigint, k bigint, {COLUMNS}"
    for view, query in (("typed", KEYED_VIEW), ("sets", DISTINCT_VIEW)):
        expected = recomputed(writer, streams["keyed"], columns, state, query.format(stream=streams["keyed"]), groups)
        got = read(writer, f"{streams['schema']}.{view}", groups)
        assert_same(got, expected, unordered=("ts",) if view == "sets" else ())


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=st.lists(st.tuples(st.integers(0, 2), value_row), max_size=30), cuts=st.lists(st.integers(0, 30)))
def test_each_type_over_an_append_only_stream_equals_postgresql(writer, streams, events, cuts):
    base = 1_000_000 + next(example) * 10
    rows = [(1, base + g, *values) for g, values in events]
    replay(writer, streams["append"], rows, cuts)
    groups = [base + g for g in range(3)]
    query = APPEND_VIEW.format(stream=streams["append"])
    expected = recomputed(writer, streams["append"], f"g bigint, {COLUMNS}", [r[1:] for r in rows], query, groups)
    assert_same(read(writer, f"{streams['schema']}.states", groups), expected)


def _row(g, k, **values):
    names = [c.split()[0] for c in COLUMNS.split(", ")]
    return (1, g, k, *(values.get(n) for n in names))


@pytest.mark.parametrize("batches", ["one", "each"])
def test_the_known_wrong_answers_of_issue_26_are_postgresqls(writer, streams, batches):
    """avg(real) adds up in double precision; array_agg(DISTINCT) keeps NULL; money and interval sums run."""
    g = 9_000_000 + next(example)
    reals = [16777216.0] + [1.0] * 9  # in real, 16777216 + 1 is 16777216
    rows = [_row(g, k, r=r, n=Decimal("1.25"), i4=90, t="a") for k, r in enumerate(reals)]
    rows += [_row(g, 20, t="1"), _row(g, 21, t="a"), _row(g, 22, t=None), _row(g, 23, t="a")]
    replay(writer, streams["keyed"], rows, range(len(rows)) if batches == "each" else [])
    got = writer.execute(
        f"SELECT avg_r, sum_m, sum_iv, avg_iv FROM {streams['schema']}.typed WHERE g = %s", (g,)
    ).fetchone()
    assert got == (16777225.0 / 10, "$12.50", timedelta(minutes=15), timedelta(seconds=90))
    (ts,) = writer.execute(f"SELECT ts FROM {streams['schema']}.sets WHERE g = %s", (g,)).fetchone()
    assert _set_order(ts) == ["1", "a", None]
    rows = [(-1, *row[1:]) for row in (rows[-4], rows[-2])]  # 1 and NULL retracted: NULL leaves the set
    replay(writer, streams["keyed"], rows, [])
    (ts,) = writer.execute(f"SELECT ts FROM {streams['schema']}.sets WHERE g = %s", (g,)).fetchone()
    assert ts == ["a"]


@pytest.mark.parametrize(
    ("call", "match"),
    [
        ("avg((n)::money)", r"function avg\(money\) does not exist"),
        ("sum(dt)", r"function sum\(date\) does not exist"),
        ("sum(tz)", r"function sum\(timestamp with time zone\) does not exist"),
        ("min(b)", r"function min\(boolean\) does not exist"),
        ("max((t)::jsonb)", r"function max\(jsonb\) does not exist"),
        ("bool_and(i4)", r"function bool_and\(integer\) does not exist"),
        ("bit_or(r)", r"function bit_or\(real\) does not exist"),
        ("variance(make_interval(secs => i4))", r"function variance\(interval\) does not exist"),
        ("stddev((n)::money)", r"function stddev\(money\) does not exist"),
        ("corr(t, d)", "corr"),
        ("percentile_cont(0.5) WITHIN GROUP (ORDER BY make_interval(secs => i4))", "order by a number, e.g. extract"),
        (
            "percentile_cont(0.5) WITHIN GROUP (ORDER BY tz)",
            r"percentile_cont\(numeric, timestamp with time zone\) does not",
        ),
    ],
)
def test_a_pair_postgresql_does_not_aggregate_is_refused_when_the_view_is_defined(pg, streams, call, match):
    statement = (
        f"CREATE CONTINUOUS VIEW {streams['schema']}.nope AS SELECT g, {call} AS a FROM {streams['append']} GROUP BY g"
    )
    with pg("sv_owner", autocommit=True) as owner, pytest.raises(DefinitionError, match=match):
        catalog.define(owner, statement)
