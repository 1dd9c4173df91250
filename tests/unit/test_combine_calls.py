"""combine() as the front end reads it: what a rollup keeps of its upstream's states, and each refusal in one line."""

from __future__ import annotations

import pytest

from pipelines.cv.frontend import combine
from pipelines.cv.frontend.statements import NO_SCOPE, parse
from pipelines.cv.frontend.view_sources import rows_stream
from pipelines.cv.model import DefinitionError, Scope
from pipelines.cv.views import change_capture
from pipelines.cv.views.view_types import ViewTypes

CLICKS = parse("CREATE STREAM clicks (url text, uid int, ms int, ts timestamptz) WITH (topic = 'clicks')", NO_SCOPE)
MINUTE = parse(
    "CREATE CONTINUOUS VIEW web.per_minute AS SELECT date_trunc('minute', ts) AS minute, url, count(*) AS n,"
    " avg(ms) AS mean, stddev(ms) AS spread, approx_count_distinct(uid) AS users, max(ms) AS peak,"
    " percentile_cont(0.9) WITHIN GROUP (ORDER BY ms) AS p90, topk_agg(url, 3) AS top,"
    " count(DISTINCT uid) AS exact_users, sum(ms) + 1 AS plus FROM clicks GROUP BY 1, 2",
    Scope({"clicks": CLICKS}, frozenset()),
)
# The storage's types as PostgreSQL resolves them (here: what each kind stores).
TYPES = tuple(
    {"count": "bigint", "sum": "numeric", "max": "integer", "hll": "hll", "tdigest": "tdigest", "topk": "jsonb"}.get(
        a.kind, "bigint"
    )
    for a in MINUTE.aggregates
)
ROWS = rows_stream(
    "web.per_minute",
    tuple((o.name, "numeric") for o in MINUTE.outputs),
    ("minute", "url"),
)
VIEWS = {
    "web.per_minute": ROWS,
    "combine(web.per_minute)": combine.rows_states_stream(ROWS, MINUTE, TYPES),
    "output_of(web.per_minute, states)": combine.changes_states_stream(MINUTE, TYPES),
}
SCOPE = Scope({"clicks": CLICKS}, frozenset(), views=VIEWS)


def view(select: str):
    return parse(f"CREATE CONTINUOUS VIEW web.v AS {select}", SCOPE)


def test_combine_of_an_average_keeps_the_sums_of_its_count_and_sum_and_reads_as_avg():
    hourly = view("SELECT date_trunc('hour', minute) AS hour, combine(mean) AS mean FROM web.per_minute GROUP BY 1")
    assert hourly.stream == "combine(web.per_minute)"
    assert [a.kind for a in hourly.aggregates] == ["sum", "sum"]
    assert all(a.arg_sql.startswith('"_cv_state_') for a in hourly.aggregates)
    (call,) = hourly.calls
    assert (call.function, call.sql) == ("avg", 'combine("mean", avg(ms))')  # typed as the column, read as avg


def test_combine_keeps_each_kind_as_it_merges():
    hourly = view(
        "SELECT url, combine(n) AS n, combine(spread) AS spread, combine(users) AS users, combine(peak) AS peak,"
        " combine(p90) AS p90, combine(top) AS top FROM web.per_minute GROUP BY url"
    )
    kinds = [(a.kind, a.params) for a in hourly.aggregates]
    assert kinds[:4] == [("sum", ())] * 4  # n; then spread's n, sum(x), sum(x*x) (n shared with count: once)
    assert ("combined", ("hll",)) in kinds  # recomputed from the rows: a sketch cannot forget one
    assert ("max", ()) in kinds
    assert ("combined", ("tdigest", "100")) in kinds
    assert ("combined", ("topk", "100")) in kinds


