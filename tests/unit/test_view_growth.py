"""Views whose rows only grow: which columns move one way, and which min/max keep no value counts."""

from __future__ import annotations

import pytest

from pipelines.cv.frontend.statements import NO_SCOPE, parse
from pipelines.cv.frontend.view_sources import from_definition, rows_stream, to_definition, with_growth
from pipelines.cv.model import FIXED, GROWS_DOWN, GROWS_UP, Scope
from pipelines.cv.views import extremes, stream_sql
from pipelines.cv.views.growth import directions, grown_extremes, guarded_columns, plain_column

CLICKS = parse("CREATE STREAM clicks (url text, ms int, ts timestamptz) WITH (topic = 'clicks')", NO_SCOPE)
LIKES = parse(
    "CREATE STREAM likes (user_id bigint, object_id bigint, ms int) WITH (topic = 'likes', key = 'user_id, object_id')",
    NO_SCOPE,
)
MINUTE_COLUMNS = (
    ("minute", "timestamp with time zone"),
    ("url", "text"),
    ("n", "bigint"),
    ("total", "bigint"),
    ("peak", "integer"),
    ("fastest", "integer"),
)
PER_MINUTE = rows_stream("web.per_minute", MINUTE_COLUMNS, ("minute", "url"))
MINUTE_SQL = (
    "SELECT date_trunc('minute', ts) AS minute, url, count(*) AS n, sum(ms) AS total, max(ms) AS peak,"
    " min(ms) AS fastest FROM clicks GROUP BY 1, 2"
)
SCOPE = Scope({"clicks": CLICKS, "likes": LIKES}, frozenset(), views={"web.per_minute": PER_MINUTE})


def view(select: str, options: str = "", scope: Scope = SCOPE):
    return parse(f"CREATE CONTINUOUS VIEW web.v {options} AS {select}", scope)


def growing(feed=PER_MINUTE):
    """The minute feed as stored when its upstream is the minute view over the append-only clicks."""
    return with_growth(feed, directions(view(MINUTE_SQL), CLICKS))


HOURLY = (
    "SELECT date_trunc('hour', minute) AS hour, url, sum(n) AS n, max(peak) AS peak, min(fastest) AS fastest,"
    " count(*) AS minutes FROM web.per_minute GROUP BY 1, 2"
)


def test_over_an_append_only_stream_groups_are_fixed_counts_and_maxes_go_up_mins_down():
    assert directions(view(MINUTE_SQL), CLICKS) == {
        "minute": FIXED,
        "url": FIXED,
        "n": GROWS_UP,
        "peak": GROWS_UP,
        "fastest": GROWS_DOWN,
    }  # total: a sum of ints may go down


@pytest.mark.parametrize(
    ("options", "select"),
    [
        ("WITH (ttl = '1 day', ttl_column = 'minute')", MINUTE_SQL),  # retention deletes rows
        ("", "SELECT object_id, count(*) AS n, max(ms) AS peak FROM likes GROUP BY 1"),  # unlikes retract
    ],
)
def test_rows_that_may_be_deleted_move_no_way_known(options, select):
    stream = LIKES if "likes" in select else CLICKS
    assert directions(view(select, options), stream) == {}


def test_a_view_over_growing_rows_grouped_by_their_key_grows_too():
    hourly = view(HOURLY)
    assert directions(hourly, growing()) == {
        "hour": FIXED,
        "url": FIXED,
        "peak": GROWS_UP,
        "fastest": GROWS_DOWN,
        "minutes": GROWS_UP,
    }
    assert grown_extremes(hourly, growing()) == {"peak": ("peak", GROWS_UP), "fastest": ("fastest", GROWS_DOWN)}


def test_grown_extremes_keep_no_value_counts_and_their_columns_are_guarded():
    hourly = view(HOURLY)
    assert [a.name for _, a in extremes.counted_extremes(hourly, growing())] == ["peak", "fastest"]
    assert extremes.kept_extremes(hourly, growing()) == []
    assert [a.name for _, a in extremes.kept_extremes(hourly, PER_MINUTE)] == ["peak", "fastest"]
    assert guarded_columns([hourly], growing()) == {"peak": GROWS_UP, "fastest": GROWS_DOWN}


@pytest.mark.parametrize(
    "select",
    [
        "SELECT n, max(peak) AS peak FROM web.per_minute GROUP BY 1",  # grouped by a column that moves
        "SELECT url, max(peak) AS peak FROM web.per_minute WHERE n > 10 GROUP BY 1",  # a row may enter later
        "SELECT url, max(peak) FILTER (WHERE n > 10) AS peak FROM web.per_minute GROUP BY 1",
        "SELECT url, max(total) AS peak FROM web.per_minute GROUP BY 1",  # a sum may go down
        "SELECT url, max(fastest) AS peak FROM web.per_minute GROUP BY 1",  # a min goes down, not up
        "SELECT url, max(peak + 1) AS peak FROM web.per_minute GROUP BY 1",  # not the column itself
    ],
)
def test_a_min_or_max_keeps_its_counts_unless_it_reads_a_column_moving_its_way_grouped_by_keys(select):
    assert grown_extremes(view(select), growing()) == {}


def test_a_max_of_a_key_column_or_of_a_count_needs_no_counts():
    select = "SELECT url, max(minute) AS last, max(n) AS busiest FROM web.per_minute GROUP BY 1"
    assert grown_extremes(view(select), growing()) == {"last": ("minute", FIXED), "busiest": ("n", GROWS_UP)}


def test_a_feed_whose_upstream_may_shrink_states_nothing():
    assert grown_extremes(view(HOURLY), PER_MINUTE) == {}
    assert directions(view(HOURLY), PER_MINUTE) == {}


def test_a_feed_definition_keeps_its_growth_and_reads_back_without_it_as_before():
    feed = growing()
    back = from_definition(feed.name, feed.topic, to_definition(feed))
    assert back.grows == feed.grows
    assert '"grows"' not in to_definition(PER_MINUTE)
    assert from_definition(PER_MINUTE.name, PER_MINUTE.topic, to_definition(PER_MINUTE)).grows == ()


@pytest.mark.parametrize(
    ("expression", "column"), [("peak", "peak"), ('"peak"', "peak"), ("peak + 1", None), ("t.peak", None), (None, None)]
)
def test_a_plain_column_is_one_column_and_nothing_else(expression, column):
    assert plain_column(expression) == column


def test_the_feed_statement_counts_the_groups_that_break_the_guarded_ways():
    statement = stream_sql.feed_to_deltas(growing(), None, {"peak": GROWS_UP, "fastest": GROWS_DOWN}).as_string(None)
    columns = [c.name for c in growing().columns]
    peak, fastest = columns.index("peak"), columns.index("fastest")
    assert f'"_n{peak}" < "_o{peak}"' in statement
    assert f'"_n{fastest}" > "_o{fastest}"' in statement
    assert "NOT has" in statement
    unguarded = stream_sql.feed_to_deltas(growing(), None, {}).as_string(None)
    assert unguarded.endswith("SELECT (SELECT count(*) FROM deltas), 0")
