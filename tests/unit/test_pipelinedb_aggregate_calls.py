"""PipelineDB's aggregates parse into what a view keeps, and are refused, in one line, where they cannot be kept."""

from __future__ import annotations

import pytest

from pipelines.cv.frontend.backfill import check_backfill_option, order_dependent
from pipelines.cv.frontend.pipelinedb_calls import APPEND_MAX_VALUES, typing_sql
from pipelines.cv.frontend.statements import NO_SCOPE, parse
from pipelines.cv.model import DefinitionError, Scope

EVENTS = "CREATE STREAM ev (g bigint, k bigint, x bigint, t text, w int, ts timestamptz) WITH (topic = 'ev')"
KEYED = "CREATE STREAM kv (g bigint, k bigint, x bigint) WITH (topic = 'kv', key = 'g, k')"


@pytest.fixture(scope="module")
def view():
    streams = {"ev": parse(EVENTS, NO_SCOPE), "kv": parse(KEYED, NO_SCOPE)}

    def parse_view(query: str, options: str = ""):
        return parse(f"CREATE CONTINUOUS VIEW t.v {options} AS {query}", Scope(streams, frozenset()))

    return parse_view


def kinds(view_def):
    return [(a.kind, a.arg_sql, a.params) for a in view_def.aggregates]


def test_keyed_max_keeps_the_key_extreme_beside_the_value_at_it(view):
    v = view("SELECT g, keyed_max(k, x) AS last_x, keyed_min(k, t) AS first_t FROM ev GROUP BY g")
    assert kinds(v) == [
        ("max", "k", ()),
        ("keyed", "k, x", ("max",)),
        ("min", "k", ()),
        ("keyed", "k, t", ("min",)),
    ]


def test_first_values_keeps_the_first_n_in_the_order_by_with_postgresql_null_defaults(view):
    v = view(
        "SELECT g, first_values(3) WITHIN GROUP (ORDER BY x) AS lo,"
        " first_values(2) WITHIN GROUP (ORDER BY x DESC) AS hi,"
        " first_values(2, t) AS pdb FROM ev GROUP BY g"
    )
    assert kinds(v) == [
        ("first", "x", ("3", "ASC NULLS LAST")),
        ("first", "x", ("2", "DESC NULLS FIRST")),
        ("first", "t", ("2", "ASC NULLS LAST")),
    ]


def test_set_agg_is_array_agg_distinct_and_the_collecting_aggregates_are_capped(view):
    v = view("SELECT g, set_agg(x) AS xs, array_agg(x) AS all_x, string_agg(t, ',') AS ts FROM ev GROUP BY g")
    assert kinds(v)[0][0] == "set"
    assert ("append", "x", (str(APPEND_MAX_VALUES),)) in kinds(v)
    assert any(a.kind == "append" and a.filter_sql == "(t) IS NOT NULL" for a in v.aggregates)


def test_weighted_topk_keeps_values_and_weights(view):
    v = view("SELECT g, topk_agg(t, 3, w) AS top FROM ev GROUP BY g")
    assert kinds(v) == [("topk", "t, (w)::bigint", ("100", "weighted"))]


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("SELECT g, keyed_max(k, x) AS m FROM kv GROUP BY g", "cannot forget a retracted row"),
        ("SELECT g, first_values(2) WITHIN GROUP (ORDER BY x) AS f FROM kv GROUP BY g", "cannot forget"),
        ("SELECT g, array_agg(x) AS a FROM kv GROUP BY g", "cannot forget"),
        ("SELECT g, keyed_max(k) AS m FROM ev GROUP BY g", r"keyed_max\(key, value\) takes two arguments"),
        ("SELECT g, first_values(0) WITHIN GROUP (ORDER BY x) AS f FROM ev GROUP BY g", "positive integer"),
        ("SELECT g, first_values(2001) WITHIN GROUP (ORDER BY x) AS f FROM ev GROUP BY g", "at most 1000"),
        ("SELECT g, first_values(2, x, t) AS f FROM ev GROUP BY g", "composite"),
        ("SELECT g, string_agg(t, t) AS s FROM ev GROUP BY g", "constant delimiter"),
        ("SELECT g, array_agg(x ORDER BY k) AS a FROM ev GROUP BY g", "ORDER BY inside an aggregate"),
    ],
)
def test_what_cannot_be_kept_is_refused_with_the_reason(view, query, says):
    with pytest.raises(DefinitionError, match=says):
        view(query)


