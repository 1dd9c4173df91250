"""PipelineDB's aggregate forms its regression suite writes: hll_agg, bucket_agg, json(b)_object_agg.

Each parses into what a view keeps, typed by PostgreSQL as PipelineDB's call would be, and a call
that cannot be kept is refused in one line saying what to write.
"""

from __future__ import annotations

import pytest

from pipelines.cv.frontend.pipelinedb_calls import APPEND_MAX_VALUES, typing_sql
from pipelines.cv.frontend.statements import NO_SCOPE, parse
from pipelines.cv.model import DefinitionError, Scope

EVENTS = "CREATE STREAM ev (g bigint, x int, y int, t text, ts timestamptz) WITH (topic = 'ev')"
CAP = (str(APPEND_MAX_VALUES),)


@pytest.fixture(scope="module")
def view():
    streams = {"ev": parse(EVENTS, NO_SCOPE)}

    def parse_view(query: str):
        return parse(f"CREATE CONTINUOUS VIEW t.v AS {query}", Scope(streams, frozenset()))

    return parse_view


def kinds(view_def):
    return [(a.kind, a.arg_sql, a.filter_sql, a.params) for a in view_def.aggregates]


def test_hll_agg_is_a_hyperloglog_of_the_values_and_an_aggregate_inside_expressions(view):
    v = view(
        "SELECT g, hll_agg(x) AS h, hll_cardinality(hll_agg(x)) + hll_cardinality(hll_agg(t)) AS n FROM ev GROUP BY g"
    )
    assert kinds(v) == [("hll", "hll_hash_any(x), 14", None, ()), ("hll", "hll_hash_any(t), 14", None, ())]
    assert typing_sql("hll_agg(x)") == "hll_add_agg(hll_hash_any(x), 14)"  # PipelineDB's p = 14: 0.81% error


def test_hll_agg_is_kept_in_a_sliding_window(view):
    v = view("SELECT g, hll_agg(x) FROM ev WHERE ts > clock_timestamp() - interval '1 hour' GROUP BY g")
    assert kinds(v) == [("hll", "hll_hash_any(x), 14", None, ())]


def test_bucket_agg_keeps_each_value_with_its_bucket_and_maybe_its_time(view):
    v = view("SELECT bucket_agg(x, y::smallint) AS b, bucket_agg(t, y::smallint, ts) AS bt FROM ev")
    assert kinds(v) == [
        ("bucket", "x, (CAST(y AS smallint))::smallint", None, ()),
        ("bucket", "t, (CAST(y AS smallint))::smallint, (ts)::timestamptz", None, ("timed",)),
    ]
    assert typing_sql("bucket_agg(x, y::smallint)") == "NULL::bytea"


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("SELECT g, bucket_agg(x) FROM ev GROUP BY g", r"bucket_agg\(x, bucket \[, ts\]\)"),
        ("SELECT g, json_object_agg(t) FROM ev GROUP BY g", r"json_object_agg\(key, value\) takes two arguments"),
        ("SELECT g, hll_agg(x, 14) FROM ev GROUP BY g", r"hll_agg\(x\) takes one argument"),
        (
            "SELECT g, bucket_agg(x, y::smallint) FROM ev WHERE ts > clock_timestamp() - interval '1 hour' GROUP BY g",
            "is not kept in a sliding-window view",
        ),
    ],
)
def test_a_form_that_cannot_be_kept_is_refused_in_one_line(view, query, message):
    with pytest.raises(DefinitionError, match=message) as refused:
        view(query)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("name", ["json_object_agg", "jsonb_object_agg"])
def test_object_aggregates_keep_keys_and_values_side_by_side_under_one_filter(view, name):
    v = view(f"SELECT g, {name}(t, x) FILTER (WHERE x > 0) AS o FROM ev GROUP BY g")
    given = "(t) IS NOT NULL AND (x > 0)"
    assert kinds(v) == [("append", "t", given, CAP), ("append", "x", given, CAP)]
    (call,) = v.calls
    assert call.function == name
    # Typed over no row: PostgreSQL's own would fail on the sample row's NULL key.
    assert typing_sql(f"{name}(t, x)") == f"{name}(t, x) FILTER (WHERE false)"


def test_a_view_with_bucket_agg_starts_from_now_and_says_why_a_backfill_is_refused(view):
    # A value's latest row sets its bucket: history applied after live events would move it back.
    with pytest.raises(DefinitionError, match=r"backfill = 'earliest': bucket_agg kept as a transition state"):
        parse(
            "CREATE CONTINUOUS VIEW t.v WITH (backfill = 'earliest') AS SELECT bucket_agg(x, y::smallint) FROM ev",
            Scope({"ev": parse(EVENTS, NO_SCOPE)}, frozenset()),
        )


def test_hll_agg_is_kept_over_a_keyed_stream_like_hll_add_agg_and_bucket_agg_is_not():
    keyed = "CREATE STREAM kv (g bigint, k bigint, x int) WITH (topic = 'kv', key = 'g, k')"
    scope = Scope({"kv": parse(keyed, NO_SCOPE)}, frozenset())
    v = parse("CREATE CONTINUOUS VIEW t.v AS SELECT g, hll_agg(x) AS h FROM kv GROUP BY g", scope)
    assert [a.kind for a in v.aggregates] == ["hll"]  # a retraction leaves the sketch as it is
    with pytest.raises(DefinitionError, match="cannot forget a retracted row, and kv has a key"):
        parse("CREATE CONTINUOUS VIEW t.w AS SELECT g, bucket_agg(x, 1::smallint) FROM kv GROUP BY g", scope)