def test_combine_over_output_of_adds_each_changes_after_minus_before():
    daily = view(
        "SELECT date_trunc('day', (delta).minute) AS day, combine((delta).mean) AS mean, combine((delta).users) AS u"
        " FROM output_of('web.per_minute') GROUP BY 1"
    )
    assert daily.stream == "output_of(web.per_minute, states)"
    sums = [a.arg_sql for a in daily.aggregates if a.kind == "sum"]
    assert len(sums) == 2
    assert all(" - coalesce(" in s and "_cv_old_states" in s for s in sums)
    assert [a.params for a in daily.aggregates if a.kind == "hll"] == [("union",)]


@pytest.mark.parametrize(
    ("select", "message"),
    [
        ("SELECT url, combine(exact_users) AS u FROM web.per_minute GROUP BY url", "exact distinct count.*approx"),
        ("SELECT url, combine(plus) AS p FROM web.per_minute GROUP BY url", "plus is not an aggregate output"),
        ("SELECT minute, combine(url) AS p FROM web.per_minute GROUP BY minute", "url is not an aggregate output"),
        ("SELECT url, combine(n) AS n FROM clicks GROUP BY url", "merges a continuous view's stored aggregates"),
        ("SELECT url, combine(n, 1) AS n FROM web.per_minute GROUP BY url", r"combine\(column\) over FROM <view>"),
        ("SELECT url, combine(DISTINCT n) AS n FROM web.per_minute GROUP BY url", "no DISTINCT"),
        ("SELECT url, combine(n) FILTER (WHERE n > 1) AS n FROM web.per_minute GROUP BY url", "FILTER"),
        ("SELECT url, combine(n + 1) AS n FROM web.per_minute GROUP BY url", r"combine\(column\)"),
        ("SELECT combine(n) AS n FROM output_of('web.per_minute')", "n is not a column of the stream"),
        (
            "SELECT (delta).url AS url, combine((delta).p90) AS p FROM output_of('web.per_minute') GROUP BY 1",
            "FROM the view itself",
        ),
        (
            "SELECT url, combine(p90) AS p, count(DISTINCT minute) AS m FROM web.per_minute GROUP BY url",
            "cannot share a view",
        ),
    ],
)
def test_what_combine_cannot_merge_is_refused_in_one_line(select, message):
    with pytest.raises(DefinitionError, match=message) as refused:
        view(select)
    assert "\n" not in str(refused.value)


def test_a_view_read_by_combine_captures_its_states_beside_the_row_users_read():
    types = ViewTypes(("timestamptz", "text"), TYPES, None)
    plain = change_capture.projection(MINUTE, types)
    with_states = change_capture.projection(MINUTE, types, states=True)
    assert "_cv_states" not in plain
    assert with_states.startswith(
        "SELECT to_jsonb(_cv_key) AS key, to_jsonb(_cv_row) || jsonb_build_object('_cv_states',"
    )
    # Each mergeable state under its feed column's name; a t-digest as its text (to_jsonb makes it an object).
    assert "'_cv_state_n', s.\"n\"" in with_states
    assert "'_cv_state__cv_p90_" in with_states
    assert '"::text' in with_states
    assert "'_cv_state_exact_users'" not in with_states  # an exact distinct count keeps no state combine() merges


def test_an_exact_distinct_count_is_combined_as_its_set_when_the_upstream_keeps_reference_counts():
    with_sets = combine.rows_states_stream(ROWS, MINUTE, TYPES, distinct_set="integer")
    assert ("_cv_state_exact_users", "integer[]") in [(c.name, c.type) for c in with_sets.columns]
    scope = Scope({"clicks": CLICKS}, frozenset(), views={**VIEWS, "combine(web.per_minute)": with_sets})
    hourly = parse(
        "CREATE CONTINUOUS VIEW web.v AS SELECT url, combine(exact_users) AS u FROM web.per_minute GROUP BY url", scope
    )
    assert [(a.kind, a.params) for a in hourly.aggregates] == [("combined", ("count_distinct",))]
    assert hourly.calls[0].sql == 'combine("exact_users", count(DISTINCT uid))'