def test_no_collecting_aggregate_in_a_sliding_window_but_keyed_ones_merge_their_steps(view):
    window = "WHERE ts > clock_timestamp() - interval '1 minute' GROUP BY g"
    for call in ("array_agg(x)", "first_values(1) WITHIN GROUP (ORDER BY x)"):
        with pytest.raises(DefinitionError, match="not kept in a sliding-window view"):
            view(f"SELECT g, {call} AS a FROM ev {window}")
    kept = view(f"SELECT g, keyed_max(k, x) AS a FROM ev {window}")  # each step: max(k) and x at it
    assert [a.kind for a in kept.aggregates] == ["max", "keyed"]


def test_a_backfill_refuses_arrival_order_but_not_keyed_or_first_values(view):
    ordered = view("SELECT g, keyed_max(k, x) AS m, first_values(2) WITHIN GROUP (ORDER BY x) AS f FROM ev GROUP BY g")
    assert order_dependent(ordered.aggregates) == []
    collected = view("SELECT g, string_agg(t, ',') AS s FROM ev GROUP BY g")
    assert order_dependent(collected.aggregates) == ["array_agg/json_agg/string_agg"]
    stream = parse(EVENTS, NO_SCOPE)
    with pytest.raises(DefinitionError, match="backfill = 'none'"):
        check_backfill_option({"backfill": "earliest"}, stream, collected.aggregates, "t.v")


def test_pipelinedb_calls_are_typed_as_postgresql_would_type_their_result():
    assert typing_sql("keyed_max(ts, x)") == "x"
    assert typing_sql("first_values(2) WITHIN GROUP (ORDER BY x DESC)") == "array_agg(x)"
    assert typing_sql("set_agg(x)") == "array_agg(x)"
    assert typing_sql("array_agg(x)") == "array_agg(x)"


def test_sketches_take_pipelinedbs_defaults_or_constant_parameters(view):
    v = view(
        "SELECT g, bloom_agg(x) AS b, bloom_agg(t, 0.01, 1000) AS b2, freq_agg(t) AS f, freq_agg(x, 0.01, 0.99) AS f2,"
        " dist_agg(x) AS d, dist_agg(x, 200) AS d2 FROM ev GROUP BY g"
    )
    assert kinds(v) == [
        ("bloom", "x", ("0.02", "16384")),
        ("bloom", "t", ("0.01", "1000")),
        ("freq", "t", ("0.002", "0.995")),
        ("freq", "x", ("0.01", "0.99")),
        ("tdigest", "(x)::float8", ("100",)),
        ("tdigest", "(x)::float8", ("200",)),
    ]


@pytest.mark.parametrize(
    ("call", "says"),
    [
        ("bloom_agg(x, 1.5, 100)", r"p in \(0, 1\)"),
        ("bloom_agg(x, 0.1, 0)", "n a positive integer"),
        ("bloom_agg(x, 0.1)", "constants"),
        ("freq_agg(x, 0.1, w)", "constants"),
        ("dist_agg(x, 5)", "compression an integer"),
    ],
)
def test_sketch_parameters_out_of_range_are_refused(view, call, says):
    with pytest.raises(DefinitionError, match=says):
        view(f"SELECT g, {call} AS s FROM ev GROUP BY g")


def test_sketches_are_kept_in_sliding_windows_but_not_over_keyed_streams(view):
    windowed = view(
        "SELECT g, bloom_agg(x) AS b, freq_agg(x) AS f, dist_agg(x) AS d FROM ev"
        " WHERE ts > clock_timestamp() - interval '1 minute' GROUP BY g"
    )
    assert [a.kind for a in windowed.aggregates] == ["bloom", "freq", "tdigest"]
    with pytest.raises(DefinitionError, match="cannot forget"):
        view("SELECT g, bloom_agg(x) AS b FROM kv GROUP BY g")


def test_hll_union_agg_is_kept_over_a_keyed_stream_as_hll_add_agg_is(view):
    """Retractions leave a HyperLogLog as it is: both sketches' aggregates say so in the docs, neither is refused."""
    v = view("SELECT g, hll_union_agg(x::text::hll) AS u, hll_add_agg(hll_hash_bigint(x)) AS a FROM kv GROUP BY g")
    assert [a.kind for a in v.aggregates] == ["hll", "hll"]
